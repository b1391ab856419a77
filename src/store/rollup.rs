//! Rollups (`[[rollup]]`): per sensor and interval (`1h`, `1d`...,
//! aligned to the Unix epoch, UTC), the count of readings and, per numeric
//! field, `sum`, `n`, `min`, `max`, `avg`, `first` and `last` (by reading
//! time; of readings with the same time, the smallest value is first and
//! the largest last), in `<collection>_<interval>`, one document per sensor
//! and interval start, with `computedAt` and `partial`.
//!
//! # When a rollup is written
//! Every flush, before its write, records the (rollup, sensor, interval)
//! keys it touches in `<collection>_rollup_due` (an upsert per key, once
//! per key and run while the interval is open, so about one statement per
//! sensor and interval), with `due` = the interval's end plus
//! `closer.grace`: when its last window is sealed. A key touched by a
//! write whose interval is already due (late data) is recorded again after
//! the write too, bumping its version. Each closer pass then computes the
//! due keys' rollups from the stored readings (an aggregation on the
//! server; only the results travel), upserts them, and deletes each key
//! unless its version changed meanwhile. So a late reading makes its
//! intervals be computed again, a crash anywhere leaves the key for the
//! next pass, and computing twice gives the same document. With
//! `partial = true` the pass also computes the open intervals' keys, marked
//! `partial: true`, and keeps them.
//!
//! Both storage modes compute from the readings: the samples of the
//! interval's buckets, or the time series documents of the interval.
//!
//! The passes run on a task of their own ([`Rollups::start_passes`]),
//! woken by each closer run with its time: computing many sensors' rollups
//! takes the database seconds, and flushes must not wait for it. A pass
//! that is still running when the closer runs again is followed by one
//! more; the queue's versions make a pass safe beside the writes.

use std::collections::{BTreeMap, HashMap, HashSet};

use bson::{doc, rawdoc, Bson, Document};
use futures_util::TryStreamExt;
use mongodb::options::IndexOptions;
use mongodb::{Database, IndexModel};
use tokio_util::sync::CancellationToken;

use super::mongo::{self, Mongo};
use super::read::{self, Range};
use crate::config::{RollupSettings, Settings, StorageMode};
use crate::flush::Batch;
use crate::retry::{Aborted, Backoff};
use crate::telemetry;

/// Sensors one aggregation takes at most.
const SENSORS_PER_QUERY: usize = 500;

/// Due keys one pass takes at most (the rest wait for the next pass).
const KEYS_PER_PASS: i64 = 20_000;

/// A key whose rollup cannot be written is tried again this much later.
const PARKED_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

/// (rollup index, sensor, interval start ms).
type Key = (usize, String, i64);

/// A queue entry read back: (sensor, version, `_id`).
type Entry = (String, i64, Bson);

/// Where the readings are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Buckets,
    Timeseries,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Rollup documents written (final and partial).
    pub written: u64,
    /// Write statements sent (rollup upserts and queue deletes).
    pub statements: u64,
    /// Keys whose rollup could not be written, set aside.
    pub parked: u64,
}

pub struct Rollups {
    specs: Vec<RollupSettings>,
    /// `<collection>_rollup_due`.
    queue: String,
    grace_ms: i64,
    /// Keys this run recorded whose interval is not due yet.
    recorded: HashSet<Key>,
    passes: Passes,
    /// Wakes the pass task with the closer's time.
    wake: Option<tokio::sync::watch::Sender<i64>>,
}

/// What a pass needs (a copy lives on the pass task).
#[derive(Clone)]
struct Passes {
    specs: Vec<RollupSettings>,
    /// The readings' collection.
    base: String,
    queue: String,
    source: Source,
}

impl Rollups {
    /// `None` without `[[rollup]]`s.
    pub fn new(settings: &Settings) -> Option<Rollups> {
        if settings.rollups.is_empty() {
            return None;
        }
        let base = settings.mongodb.collection.clone();
        let queue = format!("{base}_rollup_due");
        Some(Rollups {
            specs: settings.rollups.clone(),
            queue: queue.clone(),
            grace_ms: settings.closer.grace.as_millis() as i64,
            recorded: HashSet::new(),
            passes: Passes {
                specs: settings.rollups.clone(),
                base,
                queue,
                source: match settings.storage.mode {
                    StorageMode::Buckets => Source::Buckets,
                    StorageMode::Timeseries => Source::Timeseries,
                },
            },
            wake: None,
        })
    }

    /// Starts the task that runs the passes on `db` (needs a tokio
    /// runtime); until then [`Rollups::closer_ran`] runs them inline.
    pub fn start_passes(&mut self, db: Database) {
        let (wake, mut woken) = tokio::sync::watch::channel(i64::MIN);
        let passes = self.passes.clone();
        tokio::spawn(async move {
            let mut failing = false;
            while woken.changed().await.is_ok() {
                let now_ms = *woken.borrow_and_update();
                passes.run(&db, now_ms, &mut failing).await;
            }
        });
        self.wake = Some(wake);
    }

    /// The closer ran at `now_ms` (its time, held back while a backlog
    /// drains): the pass task computes what is due by then.
    pub async fn closer_ran(&mut self, db: &Database, now_ms: i64) {
        match &self.wake {
            Some(wake) => {
                let _ = wake.send(now_ms);
            }
            None => self.passes.run(db, now_ms, &mut false).await,
        }
    }

    /// The collection of a rollup (`<collection>_<interval>`).
    pub fn collection_of(base: &str, spec: &RollupSettings) -> String {
        format!("{base}_{}", spec.name)
    }

    /// Indexes: `{sensorId, start}` (unique; what a dashboard reads), the
    /// TTL on `start` per rollup, and `due` on the queue.
    pub async fn schema(&self, db: &Database) -> mongodb::error::Result<()> {
        for spec in &self.specs {
            let coll = Rollups::collection_of(&self.passes.base, spec);
            let index = IndexModel::builder()
                .keys(doc! { "sensorId": 1, "start": 1 })
                .options(IndexOptions::builder().unique(true).build())
                .build();
            db.collection::<Document>(&coll).create_index(index).await?;
            mongo::sync_ttl(db, &coll, "start", "start_ttl", spec.expire_after).await?;
        }
        let due = IndexModel::builder().keys(doc! { "due": 1 }).build();
        db.collection::<Document>(&self.queue)
            .create_index(due)
            .await?;
        Ok(())
    }

    fn due_ms(&self, key: &Key) -> i64 {
        key.2 + self.specs[key.0].interval_ms() + self.grace_ms
    }

    /// The keys a flush touches.
    fn keys(&self, batch: &Batch) -> Vec<Key> {
        let mut keys: HashSet<Key> = HashSet::new();
        for run in &batch.runs {
            for (i, spec) in self.specs.iter().enumerate() {
                let mut last = None;
                for s in run.samples.iter() {
                    let start = spec.start_of(s.ts_ms);
                    if last != Some(start) {
                        keys.insert((i, run.sensor.clone(), start));
                        last = Some(start);
                    }
                }
            }
        }
        keys.into_iter().collect()
    }

    /// Before a flush's write: records the keys it touches that this run
    /// has not recorded, and those already due (late data). Returns the
    /// keys, for [`Rollups::after_write`].
    pub async fn before_write(
        &mut self,
        m: &mut Mongo,
        batch: &Batch,
        now_ms: i64,
        abort: &CancellationToken,
    ) -> Result<Vec<Key>, Aborted> {
        let keys = self.keys(batch);
        self.recorded
            .retain(|k| k.2 + self.specs[k.0].interval_ms() + self.grace_ms > now_ms);
        let new: Vec<Key> = keys
            .iter()
            .filter(|k| self.due_ms(k) <= now_ms || !self.recorded.contains(*k))
            .cloned()
            .collect();
        self.record(m, &new, abort).await?;
        for k in new {
            if self.due_ms(&k) > now_ms {
                self.recorded.insert(k);
            }
        }
        Ok(keys)
    }

    /// After a flush's write: the keys that are due by now are recorded
    /// again, so a pass that computed them while the write was in flight
    /// keeps them for the next pass.
    pub async fn after_write(
        &mut self,
        m: &mut Mongo,
        keys: &[Key],
        now_ms: i64,
        abort: &CancellationToken,
    ) -> Result<(), Aborted> {
        let due: Vec<Key> = (keys.iter())
            .filter(|k| self.due_ms(k) <= now_ms)
            .cloned()
            .collect();
        self.record(m, &due, abort).await
    }

    /// Upserts queue entries for `keys` (bumping their version), retrying
    /// until answered (idempotent: sent again whatever happened).
    async fn record(
        &self,
        m: &mut Mongo,
        keys: &[Key],
        abort: &CancellationToken,
    ) -> Result<(), Aborted> {
        let mut backoff = Backoff::default();
        let mut rest = keys;
        while !rest.is_empty() {
            let (len, reply) = m
                .write_until_answered("record rollups to compute", &mut backoff, abort, |m| {
                    let statements = rest.iter().map(|k| {
                        let due = bson::DateTime::from_millis(self.due_ms(k));
                        rawdoc! {
                            "q": { "_id": self.queue_id(k) },
                            "u": {
                                "$set": {
                                    "due": due,
                                    "r": self.specs[k.0].name.as_str(),
                                    "s": k.1.as_str(),
                                    "t": bson::DateTime::from_millis(k.2),
                                },
                                "$inc": { "v": 1_i64 },
                            },
                            "upsert": true,
                        }
                    });
                    m.batch_command("update", &self.queue, "updates", statements, false)
                })
                .await?;
            match reply {
                Some(reply) => {
                    for (index, code, msg) in reply.write_errors {
                        tracing::error!(index, code, error = %msg, "The database refused a rollup key; that interval's rollup may be missing.");
                    }
                    metrics::counter!(telemetry::ROLLUP_STATEMENTS).increment(len as u64);
                    rest = &rest[len..];
                    backoff.reset();
                }
                None => m.wait(&mut backoff, abort).await?,
            }
        }
        Ok(())
    }

    /// `<rollup>|<interval start ms>|<sensorId>` (a rollup's name holds no
    /// `|`): a string, as an `_id` that is a document was not served by the
    /// `_id` index on SecantusDB (about 120 upserts/s, a backfill's keys
    /// took minutes). Its parts are fields of the entry too.
    fn queue_id(&self, k: &Key) -> String {
        format!("{}|{}|{}", self.specs[k.0].name, k.2, k.1)
    }
}

impl Passes {
    /// One pass, timed and logged (a failure once until one works; its
    /// keys stay for the next pass).
    async fn run(&self, db: &Database, now_ms: i64, failing: &mut bool) {
        let started = std::time::Instant::now();
        match self.pass(db, now_ms).await {
            Ok(_) if std::mem::take(failing) => tracing::info!("Rollups are written again."),
            Ok(_) => {}
            Err(e) if !std::mem::replace(failing, true) => {
                tracing::warn!(error = %e, "Could not write rollups; retrying at the closer's next run.")
            }
            Err(_) => {}
        }
        metrics::histogram!(telemetry::ROLLUP_PASS_SECONDS).record(started.elapsed().as_secs_f64());
    }

    /// One pass: computes and writes the due rollups (and the partial
    /// ones), deleting the keys done.
    async fn pass(&self, db: &Database, now_ms: i64) -> mongodb::error::Result<Pass> {
        let mut out = Pass::default();
        let now = bson::DateTime::from_millis(now_ms);
        let due: Vec<Document> = db
            .collection::<Document>(&self.queue)
            .find(doc! { "due": { "$lte": now } })
            .sort(doc! { "due": 1 })
            .limit(KEYS_PER_PASS)
            .await?
            .try_collect()
            .await?;
        self.compute_keys(db, due, now_ms, false, &mut out).await?;
        for spec in self.specs.iter().filter(|s| s.partial) {
            let open: Vec<Document> = db
                .collection::<Document>(&self.queue)
                .find(doc! { "due": { "$gt": now }, "r": spec.name.as_str() })
                .limit(KEYS_PER_PASS)
                .await?
                .try_collect()
                .await?;
            self.compute_keys(db, open, now_ms, true, &mut out).await?;
        }
        metrics::counter!(telemetry::ROLLUPS_WRITTEN).increment(out.written);
        metrics::counter!(telemetry::ROLLUP_STATEMENTS).increment(out.statements);
        Ok(out)
    }

    /// Computes the rollups of queue entries `entries`, grouped by rollup
    /// and interval; deletes the entries (unless `partial`).
    async fn compute_keys(
        &self,
        db: &Database,
        entries: Vec<Document>,
        now_ms: i64,
        partial: bool,
        out: &mut Pass,
    ) -> mongodb::error::Result<()> {
        // (rollup name, start) -> [(sensor, version, _id)]
        let mut groups: BTreeMap<(String, i64), Vec<Entry>> = BTreeMap::new();
        for e in entries {
            let Some(id) = e.get("_id") else { continue };
            // The key's parts: fields of the entry, or (an entry queued
            // before the `_id` was a string) of its `_id`.
            let parts = match id {
                Bson::Document(d) => d,
                _ => &e,
            };
            let (Ok(r), Ok(s), Ok(t)) = (
                parts.get_str("r"),
                parts.get_str("s"),
                parts.get_datetime("t"),
            ) else {
                continue;
            };
            let v = read::number(e.get("v")).unwrap_or(0.0) as i64;
            groups
                .entry((r.to_string(), t.timestamp_millis()))
                .or_default()
                .push((s.to_string(), v, id.clone()));
        }
        for ((name, start), keys) in groups {
            let spec = self.specs.iter().find(|s| s.name == name);
            for chunk in keys.chunks(SENSORS_PER_QUERY) {
                // Keys whose rollup cannot be computed or written: parked.
                let mut failed: Vec<(&Entry, String)> = Vec::new();
                if let Some(spec) = spec {
                    let sensors: Vec<&str> = chunk.iter().map(|k| k.0.as_str()).collect();
                    let docs = match self
                        .compute(db, spec, start, &sensors, now_ms, partial)
                        .await
                    {
                        Ok(docs) => docs,
                        // Refused by the server (not the link): each sensor
                        // alone, so one that cannot be computed is parked
                        // and the others go on.
                        Err(e) if refused(&e) => {
                            let mut docs = Vec::new();
                            for (entry, sensor) in chunk.iter().zip(&sensors) {
                                match self
                                    .compute(db, spec, start, &[sensor], now_ms, partial)
                                    .await
                                {
                                    Ok(d) => docs.extend(d),
                                    Err(e) if refused(&e) => failed.push((entry, e.to_string())),
                                    Err(e) => return Err(e),
                                }
                            }
                            docs
                        }
                        Err(e) => return Err(e),
                    };
                    if !docs.is_empty() {
                        let sensors_of: Vec<String> = docs
                            .iter()
                            .map(|d| d.get_str("sensorId").unwrap_or_default().to_string())
                            .collect();
                        let updates: Vec<Document> = docs
                            .into_iter()
                            .map(|d| {
                                let q = doc! { "sensorId": d.get("sensorId").cloned().unwrap_or(Bson::Null), "start": d.get("start").cloned().unwrap_or(Bson::Null) };
                                doc! { "q": q, "u": d, "upsert": true }
                            })
                            .collect();
                        out.statements += updates.len() as u64;
                        let coll = Rollups::collection_of(&self.base, spec);
                        let errors = write(db, &coll, "update", "updates", updates).await?;
                        out.written += (sensors_of.len() - errors.len()) as u64;
                        for (i, error) in errors {
                            let sensor = &sensors_of[i];
                            if let Some(entry) = chunk.iter().find(|e| &e.0 == sensor) {
                                failed.push((entry, error));
                            }
                        }
                    }
                }
                if !failed.is_empty() {
                    out.parked += failed.len() as u64;
                    self.park(db, &name, &failed, now_ms).await?;
                }
                // A rollup no longer configured: its keys just go.
                if !partial {
                    let deletes: Vec<Document> = chunk
                        .iter()
                        .filter(|e| !failed.iter().any(|f| std::ptr::eq(f.0, *e)))
                        .map(|(_, v, id)| doc! { "q": { "_id": id, "v": v }, "limit": 1 })
                        .collect();
                    out.statements += deletes.len() as u64;
                    if !deletes.is_empty() {
                        write(db, &self.queue, "delete", "deletes", deletes).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Parks keys whose rollup could not be computed or written: due again
    /// in [`PARKED_FOR`] (so they never block a pass), counted, logged at
    /// most once per pass with the first error.
    async fn park(
        &self,
        db: &Database,
        rollup: &str,
        failed: &[(&Entry, String)],
        now_ms: i64,
    ) -> mongodb::error::Result<()> {
        let again = bson::DateTime::from_millis(now_ms + PARKED_FOR.as_millis() as i64);
        let updates: Vec<Document> = failed
            .iter()
            .map(|((_, _, id), error)| {
                let error = crate::decode::truncate(error, 512);
                doc! {
                    "q": { "_id": id },
                    "u": { "$set": { "due": again, "parked": true, "error": error } },
                }
            })
            .collect();
        metrics::counter!(telemetry::ROLLUP_KEYS_PARKED).increment(failed.len() as u64);
        tracing::warn!(
            rollup,
            keys = failed.len(),
            sensor = %failed[0].0 .0,
            error = %failed[0].1,
            again = ?PARKED_FOR,
            "Rollups that cannot be written are set aside (the others go on); tried again later."
        );
        write(db, &self.queue, "update", "updates", updates).await?;
        Ok(())
    }

    /// The rollup documents of `sensors` for the interval at `start`,
    /// computed from their readings on the server.
    async fn compute(
        &self,
        db: &Database,
        spec: &RollupSettings,
        start: i64,
        sensors: &[&str],
        now_ms: i64,
        partial: bool,
    ) -> mongodb::error::Result<Vec<Document>> {
        let from = bson::DateTime::from_millis(start);
        let to = bson::DateTime::from_millis(start + spec.interval_ms());
        let coll = db.collection::<Document>(&self.base);
        // The readings as {sensorId, ts, <fields>}, and their count.
        let (mut readings, count) = match self.source {
            Source::Buckets => (
                vec![
                    doc! { "$match": { "sensorId": { "$in": sensors }, "startTs": { "$gte": from, "$lt": to } } },
                    doc! { "$unwind": "$samples" },
                    doc! { "$replaceWith": { "$mergeObjects": [ { "sensorId": "$sensorId" }, "$samples" ] } },
                ],
                doc! { "$sum": { "$size": "$samples" } },
            ),
            Source::Timeseries => (
                vec![
                    doc! { "$match": { "sensorId": { "$in": sensors }, "ts": { "$gte": from, "$lt": to } } },
                ],
                doc! { "$sum": 1 },
            ),
        };
        let mut counts: HashMap<String, i64> = HashMap::new();
        let mut pipeline = vec![readings[0].clone()];
        pipeline.push(doc! { "$group": { "_id": "$sensorId", "count": count } });
        let mut cursor = coll.aggregate(pipeline).await?;
        while let Some(row) = cursor.try_next().await? {
            if let Ok(s) = row.get_str("_id") {
                counts.insert(
                    s.to_string(),
                    read::number(row.get("count")).unwrap_or(0.0) as i64,
                );
            }
        }
        readings.extend([
            doc! { "$project": { "sensorId": 1, "ts": 1, "kv": { "$objectToArray": "$$ROOT" } } },
            doc! { "$unwind": "$kv" },
            doc! { "$match": {
                "kv.k": { "$nin": ["_id", "sensorId", "ts", "lsn"] },
                "$expr": { "$isNumber": "$kv.v" },
            } },
            doc! { "$sort": { "ts": 1, "kv.v": 1 } },
            doc! { "$group": {
                "_id": { "s": "$sensorId", "f": "$kv.k" },
                "sum": { "$sum": "$kv.v" },
                "n": { "$sum": 1 },
                "min": { "$min": "$kv.v" },
                "max": { "$max": "$kv.v" },
                "first": { "$first": "$kv.v" },
                "last": { "$last": "$kv.v" },
            } },
        ]);
        let mut docs: BTreeMap<String, Document> = BTreeMap::new();
        for (sensor, n) in &counts {
            let mut d = doc! {
                "sensorId": sensor.as_str(),
                "start": from,
                "end": to,
                "count": *n,
            };
            for part in ["sum", "n", "min", "max", "avg", "first", "last"] {
                d.insert(part, Document::new());
            }
            d.insert("computedAt", bson::DateTime::from_millis(now_ms));
            d.insert("partial", partial);
            docs.insert(sensor.clone(), d);
        }
        let mut cursor = coll.aggregate(readings).await?;
        while let Some(row) = cursor.try_next().await? {
            let Ok(id) = row.get_document("_id") else {
                continue;
            };
            let (Ok(sensor), Ok(field)) = (id.get_str("s"), id.get_str("f")) else {
                continue;
            };
            let Some(d) = docs.get_mut(sensor) else {
                continue;
            };
            let sum = read::number(row.get("sum")).unwrap_or(0.0);
            let n = read::number(row.get("n")).unwrap_or(0.0) as i64;
            for (part, value) in [
                ("sum", Bson::Double(sum)),
                ("n", Bson::Int64(n)),
                ("min", row.get("min").cloned().unwrap_or(Bson::Null)),
                ("max", row.get("max").cloned().unwrap_or(Bson::Null)),
                (
                    "avg",
                    Bson::Double(if n > 0 { sum / n as f64 } else { 0.0 }),
                ),
                ("first", row.get("first").cloned().unwrap_or(Bson::Null)),
                ("last", row.get("last").cloned().unwrap_or(Bson::Null)),
            ] {
                if let Ok(p) = d.get_document_mut(part) {
                    p.insert(field, value);
                }
            }
        }
        Ok(docs.into_values().collect())
    }
}

/// Sends one write command (`update` or `delete`), unordered; returns the
/// statements the server refused: (index, error).
async fn write(
    db: &Database,
    coll: &str,
    name: &str,
    field: &str,
    statements: Vec<Document>,
) -> mongodb::error::Result<Vec<(usize, String)>> {
    let reply = db
        .run_command(doc! { name: coll, field: statements, "ordered": false })
        .await?;
    Ok(mongo::Reply::parse(&reply)
        .write_errors
        .into_iter()
        .map(|(i, code, msg)| (i, format!("rollup {name} rejected (code {code}): {msg}")))
        .collect())
}

/// Whether the server refused a command (it will refuse it again), rather
/// than the link or the server failing.
fn refused(e: &mongodb::error::Error) -> bool {
    matches!(*e.kind, mongodb::error::ErrorKind::Command(_))
}

/// One rollup document as `palletd query --stats --rollup` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupRow {
    pub start_ms: i64,
    pub count: i64,
    pub partial: bool,
    /// field -> (sum, n, min, max, avg, first, last)
    pub fields: BTreeMap<String, [f64; 7]>,
}

/// A sensor's rollups of one interval, in time order.
pub async fn read_rollups(
    db: &Database,
    collection: &str,
    sensor: &str,
    range: Range,
) -> read::Result<Vec<RollupRow>> {
    let mut cursor = db
        .collection::<Document>(collection)
        .find(read::filter(sensor, "start", range))
        .sort(doc! { "start": 1 })
        .await?;
    let mut out = Vec::new();
    let empty = Document::new();
    while let Some(d) = cursor.try_next().await? {
        let part = |name: &str| d.get_document(name).unwrap_or(&empty).clone();
        let parts = ["sum", "n", "min", "max", "avg", "first", "last"].map(part);
        let mut fields = BTreeMap::new();
        for (field, _) in &parts[0] {
            let v = |i: usize| read::number(parts[i].get(field)).unwrap_or(f64::NAN);
            fields.insert(field.clone(), [v(0), v(1), v(2), v(3), v(4), v(5), v(6)]);
        }
        out.push(RollupRow {
            start_ms: d.get_datetime("start")?.timestamp_millis(),
            count: read::number(d.get("count")).unwrap_or(0.0) as i64,
            partial: d.get_bool("partial").unwrap_or(false),
            fields,
        });
    }
    Ok(out)
}
