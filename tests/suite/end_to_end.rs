//! palletd end to end: a real Mosquitto, a real SecantusDB, palletd as a
//! child process. Each test starts its own services on free ports.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bson::Bson;
use rand::{Rng, SeedableRng};

use common::*;

/// What a published reading must look like once stored.
#[derive(Debug, Clone)]
struct Expected {
    /// `None`: no timestamp was sent, so it is the arrival time.
    ts_ms: Option<i64>,
    fields: BTreeMap<String, Bson>,
}

/// A timestamp in one of the accepted forms, and the milliseconds it means.
fn timestamp(rng: &mut impl Rng, ts_ms: i64) -> (Option<serde_json::Value>, Option<i64>) {
    let dt = chrono::DateTime::from_timestamp_millis(ts_ms).unwrap();
    match rng.gen_range(0..7) {
        0 => (
            Some(
                dt.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                    .into(),
            ),
            Some(ts_ms),
        ),
        1 => {
            let offset = chrono::FixedOffset::east_opt(2 * 3600).unwrap();
            (
                Some(dt.with_timezone(&offset).to_rfc3339().into()),
                Some(ts_ms),
            )
        }
        2 => (Some((ts_ms / 1000).into()), Some(ts_ms / 1000 * 1000)),
        3 => (Some(ts_ms.into()), Some(ts_ms)),
        4 => (
            Some((ts_ms * 1000 + rng.gen_range(0..1000)).into()),
            Some(ts_ms),
        ),
        5 => (
            Some((ts_ms * 1_000_000 + rng.gen_range(0..1_000_000)).into()),
            Some(ts_ms),
        ),
        _ => (None, None),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_payloads_from_50_sensors_are_stored_exactly_once() {
    let mut stack = Stack::start("mixed", |c| c).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut publisher = stack.publisher().await;
    let mut expected: HashMap<(String, i64), Expected> = HashMap::new();
    let started = now_ms();
    let mut seq = 0i64;
    while seq < 10_000 {
        let sensor = format!("s{:02}", rng.gen_range(0..50));
        let form = rng.gen_range(0..10);
        if form == 0 {
            // A bare number: field name from the topic, arrival time.
            seq += 1;
            publisher
                .publish(&format!("plant/{sensor}/seq"), seq.to_string())
                .await;
            let fields = BTreeMap::from([("seq".to_string(), Bson::Double(seq as f64))]);
            expected.insert(
                (sensor, seq),
                Expected {
                    ts_ms: None,
                    fields,
                },
            );
            continue;
        }
        let n = if form < 4 {
            rng.gen_range(1..=6).min(10_000 - seq)
        } else {
            1
        };
        let mut objects = Vec::new();
        for _ in 0..n {
            seq += 1;
            let ts = started - rng.gen_range(0..3 * HOUR_MS);
            let (ts_json, ts_ms) = timestamp(&mut rng, ts);
            let temp = (rng.gen_range(-200..400) as f64) / 10.0;
            let mut obj = serde_json::json!({ "seq": seq, "temp": temp });
            let mut fields = BTreeMap::from([
                ("seq".to_string(), Bson::Double(seq as f64)),
                ("temp".to_string(), Bson::Double(temp)),
            ]);
            if rng.gen_bool(0.5) {
                let h = rng.gen_range(0..100) as f64;
                obj["humidity"] = h.into();
                fields.insert("humidity".into(), Bson::Double(h));
            }
            if rng.gen_bool(0.2) {
                obj["status"] = "ok".into();
                fields.insert("status".into(), Bson::String("ok".into()));
            }
            if rng.gen_bool(0.2) {
                obj["door"] = true.into();
                fields.insert("door".into(), Bson::Boolean(true));
            }
            if rng.gen_bool(0.1) {
                obj["dropped"] = serde_json::Value::Null;
            }
            if let Some(t) = ts_json {
                obj["ts"] = t;
            }
            objects.push(obj);
            expected.insert((sensor.clone(), seq), Expected { ts_ms, fields });
        }
        let payload = if form < 4 {
            serde_json::Value::Array(objects)
        } else {
            objects.pop().unwrap()
        };
        publisher
            .publish(&format!("sensors/{sensor}/telemetry"), payload.to_string())
            .await;
    }
    publisher.flush().await;
    assert_eq!(expected.len(), 10_000);

    eventually(
        Duration::from_secs(120),
        "all 10,000 readings stored",
        || async { stack.stored().await >= 10_000 },
    )
    .await;
    // Nothing left that could still show up twice before counting exactly.
    stack.palletd.settled().await;
    let finished = now_ms();

    let buckets = stack.docs("readings").await;
    for b in &buckets {
        check_bucket(b, HOUR_MS, 200, 256 * 1024);
    }
    let stored = unwind(&buckets);
    assert_eq!(stored.len(), expected.len(), "same set of (sensor, seq)");
    for (key, want) in &expected {
        let got = stored.get(key).unwrap_or_else(|| panic!("{key:?} missing"));
        assert_eq!(got.len(), 1, "{key:?} stored {} times", got.len());
        let (ts, sample) = &got[0];
        match want.ts_ms {
            Some(t) => assert_eq!(*ts, t, "{key:?} ts"),
            None => assert!((started..=finished).contains(ts), "{key:?} arrival ts {ts}"),
        }
        let fields: BTreeMap<String, Bson> =
            sample.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(&fields, &want.fields, "{key:?} fields");
    }
    assert!(stack.docs("readings_deadletter").await.is_empty());
    // Every message was acknowledged once stored: the broker holds none.
    stack.all_acknowledged().await;
    stack.stop();
}

/// Publishes `n` single readings of one sensor, all in the current window.
async fn publish_in_one_window(stack: &Stack, sensor: &str, n: i64, pad: usize) {
    let mut publisher = stack.publisher().await;
    let start = now_ms().div_euclid(HOUR_MS) * HOUR_MS;
    for i in 0..n {
        let payload = serde_json::json!({ "ts": start + i, "seq": i, "pad": "x".repeat(pad) });
        publisher.json(sensor, payload).await;
    }
    publisher.flush().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_bucket_rolls_over_to_new_document() {
    let mut stack = Stack::start("rollover", |c| c.max_samples(7)).await;
    publish_in_one_window(&stack, "r1", 30, 0).await;
    stack.wait_stored(30).await;
    let buckets = stack.docs("readings").await;
    for b in &buckets {
        check_bucket(b, HOUR_MS, 7, 256 * 1024);
    }
    let mut counts: Vec<i32> = buckets
        .iter()
        .map(|b| b.get_i32("count").unwrap())
        .collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(
        counts,
        vec![7, 7, 7, 7, 2],
        "all buckets but the last are full"
    );
    assert_eq!(unwind(&buckets).len(), 30);
    stack.stop();
}

/// After a restart palletd learns the fill of the window's newest bucket
/// (by `_id`, four sequence numbers a round) and continues it, also when
/// the window has more buckets than one round asks for: 23 readings in
/// buckets of 5 are buckets 0-4 (the last holds 3); after a restart 4 more
/// fill bucket 4 and start bucket 5, with no collision. (Asked only for
/// 0-3, palletd would take bucket 4 for empty, send it 4 samples that do
/// not fit, and collide.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_continues_the_newest_bucket_of_a_window_with_many() {
    let mut stack = Stack::start("continue", |c| c.max_samples(5)).await;
    publish_in_one_window(&stack, "c1", 23, 0).await;
    stack.wait_stored(23).await;
    stack.stop();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    let mut publisher = stack.publisher().await;
    let start = now_ms().div_euclid(HOUR_MS) * HOUR_MS;
    for i in 23..27 {
        publisher
            .json("c1", serde_json::json!({ "ts": start + i, "seq": i }))
            .await;
    }
    publisher.flush().await;
    stack.wait_stored(27).await;
    let mut counts: Vec<(String, i32)> = (stack.docs("readings").await.iter())
        .map(|b| {
            let id = b.get_str("_id").unwrap().to_string();
            (id, b.get_i32("count").unwrap())
        })
        .collect();
    counts.sort();
    let counts: Vec<i32> = counts.into_iter().map(|c| c.1).collect();
    assert_eq!(counts, [5, 5, 5, 5, 5, 2], "buckets 0-5 of the window");
    assert_eq!(
        stack
            .palletd
            .metric("palletd_bucket_id_collisions_total", None),
        0.0
    );
    stack.stop();
}

/// Another writer fills the buckets palletd is extending, for 40 sensors at
/// once (a second instance, or palletd's own backlog lane after an outage:
/// each lane knows only its own fills). palletd's next statements of those
/// sensors meet full buckets; the first collision makes it look the rest
/// of the write's buckets up again (one query) before it sends the rest,
/// so a write costs one collision round, not one per sensor (before, the
/// rest of the command was sent again after each: over a 2 Mbit/s link a
/// write of 1,000 sensors' statements took tens of minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_filled_behind_palletds_back_cost_one_collision_round() {
    const SENSORS: usize = 40;
    let mut stack = Stack::start("behindback", |c| c.max_samples(5).max_delay("2s")).await;
    let start = now_ms().div_euclid(HOUR_MS) * HOUR_MS;
    let mut publisher = stack.publisher().await;
    let publish = |seq: i64| serde_json::json!({ "ts": start + seq, "seq": seq });
    for k in 0..SENSORS {
        for seq in 0..2 {
            publisher.json(&format!("w{k:02}"), publish(seq)).await;
        }
    }
    publisher.flush().await;
    stack.wait_stored(2 * SENSORS).await;
    // Another writer filled every bucket (as far as its count says).
    let coll = stack
        .client
        .database(&stack.config.database())
        .collection::<bson::Document>("readings");
    let filled = coll
        .update_many(bson::doc! {}, bson::doc! { "$set": { "count": 5 } })
        .await
        .unwrap();
    assert_eq!(filled.modified_count, SENSORS as u64);
    for k in 0..SENSORS {
        publisher.json(&format!("w{k:02}"), publish(2)).await;
    }
    publisher.flush().await;
    stack.wait_stored(3 * SENSORS).await;
    let buckets = stack.docs("readings").await;
    let stored = unwind(&buckets);
    assert_eq!(stored.len(), 3 * SENSORS, "every reading once");
    assert!(stored.values().all(|v| v.len() == 1), "every reading once");
    for b in &buckets {
        let id = b.get_str("_id").unwrap();
        let expected = if id.ends_with("|0") {
            vec![0, 1]
        } else {
            vec![2]
        };
        let mut got = seqs(b);
        got.sort();
        assert_eq!(got, expected, "{id}");
    }
    let collisions = stack
        .palletd
        .metric("palletd_bucket_id_collisions_total", None);
    assert!(
        collisions <= 4.0,
        "{collisions} collisions for {SENSORS} sensors' full buckets: one round per write"
    );
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_rolls_over_at_the_byte_cap() {
    let mut stack = Stack::start("bysize", |c| {
        c.max_samples(1000).set("bucket.max_bytes", 1000)
    })
    .await;
    publish_in_one_window(&stack, "b1", 40, 100).await;
    stack.wait_stored(40).await;
    let buckets = stack.docs("readings").await;
    assert!(buckets.len() > 1, "the byte cap started several buckets");
    let mut not_full = 0;
    for b in &buckets {
        check_bucket(b, HOUR_MS, 1000, 1000);
        // A statement of one more sample costs its document and, once,
        // the summaries of its numeric fields (sum, n, min, max, avg, and
        // first and last as {t, v}).
        let first = b.get_array("samples").unwrap()[0].as_document().unwrap();
        let summaries: usize = first
            .iter()
            .filter(|(_, v)| matches!(v, bson::Bson::Double(_)))
            .map(|(k, _)| 7 * k.len() + 108)
            .sum();
        let one = (bson::to_vec(first).unwrap().len() + summaries) as i32;
        if b.get_i32("size").unwrap() + one <= 1000 {
            not_full += 1;
        }
    }
    // (The last may be full too: 40 samples can fill the buckets exactly.)
    assert!(not_full <= 1, "all buckets but the last are full by size");
    assert_eq!(unwind(&buckets).len(), 40);
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readings_are_acknowledged_once_spooled_and_stored_after_a_crash() {
    let mut stack = Stack::without_database("ackafter", |c| c).await;
    let mut publisher = stack.publisher().await;
    for seq in 0..150 {
        let payload = serde_json::json!({ "seq": seq, "temp": 20.5 });
        publisher.json("a1", payload).await;
    }
    publisher.flush().await;
    // The database is down, yet every message is acknowledged: it is durable
    // in the spool, so the broker holds none of them.
    stack.all_acknowledged().await;
    stack.palletd.kill();

    stack.db.start_again();
    let mut stack = Stack::on(stack.broker, stack.db, "ackafter", |c| c).await;
    stack.wait_stored(150).await;
    stack.palletd.settled().await;
    let stored = unwind(&stack.docs("readings").await);
    assert_eq!(stored.len(), 150);
    assert!(
        stored.values().all(|v| v.len() == 1),
        "no reading stored twice"
    );
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_goes_to_the_dead_letter_and_good_readings_are_stored() {
    // A first run subscribes to a topic the second run's config no longer
    // has; the persistent sessions queue what is published to it while
    // palletd is down, so that arrives at a palletd that has no pattern for
    // it (which then unsubscribes the topic: nothing more comes).
    let mut first = Stack::start("garbage", |c| c.subscribe("legacy/{sensor}")).await;
    first.stop();
    let mut publisher = Publisher::connect(&first.broker, "pub-garbage-legacy").await;
    publisher
        .publish("legacy/g1", br#"{"temp": 1}"#.to_vec())
        .await;
    publisher.flush().await;
    let mut stack = Stack::on(first.broker, first.db, "garbage", |c| c).await;

    let now = now_ms();
    let garbage: Vec<(&str, Vec<u8>, &str)> = vec![
        ("sensors/g1/telemetry", b"{not json".to_vec(), "bad_payload"),
        ("sensors/g1/telemetry", b"[1, 2]".to_vec(), "bad_payload"),
        (
            "sensors/g1/telemetry",
            b"\"just text\"".to_vec(),
            "bad_payload",
        ),
        (
            "sensors/g1/telemetry",
            vec![b'7'; 1_000_000],
            "payload_too_large",
        ),
        (
            "sensors//telemetry",
            br#"{"temp": 1}"#.to_vec(),
            "bad_sensor",
        ),
        (
            "sensors/g1/telemetry",
            br#"{"ts": "last tuesday", "temp": 1}"#.to_vec(),
            "bad_timestamp",
        ),
        (
            "sensors/g1/telemetry",
            serde_json::json!({"ts": now + 365 * 24 * HOUR_MS, "temp": 1})
                .to_string()
                .into_bytes(),
            "time_out_of_range",
        ),
        // Nested objects are flattened into fields; a value nested deeper
        // than 16 levels is left out, and nothing else is there.
        (
            "sensors/g1/telemetry",
            format!("{{\"o\": {}1{}}}", "[".repeat(17), "]".repeat(17)).into_bytes(),
            "bad_field",
        ),
        ("sensors/g1/telemetry", br#"{"": 1}"#.to_vec(), "bad_field"),
        ("plant/g1/temp", b"warm".to_vec(), "bad_payload"),
    ];
    let mut publisher = stack.publisher().await;
    let mut good = 0;
    for (topic, payload, _) in &garbage {
        publisher.publish(topic, payload.clone()).await;
        for _ in 0..3 {
            good += 1;
            let payload = serde_json::json!({ "seq": good, "temp": 19.0 });
            publisher.json("ok1", payload).await;
        }
    }
    publisher.flush().await;

    eventually(
        Duration::from_secs(60),
        "dead letters and good readings stored",
        || async {
            stack.docs("readings_deadletter").await.len() > garbage.len()
                && stack.stored().await >= good as usize
        },
    )
    .await;
    stack.palletd.settled().await;
    let dead = stack.docs("readings_deadletter").await;
    assert_eq!(
        dead.len(),
        garbage.len() + 1,
        "one dead letter per bad message, the legacy one too"
    );
    let mut causes: Vec<&str> = dead.iter().map(|d| d.get_str("cause").unwrap()).collect();
    let mut want: Vec<&str> = garbage.iter().map(|g| g.2).collect();
    want.push("unknown_topic");
    causes.sort_unstable();
    want.sort_unstable();
    assert_eq!(causes, want);
    for d in &dead {
        assert!(d.get_datetime("receivedAt").is_ok());
        assert!(!d.get_str("error").unwrap().is_empty());
        assert!(d.get_str("topic").is_ok());
        assert!(matches!(d.get("payload"), Some(Bson::Binary(_))));
    }
    let big = dead
        .iter()
        .find(|d| d.get_str("cause") == Ok("payload_too_large"))
        .unwrap();
    assert_eq!(big.get_i64("payloadSize"), Ok(1_000_000));
    let buckets = stack.docs("readings").await;
    let stored = unwind(&buckets);
    assert_eq!(stored.len(), good as usize, "every good reading stored");
    assert!(
        buckets.iter().all(|b| b.get_str("sensorId") == Ok("ok1")),
        "no garbage in a bucket"
    );
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stores_pending_samples_and_exits_zero() {
    // A long interval and a large in-flight allowance: nothing is flushed
    // until shutdown.
    let mut stack = Stack::start("sigterm", |c| {
        c.max_delay("1h").set("mqtt.max_inflight", 1000)
    })
    .await;
    let mut publisher = stack.publisher().await;
    for seq in 0..60 {
        let payload = serde_json::json!({ "seq": seq, "v": seq });
        publisher.json("t1", payload).await;
    }
    publisher.flush().await;
    // All 60 are in palletd's memory (not only decoded and spooled).
    stack
        .palletd
        .wait_metric("palletd_pending_samples", 60.0)
        .await;
    assert_eq!(stack.stored().await, 0, "nothing flushed before SIGTERM");

    stack.stop();
    assert!(stack
        .palletd
        .log()
        .contains("Flushing buffered samples before exit."));
    let stored = unwind(&stack.docs("readings").await);
    assert_eq!(stored.len(), 60, "every pending sample stored before exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_timeout_exits_nonzero_and_says_what_was_left() {
    let broker = Broker::start();
    let mut db = Database::start();
    db.stop();
    let cfg = Config::new(&broker, &db, "timeout");
    let mut palletd = Palletd::start_with(
        &cfg,
        Run {
            args: &["--shutdown-timeout", "2s"],
            ..Run::default()
        },
    );
    palletd.subscribed().await;
    let mut publisher = Publisher::connect(&broker, "pub-timeout").await;
    for seq in 0..5 {
        publisher
            .json("x1", serde_json::json!({ "seq": seq }))
            .await;
    }
    publisher.flush().await;
    palletd.wait_metric("palletd_pending_samples", 5.0).await;
    // A flush is retrying against the absent database.
    palletd
        .wait_metric("palletd_database_errors_total", 1.0)
        .await;
    assert_eq!(palletd.terminate(), Some(1));
    let log = palletd.log();
    assert!(log.contains("shutdown timed out"), "{log}");
    assert!(log.contains("5 sample(s)"), "{log}");
    assert!(log.contains("0 message(s) not acknowledged"), "{log}");
    // What was left is in the spool: the next run stores it.
    db.start_again();
    let mut stack = Stack::on(broker, db, "timeout", |c| c).await;
    eventually(Duration::from_secs(30), "the 5 readings stored", || async {
        stack.stored().await == 5
    })
    .await;
    stack.stop();
}
