//! Faults with real processes: palletd killed under load, a database outage,
//! an ambiguous write, a torn spool, a full spool, a broker restart. Each
//! ends by comparing what was published with what the buckets hold.

mod common;

use std::time::Duration;

use rand::{Rng, SeedableRng};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_five_times_under_load_stores_every_reading_exactly_once() {
    let broker = Broker::start();
    let db = Database::start();
    let cfg = config(
        &broker,
        &db,
        "crash",
        "palletd-crash",
        "[flush]\ninterval = \"300ms\"\n",
    );
    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let publisher = Publisher::connect(&broker, "pub-crash").await;
    let stream = tokio::spawn(publish_steadily(publisher, 20, 250.0, 3000));
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(700..2000))).await;
        palletd.kill();
        palletd = Palletd::start(&cfg);
    }
    let sent = stream.await.unwrap();
    let client = db.client().await;
    assert_exactly_once(&client, "crash", &sent, Duration::from_secs(120)).await;
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_keeps_acknowledging_from_the_spool_and_loses_nothing() {
    let broker = Broker::start();
    let mut db = Database::start();
    let cfg = config(&broker, &db, "outage", "palletd-outage", "");
    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let publisher = Publisher::connect(&broker, "pub-outage").await;
    // 70 s of readings at 100/s; the database is away for 60 s of them.
    let stream = tokio::spawn(publish_steadily(publisher, 20, 100.0, 7000));
    tokio::time::sleep(Duration::from_secs(4)).await;
    db.stop();
    let mut most_held = 0;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(9)).await;
        most_held = most_held.max(broker_held_messages(&broker).await);
    }
    assert!(
        most_held <= 150,
        "the broker's queue for palletd stayed small: {most_held}"
    );
    db.start_again();
    let sent = stream.await.unwrap();
    let client = db.client().await;
    assert_exactly_once(&client, "outage", &sent, Duration::from_secs(120)).await;
    assert_eq!(broker_held_messages(&broker).await, 0);
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_applied_without_a_reply_is_not_applied_twice() {
    let broker = Broker::start();
    let db = Database::start();
    let proxy = CutProxy::start(db.port).await;
    let cfg =
        config(&broker, &db, "ambiguous", "palletd-ambiguous", "").replace(&db.uri(), &proxy.uri());
    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    palletd.wait_for_log("Indexes are in place.", Duration::from_secs(30));
    proxy.arm();
    let publisher = Publisher::connect(&broker, "pub-ambiguous").await;
    let sent = publish_steadily(publisher, 5, 200.0, 100).await;
    let client = db.client().await;
    assert_exactly_once(&client, "ambiguous", &sent, Duration::from_secs(60)).await;
    assert_eq!(
        proxy.cuts.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one reply was dropped"
    );
    assert!(
        palletd
            .log()
            .contains("An interrupted write had been applied"),
        "{}",
        palletd.log()
    );
    assert_eq!(palletd.terminate(), Some(0));
}

/// The newest spool segment of a palletd run.
fn last_segment(broker: &Broker, client_id: &str) -> std::path::PathBuf {
    let dir = broker.dir.path().join(format!("spool-{client_id}"));
    let mut segments: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    segments.pop().expect("a spool segment")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_spool_tail_loses_only_that_record() {
    let broker = Broker::start();
    let mut db = Database::start();
    db.stop();
    let cfg = config(&broker, &db, "torn", "palletd-torn", "");
    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let publisher = Publisher::connect(&broker, "pub-torn").await;
    let sent = publish_steadily(publisher, 1, 500.0, 50).await;
    eventually(
        Duration::from_secs(30),
        "all acknowledged from the spool",
        || async { broker_held_messages(&broker).await == 0 },
    )
    .await;
    palletd.kill();
    // Power lost in the middle of the last write: its tail is missing.
    let segment = last_segment(&broker, "palletd-torn");
    let len = std::fs::metadata(&segment).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len - 3)
        .unwrap();

    db.start_again();
    let mut palletd = Palletd::start(&cfg);
    let client = db.client().await;
    let (last, rest) = sent.split_last().unwrap();
    assert_exactly_once(&client, "torn", rest, Duration::from_secs(60)).await;
    assert!(!stored_counts(&client, "torn").await.contains_key(last));
    assert!(palletd.log().contains("torn record"), "{}", palletd.log());
    assert!(
        all_docs(&client, "torn", "readings_deadletter")
            .await
            .is_empty(),
        "no garbage replayed"
    );
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_stops_acknowledging_and_resumes_when_the_database_returns() {
    let broker = Broker::start_with("max_inflight_messages 100\nmax_queued_messages 100000\n");
    let mut db = Database::start();
    db.stop();
    let cfg = config(&broker, &db, "full", "palletd-full", "")
        .replace("[spool]\n", "[spool]\nmax_size = \"64KiB\"\n");
    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let publisher = Publisher::connect(&broker, "pub-full").await;
    let sent = publish_steadily(publisher, 10, 2000.0, 2000).await;
    palletd.wait_for_log("Spool is full", Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = broker_held_messages(&broker).await;
    assert!(held > 0, "the broker keeps what palletd could not spool");
    db.start_again();
    let client = db.client().await;
    assert_exactly_once(&client, "full", &sent, Duration::from_secs(120)).await;
    eventually(
        Duration::from_secs(30),
        "the broker holds nothing",
        || async { broker_held_messages(&broker).await == 0 },
    )
    .await;
    assert!(
        palletd.log().contains("Spool has room again"),
        "{}",
        palletd.log()
    );
    assert_eq!(palletd.terminate(), Some(0));
}

/// A second subscriber with its own kept session: what the broker delivered
/// to it is what the broker had to offer palletd.
async fn observer(
    broker: &Broker,
) -> std::sync::Arc<std::sync::Mutex<std::collections::HashSet<(String, i64)>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let mut opts = rumqttc::MqttOptions::new("observer", "127.0.0.1", broker.port);
    opts.set_clean_session(false);
    let (client, mut eventloop) = rumqttc::AsyncClient::new(opts, 100);
    client
        .subscribe("sensors/+/telemetry", rumqttc::QoS::AtLeastOnce)
        .await
        .unwrap();
    let out = seen.clone();
    tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(ack)))
                    if !ack.session_present =>
                {
                    let _ = client.try_subscribe("sensors/+/telemetry", rumqttc::QoS::AtLeastOnce);
                }
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                    let sensor = p.topic.split('/').nth(1).unwrap_or_default().to_string();
                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&p.payload) {
                        if let Some(seq) = v["seq"].as_i64() {
                            out.lock().unwrap().insert((sensor, seq));
                        }
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    // Subscribed before the stream starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_loses_nothing() {
    let mut broker = Broker::start();
    let db = Database::start();
    let cfg = config(&broker, &db, "restart", "palletd-restart", "");
    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let seen = observer(&broker).await;
    let publisher = Publisher::connect_persistent(&broker, "pub-restart").await;
    let stream = tokio::spawn(publish_steadily(publisher, 10, 100.0, 1000));
    tokio::time::sleep(Duration::from_secs(4)).await;
    broker.restart();
    let sent = stream.await.unwrap();
    palletd.wait_for_log("Reconnected to the MQTT broker.", Duration::from_secs(30));
    let client = db.client().await;
    // Every published reading is stored. An independent subscriber with a
    // kept session tells, on failure, whether the broker itself lost any
    // (it forgets sessions when it cannot write its persistence file).
    let all_stored = async {
        loop {
            let stored = stored_counts(&client, "restart").await;
            if sent.iter().all(|k| stored.contains_key(k)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(120), all_stored)
        .await
        .is_err()
    {
        let stored = stored_counts(&client, "restart").await;
        let seen = seen.lock().unwrap().clone();
        let missing: Vec<_> = sent.iter().filter(|k| !stored.contains_key(*k)).collect();
        panic!(
            "{} of {} published readings are missing, e.g. {:?} (the broker delivered {} of {} to another subscriber)\n{}",
            missing.len(),
            sent.len(),
            &missing[..missing.len().min(10)],
            seen.len(),
            sent.len(),
            palletd.log()
        );
    }
    let lost_by_broker = sent
        .iter()
        .filter(|k| !seen.lock().unwrap().contains(*k))
        .count();
    eprintln!(
        "readings the broker lost in its restart: {lost_by_broker} of {}",
        sent.len()
    );
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spooled_samples_too_big_for_a_lowered_cap_are_dead_lettered_not_dropped() {
    let broker = Broker::start();
    let mut db = Database::start();
    db.stop();
    let cfg = config(&broker, &db, "lowered", "palletd-lowered", "");
    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let mut publisher = Publisher::connect(&broker, "pub-lowered").await;
    for seq in 0..5 {
        let pad = if seq % 2 == 0 {
            "x".repeat(500)
        } else {
            String::new()
        };
        let payload = serde_json::json!({ "seq": seq, "pad": pad });
        publisher
            .publish("sensors/big1/telemetry", payload.to_string())
            .await;
    }
    publisher.flush().await;
    eventually(
        Duration::from_secs(30),
        "all spooled and acknowledged",
        || async { broker_held_messages(&broker).await == 0 },
    )
    .await;
    palletd.kill();

    // The operator lowers the byte cap before the spool is replayed.
    db.start_again();
    let lowered = cfg.replace("[spool]\n", "[bucket]\nmax_bytes = 256\n\n[spool]\n");
    let mut palletd = Palletd::start(&lowered);
    let client = db.client().await;
    eventually(
        Duration::from_secs(60),
        "every sample stored or dead-lettered",
        || async {
            stored_samples(&client, "lowered").await
                + all_docs(&client, "lowered", "readings_deadletter")
                    .await
                    .len()
                >= 5
        },
    )
    .await;
    let stored = stored_counts(&client, "lowered").await;
    let mut kept: Vec<i64> = stored.keys().map(|k| k.1).collect();
    kept.sort_unstable();
    assert_eq!(kept, vec![1, 3]);
    let dead = all_docs(&client, "lowered", "readings_deadletter").await;
    assert_eq!(dead.len(), 3);
    assert!(dead
        .iter()
        .all(|d| d.get_str("cause") == Ok("sample_too_large")));
    assert_eq!(palletd.terminate(), Some(0));
}
