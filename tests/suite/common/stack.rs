//! A broker, a database and palletd, started together for one test.

use super::*;

/// A broker, a database and palletd, started together for one test.
pub struct Stack {
    pub broker: Broker,
    pub db: Database,
    pub config: Config,
    pub palletd: Palletd,
    pub client: mongodb::Client,
}

impl Stack {
    /// Broker, database and palletd with `configure`d settings, ready.
    pub async fn start(name: &str, configure: impl FnOnce(Config) -> Config) -> Stack {
        let broker = Broker::start();
        let db = Database::start();
        Self::on(broker, db, name, configure).await
    }

    /// palletd on these services, ready.
    pub async fn on(
        broker: Broker,
        db: Database,
        name: &str,
        configure: impl FnOnce(Config) -> Config,
    ) -> Stack {
        let stack = Self::assemble(broker, db, name, configure).await;
        stack.palletd.ready().await;
        stack
    }

    /// Broker and palletd up (subscribed), the database stopped: palletd
    /// spools and acknowledges what it receives. `stack.db.start_again()`
    /// brings the database back.
    pub async fn without_database(name: &str, configure: impl FnOnce(Config) -> Config) -> Stack {
        let mut db = Database::start();
        db.stop();
        let stack = Self::assemble(Broker::start(), db, name, configure).await;
        stack.palletd.subscribed().await;
        stack
    }

    async fn assemble(
        broker: Broker,
        db: Database,
        name: &str,
        configure: impl FnOnce(Config) -> Config,
    ) -> Stack {
        let config = configure(Config::new(&broker, &db, name));
        let palletd = Palletd::start(&config);
        let client = db.client().await;
        Stack {
            broker,
            db,
            config,
            palletd,
            client,
        }
    }

    /// SIGKILLs palletd `times` times at random moments 0.7-2 s apart (the
    /// same moments for the same `seed`), starting it again each time.
    pub async fn kill_repeatedly(&mut self, times: usize, seed: u64) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..times {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(700..2000))).await;
            self.palletd.kill();
            self.palletd = Palletd::start(&self.config);
        }
    }

    /// Waits until the broker holds no message for palletd: everything it
    /// sent was acknowledged (spooled).
    pub async fn all_acknowledged(&self) {
        eventually(
            Duration::from_secs(30),
            "the broker holds no message for palletd",
            || async { self.broker.held_messages().await == 0 },
        )
        .await;
    }

    /// Publishes 1,000 readings over 10 sensors at 100/s from a publisher
    /// with a kept session, restarts the broker 4 s in, and waits until
    /// palletd reconnected at least `reconnects` times. Returns what was
    /// sent.
    pub async fn publish_through_a_broker_restart(
        &mut self,
        reconnects: f64,
    ) -> Vec<(String, i64)> {
        let id = format!("pub-{}", self.config.name);
        let publisher = Publisher::connect_persistent(&self.broker, &id).await;
        let stream = tokio::spawn(publish_steadily(publisher, 10, 100.0, 1000));
        tokio::time::sleep(Duration::from_secs(4)).await;
        self.broker.restart();
        let sent = stream.await.unwrap();
        self.palletd
            .wait_metric("palletd_broker_reconnects_total", reconnects)
            .await;
        sent
    }

    pub async fn publisher(&self) -> Publisher {
        Publisher::connect(&self.broker, &format!("pub-{}", self.config.name)).await
    }

    /// Samples stored so far.
    pub async fn stored(&self) -> usize {
        stored_samples(&self.client, &self.config.database()).await
    }

    /// All documents of one of this test's collections.
    pub async fn docs(&self, coll: &str) -> Vec<Document> {
        all_docs(&self.client, &self.config.database(), coll).await
    }

    /// Waits until at least `n` samples are stored.
    pub async fn wait_stored(&self, n: usize) {
        eventually(
            Duration::from_secs(60),
            &format!("{n} samples stored"),
            || async { self.stored().await >= n },
        )
        .await;
    }

    /// Stops palletd with SIGTERM; it must exit 0.
    pub fn stop(&mut self) {
        assert_eq!(self.palletd.terminate(), Some(0), "{}", self.palletd.log());
    }
}
