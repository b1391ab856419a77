//! MongoDB plumbing every storage mode shares: building and running a write
//! command with the configured write concern, reading its reply, deciding
//! what a failure means ([`decide`]), retrying reads, logging an outage
//! once, writing dead letters, and the retention (TTL) indexes. How each
//! write is sent again and what its partial success means is
//! [`super::statements`]'s.
//!
//! [`decide`] is the one place that decides what is retriable; every
//! write's failure goes through it ([`Failure`] -> [`Decision`]):
//! - **Retry**: nothing was applied (no server selected, DNS,
//!   authentication, TLS; a primary that refused the command because it
//!   is no longer primary: `NotWritablePrimary`, `NotPrimaryNoSecondaryOk`,
//!   `NotPrimaryOrSecondary`): the same command again after a backoff.
//! - **Retry part** ([`Decision::Resolve`]): any part may have been
//!   applied (the connection broke, any other command error such as a
//!   stepdown while it ran or `MaxTimeMSExpired`, a write concern error):
//!   palletd waits out the write's time limit (`mongodb.write_time_limit`:
//!   the server may still be running it), learns what MongoDB has, and
//!   sends the rest. A statement refused with a transient code
//!   ([`TRANSIENT_CODES`]) is sent again from it after a backoff
//!   ([`Decision::RetryStatement`]); a bucket upsert whose `_id` is taken
//!   (E11000 on `_id`: the bucket is full or sealed beyond what palletd
//!   knew) goes to the window's next bucket at once
//!   ([`Decision::NextBucket`]).
//! - **Give up** ([`Decision::GiveUp`]): a statement refused with any
//!   other code, or E11000 on another unique index (one an operator added:
//!   it would refuse the reading again for ever): its readings go to the
//!   dead letter with the server's message.
//!
//! Outages are logged once (ERROR: data waits) and once on recovery (INFO).

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, rawdoc, Document, RawArrayBuf, RawDocumentBuf};
use futures_util::TryStreamExt;
use mongodb::error::ErrorKind;
use mongodb::options::{IndexOptions, ReadConcern};
use mongodb::{Database, IndexModel};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use super::fence::FenceFile;
use super::statements::{Ids, Lost, Unordered};
use crate::config::{MongoSettings, WriteConcern};
use crate::deadletter::DeadLetter;
use crate::retry::{Aborted, Backoff};
use crate::telemetry::{self, Health};

/// The server's limit on statements per write command.
const MAX_BATCH_STATEMENTS: usize = 100_000;
/// Stay under the 16 MiB command size with room for the envelope.
const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024 - 64 * 1024;

/// Server error codes after which the same statement may simply be sent
/// again (a write error; as a command's error they mean "retry part").
pub(crate) const TRANSIENT_CODES: &[i32] = &[
    6, 7, 24, 46, 50, 89, 91, 112, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
];

/// Command errors a server gives before it runs the command: it is not
/// (or no longer) the primary. Nothing of the command was applied.
pub(crate) const NOT_PRIMARY_CODES: &[i32] = &[10107, 13435, 13436];

/// E11000.
pub(crate) const DUPLICATE_KEY: i32 = 11000;

/// Beyond `mongodb.write_time_limit`: the server checks the limit between
/// statements, and clocks tick apart.
pub(crate) const FENCE_MARGIN: Duration = Duration::from_secs(1);

/// What a failed write command means for what to do next (the whole
/// command's part of [`Decision`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryAction {
    /// Nothing was applied: send the same command again after a backoff.
    Retry,
    /// Any part of it may have been applied: learn what MongoDB has before
    /// sending any of it again.
    Ambiguous,
}

/// A write's failure, as [`decide`] reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Failure<'a> {
    /// The whole command failed (the driver's error).
    Command(&'a mongodb::error::Error),
    /// The command was answered with a `writeConcernError`.
    WriteConcern,
    /// One statement was refused; `by_id`: it upserts a document by its
    /// `_id` (a bucket), so a duplicate `_id` means that document exists.
    Statement { error: &'a WriteError, by_id: bool },
}

/// What palletd does about a [`Failure`] (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Nothing was applied: the same command again after a backoff.
    Retry,
    /// Any part may have been applied: wait out the write's time limit,
    /// learn what MongoDB has, send the rest.
    Resolve,
    /// This statement (and those after it) again after a backoff.
    RetryStatement,
    /// This statement into the window's next bucket, at once.
    NextBucket,
    /// This statement's readings to the dead letter.
    GiveUp,
}

/// The one retry decision.
pub(crate) fn decide(failure: Failure<'_>) -> Decision {
    match failure {
        Failure::Command(e) => match &*e.kind {
            // The command never left palletd.
            ErrorKind::ServerSelection { .. }
            | ErrorKind::DnsResolve { .. }
            | ErrorKind::Authentication { .. }
            | ErrorKind::InvalidTlsConfig { .. }
            | ErrorKind::InvalidArgument { .. } => Decision::Retry,
            // Refused before it ran: not the primary.
            ErrorKind::Command(c) if NOT_PRIMARY_CODES.contains(&c.code) => Decision::Retry,
            _ => Decision::Resolve,
        },
        Failure::WriteConcern => Decision::Resolve,
        Failure::Statement { error, by_id } => match error.code {
            DUPLICATE_KEY if by_id && error.duplicate_on_id => Decision::NextBucket,
            DUPLICATE_KEY => Decision::GiveUp,
            code if TRANSIENT_CODES.contains(&code) => Decision::RetryStatement,
            _ => Decision::GiveUp,
        },
    }
}

/// Whether the server refused a command for good (a read it will refuse
/// again: a command error whose code is not transient), rather than the
/// link or a failing or stepping-down server.
pub(crate) fn refused(e: &mongodb::error::Error) -> bool {
    matches!(&*e.kind, ErrorKind::Command(c) if !TRANSIENT_CODES.contains(&c.code))
}

/// What a whole-command failure (the driver's error, or a write concern
/// error) means for the command.
pub(crate) fn classify(failure: Failure<'_>) -> RetryAction {
    match decide(failure) {
        Decision::Retry => RetryAction::Retry,
        _ => RetryAction::Ambiguous,
    }
}

/// What a statement's write error means ([`decide`]).
pub(crate) fn statement_error(error: &WriteError, by_id: bool) -> Decision {
    decide(Failure::Statement { error, by_id })
}

impl Decision {
    /// The `kind` of `palletd_database_errors_total` a statement error of
    /// this decision counts under.
    pub(crate) fn statement_label(self) -> &'static str {
        match self {
            Decision::GiveUp => "statement_rejected",
            _ => "statement_transient",
        }
    }
}

/// The server's error code of a failed command, if it is one.
pub(crate) fn command_code(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

/// A bounded label for a driver error, for logs and metrics (one of
/// [`crate::telemetry::DATABASE_ERROR_KINDS`]).
pub(crate) fn error_kind(e: &mongodb::error::Error) -> &'static str {
    match &*e.kind {
        ErrorKind::Io(_) => "network",
        ErrorKind::ServerSelection { .. } => "server_selection",
        ErrorKind::ConnectionPoolCleared { .. } => "pool_cleared",
        ErrorKind::Authentication { .. } => "authentication",
        ErrorKind::Command(_) => "command",
        ErrorKind::Write(_) => "write",
        ErrorKind::DnsResolve { .. } => "dns",
        ErrorKind::InvalidTlsConfig { .. } => "tls_config",
        _ => "other",
    }
}

/// One statement's write error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriteError {
    pub index: usize,
    pub code: i32,
    pub msg: String,
    /// For E11000: the duplicate is on `_id` (`keyPattern` says so, or
    /// the message names the `_id_` index, or neither names another).
    pub duplicate_on_id: bool,
}

impl WriteError {
    fn parse(e: &Document) -> Option<WriteError> {
        let index = e.get("index").and_then(as_usize)?;
        let code = e.get("code").and_then(|c| c.as_i32()).unwrap_or(-1);
        let msg = e.get_str("errmsg").unwrap_or("").to_string();
        let duplicate_on_id = match e.get_document("keyPattern") {
            Ok(pattern) => pattern.keys().eq(["_id"]),
            Err(_) => match msg.split(" index: ").nth(1) {
                Some(rest) => rest.starts_with("_id_ "),
                None => true,
            },
        };
        Some(WriteError {
            index,
            code,
            msg,
            duplicate_on_id,
        })
    }
}

/// The parts of a write command's reply that matter here.
#[derive(Debug, Default)]
pub(crate) struct Reply {
    /// Indexes of the statements whose upsert inserted a document.
    pub upserted: Vec<usize>,
    /// Documents the command changed (`nModified` of an update).
    pub modified: u64,
    /// By index.
    pub write_errors: Vec<WriteError>,
    pub write_concern_error: Option<String>,
}

impl Reply {
    pub fn parse(reply: &Document) -> Reply {
        let mut out = Reply {
            modified: reply.get("nModified").and_then(as_u64).unwrap_or(0),
            ..Reply::default()
        };
        if let Ok(ups) = reply.get_array("upserted") {
            out.upserted = ups
                .iter()
                .filter_map(|u| u.as_document()?.get("index").and_then(as_usize))
                .collect();
        }
        if let Ok(errs) = reply.get_array("writeErrors") {
            out.write_errors = errs
                .iter()
                .filter_map(|e| WriteError::parse(e.as_document()?))
                .collect();
            out.write_errors.sort_by_key(|e| e.index);
        }
        if let Ok(wce) = reply.get_document("writeConcernError") {
            out.write_concern_error = Some(format!(
                "write concern error (code {}): {}",
                wce.get("code").and_then(|c| c.as_i32()).unwrap_or(-1),
                wce.get_str("errmsg").unwrap_or("")
            ));
        }
        out
    }
}

/// A message for a permanently rejected statement.
pub(crate) fn rejection(code: i32, msg: &str) -> String {
    format!("rejected by the database (code {code}): {msg}")
}

/// Counts a statement error by what it was decided to mean.
pub(crate) fn count_statement_error(decision: Decision) {
    metrics::counter!(telemetry::DATABASE_ERRORS, "kind" => decision.statement_label())
        .increment(1);
}

pub(crate) fn as_u64(b: &bson::Bson) -> Option<u64> {
    match b {
        bson::Bson::Int32(i) => u64::try_from(*i).ok(),
        bson::Bson::Int64(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

fn as_usize(b: &bson::Bson) -> Option<usize> {
    as_u64(b).and_then(|n| usize::try_from(n).ok())
}

/// Takes a prefix of documents that fits one command; returns its length.
/// Always takes at least one, so a single large document still goes out.
pub(crate) fn build_batch(docs: impl Iterator<Item = RawDocumentBuf>) -> (usize, RawArrayBuf) {
    let mut arr = RawArrayBuf::new();
    let mut n = 0;
    let mut bytes = 0;
    for d in docs {
        let len = d.as_bytes().len() + 8;
        if n > 0 && (n >= MAX_BATCH_STATEMENTS || bytes + len > MAX_BATCH_BYTES) {
            break;
        }
        bytes += len;
        n += 1;
        arr.push(d);
    }
    (n, arr)
}

/// The database with the configured write concern, and what palletd knows
/// of its state (is it failing, since when).
pub(crate) struct Mongo {
    pub db: Database,
    write_concern: RawDocumentBuf,
    /// The same, for the commands sent once ([`super::statements::send_once`]).
    pub concern: Document,
    /// Writes wait for a majority: reads that decide what an ambiguous
    /// write did read at majority too ([`Mongo::read_retrying`]).
    majority: bool,
    outage: Option<Instant>,
    /// Failed database calls so far.
    failures: u64,
    /// Where attempts and retry waits are reported (the watchdog reads it).
    health: Option<Arc<Health>>,
    /// The settle write was refused (logged once).
    settle_refused: bool,
    /// Every write command's `maxTimeMS` (`mongodb.write_time_limit`).
    time_limit: Duration,
    /// Until then a write palletd lost sight of may still be running on the
    /// server ([`Mongo::wait_for_fence`]).
    fence: Instant,
    /// Where the fence outlives a crash ([`super::fence`]).
    fence_file: Option<Arc<std::sync::Mutex<FenceFile>>>,
}

/// The configured write concern (`mongodb.write_concern`,
/// `mongodb.journal`): every write palletd sends carries it.
pub(crate) fn write_concern(settings: &MongoSettings) -> Document {
    let w = match settings.write_concern {
        WriteConcern::Majority => bson::Bson::String("majority".into()),
        WriteConcern::Nodes(n) => bson::Bson::Int32(n as i32),
    };
    doc! { "w": w, "j": settings.journal }
}

impl Mongo {
    pub fn new(db: Database, settings: &MongoSettings) -> Mongo {
        let concern = write_concern(settings);
        Mongo {
            db,
            write_concern: RawDocumentBuf::from_document(&concern).expect("a write concern"),
            concern,
            majority: settings.write_concern == WriteConcern::Majority,
            outage: None,
            failures: 0,
            health: None,
            settle_refused: false,
            time_limit: settings.write_time_limit,
            // A write of an earlier run, killed before its reply, may still
            // be running.
            fence: Instant::now() + settings.write_time_limit + FENCE_MARGIN,
            fence_file: None,
        }
    }

    /// Keeps the fence in `path` too: the wait at this start ends when the
    /// file says the run before's writes have ended, and every write is
    /// covered by it before it is sent.
    pub(crate) fn with_fence_file(mut self, path: std::path::PathBuf) -> Mongo {
        let file = FenceFile::open(path);
        if let Some(until) = file.stored() {
            let left = until.saturating_sub(crate::clock::now_ms()).max(0) as u64;
            self.fence = self.fence.min(Instant::now() + Duration::from_millis(left));
        }
        self.fence_file = Some(Arc::new(std::sync::Mutex::new(file)));
        self
    }

    /// Before a write is sent: the fence file covers its end (written and
    /// fsynced off the async threads, about once per [`super::fence::SLACK_MS`]
    /// of writing). If the file cannot be written the write goes on, and
    /// the file, no longer moved, is removed: the next start waits the
    /// whole limit.
    async fn cover(&self) {
        let Some(file) = &self.fence_file else { return };
        let end = crate::clock::now_ms() + (self.time_limit + FENCE_MARGIN).as_millis() as i64;
        let needs = file.lock().is_ok_and(|f| f.needs(end));
        if !needs {
            return;
        }
        let file = file.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
            f.cover(end).inspect_err(|_| f.forget())
        })
        .await;
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "Could not write the spool's write-fence file; the next start waits mongodb.write_time_limit before reading what a write applied.");
        }
    }

    /// Waits until no write palletd lost sight of (sent before a crash of
    /// an earlier run, or whose reply never came) can still be running on
    /// the server: the server cuts every write off after its `maxTimeMS`
    /// (`mongodb.write_time_limit`). Reads that decide what such a write
    /// applied come after this; else the server could apply a statement of
    /// it after the read said it was not, and palletd would write it again.
    pub(crate) async fn wait_for_fence(&self, abort: &CancellationToken) -> Result<(), Aborted> {
        let left = self.fence.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        tracing::info!(
            wait = ?left,
            "Waiting for any interrupted write to end on the server (mongodb.write_time_limit) before reading what it applied."
        );
        tokio::select! {
            _ = tokio::time::sleep(left) => Ok(()),
            _ = abort.cancelled() => Err(Aborted),
        }
    }

    /// A write's reply did not come: it may run on for its time limit.
    fn lost_sight(&mut self) {
        self.fence = self
            .fence
            .max(Instant::now() + self.time_limit + FENCE_MARGIN);
    }

    /// Reports attempts and retry waits to `health`.
    pub(crate) fn observe(&mut self, health: Arc<Health>) {
        self.health = Some(health);
    }

    /// Waits the next backoff delay, telling the watchdog when the next
    /// attempt is due (a retry that waits is progress, not a hang); cut
    /// short when the readiness probe finds the database back.
    pub(crate) async fn wait(
        &self,
        backoff: &mut Backoff,
        abort: &CancellationToken,
    ) -> Result<(), Aborted> {
        let delay = backoff.next_delay();
        if let Some(h) = &self.health {
            h.db_retry_in(delay);
        }
        let back = async {
            match &self.health {
                Some(h) => h.database_back().await,
                None => std::future::pending().await,
            }
        };
        let waited = tokio::select! {
            _ = tokio::time::sleep(delay) => Ok(()),
            _ = back => Ok(()),
            _ = abort.cancelled() => {
                tracing::warn!("Shutdown deadline reached while retrying a database call.");
                Err(Aborted)
            }
        };
        if let Some(h) = &self.health {
            h.db_retried();
        }
        waited
    }

    /// Runs one database call, telling the watchdog while it is in progress.
    async fn attempt<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        if let Some(h) = &self.health {
            h.db_attempt(true);
        }
        let out = call.await;
        if let Some(h) = &self.health {
            h.db_attempt(false);
        }
        out
    }

    /// Failed database calls so far.
    pub(crate) fn failures(&self) -> u64 {
        self.failures
    }

    /// `{<name>: <collection>, <field>: batch, ordered, writeConcern}`.
    pub(crate) fn command(
        &self,
        name: &str,
        collection: &str,
        field: &str,
        batch: RawArrayBuf,
        ordered: bool,
    ) -> RawDocumentBuf {
        let mut cmd = rawdoc! { name: collection };
        cmd.append(field, batch);
        cmd.append("ordered", ordered);
        cmd.append("writeConcern", self.write_concern.clone());
        cmd.append("maxTimeMS", self.time_limit.as_millis() as i64);
        cmd
    }

    /// Sends a write command. A failure (logged) says what it means for
    /// the statements: a write concern error counts as ambiguous.
    pub(crate) async fn write(
        &mut self,
        cmd: RawDocumentBuf,
        what: &str,
    ) -> Result<Reply, RetryAction> {
        self.cover().await;
        match self
            .attempt(self.db.run_raw_command(cmd).into_future())
            .await
        {
            Ok(r) => {
                let reply = Reply::parse(&r);
                if let Some(wce) = &reply.write_concern_error {
                    metrics::counter!(telemetry::DATABASE_ERRORS, "kind" => "write_concern")
                        .increment(1);
                    self.failed_msg(what, wce);
                    let action = classify(Failure::WriteConcern);
                    if action == RetryAction::Ambiguous {
                        self.lost_sight();
                    }
                    return Err(action);
                }
                self.recovered();
                Ok(reply)
            }
            Err(e) => {
                self.failed(what, &e);
                let action = classify(Failure::Command(&e));
                if action == RetryAction::Ambiguous {
                    self.lost_sight();
                }
                Err(action)
            }
        }
    }

    /// `build_batch` of `docs` as a `name` command on `collection`: (the
    /// documents it holds, the command).
    pub(crate) fn batch_command(
        &self,
        name: &str,
        collection: &str,
        field: &str,
        docs: impl Iterator<Item = RawDocumentBuf>,
        ordered: bool,
    ) -> (usize, RawDocumentBuf) {
        let (len, batch) = build_batch(docs);
        (len, self.command(name, collection, field, batch, ordered))
    }

    /// Runs a read that decides what was applied, until it answers, with
    /// backoff; logged like a write. `read` gets the read concern to use:
    /// after majority writes, majority (a write the primary applied and an
    /// election then rolls back must not look applied); else the server's
    /// default.
    pub(crate) async fn read_retrying<T, F>(
        &mut self,
        what: &str,
        abort: &CancellationToken,
        mut read: impl FnMut(Database, Option<ReadConcern>) -> F,
    ) -> Result<T, Aborted>
    where
        F: std::future::Future<Output = mongodb::error::Result<T>>,
    {
        let concern = self.majority.then(ReadConcern::majority);
        let mut backoff = Backoff::default();
        loop {
            match self.attempt(read(self.db.clone(), concern.clone())).await {
                Ok(m) => {
                    self.recovered();
                    return Ok(m);
                }
                Err(e) => {
                    self.failed(what, &e);
                    self.wait(&mut backoff, abort).await?;
                }
            }
        }
    }

    /// Before reads that decide whether ambiguous writes were applied, with
    /// majority writes: a majority write of its own (`settledAt` of this
    /// spool's document in `collection`). Once it is acknowledged, every
    /// write this primary applied before it is majority-committed, and one
    /// an old primary applied and never replicated will be rolled back: a
    /// majority read then sees each write's final fate, neither a write
    /// still replicating as missing (it would be sent twice) nor a doomed
    /// one as applied (it would be lost). A refusal (say the user may not
    /// write there) is logged once and the reads go on without it.
    pub(crate) async fn settle(
        &mut self,
        collection: &str,
        spool: &str,
        abort: &CancellationToken,
    ) -> Result<(), Aborted> {
        if !self.majority {
            return Ok(());
        }
        let w = Unordered {
            what: "settle before reading what was applied",
            command: "update",
            collection,
            field: "updates",
            ids: Ids::Upserted,
            lost: Lost::Resend,
        };
        let statement = |_| {
            rawdoc! {
                "q": { "_id": spool },
                "u": { "$set": { "settledAt": bson::DateTime::now() } },
                "upsert": true,
            }
        };
        let sent = self.send_unordered(w, 1, statement, abort).await?;
        if let Some(WriteError { code, msg, .. }) = sent.refused.first() {
            if !self.settle_refused {
                tracing::warn!(code, error = %msg, collection, "Cannot write palletd's spool document; deciding what interrupted writes did without waiting for them to be majority-committed.");
                self.settle_refused = true;
            }
        }
        Ok(())
    }

    /// Inserts dead-letter documents, retrying until they are in. A
    /// document the server refuses outright is logged at ERROR and dropped:
    /// it is already garbage. One that is already there (its `_id` comes
    /// from its LSN: an interrupted earlier attempt) is in.
    pub(crate) async fn insert_deadletters(
        &mut self,
        collection: &str,
        docs: &[DeadLetter],
        abort: &CancellationToken,
    ) -> Result<(), Aborted> {
        let w = Unordered {
            what: "write dead letters",
            command: "insert",
            collection,
            field: "documents",
            ids: Ids::Inserted,
            lost: Lost::Resend,
        };
        let sent = self
            .send_unordered(w, docs.len(), |i| docs[i].1.clone(), abort)
            .await?;
        for e in sent.refused {
            error!(index = e.index, code = e.code, error = %e.msg, "Dead letter refused by the database; dropped.");
        }
        Ok(())
    }

    pub(crate) fn failed(&mut self, what: &str, e: &mongodb::error::Error) {
        let kind = error_kind(e);
        metrics::counter!(telemetry::DATABASE_ERRORS, "kind" => kind).increment(1);
        self.failed_msg(what, &format!("{kind}: {e}"));
    }

    pub(crate) fn failed_msg(&mut self, what: &str, e: &str) {
        self.failures += 1;
        if self.outage.is_none() {
            self.outage = Some(Instant::now());
            error!(error = %e, "Cannot {what}; holding the data and retrying until the database accepts it.");
        } else {
            debug!(error = %e, "Still cannot {what}.");
        }
    }

    pub(crate) fn recovered(&mut self) {
        if let Some(since) = self.outage.take() {
            info!(
                after = %humantime::format_duration(Duration::from_secs(since.elapsed().as_secs())),
                "Database writes recovered."
            );
        }
    }
}

impl Reply {
    /// The first write error as an error (`what` rejected, with its code
    /// and message); `Ok` when there is none.
    pub(crate) fn refusal(&self, what: &str) -> mongodb::error::Result<()> {
        match self.write_errors.first() {
            Some(e) => Err(mongodb::error::Error::custom(format!(
                "{what} rejected (code {}): {}",
                e.code, e.msg
            ))),
            None => Ok(()),
        }
    }
}

/// Name of the TTL index on the dead letters' `receivedAt`.
pub(crate) const DEADLETTER_TTL_INDEX: &str = "receivedAt_ttl";

/// The `expireAfterSeconds` of the index `name`, if it exists.
pub(crate) async fn ttl_of(
    db: &Database,
    coll: &str,
    name: &str,
) -> mongodb::error::Result<Option<Duration>> {
    let cursor = match db.collection::<Document>(coll).list_indexes().await {
        Ok(c) => c,
        // NamespaceNotFound: no collection yet, so no index.
        Err(e) if matches!(&*e.kind, ErrorKind::Command(c) if c.code == 26) => return Ok(None),
        Err(e) => return Err(e),
    };
    let indexes: Vec<IndexModel> = cursor.try_collect().await?;
    Ok(indexes
        .into_iter()
        .filter_map(|i| i.options)
        .find(|o| o.name.as_deref() == Some(name))
        .map(|o| o.expire_after.unwrap_or_default()))
}

/// Makes the TTL index `name` on `field` follow `want`: created when
/// missing, changed in place with `collMod` (no rebuild) when it differs,
/// dropped when retention is off.
pub(crate) async fn sync_ttl(
    db: &Database,
    coll: &str,
    field: &str,
    name: &str,
    want: Option<Duration>,
) -> mongodb::error::Result<()> {
    let have = ttl_of(db, coll, name).await?;
    match (have, want) {
        (None, Some(after)) => {
            let index = IndexModel::builder()
                .keys(doc! { field: 1 })
                .options(
                    IndexOptions::builder()
                        .name(name.to_string())
                        .expire_after(after)
                        .build(),
                )
                .build();
            db.collection::<Document>(coll).create_index(index).await?;
            info!(collection = coll, expire_after = %humantime::format_duration(after), "Retention index created.");
        }
        (Some(old), Some(after)) if old != after => {
            db.run_command(doc! {
                "collMod": coll,
                "index": { "name": name, "expireAfterSeconds": after.as_secs() as i64 },
            })
            .await?;
            info!(
                collection = coll,
                from = %humantime::format_duration(old),
                to = %humantime::format_duration(after),
                "Retention changed."
            );
        }
        (Some(_), None) => {
            db.collection::<Document>(coll).drop_index(name).await?;
            info!(collection = coll, "Retention removed: documents are kept.");
        }
        _ => {}
    }
    Ok(())
}

/// The LSNs of spool `tag` from `lo` to `hi` that have a dead letter (one
/// range scan of `_id`, which is made of the tag and the LSN).
pub(crate) async fn deadletter_lsns(
    coll: mongodb::Collection<bson::Document>,
    concern: Option<ReadConcern>,
    tag: u32,
    lo: u64,
    hi: u64,
) -> mongodb::error::Result<std::collections::HashSet<u64>> {
    use futures_util::TryStreamExt;
    let filter = bson::doc! { "_id": {
        "$gte": crate::deadletter::id(tag, lo),
        "$lte": crate::deadletter::id(tag, hi),
    } };
    let find = coll.find(filter).projection(bson::doc! { "_id": 1 });
    let mut cursor = match concern {
        Some(c) => find.read_concern(c).await?,
        None => find.await?,
    };
    let mut out = std::collections::HashSet::new();
    while let Some(d) = cursor.try_next().await? {
        if let Ok(id) = d.get_object_id("_id") {
            out.insert(crate::deadletter::lsn_of(id));
        }
    }
    Ok(out)
}

/// The checkpoints spools published in `<collection>_spools`
/// (`checkpoint` on the document of each spool id, `s<id in hex>`): every
/// record of that id below it is in MongoDB (or dead-lettered). Keyed by
/// the documents' `_id`, which is also the id's `lsns.<...>` field name.
pub(crate) async fn published_checkpoints(
    coll: mongodb::Collection<bson::Document>,
    concern: Option<ReadConcern>,
) -> mongodb::error::Result<std::collections::HashMap<String, u64>> {
    let find = coll
        .find(doc! { "checkpoint": { "$exists": true } })
        .projection(doc! { "checkpoint": 1 });
    let mut cursor = match concern {
        Some(c) => find.read_concern(c).await?,
        None => find.await?,
    };
    let mut out = std::collections::HashMap::new();
    while let Some(d) = cursor.try_next().await? {
        if let (Ok(id), Ok(c)) = (d.get_str("_id"), d.get_i64("checkpoint")) {
            out.insert(id.to_string(), c.max(0) as u64);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_split_at_the_size_limit() {
        let big = rawdoc! { "x": "y".repeat(6 * 1024 * 1024) };
        let docs = vec![big.clone(), big.clone(), big.clone()];
        let (n, _) = build_batch(docs.into_iter());
        assert_eq!(n, 2);
        let (n, _) = build_batch(std::iter::once(
            rawdoc! { "x": "y".repeat(17 * 1024 * 1024) },
        ));
        assert_eq!(n, 1, "a single document always goes out");
    }

    fn write_error(index: usize, code: i32, msg: &str) -> WriteError {
        WriteError {
            index,
            code,
            msg: msg.to_string(),
            duplicate_on_id: true,
        }
    }

    #[test]
    fn reply_parsing_finds_upserts_and_errors() {
        let r = Reply::parse(&doc! {
            "n": 3, "upserted": [{"index": 2, "_id": 1}, {"index": 0i64, "_id": 2}],
            "writeErrors": [{"index": 3, "code": 2, "errmsg": "bad"}],
        });
        assert_eq!(r.upserted, vec![2, 0]);
        assert_eq!(r.write_errors, vec![write_error(3, 2, "bad")]);
        assert!(r.write_concern_error.is_none());
    }

    /// E11000's index: `keyPattern` where the server gives it, else the
    /// index its message names.
    #[test]
    fn a_duplicate_key_says_which_index() {
        let on = |e: Document| Reply::parse(&doc! { "writeErrors": [e] }).write_errors[0].clone();
        let dup = "E11000 duplicate key error collection: p.readings index:";
        assert!(on(doc! { "index": 0, "code": 11000, "errmsg": format!("{dup} _id_ dup key: {{ _id: \"a\" }}") }).duplicate_on_id);
        assert!(!on(doc! { "index": 0, "code": 11000, "errmsg": format!("{dup} site_1 dup key: {{ site: 1 }}") }).duplicate_on_id);
        assert!(
            !on(doc! { "index": 0, "code": 11000, "errmsg": "x", "keyPattern": { "site": 1 } })
                .duplicate_on_id
        );
        assert!(
            on(doc! { "index": 0, "code": 11000, "errmsg": "x", "keyPattern": { "_id": 1 } })
                .duplicate_on_id
        );
        assert!(
            on(doc! { "index": 0, "code": 11000, "errmsg": "E11000 duplicate key" })
                .duplicate_on_id,
            "unknown: as before, the bucket's _id"
        );
    }

    fn command_error(code: i32, name: &str) -> mongodb::error::Error {
        let e: mongodb::error::CommandError =
            bson::from_document(doc! { "code": code, "codeName": name, "errmsg": "injected" })
                .unwrap();
        mongodb::error::Error::from(ErrorKind::Command(e))
    }

    /// The fault table's classes (README "What palletd does about database
    /// errors"), each as `decide` gives it.
    #[test]
    fn the_fault_table_is_what_decide_says() {
        let io =
            mongodb::error::Error::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let table = [
            (
                decide(Failure::Command(&command_error(
                    10107,
                    "NotWritablePrimary",
                ))),
                Decision::Retry,
            ),
            (
                decide(Failure::Command(&command_error(
                    11602,
                    "InterruptedDueToReplStateChange",
                ))),
                Decision::Resolve,
            ),
            (
                decide(Failure::Command(&command_error(262, "ExceededTimeLimit"))),
                Decision::Resolve,
            ),
            (
                decide(Failure::Command(&command_error(50, "MaxTimeMSExpired"))),
                Decision::Resolve,
            ),
            (
                decide(Failure::Command(&command_error(
                    10334,
                    "BSONObjectTooLarge",
                ))),
                Decision::Resolve,
            ),
            (decide(Failure::Command(&io)), Decision::Resolve),
            (decide(Failure::WriteConcern), Decision::Resolve),
        ];
        for (i, (got, want)) in table.into_iter().enumerate() {
            assert_eq!(got, want, "row {i}");
        }
        let statement = |code, on_id, by_id| {
            let mut e = write_error(0, code, "x");
            e.duplicate_on_id = on_id;
            decide(Failure::Statement { error: &e, by_id })
        };
        assert_eq!(statement(11000, true, true), Decision::NextBucket);
        assert_eq!(
            statement(11000, false, true),
            Decision::GiveUp,
            "an operator's unique index"
        );
        assert_eq!(
            statement(11000, true, false),
            Decision::GiveUp,
            "no _id of palletd's"
        );
        assert_eq!(
            statement(112, true, true),
            Decision::RetryStatement,
            "WriteConflict"
        );
        assert_eq!(
            statement(10334, true, true),
            Decision::GiveUp,
            "BSONObjectTooLarge"
        );
        assert_eq!(statement(2, true, false), Decision::GiveUp);
    }

    proptest::proptest! {
        /// For any reply: a command error is retried whole only when the
        /// server refused it before running it, never given up; a
        /// statement is given up only for a code that is not transient
        /// (E11000 aside: given up unless it is a bucket's own `_id`);
        /// no decision retries for ever without a backoff (Retry and
        /// RetryStatement wait; Resolve waits out the time limit;
        /// NextBucket is bounded by the buckets of a window).
        #[test]
        fn every_failure_has_one_class(code in proptest::prop_oneof![
            proptest::sample::select(TRANSIENT_CODES.to_vec()),
            proptest::sample::select(vec![11000, 10334, 2, 9, 14, 121, 16755, 17419, 40]),
            -1i32..20_000,
        ], on_id: bool, by_id: bool) {
            let command = decide(Failure::Command(&command_error(code, "X")));
            proptest::prop_assert_eq!(
                command == Decision::Retry,
                NOT_PRIMARY_CODES.contains(&code)
            );
            proptest::prop_assert!(matches!(command, Decision::Retry | Decision::Resolve));
            proptest::prop_assert_eq!(
                refused(&command_error(code, "X")),
                !TRANSIENT_CODES.contains(&code)
            );
            let mut e = write_error(0, code, "x");
            e.duplicate_on_id = on_id;
            let statement = decide(Failure::Statement { error: &e, by_id });
            let want = if code == DUPLICATE_KEY {
                if on_id && by_id { Decision::NextBucket } else { Decision::GiveUp }
            } else if TRANSIENT_CODES.contains(&code) {
                Decision::RetryStatement
            } else {
                Decision::GiveUp
            };
            proptest::prop_assert_eq!(statement, want);
            let decided = statement_error(&e, by_id);
            proptest::prop_assert_eq!(decided, statement);
            proptest::prop_assert_eq!(
                decided.statement_label() == "statement_rejected",
                statement == Decision::GiveUp
            );
        }
    }
}
