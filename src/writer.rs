//! Sends flushes to MongoDB: bucket statements as ordered `update` commands,
//! dead letters as `insert` commands, both with the configured write concern.
//!
//! This is the one place that decides what is retriable:
//! - A command that fails as a whole (network, no primary, timeout, auth, a
//!   write concern error) is retried with capped, jittered backoff, for as
//!   long as it takes or until shutdown gives up. Its samples stay in memory
//!   and their messages stay unacknowledged. Logged once per outage (ERROR:
//!   data waits) and once on recovery (INFO).
//! - A statement that the server rejects with a transient code (`writeErrors`
//!   with e.g. NotWritablePrimary, WriteConflict) is retried from that
//!   statement on: the ordered command applied exactly the statements before it.
//! - A statement rejected for any other code is permanent: its outcome is
//!   `Rejected` and the caller sends its samples to the dead letter; the
//!   statements after it go on.
//!
//! In `timeseries` mode a flush is one unordered `insert` of one document per
//! reading (`{ts, sensorId, lsn, <fields>}`); a document refused with a
//! transient code is sent again, one refused for good is `Rejected`.
//!
//! Exactly once: every statement also sets `$max: {lsn}`, the highest spool
//! LSN among its samples. A sensor's statements are in LSN order inside one
//! ordered command, so what MongoDB applied is a prefix per sensor. After a
//! failure that may have applied part of a command (connection lost, timeout,
//! write concern error) the writer reads each affected sensor's highest
//! applied LSN and sends only the statements above it. An unordered insert
//! may apply any subset, so in `timeseries` mode the writer instead reads
//! which of the uncertain LSNs are present and sends only the others.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bson::{doc, rawdoc, Document, RawArrayBuf, RawDocumentBuf};
use mongodb::error::ErrorKind;
use mongodb::{Client, Collection, Database};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::bucket::{Fill, Sample, Shape, Statement};
use crate::config::{Settings, WriteConcern};

/// The server's limit on statements per write command.
const MAX_BATCH_STATEMENTS: usize = 100_000;
/// Stay under the 16 MiB command size with room for the envelope.
const MAX_BATCH_BYTES: usize = 16 * 1024 * 1024 - 64 * 1024;

/// Server error codes after which the same statement may simply be sent again.
const TRANSIENT_CODES: &[i32] = &[
    6, 7, 24, 46, 50, 89, 91, 112, 189, 262, 9001, 10107, 11000, 11600, 11602, 13435, 13436,
];

/// What became of one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied; `inserted` tells whether the upsert created a new bucket.
    Applied { inserted: bool },
    /// Rejected permanently by the server, with its message.
    Rejected(String),
}

/// Shutdown gave up while the database was still failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("gave up writing: shutdown deadline passed")]
pub struct Aborted;

pub struct Writer {
    db: Database,
    settings: Settings,
    collection: String,
    deadletter: String,
    write_concern: Document,
    shape: Shape,
    indexes_ready: bool,
    outage: Option<Instant>,
    /// Failed database calls so far (for flush pacing).
    failures: u64,
}

impl Writer {
    pub fn new(client: &Client, all: &Settings, shape: Shape) -> Self {
        let settings = &all.mongodb;
        let w = match settings.write_concern {
            WriteConcern::Majority => bson::Bson::from("majority"),
            WriteConcern::Nodes(n) => bson::Bson::from(n as i32),
        };
        Writer {
            db: client.database(&settings.database),
            settings: all.clone(),
            collection: settings.collection.clone(),
            deadletter: settings.deadletter_collection(),
            write_concern: doc! { "w": w, "j": settings.journal },
            shape,
            indexes_ready: false,
            outage: None,
            failures: 0,
        }
    }

    /// Creates the indexes (idempotent), retrying until it succeeds.
    pub async fn ensure_indexes(&mut self, abort: &CancellationToken) -> Result<(), Aborted> {
        let mut backoff = Backoff::default();
        while !self.try_ensure_indexes().await {
            backoff.wait(abort).await?;
        }
        Ok(())
    }

    /// One attempt at creating the indexes; true once they are in place.
    pub async fn try_ensure_indexes(&mut self) -> bool {
        if self.indexes_ready {
            return true;
        }
        match crate::schema::ensure(&self.db, &self.settings).await {
            Ok(()) => {
                self.recovered();
                info!(collection = %self.collection, "Indexes are in place.");
                self.indexes_ready = true;
            }
            Err(crate::schema::SchemaError::Database(e)) => self.failed("create indexes", &e),
            Err(e) => self.failed_msg("set up the collection", &e.to_string()),
        }
        self.indexes_ready
    }

    /// The database, for the closer.
    pub fn db(&self) -> &Database {
        &self.db
    }

    /// Learns the fill of the open buckets of (sensor, window start) pairs:
    /// one query on the `{sensorId, startTs}` index. Where a window has
    /// several open buckets, the emptiest is reported; a pair with no open
    /// bucket is absent. One attempt: the fill only improves packing.
    pub async fn open_fills(
        &self,
        pairs: &[(String, i64)],
    ) -> mongodb::error::Result<std::collections::HashMap<(String, i64), Fill>> {
        let mut sensors: Vec<&str> = pairs.iter().map(|p| p.0.as_str()).collect();
        sensors.sort_unstable();
        sensors.dedup();
        let mut starts: Vec<i64> = pairs.iter().map(|p| p.1).collect();
        starts.sort_unstable();
        starts.dedup();
        let starts: Vec<bson::DateTime> = starts
            .into_iter()
            .map(bson::DateTime::from_millis)
            .collect();
        let filter = doc! {
            "sensorId": { "$in": sensors },
            "startTs": { "$in": starts },
            "closed": false,
        };
        let mut cursor = self
            .db
            .collection::<Document>(&self.collection)
            .find(filter)
            .projection(doc! { "_id": 0, "sensorId": 1, "startTs": 1, "count": 1, "size": 1 })
            .await?;
        let mut best: std::collections::HashMap<(String, i64), Fill> = Default::default();
        while cursor.advance().await? {
            let d = cursor.deserialize_current()?;
            let (Ok(sensor), Ok(start)) = (d.get_str("sensorId"), d.get_datetime("startTs")) else {
                continue;
            };
            let fill = Fill {
                count: d.get_i32("count").unwrap_or(0).max(0) as u32,
                bytes: d.get_i32("size").unwrap_or(0).max(0) as u32,
            };
            best.entry((sensor.to_string(), start.timestamp_millis()))
                .and_modify(|f| {
                    if fill.count < f.count {
                        *f = fill;
                    }
                })
                .or_insert(fill);
        }
        Ok(best)
    }

    /// Inserts dead-letter documents. A document the server refuses outright
    /// is logged at ERROR and dropped: it is already garbage.
    pub async fn write_deadletters(
        &mut self,
        docs: &[Document],
        abort: &CancellationToken,
    ) -> Result<(), Aborted> {
        if docs.is_empty() {
            return Ok(());
        }
        self.ensure_indexes(abort).await?;
        let mut backoff = Backoff::default();
        let mut rest = docs;
        while !rest.is_empty() {
            let (batch_len, batch) = build_batch(rest.iter().map(|d| {
                RawDocumentBuf::from_document(d).unwrap_or_else(|_| RawDocumentBuf::new())
            }));
            let cmd = self.command("insert", &self.deadletter, "documents", batch, false);
            match self.db.run_raw_command(cmd).await {
                Ok(reply) => {
                    let reply = Reply::parse(&reply);
                    if let Some(wce) = reply.write_concern_error {
                        self.failed_msg("write dead letters", &wce);
                        backoff.wait(abort).await?;
                        continue;
                    }
                    self.recovered();
                    // 11000: the dead letter (its _id comes from its LSN) is
                    // already there from an interrupted earlier attempt.
                    for (index, code, msg) in
                        reply.write_errors.into_iter().filter(|e| e.1 != 11000)
                    {
                        error!(index, code, error = %msg, "Dead letter refused by the database; dropped.");
                    }
                    rest = &rest[batch_len..];
                    backoff = Backoff::default();
                }
                Err(e) => {
                    self.failed("write dead letters", &e);
                    backoff.wait(abort).await?;
                }
            }
        }
        Ok(())
    }

    /// Applies statements in order, in as few `update` commands as the
    /// server's limits allow, and reports each statement's outcome.
    pub async fn write_statements(
        &mut self,
        statements: &[Statement],
        abort: &CancellationToken,
    ) -> Result<Vec<Outcome>, Aborted> {
        self.ensure_indexes(abort).await?;
        let mut outcomes = Vec::with_capacity(statements.len());
        let mut backoff = Backoff::default();
        // After a failure that may have applied part of a command (the
        // connection broke, a write concern error), learn what MongoDB has
        // before sending again: the applied statements are a prefix.
        let mut ambiguous = false;
        while outcomes.len() < statements.len() {
            if ambiguous {
                let rest = &statements[outcomes.len()..];
                let sensors: Vec<String> = rest.iter().map(|s| s.sensor.clone()).collect();
                let applied = self.applied_lsns_retrying(&sensors, abort).await?;
                let done = rest
                    .iter()
                    .take_while(|s| applied.get(&s.sensor).is_some_and(|a| s.last_lsn() <= *a))
                    .count();
                if done > 0 {
                    info!(
                        statements = done,
                        "An interrupted write had been applied; not sending it again."
                    );
                }
                outcomes.extend((0..done).map(|_| Outcome::Applied { inserted: false }));
                ambiguous = false;
                continue;
            }
            let start = outcomes.len();
            // Encoded straight into the command's array (again on a retry):
            // no second copy of the flush in memory.
            let shape = self.shape;
            let (batch_len, batch) =
                build_batch(statements[start..].iter().map(|s| s.to_bson(&shape)));
            let cmd = self.command("update", &self.collection, "updates", batch, true);
            let Some(reply) = self.send_write(cmd, "write buckets").await else {
                backoff.wait(abort).await?;
                ambiguous = true;
                continue;
            };
            // Ordered: everything before the first error was applied.
            let first_error = reply.write_errors.first().cloned();
            let applied = first_error.as_ref().map_or(batch_len, |e| e.0);
            for i in 0..applied {
                outcomes.push(Outcome::Applied {
                    inserted: reply.upserted.contains(&i),
                });
            }
            if let Some((_, code, msg)) = first_error {
                let transient = TRANSIENT_CODES.contains(&code);
                let kind = if transient {
                    "statement_transient"
                } else {
                    "statement_rejected"
                };
                metrics::counter!(crate::telemetry::DATABASE_ERRORS, "kind" => kind).increment(1);
                if transient {
                    debug!(code, error = %msg, "Transient statement error; retrying from it.");
                    backoff.wait(abort).await?;
                } else {
                    outcomes.push(Outcome::Rejected(format!(
                        "rejected by the database (code {code}): {msg}"
                    )));
                    backoff = Backoff::default();
                }
            } else {
                backoff = Backoff::default();
            }
        }
        Ok(outcomes)
    }

    /// Inserts readings into the time series collection, unordered, in as
    /// few commands as the server's limits allow, and reports each one's
    /// outcome (`Applied { inserted: true }` or `Rejected`).
    pub async fn write_readings(
        &mut self,
        readings: &[(&str, &Sample)],
        abort: &CancellationToken,
    ) -> Result<Vec<Outcome>, Aborted> {
        self.ensure_indexes(abort).await?;
        let mut outcomes: Vec<Option<Outcome>> = vec![None; readings.len()];
        let mut todo: Vec<usize> = (0..readings.len()).collect();
        let mut backoff = Backoff::default();
        let mut ambiguous = false;
        while !todo.is_empty() {
            if ambiguous {
                // Any subset of the interrupted command may be in MongoDB.
                let uncertain: Vec<(&str, &Sample)> = todo.iter().map(|i| readings[*i]).collect();
                let present = self.present_lsns_retrying(&uncertain, abort).await?;
                let before = todo.len();
                todo.retain(|i| {
                    let applied = present.contains(&readings[*i].1.lsn);
                    if applied {
                        outcomes[*i] = Some(Outcome::Applied { inserted: true });
                    }
                    !applied
                });
                if todo.len() < before {
                    info!(
                        readings = before - todo.len(),
                        "An interrupted insert had been applied in part; not sending those again."
                    );
                }
                ambiguous = false;
                continue;
            }
            let (batch_len, batch) = build_batch(todo.iter().map(|i| {
                let (sensor, sample) = readings[*i];
                reading_doc(sensor, sample)
            }));
            let cmd = self.command("insert", &self.collection, "documents", batch, false);
            let Some(reply) = self.send_write(cmd, "write readings").await else {
                backoff.wait(abort).await?;
                ambiguous = true;
                continue;
            };
            let mut retry = Vec::new();
            let mut errors = reply.write_errors.iter().peekable();
            for (k, i) in todo[..batch_len].iter().enumerate() {
                let Some((_, code, msg)) = errors.next_if(|e| e.0 == k) else {
                    outcomes[*i] = Some(Outcome::Applied { inserted: true });
                    continue;
                };
                let transient = TRANSIENT_CODES.contains(code);
                let kind = if transient {
                    "statement_transient"
                } else {
                    "statement_rejected"
                };
                metrics::counter!(crate::telemetry::DATABASE_ERRORS, "kind" => kind).increment(1);
                if transient {
                    retry.push(*i);
                } else {
                    outcomes[*i] = Some(Outcome::Rejected(format!(
                        "rejected by the database (code {code}): {msg}"
                    )));
                }
            }
            let transient = !retry.is_empty();
            retry.extend_from_slice(&todo[batch_len..]);
            todo = retry;
            if transient {
                debug!("Transient insert errors; sending those readings again.");
                backoff.wait(abort).await?;
            } else {
                backoff = Backoff::default();
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::Applied { inserted: true }))
            .collect())
    }

    /// Which LSNs of `readings` the time series collection holds. The query
    /// is bounded by sensor, LSN range and time: a reading's `ts` is at most
    /// `max_lateness` before and `max_future` after its receipt, so nothing
    /// received at or after the earliest of them has a `ts` before this
    /// bound (an hour more allows for clock steps).
    async fn present_lsns(
        coll: &Collection<Document>,
        readings: &[(&str, &Sample)],
        margin_ms: i64,
    ) -> mongodb::error::Result<HashSet<u64>> {
        let Some(min_lsn) = readings.iter().map(|r| r.1.lsn).min() else {
            return Ok(HashSet::new());
        };
        let max_lsn = readings.iter().map(|r| r.1.lsn).max().unwrap_or(min_lsn);
        let min_ts = readings.iter().map(|r| r.1.ts_ms).min().unwrap_or(0);
        let mut sensors: Vec<&str> = readings.iter().map(|r| r.0).collect();
        sensors.sort_unstable();
        sensors.dedup();
        let filter = doc! {
            "sensorId": { "$in": sensors },
            "ts": { "$gte": bson::DateTime::from_millis(min_ts.saturating_sub(margin_ms)) },
            "lsn": { "$gte": min_lsn as i64, "$lte": max_lsn as i64 },
        };
        let mut cursor = coll
            .find(filter)
            .projection(doc! { "_id": 0, "lsn": 1 })
            .await?;
        let mut out = HashSet::new();
        while cursor.advance().await? {
            if let Some(lsn) = cursor.deserialize_current()?.get("lsn").and_then(as_u64) {
                out.insert(lsn);
            }
        }
        Ok(out)
    }

    /// [`Self::present_lsns`], retried with backoff until it answers.
    pub async fn present_lsns_retrying(
        &mut self,
        readings: &[(&str, &Sample)],
        abort: &CancellationToken,
    ) -> Result<HashSet<u64>, Aborted> {
        let coll = self.db.collection::<Document>(&self.collection);
        let b = &self.settings.bucket;
        let margin_ms = (b.max_lateness + b.max_future).as_millis() as i64 + 3_600_000;
        self.read_retrying("read stored LSNs", abort, || {
            Self::present_lsns(&coll, readings, margin_ms)
        })
        .await
    }

    /// Runs a read until it answers, with backoff; logged like a write.
    async fn read_retrying<T, F>(
        &mut self,
        what: &str,
        abort: &CancellationToken,
        mut read: impl FnMut() -> F,
    ) -> Result<T, Aborted>
    where
        F: std::future::Future<Output = mongodb::error::Result<T>>,
    {
        let mut backoff = Backoff::default();
        loop {
            match read().await {
                Ok(m) => {
                    self.recovered();
                    return Ok(m);
                }
                Err(e) => {
                    self.failed(what, &e);
                    backoff.wait(abort).await?;
                }
            }
        }
    }

    /// The highest LSN applied to each sensor's buckets, from the
    /// `{sensorId: 1, lsn: -1}` index; sensors with none are absent.
    async fn applied_lsns(
        coll: &Collection<Document>,
        sensors: &[String],
    ) -> mongodb::error::Result<HashMap<String, u64>> {
        let mut unique: Vec<&str> = sensors.iter().map(String::as_str).collect();
        unique.sort_unstable();
        unique.dedup();
        let mut cursor = coll
            .aggregate(vec![
                doc! { "$match": { "sensorId": { "$in": unique } } },
                doc! { "$sort": { "sensorId": 1, "lsn": -1 } },
                doc! { "$group": { "_id": "$sensorId", "lsn": { "$first": "$lsn" } } },
            ])
            .await?;
        let mut out = HashMap::new();
        while cursor.advance().await? {
            let d = cursor.deserialize_current()?;
            if let (Ok(sensor), Some(lsn)) = (d.get_str("_id"), d.get("lsn").and_then(as_u64)) {
                out.insert(sensor.to_string(), lsn);
            }
        }
        Ok(out)
    }

    /// [`Self::applied_lsns`], retried with backoff until it answers.
    pub async fn applied_lsns_retrying(
        &mut self,
        sensors: &[String],
        abort: &CancellationToken,
    ) -> Result<HashMap<String, u64>, Aborted> {
        let coll = self.db.collection::<Document>(&self.collection);
        self.read_retrying("read applied LSNs", abort, || {
            Self::applied_lsns(&coll, sensors)
        })
        .await
    }

    /// Sends a write command. `None` when it failed as a whole or with a
    /// write concern error (logged): what it applied is then unknown.
    async fn send_write(&mut self, cmd: RawDocumentBuf, what: &str) -> Option<Reply> {
        match self.db.run_raw_command(cmd).await {
            Ok(r) => {
                let reply = Reply::parse(&r);
                if let Some(wce) = &reply.write_concern_error {
                    self.failed_msg(what, wce);
                    return None;
                }
                self.recovered();
                Some(reply)
            }
            Err(e) => {
                self.failed(what, &e);
                None
            }
        }
    }

    fn command(
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
        cmd.append(
            "writeConcern",
            RawDocumentBuf::from_document(&self.write_concern).unwrap_or_default(),
        );
        cmd
    }

    fn failed(&mut self, what: &str, e: &mongodb::error::Error) {
        let kind = error_kind(e);
        metrics::counter!(crate::telemetry::DATABASE_ERRORS, "kind" => kind).increment(1);
        self.failed_msg(what, &format!("{kind}: {e}"));
    }

    /// Failed database calls so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    fn failed_msg(&mut self, what: &str, e: &str) {
        self.failures += 1;
        if e.starts_with("write concern") {
            metrics::counter!(crate::telemetry::DATABASE_ERRORS, "kind" => "write_concern")
                .increment(1);
        }
        if self.outage.is_none() {
            self.outage = Some(Instant::now());
            error!(error = %e, "Cannot {what}; holding the data and retrying until the database accepts it.");
        } else {
            debug!(error = %e, "Still cannot {what}.");
        }
    }

    fn recovered(&mut self) {
        if let Some(since) = self.outage.take() {
            info!(
                after = %humantime::format_duration(Duration::from_secs(since.elapsed().as_secs())),
                "Database writes recovered."
            );
        }
    }
}

/// A bounded label for a driver error, for logs (and metrics later).
pub fn error_kind(e: &mongodb::error::Error) -> &'static str {
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

/// A reading as a time series document: `{ts, sensorId, lsn, <fields>}`.
pub fn reading_doc(sensor: &str, sample: &Sample) -> RawDocumentBuf {
    let mut d = RawDocumentBuf::new();
    d.append("ts", bson::DateTime::from_millis(sample.ts_ms));
    d.append("sensorId", sensor);
    d.append("lsn", sample.lsn as i64);
    for (name, value) in sample.doc.iter().flatten() {
        if name != "ts" {
            d.append(name, value.to_raw_bson());
        }
    }
    d
}

/// Takes a prefix of documents that fits one command; returns its length.
/// Always takes at least one, so a single large document still goes out.
fn build_batch(docs: impl Iterator<Item = RawDocumentBuf>) -> (usize, RawArrayBuf) {
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

/// The parts of a write command's reply that matter here.
#[derive(Debug, Default)]
struct Reply {
    upserted: Vec<usize>,
    /// (index, code, message), by index.
    write_errors: Vec<(usize, i32, String)>,
    write_concern_error: Option<String>,
}

impl Reply {
    fn parse(reply: &Document) -> Reply {
        let mut out = Reply::default();
        if let Ok(ups) = reply.get_array("upserted") {
            out.upserted = ups
                .iter()
                .filter_map(|u| u.as_document()?.get("index").and_then(as_usize))
                .collect();
        }
        if let Ok(errs) = reply.get_array("writeErrors") {
            out.write_errors = errs
                .iter()
                .filter_map(|e| {
                    let e = e.as_document()?;
                    let index = e.get("index").and_then(as_usize)?;
                    let code = e.get("code").and_then(|c| c.as_i32()).unwrap_or(-1);
                    let msg = e.get_str("errmsg").unwrap_or("").to_string();
                    Some((index, code, msg))
                })
                .collect();
            out.write_errors.sort_by_key(|e| e.0);
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

fn as_u64(b: &bson::Bson) -> Option<u64> {
    match b {
        bson::Bson::Int32(i) => u64::try_from(*i).ok(),
        bson::Bson::Int64(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

fn as_usize(b: &bson::Bson) -> Option<usize> {
    match b {
        bson::Bson::Int32(i) => usize::try_from(*i).ok(),
        bson::Bson::Int64(i) => usize::try_from(*i).ok(),
        _ => None,
    }
}

/// Capped exponential backoff with full jitter: 100 ms doubling to 30 s.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: Duration::from_millis(100),
        }
    }
}

impl Backoff {
    pub const CAP: Duration = Duration::from_secs(30);

    /// The next delay: uniformly between half and all of the current step.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(Self::CAP);
        let half = step / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// Sleeps for the next delay, or returns `Aborted` when `abort` fires.
    pub async fn wait(&mut self, abort: &CancellationToken) -> Result<(), Aborted> {
        let d = self.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(d) => Ok(()),
            _ = abort.cancelled() => {
                warn!("Shutdown deadline reached while retrying a database write.");
                Err(Aborted)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap() {
        let mut b = Backoff::default();
        let delays: Vec<Duration> = (0..20).map(|_| b.next_delay()).collect();
        assert!(delays[0] <= Duration::from_millis(100));
        assert!(delays.iter().all(|d| *d <= Backoff::CAP));
        assert!(delays[19] >= Backoff::CAP / 2);
    }

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

    #[test]
    fn reply_parsing_finds_upserts_and_errors() {
        let r = Reply::parse(&doc! {
            "n": 3, "upserted": [{"index": 2, "_id": 1}, {"index": 0i64, "_id": 2}],
            "writeErrors": [{"index": 3, "code": 2, "errmsg": "bad"}],
        });
        assert_eq!(r.upserted, vec![2, 0]);
        assert_eq!(r.write_errors, vec![(3, 2, "bad".to_string())]);
        assert!(r.write_concern_error.is_none());
    }
}
