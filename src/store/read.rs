//! What every storage mode's reader produces for `palletd query`: one
//! sensor's readings in time order, per-window rollups, and a summary; the
//! types and the small helpers they share.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("database: {0}")]
    Database(#[from] mongodb::error::Error),
    #[error("unexpected document shape: {0}")]
    Shape(#[from] bson::document::ValueAccessError),
    #[error("output: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Unsupported(String),
    /// A bounded read would have read more than its bound.
    #[error("{0}")]
    TooMuch(String),
}

pub(crate) type Result<T> = std::result::Result<T, QueryError>;

/// A time range `[from, to)` in ms since the epoch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Range {
    pub from: Option<i64>,
    pub to: Option<i64>,
}

impl Range {
    pub(crate) fn contains(&self, ts: i64) -> bool {
        self.from.is_none_or(|f| ts >= f) && self.to.is_none_or(|t| ts < t)
    }
}

/// A reading's fields other than `ts`, in stored order.
pub(crate) type Fields = Vec<(String, Bson)>;

/// Per-window rollups of one sensor, merged across the window's buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowStats {
    pub start_ms: i64,
    pub buckets: u32,
    pub count: i64,
    /// field -> (sum, n, min, max)
    pub fields: BTreeMap<String, (f64, i64, f64, f64)>,
}

impl WindowStats {
    pub fn new(start_ms: i64) -> WindowStats {
        WindowStats {
            start_ms,
            buckets: 0,
            count: 0,
            fields: BTreeMap::new(),
        }
    }

    /// Adds one numeric value of `field`.
    pub fn add(&mut self, field: &str, x: f64) {
        self.merge(field, x, 1, x, x);
    }

    /// Adds a bucket's summaries, or those of readings thinning left out
    /// in time series mode (shaped alike, see [`crate::bucket`]): the
    /// readings they represent ([`readings`]) and per field `sum`, `n`,
    /// `min`, `max`.
    pub(crate) fn add_summaries(&mut self, b: &Document) {
        self.count += readings(b);
        let empty = Document::new();
        let part = |name: &str| b.get_document(name).unwrap_or(&empty);
        let (sum, n, min, max) = (part("sum"), part("n"), part("min"), part("max"));
        for (field, s) in sum {
            self.merge(
                field,
                number(Some(s)).unwrap_or(0.0),
                number(n.get(field)).unwrap_or(0.0) as i64,
                number(min.get(field)).unwrap_or(f64::INFINITY),
                number(max.get(field)).unwrap_or(f64::NEG_INFINITY),
            );
        }
    }

    /// Adds a partial rollup of `field`.
    pub(crate) fn merge(&mut self, field: &str, sum: f64, n: i64, min: f64, max: f64) {
        let e = match self.fields.get_mut(field) {
            Some(e) => e,
            None => self.fields.entry(field.to_string()).or_insert((
                0.0,
                0,
                f64::INFINITY,
                f64::NEG_INFINITY,
            )),
        };
        e.0 += sum;
        e.1 += n;
        e.2 = e.2.min(min);
        e.3 = e.3.max(max);
    }
}

/// How much is stored, for `palletd query --summary`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Bucket documents (none in time series mode).
    pub buckets: Option<(u64, u64)>,
    pub samples: u64,
    pub sensors: u64,
    pub dead_letters: u64,
}

/// `{sensorId, <field>: {$gte: from, $lt: to}}` (either bound may be open).
pub(crate) fn filter(sensor: &str, field: &str, range: Range) -> Document {
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

/// A reading's fields other than `ts` (and those in `skip`).
pub(crate) fn fields(reading: &Document, skip: &[&str]) -> Fields {
    reading
        .iter()
        .filter(|(k, _)| k.as_str() != "ts" && !skip.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `n` documents read so far, at most `max`: else [`QueryError::TooMuch`]
/// (a bounded cursor asks for one more than `max`, to tell).
pub(crate) fn within(n: u64, max: Option<u64>) -> Result<()> {
    match max {
        Some(max) if n > max => Err(QueryError::TooMuch(format!(
            "more than {max} stored documents in the range"
        ))),
        _ => Ok(()),
    }
}

/// The readings a bucket represents: its samples, and those thinning
/// left out of them (`thinned`, see [`crate::bucket`]).
pub(crate) fn readings(bucket: &bson::Document) -> i64 {
    let n = |k: &str| number(bucket.get(k)).unwrap_or(0.0) as i64;
    n("count") + n("thinned")
}

/// A number stored as double, int32 or int64.
pub(crate) fn number(b: Option<&Bson>) -> Option<f64> {
    match b? {
        Bson::Double(x) => Some(*x),
        Bson::Int32(x) => Some(*x as f64),
        Bson::Int64(x) => Some(*x as f64),
        _ => None,
    }
}
