//! The operator's view against the real broker and database: each sensor's
//! latest value (`<collection>_latest`) through out-of-order, late and
//! replayed readings in both storage modes, a change stream on it, and the
//! flat view (`<collection>_flat`) read back equal to `palletd query`.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, Document};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::json;

use common::*;

/// `<collection>_latest` of this stack, by sensor.
async fn latest(stack: &Stack) -> BTreeMap<String, Document> {
    stack
        .docs("readings_latest")
        .await
        .into_iter()
        .map(|d| (d.get_str("_id").unwrap().to_string(), d))
        .collect()
}

/// A latest value's (ts, seq).
fn ts_seq(d: &Document) -> (i64, i64) {
    let ts = d.get_datetime("ts").unwrap().timestamp_millis();
    let sample = d.get_document("sample").unwrap();
    assert_eq!(
        sample.get_datetime("ts").unwrap().timestamp_millis(),
        ts,
        "{d}"
    );
    (ts, sample.get_f64("seq").unwrap() as i64)
}

/// The latest value of a sensor is its newest reading, whatever order the
/// readings arrive in: a late one, an older one replayed after a SIGKILL
/// (written after newer ones) and a newer one replayed never move it back;
/// in both storage modes, and `palletd query --latest` prints it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latest_value_only_moves_forward_through_late_and_replayed_readings() {
    for timeseries in [false, true] {
        let mut stack = Stack::start(&format!("latest{}", timeseries as u8), |c| {
            let c = c.max_delay("200ms");
            if timeseries {
                c.timeseries()
            } else {
                c
            }
        })
        .await;
        let t0 = now_ms() - 60_000;
        let mut p = stack.publisher().await;
        // Out of order: the newest of "a" comes first.
        for (sensor, off, seq) in [("a", 30, 3), ("a", 10, 1), ("b", 5, 1), ("a", 20, 2)] {
            let v = json!({ "ts": t0 + off * 1000, "seq": seq, "temp": 20.0 + seq as f64, "note": "$seq" });
            p.json(sensor, v).await;
        }
        p.flush().await;
        stack.wait_stored(4).await;
        eventually(Duration::from_secs(20), "both latest values", || async {
            latest(&stack).await.len() == 2
        })
        .await;
        let l = latest(&stack).await;
        assert_eq!(ts_seq(&l["a"]), (t0 + 30_000, 3), "mode {timeseries}");
        assert_eq!(ts_seq(&l["b"]), (t0 + 5_000, 1));
        let sample = l["a"].get_document("sample").unwrap();
        assert_eq!(sample.get_f64("temp"), Ok(23.0));
        assert_eq!(sample.get_str("note"), Ok("$seq"), "a string, not a path");
        assert!(l["a"].get_datetime("updatedAt").is_ok());

        // A late reading of "a": stored, the latest value stays.
        p.json("a", json!({ "ts": t0 + 15_000, "seq": 9 })).await;
        p.flush().await;
        stack.wait_stored(5).await;
        assert_eq!(ts_seq(&latest(&stack).await["a"]), (t0 + 30_000, 3));

        // Readings spooled while the database is away, then palletd killed:
        // the next run replays them, an older one of "b" and a newer one of
        // "a".
        stack.db.stop();
        p.json("b", json!({ "ts": t0 + 1_000, "seq": 0 })).await;
        p.json("a", json!({ "ts": t0 + 40_000, "seq": 4 })).await;
        p.flush().await;
        stack.all_acknowledged().await;
        stack.palletd.kill();
        stack.db.start_again();
        stack.palletd = Palletd::start(&stack.config);
        stack.wait_stored(7).await;
        eventually(
            Duration::from_secs(20),
            "a's replayed latest value",
            || async { ts_seq(&latest(&stack).await["a"]) == (t0 + 40_000, 4) },
        )
        .await;
        assert_eq!(ts_seq(&latest(&stack).await["b"]), (t0 + 5_000, 1));
        assert_eq!(stack.stored().await, 7, "exactly once");

        let cfg = stack
            .config
            .write_to(stack.palletd.dir.path(), "query.toml");
        let out = query_ok(&cfg, &["--latest"]);
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert_eq!(lines[0]["sensorId"], "a");
        assert_eq!(lines[0]["seq"], 4.0);
        assert_eq!(
            lines[0]["ts"],
            palletd::clock::iso(t0 + 40_000).as_str(),
            "{out}"
        );
        assert_eq!(lines[1]["sensorId"], "b");
        assert!(lines[1]["updatedAt"].is_string());
        let one = query_ok(&cfg, &["--latest", "--sensor", "b"]);
        assert_eq!(one.lines().count(), 1, "{one}");
        stack.stop();
    }
}

/// A change stream on `<collection>_latest` sees each sensor's new value
/// as palletd writes it: the README's live-dashboard example, run against
/// the real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_stream_on_the_latest_values_sees_each_new_reading() {
    let mut stack = Stack::start("watch", |c| c.max_delay("100ms")).await;
    // The README's example, as written there.
    let db = stack.client.database(&stack.config.database());
    let latest = db.collection::<Document>("readings_latest");
    let mut changes = latest
        .watch()
        .full_document(mongodb::options::FullDocumentType::UpdateLookup)
        .await
        .expect("a change stream on readings_latest");
    let mut p = stack.publisher().await;
    let t0 = now_ms();
    for seq in 0..3i64 {
        p.json("w1", json!({ "ts": t0 + seq, "seq": seq })).await;
        p.flush().await;
        stack.wait_stored(seq as usize + 1).await;
    }
    let mut seen = Vec::new();
    while seen.last() != Some(&2) {
        let event = tokio::time::timeout(Duration::from_secs(20), changes.next())
            .await
            .expect("a change within 20 s")
            .expect("the stream goes on")
            .unwrap();
        let doc = event.full_document.expect("the document");
        assert_eq!(doc.get_str("_id"), Ok("w1"));
        let seq = doc.get_document("sample").unwrap().get_f64("seq").unwrap() as i64;
        seen.push(seq);
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    stack.stop();
}

/// `<collection>_flat` holds one document per reading, `{sensorId, ts,
/// <fields>}`, the same readings `palletd query` prints (buckets of 4
/// samples, out of order, two sensors); made again at a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flat_view_reads_back_what_palletd_query_prints() {
    let mut stack = Stack::start("flat", |c| c.max_delay("200ms").max_samples(4)).await;
    let mut p = stack.publisher().await;
    let t0 = now_ms() - 30_000;
    for seq in 0..10i64 {
        let off = (seq * 7) % 10;
        for sensor in ["f1", "f2"] {
            p.json(
                sensor,
                json!({ "ts": t0 + off * 100, "seq": seq, "v": seq as f64 / 2.0 }),
            )
            .await;
        }
    }
    p.flush().await;
    stack.wait_stored(20).await;
    stack.stop();
    // The view is there after a restart too (made again, kept current).
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    let cfg = stack
        .config
        .write_to(stack.palletd.dir.path(), "query.toml");
    let db = stack.client.database(&stack.config.database());
    for sensor in ["f1", "f2"] {
        let flat: Vec<Document> = db
            .collection::<Document>("readings_flat")
            .find(doc! { "sensorId": sensor })
            .sort(doc! { "ts": 1, "seq": 1 })
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(flat.len(), 10);
        let from_view: Vec<serde_json::Value> = flat
            .iter()
            .map(|d| {
                let keys: Vec<&str> = d.keys().map(|k| k.as_str()).collect();
                assert_eq!(keys, ["sensorId", "ts", "seq", "v"], "{d}");
                json!({
                    "sensorId": d.get_str("sensorId").unwrap(),
                    "ts": palletd::clock::iso(d.get_datetime("ts").unwrap().timestamp_millis()),
                    "seq": d.get_f64("seq").unwrap(),
                    "v": d.get_f64("v").unwrap(),
                })
            })
            .collect();
        let mut from_query: Vec<serde_json::Value> = query_ok(&cfg, &["--sensor", sensor])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // (Readings of the same time: by seq, as the view was sorted.)
        from_query.sort_by(|a, b| {
            (a["ts"].as_str(), a["seq"].as_f64())
                .partial_cmp(&(b["ts"].as_str(), b["seq"].as_f64()))
                .unwrap()
        });
        assert_eq!(from_view, from_query, "{sensor}");
    }
    stack.stop();
}
