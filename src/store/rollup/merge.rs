//! The merge arithmetic of rollups, sans-IO: one key's rollup (count, and
//! per numeric field sum, n, min, max, first and last) merged from
//! buckets' summaries, samples' edges or the time series aggregation's
//! rows, and the document it is written as.

use std::collections::BTreeMap;

use bson::{doc, Bson, Document};

use crate::store::read;

/// One numeric field's rollup being merged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct FieldRollup {
    pub(super) sum: f64,
    pub(super) n: i64,
    pub(super) min: f64,
    pub(super) max: f64,
    /// (ts ms, value): first by time, ties by the smallest value.
    pub(super) first: Option<(i64, f64)>,
    /// (ts ms, value): last by time, ties by the largest value.
    pub(super) last: Option<(i64, f64)>,
}

impl Default for FieldRollup {
    fn default() -> FieldRollup {
        FieldRollup {
            sum: 0.0,
            n: 0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            first: None,
            last: None,
        }
    }
}

impl FieldRollup {
    pub(super) fn edges(&mut self, first: Option<(i64, f64)>, last: Option<(i64, f64)>) {
        if let Some(f) = first {
            if self.first.is_none_or(|x| f < x) {
                self.first = Some(f);
            }
        }
        if let Some(l) = last {
            if self.last.is_none_or(|x| l > x) {
                self.last = Some(l);
            }
        }
    }
}

/// One key's rollup being merged from buckets (or readings).
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Rollup {
    pub(super) count: i64,
    pub(super) fields: BTreeMap<String, FieldRollup>,
}

/// `{t: Date, v: number}` as (ts ms, value).
fn edge_of(b: Option<&Bson>) -> Option<(i64, f64)> {
    let d = b?.as_document()?;
    Some((
        d.get_datetime("t").ok()?.timestamp_millis(),
        read::number(d.get("v"))?,
    ))
}

impl Rollup {
    /// Adds a bucket's summaries (or those of readings thinning left out
    /// in time series mode, shaped alike); `false` if it has no `first`
    /// and `last` (then [`Rollup::add_edges_of_samples`] must add its
    /// samples').
    pub(super) fn add_bucket(&mut self, b: &Document) -> bool {
        self.count += read::readings(b);
        let empty = Document::new();
        let part = |p: &str| b.get_document(p).unwrap_or(&empty);
        let (first, last) = (part("first"), part("last"));
        let mut edges = true;
        for (field, n) in part("n") {
            let f = self.fields.entry(field.clone()).or_default();
            f.n += read::number(Some(n)).unwrap_or(0.0) as i64;
            f.sum += read::number(part("sum").get(field)).unwrap_or(0.0);
            if let Some(x) = read::number(part("min").get(field)) {
                f.min = f.min.min(x);
            }
            if let Some(x) = read::number(part("max").get(field)) {
                f.max = f.max.max(x);
            }
            let (a, z) = (edge_of(first.get(field)), edge_of(last.get(field)));
            edges &= a.is_some() && z.is_some();
            f.edges(a, z);
        }
        edges
    }

    /// Adds the first and last readings of samples `{ts, <field>...}` (of a
    /// bucket whose other summaries were added).
    pub(super) fn add_edges_of_samples(&mut self, samples: &[Bson]) {
        for s in samples.iter().filter_map(Bson::as_document) {
            let Ok(ts) = s.get_datetime("ts") else {
                continue;
            };
            for (field, v) in s {
                if let (Bson::Double(x), Some(f)) = (v, self.fields.get_mut(field)) {
                    let e = Some((ts.timestamp_millis(), *x));
                    f.edges(e, e);
                }
            }
        }
    }

    /// Adds a field's rollup as the time series aggregation returns it.
    pub(super) fn add_field(&mut self, field: &str, row: &Document) {
        let f = self.fields.entry(field.to_string()).or_default();
        f.sum += read::number(row.get("sum")).unwrap_or(0.0);
        f.n += read::number(row.get("n")).unwrap_or(0.0) as i64;
        if let Some(x) = read::number(row.get("min")) {
            f.min = f.min.min(x);
        }
        if let Some(x) = read::number(row.get("max")) {
            f.max = f.max.max(x);
        }
        f.edges(edge_of(row.get("first")), edge_of(row.get("last")));
    }

    pub(super) fn to_doc(
        &self,
        sensor: &str,
        start: i64,
        interval_ms: i64,
        now_ms: i64,
        partial: bool,
    ) -> Document {
        let mut d = doc! {
            "sensorId": sensor,
            "start": bson::DateTime::from_millis(start),
            "end": bson::DateTime::from_millis(start + interval_ms),
            "count": self.count,
        };
        let mut parts: [Document; 7] = Default::default();
        for (field, f) in &self.fields {
            let avg = if f.n > 0 { f.sum / f.n as f64 } else { 0.0 };
            let value = |e: Option<(i64, f64)>| e.map_or(Bson::Null, |e| Bson::Double(e.1));
            let values = [
                Bson::Double(f.sum),
                Bson::Int64(f.n),
                Bson::Double(f.min),
                Bson::Double(f.max),
                Bson::Double(avg),
                value(f.first),
                value(f.last),
            ];
            for (p, v) in parts.iter_mut().zip(values) {
                p.insert(field, v);
            }
        }
        for (name, p) in ["sum", "n", "min", "max", "avg", "first", "last"]
            .into_iter()
            .zip(parts)
        {
            d.insert(name, p);
        }
        d.insert("computedAt", bson::DateTime::from_millis(now_ms));
        d.insert("partial", partial);
        d
    }
}
