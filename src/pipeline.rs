//! The task between the spool and the database: it holds a window of the
//! spool in memory (the [`Buffer`] and pending dead letters), flushes it to
//! MongoDB, runs the closer, and moves the spool's checkpoint forward.
//!
//! Memory holds the records from the checkpoint up to the `cursor`; records
//! at or past the cursor are on disk only. While everything fits, the
//! spooler's in-memory feed moves the cursor along with the log (live); when
//! memory is full (`flush.max_pending_samples`) or after a restart, the
//! pipeline reads records back from the spool in LSN order (catch-up) as
//! fast as flushes make room, so per-sensor order is the log's order.
//!
//! Only durable records are written to MongoDB, and only after their
//! sensor's applied LSN is known (learned from the database for sensors
//! first seen in this run), so a replay never stores a sample twice.
//!
//! A flush is awaited in this task, so at most one is in flight. Flushes
//! happen every `flush.interval` (all sensors), early when a sensor can fill
//! its open bucket (ready sensors), at once when memory is full, and right
//! before each closer run (every `closer.interval`), which therefore never
//! overlaps a write. A flush that takes more than half the interval (and met
//! no database error: after an outage the time went into retries) delays
//! the next interval flush by its own duration: the database is busy at
//! most about half the time, and under load each statement carries more
//! samples. (By hand on the benchmark, 1,000 sensors: a fixed 2 s interval
//! sustained 25k readings/s where 1 s sustained about 18k; pacing gets that
//! under load and keeps the 1 s latency when the database is idle.)
//! Records that arrive while a flush is awaited wait in the feed channel,
//! or on disk if it overflows (catch-up).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document, RawDocumentBuf};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::bucket::{Sample, Shape};
use crate::buffer::Buffer;
use crate::closer::Closer;
use crate::config::StorageMode;
use crate::spool::{Command, Entry, Reader, SpoolStats};
use crate::spooler::{deadletter_id, Feed, LogThrottle};
use crate::telemetry::{self, Health};
use crate::writer::{Aborted, Outcome, Writer};

/// Records read from the spool per catch-up step.
const CATCH_UP_BATCH: usize = 50_000;

/// How often the pipeline flushes and runs the closer.
#[derive(Debug, Clone, Copy)]
pub struct Intervals {
    pub flush: Duration,
    pub closer: Duration,
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

/// The spool as the pipeline sees it.
pub struct SpoolHandle {
    pub dir: PathBuf,
    pub tx: mpsc::Sender<Command>,
    pub durable: watch::Receiver<u64>,
    pub stats: Arc<SpoolStats>,
    pub tag: u32,
    /// First LSN not yet in memory when the pipeline starts (the checkpoint).
    pub from: u64,
    /// Records to replay at start.
    pub replay: u64,
    /// First LSN of this run: records below it were spooled by an earlier
    /// run and may be in MongoDB already.
    pub fresh_from: u64,
}

pub struct Pipeline {
    mode: StorageMode,
    buffer: Buffer,
    writer: Writer,
    deadletters: Vec<(u64, Document)>,
    max_pending: usize,
    max_lateness_ms: i64,
    throttle: LogThrottle,
    closer: Closer,
    /// Windows ending at or before this were sealed by the last closer run.
    sealed_until: Option<i64>,
    closer_failing: bool,
    health: Arc<Health>,
    spool: SpoolHandle,
    /// First LSN not in memory: records below it are in memory or in MongoDB.
    cursor: u64,
    reader: Option<Reader>,
    checkpoint_sent: u64,
    replay: Option<(Instant, u64)>,
}

impl Pipeline {
    pub fn new(
        settings: &crate::config::Settings,
        writer: Writer,
        shape: Shape,
        health: Arc<Health>,
        spool: SpoolHandle,
    ) -> Self {
        let replay = (spool.replay > 0).then(|| (Instant::now(), spool.replay));
        if spool.replay > 0 {
            info!(records = spool.replay, "Replaying the spool into MongoDB.");
        }
        Pipeline {
            mode: settings.storage.mode,
            buffer: Buffer::new(shape),
            writer,
            deadletters: Vec::new(),
            max_pending: settings.flush.max_pending_samples,
            max_lateness_ms: settings.bucket.max_lateness.as_millis() as i64,
            throttle: LogThrottle::default(),
            closer: Closer::new(&settings.mongodb.collection, settings.closer.grace),
            sealed_until: None,
            closer_failing: false,
            health,
            cursor: spool.from,
            checkpoint_sent: spool.from,
            reader: None,
            spool,
            replay,
        }
    }

    fn durable(&self) -> u64 {
        *self.spool.durable.borrow()
    }

    /// Records on disk that memory does not hold yet.
    fn backlog(&self) -> bool {
        self.cursor < self.durable()
    }

    fn room(&self) -> usize {
        self.max_pending.saturating_sub(self.buffer.pending())
    }

    /// Runs until `stop`, then flushes what memory holds. Returns what was
    /// left when `abort` cut that short.
    pub async fn run(
        mut self,
        mut feed: mpsc::Receiver<Feed>,
        intervals: Intervals,
        stop: CancellationToken,
        abort: CancellationToken,
    ) -> Result<(), Leftover> {
        let mut ticker = tokio::time::interval(intervals.flush);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closer_ticker = tokio::time::interval(intervals.closer);
        closer_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let catch_up = self.backlog() && feed.is_empty() && self.room() > 0;
            let result = tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                f = feed.recv() => match f {
                    Some(f) => {
                        self.accept(f);
                        if self.buffer.pending() >= self.max_pending {
                            self.flush(true, &abort).await
                        } else if self.buffer.has_ready() {
                            self.flush(false, &abort).await
                        } else {
                            Ok(())
                        }
                    }
                    None => break,
                },
                _ = ticker.tick() => {
                    let started = Instant::now();
                    let failures = self.writer.failures();
                    let r = self.flush(true, &abort).await;
                    // Pace by the database: when a flush takes long, wait
                    // as long again before the next one, so each write
                    // carries more samples per statement instead of the
                    // same number of ever smaller statements. Not after
                    // an outage: then the time went into retries.
                    let took = started.elapsed();
                    if took * 2 > intervals.flush && self.writer.failures() == failures {
                        ticker.reset_after(took);
                    }
                    r
                }
                _ = closer_ticker.tick() => {
                    // Flush first: what arrived before the run joins its
                    // bucket before the bucket is sealed.
                    let r = self.flush(true, &abort).await;
                    self.close_buckets().await;
                    r
                }
                _ = std::future::ready(()), if catch_up => {
                    self.catch_up().await;
                    self.flush(true, &abort).await
                }
            };
            if result.is_err() {
                return Err(self.leftover());
            }
        }
        // Shutdown: take what the spooler already offered, flush memory.
        // Records on disk only stay there for the next start.
        feed.close();
        while let Some(f) = feed.recv().await {
            self.accept(f);
        }
        let pending = self.buffer.pending();
        if pending > 0 {
            info!(samples = pending, "Flushing buffered samples before exit.");
        }
        if self.flush(true, &abort).await.is_err() {
            return Err(self.leftover());
        }
        Ok(())
    }

    fn leftover(&self) -> Leftover {
        Leftover {
            samples: self.buffer.pending(),
            dead_letters: self.deadletters.len(),
            unacknowledged: 0,
        }
    }

    /// Takes a message's records from the spooler if they continue memory's
    /// window and fit; else they stay on disk for catch-up.
    fn accept(&mut self, f: Feed) {
        if f.first != self.cursor || self.buffer.pending() + f.samples.len() > self.max_pending {
            return;
        }
        self.reader = None;
        for (sensor, sample) in f.samples {
            self.hold(&sensor, sample);
        }
        self.deadletters.extend(f.deadletters);
        self.cursor = f.end;
    }

    /// Puts a sample into memory. One that no longer fits in a bucket
    /// (`bucket.max_bytes` was lowered since it was spooled) goes to the dead
    /// letter; it is never dropped silently.
    fn hold(&mut self, sensor: &str, sample: Sample) {
        let max_bytes = self.buffer.shape().max_bytes;
        if sample.bytes() <= max_bytes {
            // Cannot fail: the size is the only thing push checks.
            let _ = self.buffer.push(sensor, sample);
            return;
        }
        let error = crate::buffer::TooBig {
            bytes: sample.bytes(),
            max_bytes,
        }
        .to_string();
        self.throttle.log("sample_too_large", sensor, &error);
        metrics::counter!(telemetry::DEAD_LETTERS, "cause" => "sample_too_large").increment(1);
        let doc = bson::to_bson(&sample.doc).unwrap_or(bson::Bson::Null);
        let dead = self.sample_deadletter(sensor, sample.lsn, doc, &error, "sample_too_large");
        self.deadletters.push((sample.lsn, dead));
    }

    /// A dead letter for one sample that cannot go into a bucket.
    fn sample_deadletter(
        &self,
        sensor: &str,
        lsn: u64,
        sample: bson::Bson,
        error: &str,
        cause: &str,
    ) -> Document {
        doc! {
            "_id": deadletter_id(self.spool.tag, lsn),
            "receivedAt": bson::DateTime::now(),
            "sensorId": sensor,
            "sample": sample,
            "error": error,
            "cause": cause,
        }
    }

    /// Reads the next durable records from the spool into memory.
    async fn catch_up(&mut self) {
        let limit = self.durable();
        let max = self.room().min(CATCH_UP_BATCH);
        let reader = self
            .reader
            .take()
            .unwrap_or_else(|| Reader::new(&self.spool.dir, self.cursor));
        let task = tokio::task::spawn_blocking(move || {
            let mut reader = reader;
            let records = reader.read(max, limit);
            (reader, records)
        });
        let (reader, records) = match task.await {
            Ok((r, Ok(records))) => (r, records),
            Ok((_, Err(e))) => {
                error!(error = %e, "Cannot read the spool; retrying.");
                tokio::time::sleep(Duration::from_secs(1)).await;
                return;
            }
            Err(e) => {
                error!(error = %e, "Spool reader failed.");
                return;
            }
        };
        let n = records.len();
        for rec in records {
            match rec.entry {
                Entry::Sample { sensor, doc } => {
                    let sample = RawDocumentBuf::from_bytes(doc)
                        .ok()
                        .and_then(|d| Sample::from_doc(d, rec.lsn));
                    match sample {
                        Some(s) => self.hold(&sensor, s),
                        None => error!(lsn = rec.lsn, "Unreadable sample in the spool; skipped."),
                    }
                }
                Entry::DeadLetter { doc } => match bson::from_slice::<Document>(&doc) {
                    Ok(d) => self.deadletters.push((rec.lsn, d)),
                    Err(_) => error!(
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
        self.reader = Some(reader);
        metrics::counter!(telemetry::SPOOL_REPLAYED).increment(n as u64);
        if let Some((since, total)) = self.replay {
            if !self.backlog() {
                let secs = since.elapsed().as_secs_f64();
                info!(
                    records = total,
                    seconds = format!("{secs:.1}"),
                    per_second = (total as f64 / secs.max(1e-3)) as u64,
                    "Spool replay done."
                );
                self.replay = None;
            } else if since.elapsed() >= Duration::from_secs(5) {
                info!(
                    remaining = self.durable().saturating_sub(self.cursor),
                    "Replaying the spool (LSNs left to read)."
                );
                self.replay = Some((Instant::now(), total));
            }
        }
    }

    /// One closer run. A failure is logged and retried at the next interval;
    /// it never holds up the data path.
    async fn close_buckets(&mut self) {
        // The seal is hinted to the closer's index: it must exist. One
        // attempt; the writer logs the outage and the next run tries again.
        // (This also sets up the collection soon after start.)
        if !self.writer.try_ensure_indexes().await || self.mode == StorageMode::Timeseries {
            // The server manages time series buckets.
            return;
        }
        let now = crate::now_ms();
        match self.closer.run(self.writer.db(), now).await {
            Ok(sealed) => {
                if self.closer_failing {
                    info!("The closer works again.");
                    self.closer_failing = false;
                }
                if sealed > 0 {
                    metrics::counter!(telemetry::BUCKETS_SEALED).increment(sealed);
                    debug!(sealed, "Sealed buckets.");
                }
                let cutoff = self.closer.cutoff(now);
                self.sealed_until = Some(cutoff);
                // Sealed windows' buckets take no more samples: forget them.
                let window = self.buffer.shape().window_ms;
                self.buffer.forget_before(cutoff - window + 1);
            }
            Err(e) => {
                if !self.closer_failing {
                    warn!(error = %e, "The closer could not seal buckets; retrying at its next interval.");
                    self.closer_failing = true;
                }
            }
        }
    }

    /// Waits until the spool is durable below `lsn`.
    async fn wait_durable(&mut self, lsn: u64, abort: &CancellationToken) -> Result<(), Aborted> {
        let mut durable = self.spool.durable.clone();
        while *durable.borrow_and_update() < lsn {
            tokio::select! {
                changed = durable.changed() => if changed.is_err() { return Err(Aborted) },
                _ = abort.cancelled() => return Err(Aborted),
            }
        }
        Ok(())
    }

    /// Writes dead letters and the pending samples (all sensors', or only the
    /// ready ones), then moves the checkpoint.
    async fn flush(&mut self, all: bool, abort: &CancellationToken) -> Result<(), Aborted> {
        if self.buffer.pending() == 0 && self.deadletters.is_empty() {
            self.checkpoint();
            return Ok(());
        }
        let started = Instant::now();
        self.health.flush_started();
        // Nothing reaches MongoDB before it is durable in the spool.
        self.wait_durable(self.cursor, abort).await?;
        let (statements, samples) = match self.mode {
            StorageMode::Buckets => self.write_buckets(all, abort).await?,
            StorageMode::Timeseries => self.write_readings(abort).await?,
        };
        if !self.deadletters.is_empty() {
            let docs: Vec<Document> = self.deadletters.iter().map(|d| d.1.clone()).collect();
            self.writer.write_deadletters(&docs, abort).await?;
            self.deadletters.clear();
        }
        self.health.flush_finished(samples as u64);
        metrics::counter!(telemetry::FLUSHES).increment(1);
        metrics::counter!(telemetry::STATEMENTS).increment(statements as u64);
        metrics::counter!(telemetry::SAMPLES_STORED).increment(samples as u64);
        metrics::histogram!(telemetry::FLUSH_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::gauge!(telemetry::PENDING_SAMPLES).set(self.buffer.pending() as f64);
        if all {
            let keep_from = self
                .buffer
                .shape()
                .window_start(crate::now_ms() - self.max_lateness_ms)
                - self.buffer.shape().window_ms;
            self.buffer.forget_before(keep_from);
        }
        self.checkpoint();
        debug!(
            statements,
            samples,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "Flushed."
        );
        Ok(())
    }

    /// Bucket mode: learns what the database has, writes the statements,
    /// and dead-letters the samples of rejected ones. Returns (statements,
    /// samples stored).
    async fn write_buckets(
        &mut self,
        all: bool,
        abort: &CancellationToken,
    ) -> Result<(usize, usize), Aborted> {
        // Samples replayed from the spool may be in MongoDB already.
        let unknown = self.buffer.unknown_applied(all);
        if !unknown.is_empty() {
            let applied = self.writer.applied_lsns_retrying(&unknown, abort).await?;
            let dropped = self.buffer.learn_applied(&unknown, &applied);
            if dropped > 0 {
                info!(
                    samples = dropped,
                    "Skipped replayed samples that MongoDB already has."
                );
            }
        }
        // Learn the fill of open buckets palletd has no memory of (after a
        // restart, or a sensor seen for the first time), so the batch fills
        // them instead of starting new ones.
        let unknown = self.buffer.unknown_windows(all);
        if !unknown.is_empty() {
            match self.writer.open_fills(&unknown).await {
                Ok(found) => self.buffer.learn(&unknown, found),
                Err(e) => debug!(error = %e, "Could not learn open bucket fills; writing without."),
            }
        }
        let statements = self.buffer.take(all);
        let mut samples = 0;
        let now = crate::now_ms();
        let age = metrics::histogram!(telemetry::SAMPLE_AGE_SECONDS);
        if !statements.is_empty() {
            let outcomes = self.writer.write_statements(&statements, abort).await?;
            for (st, outcome) in statements.iter().zip(outcomes) {
                match outcome {
                    Outcome::Applied { inserted } => {
                        self.buffer.settle(st, Some(inserted));
                        if inserted {
                            metrics::counter!(telemetry::BUCKETS_CREATED).increment(1);
                        }
                        let window = self.buffer.shape().window_ms;
                        if self.sealed_until.is_some_and(|t| st.start_ms + window <= t) {
                            metrics::counter!(telemetry::SAMPLES_LATE_INTO_SEALED)
                                .increment(st.samples.len() as u64);
                        }
                        samples += st.samples.len();
                        for s in &st.samples {
                            record_age(&age, now, s.ts_ms);
                        }
                    }
                    Outcome::Rejected(error) => {
                        self.buffer.settle(st, None);
                        self.throttle
                            .log("rejected_by_database", &st.sensor, &error);
                        metrics::counter!(telemetry::DEAD_LETTERS, "cause" => "rejected_by_database")
                            .increment(st.samples.len() as u64);
                        for s in &st.samples {
                            let sample = bson::to_bson(&s.doc).unwrap_or(bson::Bson::Null);
                            let doc = self.sample_deadletter(
                                &st.sensor,
                                s.lsn,
                                sample,
                                &error,
                                "rejected_by_database",
                            );
                            self.deadletters.push((s.lsn, doc));
                        }
                    }
                }
            }
        }
        Ok((statements.len(), samples))
    }

    /// Time series mode: drops replayed samples MongoDB already has, inserts
    /// the rest, and dead-letters the ones the server refuses. Returns
    /// (insert documents, samples stored).
    async fn write_readings(
        &mut self,
        abort: &CancellationToken,
    ) -> Result<(usize, usize), Aborted> {
        let taken = self.buffer.take_samples();
        let mut readings: Vec<(&str, &Sample)> = taken
            .iter()
            .flat_map(|(sensor, samples)| samples.iter().map(move |s| (sensor.as_str(), s)))
            .collect();
        // Readings an earlier run spooled may be in MongoDB already.
        let replayed: Vec<(&str, &Sample)> = readings
            .iter()
            .filter(|r| r.1.lsn < self.spool.fresh_from)
            .copied()
            .collect();
        if !replayed.is_empty() {
            let present = self.writer.present_lsns_retrying(&replayed, abort).await?;
            if !present.is_empty() {
                readings.retain(|r| !present.contains(&r.1.lsn));
                info!(
                    samples = present.len(),
                    "Skipped replayed samples that MongoDB already has."
                );
            }
        }
        let mut stored = 0;
        if !readings.is_empty() {
            let outcomes = self.writer.write_readings(&readings, abort).await?;
            let now = crate::now_ms();
            let age = metrics::histogram!(telemetry::SAMPLE_AGE_SECONDS);
            for ((sensor, sample), outcome) in readings.iter().zip(outcomes) {
                match outcome {
                    Outcome::Applied { .. } => {
                        stored += 1;
                        record_age(&age, now, sample.ts_ms);
                    }
                    Outcome::Rejected(error) => {
                        self.throttle.log("rejected_by_database", sensor, &error);
                        metrics::counter!(telemetry::DEAD_LETTERS, "cause" => "rejected_by_database")
                            .increment(1);
                        let doc = bson::to_bson(&sample.doc).unwrap_or(bson::Bson::Null);
                        let dead = self.sample_deadletter(
                            sensor,
                            sample.lsn,
                            doc,
                            &error,
                            "rejected_by_database",
                        );
                        self.deadletters.push((sample.lsn, dead));
                    }
                }
            }
        }
        Ok((readings.len(), stored))
    }

    /// Moves the spool's checkpoint to the lowest LSN still needed.
    fn checkpoint(&mut self) {
        let low = [
            Some(self.cursor),
            self.buffer.min_pending_lsn(),
            self.deadletters.iter().map(|d| d.0).min(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.cursor);
        if low > self.checkpoint_sent && self.spool.tx.try_send(Command::Checkpoint(low)).is_ok() {
            self.checkpoint_sent = low;
        }
        metrics::gauge!(telemetry::SPOOL_UNCONFIRMED).set(
            self.durable()
                .saturating_sub(self.spool.stats.checkpoint.load(Ordering::Relaxed))
                as f64,
        );
    }
}

/// Records how old a sample is now that it is durable in MongoDB (from its
/// own timestamp: publish-to-durable lag when sensors stamp at publish).
/// The histogram handle is looked up once per flush, not per sample.
fn record_age(age: &metrics::Histogram, now_ms: i64, ts_ms: i64) {
    age.record((now_ms - ts_ms).max(0) as f64 / 1000.0);
}
