//! `palletd query`: read back what was stored without writing MongoDB
//! queries. The storage mode's reader ([`crate::store::Store`]) yields one
//! sensor's readings in time order, or per-window rollups; this module
//! prints them as JSON lines or CSV. Both stream: memory holds one window's
//! readings at most (CSV reads the range twice, for its header).

use std::collections::BTreeMap;
use std::io::Write;

use bson::Bson;

use crate::clock::iso;
use crate::config::RollupSettings;
pub use crate::store::read::{QueryError, Range, Summary, WindowStats};
use crate::store::Store;

type Result<T> = std::result::Result<T, QueryError>;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Jsonl,
    Csv,
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

pub(crate) fn json_value(b: &Bson) -> serde_json::Value {
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

pub(crate) fn csv_field(v: &serde_json::Value) -> String {
    let s = match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        // The shortest decimal that reads back the same value: 4, 0.5.
        serde_json::Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() => x.to_string(),
            _ => n.to_string(),
        },
        other => other.to_string(),
    };
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// Prints one sensor's readings in time order.
pub async fn print_readings(
    store: &Store,
    sensor: &str,
    range: Range,
    format: Format,
    out: &mut impl Write,
) -> Result<u64> {
    match format {
        Format::Jsonl => {
            store
                .readings(sensor, range, |ts, fields| {
                    let mut obj = serde_json::Map::new();
                    obj.insert("sensorId".into(), sensor.into());
                    obj.insert("ts".into(), iso(ts).into());
                    obj.extend(fields.iter().map(|(k, v)| (k.clone(), json_value(v))));
                    writeln!(out, "{}", serde_json::Value::Object(obj))
                })
                .await
        }
        Format::Csv => {
            // The header names every column (sorted by name), so the rows
            // are read twice: once for the names, once to print. Memory
            // holds one window's rows at most, however long the range.
            let mut columns = std::collections::BTreeSet::new();
            store
                .readings(sensor, range, |_, fields| {
                    columns.extend(fields.into_iter().map(|(k, _)| k));
                    Ok(())
                })
                .await?;
            let columns: Vec<String> = columns.into_iter().collect();
            writeln!(out, "sensorId,ts,{}", columns.join(","))?;
            let sensor_cell = csv_field(&sensor.into());
            store
                .readings(sensor, range, |ts, fields| {
                    let map: BTreeMap<String, Bson> = fields.into_iter().collect();
                    let cells: Vec<String> = columns
                        .iter()
                        .map(|c| {
                            map.get(c)
                                .map(|v| csv_field(&json_value(v)))
                                .unwrap_or_default()
                        })
                        .collect();
                    writeln!(out, "{sensor_cell},{},{}", iso(ts), cells.join(","))
                })
                .await
        }
    }
}

/// Prints each sensor's latest value as JSON lines, by sensor id:
/// `{"sensorId", "ts", <fields>, "updatedAt"}`.
pub async fn print_latest(
    store: &Store,
    sensor: Option<&str>,
    out: &mut impl Write,
) -> Result<u64> {
    store
        .latest(sensor, None, |id, ts, sample, updated| {
            let mut obj = serde_json::Map::new();
            obj.insert("sensorId".into(), id.into());
            obj.insert("ts".into(), iso(ts).into());
            obj.extend(
                sample
                    .iter()
                    .filter(|(k, _)| k.as_str() != "ts")
                    .map(|(k, v)| (k.clone(), json_value(v))),
            );
            obj.insert("updatedAt".into(), iso(updated).into());
            writeln!(out, "{}", serde_json::Value::Object(obj))
        })
        .await
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

/// Prints the closer's rollups of one interval.
pub fn print_rollups(
    sensor: &str,
    rows: &[crate::store::rollup::RollupRow],
    format: Format,
    out: &mut impl Write,
) -> std::io::Result<()> {
    const PARTS: [&str; 7] = ["sum", "n", "min", "max", "avg", "first", "last"];
    if format == Format::Csv {
        writeln!(
            out,
            "sensorId,start,count,partial,field,sum,n,min,max,avg,first,last"
        )?;
    }
    for r in rows {
        match format {
            Format::Jsonl => {
                let fields: serde_json::Map<String, serde_json::Value> = r
                    .fields
                    .iter()
                    .map(|(k, v)| {
                        let parts: serde_json::Map<String, serde_json::Value> = PARTS
                            .iter()
                            .zip(v)
                            .map(|(p, x)| (p.to_string(), serde_json::json!(x)))
                            .collect();
                        (k.clone(), serde_json::Value::Object(parts))
                    })
                    .collect();
                let line = serde_json::json!({
                    "sensorId": sensor, "start": iso(r.start_ms), "count": r.count,
                    "partial": r.partial, "fields": fields,
                });
                writeln!(out, "{line}")?;
            }
            Format::Csv => {
                for (k, v) in &r.fields {
                    let values: Vec<String> = v.iter().map(|x| x.to_string()).collect();
                    writeln!(
                        out,
                        "{},{},{},{},{},{}",
                        csv_field(&sensor.into()),
                        iso(r.start_ms),
                        r.count,
                        r.partial,
                        csv_field(&k.as_str().into()),
                        values.join(",")
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// Prints how much is stored: buckets, sensors, samples, dead letters.
pub fn print_summary(s: &Summary, out: &mut impl Write) -> std::io::Result<()> {
    match s.buckets {
        Some((buckets, sealed)) => writeln!(
            out,
            "{buckets} buckets ({sealed} sealed) holding {} samples of {} sensors; {} dead letters",
            s.samples, s.sensors, s.dead_letters
        ),
        None => writeln!(
            out,
            "time series collection holding {} samples of {} sensors; {} dead letters",
            s.samples, s.sensors, s.dead_letters
        ),
    }
}

/// At most this many steps in one series answer (a point per step and
/// field: the fields of one sensor are bounded by
/// `limits.max_fields_per_sample`).
pub(crate) const MAX_POINTS: usize = 10_000;
/// At most this many stored documents (buckets, time series documents)
/// or readings read for one series answer.
pub(crate) const MAX_READ: u64 = 200_000;

/// One field's values over one step of a series: their count, sum,
/// smallest and largest.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SeriesPoint {
    pub start_ms: i64,
    pub field: String,
    pub n: i64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
}

impl SeriesPoint {
    /// The mean of the step's values (what the API and the charts show).
    pub(crate) fn avg(&self) -> f64 {
        self.sum / self.n.max(1) as f64
    }
}

/// Where a series was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SeriesSource {
    /// A rollup collection (`[[rollup]]` `name`): its settled intervals;
    /// the others (not rolled up yet, late data due again, partial) from
    /// the windows' summaries, `from_windows` of them.
    Rollup { name: String, from_windows: u64 },
    /// The windows' summaries (a bucket's, or the time series documents
    /// and summaries of readings thinning left out): every reading.
    Windows,
    /// The stored samples (a step shorter than `bucket.window`, or not a
    /// whole number of them): with thinning, the points kept.
    Samples,
}

/// Which source [`series`] reads: the cheapest the step allows, or one
/// asked for (`source=` of the API: to compare them, or to see the points
/// thinning kept at any step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Prefer {
    #[default]
    Cheapest,
    Rollup,
    Windows,
    Samples,
}

impl Prefer {
    pub fn parse(text: &str) -> Option<Prefer> {
        Some(match text {
            "auto" => Prefer::Cheapest,
            "rollup" => Prefer::Rollup,
            "windows" => Prefer::Windows,
            "samples" => Prefer::Samples,
            _ => return None,
        })
    }
}

/// One sensor's numeric fields (or `field` alone) in steps of `step_ms`
/// (aligned to the epoch) over `range`, widened to whole steps (a point
/// is its whole step's), from the source `prefer` names or the cheapest:
/// a rollup when the step is a whole number of a `[[rollup]]`'s interval
/// (the longest such; its settled intervals, the others from the
/// windows), the windows' summaries when it is a whole number of
/// `window_ms`, else the samples. At most [`MAX_POINTS`] steps and
/// [`MAX_READ`] documents or readings read: beyond, [`QueryError::TooMuch`]
/// saying what to change.
pub(crate) async fn series(
    store: &Store,
    window_ms: i64,
    sensor: &str,
    field: Option<&str>,
    range: (i64, i64),
    step_ms: i64,
    prefer: Prefer,
) -> Result<(SeriesSource, Vec<SeriesPoint>)> {
    let whole_windows = window_ms > 0 && step_ms % window_ms == 0;
    let rollup = match prefer {
        Prefer::Cheapest | Prefer::Rollup => store.rollup_for(step_ms),
        _ => None,
    };
    match prefer {
        Prefer::Rollup if rollup.is_none() => {
            return Err(QueryError::TooMuch(format!(
                "source=rollup: no [[rollup]] interval divides the step of {step_ms} ms"
            )))
        }
        Prefer::Windows if !whole_windows => {
            return Err(QueryError::TooMuch(format!(
                "source=windows: the step must be a whole number of bucket.window ({window_ms} ms)"
            )))
        }
        _ => {}
    }
    let windows = whole_windows && matches!(prefer, Prefer::Cheapest | Prefer::Windows);
    if step_ms < 1000 || range.1 <= range.0 {
        return Err(QueryError::TooMuch(
            "step must be at least 1s and from before to".into(),
        ));
    }
    let from = range.0.div_euclid(step_ms) * step_ms;
    let to = (range.1 - 1).div_euclid(step_ms) * step_ms + step_ms;
    let steps = ((to - from) as u64).div_ceil(step_ms as u64);
    if steps > MAX_POINTS as u64 {
        return Err(QueryError::TooMuch(format!(
            "{steps} steps of {step_ms} ms from {} to {}: at most {MAX_POINTS}; take a larger step or a shorter range",
            iso(from),
            iso(to)
        )));
    }
    let mut points = Points {
        step_ms,
        field,
        by_step: BTreeMap::new(),
    };
    let source = if let Some(spec) = rollup {
        let from_windows = from_rollup(store, spec, sensor, (from, to), &mut points).await?;
        SeriesSource::Rollup {
            name: spec.name.clone(),
            from_windows,
        }
    } else {
        let range = Range {
            from: Some(from),
            to: Some(to),
        };
        if windows {
            from_windows(store, sensor, range, &mut points).await?;
            SeriesSource::Windows
        } else {
            from_samples(store, sensor, range, window_ms, &mut points).await?;
            SeriesSource::Samples
        }
    };
    Ok((source, points.by_step.into_values().collect()))
}

/// A series' points as they are summed up, by step and field.
struct Points<'a> {
    step_ms: i64,
    /// The one field asked for, if any.
    field: Option<&'a str>,
    by_step: BTreeMap<(i64, String), SeriesPoint>,
}

impl Points<'_> {
    fn wanted(&self, name: &str) -> bool {
        self.field.is_none_or(|f| f == name)
    }

    /// Adds a summary `(sum, n, min, max)` of `name` at `start` to its step.
    fn add(&mut self, start: i64, name: &str, (sum, n, min, max): (f64, i64, f64, f64)) {
        if !self.wanted(name) {
            return;
        }
        let step = start.div_euclid(self.step_ms) * self.step_ms;
        let p = (self.by_step)
            .entry((step, name.to_string()))
            .or_insert_with(|| SeriesPoint {
                start_ms: step,
                field: name.to_string(),
                n: 0,
                sum: 0.0,
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
            });
        p.n += n;
        p.sum += sum;
        p.min = p.min.min(min);
        p.max = p.max.max(max);
    }
}

/// A series from a rollup's settled intervals, the others from the
/// windows' summaries in one read from the first to the last of them (the
/// open ones are the last); returns how many intervals were not settled.
async fn from_rollup(
    store: &Store,
    spec: &RollupSettings,
    sensor: &str,
    (from, to): (i64, i64),
    points: &mut Points<'_>,
) -> Result<u64> {
    let rows = store
        .settled_rollups(spec, sensor, (from, to), MAX_READ)
        .await
        .map_err(|e| too_much(e, "take a shorter range"))?;
    let interval = spec.interval_ms();
    let settled: std::collections::HashSet<i64> = rows.iter().map(|r| r.start_ms).collect();
    for r in &rows {
        for (name, f) in &r.fields {
            points.add(r.start_ms, name, (f[0], f[1] as i64, f[2], f[3]));
        }
    }
    let rest: Vec<i64> = (from..to)
        .step_by(interval as usize)
        .filter(|s| !settled.contains(s))
        .collect();
    if let (Some(first), Some(last)) = (rest.first(), rest.last()) {
        let within = Range {
            from: Some(*first),
            to: Some(last + interval),
        };
        let stats = store
            .window_stats_within(sensor, within, Some(MAX_READ))
            .await
            .map_err(|e| too_much(e, "take a shorter range"))?;
        for w in stats
            .iter()
            .filter(|w| !settled.contains(&spec.start_of(w.start_ms)))
        {
            for (name, f) in &w.fields {
                points.add(w.start_ms, name, *f);
            }
        }
    }
    Ok(rest.len() as u64)
}

/// A series from the windows' summaries.
async fn from_windows(
    store: &Store,
    sensor: &str,
    range: Range,
    points: &mut Points<'_>,
) -> Result<()> {
    let stats = store
        .window_stats_within(sensor, range, Some(MAX_READ))
        .await
        .map_err(|e| too_much(e, "take a shorter range"))?;
    for w in &stats {
        for (name, f) in &w.fields {
            points.add(w.start_ms, name, *f);
        }
    }
    Ok(())
}

/// A series from the samples, at most [`MAX_READ`] of them.
async fn from_samples(
    store: &Store,
    sensor: &str,
    range: Range,
    window_ms: i64,
    points: &mut Points<'_>,
) -> Result<()> {
    let mut read = 0u64;
    store
        .readings(sensor, range, |ts, fields| {
            read += 1;
            if read > MAX_READ {
                return Err(std::io::Error::other(OVER_READ));
            }
            for (name, v) in &fields {
                if let Bson::Double(x) = v {
                    points.add(ts, name, (*x, 1, *x, *x));
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| match e {
            QueryError::Io(e) if e.to_string() == OVER_READ => QueryError::TooMuch(format!(
                "more than {MAX_READ} readings in the range; take a shorter range, or a step of a whole number of bucket.window ({window_ms} ms), read from the windows' summaries"
            )),
            e => e,
        })?;
    Ok(())
}

/// Says what to change when a bounded read would read too much.
fn too_much(e: QueryError, advice: &str) -> QueryError {
    match e {
        QueryError::TooMuch(what) => QueryError::TooMuch(format!("{what}; {advice}")),
        e => e,
    }
}

const OVER_READ: &str = "series: read bound reached";
