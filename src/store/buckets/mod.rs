//! `storage.mode = "buckets"`: palletd's bucket documents, one per sensor
//! and window with rollups (see [`crate::bucket`] for the document and its
//! statements).
//!
//! - **Schema**: `{sensorId, startTs}` (range reads and exactly once),
//!   `{closed, endTs}` (the closer), and the `endTs` TTL index that follows
//!   `retention.expire_after`.
//! - **Write**: one ordered `update` command per flush (split only at the
//!   server's limits), one upsert per run of a sensor's consecutive samples
//!   in one window, addressed by the bucket's `_id` ([`bucket::bucket_id`](crate::bucket::bucket_id));
//!   an E11000 on it (the bucket is full or sealed) sends the statement to
//!   the window's next bucket. Before planning, the newest bucket of each
//!   window palletd has no memory of is learned with bounded lookups, so a
//!   restart continues a half-full bucket; a sensor whose lookups keep
//!   finding nothing is not asked about its new windows
//!   ([`bucket::QUIET_LOOKUPS`](crate::bucket::QUIET_LOOKUPS)).
//! - **What a replay already applied**: every statement pushes its first
//!   and last LSN onto the bucket's `lsns.<spool>` ([`bucket::lsns_field`](crate::bucket::lsns_field)),
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

use bson::{doc, Bson, Document};
use mongodb::{Collection, Database, IndexModel};

use super::mongo;
use super::read;
use super::SchemaError;
use crate::bucket::Shape;
use crate::config::Settings;
use crate::spool_ids::Tags;

mod applied;
mod read_back;
mod seal;
mod write;

/// Name of the TTL index on the buckets' `endTs`.
pub(crate) const TTL_INDEX: &str = "endTs_ttl";

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
pub(crate) const SEAL_CHUNK: usize = 100;
pub(crate) const SEAL_CHUNK_MIN: usize = 10;
pub(crate) const SEAL_CHUNK_MAX: usize = 1000;
pub(crate) const SEAL_CHUNK_TIME: std::time::Duration = std::time::Duration::from_millis(250);

/// Full buckets whose `_id`s are held for an early seal; beyond, a full
/// bucket waits for its window's end like the others (8 MB of ids at most).
pub(crate) const FULL_HELD: usize = 100_000;

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
    /// The configured write concern, which the seal carries
    /// ([`mongo::write_concern`]).
    concern: Document,
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
            concern: mongo::write_concern(&settings.mongodb),
        }
    }

    /// The spool whose samples this store writes and resolves.
    pub(crate) fn set_spool(&mut self, tags: Tags) {
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

    /// Buckets whose `endTs` is at or before this are sealed at `now_ms`.
    pub(crate) fn cutoff(&self, now_ms: i64) -> i64 {
        now_ms - self.grace_ms
    }

    /// How long after its end a window is sealed (`closer.grace`).
    pub(crate) fn grace(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.grace_ms.max(0) as u64)
    }
}

/// The flat view's pipeline: each sample of each bucket as a document of
/// its own, with its bucket's sensor.
pub(crate) fn flat_pipeline() -> Vec<Document> {
    vec![
        doc! { "$unwind": "$samples" },
        doc! { "$replaceWith": { "$mergeObjects": [{ "sensorId": "$sensorId" }, "$samples"] } },
    ]
}
