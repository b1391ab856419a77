//! `[[rollup]]`: every field of every rollup document equals the same
//! summary computed here from the readings published, in both storage
//! modes, after late data and across a SIGKILL.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::Document;
use common::*;
use futures_util::TryStreamExt;

/// One reading as published: (sensor, ts ms, fields).
type Reading = (String, i64, Vec<(&'static str, serde_json::Value)>);

/// A rollup as this test computes it: count, and per numeric field
/// [sum, n, min, max, avg, first, last].
#[derive(Debug, PartialEq)]
struct Expected {
    count: i64,
    fields: BTreeMap<String, [f64; 7]>,
}

/// The rollups of `interval_ms` from the raw readings: first and last by
/// time, ties broken by value (smallest first, largest last).
fn expected(readings: &[Reading], interval_ms: i64) -> BTreeMap<(String, i64), Expected> {
    let mut per: BTreeMap<(String, i64), Vec<&Reading>> = BTreeMap::new();
    for r in readings {
        per.entry((r.0.clone(), r.1.div_euclid(interval_ms) * interval_ms))
            .or_default()
            .push(r);
    }
    per.into_iter()
        .map(|(key, rs)| {
            let mut values: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
            for r in &rs {
                for (k, v) in &r.2 {
                    if let Some(x) = v.as_f64() {
                        values.entry(k.to_string()).or_default().push((r.1, x));
                    }
                }
            }
            let fields = values
                .into_iter()
                .map(|(k, mut vs)| {
                    vs.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
                    let sum: f64 = vs.iter().map(|v| v.1).sum();
                    let n = vs.len() as f64;
                    let min = vs.iter().map(|v| v.1).fold(f64::INFINITY, f64::min);
                    let max = vs.iter().map(|v| v.1).fold(f64::NEG_INFINITY, f64::max);
                    let (first, last) = (vs[0].1, vs[vs.len() - 1].1);
                    (k, [sum, n, min, max, sum / n, first, last])
                })
                .collect();
            (
                key,
                Expected {
                    count: rs.len() as i64,
                    fields,
                },
            )
        })
        .collect()
}

/// The stored rollups of a collection, as [`Expected`].
fn stored(docs: &[Document]) -> BTreeMap<(String, i64), Expected> {
    docs.iter()
        .map(|d| {
            let empty = Document::new();
            let part = |p: &str| d.get_document(p).unwrap_or(&empty);
            let fields = part("sum")
                .keys()
                .map(|k| {
                    let v = |p: &str| number(part(p).get(k));
                    let row = [
                        v("sum"),
                        v("n"),
                        v("min"),
                        v("max"),
                        v("avg"),
                        v("first"),
                        v("last"),
                    ];
                    (k.clone(), row)
                })
                .collect();
            assert!(!d.get_bool("partial").unwrap(), "{d}");
            assert!(d.get_datetime("computedAt").is_ok(), "{d}");
            (
                (
                    d.get_str("sensorId").unwrap().to_string(),
                    d.get_datetime("start").unwrap().timestamp_millis(),
                ),
                Expected {
                    count: number(d.get("count")) as i64,
                    fields,
                },
            )
        })
        .collect()
}

async fn publish(publisher: &mut Publisher, readings: &[Reading]) {
    for (sensor, ts, fields) in readings {
        let mut v = serde_json::Map::new();
        v.insert("ts".into(), (*ts).into());
        for (k, x) in fields {
            v.insert(k.to_string(), x.clone());
        }
        publisher.json(sensor, serde_json::Value::Object(v)).await;
    }
    publisher.flush().await;
}

/// Waits until the rollups of `interval` match the readings exactly.
async fn rollups_match(stack: &Stack, interval: &str, interval_ms: i64, readings: &[Reading]) {
    let want = expected(readings, interval_ms);
    let coll = format!("readings_{interval}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = stored(&stack.docs(&coll).await);
        if got == want {
            assert!(!got.is_empty());
            eprintln!("{interval}: {} rollups match", got.len());
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rollups of {interval} never matched the readings:\n got {got:#?}\nwant {want:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn rollups_equal_the_raw_readings(name: &str, timeseries: bool) {
    let mut stack = Stack::start(name, |c| {
        let c = c
            .window("1s")
            .closer("200ms", "1s")
            .max_delay("200ms")
            .rollup("2s", false, None)
            .rollup("4s", false, None);
        if timeseries {
            c.timeseries()
        } else {
            c
        }
    })
    .await;
    // Three 4 s intervals, all over: their rollups are due at once.
    let t0 = (now_ms() - 20_000).div_euclid(4000) * 4000;
    let mut readings: Vec<Reading> = Vec::new();
    for i in 0..60i64 {
        let sensor = ["r1", "r2"][(i % 2) as usize].to_string();
        // Out of order within the range; values in halves (exact sums).
        let ts = t0 + (i * 7919) % 12_000;
        let mut fields = vec![("temp", serde_json::json!((i % 17) as f64 / 2.0))];
        if i % 3 == 0 {
            fields.push(("hum", serde_json::json!(40 + i % 5)));
        }
        if i % 4 == 0 {
            fields.push(("door", serde_json::json!("open")));
        }
        readings.push((sensor, ts, fields));
    }
    // Readings of one time at the start and at the end of r1's range
    // (reading 0 is r1's at t0): first and last break the tie by value.
    for (ts, temp) in [
        (t0, -3.5),
        (t0, 9.5),
        (t0 + 11_999, 1.0),
        (t0 + 11_999, 2.0),
    ] {
        readings.push(("r1".into(), ts, vec![("temp", serde_json::json!(temp))]));
    }
    publish(&mut stack.publisher().await, &readings).await;
    rollups_match(&stack, "2s", 2000, &readings).await;
    rollups_match(&stack, "4s", 4000, &readings).await;

    // A late reading into intervals already rolled up: recomputed.
    let late: Reading = (
        "r2".into(),
        t0 + 2500,
        vec![("temp", serde_json::json!(100.0))],
    );
    publish(&mut stack.publisher().await, std::slice::from_ref(&late)).await;
    readings.push(late);
    rollups_match(&stack, "2s", 2000, &readings).await;
    rollups_match(&stack, "4s", 4000, &readings).await;

    // Killed as soon as it acknowledged another late reading (spooled, not
    // necessarily written or recorded): the restart still rolls it up.
    let late: Reading = (
        "r1".into(),
        t0 + 9000,
        vec![("hum", serde_json::json!(1.5))],
    );
    publish(&mut stack.publisher().await, std::slice::from_ref(&late)).await;
    readings.push(late);
    stack.palletd.kill();
    stack.palletd = Palletd::start(&stack.config);
    rollups_match(&stack, "2s", 2000, &readings).await;
    rollups_match(&stack, "4s", 4000, &readings).await;

    // palletd query --stats --rollup reads them.
    let dir = tempfile::tempdir().unwrap();
    let cfg = stack.config.write_to(dir.path(), "palletd.toml");
    let out = query_ok(&cfg, &["--sensor", "r1", "--stats", "--rollup", "4s"]);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let want = expected(&readings, 4000);
    let want_r1: Vec<&Expected> = want
        .iter()
        .filter(|(k, _)| k.0 == "r1")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(lines.len(), want_r1.len(), "{out}");
    for (line, want) in lines.iter().zip(want_r1) {
        assert_eq!(line["count"].as_i64(), Some(want.count), "{line}");
        assert_eq!(
            line["fields"]["temp"]["first"].as_f64(),
            Some(want.fields["temp"][5]),
            "{line}"
        );
    }
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bucket_rollups_equal_the_raw_readings_after_late_data_and_a_kill() {
    rollups_equal_the_raw_readings("rollups", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_series_rollups_equal_the_raw_readings_after_late_data_and_a_kill() {
    rollups_equal_the_raw_readings("tsrollups", true).await;
}

/// A bucket palletd 0.1 wrote (an ObjectId `_id`, no `first` and `last`)
/// and today's buckets in one interval: the rollup merges the old one's
/// summaries and its samples' first and last with the new ones'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollup_merges_buckets_of_palletd_0_1_with_todays() {
    let mut stack = Stack::start("oldrollup", |c| {
        c.window("1s")
            .closer("200ms", "1s")
            .max_delay("200ms")
            .rollup("4s", false, None)
    })
    .await;
    let t0 = (now_ms() - 20_000).div_euclid(4000) * 4000;
    let old: Vec<Reading> = [(t0 + 1500, 7.5), (t0 + 1100, -2.0), (t0 + 1900, 3.0)]
        .into_iter()
        .map(|(ts, v)| ("o1".to_string(), ts, vec![("temp", serde_json::json!(v))]))
        .collect();
    let at = |ms: i64| bson::DateTime::from_millis(ms);
    let samples: Vec<Document> = old
        .iter()
        .map(|r| bson::doc! { "ts": at(r.1), "temp": r.2[0].1.as_f64().unwrap() })
        .collect();
    stack
        .client
        .database("oldrollup")
        .collection::<Document>("readings")
        .insert_one(bson::doc! {
            "sensorId": "o1", "startTs": at(t0 + 1000), "endTs": at(t0 + 2000),
            "count": 3, "size": 120, "minTs": at(t0 + 1100), "maxTs": at(t0 + 1900),
            "sum": { "temp": 8.5 }, "n": { "temp": 3 }, "min": { "temp": -2.0 }, "max": { "temp": 7.5 },
            "samples": samples, "lsn": 0_i64, "closed": true,
        })
        .await
        .unwrap();
    // Today's readings of the interval, after the old bucket's (whose
    // first is the interval's: only its samples know it).
    let new: Vec<Reading> = [(t0 + 2200, 1.0), (t0 + 2800, 4.5)]
        .into_iter()
        .map(|(ts, v)| ("o1".to_string(), ts, vec![("temp", serde_json::json!(v))]))
        .collect();
    publish(&mut stack.publisher().await, &new).await;
    let all: Vec<Reading> = old.into_iter().chain(new).collect();
    rollups_match(&stack, "4s", 4000, &all).await;
    stack.stop();
}

/// `partial = true`: the interval still open has a document, marked
/// partial, that follows the readings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_rollup_follows_the_open_interval() {
    let mut stack = Stack::start("partial", |c| {
        c.window("1s")
            .closer("200ms", "1s")
            .max_delay("200ms")
            .rollup("1d", true, Some("400d"))
    })
    .await;
    let now = now_ms();
    let readings: Vec<Reading> = (0..5)
        .map(|i| {
            let fields = vec![("temp", serde_json::json!(i as f64))];
            ("p1".to_string(), now - 1000 + i * 100, fields)
        })
        .collect();
    publish(&mut stack.publisher().await, &readings).await;
    let want = expected(&readings, 86_400_000);
    eventually(
        Duration::from_secs(60),
        "a partial daily rollup",
        || async {
            let docs = stack.docs("readings_1d").await;
            docs.len() == 1 && number(docs[0].get("count")) as usize == readings.len()
        },
    )
    .await;
    let docs = stack.docs("readings_1d").await;
    assert!(docs[0].get_bool("partial").unwrap(), "{}", docs[0]);
    // Its retention: a TTL index on the interval start.
    let indexes: Vec<mongodb::IndexModel> = stack
        .client
        .database("partial")
        .collection::<Document>("readings_1d")
        .list_indexes()
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let ttl = indexes
        .iter()
        .filter_map(|i| {
            i.options
                .as_ref()?
                .expire_after
                .map(|e| (i.keys.clone(), e))
        })
        .collect::<Vec<_>>();
    assert_eq!(
        ttl,
        vec![(bson::doc! { "start": 1 }, Duration::from_secs(400 * 86400))]
    );
    let (_, want) = want.into_iter().next().unwrap();
    assert_eq!(
        number(docs[0].get_document("sum").unwrap().get("temp")),
        want.fields["temp"][0]
    );
    assert_eq!(
        number(docs[0].get_document("last").unwrap().get("temp")),
        want.fields["temp"][6]
    );
    stack.stop();
}

/// A rollup the database refuses (here a unique index an operator put on
/// `count`; in the field, a document over 16 MB from thousands of field
/// names) is set aside and counted; the others are written, those of later
/// intervals too. Before, the refusal aborted the pass, and every pass took
/// the same key first: nothing after it was ever rolled up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollup_the_database_refuses_is_set_aside_and_the_rest_written() {
    let mut stack = Stack::start("parked", |c| {
        c.window("1s")
            .closer("200ms", "1s")
            .max_delay("200ms")
            .rollup("2s", false, None)
    })
    .await;
    let unique_count = mongodb::IndexModel::builder()
        .keys(bson::doc! { "count": 1 })
        .options(
            mongodb::options::IndexOptions::builder()
                .unique(true)
                .build(),
        )
        .build();
    stack
        .client
        .database("parked")
        .collection::<Document>("readings_2s")
        .create_index(unique_count)
        .await
        .unwrap();
    let t0 = (now_ms() - 20_000).div_euclid(2000) * 2000;
    let mut readings: Vec<Reading> = Vec::new();
    // Two sensors with as many readings in the first interval (one of
    // their rollups breaks the unique count), a third in the next.
    for (sensor, start, n) in [("p1", t0, 3), ("p2", t0, 3), ("p3", t0 + 2000, 5)] {
        for i in 0..n {
            readings.push((
                sensor.to_string(),
                start + i * 100,
                vec![("v", serde_json::json!(i as f64))],
            ));
        }
    }
    publish(&mut stack.publisher().await, &readings).await;
    eventually(
        Duration::from_secs(60),
        "the later interval rolled up",
        || async {
            stack
                .docs("readings_2s")
                .await
                .iter()
                .any(|d| d.get_str("sensorId") == Ok("p3"))
        },
    )
    .await;
    stack
        .palletd
        .wait_until(Duration::from_secs(60), "setting a rollup aside", |p| {
            p.metric("palletd_rollup_keys_parked_total", None) >= 1.0
        })
        .await;
    let rolled: Vec<String> = stack
        .docs("readings_2s")
        .await
        .iter()
        .map(|d| d.get_str("sensorId").unwrap().to_string())
        .collect();
    assert_eq!(rolled.len(), 2, "one of p1 and p2, and p3: {rolled:?}");
    let parked: Vec<Document> = stack
        .docs("readings_rollup_due")
        .await
        .into_iter()
        .filter(|d| d.get_bool("parked") == Ok(true))
        .collect();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert!(
        parked[0].get_str("error").unwrap().contains("11000"),
        "{parked:?}"
    );
    stack.stop();
}

/// A backfill records its rollup keys as blocks: one queue entry per
/// rollup, sensor and 64 intervals, whose bits are exactly the intervals
/// written (before, an entry per interval: a statement per reading here,
/// as every reading is its own bucket and interval). Then, with an entry
/// of one interval as palletd wrote them before blocks beside them, the
/// passes compute every rollup and empty the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_records_its_rollup_keys_in_blocks_of_64_intervals() {
    // No closer run (so no pass) while the keys are looked at.
    let mut stack = Stack::start("blocks", |c| {
        c.window("1s")
            .closer("1h", "1s")
            .max_delay("200ms")
            .rollup("2s", false, None)
    })
    .await;
    let t0 = (now_ms() - 400_000).div_euclid(2000) * 2000;
    let readings: Vec<Reading> = (0..600i64)
        .map(|i| {
            let sensor = ["q1", "q2"][(i % 2) as usize].to_string();
            (
                sensor,
                t0 + (i / 2) * 1000,
                vec![("v", serde_json::json!(i as f64 / 2.0))],
            )
        })
        .collect();
    publish(&mut stack.publisher().await, &readings).await;
    stack.wait_stored(readings.len()).await;

    let queue = stack.docs("readings_rollup_due").await;
    let mut recorded: Vec<(String, i64)> = Vec::new();
    for e in &queue {
        let (sensor, start) = (e.get_str("s").unwrap(), e.get_datetime("t").unwrap());
        let mask = e.get_i64("m").unwrap() as u64;
        let start = start.timestamp_millis();
        assert_eq!(start % (64 * 2000), 0, "{e:?}");
        for bit in (0..64).filter(|b| mask >> b & 1 == 1) {
            recorded.push((sensor.to_string(), start + bit * 2000));
        }
    }
    recorded.sort();
    let written: Vec<(String, i64)> = expected(&readings, 2000).into_keys().collect();
    assert_eq!(written.len(), 300);
    assert_eq!(recorded, written);
    // 300 s of 2 s intervals: 3 or 4 blocks of 128 s per sensor.
    assert!(queue.len() <= 8, "{} entries: {queue:?}", queue.len());

    let old = bson::doc! {
        "_id": format!("2s|{}|q1", t0 + 2000), "r": "2s", "s": "q1",
        "t": bson::DateTime::from_millis(t0 + 2000), "v": 1_i64,
        "due": bson::DateTime::from_millis(t0 + 5000),
    };
    (stack.client.database("blocks"))
        .collection::<Document>("readings_rollup_due")
        .insert_one(old)
        .await
        .unwrap();
    stack.stop();
    stack.config = stack.config.clone().closer("200ms", "1s");
    stack.palletd = Palletd::start(&stack.config);
    rollups_match(&stack, "2s", 2000, &readings).await;
    eventually(Duration::from_secs(60), "the queue emptied", || async {
        stack.docs("readings_rollup_due").await.is_empty()
    })
    .await;
    stack.stop();
}
