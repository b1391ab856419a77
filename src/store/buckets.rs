//! `storage.mode = "buckets"`: palletd's bucket documents, one per sensor
//! and window with rollups (see [`crate::bucket`] for the document and its
//! statements).
//!
//! - **Schema**: `{sensorId, startTs}` (range reads and exactly once),
//!   `{closed, endTs}` (the closer), and the `endTs` TTL index that follows
//!   `retention.expire_after`.
//! - **Write**: one ordered `update` command per flush (split only at the
//!   server's limits), one upsert per run of a sensor's consecutive samples
//!   in one window, addressed by the bucket's `_id` ([`bucket::bucket_id`]);
//!   an E11000 on it (the bucket is full or sealed) sends the statement to
//!   the window's next bucket. Before planning, the newest bucket of each
//!   window palletd has no memory of is learned with bounded lookups, so a
//!   restart continues a half-full bucket; a sensor whose lookups keep
//!   finding nothing is not asked about its new windows
//!   ([`bucket::QUIET_LOOKUPS`]).
//! - **What a replay already applied**: every statement pushes its first
//!   and last LSN onto the bucket's `lsns.<spool>` ([`bucket::lsns_field`]),
//!   so an uncertain sample is in MongoDB iff a bucket of its sensor and
//!   window holds a pair around its LSN; one query on `{sensorId, startTs}`
//!   answers a whole flush. This holds in whatever order a sensor's samples
//!   are written (live readings before a backlog) and with several spools
//!   writing one sensor. Buckets written by palletd 0.1 have no `lsns` but
//!   `lsn`, the highest LSN applied to them by a writer whose samples went
//!   in LSN order: a sample at or below it is in (palletd no longer sets
//!   `lsn`, so it keeps meaning exactly that). A sample below the
//!   checkpoint its spool id published (`<collection>_spools`) is in too.
//! - **Seal** (the closer): in chunks of [`SEAL_CHUNK`] buckets (their
//!   `_id`s found on the `{closed, endTs}` index, then one multi-document
//!   update of those), every bucket whose window ended more than
//!   `closer.grace` ago: `closed: true`, `closedAt`, samples
//!   sorted by `ts`, `avg = sum / n`, and without the `lsns` pairs every
//!   spool's published checkpoint has passed (no replay asks for them: a
//!   sealed bucket then has the seeds' shape). On MongoDB 5.2+ (and SecantusDB) a
//!   pipeline update with `$sortArray`; older servers get two statements
//!   (`$push {$each: [], $sort}` then a pipeline update adding `avg` to
//!   exactly the buckets the first one sealed).
//! - **Read**: buckets in `startTs` order on `{sensorId, startTs}`, each
//!   window's buckets merged and sorted by `ts`; rollups without samples.

use std::collections::HashMap;
use std::io::Write;

use bson::{doc, Bson, Document};
use futures_util::TryStreamExt;
use mongodb::options::ReadConcern;
use mongodb::{Collection, Database, IndexModel};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::mongo::{self, count_statement_error, rejection, Decision, Mongo, WriteError};
use super::read::{self, Fields, QueryError, Range, Summary, WindowStats};
use super::SchemaError;
use crate::bucket::{self, Fill, Shape};
use crate::config::Settings;
use crate::flush::{Batch, Outcome, Resolution, Resolve, Written};
use crate::retry::{Aborted, Backoff};
use crate::tags::Tags;

/// Name of the TTL index on the buckets' `endTs`.
pub const TTL_INDEX: &str = "endTs_ttl";

/// Buckets of one window a statement tries before its samples are
/// refused (dead-lettered): a bound on the walk to the next bucket (a
/// duplicate on an index of the user's is refused at once:
/// [`mongo::decide`]).
const MAX_SEQ: u32 = 1_000_000;

/// Buckets one seal statement closes at most (their `_id`s in its filter):
/// the first chunk's size; then each chunk is sized from the last one's
/// time to take about [`SEAL_CHUNK_TIME`], between [`SEAL_CHUNK_MIN`] and
/// [`SEAL_CHUNK_MAX`] buckets (SecantusDB took about 1.3 ms per bucket of
/// 200 samples, so about 200 buckets).
pub const SEAL_CHUNK: usize = 100;
pub const SEAL_CHUNK_MIN: usize = 10;
pub const SEAL_CHUNK_MAX: usize = 1000;
pub const SEAL_CHUNK_TIME: std::time::Duration = std::time::Duration::from_millis(250);

/// Full buckets whose `_id`s are held for an early seal; beyond, a full
/// bucket waits for its window's end like the others (8 MB of ids at most).
pub const FULL_HELD: usize = 100_000;

/// What one [`Buckets::seal`] call did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sealed {
    pub buckets: u64,
    /// The chunk was full: more buckets may be left to seal.
    pub more: bool,
}

/// First wire version with `$sortArray` (MongoDB 5.2).
const WIRE_VERSION_SORT_ARRAY: i32 = 15;

/// The bucket collection.
pub struct Buckets {
    pub(super) collection: String,
    shape: Shape,
    expire_after: Option<std::time::Duration>,
    grace_ms: i64,
    /// Whether the server lacks `$sortArray`; learned on the first seal.
    legacy_seal: Option<bool>,
    /// Buckets a seal call closes at most ([`SEAL_CHUNK`]), and whether
    /// that is fixed (tests) or follows the time chunks take.
    seal_chunk: usize,
    seal_chunk_fixed: bool,
    /// `_id`s of buckets this run's statements filled to
    /// `bucket.max_samples` and not yet sealed (at most [`FULL_HELD`]):
    /// no statement can add to them (the count cap in the filter), so the
    /// closer seals them without waiting for their window's end and the
    /// hour's seal is left the last bucket of each sensor.
    full: Vec<Bson>,
    /// Whether palletd writes through a sharded cluster's router; learned
    /// on the first write ([`Buckets::shard_key`]).
    routed: std::sync::OnceLock<bool>,
    /// The spool ids this spool's records were written under (each
    /// statement records its LSNs under its own, [`bucket::lsns_field`]).
    tags: Tags,
}

/// The indexes the buckets need: range reads (and what a replay applied),
/// the closer.
pub fn indexes() -> Vec<IndexModel> {
    vec![
        IndexModel::builder()
            .keys(doc! { "sensorId": 1, "startTs": 1 })
            .build(),
        IndexModel::builder()
            .keys(doc! { "closed": 1, "endTs": 1 })
            .build(),
    ]
}

impl Buckets {
    pub fn new(settings: &Settings) -> Buckets {
        Buckets {
            collection: settings.mongodb.collection.clone(),
            shape: settings.shape(),
            expire_after: settings.retention.expire_after,
            grace_ms: settings.closer.grace.as_millis() as i64,
            legacy_seal: None,
            seal_chunk: SEAL_CHUNK,
            seal_chunk_fixed: false,
            full: Vec::new(),
            routed: std::sync::OnceLock::new(),
            tags: Tags::new(0),
        }
    }

    /// The spool whose samples this store writes and resolves.
    pub fn set_spool(&mut self, tags: Tags) {
        self.tags = tags;
    }

    /// Forces the seal's update form for servers before 5.2 (for tests).
    pub fn with_legacy_seal(mut self, legacy: bool) -> Self {
        self.legacy_seal = Some(legacy);
        self
    }

    /// Seals at most `n` buckets a call (for tests).
    pub fn with_seal_chunk(mut self, n: usize) -> Self {
        self.seal_chunk = n.max(1);
        self.seal_chunk_fixed = true;
        self
    }

    fn coll(&self, db: &Database) -> Collection<Document> {
        db.collection(&self.collection)
    }

    /// Whether the upserts name the shard key in their filter: only through
    /// a sharded cluster's router (`mongos` answers `hello` with `msg:
    /// "isdbgrid"`), which needs it to route them; elsewhere the `_id`
    /// alone is the cheaper filter ([`bucket::Statement::to_bson`]). Asked
    /// once; a `hello` that fails counts as sharded (the filter every
    /// server takes) and is asked again next time.
    async fn shard_key(&self, db: &Database) -> bool {
        if let Some(&routed) = self.routed.get() {
            return routed;
        }
        match db.run_command(doc! { "hello": 1 }).await {
            Ok(hello) => *self
                .routed
                .get_or_init(|| hello.get_str("msg") == Ok("isdbgrid")),
            Err(_) => true,
        }
    }

    pub(super) async fn schema(&self, db: &Database) -> Result<(), SchemaError> {
        self.coll(db).create_indexes(indexes()).await?;
        mongo::sync_ttl(db, &self.collection, "endTs", TTL_INDEX, self.expire_after).await?;
        self.flat_view(db).await?;
        Ok(())
    }

    /// `<collection>_flat`: a view with one document per reading,
    /// `{sensorId, ts, <fields>}`, for tools that expect that shape
    /// (Grafana's MongoDB plugins, Atlas Charts, BI connectors). A view
    /// stores nothing; each query on it unwinds the buckets it reads
    /// (docs/storage.md, "A flat view"). Made at start, its pipeline kept current.
    async fn flat_view(&self, db: &Database) -> mongodb::error::Result<()> {
        let name = format!("{}_flat", self.collection);
        let pipeline = flat_pipeline();
        match db
            .create_collection(&name)
            .view_on(self.collection.clone())
            .pipeline(pipeline.clone())
            .await
        {
            Ok(()) => Ok(()),
            // NamespaceExists: the view of an earlier start.
            Err(e) if mongo::command_code(&e) == Some(48) => {
                db.run_command(doc! {
                    "collMod": &name,
                    "viewOn": &self.collection,
                    "pipeline": pipeline,
                })
                .await?;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Each uncertain sample is in MongoDB iff a bucket of its sensor and
    /// window holds a range of this spool around its LSN, or (a bucket
    /// written by palletd 0.1) an `lsn` at or above it.
    pub(super) async fn resolve(
        &self,
        mongo: &mut Mongo,
        req: &[Resolve],
        abort: &CancellationToken,
    ) -> Result<Resolution, Aborted> {
        let shape = self.shape;
        // The (sensor, window) pairs with uncertain samples.
        let pairs: Vec<(&str, i64)> = req
            .iter()
            .flat_map(|r| {
                r.samples
                    .iter()
                    .map(|&(_, ts)| (r.sensor.as_str(), shape.window_start(ts)))
            })
            .collect();
        let lookups = lookups(pairs);
        // The ids the uncertain samples were written under (one, but for a
        // spool copied from another box).
        let mut tags: Vec<u32> = req
            .iter()
            .flat_map(|r| r.samples.iter().map(|s| self.tags.of(s.0)))
            .collect();
        tags.sort_unstable();
        tags.dedup();
        let coll = self.collection.clone();
        let found = mongo
            .read_retrying("read applied LSNs", abort, |db, concern| {
                applied_ranges(db.collection(&coll), concern, &lookups, &tags)
            })
            .await?;
        let mut out = Resolution::default();
        for r in req {
            for &(lsn, ts) in &r.samples {
                let key = (r.sensor.clone(), shape.window_start(ts));
                if found
                    .get(&key)
                    .is_some_and(|a| a.holds(self.tags.of(lsn), lsn))
                {
                    out.applied.insert(lsn);
                }
            }
        }
        Ok(out)
    }

    /// Plans and sends the batch's statements; sets every sample's outcome
    /// and the runs' open-bucket fills.
    pub(super) async fn write(
        &mut self,
        mongo: &mut Mongo,
        batch: &mut Batch,
        abort: &CancellationToken,
    ) -> Result<Written, Aborted> {
        let mut written = Written::default();
        self.learn_fills(mongo, batch).await;
        let shard_key = self.shard_key(&mongo.db).await;
        let shape = self.shape;
        let mut plans: Vec<Vec<bucket::Statement>> = batch
            .runs
            .iter_mut()
            .map(|r| {
                r.outcomes = vec![Outcome::NotSent; r.samples.len()];
                bucket::plan(&r.samples, &mut r.fills, &shape, &self.tags)
            })
            .collect();
        // Every statement in order: sensors one after another, each in LSN
        // order, so what an ordered command applies is a prefix per sensor.
        let mut order: Vec<(usize, usize)> = plans
            .iter()
            .enumerate()
            .flat_map(|(r, p)| (0..p.len()).map(move |s| (r, s)))
            .collect();
        let mut backoff = Backoff::default();
        let mut next = 0;
        let mut relearned = false;
        while next < order.len() {
            let runs = &batch.runs;
            let (batch_len, reply) = mongo
                .write_until_answered("write buckets", &mut backoff, abort, |m| {
                    let statements = order[next..].iter().map(|&(r, s)| {
                        plans[r][s].to_bson(&runs[r].sensor, &runs[r].samples, &shape, shard_key)
                    });
                    m.batch_command("update", &self.collection, "updates", statements, true)
                })
                .await?;
            let Some(reply) = reply else {
                // Unknown what the command applied; the pipeline learns it
                // before sending these samples again.
                for &(r, s) in &order[next..next + batch_len] {
                    let st = &plans[r][s];
                    batch.runs[r].outcomes[st.range.clone()].fill(Outcome::Unknown);
                }
                break;
            };
            // Ordered: everything before the first error was applied.
            let first_error = reply.write_errors.first().cloned();
            let applied = first_error.as_ref().map_or(batch_len, |e| e.index);
            for i in 0..applied {
                let (r, s) = order[next + i];
                let st = &plans[r][s];
                let run = &mut batch.runs[r];
                let inserted = reply.upserted.contains(&i);
                run.outcomes[st.range.clone()].fill(Outcome::Applied);
                // A $push rewrites the whole bucket: what it held and what
                // the statement added.
                let held = if inserted {
                    0
                } else {
                    st.base.map_or(0, |b| b.bytes)
                };
                written.bytes_rewritten += u64::from(held + st.bytes);
                let full = st
                    .fill_after(inserted)
                    .is_some_and(|f| f.count >= shape.max_samples);
                if full && self.full.len() < FULL_HELD {
                    let id = bucket::bucket_id(&run.sensor, st.start_ms, st.seq);
                    self.full.push(Bson::String(id));
                }
                if st.leaves && self.full.len() < FULL_HELD {
                    let id = bucket::bucket_id(&run.sensor, st.start_ms, st.seq - 1);
                    self.full.push(Bson::String(id));
                }
                settle(&mut run.fills, st, Some(inserted));
                written.statements += 1;
                written.buckets_created += inserted as u64;
            }
            next += applied;
            let Some(error) = first_error else {
                backoff.reset();
                continue;
            };
            let decision = mongo::statement_error(&error, true);
            let (r, s) = order[next];
            match decision {
                // Its bucket is there and it does not fit (full or sealed,
                // beyond what palletd knew): the next bucket, at once (a
                // collision past MAX_SEQ buckets is given up: it would be
                // sent for ever).
                Decision::NextBucket if plans[r][s].seq < MAX_SEQ => {
                    bucket::collided(&mut plans[r], s);
                    batch.runs[r].fills.surprised();
                    metrics::counter!(crate::telemetry::BUCKET_COLLISIONS).increment(1);
                    backoff.reset();
                    if !relearned {
                        relearned = true;
                        self.replan_after(mongo, batch, &mut plans, &mut order, r)
                            .await;
                    }
                }
                Decision::RetryStatement => {
                    count_statement_error(decision);
                    debug!(code = error.code, error = %error.msg, "Transient statement error; retrying from it.");
                    mongo.wait(&mut backoff, abort).await?;
                }
                _ => {
                    count_statement_error(Decision::GiveUp);
                    let WriteError { code, msg, .. } = error;
                    let st = &plans[r][s];
                    batch.runs[r].outcomes[st.range.clone()]
                        .fill(Outcome::Rejected(rejection(code, &msg)));
                    next += 1;
                    backoff.reset();
                }
            }
        }
        // A statement not applied leaves its window's fill unknown: learned
        // again before the next write to it.
        for (run, plan) in batch.runs.iter_mut().zip(&plans) {
            for st in plan {
                if run.outcomes[st.range.start] != Outcome::Applied {
                    settle(&mut run.fills, st, None);
                }
            }
        }
        Ok(written)
    }

    /// After a collision in run `r`: another writer may have filled the
    /// buckets of the runs not sent yet too (a second instance, or the other
    /// lane: each lane knows only its own fills), and each of their
    /// statements would collide in turn, the rest of the command sent again
    /// after each (over a slow link a write of 1,000 sensors then took tens
    /// of minutes). So their fills are looked up again (one query per
    /// [`FILL_IDS_PER_QUERY`]) and they are planned anew; `order` from run
    /// `r` on follows. Done once per write: the lookup is what the planner
    /// needs, and a later collision is a race, sent on as before.
    async fn replan_after(
        &self,
        mongo: &mut Mongo,
        batch: &mut Batch,
        plans: &mut [Vec<bucket::Statement>],
        order: &mut Vec<(usize, usize)>,
        r: usize,
    ) {
        if r + 1 >= batch.runs.len() {
            return;
        }
        for (run, plan) in batch.runs[r + 1..].iter_mut().zip(&plans[r + 1..]) {
            for st in plan {
                run.fills.remove(&st.start_ms);
            }
            run.fills.surprised();
        }
        self.learn_fills(mongo, batch).await;
        let cut = order.partition_point(|&(run, _)| run <= r);
        order.truncate(cut);
        for (i, run) in batch.runs.iter_mut().enumerate().skip(r + 1) {
            plans[i] = bucket::plan(&run.samples, &mut run.fills, &self.shape, &self.tags);
            order.extend((0..plans[i].len()).map(|s| (i, s)));
        }
    }

    /// Learns the fill of open buckets the runs have no memory of (after a
    /// restart, or a sensor seen for the first time): `_id` point lookups
    /// ([`open_fills`]). One attempt: the fill only improves packing,
    /// correctness never depends on it.
    async fn learn_fills(&self, mongo: &mut Mongo, batch: &mut Batch) {
        // A quiet sensor's new windows, and a window newer than every
        // one known of its sensor, are taken to be empty (seq 0).
        for run in batch.runs.iter_mut() {
            let mut windows: Vec<i64> = (run.samples.iter())
                .map(|s| self.shape.window_start(s.ts_ms))
                .collect();
            windows.dedup();
            for w in windows {
                if !run.fills.contains_key(&w) && run.fills.assume_empty(w) {
                    run.fills.insert(w, Fill::default());
                }
            }
        }
        let mut unknown: Vec<(usize, i64)> = batch
            .runs
            .iter()
            .enumerate()
            .flat_map(|(i, run)| {
                run.samples
                    .iter()
                    .map(|s| self.shape.window_start(s.ts_ms))
                    .filter(|w| !run.fills.contains_key(w))
                    .map(move |w| (i, w))
            })
            .collect();
        if unknown.is_empty() {
            return;
        }
        unknown.sort_unstable();
        unknown.dedup();
        metrics::counter!(crate::telemetry::FILL_LOOKUPS).increment(unknown.len() as u64);
        let pairs: Vec<(&str, i64)> = (unknown.iter())
            .map(|&(i, w)| (batch.runs[i].sensor.as_str(), w))
            .collect();
        match open_fills(&self.coll(&mongo.db), &pairs).await {
            Ok(found) => {
                let mut any = vec![None; batch.runs.len()];
                for &(i, start) in &unknown {
                    let key = (batch.runs[i].sensor.clone(), start);
                    let fill = found.get(&key).copied();
                    let seen = any[i].get_or_insert(false);
                    *seen |= fill.is_some();
                    batch.runs[i].fills.insert(start, fill.unwrap_or_default());
                }
                for (run, found) in batch.runs.iter_mut().zip(any) {
                    if let Some(found) = found {
                        run.fills.looked_up(found);
                    }
                }
            }
            Err(e) => debug!(error = %e, "Could not learn open bucket fills; writing without."),
        }
    }

    /// Seals a chunk of the open buckets whose window ended at or before
    /// `now_ms - closer.grace` (their `_id`s found first on the `{closed,
    /// endTs}` index), or, when none is left, of the buckets this run
    /// filled ([`Buckets::full`]). Returns how many it sealed and whether
    /// more may be left: the caller calls again, after letting flushes go
    /// (the hour's seal of 10,000 sensors' buckets is tens of seconds of
    /// the server's time: one statement for all of them held every flush
    /// up that long, and its work grew with the data).
    ///
    /// `published`: the checkpoint each spool published (by `lsns` field
    /// name); a sealed bucket keeps only the `lsns.<spool>` whose pairs
    /// reach that spool's checkpoint, and none once all are past
    /// ([`strip_expression`]).
    pub async fn seal(
        &mut self,
        db: &Database,
        now_ms: i64,
        published: &HashMap<String, u64>,
    ) -> mongodb::error::Result<Sealed> {
        let legacy = match self.legacy_seal {
            Some(l) => l,
            None => {
                let hello = db.run_command(doc! { "hello": 1 }).await?;
                let wire = hello.get_i32("maxWireVersion").unwrap_or(0);
                *self.legacy_seal.insert(wire < WIRE_VERSION_SORT_ARRAY)
            }
        };
        let cutoff = bson::DateTime::from_millis(self.cutoff(now_ms));
        let now = bson::DateTime::from_millis(now_ms);
        let ids: Vec<Bson> = self
            .coll(db)
            .find(open_and_ended(cutoff))
            .projection(doc! { "_id": 1 })
            .hint(mongodb::options::Hint::Keys(
                doc! { "closed": 1, "endTs": 1 },
            ))
            .limit(self.seal_chunk as i64)
            .batch_size(self.seal_chunk as u32)
            .await?
            .try_filter_map(|d| async move { Ok(d.get("_id").cloned()) })
            .try_collect()
            .await?;
        let (ids, q, more) = if !ids.is_empty() {
            let q = chunk_filter(&ids, cutoff);
            let more = ids.len() >= self.seal_chunk || !self.full.is_empty();
            (ids, q, more)
        } else if !self.full.is_empty() {
            let take = self.full.len().min(self.seal_chunk);
            let ids: Vec<Bson> = self.full.drain(..take).collect();
            // (Full, or left with little room: no statement of this run
            // adds to them, whatever their window; a bucket that has more
            // room than `Shape::little_room` is not sealed early.)
            let q = doc! {
                "_id": { "$in": &ids },
                "closed": false,
                "count": { "$gte": self.shape.nearly_full() as i64 },
            };
            (ids, q, !self.full.is_empty())
        } else {
            return Ok(Sealed::default());
        };
        let started = std::time::Instant::now();
        let updates = if legacy {
            legacy_seal_statements(&ids, q, now, published)
        } else {
            vec![seal_statement(q, published)]
        };
        let reply = db
            .run_command(doc! {
                "update": &self.collection,
                "updates": updates,
                "ordered": true,
                "writeConcern": { "w": "majority" },
            })
            .await?;
        mongo::no_write_errors(&reply, "seal")?;
        if more && !self.seal_chunk_fixed {
            self.seal_chunk = next_seal_chunk(self.seal_chunk, started.elapsed());
        }
        // In the legacy form the second statement touches the same buckets.
        let modified = reply.get_i32("nModified").unwrap_or(0).max(0) as u64;
        Ok(Sealed {
            buckets: modified / if legacy { 2 } else { 1 },
            more,
        })
    }

    /// Buckets whose `endTs` is at or before this are sealed at `now_ms`.
    pub fn cutoff(&self, now_ms: i64) -> i64 {
        now_ms - self.grace_ms
    }

    /// How long after its end a window is sealed (`closer.grace`).
    pub fn grace(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.grace_ms.max(0) as u64)
    }

    /// One sensor's readings in time order, window by window: all buckets
    /// of a window (full ones, late ones after sealing) merged.
    pub(super) async fn readings(
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
    pub(super) async fn window_stats(
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

    pub(super) async fn summary(&self, db: &Database) -> read::Result<Summary> {
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
    pub(super) async fn print_raw(
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
    fn bucket_filter(&self, sensor: &str, range: Range) -> Document {
        let starts = Range {
            from: range.from.map(|f| f - self.shape.window_ms + 1),
            to: range.to,
        };
        read::filter(sensor, "startTs", starts)
    }
}

/// Records what the database did with a statement: `Some(inserted)` when
/// it was applied (the fill it now has), `None` when it was not (unknown).
fn settle(fills: &mut bucket::Fills, st: &bucket::Statement, applied: Option<bool>) {
    match applied.and_then(|inserted| st.fill_after(inserted)) {
        Some(fill) => {
            fills.insert(st.start_ms, fill);
        }
        None => {
            fills.remove(&st.start_ms);
        }
    }
}

/// Sequence numbers asked for per (sensor, window) in one round of
/// [`open_fills`]: most windows have one to three buckets.
const FILL_SEQS: u32 = 4;

/// `_id`s per fill query: 2,048 windows of 4 sequence numbers each. On
/// SecantusDB 8,192 `_id`s took 0.12-0.13 s with 240 hourly buckets per
/// sensor stored, where `sensorId $in` x `startTs $in` over 2,048 pairs
/// took 1.5-2.0 s (0.04-0.09 s on an empty collection: it grows with each
/// sensor's history) and, after a restart beside a month of history,
/// stalled the first flushes of 10,000 sensors for a minute.
const FILL_IDS_PER_QUERY: usize = 8_192;

/// What is known of the newest bucket of (sensor, window start) pairs:
/// the one with the highest sequence number ([`bucket::bucket_id`]), its
/// fill, or [`Fill::sealed`] if the closer sealed it. A pair without such a
/// bucket is absent (buckets written before buckets were addressed by
/// `_id`, with an ObjectId, are left alone: read and sealed, never written
/// again).
///
/// Asked by `_id`, [`FILL_SEQS`] sequence numbers per pair and round, at
/// most [`FILL_IDS_PER_QUERY`] per query, so each query costs the same
/// however much history the sensors have. A window's buckets are numbered
/// from 0 without gaps (a bucket is started only past the one before it),
/// so a pair whose last number asked exists is asked again for the next
/// ones, and only those.
async fn open_fills(
    coll: &Collection<Document>,
    pairs: &[(&str, i64)],
) -> mongodb::error::Result<HashMap<(String, i64), Fill>> {
    let mut newest: HashMap<(String, i64), Fill> = HashMap::new();
    let mut asking: Vec<(&str, i64)> = pairs.to_vec();
    let mut from = 0;
    while !asking.is_empty() && from < MAX_SEQ {
        for chunk in asking.chunks(FILL_IDS_PER_QUERY / FILL_SEQS as usize) {
            let ids: Vec<String> = (chunk.iter())
                .flat_map(|&(s, w)| {
                    (from..from + FILL_SEQS).map(move |q| bucket::bucket_id(s, w, q))
                })
                .collect();
            let cursor = coll
                .find(doc! { "_id": { "$in": ids } })
                .projection(
                    doc! { "_id": 1, "sensorId": 1, "startTs": 1, "count": 1, "size": 1, "closed": 1 },
                )
                .await?;
            newest_buckets(cursor, &mut newest).await?;
        }
        let top = from + FILL_SEQS - 1;
        asking.retain(|&(s, w)| {
            newest
                .get(&(s.to_string(), w))
                .is_some_and(|f| f.seq == top)
        });
        from += FILL_SEQS;
    }
    Ok(newest)
}

/// Keeps, per (sensor, window start), what is known of its newest bucket.
async fn newest_buckets(
    mut cursor: mongodb::Cursor<Document>,
    newest: &mut HashMap<(String, i64), Fill>,
) -> mongodb::error::Result<()> {
    while cursor.advance().await? {
        let d = cursor.deserialize_current()?;
        let (Ok(sensor), Ok(start), Some(seq)) = (
            d.get_str("sensorId"),
            d.get_datetime("startTs"),
            d.get_str("_id").ok().and_then(bucket::seq_of),
        ) else {
            continue;
        };
        let fill = match d.get_bool("closed") {
            Ok(false) => Fill {
                count: d.get_i32("count").unwrap_or(0).max(0) as u32,
                bytes: d.get_i32("size").unwrap_or(0).max(0) as u32,
                seq,
            },
            _ => Fill::sealed(seq),
        };
        newest
            .entry((sensor.to_string(), start.timestamp_millis()))
            .and_modify(|f| {
                if fill.seq > f.seq {
                    *f = fill;
                }
            })
            .or_insert(fill);
    }
    Ok(())
}

/// What the buckets of one sensor and window say was applied to them.
#[derive(Debug, Default)]
struct Applied {
    /// Per spool id, its LSN ranges, `[first, last, ...]`.
    ranges: Vec<(u32, Vec<u64>)>,
    /// The highest `lsn` of its buckets: set only by palletd 0.1, whose
    /// writes applied a prefix of each sensor's samples.
    legacy: Option<u64>,
}

impl Applied {
    /// Whether the record `lsn`, written under spool id `tag`, was applied.
    fn holds(&self, tag: u32, lsn: u64) -> bool {
        let ranges = self.ranges.iter().find(|r| r.0 == tag);
        ranges.is_some_and(|r| bucket::ranges_hold(&r.1, lsn))
            || self.legacy.is_some_and(|l| lsn <= l)
    }
}

/// The applied ranges (of the spool ids `tags`) of the buckets of these
/// lookups' windows and sensors: one query on `{sensorId, startTs}` per
/// lookup.
async fn applied_ranges(
    coll: Collection<Document>,
    concern: Option<ReadConcern>,
    lookups: &[Lookup<'_>],
    tags: &[u32],
) -> mongodb::error::Result<HashMap<(String, i64), Applied>> {
    let mut out: HashMap<(String, i64), Applied> = HashMap::new();
    let mut projection = doc! { "_id": 0, "sensorId": 1, "startTs": 1, "lsn": 1 };
    for tag in tags {
        projection.insert(bucket::lsns_field(*tag), 1);
    }
    for l in lookups {
        let find = coll.find(l.filter()).projection(projection.clone());
        let cursor = match concern.clone() {
            Some(c) => find.read_concern(c).await?,
            None => find.await?,
        };
        collect_applied(cursor, tags, &mut out).await?;
    }
    Ok(out)
}

/// Adds the ranges of the buckets `cursor` returns to `out`.
async fn collect_applied(
    mut cursor: mongodb::Cursor<Document>,
    tags: &[u32],
    out: &mut HashMap<(String, i64), Applied>,
) -> mongodb::error::Result<()> {
    while cursor.advance().await? {
        let d = cursor.deserialize_current()?;
        let (Ok(sensor), Ok(start)) = (d.get_str("sensorId"), d.get_datetime("startTs")) else {
            continue;
        };
        let entry = out
            .entry((sensor.to_string(), start.timestamp_millis()))
            .or_default();
        for tag in tags {
            let field = bucket::lsns_field(*tag);
            let Some((top, key)) = field.split_once('.') else {
                continue;
            };
            if let Ok(pairs) = d.get_document(top).and_then(|l| l.get_array(key)) {
                // Every bucket of the window adds its pairs (a window with
                // full buckets has several).
                let pairs = pairs.iter().filter_map(mongo::as_u64);
                match entry.ranges.iter_mut().find(|r| r.0 == *tag) {
                    Some(r) => r.1.extend(pairs),
                    None => entry.ranges.push((*tag, pairs.collect())),
                }
            }
        }
        if let Some(lsn) = d.get("lsn").and_then(mongo::as_u64) {
            entry.legacy = entry.legacy.max(Some(lsn));
        }
    }
    Ok(())
}

/// At most this many (sensor, window start) combinations a lookup of
/// buckets names (`sensorId $in` times `startTs $in`): what it can return
/// beyond the pairs asked for, and the query's size, stay bounded however
/// many windows a flush spans (a backfill of a year of hourly windows is
/// 8,760 per sensor).
pub const MAX_LOOKUP_PAIRS: usize = 2048;

/// One lookup of buckets on `{sensorId, startTs}`: its sensors times its
/// window starts, and which of those pairs were asked for.
#[derive(Debug, PartialEq)]
struct Lookup<'a> {
    sensors: Vec<&'a str>,
    starts: Vec<i64>,
    /// Per sensor, the window starts asked for (sorted).
    asked: std::collections::BTreeMap<&'a str, Vec<i64>>,
}

impl Lookup<'_> {
    fn filter(&self) -> Document {
        let starts: Vec<bson::DateTime> = self
            .starts
            .iter()
            .map(|s| bson::DateTime::from_millis(*s))
            .collect();
        doc! { "sensorId": { "$in": &self.sensors }, "startTs": { "$in": starts } }
    }
}

/// Cuts (sensor, window start) pairs into lookups of at most
/// [`MAX_LOOKUP_PAIRS`] combinations each: sensors are gathered while
/// their windows together keep within it (the live case: a thousand
/// sensors and one window are one lookup); a sensor with more windows than
/// that gets lookups of its own. The number of lookups grows with the pairs
/// asked for, never with the square of anything.
fn lookups(mut pairs: Vec<(&str, i64)>) -> Vec<Lookup<'_>> {
    pairs.sort_unstable();
    pairs.dedup();
    let mut out: Vec<Lookup<'_>> = Vec::new();
    let mut current: Option<(Lookup<'_>, std::collections::BTreeSet<i64>)> = None;
    let mut rest = pairs.as_slice();
    while let Some(&(sensor, _)) = rest.first() {
        let n = rest.iter().take_while(|p| p.0 == sensor).count();
        let (mine, after) = rest.split_at(n);
        rest = after;
        let starts: Vec<i64> = mine.iter().map(|p| p.1).collect();
        if let Some((l, union)) = current.as_mut() {
            let added = starts.iter().filter(|s| !union.contains(s)).count();
            if (l.sensors.len() + 1) * (union.len() + added) <= MAX_LOOKUP_PAIRS {
                union.extend(starts.iter().copied());
                l.sensors.push(sensor);
                l.asked.insert(sensor, starts);
                continue;
            }
        }
        if let Some((mut l, union)) = current.take() {
            l.starts = union.into_iter().collect();
            out.push(l);
        }
        if starts.len() > MAX_LOOKUP_PAIRS {
            for chunk in starts.chunks(MAX_LOOKUP_PAIRS) {
                out.push(Lookup {
                    sensors: vec![sensor],
                    starts: chunk.to_vec(),
                    asked: [(sensor, chunk.to_vec())].into(),
                });
            }
            continue;
        }
        let union = starts.iter().copied().collect();
        current = Some((
            Lookup {
                sensors: vec![sensor],
                starts: Vec::new(),
                asked: [(sensor, starts)].into(),
            },
            union,
        ));
    }
    if let Some((mut l, union)) = current {
        l.starts = union.into_iter().collect();
        out.push(l);
    }
    out
}

/// The flat view's pipeline: each sample of each bucket as a document of
/// its own, with its bucket's sensor.
pub fn flat_pipeline() -> Vec<Document> {
    vec![
        doc! { "$unwind": "$samples" },
        doc! { "$replaceWith": { "$mergeObjects": [{ "sensorId": "$sensorId" }, "$samples"] } },
    ]
}

fn open_and_ended(cutoff: bson::DateTime) -> Document {
    doc! { "closed": false, "endTs": { "$lte": cutoff } }
}

/// The next chunk's size after a full chunk of `n` buckets took `took`:
/// about [`SEAL_CHUNK_TIME`]'s worth, growing at most fourfold a step.
fn next_seal_chunk(n: usize, took: std::time::Duration) -> usize {
    let per_bucket = took.as_secs_f64().max(1e-6) / n as f64;
    let fit = (SEAL_CHUNK_TIME.as_secs_f64() / per_bucket) as usize;
    fit.min(n * 4).clamp(SEAL_CHUNK_MIN, SEAL_CHUNK_MAX)
}

/// [`open_and_ended`], of the buckets `ids` only (a seal's chunk).
fn chunk_filter(ids: &[Bson], cutoff: bson::DateTime) -> Document {
    let mut q = doc! { "_id": { "$in": ids } };
    q.extend(open_and_ended(cutoff));
    q
}

/// `avg.<f> = sum.<f> / n.<f>` for every rolled-up field, as an expression
/// that MongoDB 5.0 accepts (`$getField` takes only constant names before 7.2).
fn avg_expression() -> Document {
    doc! {
        "$arrayToObject": { "$map": {
            "input": { "$objectToArray": { "$ifNull": ["$sum", {}] } },
            "as": "s",
            "in": {
                "k": "$$s.k",
                "v": { "$divide": ["$$s.v", { "$let": {
                    "vars": { "n": { "$arrayElemAt": [
                        { "$filter": {
                            "input": { "$objectToArray": { "$ifNull": ["$n", {}] } },
                            "cond": { "$eq": ["$$this.k", "$$s.k"] },
                        } }, 0] } },
                    "in": "$$n.v",
                } }] },
            },
        } }
    }
}

/// `lsns` without the spools' pairs that no replay needs: an entry
/// `lsns.<spool>` goes when its largest LSN is below the checkpoint that
/// spool published (every record below it is in MongoDB), and the field
/// goes with its last entry. A spool that resolves an LSN below its
/// published checkpoint (after a crash before the spool stored that
/// checkpoint, or a restored backup or a copy of it) takes it as applied
/// (`Store::resolve`), so it never looks for those pairs. `None` without
/// published checkpoints.
///
/// The rule's proof is the pipeline model's (`src/pipeline/tests.rs`):
/// every seal there publishes and removes pairs, finer than this (each
/// pair below the checkpoint, in open windows too), through crashes, lost
/// replies, two instances and a backlog, and every sample stays stored
/// exactly once; `tests/faults.rs` restores a spool from a backup.
fn strip_expression(published: &HashMap<String, u64>) -> Option<Document> {
    if published.is_empty() {
        return None;
    }
    let mut spools: Vec<(&String, &u64)> = published.iter().collect();
    spools.sort();
    let passed: Vec<Document> = spools
        .into_iter()
        .map(|(field, c)| {
            doc! { "$and": [
                { "$eq": ["$$e.k", field.as_str()] },
                { "$lt": [{ "$max": "$$e.v" }, *c as i64] },
            ] }
        })
        .collect();
    let kept = doc! { "$filter": {
        "input": { "$objectToArray": { "$ifNull": ["$lsns", {}] } },
        "as": "e",
        "cond": { "$not": [{ "$or": passed }] },
    } };
    Some(doc! { "$let": {
        "vars": { "kept": kept },
        "in": { "$cond": [
            { "$eq": [{ "$size": "$$kept" }, 0] },
            "$$REMOVE",
            { "$arrayToObject": "$$kept" },
        ] },
    } })
}

/// The one-statement seal of the buckets `q` finds (MongoDB 5.2+).
fn seal_statement(q: Document, published: &HashMap<String, u64>) -> Document {
    let mut set = doc! {
        "closed": true,
        "closedAt": "$$NOW",
        "samples": { "$sortArray": { "input": "$samples", "sortBy": { "ts": 1 } } },
        "avg": avg_expression(),
    };
    if let Some(lsns) = strip_expression(published) {
        set.insert("lsns", lsns);
    }
    doc! {
        "q": q,
        "u": [ { "$set": set } ],
        "multi": true,
    }
}

/// The two-statement seal of the buckets `q` finds, among `ids`, for
/// servers without `$sortArray`.
fn legacy_seal_statements(
    ids: &[Bson],
    q: Document,
    now: bson::DateTime,
    published: &HashMap<String, u64>,
) -> Vec<Document> {
    let mut set = doc! { "avg": avg_expression() };
    if let Some(lsns) = strip_expression(published) {
        set.insert("lsns", lsns);
    }
    vec![
        doc! {
            "q": q,
            "u": {
                "$push": { "samples": { "$each": [], "$sort": { "ts": 1 } } },
                "$set": { "closed": true, "closedAt": now },
            },
            "multi": true,
        },
        doc! {
            "q": { "_id": { "$in": ids }, "closed": true, "closedAt": now, "avg": { "$exists": false } },
            "u": [ { "$set": set } ],
            "multi": true,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn combos(l: &Lookup<'_>) -> usize {
        l.sensors.len() * l.starts.len()
    }

    /// The live case (a thousand sensors, one window) is one lookup; a
    /// backfill (three sensors, a year of hourly windows) is lookups of at
    /// most MAX_LOOKUP_PAIRS combinations, not one of 26,280 clauses.
    /// Mutant this kills: the resolve lookup's `$or` of a clause per window.
    #[test]
    fn lookups_stay_bounded_for_many_sensors_and_for_many_windows() {
        let names: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
        let live: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), 3_600_000)).collect();
        let l = lookups(live);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].sensors.len(), l[0].starts.len()), (1000, 1));

        let hour = 3_600_000;
        let year: Vec<(&str, i64)> = names[..3]
            .iter()
            .flat_map(|n| (0..8760).map(move |h| (n.as_str(), h * hour)))
            .collect();
        let l = lookups(year);
        assert!(l.iter().all(|l| combos(l) <= MAX_LOOKUP_PAIRS));
        assert_eq!(l.len(), 3 * 8760_usize.div_ceil(MAX_LOOKUP_PAIRS));
    }

    proptest! {
        /// Every pair asked for is in exactly one lookup, asked there,
        /// within its sensors and starts; no lookup names more than
        /// MAX_LOOKUP_PAIRS combinations.
        #[test]
        fn every_pair_is_looked_up_once_within_the_bound(
            raw in proptest::collection::vec((0u16..300, 0i64..5000), 0..6000),
        ) {
            let names: Vec<String> = (0..300).map(|i| format!("s{i}")).collect();
            let pairs: Vec<(&str, i64)> =
                raw.iter().map(|&(s, w)| (names[s as usize].as_str(), w)).collect();
            let ls = lookups(pairs.clone());
            let mut seen = std::collections::HashMap::new();
            for l in &ls {
                prop_assert!(combos(l) <= MAX_LOOKUP_PAIRS);
                for (sensor, starts) in &l.asked {
                    prop_assert!(l.sensors.contains(sensor));
                    for s in starts {
                        prop_assert!(l.starts.binary_search(s).is_ok());
                        *seen.entry((*sensor, *s)).or_insert(0) += 1;
                    }
                }
            }
            let mut want = pairs;
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(seen.len(), want.len());
            prop_assert!(seen.values().all(|n| *n == 1));
            prop_assert!(want.iter().all(|p| seen.contains_key(p)));
        }
    }

    #[test]
    fn a_seal_chunk_is_sized_to_take_a_quarter_second() {
        let ms = std::time::Duration::from_millis;
        // 1.3 ms a bucket: about 190.
        assert_eq!(next_seal_chunk(100, ms(130)), 192);
        assert_eq!(next_seal_chunk(200, ms(500)), 100);
        assert_eq!(next_seal_chunk(100, ms(1)), 400, "fourfold at most");
        assert_eq!(next_seal_chunk(1000, ms(1)), SEAL_CHUNK_MAX);
        assert_eq!(next_seal_chunk(100, ms(60_000)), SEAL_CHUNK_MIN);
    }

    /// On a sharded collection a multi-document update needs no shard key
    /// (MongoDB routes it to every shard); it must not change one.
    #[test]
    fn the_seal_is_an_update_many_that_leaves_the_shard_key_alone() {
        let cutoff = bson::DateTime::from_millis(3_600_000);
        let published: HashMap<String, u64> = [("s00000001".to_string(), 5)].into();
        let ids = [Bson::String("a|0|0".into()), Bson::String("b|0|0".into())];
        let q = chunk_filter(&ids, cutoff);
        let mut statements = vec![seal_statement(q.clone(), &published)];
        statements.extend(legacy_seal_statements(&ids, q, cutoff, &published));
        for st in statements {
            assert_eq!(st.get_bool("multi"), Ok(true), "{st}");
            let q = st.get_document("q").unwrap();
            assert_eq!(
                q.get_document("_id").unwrap(),
                &doc! { "$in": ids.to_vec() },
                "a chunk's buckets only"
            );
            assert!(!st.get_bool("upsert").unwrap_or(false));
            let sets: Vec<&Document> = match st.get("u").unwrap() {
                Bson::Array(stages) => stages
                    .iter()
                    .filter_map(|s| s.as_document()?.get_document("$set").ok())
                    .collect(),
                Bson::Document(u) => u.values().filter_map(|v| v.as_document()).collect(),
                other => panic!("{other}"),
            };
            for set in sets {
                assert!(!set.contains_key("sensorId") && !set.contains_key("startTs"));
            }
        }
    }
}
