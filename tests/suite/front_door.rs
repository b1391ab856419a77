//! The front door, exactly once: the broker's redeliveries recognised by
//! the session they belong to and only among what it can still resend, and
//! shared subscriptions proved before they are trusted. Against a real
//! Mosquitto (with a TCP proxy in front of it that loses what one side
//! sends, as a dying connection does) and aedes, a broker that grants
//! `$share/` without delivering through it.

use crate::common;

use std::time::Duration;

use common::*;
use palletd::testkit::netem::{Link, Proxy};

/// A proxy in front of `broker` that carries everything until told to
/// lose one direction.
async fn proxy(broker: &Broker) -> Proxy {
    let link = Link {
        one_way: Duration::ZERO,
        bytes_per_sec: 0,
    };
    Proxy::link(broker.port, link).await.unwrap()
}

fn via(c: Config, proxy: &Proxy) -> Config {
    c.set("mqtt.url", format!("mqtt://127.0.0.1:{}", proxy.port))
}

/// Waits until palletd received `n` QoS 1 messages and released every
/// acknowledgement (each one is durable in the spool).
async fn all_spooled(p: &Palletd, n: f64) {
    p.wait_until(
        Duration::from_secs(60),
        &format!("{n} messages spooled"),
        |p| {
            let s = p.scrape();
            metric(&s, "palletd_messages_received_total", None) >= n
                && metric(&s, "palletd_oldest_unacked_age_seconds", None) == 0.0
        },
    )
    .await;
}

/// A broker, a database and palletd (one connection, readings written
/// within 1 s) reaching the broker through a proxy.
async fn behind_a_proxy(name: &str) -> (Stack, Proxy) {
    let broker = Broker::start();
    let proxy = proxy(&broker).await;
    let stack = Stack::on(broker, Database::start(), name, |c| {
        via(c, &proxy).one_stream().max_delay("1s")
    })
    .await;
    (stack, proxy)
}

/// A PUBACK lost with a dying connection after its readings reached the
/// database: the spool's segments are gone when palletd starts again, and
/// the broker resends every message with DUP. They are recognised by the
/// identities kept beside the spool (`message-ids`), not stored again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_acknowledgements_then_a_restart_after_the_writes_store_nothing_twice() {
    let (mut stack, proxy) = behind_a_proxy("lostack").await;
    // From here on what palletd sends (its PUBACKs) is lost.
    proxy.lose(true, false);
    let first = publish_steadily(stack.publisher().await, 10, 500.0, 100).await;
    stack.wait_stored(100).await;
    stack.palletd.settled().await;
    eventually(Duration::from_secs(10), "no PUBACK arrived", || async {
        stack.broker.held_messages().await == 100
    })
    .await;
    stack.palletd.kill();
    proxy.lose(false, false);
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    let more = publish_steadily_from(stack.publisher().await, 10, 500.0, 100..150).await;
    let sent: Vec<_> = first.into_iter().chain(more).collect();
    assert_exactly_once(&stack.client, "lostack", &sent, Duration::from_secs(60)).await;
    stack.all_acknowledged().await;
    assert!(
        stack
            .palletd
            .metric("palletd_redeliveries_skipped_total", None)
            >= 100.0,
        "the broker resent the 100 and palletd recognised them"
    );
    stack.stop();
}

/// A broker that sends more messages without their PUBACKs than
/// `mqtt.max_inflight` says (palletd told 10; Mosquitto here allows 100):
/// under a burst, a session holds more unacknowledged messages than 10
/// while the spool's group commit runs, so palletd learns the larger
/// window as it sees it and keeps it (in the spool's directory, for the
/// next start). Then PUBACKs are lost and palletd restarts: the broker's
/// resends, from further back than twice 10, are stored nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_window_larger_than_told_is_learned_and_resends_stored_once() {
    let broker = Broker::start();
    let proxy = proxy(&broker).await;
    let mut stack = Stack::on(broker, Database::start(), "learnwin", |c| {
        via(c, &proxy)
            .one_stream()
            .max_delay("1s")
            .set("mqtt.max_inflight", 10)
    })
    .await;
    let burst = publish_steadily(stack.publisher().await, 10, 100_000.0, 3000).await;
    stack
        .palletd
        .wait_until(Duration::from_secs(30), "the window learned", |p| {
            p.metric("palletd_mqtt_broker_window", None) >= 100.0
        })
        .await;
    stack.wait_stored(3000).await;
    stack.all_acknowledged().await;
    let kept =
        std::fs::read_to_string(stack.config.settings().spool.dir.join("mqtt-broker")).unwrap();
    assert!(kept.contains("window "), "{kept}");
    // The broker's whole window (100) sent and its PUBACKs lost.
    proxy.lose(true, false);
    let lost = publish_steadily_from(stack.publisher().await, 10, 1000.0, 3000..3100).await;
    stack.wait_stored(3100).await;
    stack.palletd.nothing_left_to_write().await;
    stack.palletd.kill();
    proxy.lose(false, false);
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    assert!(stack.palletd.metric("palletd_mqtt_broker_window", None) >= 100.0);
    let sent: Vec<_> = burst.into_iter().chain(lost).collect();
    assert_exactly_once(&stack.client, "learnwin", &sent, Duration::from_secs(60)).await;
    assert!(
        stack
            .palletd
            .metric("palletd_redeliveries_skipped_total", None)
            >= 20.0,
        "the broker resent more than twice the window palletd was told"
    );
    stack.stop();
}

/// Four sessions' PUBACKs lost while the database is down, then a restart
/// with two connections: the two retiring sessions get other connection
/// indexes, and their redeliveries are recognised by their client ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_to_retiring_sessions_are_recognised_by_their_client_id() {
    let mut db = Database::start();
    db.stop();
    let broker = Broker::start();
    let proxy = proxy(&broker).await;
    let config = via(
        Config::new(&broker, &db, "retiredup").set("mqtt.connections", 4),
        &proxy,
    );
    let mut palletd = Palletd::start(&config);
    palletd.subscribed().await;
    palletd.connections_up(4.0).await;
    proxy.lose(true, false);
    let publisher = Publisher::connect(&broker, "pub-retiredup").await;
    let mut sent = publish_steadily_from(publisher, 10, 2000.0, 0..400).await;
    all_spooled(&palletd, 400.0).await;
    let per: Vec<f64> = (0..4)
        .map(|k| {
            palletd.metric(
                "palletd_messages_received_total",
                Some(("connection", &k.to_string())),
            )
        })
        .collect();
    assert!(
        per.iter().all(|n| *n > 0.0),
        "every session got some: {per:?}"
    );
    palletd.kill();
    proxy.lose(false, false);
    db.start_again();
    let config = config.set("mqtt.connections", 2);
    let mut palletd = Palletd::start(&config);
    palletd.ready().await;
    let sessions = config.settings().spool.dir.join("mqtt-sessions.json");
    palletd
        .wait_until(Duration::from_secs(60), "sessions 2 and 3 retired", |_| {
            let text = std::fs::read_to_string(&sessions).unwrap_or_default();
            !text.contains("retiredup-2") && !text.contains("retiredup-3")
        })
        .await;
    let publisher = Publisher::connect(&broker, "pub-retiredup").await;
    sent.extend(publish_steadily_from(publisher, 10, 2000.0, 400..440).await);
    let client = db.client().await;
    assert_exactly_once(&client, "retiredup", &sent, Duration::from_secs(60)).await;
    let retired: f64 = ["64", "65"]
        .iter()
        .map(|k| palletd.metric("palletd_messages_received_total", Some(("connection", k))))
        .sum();
    assert!(
        retired >= per[2] + per[3],
        "the retiring sessions received their sessions' redeliveries: {retired} of {per:?}"
    );
    eventually(Duration::from_secs(30), "nothing held", || async {
        broker.held_messages().await == 0
    })
    .await;
    assert_eq!(palletd.terminate(), Some(0), "{}", palletd.log());
}

/// A sensor that sends the same bare number over and over: once the
/// broker's packet ids wrapped, a message palletd never received arrives
/// again with DUP under the packet id of an older one with the same topic
/// and payload. It is new (the older one is far outside the window) and
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constant_sensor_loses_nothing_when_packet_ids_wrap() {
    let (mut stack, proxy) = behind_a_proxy("wrap").await;
    let mut publisher = stack.publisher().await;
    const BEFORE: usize = 65_540;
    for i in 0..BEFORE {
        publisher.publish("plant/input7/state", "1").await;
        if i % 1000 == 999 {
            publisher.flush().await;
        }
    }
    publisher.flush().await;
    let stored = |stack: &Stack| {
        let client = stack.client.clone();
        async move {
            all_docs(&client, "wrap", "readings")
                .await
                .iter()
                .map(|b| b.get_i32("count").unwrap() as usize)
                .sum::<usize>()
        }
    };
    eventually(
        Duration::from_secs(120),
        "65,540 readings stored",
        || async { stored(&stack).await == BEFORE },
    )
    .await;
    stack.all_acknowledged().await;
    // The broker's next ten sendings are lost with the connection (a
    // PUBLISH of this topic and payload is 25 bytes).
    proxy.lose(false, true);
    for _ in 0..10 {
        publisher.publish("plant/input7/state", "1").await;
    }
    publisher.flush().await;
    eventually(Duration::from_secs(10), "ten sent and lost", || async {
        stack.broker.held_messages().await == 10 && proxy.lost().1 >= 10 * 25
    })
    .await;
    proxy.cut();
    proxy.lose(false, false);
    proxy.restore();
    eventually(Duration::from_secs(60), "every reading stored", || async {
        stored(&stack).await == BEFORE + 10
    })
    .await;
    stack.all_acknowledged().await;
    stack.palletd.settled().await;
    assert_eq!(stored(&stack).await, BEFORE + 10, "none twice");
    assert_eq!(
        stack
            .palletd
            .metric("palletd_redeliveries_skipped_total", None),
        0.0
    );
    stack.stop();
}

/// aedes grants `$share/` subscriptions and delivers nothing through
/// them: with the default four connections palletd proves it with its
/// probe, goes on with one connection, unshared, says so (WARN, the
/// metric, the status page), and stores every reading of a real series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_without_shared_subscriptions_gets_one_unshared_connection() {
    let aedes = Aedes::start();
    let db = Database::start();
    let config = Config::new_with(&aedes.url(), aedes.dir.path(), &db, "aedes");
    let palletd = Palletd::start(&config);
    palletd.ready().await;
    // The weekly CO2 series of Mauna Loa, as a device would send it.
    let mut opts = rumqttc::MqttOptions::new("pub-aedes", "127.0.0.1", aedes.port);
    opts.set_inflight(100);
    let (client, mut eventloop) = rumqttc::AsyncClient::new(opts, 100);
    let (acked, mut acks) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(ev) = eventloop.poll().await {
            if let rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_)) = ev {
                let _ = acked.send(());
            }
        }
    });
    let series = co2();
    assert!(series.len() > 2000, "the whole series: {}", series.len());
    let mut sent = Vec::new();
    for (seq, (date, ppm)) in series.iter().enumerate() {
        let payload = serde_json::json!({ "seq": seq, "co2": ppm, "week": date });
        client
            .publish(
                "sensors/mauna-loa/telemetry",
                rumqttc::QoS::AtLeastOnce,
                false,
                payload.to_string(),
            )
            .await
            .unwrap();
        sent.push(("mauna-loa".to_string(), seq as i64));
    }
    for _ in 0..series.len() {
        tokio::time::timeout(Duration::from_secs(60), acks.recv())
            .await
            .expect("aedes acknowledged every publish");
    }
    let mongo = db.client().await;
    assert_exactly_once(&mongo, "aedes", &sent, Duration::from_secs(60)).await;
    // What was stored is the file's series.
    let mut stored: Vec<(i64, f64)> = all_docs(&mongo, "aedes", "readings")
        .await
        .iter()
        .flat_map(|b| b.get_array("samples").unwrap().clone())
        .map(|s| {
            let s = s.as_document().unwrap().clone();
            (s.get_f64("week").unwrap() as i64, s.get_f64("co2").unwrap())
        })
        .collect();
    stored.sort_by_key(|s| s.0);
    assert_eq!(stored, series);
    let scrape = palletd.scrape();
    assert_eq!(
        metric(
            &scrape,
            "palletd_broker_shared_subscriptions",
            Some(("state", "not_delivered"))
        ),
        1.0
    );
    assert_eq!(metric(&scrape, "palletd_broker_connections_up", None), 1.0);
    let log = palletd.log();
    assert!(
        log.contains("does not deliver through shared subscriptions"),
        "{log}"
    );
    let (_, page) = http_get(palletd.http_port, "/");
    assert!(page.contains("NOT delivered by the broker"), "{page}");
    let mut palletd = palletd;
    assert_eq!(palletd.terminate(), Some(0), "{}", palletd.log());
}

/// Mosquitto delivers through `$share/`: the probe proves it, and the
/// default four connections share the messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_is_seen_to_deliver_through_the_shared_group() {
    let mut stack = Stack::start("delivered", |c| c).await;
    stack.palletd.connections_up(4.0).await;
    assert_eq!(
        stack.palletd.metric(
            "palletd_broker_shared_subscriptions",
            Some(("state", "delivered"))
        ),
        1.0
    );
    let sent = publish_steadily(stack.publisher().await, 10, 500.0, 200).await;
    assert_exactly_once(&stack.client, "delivered", &sent, Duration::from_secs(60)).await;
    let (_, page) = http_get(stack.palletd.http_port, "/");
    assert!(
        page.contains("delivered by the broker (verified)"),
        "{page}"
    );
    assert!(!stack.palletd.log().contains("does not deliver"));
    stack.all_acknowledged().await;
    stack.stop();
}

/// Sessions retired while ingest is paused (the spool full, the database
/// down) keep what they hold until it is spooled and acknowledged: none is
/// retired early, SIGTERM still ends palletd cleanly, and once the
/// database is back every reading is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_retired_while_the_spool_is_full_strand_and_double_nothing() {
    let mut stack = Stack::without_database("retirefull", |c| {
        c.set("mqtt.connections", 4)
            .set("spool.max_size", "64KiB")
            .set("spool.compress", false)
    })
    .await;
    stack.palletd.connections_up(4.0).await;
    stack.stop();
    // While palletd is down the broker queues for all four sessions.
    let sent = publish_steadily(stack.publisher().await, 10, 2000.0, 2000).await;
    stack.config = stack.config.clone().set("mqtt.connections", 2);
    stack.palletd = Palletd::start_with(
        &stack.config,
        Run {
            args: &["--shutdown-timeout", "5s"],
            ..Default::default()
        },
    );
    stack
        .palletd
        .wait_metric("palletd_spool_bytes", 64.0 * 1024.0)
        .await;
    stack
        .palletd
        .wait_for_log("Spool is full", Duration::from_secs(30))
        .await;
    let sessions = stack.config.settings().spool.dir.join("mqtt-sessions.json");
    let held = || std::fs::read_to_string(&sessions).unwrap_or_default();
    // Longer than a session needs to be quiet to retire: a retiring
    // session that still holds unacknowledged messages waits, and stays
    // listed. (One whose messages all reached the spool before it filled
    // may retire: which one that is depends on the broker's order. That
    // none retired with messages not spooled shows at the end: every
    // reading stored once.)
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        held().contains("retirefull-2") || held().contains("retirefull-3"),
        "every retiring session retired while the spool was full: {}",
        held()
    );
    assert!(stack.broker.held_messages().await > 0);
    // With the database down a stop ends within its deadline, naming what
    // stays in the spool (exit 1, as documented): no session holds it up.
    let stopped = std::time::Instant::now();
    assert_eq!(
        stack.palletd.terminate(),
        Some(1),
        "{}",
        stack.palletd.log()
    );
    assert!(stopped.elapsed() < Duration::from_secs(20));
    let log = stack.palletd.log();
    assert!(
        log.contains("kept in the spool for the next start"),
        "{log}"
    );
    stack.db.start_again();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    assert_exactly_once(&stack.client, "retirefull", &sent, Duration::from_secs(120)).await;
    stack
        .palletd
        .wait_until(Duration::from_secs(60), "sessions 2 and 3 retired", |_| {
            !held().contains("retirefull-2") && !held().contains("retirefull-3")
        })
        .await;
    stack.all_acknowledged().await;
    stack.stop();
}
