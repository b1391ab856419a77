//! Reading what was stored back and checking it: buckets' invariants,
//! sealed buckets, exactly once.

use super::*;

/// All documents of a collection.
pub async fn all_docs(client: &mongodb::Client, db: &str, coll: &str) -> Vec<Document> {
    client
        .database(db)
        .collection::<Document>(coll)
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// Samples stored: in bucket documents, or one per time series document.
pub async fn stored_samples(client: &mongodb::Client, db: &str) -> usize {
    all_docs(client, db, "readings")
        .await
        .iter()
        .map(|b| b.get_array("samples").map_or(1, |s| s.len()))
        .sum()
}

/// The `seq` field of every sample of a bucket, in stored order.
pub fn seqs(bucket: &Document) -> Vec<i64> {
    bucket
        .get_array("samples")
        .unwrap()
        .iter()
        .map(|s| s.as_document().unwrap().get_f64("seq").unwrap() as i64)
        .collect()
}

/// A sample's `ts` in ms.
pub fn ts_of(sample: &Bson) -> i64 {
    sample
        .as_document()
        .unwrap()
        .get_datetime("ts")
        .unwrap()
        .timestamp_millis()
}

/// Unwinds every bucket into (sensor, seq) -> [(ts, sample without ts)].
pub fn unwind(buckets: &[Document]) -> HashMap<(String, i64), Vec<(i64, Document)>> {
    let mut out: HashMap<(String, i64), Vec<(i64, Document)>> = HashMap::new();
    for b in buckets {
        let sensor = b.get_str("sensorId").unwrap().to_string();
        for s in b.get_array("samples").unwrap() {
            let mut s = s.as_document().unwrap().clone();
            let ts = s.get_datetime("ts").unwrap().timestamp_millis();
            s.remove("ts");
            let seq = s.get_f64("seq").unwrap() as i64;
            out.entry((sensor.clone(), seq)).or_default().push((ts, s));
        }
    }
    out
}

/// Checks every invariant of a bucket document; panics naming the broken one.
pub fn check_bucket(b: &Document, window_ms: i64, max_samples: usize, max_bytes: usize) {
    let samples = b.get_array("samples").expect("samples");
    let count = b.get_i32("count").expect("count") as usize;
    assert_eq!(count, samples.len(), "count == samples.length: {b}");
    assert!(count <= max_samples, "count <= max_samples: {b}");
    let size = b.get_i32("size").expect("size") as usize;
    assert!(size <= max_bytes, "size <= max_bytes: {b}");
    // What the bucket holds: its samples, and an entry per distinct numeric
    // name in each of sum, n, min, max and the seal's avg, and its {t, v}
    // in first and last.
    let bytes: usize = samples
        .iter()
        .map(|s| bson::to_vec(s.as_document().unwrap()).unwrap().len())
        .sum();
    let names: std::collections::HashSet<&str> = samples
        .iter()
        .flat_map(|s| s.as_document().unwrap().iter())
        .filter(|(_, v)| matches!(v, Bson::Double(_)))
        .map(|(k, _)| k.as_str())
        .collect();
    let summaries: usize = names.iter().map(|n| 7 * n.len() + 108).sum();
    assert!(
        bytes + summaries <= size,
        "size counts what the bucket holds: {bytes} bytes of samples and {summaries} of summaries, size {size}: {b}"
    );
    let start = b.get_datetime("startTs").unwrap().timestamp_millis();
    let end = b.get_datetime("endTs").unwrap().timestamp_millis();
    // Open, unless full (the closer seals a bucket palletd filled, or
    // left with a sixteenth or less of room, without waiting for its
    // window's end) or its window is over.
    if b.get_bool("closed").expect("closed") {
        assert!(
            count >= max_samples - max_samples / 16 || end <= now_ms(),
            "closed only when full or its window is over: {b}"
        );
        check_sealed(b);
    }
    assert_eq!(
        start.rem_euclid(window_ms),
        0,
        "startTs aligned to the window"
    );
    assert_eq!(end, start + window_ms, "endTs = startTs + window");
    let ts: Vec<i64> = samples.iter().map(ts_of).collect();
    assert!(
        ts.iter().all(|t| (start..end).contains(t)),
        "sample ts in [startTs, endTs)"
    );
    assert_eq!(
        b.get_datetime("minTs").unwrap().timestamp_millis(),
        *ts.iter().min().unwrap()
    );
    assert_eq!(
        b.get_datetime("maxTs").unwrap().timestamp_millis(),
        *ts.iter().max().unwrap()
    );
    // Rollups recomputed from the samples.
    let mut sums: std::collections::BTreeMap<String, (f64, i32, f64, f64)> = Default::default();
    for s in samples {
        for (k, v) in s.as_document().unwrap() {
            if let Bson::Double(x) = v {
                let e = sums
                    .entry(k.clone())
                    .or_insert((0.0, 0, f64::MAX, f64::MIN));
                e.0 += x;
                e.1 += 1;
                e.2 = e.2.min(*x);
                e.3 = e.3.max(*x);
            }
        }
    }
    let empty = Document::new();
    let (sum, n, min, max) = (
        b.get_document("sum").unwrap_or(&empty),
        b.get_document("n").unwrap_or(&empty),
        b.get_document("min").unwrap_or(&empty),
        b.get_document("max").unwrap_or(&empty),
    );
    assert_eq!(n.len(), sums.len(), "one n.<field> per numeric field: {b}");
    for (k, (s, c, lo, hi)) in sums {
        let stored = sum.get_f64(&k).unwrap();
        assert!(
            (stored - s).abs() <= 1e-9 * s.abs().max(1.0),
            "sum.{k}: {stored} vs {s}"
        );
        assert_eq!(n.get_i32(&k).unwrap(), c, "n.{k}");
        assert_eq!(min.get_f64(&k).unwrap(), lo, "min.{k}");
        assert_eq!(max.get_f64(&k).unwrap(), hi, "max.{k}");
    }
}

/// Checks a sealed bucket: closed, `closedAt`, samples sorted, `avg = sum / n`.
pub fn check_sealed(b: &Document) {
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

/// (sensor, seq) -> how many times stored.
pub async fn stored_counts(client: &mongodb::Client, db: &str) -> HashMap<(String, i64), usize> {
    let mut out = HashMap::new();
    for b in all_docs(client, db, "readings").await {
        let sensor = b.get_str("sensorId").unwrap().to_string();
        match b.get_array("samples") {
            Ok(samples) => {
                for s in samples {
                    let seq = s.as_document().unwrap().get_f64("seq").unwrap() as i64;
                    *out.entry((sensor.clone(), seq)).or_default() += 1;
                }
            }
            // Time series mode: one document per reading.
            Err(_) => {
                let seq = b.get_f64("seq").unwrap() as i64;
                *out.entry((sensor, seq)).or_default() += 1;
            }
        }
    }
    out
}

/// Waits until every sent reading is stored, then checks each is stored
/// exactly once and every bucket is consistent.
pub async fn assert_exactly_once(
    client: &mongodb::Client,
    db: &str,
    sent: &[(String, i64)],
    within: Duration,
) {
    // Every reading seen, not a count reached: a scan while buckets grow
    // may see one twice. On a timeout, say which are missing.
    let last = std::sync::Mutex::new((0, Vec::new()));
    poll_until(
        within,
        || async {
            let stored = stored_counts(client, db).await;
            let missing: Vec<_> = sent.iter().filter(|k| !stored.contains_key(*k)).collect();
            let shown = missing.iter().take(10).map(|k| (*k).clone()).collect();
            *last.lock().unwrap() = (missing.len(), shown);
            missing.is_empty()
        },
        || {
            let (n, shown) = &*last.lock().unwrap();
            format!(
                "every published reading stored: {n} of {} missing, e.g. {shown:?}",
                sent.len()
            )
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stored = stored_counts(client, db).await;
    let missing: Vec<_> = sent
        .iter()
        .filter(|k| !stored.contains_key(*k))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    let twice: Vec<_> = stored.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(twice.is_empty(), "stored more than once: {twice:?}");
    assert_eq!(stored.len(), sent.len(), "nothing extra");
    for b in all_docs(client, db, "readings").await {
        if b.contains_key("samples") {
            check_bucket(&b, HOUR_MS, 200, 256 * 1024);
        }
    }
}

/// A stored number of any BSON numeric type.
pub fn number(b: Option<&Bson>) -> f64 {
    match b {
        Some(Bson::Double(x)) => *x,
        Some(Bson::Int32(x)) => *x as f64,
        Some(Bson::Int64(x)) => *x as f64,
        other => panic!("not a number: {other:?}"),
    }
}
