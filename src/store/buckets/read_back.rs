//! Reading buckets back for `palletd query` and the series API.

use super::*;
use std::io::Write;

use bson::{doc, Bson, Document};
use futures_util::TryStreamExt;
use mongodb::Database;

use super::read::{self, Fields, QueryError, Range, Summary, WindowStats};

impl Buckets {
    /// One sensor's readings in time order, window by window: all buckets
    /// of a window (full ones, late ones after sealing) merged.
    pub(in crate::store) async fn readings(
        &self,
        db: &Database,
        sensor: &str,
        range: Range,
        mut emit: impl FnMut(i64, Fields) -> std::io::Result<()>,
    ) -> read::Result<u64> {
        let mut cursor = self
            .coll(db)
            .find(self.bucket_filter(sensor, range))
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
                if range.contains(ts) {
                    rows.push((ts, read::fields(s, &[])));
                    n += 1;
                }
            }
        }
        flush(&mut rows)?;
        Ok(n)
    }

    /// Per-window rollups from the buckets' rollup fields (no samples
    /// read); at most `max` buckets ([`read::within`]).
    pub(in crate::store) async fn window_stats(
        &self,
        db: &Database,
        sensor: &str,
        range: Range,
        max: Option<u64>,
    ) -> read::Result<Vec<WindowStats>> {
        let coll = self.coll(db);
        let mut find = coll
            .find(self.bucket_filter(sensor, range))
            .sort(doc! { "startTs": 1 })
            .projection(doc! { "samples": 0 });
        if let Some(max) = max {
            find = find.limit(max as i64 + 1);
        }
        let mut cursor = find.await?;
        let mut out: Vec<WindowStats> = Vec::new();
        let mut n = 0;
        while let Some(b) = cursor.try_next().await? {
            n += 1;
            read::within(n, max)?;
            let start = b.get_datetime("startTs")?.timestamp_millis();
            if out.last().map(|w| w.start_ms) != Some(start) {
                out.push(WindowStats::new(start));
            }
            let Some(w) = out.last_mut() else { continue };
            w.buckets += 1;
            w.add_summaries(&b);
        }
        Ok(out)
    }

    pub(in crate::store) async fn summary(&self, db: &Database) -> read::Result<Summary> {
        let mut agg = self
            .coll(db)
            .aggregate(vec![doc! { "$group": {
                "_id": null,
                "buckets": { "$sum": 1 },
                "sealed": { "$sum": { "$cond": ["$closed", 1, 0] } },
                "samples": { "$sum": "$count" },
                "sensors": { "$addToSet": "$sensorId" },
            } }])
            .await?;
        let row = agg.try_next().await?.unwrap_or_default();
        let n = |k: &str| read::number(row.get(k)).unwrap_or(0.0) as u64;
        Ok(Summary {
            buckets: Some((n("buckets"), n("sealed"))),
            samples: n("samples"),
            sensors: row.get_array("sensors").map_or(0, |a| a.len()) as u64,
            dead_letters: 0,
        })
    }

    /// Up to `limit` bucket documents as relaxed extended JSON, newest
    /// first, with at most 3 samples each.
    pub(in crate::store) async fn print_raw(
        &self,
        db: &Database,
        sensor: Option<&str>,
        limit: i64,
        out: &mut dyn Write,
    ) -> read::Result<()> {
        let f = sensor.map_or_else(Document::new, |s| doc! { "sensorId": s });
        let mut cursor = self
            .coll(db)
            .find(f)
            .sort(doc! { "startTs": -1 })
            .limit(limit)
            .projection(doc! { "samples": { "$slice": 3 } })
            .await?;
        while let Some(b) = cursor.try_next().await? {
            let json = Bson::Document(b).into_relaxed_extjson();
            let text = serde_json::to_string_pretty(&json)
                .map_err(|e| QueryError::Io(std::io::Error::other(e)))?;
            writeln!(out, "{text}")?;
        }
        Ok(())
    }

    /// The buckets that may hold samples in `range`: a bucket starting less
    /// than a window before `from` may hold samples after it.
    pub(super) fn bucket_filter(&self, sensor: &str, range: Range) -> Document {
        let starts = Range {
            from: range.from.map(|f| f - self.shape.window_ms + 1),
            to: range.to,
        };
        read::filter(sensor, "startTs", starts)
    }
}
