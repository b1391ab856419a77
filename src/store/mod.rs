//! Where readings go in MongoDB: one file per storage mode behind one
//! enum, [`Store`], and the plumbing they share.
//!
//! - [`buckets`]: palletd's bucket documents (the default).
//! - [`timeseries`]: a MongoDB native time series collection.
//! - [`mongo`]: running commands, reading replies, the typed retry
//!   decision, outage logging, dead letters, TTL indexes.
//! - [`statements`]: the statement driver every write goes through
//!   (unordered with its partial success, ordered, or once).
//! - [`read`]: what the readers return to `palletd query`.
//! - [`rollup`]: `[[rollup]]` summaries per sensor and interval, kept by
//!   the closer in every mode.
//!
//! Every mode answers the same five questions: its **schema** (what to set
//! up at start), how to **resolve** samples that may already be in MongoDB
//! (replayed from an earlier run, or sent in a write whose reply was lost),
//! its **write**, its **seal** (the closer; nothing in time series mode) and
//! its **read** (`palletd query`). Adding a mode is one new file with those
//! functions, one arm here, and its name in [`crate::config::StorageMode`].
//!
//! Dead letters are the same in every mode: `<collection>_deadletter`, with
//! a TTL index on `receivedAt`. A flush writes them before its samples.

pub mod buckets;
pub(crate) mod fence;
pub mod latest;
pub(crate) mod mongo;
pub(crate) mod read;
pub(crate) mod rollup;
pub(crate) mod statements;
pub(crate) mod timeseries;

use std::io::Write;
use std::sync::Arc;

use mongodb::Database;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::{RollupSettings, Settings, StorageMode};
use crate::handoff::{Batch, Resolution, Resolve, Written};
use crate::retry::{Aborted, Backoff};
use crate::spool_ids::Tags;
use buckets::{Buckets, Sealed};
use mongo::Mongo;
use read::{Fields, Range, Summary, WindowStats};
use timeseries::Timeseries;

/// Why the schema could not be put in place.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SchemaError {
    #[error(transparent)]
    Database(#[from] mongodb::error::Error),
    /// The collection exists in a shape palletd must not write into.
    #[error("{0}")]
    Mismatch(String),
}

/// Where thinning sums up the values it leaves out, per window of this
/// many ms: in time series mode, whose documents are readings and carry no
/// window's summaries (`bucket.window`); `None` in bucket mode, whose
/// statements summarise every reading.
pub(crate) fn left_out_window(settings: &Settings) -> Option<i64> {
    (settings.storage.mode == crate::config::StorageMode::Timeseries)
        .then_some(settings.bucket.window.as_millis() as i64)
}

/// The storage mode.
pub(crate) enum Mode {
    Buckets(Buckets),
    Timeseries(Timeseries),
}

/// The configured storage mode on one database.
pub struct Store {
    mode: Mode,
    mongo: Mongo,
    deadletters: String,
    deadletter_expire_after: Option<std::time::Duration>,
    schema_ready: bool,
    /// The spool whose samples this store writes (its dead letters' ids).
    tags: Tags,
    /// `<collection>_spools`: a document per spool id (the settle write).
    spools: String,
    rollups: Option<rollup::Rollups>,
    /// `<collection>_latest` (`[latest] enabled`).
    latest: Option<latest::Latest>,
    /// The checkpoints published at the start of the closer run whose seal
    /// is in chunks, until its last.
    sealing: Option<std::collections::HashMap<String, u64>>,
}

impl Store {
    pub fn new(settings: &Settings, db: Database) -> Store {
        let mode = match settings.storage.mode {
            StorageMode::Buckets => Mode::Buckets(Buckets::new(settings)),
            StorageMode::Timeseries => Mode::Timeseries(Timeseries::new(settings)),
        };
        Store {
            mode,
            mongo: Mongo::new(db, &settings.mongodb)
                .with_fence_file(settings.spool.dir.join("write-fence")),
            deadletters: settings.mongodb.deadletter_collection(),
            deadletter_expire_after: settings.retention.deadletter_expire_after,
            schema_ready: false,
            tags: Tags::new(0),
            spools: format!("{}_spools", settings.mongodb.collection),
            rollups: rollup::Rollups::new(settings),
            latest: settings
                .latest
                .enabled
                .then(|| latest::Latest::new(settings.mongodb.latest_collection())),
            sealing: None,
        }
    }

    /// Reports database attempts and retry waits to `health` (the
    /// watchdog tells a retrying flush from a stuck one).
    pub(crate) fn observe(&mut self, health: Arc<crate::telemetry::Health>) {
        self.mongo.observe(health);
    }

    /// The spool whose samples this store writes and resolves (its id
    /// tells its statements from other instances' in a bucket).
    pub(crate) fn set_spool(&mut self, tags: Tags) {
        self.tags = tags.clone();
        match &mut self.mode {
            Mode::Buckets(b) => b.set_spool(tags),
            Mode::Timeseries(t) => t.set_spool(tags),
        }
    }

    /// Runs the rollup passes on a task of their own on `tracker`, until
    /// `done` or `abort` (see [`rollup::Rollups::start_passes`]).
    pub(crate) fn start_rollups(
        &mut self,
        tracker: &tokio_util::task::TaskTracker,
        tokens: [CancellationToken; 2],
    ) {
        let db = self.mongo.db.clone();
        if let Some(r) = &mut self.rollups {
            r.start_passes(db, tracker, tokens);
        }
    }

    /// One attempt at setting up the schema (idempotent); true once it is
    /// in place. A failure is logged like an outage.
    pub async fn try_ensure_schema(&mut self) -> bool {
        if self.schema_ready {
            return true;
        }
        let db = self.mongo.db.clone();
        let mode = match &self.mode {
            Mode::Buckets(m) => m.schema(&db).await,
            Mode::Timeseries(m) => m.schema(&db).await,
        };
        let mode = match (mode, &self.rollups) {
            (Ok(()), Some(r)) => r.schema(&db).await.map_err(SchemaError::from),
            (other, _) => other,
        };
        let mode = match (mode, &self.latest) {
            (Ok(()), Some(l)) => l.schema(&db).await.map_err(SchemaError::from),
            (other, _) => other,
        };
        let result = match mode {
            Ok(()) => mongo::sync_ttl(
                &db,
                &self.deadletters,
                "receivedAt",
                mongo::DEADLETTER_TTL_INDEX,
                self.deadletter_expire_after,
            )
            .await
            .map_err(SchemaError::from),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                self.mongo.recovered();
                info!(collection = %self.collection(), "Indexes are in place.");
                self.schema_ready = true;
            }
            Err(SchemaError::Database(e)) => self.mongo.failed("create indexes", &e),
            Err(e) => self
                .mongo
                .failed_msg("set up the collection", &e.to_string()),
        }
        self.schema_ready
    }

    /// Sets up the schema, retrying until it is in place.
    pub(crate) async fn ensure_schema(&mut self, abort: &CancellationToken) -> Result<(), Aborted> {
        let mut backoff = Backoff::default();
        while !self.try_ensure_schema().await {
            self.mongo.wait(&mut backoff, abort).await?;
        }
        Ok(())
    }

    fn collection(&self) -> &str {
        match &self.mode {
            Mode::Buckets(m) => &m.collection,
            Mode::Timeseries(m) => &m.collection,
        }
    }

    /// Learns which of these samples are in MongoDB, retrying until the
    /// database answers: stored by the mode's rule, or refused for good and
    /// dead-lettered (a refused statement dead-letters all its samples, and
    /// a replay must not store one whose dead letter is written).
    pub(crate) async fn resolve(
        &mut self,
        req: &[Resolve],
        abort: &CancellationToken,
    ) -> Result<Resolution, Aborted> {
        let failures = self.mongo.failures();
        self.ensure_schema(abort).await?;
        // An interrupted write still running would answer wrongly.
        self.mongo.wait_for_fence(abort).await?;
        let spool = format!("s{:08x}", self.tags.current());
        self.mongo.settle(&self.spools, &spool, abort).await?;
        let mut out = match &self.mode {
            Mode::Buckets(m) => m.resolve(&mut self.mongo, req, abort).await?,
            Mode::Timeseries(m) => m.resolve(&mut self.mongo, req, abort).await?,
        };
        if let Mode::Buckets(_) = &self.mode {
            // Below its id's published checkpoint a sample is in, though a
            // seal may have removed its LSN pair (a spool restored from a
            // backup, or copied to another box, replays records an earlier
            // run wrote and confirmed).
            let coll = self.spools.clone();
            let published = self
                .mongo
                .read_retrying("read published checkpoints", abort, |db, concern| {
                    mongo::published_checkpoints(db.collection(&coll), concern)
                })
                .await?;
            let samples = req.iter().flat_map(|r| r.samples.iter().map(|s| s.0));
            for lsn in samples {
                let id = format!("s{:08x}", self.tags.of(lsn));
                if published.get(&id).is_some_and(|&c| lsn < c) {
                    out.applied.insert(lsn);
                }
            }
        }
        let lsns = || req.iter().flat_map(|r| r.samples.iter().map(|s| s.0));
        if let (Some(lo), Some(hi)) = (lsns().min(), lsns().max()) {
            // One range scan of `_id` per spool id the range was written under.
            for (tag, lo, hi) in self.tags.split(lo, hi) {
                let coll = self.deadletters.clone();
                let dead = self
                    .mongo
                    .read_retrying("read dead letters", abort, |db, concern| {
                        mongo::deadletter_lsns(db.collection(&coll), concern, tag, lo, hi)
                    })
                    .await?;
                out.applied.extend(lsns().filter(|l| dead.contains(l)));
            }
        }
        out.met_errors = self.mongo.failures() != failures;
        Ok(out)
    }

    /// Writes a flush: its dead letters, its sensors' latest values, then
    /// its samples, setting each sample's outcome. Retries what certainly
    /// was not applied until it is; returns when every sample is applied,
    /// rejected, or of unknown fate.
    pub(crate) async fn write(
        &mut self,
        batch: &mut Batch,
        abort: &CancellationToken,
    ) -> Result<Written, Aborted> {
        let failures = self.mongo.failures();
        self.ensure_schema(abort).await?;
        self.mongo
            .insert_deadletters(&self.deadletters, &batch.deadletters, abort)
            .await?;
        let began_ms = crate::clock::now_ms();
        let keys = match &mut self.rollups {
            Some(r) => {
                r.before_write(&mut self.mongo, batch, began_ms, abort)
                    .await?
            }
            None => Vec::new(),
        };
        if let Some(l) = &self.latest {
            l.write(&mut self.mongo, batch, abort).await?;
        }
        let mut written = match &mut self.mode {
            Mode::Buckets(m) => m.write(&mut self.mongo, batch, abort).await?,
            Mode::Timeseries(m) => m.write(&mut self.mongo, batch, abort).await?,
        };
        if let Some(r) = &mut self.rollups {
            let now_ms = crate::clock::now_ms();
            r.after_write(&mut self.mongo, &keys, began_ms, now_ms, abort)
                .await?;
        }
        written.met_errors |= self.mongo.failures() != failures;
        Ok(written)
    }

    /// What to say when a write whose reply was lost turns out to have
    /// been applied (in part).
    pub(crate) fn interrupted_and_applied(&self) -> &'static str {
        match &self.mode {
            Mode::Buckets(_) => "An interrupted write had been applied; not sending it again.",
            Mode::Timeseries(_) => {
                "An interrupted insert had been applied in part; not sending those again."
            }
        }
    }

    /// One step of a closer run at `now_ms` (after one attempt at the
    /// schema, which the seal's index hint needs). The run's `first` step
    /// publishes `checkpoint` (bucket mode: every record of the spool below
    /// it is in MongoDB, as the pipeline's last checkpoint says, stored by
    /// the spool yet or not); each step seals a chunk of what is over
    /// (dropping the LSN pairs every spool's published checkpoint has
    /// passed, as published at the run's start); the last one, which finds
    /// nothing more to seal, wakes the rollups that are due.
    pub async fn seal(
        &mut self,
        now_ms: i64,
        checkpoint: u64,
        first: bool,
    ) -> Result<Sealed, String> {
        if !self.try_ensure_schema().await {
            return Err("the schema is not in place".into());
        }
        let db = self.mongo.db.clone();
        let concern = &self.mongo.concern;
        let sealed = match &mut self.mode {
            Mode::Buckets(m) => {
                let published = match self.sealing.take() {
                    Some(p) if !first => p,
                    _ => publish_checkpoint(&db, concern, &self.spools, &self.tags, checkpoint)
                        .await
                        .map_err(|e| e.to_string())?,
                };
                let sealed = m
                    .seal(&db, now_ms, &published)
                    .await
                    .map_err(|e| e.to_string())?;
                if sealed.more {
                    self.sealing = Some(published);
                }
                sealed
            }
            Mode::Timeseries(_) => Sealed::default(),
        };
        if !sealed.more {
            if let Some(r) = &mut self.rollups {
                r.closer_ran(&db, now_ms).await;
            }
        }
        Ok(sealed)
    }

    /// A sensor's rollups of interval `name` (`1h`, ...).
    pub async fn rollups(
        &self,
        name: &str,
        sensor: &str,
        range: Range,
    ) -> read::Result<Vec<rollup::RollupRow>> {
        let coll = format!("{}_{name}", self.collection());
        rollup::read_rollups(&self.mongo.db, &coll, sensor, range, None).await
    }

    /// The rollup a series of steps of `step_ms` is read from: of those
    /// whose interval divides the step, the longest.
    pub(crate) fn rollup_for(&self, step_ms: i64) -> Option<&RollupSettings> {
        self.rollups
            .as_ref()?
            .specs()
            .iter()
            .filter(|s| step_ms % s.interval_ms() == 0)
            .max_by_key(|s| s.interval_ms())
    }

    /// A sensor's settled rollups of `spec` over `range` (whole
    /// intervals), at most `max` ([`rollup::settled`]).
    pub(crate) async fn settled_rollups(
        &self,
        spec: &RollupSettings,
        sensor: &str,
        range: (i64, i64),
        max: u64,
    ) -> read::Result<Vec<rollup::RollupRow>> {
        rollup::settled(&self.mongo.db, self.collection(), spec, sensor, range, max).await
    }

    /// Windows ending at or before this are sealed by a seal at `now_ms`.
    pub(crate) fn seal_cutoff(&self, now_ms: i64) -> Option<i64> {
        self.seal_grace()
            .map(|grace| now_ms - grace.as_millis() as i64)
    }

    /// How long after its end a window is sealed; `None` when the mode has
    /// no seal.
    pub(crate) fn seal_grace(&self) -> Option<std::time::Duration> {
        match &self.mode {
            Mode::Buckets(m) => Some(m.grace()),
            Mode::Timeseries(_) => None,
        }
    }

    /// One sensor's readings in time order, streamed to `emit`.
    pub(crate) async fn readings(
        &self,
        sensor: &str,
        range: Range,
        emit: impl FnMut(i64, Fields) -> std::io::Result<()>,
    ) -> read::Result<u64> {
        let db = &self.mongo.db;
        match &self.mode {
            Mode::Buckets(m) => m.readings(db, sensor, range, emit).await,
            Mode::Timeseries(m) => m.readings(db, sensor, range, emit).await,
        }
    }

    /// Per-window rollups of one sensor.
    pub async fn window_stats(&self, sensor: &str, range: Range) -> read::Result<Vec<WindowStats>> {
        self.window_stats_within(sensor, range, None).await
    }

    /// Per-window rollups of one sensor from at most `max` stored
    /// documents (buckets, or time series documents), else
    /// [`read::QueryError::TooMuch`].
    pub(crate) async fn window_stats_within(
        &self,
        sensor: &str,
        range: Range,
        max: Option<u64>,
    ) -> read::Result<Vec<WindowStats>> {
        let db = &self.mongo.db;
        match &self.mode {
            Mode::Buckets(m) => m.window_stats(db, sensor, range, max).await,
            Mode::Timeseries(m) => m.window_stats(db, sensor, range, max).await,
        }
    }

    /// How much is stored.
    pub async fn summary(&self) -> read::Result<Summary> {
        let db = &self.mongo.db;
        let mut s = match &self.mode {
            Mode::Buckets(m) => m.summary(db).await?,
            Mode::Timeseries(m) => m.summary(db).await?,
        };
        s.dead_letters = db
            .collection::<bson::Document>(&self.deadletters)
            .estimated_document_count()
            .await?;
        Ok(s)
    }

    /// Each sensor's latest value (`<collection>_latest`), or `sensor`'s;
    /// the first `limit` by id.
    pub(crate) async fn latest(
        &self,
        sensor: Option<&str>,
        limit: Option<u64>,
        emit: impl FnMut(&str, i64, &bson::Document, i64) -> std::io::Result<()>,
    ) -> read::Result<u64> {
        let Some(l) = &self.latest else {
            return Err(read::QueryError::Unsupported(
                "[latest] enabled = false: palletd keeps no latest values".into(),
            ));
        };
        latest::read(&self.mongo.db, l.collection(), sensor, limit, emit).await
    }

    /// The first `limit` sensors of `<collection>_latest` by id.
    pub(crate) async fn sensor_ids(&self, limit: u64) -> read::Result<Vec<String>> {
        let Some(l) = &self.latest else {
            return Ok(Vec::new());
        };
        latest::ids(&self.mongo.db, l.collection(), limit).await
    }

    /// The raw documents palletd wrote (bucket mode only).
    pub async fn print_raw(
        &self,
        sensor: Option<&str>,
        limit: i64,
        out: &mut dyn Write,
    ) -> read::Result<()> {
        match &self.mode {
            Mode::Buckets(m) => m.print_raw(&self.mongo.db, sensor, limit, out).await,
            Mode::Timeseries(_) => Err(read::QueryError::Unsupported(
                "--buckets shows palletd's bucket documents; with storage.mode = \"timeseries\" the server keeps its own buckets".into(),
            )),
        }
    }
}

/// Publishes `checkpoint` (every record of the spool below it is in
/// MongoDB) on the `<collection>_spools` document of the spool's current
/// id, never lowering it; returns what every spool published, by `lsns`
/// field name. Only the current id: an earlier one (the spool was copied
/// from another box) is the original's too, whose records above the copy
/// this spool knows nothing of, so their pairs stay. A spool that stops
/// publishing keeps its pairs in the buckets sealed from then on; nothing
/// else waits for it.
async fn publish_checkpoint(
    db: &Database,
    concern: &bson::Document,
    spools: &str,
    tags: &Tags,
    checkpoint: u64,
) -> mongodb::error::Result<std::collections::HashMap<String, u64>> {
    let updates = vec![bson::doc! {
        "q": { "_id": format!("s{:08x}", tags.current()) },
        "u": { "$max": { "checkpoint": checkpoint as i64 } },
        "upsert": true,
    }];
    let what = "publish the spool's checkpoint";
    let cmd = bson::doc! {
        "update": spools,
        "updates": updates,
        "ordered": false,
    };
    statements::send_once(db, concern, cmd, what)
        .await?
        .refusal(what)?;
    mongo::published_checkpoints(db.collection(spools), None).await
}
