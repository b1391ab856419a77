//! `<collection>_latest` (`[latest] enabled`, on by default): one document
//! per sensor with its newest sample, the first question of a dashboard
//! ("what does each sensor read now?") answered by a point read, and live
//! by a change stream on this collection (MongoDB's time series
//! collections cannot give one). In both storage modes.
//!
//! ```text
//! { _id: <sensor id>, ts: <Date of its newest sample>,
//!   sample: <that sample as stored: ts and every field>, updatedAt: <Date> }
//! ```
//!
//! - **Written with every flush**, one statement per sensor of the flush
//!   (its newest sample in the flush), in one unordered `update` command
//!   sent right before the flush's own (an `update` command names one
//!   collection; the client `bulkWrite` that spans collections needs
//!   MongoDB 8.0). Before, not after: a flush whose reply is lost, or a
//!   crash right after it, is resolved on the next try without being
//!   written again, so the value must already be there; a sample the
//!   database then refuses for good (rare: it goes to the dead letter) may
//!   be the latest value meanwhile.
//! - **Only ever forward in time**: each statement is a pipeline update
//!   that replaces `ts`, `sample` and `updatedAt` only when its sample is
//!   newer than the stored `ts`, so late data, a backlog drained after live
//!   readings and a replay after a crash never move it back, and sending it
//!   twice changes nothing.
//! - **Bounded**: a flush takes at most `MAX_SENSORS_PER_FLUSH` sensors, so
//!   the command holds at most that many statements; the collection holds
//!   one small document per sensor, indexed on `ts` (the status page's
//!   quietest sensors).

use bson::{doc, rawdoc, Document, RawBson, RawDocumentBuf};
use mongodb::{Database, IndexModel};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::mongo::Mongo;
use super::statements::{Ids, Lost, Unordered};
use crate::bucket::SampleRef;
use crate::handoff::Batch;
use crate::retry::Aborted;

/// The latest-value collection.
pub(crate) struct Latest {
    collection: String,
}

impl Latest {
    pub fn new(collection: String) -> Latest {
        Latest { collection }
    }

    pub(crate) fn collection(&self) -> &str {
        &self.collection
    }

    /// The `{ts: 1}` index (the quietest sensors first).
    pub(crate) async fn schema(&self, db: &Database) -> mongodb::error::Result<()> {
        db.collection::<Document>(&self.collection)
            .create_index(IndexModel::builder().keys(doc! { "ts": 1 }).build())
            .await?;
        Ok(())
    }

    /// Writes the newest sample of each sensor of `batch`, retried until
    /// the database answers (idempotent). A statement the database refuses
    /// is logged and left: the next flush of that sensor tries again.
    pub(crate) async fn write(
        &self,
        mongo: &mut Mongo,
        batch: &Batch,
        abort: &CancellationToken,
    ) -> Result<(), Aborted> {
        let statements: Vec<RawDocumentBuf> = batch
            .runs
            .iter()
            .filter_map(|r| newest(r.samples.iter()).map(|s| statement(&r.sensor, s)))
            .collect();
        let w = Unordered {
            what: "write latest values",
            command: "update",
            collection: &self.collection,
            field: "updates",
            ids: Ids::Upserted,
            lost: Lost::Resend,
        };
        let refused = mongo
            .send_unordered(w, statements.len(), |i| statements[i].clone(), abort)
            .await?
            .refused;
        if let Some(first) = refused.first() {
            warn!(
                statements = refused.len(),
                code = first.code,
                error = %first.msg,
                "The database refused latest-value statements; the next flush of those sensors tries again."
            );
        }
        Ok(())
    }
}

/// Each sensor's latest value (or `sensor`'s only), by sensor id, streamed
/// to `emit(sensor, ts_ms, sample, updated_ms)`.
pub(crate) async fn read(
    db: &Database,
    collection: &str,
    sensor: Option<&str>,
    limit: Option<u64>,
    mut emit: impl FnMut(&str, i64, &Document, i64) -> std::io::Result<()>,
) -> super::read::Result<u64> {
    use futures_util::TryStreamExt;
    let filter = sensor.map_or_else(Document::new, |s| doc! { "_id": s });
    let coll = db.collection::<Document>(collection);
    let mut find = coll.find(filter).sort(doc! { "_id": 1 });
    if let Some(limit) = limit {
        find = find.limit(limit as i64);
    }
    let mut cursor = find.await?;
    let mut n = 0;
    while let Some(d) = cursor.try_next().await? {
        let id = d.get_str("_id")?;
        let ts = d.get_datetime("ts")?.timestamp_millis();
        let updated = d.get_datetime("updatedAt")?.timestamp_millis();
        emit(id, ts, d.get_document("sample")?, updated)?;
        n += 1;
    }
    Ok(n)
}

/// The first `limit` sensor ids by id (the index on `_id`, nothing else
/// read).
pub(crate) async fn ids(
    db: &Database,
    collection: &str,
    limit: u64,
) -> super::read::Result<Vec<String>> {
    use futures_util::TryStreamExt;
    let mut cursor = db
        .collection::<Document>(collection)
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .projection(doc! { "_id": 1 })
        .limit(limit as i64)
        .await?;
    let mut out = Vec::new();
    while let Some(d) = cursor.try_next().await? {
        out.push(d.get_str("_id")?.to_string());
    }
    Ok(out)
}

/// The newest of a sensor's readings (the last one of equal times; not a
/// point thinning stored late nor readings it left out summed up,
/// [`SampleRef::is_reading`]).
fn newest<'a>(samples: impl Iterator<Item = SampleRef<'a>>) -> Option<SampleRef<'a>> {
    let readings = samples.filter(|s| s.is_reading());
    readings.fold(None, |best: Option<SampleRef<'a>>, s| match best {
        Some(b) if b.ts_ms > s.ts_ms => Some(b),
        _ => Some(s),
    })
}

/// The `n` sensors quiet the longest: the oldest `ts` first, on its index
/// (for the status page), as (sensor id, ms).
pub(crate) async fn quietest(
    latest: &mongodb::Collection<bson::Document>,
    n: i64,
) -> mongodb::error::Result<Vec<(String, i64)>> {
    use futures_util::TryStreamExt;
    let docs: Vec<bson::Document> = latest
        .find(bson::doc! {})
        .sort(bson::doc! { "ts": 1 })
        .projection(bson::doc! { "ts": 1 })
        .limit(n)
        .await?
        .try_collect()
        .await?;
    Ok(docs
        .iter()
        .filter_map(|d| {
            let ts = d.get_datetime("ts").ok()?.timestamp_millis();
            Some((d.get_str("_id").ok()?.to_string(), ts))
        })
        .collect())
}

/// How often the quietest sensors are read from `<collection>_latest`.
const QUIET_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads the sensors quiet the longest from `<collection>_latest` (the
/// oldest `ts` first, on its index) for the status page, every
/// [`QUIET_EVERY`]; a read that fails or takes over 2 s leaves the last.
pub(crate) async fn watch_quietest(
    latest: Option<mongodb::Collection<bson::Document>>,
    health: &crate::telemetry::Health,
) {
    let Some(latest) = latest else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(QUIET_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let read = quietest(&latest, 10);
        if let Ok(Ok(quiet)) = tokio::time::timeout(std::time::Duration::from_secs(2), read).await {
            health.set_quiet(quiet);
        }
    }
}

/// The upsert of `sensor`'s latest value with `sample`, applied only when
/// it is newer than the stored one (`$gt` of a date over a missing `ts` is
/// true: BSON orders dates after null). Public for the benchmark's
/// account of bytes on the wire.
pub fn statement(sensor: &str, sample: SampleRef<'_>) -> RawDocumentBuf {
    let ts = bson::DateTime::from_millis(sample.ts_ms);
    // Built as raw BSON: no owned copy of the sample, no document tree.
    let pick = |new: RawBson, old: &str| {
        rawdoc! { "$cond": [{ "$gt": [ts, { "$ifNull": ["$ts", null] }] }, new, old] }
    };
    let u = rawdoc! { "$set": {
        "ts": pick(ts.into(), "$ts"),
        // $literal: a stored string that starts with '$' stays a string.
        "sample": pick(rawdoc! { "$literal": sample.whole() }.into(), "$sample"),
        "updatedAt": pick(RawBson::String("$$NOW".into()), "$updatedAt"),
    } };
    rawdoc! { "q": { "_id": sensor }, "u": [u], "upsert": true }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{Sample, Samples};
    use crate::decode::{FieldValue, Reading};

    fn samples(ts: &[i64]) -> Samples {
        let mut out = Samples::new();
        for (i, &t) in ts.iter().enumerate() {
            let r = Reading {
                ts_ms: t,
                fields: vec![("v".into(), FieldValue::Num(i as f64))],
                ..Reading::default()
            };
            let s = Sample::encode(&r, 10 + i as u64);
            out.push(SampleRef {
                ts_ms: s.ts_ms,
                lsn: s.lsn,
                doc: &s.doc,
            });
        }
        out
    }

    #[test]
    fn the_newest_sample_is_the_latest_time_and_the_last_of_equal_ones() {
        let s = samples(&[5, 9, 2, 9, 1]);
        let n = newest(s.iter()).unwrap();
        assert_eq!((n.ts_ms, n.lsn), (9, 13));
        assert!(newest(Samples::new().iter()).is_none());
    }

    #[test]
    fn the_statement_replaces_the_value_only_with_a_newer_sample() {
        let s = samples(&[1_000]);
        let st = bson::Document::try_from(statement("s1", s.get(0)).as_ref()).unwrap();
        assert_eq!(st.get_document("q").unwrap(), &doc! { "_id": "s1" });
        assert_eq!(st.get_bool("upsert"), Ok(true));
        let set = st.get_array("u").unwrap()[0]
            .as_document()
            .unwrap()
            .get_document("$set")
            .unwrap();
        let ts = bson::DateTime::from_millis(1_000);
        let newer = doc! { "$gt": [ts, { "$ifNull": ["$ts", null] }] };
        assert_eq!(
            set.get_document("ts").unwrap(),
            &doc! { "$cond": [newer.clone(), ts, "$ts"] }
        );
        let sample = set.get_document("sample").unwrap();
        assert_eq!(
            sample,
            &doc! { "$cond": [newer, { "$literal": { "ts": ts, "v": 0.0 } }, "$sample"] }
        );
    }
}
