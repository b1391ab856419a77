//! Bucket lifecycle against the real broker and database: the closer, late
//! and out-of-order data, clock problems, restart recovery and retention.

mod common;

use std::time::Duration;

use bson::{doc, Bson, Document};

use common::*;

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn ts_of(sample: &Bson) -> i64 {
    sample
        .as_document()
        .unwrap()
        .get_datetime("ts")
        .unwrap()
        .timestamp_millis()
}

fn seqs(bucket: &Document) -> Vec<i64> {
    bucket
        .get_array("samples")
        .unwrap()
        .iter()
        .map(|s| s.as_document().unwrap().get_f64("seq").unwrap() as i64)
        .collect()
}

async fn publish_json(publisher: &mut Publisher, sensor: &str, value: serde_json::Value) {
    publisher
        .publish(&format!("sensors/{sensor}/telemetry"), value.to_string())
        .await;
}

/// Publishes readings `seq` at `start + seq` ms and waits for the broker.
async fn publish_seqs(
    publisher: &mut Publisher,
    sensor: &str,
    start: i64,
    seqs: std::ops::Range<i64>,
) {
    for seq in seqs {
        publish_json(
            publisher,
            sensor,
            serde_json::json!({ "ts": start + seq, "seq": seq }),
        )
        .await;
    }
    publisher.flush().await;
}

fn check_sealed(b: &Document) {
    assert!(b.get_bool("closed").unwrap(), "sealed: {b}");
    assert!(b.get_datetime("closedAt").is_ok(), "closedAt set: {b}");
    let ts: Vec<i64> = b.get_array("samples").unwrap().iter().map(ts_of).collect();
    assert!(
        ts.windows(2).all(|w| w[0] <= w[1]),
        "samples sorted by ts: {ts:?}"
    );
    let (sum, n, avg) = (
        b.get_document("sum").unwrap(),
        b.get_document("n").unwrap(),
        b.get_document("avg").unwrap(),
    );
    assert_eq!(avg.len(), sum.len(), "one avg per rolled-up field: {b}");
    for (field, s) in sum {
        let want = s.as_f64().unwrap() / n.get_i32(field).unwrap() as f64;
        let got = avg.get_f64(field).unwrap();
        assert!(
            (got - want).abs() < 1e-9,
            "avg.{field} = sum / n: {got} vs {want}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closer_seals_ended_windows_and_late_samples_start_a_second_bucket() {
    let broker = Broker::start();
    let db = Database::start();
    let extra = "[bucket]\nwindow = \"1s\"\n[closer]\ninterval = \"1s\"\ngrace = \"1s\"\n[flush]\ninterval = \"200ms\"\n";
    let mut palletd = Palletd::start(&config(&broker, &db, "closer", "palletd-closer", extra));
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let mut publisher = Publisher::connect(&broker, "pub-closer").await;
    // The next one-second window; samples out of order inside it.
    let w0 = now_ms().div_euclid(1000) * 1000 + 1000;
    for (seq, off) in [700, 100, 500, 300, 900].into_iter().enumerate() {
        let v = serde_json::json!({ "ts": w0 + off, "seq": seq, "temp": 20.0 + seq as f64, "hum": 40 + seq });
        publish_json(&mut publisher, "c1", v).await;
    }
    publisher.flush().await;

    let client = db.client().await;
    eventually(Duration::from_secs(20), "the bucket is sealed", || async {
        let b = all_docs(&client, "closer", "readings").await;
        b.len() == 1 && b[0].get_bool("closed") == Ok(true)
    })
    .await;
    let sealed = all_docs(&client, "closer", "readings").await.remove(0);
    check_sealed(&sealed);
    assert_eq!(sealed.get_i32("count"), Ok(5));
    assert_eq!(
        sealed.get_datetime("startTs").unwrap().timestamp_millis(),
        w0
    );

    // A late sample for the sealed window: a second bucket of that window.
    let v = serde_json::json!({ "ts": w0 + 50, "seq": 99, "temp": 1.0 });
    publish_json(&mut publisher, "c1", v).await;
    publisher.flush().await;
    eventually(
        Duration::from_secs(20),
        "the late bucket is stored and sealed",
        || async {
            let b = all_docs(&client, "closer", "readings").await;
            b.len() == 2 && b.iter().all(|b| b.get_bool("closed") == Ok(true))
        },
    )
    .await;
    let buckets = all_docs(&client, "closer", "readings").await;
    let first = buckets
        .iter()
        .find(|b| b.get_object_id("_id") == sealed.get_object_id("_id"))
        .unwrap();
    assert_eq!(first, &sealed, "a sealed bucket is never written again");
    let late = buckets
        .iter()
        .find(|b| b.get_object_id("_id") != sealed.get_object_id("_id"))
        .unwrap();
    assert_eq!(late.get_datetime("startTs").unwrap().timestamp_millis(), w0);
    assert_eq!(seqs(late), vec![99]);
    check_sealed(late);
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_and_interleaved_windows_keep_arrival_order() {
    let broker = Broker::start();
    let db = Database::start();
    // Hour windows, and a grace long enough that the previous hour is open.
    let extra = "[closer]\ngrace = \"2h\"\n";
    let mut palletd = Palletd::start(&config(&broker, &db, "order", "palletd-order", extra));
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let hour = 3_600_000;
    let current = now_ms().div_euclid(hour) * hour;
    let previous = current - hour;
    let mut publisher = Publisher::connect(&broker, "pub-order").await;
    // Alternate windows; inside each window the timestamps go backwards.
    for seq in 0..40i64 {
        let base = if seq % 2 == 0 { previous } else { current };
        let v = serde_json::json!({ "ts": base + 60_000 - seq * 1000, "seq": seq, "v": seq });
        publish_json(&mut publisher, "o1", v).await;
    }
    publisher.flush().await;
    let client = db.client().await;
    eventually(Duration::from_secs(30), "40 samples stored", || async {
        stored_samples(&client, "order").await >= 40
    })
    .await;
    let buckets = all_docs(&client, "order", "readings").await;
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
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_future_and_too_old_samples_are_dead_lettered_and_the_rest_stored() {
    let broker = Broker::start();
    let db = Database::start();
    let mut palletd = Palletd::start(&config(&broker, &db, "clock", "palletd-clock", ""));
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let now = now_ms();
    let mut publisher = Publisher::connect(&broker, "pub-clock").await;
    let payload = serde_json::json!([
        { "ts": now - 1000, "seq": 1, "v": 1 },
        { "ts": now + 3_600_000, "seq": 2, "v": 2 },
        { "ts": now - 2000, "seq": 3, "v": 3 },
        { "ts": now - 8 * 86_400_000, "seq": 4, "v": 4 },
    ]);
    publish_json(&mut publisher, "k1", payload).await;
    publisher.flush().await;
    let client = db.client().await;
    eventually(
        Duration::from_secs(30),
        "stored and dead-lettered",
        || async {
            stored_samples(&client, "clock").await >= 2
                && all_docs(&client, "clock", "readings_deadletter")
                    .await
                    .len()
                    >= 2
        },
    )
    .await;
    let buckets = all_docs(&client, "clock", "readings").await;
    let mut stored: Vec<i64> = buckets.iter().flat_map(seqs).collect();
    stored.sort_unstable();
    assert_eq!(stored, vec![1, 3]);
    let dead = all_docs(&client, "clock", "readings_deadletter").await;
    assert_eq!(dead.len(), 2);
    let errors: Vec<&str> = dead.iter().map(|d| d.get_str("error").unwrap()).collect();
    assert!(dead
        .iter()
        .all(|d| d.get_str("cause") == Ok("time_out_of_range")));
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("sample 1:") && e.contains("max_future")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("sample 3:") && e.contains("max_lateness")),
        "{errors:?}"
    );
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_left_open_by_a_killed_palletd_are_sealed_by_the_next_run() {
    let broker = Broker::start();
    let db = Database::start();
    let quiet = "[bucket]\nwindow = \"1s\"\n[closer]\ninterval = \"1h\"\ngrace = \"1s\"\n";
    let mut palletd = Palletd::start(&config(&broker, &db, "leftopen", "palletd-leftopen", quiet));
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let mut publisher = Publisher::connect(&broker, "pub-leftopen").await;
    for seq in 0..6 {
        publish_json(
            &mut publisher,
            "l1",
            serde_json::json!({ "seq": seq, "v": seq }),
        )
        .await;
    }
    publisher.flush().await;
    let client = db.client().await;
    eventually(Duration::from_secs(30), "6 samples stored", || async {
        stored_samples(&client, "leftopen").await >= 6
    })
    .await;
    palletd.kill();
    let open = all_docs(&client, "leftopen", "readings").await;
    assert!(
        open.iter().all(|b| b.get_bool("closed") == Ok(false)),
        "left open"
    );

    let busy = quiet.replace("interval = \"1h\"", "interval = \"1s\"");
    let mut palletd = Palletd::start(&config(&broker, &db, "leftopen", "palletd-leftopen", &busy));
    eventually(
        Duration::from_secs(30),
        "the next run seals them",
        || async {
            let b = all_docs(&client, "leftopen", "readings").await;
            b.len() == open.len() && b.iter().all(|b| b.get_bool("closed") == Ok(true))
        },
    )
    .await;
    for b in all_docs(&client, "leftopen", "readings").await {
        check_sealed(&b);
    }
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_open_bucket_keeps_filling_to_its_cap() {
    let broker = Broker::start();
    let db = Database::start();
    let cfg = config(
        &broker,
        &db,
        "refill",
        "palletd-refill",
        "[bucket]\nmax_samples = 10\n",
    );
    let hour = 3_600_000;
    let start = now_ms().div_euclid(hour) * hour;
    let client = db.client().await;

    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let mut publisher = Publisher::connect(&broker, "pub-refill").await;
    publish_seqs(&mut publisher, "f1", start, 0..4).await;
    eventually(Duration::from_secs(30), "4 samples stored", || async {
        stored_samples(&client, "refill").await >= 4
    })
    .await;
    assert_eq!(palletd.terminate(), Some(0));

    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Connected to the MQTT broker.", Duration::from_secs(30));
    publish_seqs(&mut publisher, "f1", start, 4..14).await;
    eventually(Duration::from_secs(30), "14 samples stored", || async {
        stored_samples(&client, "refill").await >= 14
    })
    .await;
    let buckets = all_docs(&client, "refill", "readings").await;
    assert_eq!(buckets.len(), 2);
    let first = buckets.iter().find(|b| seqs(b).contains(&0)).unwrap();
    assert_eq!(
        seqs(first),
        (0..10).collect::<Vec<_>>(),
        "the old bucket was filled to its cap"
    );
    let second = buckets.iter().find(|b| !seqs(b).contains(&0)).unwrap();
    assert_eq!(seqs(second), (10..14).collect::<Vec<_>>());
    assert_eq!(palletd.terminate(), Some(0));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_index_follows_the_configuration() {
    let broker = Broker::start();
    let db = Database::start();
    let client = db.client().await;
    let runs: [(&str, Option<i64>, Option<i64>); 3] = [
        (
            "[retention]\nexpire_after = \"1h\"\n",
            Some(3600),
            Some(7 * 86400),
        ),
        (
            "[retention]\nexpire_after = \"2h\"\ndeadletter_expire_after = \"1d\"\n",
            Some(7200),
            Some(86400),
        ),
        (
            "[retention]\ndeadletter_expire_after = \"off\"\n",
            None,
            None,
        ),
    ];
    for (extra, buckets, dead) in runs {
        let mut palletd = Palletd::start(&config(&broker, &db, "ttl", "palletd-ttl", extra));
        palletd.wait_for_log("Indexes are in place.", Duration::from_secs(30));
        assert_eq!(
            ttl(&client, "ttl", "readings", "endTs_ttl").await,
            buckets,
            "{extra}"
        );
        assert_eq!(
            ttl(&client, "ttl", "readings_deadletter", "receivedAt_ttl").await,
            dead,
            "{extra}"
        );
        assert_eq!(palletd.terminate(), Some(0), "{}", palletd.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_past_retention_are_deleted() {
    let broker = Broker::start();
    let db = Database::start();
    let cfg = config(
        &broker,
        &db,
        "expire",
        "palletd-expire",
        "[retention]\nexpire_after = \"1s\"\n",
    );
    let mut palletd = Palletd::start(&cfg);
    palletd.wait_for_log("Subscribed.", Duration::from_secs(30));
    let hour = 3_600_000;
    let now = now_ms();
    let mut publisher = Publisher::connect(&broker, "pub-expire").await;
    for seq in 0..5 {
        // Two hours ago: the window ended over an hour ago.
        publish_json(
            &mut publisher,
            "e1",
            serde_json::json!({ "ts": now - 2 * hour + seq, "seq": seq }),
        )
        .await;
        publish_json(
            &mut publisher,
            "e1",
            serde_json::json!({ "ts": now + seq, "seq": 100 + seq }),
        )
        .await;
    }
    publisher.flush().await;
    let client = db.client().await;
    eventually(Duration::from_secs(30), "10 samples stored", || async {
        stored_samples(&client, "expire").await >= 10
    })
    .await;
    // The TTL monitor runs about once a minute.
    eventually(
        Duration::from_secs(150),
        "the expired bucket is deleted",
        || async { stored_samples(&client, "expire").await == 5 },
    )
    .await;
    let left = all_docs(&client, "expire", "readings").await;
    let mut s: Vec<i64> = left.iter().flat_map(seqs).collect();
    s.sort_unstable();
    assert_eq!(
        s,
        vec![100, 101, 102, 103, 104],
        "only the current window is kept"
    );
    assert_eq!(palletd.terminate(), Some(0));
}

/// Both seal forms (one pipeline update on 5.2+, two statements before)
/// leave the same document.
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
        }
    };
    let coll = database.collection::<Document>("readings");
    coll.create_indexes(palletd::schema::bucket_indexes())
        .await
        .unwrap();
    coll.insert_many([bucket("new"), bucket("old")])
        .await
        .unwrap();
    let mut modern =
        palletd::closer::Closer::new("readings", Duration::from_secs(1)).with_legacy_update(false);
    let mut legacy =
        palletd::closer::Closer::new("readings", Duration::from_secs(1)).with_legacy_update(true);
    // Seal only "new" with the pipeline form, then the rest with the legacy form.
    coll.update_one(
        doc! { "sensorId": "old" },
        doc! { "$set": { "endTs": t(5000) } },
    )
    .await
    .unwrap();
    assert_eq!(modern.run(&database, 3000).await.unwrap(), 1);
    assert_eq!(legacy.run(&database, 7000).await.unwrap(), 1);
    let mut docs = all_docs(&client, "seal", "readings").await;
    for d in &mut docs {
        check_sealed(d);
        assert_eq!(d.get_document("avg").unwrap(), &doc! { "a": 2.0, "b": 2.5 });
        d.remove("_id");
        d.remove("closedAt");
        d.remove("endTs");
        d.remove("sensorId");
    }
    assert_eq!(docs[0], docs[1]);
}
