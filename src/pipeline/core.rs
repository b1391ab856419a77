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

use bson::RawDocumentBuf;

use super::pending::{Pending, Pushed};
use super::policy::{FlushPolicy, Memory, Selection};
use crate::bucket::{Sample, Shape};
use crate::deadletter::{self, DeadLetter, Reporter};
use crate::flush::{Batch, Outcome, Resolution, Resolve, Written};
use crate::spool::{Entry, Record};
use crate::spooler::Feed;
use crate::telemetry;

/// Records read from the spool per catch-up step.
pub const CATCH_UP_BATCH: usize = 50_000;

/// How the core is set up.
#[derive(Debug, Clone)]
pub struct Config {
    pub shape: Shape,
    /// The spool's tag, for dead-letter ids.
    pub tag: u32,
    pub max_pending: usize,
    pub max_lateness_ms: i64,
    pub flush_every: Duration,
    pub seal_every: Duration,
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
        selection: Selection,
        started: Instant,
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
    reporter: Reporter,
    /// First LSN not in memory: records below it are in memory or in MongoDB.
    cursor: u64,
    /// Everything below this LSN is durable in the spool.
    durable: u64,
    checkpoint_sent: u64,
    checkpoint_due: Option<u64>,
    busy: Option<Busy>,
    /// The sensors the current resolve is for.
    resolving: Option<Vec<String>>,
    /// Windows ending at or before this were sealed by the last seal.
    sealed_until: Option<i64>,
    stopping: bool,
}

impl Core {
    pub fn new(config: Config, now: Instant) -> Core {
        Core {
            policy: FlushPolicy::new(config.flush_every, config.seal_every, now),
            pending: Pending::new(config.shape, config.fresh_from),
            deadletters: Vec::new(),
            reporter: Reporter::default(),
            cursor: config.from,
            durable: config.from,
            checkpoint_sent: config.from,
            checkpoint_due: None,
            busy: None,
            resolving: None,
            sealed_until: None,
            stopping: false,
            config,
        }
    }

    /// Samples held in memory.
    pub fn pending(&self) -> usize {
        self.pending.count()
    }

    /// First LSN not in memory.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Records on disk that memory does not hold yet.
    pub fn backlog(&self) -> u64 {
        self.durable.saturating_sub(self.cursor)
    }

    fn room(&self) -> usize {
        self.config
            .max_pending
            .saturating_sub(self.pending.count() + self.deadletters.len())
    }

    /// The spool is durable below `lsn`.
    pub fn set_durable(&mut self, lsn: u64) {
        self.durable = self.durable.max(lsn);
    }

    /// A flush is due but waits until the spool is durable up to this LSN.
    pub fn needs_durable(&self, now: Instant) -> Option<u64> {
        (self.busy.is_none() && self.flush_due(now).is_some() && self.durable < self.cursor)
            .then_some(self.cursor)
    }

    /// When to call [`Core::poll`] again if nothing else happens.
    pub fn deadline(&self) -> Instant {
        self.policy.deadline()
    }

    /// Whether shutdown began.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// Shutdown: flush what memory holds, read nothing more, seal nothing.
    pub fn stop(&mut self) {
        self.stopping = true;
        self.policy.flush_all_now();
    }

    /// Records the spooler appended: taken if they continue memory's window
    /// and fit; else they stay on disk for catch-up.
    pub fn feed(&mut self, f: Feed, now_ms: i64) {
        if f.first != self.cursor || f.samples.len() + f.deadletters.len() > self.room() {
            return;
        }
        for (sensor, sample) in f.samples {
            self.hold(&sensor, sample, now_ms);
        }
        self.deadletters.extend(f.deadletters);
        self.cursor = f.end;
    }

    /// Records read back from the spool for a [`Action::Read`]
    /// (`max`, `limit` as asked).
    pub fn records(&mut self, records: Vec<Record>, max: usize, limit: u64, now_ms: i64) {
        self.busy = None;
        let n = records.len();
        for rec in records {
            match rec.entry {
                Entry::Sample { sensor, doc } => {
                    let sample = RawDocumentBuf::from_bytes(doc)
                        .ok()
                        .and_then(|d| Sample::from_doc(d, rec.lsn));
                    match sample {
                        Some(s) => self.hold(&sensor, s, now_ms),
                        None => {
                            tracing::error!(
                                lsn = rec.lsn,
                                "Unreadable sample in the spool; skipped."
                            )
                        }
                    }
                }
                Entry::DeadLetter { doc } => match bson::from_slice(&doc) {
                    Ok(d) => self.deadletters.push((rec.lsn, d)),
                    Err(_) => tracing::error!(
                        lsn = rec.lsn,
                        "Unreadable dead letter in the spool; skipped."
                    ),
                },
                Entry::MessageId { .. } => {}
            }
            self.cursor = rec.lsn + 1;
        }
        if n < max {
            // The whole range up to `limit` has been read.
            self.cursor = self.cursor.max(limit);
        }
        self.policy.flush_all_now();
    }

    /// A read failed: nothing changes, it is asked again.
    pub fn read_failed(&mut self) {
        self.busy = None;
    }

    /// Puts a sample into memory. One that no longer fits in a bucket
    /// (`bucket.max_bytes` was lowered since it was spooled) goes to the dead
    /// letter; it is never dropped silently.
    fn hold(&mut self, sensor: &str, sample: Sample, now_ms: i64) {
        if let Err(too_big) = self.config.shape.check(&sample) {
            let error = too_big.to_string();
            self.reporter.report("sample_too_large", sensor, &error, 1);
            let doc = deadletter::for_sample(
                self.config.tag,
                sample.lsn,
                now_ms,
                sensor,
                &sample.doc,
                "sample_too_large",
                &error,
            );
            self.deadletters.push((sample.lsn, doc));
            return;
        }
        if self.pending.push(sensor, sample) == Pushed::AlreadyApplied {
            tracing::debug!(
                sensor,
                "Skipped a replayed sample that MongoDB already has."
            );
        }
    }

    fn memory(&self) -> Memory {
        Memory {
            pending: self.pending.count() + self.deadletters.len(),
            max_pending: self.config.max_pending,
            has_ready: self.pending.has_ready(),
        }
    }

    fn flush_due(&self, now: Instant) -> Option<Selection> {
        if self.stopping {
            return Some(Selection::All);
        }
        self.policy.due(now, self.memory())
    }

    /// What to do now, if anything; `None`: wait for an event or the
    /// [`Core::deadline`].
    pub fn poll(&mut self, now: Instant, now_ms: i64) -> Option<Action> {
        if self.busy.is_some() {
            return None;
        }
        if let Some(lsn) = self.checkpoint_due.take() {
            self.checkpoint_sent = lsn;
            return Some(Action::Checkpoint(lsn));
        }
        if let Some(selection) = self.flush_due(now) {
            if self.pending.count() == 0 && self.deadletters.is_empty() {
                // Nothing to write: the flush is done at once.
                self.policy.flushed(selection, now, now, false);
                self.update_checkpoint();
                if let Some(lsn) = self.checkpoint_due.take() {
                    self.checkpoint_sent = lsn;
                    return Some(Action::Checkpoint(lsn));
                }
            } else if self.durable < self.cursor {
                // Nothing reaches MongoDB before it is durable in the spool.
                return None;
            } else {
                return Some(self.flush(selection, now));
            }
        }
        if self.stopping {
            return (self.pending.count() == 0 && self.deadletters.is_empty())
                .then_some(Action::Done);
        }
        if self.policy.seal_due(now) {
            self.busy = Some(Busy::Seal);
            return Some(Action::Seal { now_ms });
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

    /// The next step of a flush of `selection`: resolve its uncertain
    /// samples first, then write.
    fn flush(&mut self, selection: Selection, now: Instant) -> Action {
        let sensors = self.pending.select(selection == Selection::All);
        let resolve: Vec<Resolve> = sensors
            .iter()
            .filter_map(|s| {
                let samples = self.pending.uncertain(s);
                (!samples.is_empty()).then(|| Resolve {
                    sensor: s.clone(),
                    samples,
                })
            })
            .collect();
        if !resolve.is_empty() {
            self.busy = Some(Busy::Resolve);
            self.resolving = Some(sensors);
            return Action::Resolve(resolve);
        }
        let runs = self.pending.take(&sensors);
        let deadletters = std::mem::take(&mut self.deadletters);
        let low = runs
            .iter()
            .filter_map(|r| r.samples.first().map(|s| s.lsn))
            .chain(deadletters.iter().map(|d| d.0))
            .min();
        let batch = Batch { runs, deadletters };
        self.busy = Some(Busy::Write {
            selection,
            started: now,
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
        if let Some(sensors) = self.resolving.take() {
            for sensor in &sensors {
                let mark = resolution.watermarks.get(sensor).copied();
                dropped += self.pending.resolve(sensor, &resolution.applied, mark);
            }
        }
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
        let Some(Busy::Write {
            selection, started, ..
        }) = self.busy.take()
        else {
            return Flushed::default();
        };
        let mut report = Flushed {
            statements: written.statements as u64,
            buckets_created: written.buckets_created,
            deadletters: batch.deadletters.len() as u64,
            ..Flushed::default()
        };
        let window = self.config.shape.window_ms;
        let age = metrics::histogram!(telemetry::SAMPLE_AGE_SECONDS);
        for mut run in batch.runs {
            let outcomes = std::mem::take(&mut run.outcomes);
            let samples = std::mem::take(&mut run.samples);
            let mut back = Vec::new();
            let mut uncertain = 0;
            let mut applied_to = None;
            for (i, sample) in samples.into_iter().enumerate() {
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
                            &sample.doc,
                            "rejected_by_database",
                            error,
                        );
                        self.deadletters.push((sample.lsn, doc));
                    }
                    Outcome::Unknown => {
                        report.unknown += 1;
                        back.push(sample);
                        uncertain = back.len();
                    }
                    Outcome::NotSent => back.push(sample),
                }
            }
            self.pending.put_back(run, back, uncertain, applied_to);
        }
        self.policy
            .flushed(selection, started, now, written.met_errors);
        if selection == Selection::All {
            let shape = self.config.shape;
            let keep_from = shape.window_start(now_ms - self.config.max_lateness_ms) - window;
            self.pending.forget_before(keep_from);
        }
        self.update_checkpoint();
        report
    }

    /// The report of an [`Action::Seal`] at `now_ms`: windows ending at or
    /// before `cutoff` are sealed (`None`: the seal failed, or the mode has
    /// none). Their open-bucket memory is forgotten.
    pub fn sealed(&mut self, now: Instant, cutoff: Option<i64>) {
        self.busy = None;
        self.policy.sealed(now);
        if let Some(cutoff) = cutoff {
            self.sealed_until = Some(cutoff);
            let window = self.config.shape.window_ms;
            self.pending.forget_before(cutoff - window + 1);
        }
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
