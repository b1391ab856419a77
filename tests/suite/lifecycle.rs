//! Bucket lifecycle against the real broker and database: the closer, late
//! and out-of-order data, clock problems, restart recovery and retention.

use crate::common;

use std::time::Duration;

use bson::{doc, Bson, Document};

use common::*;

/// Publishes readings `seq` at `start + seq` ms and waits for the broker.
async fn publish_seqs(
    publisher: &mut Publisher,
    sensor: &str,
    start: i64,
    seqs: std::ops::Range<i64>,
) {
    for seq in seqs {
        publisher
            .json(sensor, serde_json::json!({ "ts": start + seq, "seq": seq }))
            .await;
    }
    publisher.flush().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closer_seals_ended_windows_and_late_samples_start_a_second_bucket() {
    let mut stack = Stack::start("closer", |c| {
        c.window("1s").closer("1s", "1s").max_delay("200ms")
    })
    .await;
    let mut publisher = stack.publisher().await;
    // The next one-second window; samples out of order inside it.
    let w0 = now_ms().div_euclid(1000) * 1000 + 1000;
    for (seq, off) in [700, 100, 500, 300, 900].into_iter().enumerate() {
        let v = serde_json::json!({ "ts": w0 + off, "seq": seq, "temp": 20.0 + seq as f64, "hum": 40 + seq });
        publisher.json("c1", v).await;
    }
    publisher.flush().await;

    eventually(Duration::from_secs(20), "the bucket is sealed", || async {
        let b = stack.docs("readings").await;
        b.len() == 1 && b[0].get_bool("closed") == Ok(true)
    })
    .await;
    let sealed = stack.docs("readings").await.remove(0);
    check_sealed(&sealed);
    assert_eq!(sealed.get_i32("count"), Ok(5));
    // Its samples were confirmed (the spool's checkpoint, published at the
    // seal, is past them): no replay needs its LSN pairs, and the sealed
    // bucket has none.
    assert!(!sealed.contains_key("lsns"), "{sealed}");
    let published = stack.docs("readings_spools").await;
    assert!(
        published.iter().any(|d| d.get_i64("checkpoint").is_ok()),
        "{published:?}"
    );
    assert_eq!(
        sealed.get_datetime("startTs").unwrap().timestamp_millis(),
        w0
    );

    // A late sample for the sealed window: a second bucket of that window.
    let v = serde_json::json!({ "ts": w0 + 50, "seq": 99, "temp": 1.0 });
    publisher.json("c1", v).await;
    publisher.flush().await;
    eventually(
        Duration::from_secs(20),
        "the late bucket is stored and sealed",
        || async {
            let b = stack.docs("readings").await;
            b.len() == 2 && b.iter().all(|b| b.get_bool("closed") == Ok(true))
        },
    )
    .await;
    // Each bucket addressed by sensor, window and its number in the window.
    assert_eq!(sealed.get_str("_id"), Ok(format!("c1|{w0}|0").as_str()));
    let buckets = stack.docs("readings").await;
    let first = buckets
        .iter()
        .find(|b| b.get("_id") == sealed.get("_id"))
        .unwrap();
    assert_eq!(first, &sealed, "a sealed bucket is never written again");
    let late = buckets
        .iter()
        .find(|b| b.get("_id") != sealed.get("_id"))
        .unwrap();
    assert_eq!(late.get_str("_id"), Ok(format!("c1|{w0}|1").as_str()));
    assert_eq!(late.get_datetime("startTs").unwrap().timestamp_millis(), w0);
    assert_eq!(seqs(late), vec![99]);
    check_sealed(late);
    assert!(!late.contains_key("lsns"), "{late}");
    stack.stop();
}

/// palletd holds readings up to `flush.max_delay` (an hour here); before
/// the closer seals a window it writes what it holds of it, so its own
/// holding never makes a reading late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_readings_are_written_before_their_window_is_sealed() {
    let mut stack = Stack::start("holdseal", |c| {
        c.one_stream()
            .window("1s")
            .closer("1s", "1s")
            .max_delay("1h")
    })
    .await;
    let mut publisher = stack.publisher().await;
    let w0 = now_ms().div_euclid(1000) * 1000 + 1000;
    for seq in 0..3 {
        let v = serde_json::json!({ "ts": w0 + 100 * seq, "seq": seq, "temp": 20.0 });
        publisher.json("h1", v).await;
    }
    publisher.flush().await;
    eventually(Duration::from_secs(20), "the window is sealed", || async {
        let b = stack.docs("readings").await;
        !b.is_empty() && b.iter().all(|b| b.get_bool("closed") == Ok(true))
    })
    .await;
    let buckets = stack.docs("readings").await;
    assert_eq!(buckets.len(), 1, "one bucket: nothing came late");
    assert_eq!(seqs(&buckets[0]), vec![0, 1, 2]);
    check_sealed(&buckets[0]);
    assert_eq!(
        stack
            .palletd
            .metric("palletd_samples_late_into_sealed_window_total", None),
        0.0
    );
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_and_interleaved_windows_keep_arrival_order() {
    // Hour windows, and a grace long enough that the previous hour is open.
    let mut stack = Stack::start("order", |c| c.set("closer.grace", "2h").one_stream()).await;
    let hour = 3_600_000;
    let current = now_ms().div_euclid(hour) * hour;
    let previous = current - hour;
    let mut publisher = stack.publisher().await;
    // Alternate windows; inside each window the timestamps go backwards.
    for seq in 0..40i64 {
        let base = if seq % 2 == 0 { previous } else { current };
        let v = serde_json::json!({ "ts": base + 60_000 - seq * 1000, "seq": seq, "v": seq });
        publisher.json("o1", v).await;
    }
    publisher.flush().await;
    stack.wait_stored(40).await;
    let buckets = stack.docs("readings").await;
    assert_eq!(buckets.len(), 2, "one bucket per window");
    for b in &buckets {
        check_bucket(b, hour, 200, 256 * 1024);
        let start = b.get_datetime("startTs").unwrap().timestamp_millis();
        let s = seqs(b);
        assert_eq!(s.len(), 20);
        assert!(
            s.windows(2).all(|w| w[0] < w[1]),
            "arrival order kept: {s:?}"
        );
        let parity = if start == previous { 0 } else { 1 };
        assert!(
            s.iter().all(|q| q % 2 == parity),
            "each sample in its own window"
        );
    }
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_future_and_too_old_samples_are_dead_lettered_and_the_rest_stored() {
    let mut stack = Stack::start("clock", |c| c).await;
    let now = now_ms();
    let mut publisher = stack.publisher().await;
    let payload = serde_json::json!([
        { "ts": now - 1000, "seq": 1, "v": 1 },
        { "ts": now + 3_600_000, "seq": 2, "v": 2 },
        { "ts": now - 2000, "seq": 3, "v": 3 },
        { "ts": now - 8 * 86_400_000, "seq": 4, "v": 4 },
    ]);
    publisher.json("k1", payload).await;
    publisher.flush().await;
    eventually(
        Duration::from_secs(30),
        "stored and dead-lettered",
        || async {
            stack.stored().await >= 2 && !stack.docs("readings_deadletter").await.is_empty()
        },
    )
    .await;
    let buckets = stack.docs("readings").await;
    let mut stored: Vec<i64> = buckets.iter().flat_map(seqs).collect();
    stored.sort_unstable();
    assert_eq!(stored, vec![1, 3]);
    // One dead letter for the message, naming both refused samples.
    let dead = stack.docs("readings_deadletter").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    let d = &dead[0];
    assert_eq!(d.get_str("cause"), Ok("time_out_of_range"));
    assert_eq!(d.get_i64("refused"), Ok(2));
    let error = d.get_str("error").unwrap();
    assert!(
        error.starts_with("sample 1:") && error.contains("max_future"),
        "{error}"
    );
    let causes = d.get_array("causes").unwrap();
    assert_eq!(causes.len(), 1);
    let c = causes[0].as_document().unwrap();
    assert_eq!(c.get_i64("count"), Ok(2));
    let samples: Vec<i64> = c
        .get_array("samples")
        .unwrap()
        .iter()
        .filter_map(|i| i.as_i64())
        .collect();
    assert_eq!(samples, vec![1, 3]);
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_left_open_by_a_killed_palletd_are_sealed_by_the_next_run() {
    let mut stack = Stack::start("leftopen", |c| c.window("1s").closer("1h", "1s")).await;
    let mut publisher = stack.publisher().await;
    for seq in 0..6 {
        publisher
            .json("l1", serde_json::json!({ "seq": seq, "v": seq }))
            .await;
    }
    publisher.flush().await;
    stack.wait_stored(6).await;
    stack.palletd.kill();
    let open = stack.docs("readings").await;
    assert!(
        open.iter().all(|b| b.get_bool("closed") == Ok(false)),
        "left open"
    );

    let mut stack = Stack::on(stack.broker, stack.db, "leftopen", |c| {
        c.window("1s").closer("1s", "1s")
    })
    .await;
    eventually(
        Duration::from_secs(30),
        "the next run seals them",
        || async {
            let b = stack.docs("readings").await;
            b.len() == open.len() && b.iter().all(|b| b.get_bool("closed") == Ok(true))
        },
    )
    .await;
    for b in stack.docs("readings").await {
        check_sealed(&b);
    }
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_open_bucket_keeps_filling_to_its_cap() {
    let hour = 3_600_000;
    let start = now_ms().div_euclid(hour) * hour;
    let mut stack = Stack::start("refill", |c| c.max_samples(10).one_stream()).await;
    let mut publisher = stack.publisher().await;
    publish_seqs(&mut publisher, "f1", start, 0..4).await;
    stack.wait_stored(4).await;
    stack.stop();

    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    publish_seqs(&mut publisher, "f1", start, 4..14).await;
    stack.wait_stored(14).await;
    let buckets = stack.docs("readings").await;
    assert_eq!(buckets.len(), 2);
    let first = buckets.iter().find(|b| seqs(b).contains(&0)).unwrap();
    assert_eq!(
        seqs(first),
        (0..10).collect::<Vec<_>>(),
        "the old bucket was filled to its cap"
    );
    let second = buckets.iter().find(|b| !seqs(b).contains(&0)).unwrap();
    assert_eq!(seqs(second), (10..14).collect::<Vec<_>>());
    stack.stop();
}

async fn ttl(client: &mongodb::Client, db: &str, coll: &str, name: &str) -> Option<i64> {
    let db = client.database(db);
    let reply = db.run_command(doc! { "listIndexes": coll }).await.ok()?;
    let batch = reply
        .get_document("cursor")
        .ok()?
        .get_array("firstBatch")
        .ok()?;
    batch
        .iter()
        .filter_map(|i| i.as_document())
        .find(|i| i.get_str("name") == Ok(name))
        .map(|i| match i.get("expireAfterSeconds") {
            Some(Bson::Int32(n)) => *n as i64,
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Double(n)) => *n as i64,
            other => panic!("no expireAfterSeconds on {name}: {other:?}"),
        })
}

/// The schema is set up in process: the storage mode against the real
/// server, no broker and no palletd process needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_index_follows_the_configuration() {
    let db = Database::start();
    let client = db.client().await;
    // (expire_after, deadletter_expire_after, bucket TTL, dead-letter TTL)
    type Run = (&'static str, Option<&'static str>, Option<i64>, Option<i64>);
    let runs: [Run; 3] = [
        ("1h", None, Some(3600), Some(7 * 86400)),
        ("2h", Some("1d"), Some(7200), Some(86400)),
        ("", Some("off"), None, None),
    ];
    for (expire, dead_expire, buckets, dead) in runs {
        let mut cfg = Config::offline(&db, "ttl");
        if !expire.is_empty() {
            cfg = cfg.set("retention.expire_after", expire);
        }
        if let Some(d) = dead_expire {
            cfg = cfg.set("retention.deadletter_expire_after", d);
        }
        let settings = cfg.settings();
        let mut store = palletd::Store::new(&settings, client.database("ttl"));
        assert!(store.try_ensure_schema().await, "schema set up");
        assert_eq!(
            ttl(&client, "ttl", "readings", "endTs_ttl").await,
            buckets,
            "{expire}"
        );
        assert_eq!(
            ttl(&client, "ttl", "readings_deadletter", "receivedAt_ttl").await,
            dead,
            "{dead_expire:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_past_retention_are_deleted() {
    let db = Database::start();
    // The TTL monitor waits until the readings are seen stored (else it
    // could delete the old window first), then runs every second.
    db.pause_ttl_monitor().await;
    let mut stack = Stack::on(Broker::start(), db, "expire", |c| {
        c.set("retention.expire_after", "1s")
    })
    .await;
    let hour = 3_600_000;
    let now = now_ms();
    let mut publisher = stack.publisher().await;
    for seq in 0..5 {
        // Two hours ago: the window ended over an hour ago.
        publisher
            .json(
                "e1",
                serde_json::json!({ "ts": now - 2 * hour + seq, "seq": seq }),
            )
            .await;
        publisher
            .json(
                "e1",
                serde_json::json!({ "ts": now + seq, "seq": 100 + seq }),
            )
            .await;
    }
    publisher.flush().await;
    stack.wait_stored(10).await;
    let passes = stack.db.fast_ttl_monitor().await;
    eventually(
        Duration::from_secs(60),
        "two TTL monitor passes",
        || async { stack.db.ttl_passes().await >= passes + 2 },
    )
    .await;
    assert_eq!(stack.stored().await, 5, "the expired bucket is deleted");
    let left = stack.docs("readings").await;
    let mut s: Vec<i64> = left.iter().flat_map(seqs).collect();
    s.sort_unstable();
    assert_eq!(
        s,
        vec![100, 101, 102, 103, 104],
        "only the current window is kept"
    );
    stack.stop();
}

/// Both seal forms (one pipeline update on 5.2+, two statements before)
/// leave the same document, without the `lsns` pairs the spools'
/// published checkpoints have passed (and without `lsns` once none is
/// left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_and_pipeline_seals_agree() {
    let db = Database::start();
    let client = db.client().await;
    let database = client.database("seal");
    let t = |ms: i64| bson::DateTime::from_millis(ms);
    let bucket = |sensor: &str| {
        doc! {
            "sensorId": sensor, "startTs": t(0), "endTs": t(1000), "closed": false,
            "count": 3, "size": 1,
            "sum": { "a": 6.0, "b": 5.0 }, "n": { "a": 3, "b": 2 },
            "min": { "a": 1.0, "b": 2.0 }, "max": { "a": 3.0, "b": 3.0 },
            "samples": [ { "ts": t(900), "a": 3.0, "b": 3.0 }, { "ts": t(100), "a": 1.0 }, { "ts": t(500), "a": 2.0, "b": 2.0 } ],
            "lsns": { "s0000000a": [1_i64, 5_i64], "s0000000b": [3_i64, 40_i64], "s0000000c": [7_i64, 8_i64] },
        }
    };
    // Spool a is past its pairs, b is not (40 is not below 20), c never
    // published.
    let published: std::collections::HashMap<String, u64> =
        [("s0000000a".to_string(), 10), ("s0000000b".to_string(), 20)].into();
    let all_past: std::collections::HashMap<String, u64> = [
        ("s0000000a".to_string(), 10),
        ("s0000000b".to_string(), 41),
        ("s0000000c".to_string(), 9),
    ]
    .into();
    let coll = database.collection::<Document>("readings");
    coll.create_indexes(palletd::internals::bucket_indexes())
        .await
        .unwrap();
    coll.insert_many([bucket("new"), bucket("old")])
        .await
        .unwrap();
    let settings = Config::offline(&db, "seal")
        .set("closer.grace", "1s")
        .settings();
    let buckets = || palletd::internals::Buckets::new(&settings);
    let mut modern = buckets().with_legacy_seal(false);
    let mut legacy = buckets().with_legacy_seal(true);
    // Seal only "new" with the pipeline form, then the rest with the legacy form.
    coll.update_one(
        doc! { "sensorId": "old" },
        doc! { "$set": { "endTs": t(5000) } },
    )
    .await
    .unwrap();
    assert_eq!(
        modern
            .seal(&database, 3000, &published)
            .await
            .unwrap()
            .buckets,
        1
    );
    assert_eq!(
        legacy
            .seal(&database, 7000, &published)
            .await
            .unwrap()
            .buckets,
        1
    );
    let mut docs = all_docs(&client, "seal", "readings").await;
    for d in &mut docs {
        check_sealed(d);
        assert_eq!(d.get_document("avg").unwrap(), &doc! { "a": 2.0, "b": 2.5 });
        assert_eq!(
            d.get_document("lsns").unwrap(),
            &doc! { "s0000000b": [3_i64, 40_i64], "s0000000c": [7_i64, 8_i64] }
        );
        d.remove("_id");
        d.remove("closedAt");
        d.remove("endTs");
        d.remove("sensorId");
    }
    assert_eq!(docs[0], docs[1]);
    // Every pair past: the field goes, in both forms.
    coll.insert_many([bucket("new2"), bucket("old2")])
        .await
        .unwrap();
    coll.update_one(
        doc! { "sensorId": "old2" },
        doc! { "$set": { "endTs": t(5000) } },
    )
    .await
    .unwrap();
    assert_eq!(
        modern
            .seal(&database, 3000, &all_past)
            .await
            .unwrap()
            .buckets,
        1
    );
    assert_eq!(
        legacy
            .seal(&database, 7000, &all_past)
            .await
            .unwrap()
            .buckets,
        1
    );
    for d in all_docs(&client, "seal", "readings").await {
        if d.get_str("sensorId").unwrap().ends_with('2') {
            assert!(!d.contains_key("lsns"), "{d}");
        }
    }
}

/// A bucket written before buckets were addressed by `_id` (an ObjectId)
/// is left alone: readings of its window go to a bucket of the new form,
/// and a read returns both. Its own samples are never duplicated or lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_of_an_earlier_version_is_read_and_left_alone() {
    let db = Database::start();
    let client = db.client().await;
    let w0 = now_ms().div_euclid(HOUR_MS) * HOUR_MS;
    let t = bson::DateTime::from_millis;
    let old = doc! {
        "_id": bson::oid::ObjectId::new(),
        "sensorId": "o1", "startTs": t(w0), "endTs": t(w0 + HOUR_MS), "closed": false,
        "count": 2, "size": 60,
        "sum": { "v": 3.0 }, "n": { "v": 2 }, "min": { "v": 1.0 }, "max": { "v": 2.0 },
        "minTs": t(w0 + 1000), "maxTs": t(w0 + 2000),
        "samples": [ { "ts": t(w0 + 1000), "seq": 0.0, "v": 1.0 }, { "ts": t(w0 + 2000), "seq": 1.0, "v": 2.0 } ],
    };
    client
        .database("oldform")
        .collection::<Document>("readings")
        .insert_one(old.clone())
        .await
        .unwrap();
    let mut stack = Stack::on(Broker::start(), db, "oldform", |c| c.one_stream()).await;
    let mut publisher = stack.publisher().await;
    for seq in 2..4 {
        let v = serde_json::json!({ "ts": w0 + 1000 * (seq + 1), "seq": seq, "v": seq as f64 });
        publisher.json("o1", v).await;
    }
    publisher.flush().await;
    stack.wait_stored(4).await;
    let docs = stack.docs("readings").await;
    assert_eq!(docs.len(), 2, "{docs:?}");
    let kept = docs
        .iter()
        .find(|d| d.get("_id") == old.get("_id"))
        .unwrap();
    assert_eq!(kept, &old, "left alone");
    let new = docs
        .iter()
        .find(|d| d.get("_id") != old.get("_id"))
        .unwrap();
    assert_eq!(new.get_str("_id"), Ok(format!("o1|{w0}|0").as_str()));
    assert_eq!(seqs(new), vec![2, 3]);
    let dir = tempfile::tempdir().unwrap();
    let cfg = stack.config.write_to(dir.path(), "palletd.toml");
    let out = query_ok(&cfg, &["--sensor", "o1"]);
    let seqs: Vec<i64> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| v["seq"].as_f64().unwrap() as i64)
        .collect();
    assert_eq!(seqs, vec![0, 1, 2, 3], "{out}");
    stack.stop();
}

/// A seal closes at most a chunk of buckets per statement and says when
/// more may be left (the closer then lets flushes go between chunks): 25
/// ended buckets in chunks of 10 take three calls in both seal forms, and
/// the buckets whose window is not over stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seal_goes_in_chunks_until_every_ended_bucket_is_sealed() {
    let db = Database::start();
    let client = db.client().await;
    let t = |ms: i64| bson::DateTime::from_millis(ms);
    let settings = Config::offline(&db, "chunks")
        .set("closer.grace", "1s")
        .settings();
    for legacy in [false, true] {
        let database = client.database(&format!("chunks{}", legacy as u8));
        let coll = database.collection::<Document>("readings");
        coll.create_indexes(palletd::internals::bucket_indexes())
            .await
            .unwrap();
        let bucket = |i: i64, end: i64| {
            doc! {
                "_id": format!("s{i}|0|0"), "sensorId": format!("s{i}"),
                "startTs": t(0), "endTs": t(end), "closed": false, "count": 2, "size": 1,
                "sum": { "a": 3.0 }, "n": { "a": 2 }, "min": { "a": 1.0 }, "max": { "a": 2.0 },
                "samples": [ { "ts": t(900), "a": 2.0 }, { "ts": t(100), "a": 1.0 } ],
            }
        };
        let ended = (0..25).map(|i| bucket(i, 1000));
        let open = (100..103).map(|i| bucket(i, 60_000));
        coll.insert_many(ended.chain(open)).await.unwrap();
        let mut buckets = palletd::internals::Buckets::new(&settings)
            .with_legacy_seal(legacy)
            .with_seal_chunk(10);
        let none = std::collections::HashMap::new();
        let mut calls = Vec::new();
        loop {
            let sealed = buckets.seal(&database, 3000, &none).await.unwrap();
            calls.push(sealed.buckets);
            if !sealed.more {
                break;
            }
        }
        assert_eq!(calls, vec![10, 10, 5], "legacy: {legacy}");
        let docs = all_docs(&client, database.name(), "readings").await;
        for d in &docs {
            if d.get_datetime("endTs").unwrap().timestamp_millis() == 1000 {
                check_sealed(d);
                assert_eq!(d.get_document("avg").unwrap(), &doc! { "a": 1.5 });
            } else {
                assert_eq!(d.get_bool("closed"), Ok(false), "{d}");
            }
        }
        // Nothing left: one call that finds nothing.
        let sealed = buckets.seal(&database, 3000, &none).await.unwrap();
        assert_eq!((sealed.buckets, sealed.more), (0, false));
    }
}

/// A bucket palletd filled to `bucket.max_samples` is sealed at the
/// closer's next run, before its window ends (no statement can add to it):
/// the hour's seal is left the last bucket of each sensor. The open one
/// stays open and keeps filling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_buckets_are_sealed_before_their_window_ends() {
    let mut stack = Stack::start("fullseal", |c| {
        c.one_stream()
            .window("1h")
            .max_samples(4)
            .closer("1s", "5m")
            .max_delay("200ms")
    })
    .await;
    let mut publisher = stack.publisher().await;
    let t0 = now_ms();
    publish_seqs(&mut publisher, "fs1", t0, 0..10).await;
    eventually(
        Duration::from_secs(20),
        "the two full buckets sealed, the third open",
        || async {
            let b = stack.docs("readings").await;
            b.len() == 3
                && b.iter()
                    .filter(|b| b.get_bool("closed") == Ok(true))
                    .count()
                    == 2
        },
    )
    .await;
    let window = t0.div_euclid(3_600_000) * 3_600_000;
    let by_id = |b: &[Document], seq: u32| {
        b.iter()
            .find(|d| d.get_str("_id") == Ok(format!("fs1|{window}|{seq}").as_str()))
            .cloned()
            .unwrap_or_else(|| panic!("bucket {seq} of {b:?}"))
    };
    let b = stack.docs("readings").await;
    for seq in [0, 1] {
        let full = by_id(&b, seq);
        check_sealed(&full);
        assert_eq!(full.get_i32("count"), Ok(4));
    }
    let open = by_id(&b, 2);
    assert_eq!(open.get_bool("closed"), Ok(false));
    assert_eq!(seqs(&open), vec![8, 9]);
    // The open one fills, and is sealed in turn.
    publish_seqs(&mut publisher, "fs1", t0, 10..13).await;
    eventually(Duration::from_secs(20), "the third sealed too", || async {
        let b = stack.docs("readings").await;
        b.len() == 4 && by_id(&b, 2).get_bool("closed") == Ok(true)
    })
    .await;
    let b = stack.docs("readings").await;
    assert_eq!(seqs(&by_id(&b, 2)), vec![8, 9, 10, 11]);
    assert_eq!(by_id(&b, 3).get_bool("closed"), Ok(false));
    assert_eq!(stack.stored().await, 13);
    stack.stop();
}

/// A flush whose run overflows a bucket with a sixteenth of its room or
/// less left goes whole to the next bucket (one statement, not two), and
/// the bucket left is sealed early like a full one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_overflowing_a_nearly_full_bucket_starts_the_next_and_the_left_one_is_sealed() {
    let mut stack = Stack::start("leave", |c| {
        c.one_stream()
            .window("1h")
            .max_samples(16)
            .closer("1s", "5m")
            .max_delay("2s")
    })
    .await;
    let mut publisher = stack.publisher().await;
    let t0 = now_ms();
    let window = t0.div_euclid(3_600_000) * 3_600_000;
    publish_seqs(&mut publisher, "lv1", t0, 0..15).await;
    eventually(Duration::from_secs(20), "15 readings stored", || async {
        stack.stored().await == 15
    })
    .await;
    // One of 16 left; a run of 3 goes whole to the next bucket.
    publish_seqs(&mut publisher, "lv1", t0, 15..18).await;
    eventually(
        Duration::from_secs(20),
        "the second bucket started and the first sealed",
        || async {
            let b = stack.docs("readings").await;
            b.len() == 2
                && b.iter()
                    .any(|d| d.get_bool("closed") == Ok(true) && d.get_i32("count") == Ok(15))
        },
    )
    .await;
    let b = stack.docs("readings").await;
    let by_id = |seq: u32| {
        b.iter()
            .find(|d| d.get_str("_id") == Ok(format!("lv1|{window}|{seq}").as_str()))
            .cloned()
            .unwrap_or_else(|| panic!("bucket {seq} of {b:?}"))
    };
    let left = by_id(0);
    check_sealed(&left);
    assert_eq!(seqs(&left), (0..15).collect::<Vec<_>>());
    let next = by_id(1);
    assert_eq!(next.get_bool("closed"), Ok(false));
    assert_eq!(seqs(&next), vec![15, 16, 17]);
    for d in &b {
        check_bucket(d, 3_600_000, 16, 262_144);
    }
    assert_eq!(stack.stored().await, 18);
    stack.stop();
}

/// A spool written by a newer palletd (its `format` says a version this
/// one does not read) is refused with exit 78 before anything in it is
/// read or changed; the palletd that reads it then stores everything it
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_of_a_newer_version_is_refused_with_exit_78_and_nothing_lost() {
    let mut stack = Stack::without_database("newerspool", |c| c).await;
    let mut publisher = stack.publisher().await;
    for seq in 0..20 {
        publisher
            .json("n1", serde_json::json!({ "seq": seq, "v": seq }))
            .await;
    }
    publisher.flush().await;
    stack.all_acknowledged().await;
    stack.palletd.kill();
    let spool = stack.config.settings().spool.dir;
    let format = spool.join("format");
    let ours = std::fs::read_to_string(&format).unwrap();
    assert!(ours.starts_with("palletd spool format "), "{ours:?}");
    let version: u32 = ours.trim().rsplit(' ').next().unwrap().parse().unwrap();
    let newer = format!("palletd spool format {}\n", version + 1);
    std::fs::write(&format, &newer).unwrap();
    let before: Vec<_> = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), e.metadata().unwrap().len())
        })
        .collect();
    stack.db.start_again();
    let mut palletd = Palletd::start(&stack.config);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while palletd.running() {
        assert!(
            std::time::Instant::now() < deadline,
            "still running:\n{}",
            palletd.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(palletd.terminate(), Some(78), "{}", palletd.log());
    assert!(
        palletd.log().contains("newer than this palletd reads"),
        "{}",
        palletd.log()
    );
    let after: Vec<_> = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name(), e.metadata().unwrap().len())
        })
        .collect();
    assert_eq!(before, after, "the spool is left as it was");
    // The palletd that reads it (here: the same version, the file put
    // back) stores all twenty.
    std::fs::write(&format, &ours).unwrap();
    let client = stack.db.client().await;
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    let sent: Vec<_> = (0..20).map(|s| ("n1".to_string(), s)).collect();
    assert_exactly_once(&client, "newerspool", &sent, Duration::from_secs(60)).await;
    stack.stop();
}
