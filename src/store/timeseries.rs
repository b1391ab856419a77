//! `storage.mode = "timeseries"`: a MongoDB native time series collection,
//! one document per reading, `{ts, sensorId, lsn, _spool, <fields>}`
//! (`_spool`: the id of the spool the reading came through, `s<8 hex>`,
//! as in bucket mode's `lsns.s<id>`); the server builds, compresses and
//! expires its own buckets.
//!
//! - **Schema**: the collection is created if missing (`timeField: "ts"`,
//!   `metaField: "sensorId"`, the configured granularity, `expireAfterSeconds`
//!   from `retention.expire_after`); one of another shape is refused (the
//!   readings wait in the spool); a changed retention is applied with
//!   `collMod`; a changed granularity is logged (MongoDB keeps the first).
//! - **Write**: one unordered `insert` per flush (split only at the
//!   server's limits); a document refused with a transient code is sent
//!   again, one refused for good is dead-lettered.
//! - **What a replay already applied**: an unordered insert may apply any
//!   subset, so there is no prefix rule: the uncertain LSNs themselves are
//!   looked up (bounded by sensor, LSN range and time), each with its
//!   spool's id: LSNs come from each box's clock, so another box writing
//!   the same sensor id may hold the same LSN (a document without
//!   `_spool`, from a version before it, matches any).
//! - **Thinning** ([`crate::thin`]): a reading thinning left nothing of
//!   has no document; the values left out are summed up per sensor and
//!   window in documents of their own, `{ts, sensorId, lsn, _spool,
//!   _leftOut: {count, sum, n, min, max, first, last, thinning}}`
//!   ([`crate::bucket::LEFT_OUT`]: `count` readings without a document,
//!   the rest per field as a bucket has them), spooled by the admission,
//!   so a replay finds them by their LSN as any document; a point stored
//!   late is a document marked `_archive: true`, no reading of its own.
//!   Rollups and `palletd query` count the readings' documents and add
//!   the summaries.
//! - **Seal**: nothing to do; the server manages its buckets.
//! - **Read**: readings in `ts` order on `{sensorId, ts}`; per-window
//!   rollups computed from them (windows of `bucket.window`).

use std::collections::HashSet;
use std::time::Duration;

use bson::{doc, Document, RawDocumentBuf};
use futures_util::TryStreamExt;
use mongodb::options::ReadConcern;
use mongodb::{Collection, Database, IndexModel};
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::mongo::{self, rejection, Mongo};
use super::read::{self, Fields, Range, Summary, WindowStats};
use super::statements::{Ids, Lost, Unordered};
use super::SchemaError;
use crate::bucket::{SampleRef, ARCHIVE, LEFT_OUT};
use crate::config::Settings;
use crate::handoff::{Batch, Outcome, Resolution, Resolve, Written};
use crate::retry::Aborted;
use crate::spool_ids::Tags;

/// The time series collection.
pub(crate) struct Timeseries {
    pub(super) collection: String,
    granularity: &'static str,
    expire_after: Option<Duration>,
    window_ms: i64,
    /// How far a reading's `ts` may lie before its receipt (lateness plus
    /// future, and an hour for clock steps): bounds the LSN lookups.
    margin_ms: i64,
    /// The spool's ids, by LSN.
    tags: Tags,
}

impl Timeseries {
    pub fn new(settings: &Settings) -> Timeseries {
        let b = &settings.bucket;
        Timeseries {
            collection: settings.mongodb.collection.clone(),
            granularity: settings.storage.granularity,
            expire_after: settings.retention.expire_after,
            window_ms: b.window.as_millis() as i64,
            margin_ms: (b.max_lateness + b.max_future).as_millis() as i64 + 3_600_000,
            tags: Tags::new(0),
        }
    }

    /// The spool whose readings this writes and looks up.
    pub(crate) fn set_spool(&mut self, tags: Tags) {
        self.tags = tags;
    }

    fn coll(&self, db: &Database) -> Collection<Document> {
        db.collection(&self.collection)
    }

    /// Creates the time series collection if it is missing, refuses a
    /// collection of another shape, and follows a changed retention.
    pub(super) async fn schema(&self, db: &Database) -> Result<(), SchemaError> {
        let name = &self.collection;
        let want_ttl = self.expire_after;
        let info = match collection_info(db, name).await? {
            Some(info) => info,
            None => {
                let mut create = doc! {
                    "create": name,
                    "timeseries": {
                        "timeField": "ts",
                        "metaField": "sensorId",
                        "granularity": self.granularity,
                    },
                };
                if let Some(ttl) = want_ttl {
                    create.insert("expireAfterSeconds", ttl.as_secs() as i64);
                }
                match db.run_command(create).await {
                    Ok(_) => info!(
                        collection = %name,
                        granularity = self.granularity,
                        "Time series collection created."
                    ),
                    // 48 NamespaceExists: created meanwhile; checked below.
                    Err(e) if matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 48) =>
                        {}
                    Err(e) => return Err(e.into()),
                }
                collection_info(db, name).await?.unwrap_or_default()
            }
        };
        let options = info.get_document("options").cloned().unwrap_or_default();
        let ts = options.get_document("timeseries").ok();
        let fields = ts.map(|t| (t.get_str("timeField").ok(), t.get_str("metaField").ok()));
        if info.get_str("type").ok() != Some("timeseries")
            || fields != Some((Some("ts"), Some("sensorId")))
        {
            return Err(SchemaError::Mismatch(format!(
                "collection {name:?} exists but is not a time series collection with timeField \"ts\" and \
                 metaField \"sensorId\"; storage.mode = \"timeseries\" needs another mongodb.collection \
                 (or drop this one)"
            )));
        }
        if let Some(g) = ts.and_then(|t| t.get_str("granularity").ok()) {
            if g != self.granularity {
                tracing::warn!(
                    collection = %name,
                    have = g,
                    configured = self.granularity,
                    "The time series collection keeps the granularity it was created with."
                );
            }
        }
        let have_ttl = options
            .get("expireAfterSeconds")
            .and_then(mongo::as_u64)
            .map(Duration::from_secs);
        if have_ttl != want_ttl {
            let value = want_ttl.map_or(bson::Bson::from("off"), |t| {
                bson::Bson::Int64(t.as_secs() as i64)
            });
            db.run_command(doc! { "collMod": name, "expireAfterSeconds": value })
                .await?;
            info!(collection = %name, expire_after = ?want_ttl, "Retention changed.");
        }
        // MongoDB 6.3+ creates this index itself; 5.0 does not.
        self.coll(db)
            .create_index(
                IndexModel::builder()
                    .keys(doc! { "sensorId": 1, "ts": 1 })
                    .build(),
            )
            .await?;
        Ok(())
    }

    /// Looks the uncertain LSNs up: any subset of an insert may be applied.
    pub(super) async fn resolve(
        &self,
        mongo: &mut Mongo,
        req: &[Resolve],
        abort: &CancellationToken,
    ) -> Result<Resolution, Aborted> {
        let coll = self.collection.clone();
        let margin_ms = self.margin_ms;
        let tags = &self.tags;
        let applied = mongo
            .read_retrying("read stored LSNs", abort, |db, concern| {
                present_lsns(db.collection(&coll), concern, req, tags, margin_ms)
            })
            .await?;
        Ok(Resolution {
            applied,
            ..Resolution::default()
        })
    }

    /// Inserts the batch's readings, unordered, in as few commands as the
    /// server's limits allow; sets every sample's outcome.
    pub(super) async fn write(
        &self,
        mongo: &mut Mongo,
        batch: &mut Batch,
        abort: &CancellationToken,
    ) -> Result<Written, Aborted> {
        let mut written = Written::default();
        for run in batch.runs.iter_mut() {
            run.outcomes = vec![Outcome::NotSent; run.samples.len()];
        }
        // (run, sample) of every reading still to send.
        // A reading thinning left nothing of is applied with nothing to
        // send: what it adds to the rollups is in a summary of its own.
        let mut todo: Vec<(usize, usize)> = Vec::new();
        for (r, run) in batch.runs.iter_mut().enumerate() {
            for s in 0..run.samples.len() {
                match run.samples.get(s).pushes() {
                    true => todo.push((r, s)),
                    false => run.outcomes[s] = Outcome::Applied,
                }
            }
        }
        let w = Unordered {
            what: "write readings",
            command: "insert",
            collection: &self.collection,
            field: "documents",
            // Inserts carry no `_id` of palletd's: a duplicate key is an
            // index of the operator's, refusing it for good.
            ids: Ids::Server,
            // Any subset of the insert may be in MongoDB.
            lost: Lost::HandBack,
        };
        let runs = &batch.runs;
        let sent = mongo
            .send_unordered(
                w,
                todo.len(),
                |i| {
                    let (r, s) = todo[i];
                    let sample = runs[r].samples.get(s);
                    reading_doc(&runs[r].sensor, sample, self.tags.of(sample.lsn))
                },
                abort,
            )
            .await?;
        for &(r, s) in &todo {
            batch.runs[r].outcomes[s] = Outcome::Applied;
        }
        for e in &sent.refused {
            let (r, s) = todo[e.index];
            batch.runs[r].outcomes[s] = Outcome::Rejected(rejection(e.code, &e.msg));
        }
        for &i in &sent.unknown {
            let (r, s) = todo[i];
            batch.runs[r].outcomes[s] = Outcome::Unknown;
        }
        for &i in &sent.unsent {
            let (r, s) = todo[i];
            batch.runs[r].outcomes[s] = Outcome::NotSent;
        }
        written.statements =
            todo.len() - sent.refused.len() - sent.unknown.len() - sent.unsent.len();
        Ok(written)
    }

    /// One sensor's readings in `ts` order.
    pub(super) async fn readings(
        &self,
        db: &Database,
        sensor: &str,
        range: Range,
        mut emit: impl FnMut(i64, Fields) -> std::io::Result<()>,
    ) -> read::Result<u64> {
        let mut cursor = self
            .coll(db)
            .find(read::filter(sensor, "ts", range))
            .sort(doc! { "ts": 1 })
            .projection(doc! { "_id": 0 })
            .await?;
        let mut n = 0;
        while let Some(d) = cursor.try_next().await? {
            if d.contains_key(LEFT_OUT) {
                continue;
            }
            let ts = d.get_datetime("ts")?.timestamp_millis();
            emit(ts, read::fields(&d, OWN_FIELDS))?;
            n += 1;
        }
        Ok(n)
    }

    /// Per-window rollups computed from the readings' documents and the
    /// summaries of those thinning left out (points stored late are
    /// neither).
    /// At most `max` documents ([`read::within`]).
    pub(super) async fn window_stats(
        &self,
        db: &Database,
        sensor: &str,
        range: Range,
        max: Option<u64>,
    ) -> read::Result<Vec<WindowStats>> {
        let mut out: Vec<WindowStats> = Vec::new();
        let window_ms = self.window_ms;
        let coll = self.coll(db);
        let mut find = coll
            .find(read::filter(sensor, "ts", range))
            .sort(doc! { "ts": 1 })
            .projection(doc! { "_id": 0, "sensorId": 0, "lsn": 0, SPOOL: 0 });
        if let Some(max) = max {
            find = find.limit(max as i64 + 1);
        }
        let mut cursor = find.await?;
        let mut n = 0;
        while let Some(d) = cursor.try_next().await? {
            n += 1;
            read::within(n, max)?;
            if d.get_bool(ARCHIVE).unwrap_or(false) {
                continue;
            }
            let start = d
                .get_datetime("ts")?
                .timestamp_millis()
                .div_euclid(window_ms)
                * window_ms;
            if out.last().map(|w| w.start_ms) != Some(start) {
                out.push(WindowStats::new(start));
            }
            let Some(w) = out.last_mut() else { continue };
            if let Ok(left) = d.get_document(LEFT_OUT) {
                w.add_summaries(left);
                continue;
            }
            w.count += 1;
            for (k, v) in &d {
                if let bson::Bson::Double(x) = v {
                    w.add(k, *x);
                }
            }
        }
        Ok(out)
    }

    pub(super) async fn summary(&self, db: &Database) -> read::Result<Summary> {
        // Stored points: not the summaries of readings left out.
        let left_out = format!("${LEFT_OUT}");
        let mut agg = self
            .coll(db)
            .aggregate(vec![doc! { "$group": {
                "_id": null,
                "samples": { "$sum": { "$cond": [{ "$eq": [{ "$type": left_out }, "missing"] }, 1, 0] } },
                "sensors": { "$addToSet": "$sensorId" },
            } }])
            .await?;
        let row = agg.try_next().await?.unwrap_or_default();
        Ok(Summary {
            buckets: None,
            samples: read::number(row.get("samples")).unwrap_or(0.0) as u64,
            sensors: row.get_array("sensors").map_or(0, |a| a.len()) as u64,
            dead_letters: 0,
        })
    }
}

/// The fields of a time series document that palletd writes besides the
/// reading's own (and `ts`); `_archive` marks a point thinning stored late.
pub(crate) const OWN_FIELDS: &[&str] = &["sensorId", "lsn", SPOOL, ARCHIVE];

/// The spool's id, `s<8 hex>` (a name no payload's field maps to: it
/// starts with `_`).
pub(crate) const SPOOL: &str = "_spool";

fn spool_id(tag: u32) -> String {
    format!("s{tag:08x}")
}

/// A reading as a time series document: `{ts, sensorId, lsn, _spool,
/// <fields>}`; `tag`: the id of the spool it came through.
pub(crate) fn reading_doc(sensor: &str, sample: SampleRef<'_>, tag: u32) -> RawDocumentBuf {
    let mut d = RawDocumentBuf::new();
    d.append("ts", bson::DateTime::from_millis(sample.ts_ms));
    d.append("sensorId", sensor);
    d.append("lsn", sample.lsn as i64);
    d.append(SPOOL, spool_id(tag));
    for (name, value) in sample.doc.iter().flatten() {
        // Units stay out: a time series has no bucket document of
        // palletd's to keep them once in; so does what thinning did (a
        // value it left out is summed up in a document of its own).
        if name != "ts" && name != crate::bucket::UNITS && name != crate::bucket::THIN {
            d.append(name, value.to_raw_bson());
        }
    }
    d
}

/// The collection's `listCollections` entry, if it exists.
async fn collection_info(db: &Database, name: &str) -> mongodb::error::Result<Option<Document>> {
    let reply = db
        .run_command(doc! { "listCollections": 1, "filter": { "name": name } })
        .await?;
    Ok(reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .and_then(|b| b.first())
        .and_then(|d| d.as_document())
        .cloned())
}

/// Which of the requested LSNs the collection holds, under this spool's
/// id for each. Bounded by sensor, LSN range and time: a reading's `ts` is
/// at most `max_lateness` before and `max_future` after its receipt, so
/// nothing received at or after the earliest of them has a `ts` before
/// this bound.
async fn present_lsns(
    coll: Collection<Document>,
    concern: Option<ReadConcern>,
    req: &[Resolve],
    tags: &Tags,
    margin_ms: i64,
) -> mongodb::error::Result<HashSet<u64>> {
    let all = || req.iter().flat_map(|r| r.samples.iter());
    let (Some(min_lsn), Some(max_lsn)) = (all().map(|s| s.0).min(), all().map(|s| s.0).max())
    else {
        return Ok(HashSet::new());
    };
    let min_ts = all().map(|s| s.1).min().unwrap_or(0);
    let sensors: Vec<&str> = req.iter().map(|r| r.sensor.as_str()).collect();
    let filter = doc! {
        "sensorId": { "$in": sensors },
        "ts": { "$gte": bson::DateTime::from_millis(min_ts.saturating_sub(margin_ms)) },
        "lsn": { "$gte": min_lsn as i64, "$lte": max_lsn as i64 },
    };
    let find = coll
        .find(filter)
        .projection(doc! { "_id": 0, "lsn": 1, SPOOL: 1 });
    let mut cursor = match concern {
        Some(c) => find.read_concern(c).await?,
        None => find.await?,
    };
    let wanted: HashSet<u64> = all().map(|s| s.0).collect();
    let mut out = HashSet::new();
    while cursor.advance().await? {
        let d = cursor.deserialize_current()?;
        let Some(lsn) = d.get("lsn").and_then(mongo::as_u64) else {
            continue;
        };
        let ours = match d.get_str(SPOOL) {
            Ok(id) => id == spool_id(tags.of(lsn)),
            // Written before documents named their spool.
            Err(_) => true,
        };
        if ours && wanted.contains(&lsn) {
            out.insert(lsn);
        }
    }
    Ok(out)
}
