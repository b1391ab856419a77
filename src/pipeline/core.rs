//! The pipeline's state and decisions, sans-IO: it takes events (records
//! from the spooler or read back from the spool, the durable LSN, what the
//! store reports, the time) and returns what to do next as an [`Action`]
//! (read records back, resolve uncertain samples, write a flush, store a
//! checkpoint, seal), the way rumqttc's `MqttState` returns packets and
//! never touches a socket.
//!
//! # Memory and the cursor
//! Memory holds the records from the checkpoint up to the `cursor`; records
//! at or past the cursor are on disk only. While everything fits, the
//! spooler's feed moves the cursor along with the log (live); when memory is
//! full (`flush.max_pending_samples`) or after a restart, records are read
//! back from the spool in LSN order (catch-up) as fast as flushes make room,
//! so per-sensor order is the log's order.
//!
//! # What a flush takes
//! Each sensor is flushed by its own fill and age ([`super::pending`]): when
//! its samples fill its open bucket, when its oldest sample waited
//! `flush.max_delay`, or, when memory is full, oldest first. Under
//! sustained load a reading is therefore durable within `max_delay` plus
//! one flush (plus the wait for the flush before it when the database is
//! the bottleneck). Before a seal, every sensor holding samples of a window
//! the seal closes is flushed, so palletd's own holding never makes late
//! data. Dead letters go with the next flush, or on their own once the
//! oldest waited `max_delay`.
//!
//! # Exactly once
//! Only durable records are written (a flush waits until the spool is
//! durable up to the cursor). A sample that may already be in MongoDB
//! (spooled by an earlier run, or sent in a write whose reply was lost) is
//! *uncertain*; before a sensor's samples are written, its uncertain ones
//! are resolved with the store, and those MongoDB has leave memory. At most
//! one action is outstanding at a time, and a sensor's samples are written
//! in LSN order.
//!
//! # The checkpoint
//! The checkpoint is the lowest LSN still needed: the cursor, the lowest
//! sample or dead letter in memory, or the lowest one of the flush in
//! flight. Everything below it is in MongoDB (or was dead-lettered there).

use std::time::{Duration, Instant};

use super::pending::{Pending, Pushed, SensorId};
use super::policy::FlushPolicy;
use crate::bucket::{SampleRef, Samples, Shape};
use crate::deadletter::{self, DeadLetter, Reporter};
use crate::flush::{Batch, Outcome, Resolution, Resolve, Written};
use crate::spool::{parse, EntryRef};
use crate::spooler::Feed;
use crate::telemetry;

/// Records read from the spool per catch-up step.
pub const CATCH_UP_BATCH: usize = 50_000;

/// Flushes of the sensors holding windows a seal closes, before the seal
/// goes ahead anyway (samples for those windows keep arriving late).
const SEAL_FLUSH_ROUNDS: u32 = 3;

/// Sensors one flush takes at most (its command stays small enough to be
/// quick, and the sensors it wrote start their next delay early; the rest
/// go in the next flush, at once).
pub const MAX_SENSORS_PER_FLUSH: usize = 1000;

/// How the core is set up.
#[derive(Debug, Clone)]
pub struct Config {
    pub shape: Shape,
    /// The spool's tag, for dead-letter ids.
    pub tag: u32,
    pub max_pending: usize,
    pub max_lateness_ms: i64,
    /// How long a sensor's oldest pending sample may wait (`flush.max_delay`).
    pub max_delay: Duration,
    pub seal_every: Duration,
    /// A seal at `now` closes the windows ending at or before `now - grace`;
    /// `None` when the storage mode has no seal.
    pub seal_grace_ms: Option<i64>,
    /// The checkpoint: the first LSN memory is missing at start.
    pub from: u64,
    /// The first LSN of this run: records below it were spooled by an
    /// earlier run and may be in MongoDB already.
    pub fresh_from: u64,
}

/// What the task should do next.
#[derive(Debug)]
pub enum Action {
    /// Store this checkpoint (everything below is in MongoDB).
    Checkpoint(u64),
    /// Read up to `max` records from `from` on, below `limit`, and hand
    /// them to [`Core::records`].
    Read { from: u64, max: usize, limit: u64 },
    /// Ask the store which of these samples are in MongoDB; hand the answer
    /// to [`Core::resolved`].
    Resolve(Vec<Resolve>),
    /// Write this flush; hand it back with the outcomes to [`Core::written`].
    Write(Batch),
    /// Seal the windows that are over at `now_ms`; report with
    /// [`Core::sealed`].
    Seal { now_ms: i64 },
    /// Shutdown: everything in memory is written.
    Done,
}

/// What a finished flush did, for metrics and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flushed {
    pub samples_stored: u64,
    pub statements: u64,
    pub buckets_created: u64,
    pub bytes_rewritten: u64,
    pub late_into_sealed: u64,
    pub rejected: u64,
    pub deadletters: u64,
    /// Samples whose fate is unknown (resolved before they go again).
    pub unknown: u64,
}

/// What was left undone when shutdown gave up.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Leftover {
    /// Samples in memory not yet in MongoDB (they stay in the spool).
    pub samples: usize,
    pub dead_letters: usize,
    /// Messages not acknowledged (the broker redelivers them).
    pub unacknowledged: usize,
}

/// The action in progress.
#[derive(Debug, Clone, Copy)]
enum Busy {
    Read,
    Resolve,
    Write {
        low: Option<u64>,
        samples: usize,
        deadletters: usize,
    },
    Seal,
}

pub struct Core {
    config: Config,
    policy: FlushPolicy,
    pending: Pending,
    deadletters: Vec<DeadLetter>,
    /// When the oldest dead letter in memory arrived (monotonic ms).
    deadletters_since: Option<i64>,
    reporter: Reporter,
    /// First LSN not in memory: records below it are in memory or in MongoDB.
    cursor: u64,
    /// Everything below this LSN is durable in the spool.
    durable: u64,
    checkpoint_sent: u64,
    checkpoint_due: Option<u64>,
    busy: Option<Busy>,
    /// The sensors of the flush being prepared (resolved, then written).
    flushing: Option<Vec<SensorId>>,
    /// The time (ms) of the seal being prepared, and how many flushes of
    /// the sensors holding windows it closes were made for it.
    seal_at: Option<(i64, u32)>,
    /// Windows ending at or before this were sealed by the last seal.
    sealed_until: Option<i64>,
    stopping: bool,
    /// The last poll wanted to write but the spool was not durable yet.
    blocked: bool,
    /// The core's monotonic clock starts here (deadlines never follow a
    /// step of the wall clock).
    epoch: Instant,
    /// The time of the last poll.
    now: Instant,
}

impl Core {
    pub fn new(config: Config, now: Instant) -> Core {
        Core {
            policy: FlushPolicy::new(config.max_delay, config.seal_every, now),
            pending: Pending::new(
                config.shape,
                config.fresh_from,
                config.max_delay.as_millis() as i64,
            ),
            deadletters: Vec::new(),
            deadletters_since: None,
            reporter: Reporter::default(),
            cursor: config.from,
            durable: config.from,
            checkpoint_sent: config.from,
            checkpoint_due: None,
            busy: None,
            flushing: None,
            seal_at: None,
            sealed_until: None,
            stopping: false,
            blocked: false,
            epoch: now,
            now,
            config,
        }
    }

    /// Monotonic ms of `now` since the core started.
    fn mono(&self, now: Instant) -> i64 {
        now.saturating_duration_since(self.epoch).as_millis() as i64
    }

    /// Samples held in memory.
    pub fn pending(&self) -> usize {
        self.pending.count()
    }

    /// Samples in memory not yet in MongoDB, the flush in flight included.
    pub fn unwritten(&self) -> usize {
        self.leftover().samples
    }

    /// First LSN not in memory.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Records on disk that memory does not hold yet.
    pub fn backlog(&self) -> u64 {
        self.durable.saturating_sub(self.cursor)
    }

    fn held(&self) -> usize {
        self.pending.count() + self.deadletters.len()
    }

    fn room(&self) -> usize {
        self.config.max_pending.saturating_sub(self.held())
    }

    /// The spool is durable below `lsn`.
    pub fn set_durable(&mut self, lsn: u64) {
        self.durable = self.durable.max(lsn);
    }

    /// A flush waits until the spool is durable up to this LSN.
    pub fn needs_durable(&self) -> Option<u64> {
        self.blocked.then_some(self.cursor)
    }

    /// When to call [`Core::poll`] again if nothing else happens.
    pub fn deadline(&self) -> Instant {
        let mono_now = self.mono(self.now);
        let due = [
            self.pending.next_due_ms(),
            self.deadletters_since
                .map(|t| t + self.config.max_delay.as_millis() as i64),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|ms| self.now + Duration::from_millis((ms - mono_now).max(0) as u64));
        self.policy.deadline(due)
    }

    /// Whether shutdown began.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// Shutdown: flush what memory holds, read nothing more, seal nothing.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// Records the spooler appended: taken if they continue memory's window
    /// and fit; else they stay on disk for catch-up.
    pub fn feed(&mut self, f: Feed, now: Instant, now_ms: i64) {
        if f.first != self.cursor || f.records > self.room() {
            return;
        }
        self.hold_records(&f.bytes, now, now_ms);
        self.cursor = f.end;
        self.update_checkpoint();
    }

    /// Records read back from the spool for an [`Action::Read`] (as
    /// written, `n` of them; `max`, `limit` as asked).
    pub fn records(
        &mut self,
        bytes: &[u8],
        n: usize,
        max: usize,
        limit: u64,
        now: Instant,
        now_ms: i64,
    ) {
        self.busy = None;
        if let Some(last) = self.hold_records(bytes, now, now_ms) {
            self.cursor = last + 1;
        }
        if n < max {
            // The whole range up to `limit` has been read.
            self.cursor = self.cursor.max(limit);
        }
        self.update_checkpoint();
    }

    /// A read failed: nothing changes, it is asked again.
    pub fn read_failed(&mut self) {
        self.busy = None;
    }

    /// Puts encoded records into memory; returns the last LSN.
    fn hold_records(&mut self, bytes: &[u8], now: Instant, now_ms: i64) -> Option<u64> {
        let mut last = None;
        for rec in parse(bytes) {
            last = Some(rec.lsn);
            match rec.entry {
                EntryRef::Sample { sensor, doc } => {
                    let sample = bson::RawDocument::from_bytes(doc)
                        .ok()
                        .and_then(|d| SampleRef::from_doc(d, rec.lsn));
                    match sample {
                        Some(s) => self.hold(sensor, s, now, now_ms),
                        None => {
                            tracing::error!(
                                lsn = rec.lsn,
                                "Unreadable sample in the spool; skipped."
                            )
                        }
                    }
                }
                EntryRef::DeadLetter { doc } => match bson::from_slice(doc) {
                    Ok(d) => self.hold_deadletter((rec.lsn, d), now),
                    Err(_) => tracing::error!(
                        lsn = rec.lsn,
                        "Unreadable dead letter in the spool; skipped."
                    ),
                },
                EntryRef::MessageId { .. } => {}
            }
        }
        last
    }

    fn hold_deadletter(&mut self, d: DeadLetter, now: Instant) {
        if self.deadletters.is_empty() {
            self.deadletters_since = Some(self.mono(now));
        }
        self.deadletters.push(d);
    }

    /// Puts a sample into memory. One that no longer fits in a bucket
    /// (`bucket.max_bytes` was lowered since it was spooled) goes to the dead
    /// letter; it is never dropped silently.
    fn hold(&mut self, sensor: &str, sample: SampleRef<'_>, now: Instant, now_ms: i64) {
        if let Err(too_big) = self.config.shape.check(sample) {
            let error = too_big.to_string();
            self.reporter.report("sample_too_large", sensor, &error, 1);
            let doc = deadletter::for_sample(
                self.config.tag,
                sample.lsn,
                now_ms,
                sensor,
                sample.doc,
                "sample_too_large",
                &error,
            );
            self.hold_deadletter((sample.lsn, doc), now);
            return;
        }
        let mono = self.mono(now);
        if self.pending.push(sensor, sample, mono) == Pushed::AlreadyApplied {
            tracing::debug!(
                sensor,
                "Skipped a replayed sample that MongoDB already has."
            );
        }
    }

    /// What to do now, if anything; `None`: wait for an event or the
    /// [`Core::deadline`].
    pub fn poll(&mut self, now: Instant, now_ms: i64) -> Option<Action> {
        self.now = now;
        self.blocked = false;
        if self.busy.is_some() {
            return None;
        }
        if let Some(lsn) = self.checkpoint_due.take() {
            self.checkpoint_sent = lsn;
            return Some(Action::Checkpoint(lsn));
        }
        // Nothing reaches MongoDB before it is durable in the spool.
        let can_write = self.durable >= self.cursor;
        // A flush being prepared goes on (its samples were resolved).
        if let Some(ids) = self.flushing.take() {
            return self.flush_or_wait(ids, can_write, now);
        }
        if self.stopping {
            if self.held() == 0 {
                return Some(Action::Done);
            }
            let ids = self.pending.all();
            return self.flush_or_wait(ids, can_write, now);
        }
        if self.policy.seal_due(now) {
            // First every sensor holding a window the seal closes (again if
            // more of them arrived meanwhile, a few times at most).
            let (at, rounds) = *self.seal_at.get_or_insert((now_ms, 0));
            let closing = match self.config.seal_grace_ms {
                Some(grace) if rounds < SEAL_FLUSH_ROUNDS => {
                    self.pending.holding_windows_ending_by(at - grace)
                }
                _ => Vec::new(),
            };
            if !closing.is_empty() {
                self.seal_at = Some((at, rounds + 1));
                return self.flush_or_wait(closing, can_write, now);
            }
            self.seal_at = None;
            self.busy = Some(Busy::Seal);
            return Some(Action::Seal { now_ms: at });
        }
        let mono = self.mono(now);
        let pressure = self.room() == 0;
        let deadletters_due = self
            .deadletters_since
            .is_some_and(|t| mono - t >= self.config.max_delay.as_millis() as i64);
        if self.policy.may_flush(now, pressure) {
            if !can_write {
                self.blocked = pressure || deadletters_due || self.pending.may_be_due(mono);
                return None;
            }
            let ids = self.pending.due(mono, pressure, MAX_SENSORS_PER_FLUSH);
            if !ids.is_empty() || deadletters_due {
                return Some(self.flush(ids, now));
            }
        }
        if self.cursor < self.durable && self.room() > 0 {
            self.busy = Some(Busy::Read);
            return Some(Action::Read {
                from: self.cursor,
                max: self.room().min(CATCH_UP_BATCH),
                limit: self.durable,
            });
        }
        None
    }

    fn flush_or_wait(
        &mut self,
        ids: Vec<SensorId>,
        can_write: bool,
        now: Instant,
    ) -> Option<Action> {
        if can_write {
            Some(self.flush(ids, now))
        } else {
            self.flushing = Some(ids);
            self.blocked = true;
            None
        }
    }

    /// The next step of a flush of sensors `ids`: resolve their uncertain
    /// samples first, then write them with the dead letters in memory.
    fn flush(&mut self, ids: Vec<SensorId>, now: Instant) -> Action {
        let resolve: Vec<Resolve> = ids
            .iter()
            .filter_map(|id| {
                let samples = self.pending.uncertain(*id);
                (!samples.is_empty()).then(|| Resolve {
                    sensor: self.pending.name(*id).to_string(),
                    samples,
                })
            })
            .collect();
        if !resolve.is_empty() {
            self.busy = Some(Busy::Resolve);
            self.flushing = Some(ids);
            return Action::Resolve(resolve);
        }
        self.policy.flushed(now, ids.len() >= MAX_SENSORS_PER_FLUSH);
        let runs = self.pending.take(&ids);
        let deadletters = std::mem::take(&mut self.deadletters);
        self.deadletters_since = None;
        let low = runs
            .iter()
            .filter_map(|r| r.samples.first().map(|s| s.lsn))
            .chain(deadletters.iter().map(|d| d.0))
            .min();
        let batch = Batch { runs, deadletters };
        self.busy = Some(Busy::Write {
            low,
            samples: batch.samples(),
            deadletters: batch.deadletters.len(),
        });
        Action::Write(batch)
    }

    /// The store's answer to an [`Action::Resolve`]; returns how many
    /// samples MongoDB already had.
    pub fn resolved(&mut self, resolution: Resolution) -> usize {
        self.busy = None;
        let mut dropped = 0;
        if let Some(ids) = &self.flushing {
            for id in ids {
                let mark = resolution.watermarks.get(self.pending.name(*id)).copied();
                dropped += self.pending.resolve(*id, &resolution.applied, mark);
            }
        }
        self.update_checkpoint();
        dropped
    }

    /// The store's report of an [`Action::Write`]: `batch` is handed back
    /// with its outcomes.
    pub fn written(
        &mut self,
        batch: Batch,
        written: Written,
        now: Instant,
        now_ms: i64,
    ) -> Flushed {
        self.now = now;
        if !matches!(self.busy.take(), Some(Busy::Write { .. })) {
            return Flushed::default();
        }
        let mut report = Flushed {
            statements: written.statements as u64,
            buckets_created: written.buckets_created,
            bytes_rewritten: written.bytes_rewritten,
            deadletters: batch.deadletters.len() as u64,
            ..Flushed::default()
        };
        let window = self.config.shape.window_ms;
        let age = metrics::histogram!(telemetry::SAMPLE_AGE_SECONDS);
        let mono = self.mono(now);
        for mut run in batch.runs {
            let outcomes = std::mem::take(&mut run.outcomes);
            let samples = std::mem::take(&mut run.samples);
            let mut back = Samples::new();
            let mut uncertain = 0;
            let mut applied_to = None;
            for (i, sample) in samples.iter().enumerate() {
                match outcomes.get(i).unwrap_or(&Outcome::NotSent) {
                    Outcome::Applied => {
                        report.samples_stored += 1;
                        applied_to = applied_to.max(Some(sample.lsn));
                        age.record((now_ms - sample.ts_ms).max(0) as f64 / 1000.0);
                        let start = self.config.shape.window_start(sample.ts_ms);
                        if self.sealed_until.is_some_and(|t| start + window <= t) {
                            report.late_into_sealed += 1;
                        }
                    }
                    Outcome::Rejected(error) => {
                        report.rejected += 1;
                        self.reporter
                            .report("rejected_by_database", &run.sensor, error, 1);
                        let doc = deadletter::for_sample(
                            self.config.tag,
                            sample.lsn,
                            now_ms,
                            &run.sensor,
                            sample.doc,
                            "rejected_by_database",
                            error,
                        );
                        self.hold_deadletter((sample.lsn, doc), now);
                    }
                    Outcome::Unknown => {
                        report.unknown += 1;
                        back.push(sample);
                        uncertain = back.len();
                    }
                    Outcome::NotSent => back.push(sample),
                }
            }
            self.pending
                .put_back(run, back, uncertain, applied_to, mono);
        }
        self.update_checkpoint();
        report
    }

    /// The report of an [`Action::Seal`] at `now_ms`: windows ending at or
    /// before `cutoff` are sealed (`None`: the seal failed, or the mode has
    /// none). Open-bucket memory that no write can need again is forgotten,
    /// and with it the sensors that hold nothing.
    pub fn sealed(&mut self, now: Instant, now_ms: i64, cutoff: Option<i64>) {
        self.busy = None;
        self.now = now;
        self.policy.sealed(now);
        let shape = self.config.shape;
        // Samples older than max_lateness are refused before they get here.
        let mut keep_from = shape.window_start(now_ms - self.config.max_lateness_ms);
        if let Some(cutoff) = cutoff {
            self.sealed_until = Some(cutoff);
            keep_from = keep_from.max(cutoff - shape.window_ms + 1);
        }
        self.pending.forget_before(keep_from);
    }

    /// Moves the checkpoint to the lowest LSN still needed.
    fn update_checkpoint(&mut self) {
        let in_flight = match self.busy {
            Some(Busy::Write { low, .. }) => low,
            _ => None,
        };
        let low = [
            Some(self.cursor),
            self.pending.min_lsn(),
            self.deadletters.iter().map(|d| d.0).min(),
            in_flight,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.cursor);
        if low > self.checkpoint_sent {
            self.checkpoint_due = Some(low);
        }
    }

    /// Checks the bookkeeping of memory (tests).
    #[cfg(test)]
    pub fn check(&self) {
        self.pending
            .check(self.flushing.as_deref().unwrap_or_default());
    }

    /// What is left if shutdown gives up now.
    pub fn leftover(&self) -> Leftover {
        let (samples, deadletters) = match self.busy {
            Some(Busy::Write {
                samples,
                deadletters,
                ..
            }) => (samples, deadletters),
            _ => (0, 0),
        };
        Leftover {
            samples: self.pending.count() + samples,
            dead_letters: self.deadletters.len() + deadletters,
            unacknowledged: 0,
        }
    }
}
