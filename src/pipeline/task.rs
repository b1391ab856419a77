//! The pipeline task: a thin shell around the [`Core`]. It feeds the core
//! what arrives (records from the admission, the durable LSN, the time) and
//! carries out what it asks (read the spool, resolve, write, checkpoint,
//! seal), one action at a time. It decides nothing itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use super::state::{Action, Core, Flushed, Lane, Leftover};
use crate::clock::now_ms;
use crate::handoff::Feed;
use crate::retry::Backoff;
use crate::spool::{self, Reader, Spool};
use crate::store::Store;
use crate::telemetry::{self, Health};

/// How often the admission's feed is taken in at most.
const FEED_EVERY: Duration = Duration::from_millis(5);

/// Progress of the start-up replay, logged every 5 s.
struct Replay {
    records: u64,
    since: Instant,
    logged: Instant,
}

/// The backlog's size, drain rate and time to drain, published about once
/// a second (metrics, `/readyz`, STATUS).
struct BacklogMeter {
    drained: u64,
    at: Instant,
    /// Readings per second, smoothed.
    rate: f64,
    /// The backlog last published.
    published: u64,
}

impl BacklogMeter {
    fn update(&mut self, core: &Core, health: &Health) {
        let secs = self.at.elapsed().as_secs_f64();
        if secs < 1.0 {
            return;
        }
        let now_rate = self.drained as f64 / secs;
        self.rate = 0.7 * self.rate + 0.3 * now_rate;
        self.drained = 0;
        self.at = Instant::now();
        let status = core.backlog_status();
        let eta = (status.readings > 0 && self.rate > 0.5)
            .then(|| (status.readings as f64 / self.rate) as u64);
        self.published = status.readings;
        metrics::gauge!(telemetry::BACKLOG_READINGS).set(status.readings as f64);
        metrics::gauge!(telemetry::BACKLOG_DRAIN_RATE).set(self.rate);
        metrics::gauge!(telemetry::BACKLOG_ETA_SECONDS).set(eta.unwrap_or(0) as f64);
        health.set_backlog(status.readings, eta);
    }

    /// When to publish again while the pipeline waits: a backlog that was
    /// published must be seen to drain (its last flush may be followed by
    /// nothing to do for a long time).
    fn due(&self) -> Option<Instant> {
        (self.published > 0 || self.rate > 0.5).then(|| self.at + Duration::from_secs(1))
    }
}

/// Runs until `stop`, then writes what memory holds. Returns what was left
/// when `abort` cut that short.
pub async fn run(
    core: Core,
    store: Store,
    spool: Spool,
    feed: mpsc::Receiver<Feed>,
    health: Arc<Health>,
    stop: CancellationToken,
    abort: CancellationToken,
) -> Result<(), Leftover> {
    let replay_records = core.backlog();
    let replay = (replay_records > 0).then(|| {
        info!(
            records = replay_records,
            "Replaying the spool into MongoDB."
        );
        Replay {
            records: replay_records,
            since: Instant::now(),
            logged: Instant::now(),
        }
    });
    let task = Task {
        confirmed: spool.checkpointed(),
        core,
        store,
        spool,
        feed,
        health,
        readers: [None, None],
        read_backoff: Backoff::new(READ_RETRY_FIRST, READ_RETRY_CAP),
        meter: BacklogMeter {
            drained: 0,
            // Published at once (the gauges are there from the start).
            at: Instant::now()
                .checked_sub(Duration::from_secs(1))
                .unwrap_or_else(Instant::now),
            rate: 0.0,
            published: 0,
        },
        gauges: Gauges {
            pending: metrics::gauge!(telemetry::PENDING_SAMPLES),
            pending_bytes: metrics::gauge!(telemetry::MEMORY_BYTES, "part" => "pending"),
            delay: metrics::gauge!(telemetry::FLUSH_DELAY_SECONDS),
        },
        reporter: telemetry::Reporter::default(),
        closer_failing: false,
        sealing: Duration::ZERO,
        interrupted: false,
        replay,
        feed_at: Instant::now(),
    };
    task.run(stop, abort).await
}

/// A spool that cannot be read is read again after a backoff from this
/// up to [`READ_RETRY_CAP`].
const READ_RETRY_FIRST: Duration = Duration::from_millis(200);
const READ_RETRY_CAP: Duration = Duration::from_secs(5);

/// The gauges the task keeps up to date each turn.
struct Gauges {
    pending: metrics::Gauge,
    pending_bytes: metrics::Gauge,
    delay: metrics::Gauge,
}

/// The task's state: the core, what it carries out actions with, and what
/// it records.
struct Task {
    core: Core,
    store: Store,
    spool: Spool,
    feed: mpsc::Receiver<Feed>,
    health: Arc<Health>,
    /// One reader per lane, kept between reads of the same range.
    readers: [Option<Reader>; 2],
    /// Before reading again after the spool could not be read.
    read_backoff: Backoff,
    meter: BacklogMeter,
    gauges: Gauges,
    reporter: telemetry::Reporter,
    closer_failing: bool,
    /// The time the seal's chunks took so far in this closer run.
    sealing: Duration,
    /// The last checkpoint the core gave: every record below it is in
    /// MongoDB (stored by the spool or not yet), which is what the closer
    /// publishes.
    confirmed: u64,
    /// The last write's reply was lost: the next resolve says what it did.
    interrupted: bool,
    replay: Option<Replay>,
    /// The feed is taken in at most every [`FEED_EVERY`] (one wake-up for
    /// many of the admission's batches; memory holds readings for much
    /// longer).
    feed_at: Instant,
}

impl Task {
    async fn run(
        mut self,
        stop: CancellationToken,
        abort: CancellationToken,
    ) -> Result<(), Leftover> {
        loop {
            self.take_feed();
            self.publish();
            let now = Instant::now();
            match self.core.poll(now, now_ms()) {
                None => self.wait(&stop, &abort).await?,
                Some(Action::Done) => return Ok(()),
                Some(action) => self.carry_out(action, &abort).await?,
            }
        }
    }

    /// What the admission offered meanwhile, into memory.
    fn take_feed(&mut self) {
        if self.feed_at > Instant::now() {
            return;
        }
        let mut took = false;
        while let Ok(f) = self.feed.try_recv() {
            self.fed(f);
            took = true;
        }
        if took {
            self.feed_at = Instant::now() + FEED_EVERY;
        }
    }

    fn fed(&mut self, f: Feed) {
        self.readers[Lane::Live as usize] = None;
        self.core.feed(f, Instant::now(), now_ms());
    }

    /// The durable end to the core; gauges, refusals and the backlog out.
    fn publish(&mut self) {
        let core = &mut self.core;
        core.set_durable(self.spool.durable());
        let behind = Instant::now().checked_sub(core.behind());
        core.set_recent_from(behind.and_then(|t| self.spool.durable_as_of(t)));
        self.gauges.pending.set(core.unwritten() as f64);
        self.gauges.pending_bytes.set(core.held_bytes() as f64);
        self.gauges.delay.set(core.delay().as_secs_f64());
        for r in core.take_refusals() {
            self.reporter.report(r.cause, &r.sensor, &r.error, 1);
        }
        self.meter.update(core, &self.health);
        self.health.set_stretched_delay(core.stretched_delay());
    }

    /// Nothing to do now: waits for the first of stop, the feed, the
    /// spool's durable end, the core's deadline or the meter's.
    async fn wait(
        &mut self,
        stop: &CancellationToken,
        abort: &CancellationToken,
    ) -> Result<(), Leftover> {
        let durable = self.core.needs_durable();
        let deadline = self.core.deadline();
        let meter = self.meter.due();
        let feed_open = !stop.is_cancelled() && self.feed_at <= Instant::now();
        tokio::select! {
            biased;
            _ = stop.cancelled(), if !self.core.stopping() => self.stopping().await,
            f = self.feed.recv(), if feed_open => match f {
                Some(f) => {
                    self.fed(f);
                    self.feed_at = Instant::now() + FEED_EVERY;
                }
                None => self.core.stop(),
            },
            _ = tokio::time::sleep_until(self.feed_at.into()), if self.feed_at > Instant::now() => {}
            changed = self.spool.wait_durable(durable.unwrap_or(0)), if durable.is_some() => {
                if changed.is_err() {
                    error!("The spool's appender stopped; nothing more can be written.");
                    return Err(self.core.leftover());
                }
            }
            _ = tokio::time::sleep_until(deadline.into()) => {}
            _ = tokio::time::sleep_until(meter.unwrap_or_else(Instant::now).into()), if meter.is_some() => {}
            _ = abort.cancelled() => return Err(self.core.leftover()),
        }
        Ok(())
    }

    /// Stop: takes what the admission already offered (records on disk only
    /// stay there for the next start) and has the core write what memory
    /// holds.
    async fn stopping(&mut self) {
        self.feed.close();
        while let Some(f) = self.feed.recv().await {
            self.core.feed(f, Instant::now(), now_ms());
        }
        let pending = self.core.pending();
        if pending > 0 {
            info!(samples = pending, "Flushing buffered samples before exit.");
        }
        self.core.stop();
    }

    async fn carry_out(
        &mut self,
        action: Action,
        abort: &CancellationToken,
    ) -> Result<(), Leftover> {
        match action {
            Action::Checkpoint(lsn) => self.checkpoint(lsn),
            Action::Read {
                lane,
                from,
                max,
                limit,
            } => self.read(lane, from, max, limit, abort).await?,
            Action::Resolve(req) => self.resolve(req, abort).await?,
            Action::Write(batch) => self.write(batch, abort).await?,
            Action::Seal {
                now_ms,
                late,
                first,
            } => self.seal(now_ms, late, first).await,
            Action::Done => {}
        }
        Ok(())
    }

    fn checkpoint(&mut self, lsn: u64) {
        self.spool.checkpoint(lsn);
        self.confirmed = self.confirmed.max(lsn);
        metrics::gauge!(telemetry::SPOOL_UNCONFIRMED)
            .set(self.spool.durable().saturating_sub(lsn) as f64);
    }

    /// Reads records back from the spool into a lane; readings a full
    /// spool deleted before they were written are counted and logged.
    async fn read(
        &mut self,
        lane: Lane,
        from: u64,
        max: usize,
        limit: u64,
        abort: &CancellationToken,
    ) -> Result<(), Leftover> {
        let r = match self.readers[lane as usize].take() {
            Some(r) if r.next() == from => r,
            _ => self.spool.reader(from),
        };
        match spool::read(r, max, limit).await {
            Ok((mut r, read)) => {
                self.read_backoff.reset();
                metrics::counter!(telemetry::SPOOL_REPLAYED).increment(read.records as u64);
                let missing = r.take_missing();
                let lost = self.core.records(
                    &read.bytes,
                    read.records,
                    read.complete_to,
                    &missing,
                    Instant::now(),
                    now_ms(),
                );
                if let (Some(first), Some(last)) = (lost.first(), lost.last()) {
                    metrics::counter!(telemetry::SPOOL_DROPPED).increment(lost.len() as u64);
                    error!(
                        readings = lost.len(),
                        first_lsn = first,
                        last_lsn = last,
                        "Readings deleted from the full spool (spool.when_full = \"drop_oldest\") before they reached MongoDB are lost."
                    );
                    if let Err(e) = self.spool.forget_lost(&lost) {
                        error!(error = %e, "Cannot update the spool's record of deleted readings; they may be counted again after a restart.");
                    }
                }
                self.readers[lane as usize] = Some(r);
            }
            Err(e) => {
                error!(error = %e, "Cannot read the spool; retrying.");
                self.core.read_failed();
                if self.read_backoff.wait(abort).await.is_err() {
                    return Err(self.core.leftover());
                }
            }
        }
        self.log_replay();
        Ok(())
    }

    /// The start-up replay's progress, every 5 s, and its end.
    fn log_replay(&mut self) {
        let Some(r) = &mut self.replay else { return };
        if self.core.backlog() == 0 {
            let secs = r.since.elapsed().as_secs_f64();
            info!(
                records = r.records,
                seconds = format!("{secs:.1}"),
                per_second = (r.records as f64 / secs.max(1e-3)) as u64,
                "Spool replay done."
            );
            self.replay = None;
        } else if r.logged.elapsed() >= Duration::from_secs(5) {
            info!(
                remaining = self.core.backlog(),
                "Replaying the spool (LSNs left to read)."
            );
            r.logged = Instant::now();
        }
    }

    async fn resolve(
        &mut self,
        req: Vec<crate::handoff::Resolve>,
        abort: &CancellationToken,
    ) -> Result<(), Leftover> {
        let Ok(resolution) = self.store.resolve(&req, abort).await else {
            return Err(self.core.leftover());
        };
        let dropped = self.core.resolved(resolution);
        if dropped > 0 && std::mem::take(&mut self.interrupted) {
            info!(
                samples = dropped,
                "{}",
                self.store.interrupted_and_applied()
            );
        } else if dropped > 0 {
            info!(
                samples = dropped,
                "Skipped replayed samples that MongoDB already has."
            );
        }
        Ok(())
    }

    async fn write(
        &mut self,
        mut batch: crate::handoff::Batch,
        abort: &CancellationToken,
    ) -> Result<(), Leftover> {
        let started = Instant::now();
        self.health.flush_started();
        let Ok(written) = self.store.write(&mut batch, abort).await else {
            return Err(self.core.leftover());
        };
        let report = self.core.written(batch, written, Instant::now(), now_ms());
        self.health
            .set_deadletter_bytes_written(self.core.deadletter_bytes_written());
        self.meter.drained += report.backlog_stored;
        record(&report, started.elapsed());
        self.health.flush_finished(report.samples_stored);
        if report.unknown > 0 {
            self.interrupted = true;
            info!(
                samples = report.unknown,
                "A write was interrupted; learning what MongoDB has before sending those samples again."
            );
        }
        debug!(
            lane = ?report.lane,
            statements = report.statements,
            samples = report.samples_stored,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "Flushed."
        );
        Ok(())
    }

    /// One chunk of a closer run ([`Action::Seal`]).
    async fn seal(&mut self, now_ms: i64, late: bool, first: bool) {
        if late {
            debug!(
                "Sealing while late readings of the closing windows are still in memory; they go into new buckets."
            );
        }
        let started = Instant::now();
        let sealed = self.store.seal(now_ms, self.confirmed, first).await;
        self.sealing += started.elapsed();
        let (cutoff, more) = match sealed {
            Ok(sealed) => {
                if sealed.buckets > 0 {
                    metrics::counter!(telemetry::BUCKETS_SEALED).increment(sealed.buckets);
                    debug!(
                        sealed = sealed.buckets,
                        more = sealed.more,
                        "Sealed buckets."
                    );
                }
                if std::mem::take(&mut self.closer_failing) {
                    info!("The closer works again.");
                }
                (self.store.seal_cutoff(now_ms), sealed.more)
            }
            Err(e) => {
                if !std::mem::replace(&mut self.closer_failing, true) {
                    tracing::warn!(error = %e, "The closer could not seal buckets; retrying at its next interval.");
                }
                (None, false)
            }
        };
        if !more {
            // The closer run's time: its chunks together.
            metrics::histogram!(telemetry::CLOSER_SECONDS)
                .record(std::mem::take(&mut self.sealing).as_secs_f64());
        }
        self.core.sealed(Instant::now(), now_ms, cutoff, more);
    }
}

fn record(report: &Flushed, took: Duration) {
    use telemetry::*;
    if let Some(lane) = report.lane {
        let lane = match lane {
            Lane::Live => "live",
            Lane::Backlog => "backlog",
        };
        let age = metrics::histogram!(SAMPLE_AGE_SECONDS, "lane" => lane);
        for a in &report.ages {
            age.record(*a);
        }
    }
    static MOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let most = MOST.fetch_max(report.statements, std::sync::atomic::Ordering::Relaxed);
    metrics::gauge!(FLUSH_STATEMENTS_MAX).set(most.max(report.statements) as f64);
    if report.statements > 0 || report.samples_stored > 0 || report.deadletters > 0 {
        metrics::counter!(FLUSHES).increment(1);
    }
    metrics::counter!(STATEMENTS).increment(report.statements);
    metrics::counter!(SAMPLES_STORED).increment(report.samples_stored);
    metrics::counter!(BACKLOG_STORED).increment(report.backlog_stored);
    metrics::counter!(BUCKETS_CREATED).increment(report.buckets_created);
    metrics::counter!(BYTES_REWRITTEN).increment(report.bytes_rewritten);
    metrics::counter!(SAMPLES_LATE_INTO_SEALED).increment(report.late_into_sealed);
    metrics::histogram!(FLUSH_SECONDS).record(took.as_secs_f64());
}
