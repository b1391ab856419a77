//! `palletd query`: read back what was stored without writing MongoDB
//! queries.
//!
//! Readings are read bucket by bucket in `startTs` order on the
//! `{sensorId, startTs}` index; all buckets of one window (full ones, late
//! ones after sealing) are merged and their samples sorted by `ts`, so the
//! output is in time order while memory holds one window at a time.
//! `--stats` combines the rollups of each window's buckets (sum and n added,
//! min of min, max of max, avg = sum / n) without reading samples.
//!
//! In `timeseries` mode the readings are one document each: they are read in
//! `ts` order on the `{sensorId, ts}` index, and `--stats` computes the same
//! per-window rollups from them (windows of `bucket.window`).

use std::collections::BTreeMap;
use std::io::Write;

use bson::{doc, Bson, Document};
use futures_util::TryStreamExt;
use mongodb::Database;

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("database: {0}")]
    Database(#[from] mongodb::error::Error),
    #[error("unexpected bucket shape: {0}")]
    Shape(#[from] bson::document::ValueAccessError),
    #[error("output: {0}")]
    Io(#[from] std::io::Error),
    #[error("output: {0}")]
    Json(#[from] serde_json::Error),
}

type Result<T> = std::result::Result<T, QueryError>;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Jsonl,
    Csv,
}

/// Where the readings are.
#[derive(Clone, Copy)]
pub struct Store<'a> {
    pub db: &'a Database,
    pub collection: &'a str,
    pub window_ms: i64,
    pub timeseries: bool,
}

/// A time range `[from, to)` in ms since the epoch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Range {
    pub from: Option<i64>,
    pub to: Option<i64>,
}

/// Parses `--from`/`--to`: RFC 3339, or a duration meaning "that long ago"
/// (`2h`, `30m`).
pub fn parse_time(text: &str, now_ms: i64) -> std::result::Result<i64, String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(t.timestamp_millis());
    }
    humantime::parse_duration(text)
        .map(|d| now_ms - d.as_millis() as i64)
        .map_err(|_| {
            format!("{text:?} is neither RFC 3339 nor a duration like \"2h\" (meaning 2 hours ago)")
        })
}

/// `{sensorId, <field>: {$gte: from, $lt: to}}` (either bound may be open).
fn filter(sensor: &str, field: &str, range: Range) -> Document {
    let mut bounds = Document::new();
    if let Some(from) = range.from {
        bounds.insert("$gte", bson::DateTime::from_millis(from));
    }
    if let Some(to) = range.to {
        bounds.insert("$lt", bson::DateTime::from_millis(to));
    }
    let mut f = doc! { "sensorId": sensor };
    if !bounds.is_empty() {
        f.insert(field, bounds);
    }
    f
}

/// The buckets that may hold samples in `range`: a bucket starting less
/// than a window before `from` may hold samples after it.
fn bucket_filter(sensor: &str, range: Range, window_ms: i64) -> Document {
    let starts = Range {
        from: range.from.map(|f| f - window_ms + 1),
        to: range.to,
    };
    filter(sensor, "startTs", starts)
}

fn iso(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

fn json_value(b: &Bson) -> serde_json::Value {
    match b {
        Bson::Double(x) => serde_json::json!(x),
        Bson::Int32(x) => serde_json::json!(x),
        Bson::Int64(x) => serde_json::json!(x),
        Bson::String(s) => serde_json::json!(s),
        Bson::Boolean(v) => serde_json::json!(v),
        Bson::DateTime(d) => serde_json::json!(iso(d.timestamp_millis())),
        Bson::Null => serde_json::Value::Null,
        other => serde_json::Value::String(other.to_string()),
    }
}

fn csv_field(v: &serde_json::Value) -> String {
    let s = match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

type Fields = Vec<(String, serde_json::Value)>;

/// Rows of (ts, fields) in time order for one sensor, streamed to `emit`.
async fn readings(
    store: Store<'_>,
    sensor: &str,
    range: Range,
    emit: impl FnMut(i64, Fields) -> std::io::Result<()>,
) -> Result<u64> {
    if store.timeseries {
        series_readings(store, sensor, range, emit).await
    } else {
        bucket_readings(store, sensor, range, emit).await
    }
}

/// A reading's fields other than `ts`, as JSON values.
fn fields(reading: &Document) -> Fields {
    reading
        .iter()
        .filter(|(k, _)| k.as_str() != "ts")
        .map(|(k, v)| (k.clone(), json_value(v)))
        .collect()
}

/// Time series mode: one document per reading, in `ts` order.
async fn series_readings(
    store: Store<'_>,
    sensor: &str,
    range: Range,
    mut emit: impl FnMut(i64, Fields) -> std::io::Result<()>,
) -> Result<u64> {
    let mut cursor = store
        .db
        .collection::<Document>(store.collection)
        .find(filter(sensor, "ts", range))
        .sort(doc! { "ts": 1 })
        .projection(doc! { "_id": 0, "sensorId": 0, "lsn": 0 })
        .await?;
    let mut n = 0;
    while let Some(d) = cursor.try_next().await? {
        let ts = d.get_datetime("ts")?.timestamp_millis();
        emit(ts, fields(&d))?;
        n += 1;
    }
    Ok(n)
}

/// Bucket mode: streamed window by window, each window's buckets merged.
async fn bucket_readings(
    store: Store<'_>,
    sensor: &str,
    range: Range,
    mut emit: impl FnMut(i64, Fields) -> std::io::Result<()>,
) -> Result<u64> {
    let mut cursor = store
        .db
        .collection::<Document>(store.collection)
        .find(bucket_filter(sensor, range, store.window_ms))
        .sort(doc! { "startTs": 1 })
        .projection(doc! { "startTs": 1, "samples": 1 })
        .await?;
    let mut window: Option<i64> = None;
    let mut rows: Vec<(i64, Fields)> = Vec::new();
    let mut n = 0u64;
    let mut flush = |rows: &mut Vec<(i64, Fields)>| -> std::io::Result<()> {
        rows.sort_by_key(|r| r.0);
        for (ts, fields) in rows.drain(..) {
            emit(ts, fields)?;
        }
        Ok(())
    };
    while let Some(bucket) = cursor.try_next().await? {
        let start = bucket.get_datetime("startTs")?.timestamp_millis();
        if window != Some(start) {
            flush(&mut rows)?;
            window = Some(start);
        }
        for s in bucket.get_array("samples")? {
            let Some(s) = s.as_document() else { continue };
            let ts = s.get_datetime("ts")?.timestamp_millis();
            if range.from.is_some_and(|f| ts < f) || range.to.is_some_and(|t| ts >= t) {
                continue;
            }
            rows.push((ts, fields(s)));
            n += 1;
        }
    }
    flush(&mut rows)?;
    Ok(n)
}

/// Prints one sensor's readings in time order.
pub async fn print_readings(
    store: Store<'_>,
    sensor: &str,
    range: Range,
    format: Format,
    out: &mut impl Write,
) -> Result<u64> {
    match format {
        Format::Jsonl => {
            readings(store, sensor, range, |ts, fields| {
                let mut obj = serde_json::Map::new();
                obj.insert("sensorId".into(), sensor.into());
                obj.insert("ts".into(), iso(ts).into());
                obj.extend(fields);
                writeln!(out, "{}", serde_json::Value::Object(obj))
            })
            .await
        }
        Format::Csv => {
            // The header needs every column (sorted by name): CSV holds the
            // rows until the end.
            let mut rows = Vec::new();
            let n = readings(store, sensor, range, |ts, fields| {
                rows.push((ts, fields));
                Ok(())
            })
            .await?;
            let columns: Vec<String> = rows
                .iter()
                .flat_map(|(_, fields)| fields.iter().map(|(k, _)| k.clone()))
                .collect::<std::collections::BTreeSet<String>>()
                .into_iter()
                .collect();
            writeln!(out, "sensorId,ts,{}", columns.join(","))?;
            for (ts, fields) in rows {
                let map: BTreeMap<String, serde_json::Value> = fields.into_iter().collect();
                let cells: Vec<String> = columns
                    .iter()
                    .map(|c| map.get(c).map(csv_field).unwrap_or_default())
                    .collect();
                writeln!(
                    out,
                    "{},{},{}",
                    csv_field(&sensor.into()),
                    iso(ts),
                    cells.join(",")
                )?;
            }
            Ok(n)
        }
    }
}

/// Per-window rollups of one sensor, merged across the window's buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowStats {
    pub start_ms: i64,
    pub buckets: u32,
    pub count: i64,
    /// field -> (sum, n, min, max)
    pub fields: BTreeMap<String, (f64, i64, f64, f64)>,
}

/// The rollups of every window in the range: from the buckets' rollup
/// fields (no samples read), or in time series mode from the readings.
pub async fn window_stats(
    store: Store<'_>,
    sensor: &str,
    range: Range,
) -> Result<Vec<WindowStats>> {
    if !store.timeseries {
        return bucket_stats(store, sensor, range).await;
    }
    let mut out: Vec<WindowStats> = Vec::new();
    let window_ms = store.window_ms;
    readings(store, sensor, range, |ts, fields| {
        let start = ts.div_euclid(window_ms) * window_ms;
        if out.last().map(|w| w.start_ms) != Some(start) {
            out.push(WindowStats {
                start_ms: start,
                buckets: 0,
                count: 0,
                fields: BTreeMap::new(),
            });
        }
        if let Some(w) = out.last_mut() {
            w.count += 1;
            for (k, v) in fields {
                if let Some(x) = v.as_f64() {
                    let e = w
                        .fields
                        .entry(k)
                        .or_insert((0.0, 0, f64::INFINITY, f64::NEG_INFINITY));
                    e.0 += x;
                    e.1 += 1;
                    e.2 = e.2.min(x);
                    e.3 = e.3.max(x);
                }
            }
        }
        Ok(())
    })
    .await?;
    Ok(out)
}

async fn bucket_stats(store: Store<'_>, sensor: &str, range: Range) -> Result<Vec<WindowStats>> {
    let mut cursor = store
        .db
        .collection::<Document>(store.collection)
        .find(bucket_filter(sensor, range, store.window_ms))
        .sort(doc! { "startTs": 1 })
        .projection(doc! { "samples": 0 })
        .await?;
    let mut out: Vec<WindowStats> = Vec::new();
    while let Some(b) = cursor.try_next().await? {
        let start = b.get_datetime("startTs")?.timestamp_millis();
        if out.last().map(|w| w.start_ms) != Some(start) {
            out.push(WindowStats {
                start_ms: start,
                buckets: 0,
                count: 0,
                fields: BTreeMap::new(),
            });
        }
        let Some(w) = out.last_mut() else { continue };
        w.buckets += 1;
        w.count += number(b.get("count")).unwrap_or(0.0) as i64;
        let empty = Document::new();
        let part = |name: &str| b.get_document(name).unwrap_or(&empty);
        let (sum, n, min, max) = (part("sum"), part("n"), part("min"), part("max"));
        for (field, s) in sum {
            let e =
                w.fields
                    .entry(field.clone())
                    .or_insert((0.0, 0, f64::INFINITY, f64::NEG_INFINITY));
            e.0 += number(Some(s)).unwrap_or(0.0);
            e.1 += number(n.get(field)).unwrap_or(0.0) as i64;
            e.2 = e.2.min(number(min.get(field)).unwrap_or(f64::INFINITY));
            e.3 = e.3.max(number(max.get(field)).unwrap_or(f64::NEG_INFINITY));
        }
    }
    Ok(out)
}

fn number(b: Option<&Bson>) -> Option<f64> {
    match b? {
        Bson::Double(x) => Some(*x),
        Bson::Int32(x) => Some(*x as f64),
        Bson::Int64(x) => Some(*x as f64),
        _ => None,
    }
}

/// Prints per-window rollups.
pub fn print_stats(
    sensor: &str,
    stats: &[WindowStats],
    format: Format,
    out: &mut impl Write,
) -> std::io::Result<()> {
    if format == Format::Csv {
        writeln!(
            out,
            "sensorId,startTs,buckets,count,field,sum,n,avg,min,max"
        )?;
    }
    for w in stats {
        match format {
            Format::Jsonl => {
                let fields: serde_json::Map<String, serde_json::Value> = w
                    .fields
                    .iter()
                    .map(|(k, (sum, n, min, max))| {
                        (
                            k.clone(),
                            serde_json::json!({ "sum": sum, "n": n, "avg": sum / *n as f64, "min": min, "max": max }),
                        )
                    })
                    .collect();
                let line = serde_json::json!({
                    "sensorId": sensor, "startTs": iso(w.start_ms), "buckets": w.buckets,
                    "count": w.count, "fields": fields,
                });
                writeln!(out, "{line}")?;
            }
            Format::Csv => {
                for (k, (sum, n, min, max)) in &w.fields {
                    writeln!(
                        out,
                        "{},{},{},{},{},{sum},{n},{},{min},{max}",
                        csv_field(&sensor.into()),
                        iso(w.start_ms),
                        w.buckets,
                        w.count,
                        csv_field(&k.as_str().into()),
                        sum / *n as f64
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// Prints how much is stored: buckets, sensors, samples, dead letters.
pub async fn print_summary(store: Store<'_>, out: &mut impl Write) -> Result<()> {
    let (db, collection) = (store.db, store.collection);
    let coll = db.collection::<Document>(collection);
    let dead = db
        .collection::<Document>(&format!("{collection}_deadletter"))
        .estimated_document_count()
        .await?;
    if store.timeseries {
        let mut agg = coll
            .aggregate(vec![doc! { "$group": {
                "_id": null,
                "samples": { "$sum": 1 },
                "sensors": { "$addToSet": "$sensorId" },
            } }])
            .await?;
        let row = agg.try_next().await?.unwrap_or_default();
        writeln!(
            out,
            "time series collection holding {} samples of {} sensors; {} dead letters",
            number(row.get("samples")).unwrap_or(0.0),
            row.get_array("sensors").map_or(0, |a| a.len()),
            dead
        )?;
        return Ok(());
    }
    let mut agg = coll
        .aggregate(vec![doc! { "$group": {
            "_id": null,
            "buckets": { "$sum": 1 },
            "sealed": { "$sum": { "$cond": ["$closed", 1, 0] } },
            "samples": { "$sum": "$count" },
            "sensors": { "$addToSet": "$sensorId" },
        } }])
        .await?;
    let row = agg.try_next().await?.unwrap_or_default();
    let sensors = row.get_array("sensors").map_or(0, |a| a.len());
    writeln!(
        out,
        "{} buckets ({} sealed) holding {} samples of {} sensors; {} dead letters",
        number(row.get("buckets")).unwrap_or(0.0),
        number(row.get("sealed")).unwrap_or(0.0),
        number(row.get("samples")).unwrap_or(0.0),
        sensors,
        dead
    )?;
    Ok(())
}

/// Prints up to `limit` bucket documents as relaxed extended JSON, newest
/// first, with at most `max_samples_shown` samples each.
pub async fn print_buckets(
    db: &Database,
    collection: &str,
    sensor: Option<&str>,
    limit: i64,
    out: &mut impl Write,
) -> Result<()> {
    let f = sensor.map_or_else(Document::new, |s| doc! { "sensorId": s });
    let mut cursor = db
        .collection::<Document>(collection)
        .find(f)
        .sort(doc! { "startTs": -1 })
        .limit(limit)
        .projection(doc! { "samples": { "$slice": 3 } })
        .await?;
    while let Some(b) = cursor.try_next().await? {
        let json = Bson::Document(b).into_relaxed_extjson();
        writeln!(out, "{}", serde_json::to_string_pretty(&json)?)?;
    }
    Ok(())
}
