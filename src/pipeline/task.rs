//! The pipeline task: a thin shell around the [`Core`]. It feeds the core
//! what arrives (records from the spooler, the durable LSN, the time) and
//! carries out what it asks (read the spool, resolve, write, checkpoint,
//! seal), one action at a time. It decides nothing itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use super::state::{Action, Core, Flushed, Lane, Leftover};
use crate::clock::now_ms;
use crate::flush::Feed;
use crate::spool::{self, Reader, Spool};
use crate::store::Store;
use crate::telemetry::{self, Health};

/// How often the spooler's feed is taken in at most.
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
    mut core: Core,
    mut store: Store,
    mut spool: Spool,
    mut feed: mpsc::Receiver<Feed>,
    health: Arc<Health>,
    stop: CancellationToken,
    abort: CancellationToken,
) -> Result<(), Leftover> {
    // One reader per lane, kept between reads of the same range.
    let mut readers: [Option<Reader>; 2] = [None, None];
    let lane_index = |lane: Lane| lane as usize;
    let mut meter = BacklogMeter {
        drained: 0,
        // Published at once (the gauges are there from the start).
        at: Instant::now()
            .checked_sub(Duration::from_secs(1))
            .unwrap_or_else(Instant::now),
        rate: 0.0,
        published: 0,
    };
    let pending = metrics::gauge!(telemetry::PENDING_SAMPLES);
    let pending_bytes = metrics::gauge!(telemetry::MEMORY_BYTES, "part" => "pending");
    let delay = metrics::gauge!(telemetry::FLUSH_DELAY_SECONDS);
    let mut reporter = telemetry::Reporter::default();
    let mut closer_failing = false;
    // The time the seal's chunks took so far in this closer run.
    let mut sealing = Duration::ZERO;
    // The last checkpoint the core gave: every record below it is in
    // MongoDB (stored by the spool or not yet), which is what the closer
    // publishes.
    let mut confirmed = spool.checkpointed();
    // The last write's reply was lost: the next resolve says what it did.
    let mut interrupted = false;
    let replay_records = core.backlog();
    let mut replay = (replay_records > 0).then(|| {
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
    // The feed is taken in at most every FEED_EVERY (one wake-up for many
    // of the spooler's batches; memory holds readings for much longer).
    let mut feed_at = Instant::now();
    loop {
        // What the spooler offered meanwhile comes first.
        if feed_at <= Instant::now() {
            let mut took = false;
            while let Ok(f) = feed.try_recv() {
                readers[lane_index(Lane::Live)] = None;
                core.feed(f, Instant::now(), now_ms());
                took = true;
            }
            if took {
                feed_at = Instant::now() + FEED_EVERY;
            }
        }
        core.set_durable(spool.durable());
        pending.set(core.unwritten() as f64);
        pending_bytes.set(core.held_bytes() as f64);
        delay.set(core.delay().as_secs_f64());
        for r in core.take_refusals() {
            reporter.report(r.cause, &r.sensor, &r.error, 1);
        }
        meter.update(&core, &health);
        health.set_stretched_delay(core.stretched_delay());
        let now = Instant::now();
        let Some(action) = core.poll(now, now_ms()) else {
            let durable = core.needs_durable();
            tokio::select! {
                biased;
                _ = stop.cancelled(), if !core.stopping() => {
                    // Take what the spooler already offered; records on disk
                    // only stay there for the next start.
                    feed.close();
                    while let Some(f) = feed.recv().await {
                        core.feed(f, Instant::now(), now_ms());
                    }
                    let pending = core.pending();
                    if pending > 0 {
                        info!(samples = pending, "Flushing buffered samples before exit.");
                    }
                    core.stop();
                }
                f = feed.recv(), if !stop.is_cancelled() && feed_at <= Instant::now() => match f {
                    Some(f) => {
                        readers[lane_index(Lane::Live)] = None;
                        core.feed(f, Instant::now(), now_ms());
                        feed_at = Instant::now() + FEED_EVERY;
                    }
                    None => core.stop(),
                },
                _ = tokio::time::sleep_until(feed_at.into()), if feed_at > Instant::now() => {}
                changed = spool.wait_durable(durable.unwrap_or(0)), if durable.is_some() => {
                    if changed.is_err() {
                        error!("The spool's appender stopped; nothing more can be written.");
                        return Err(core.leftover());
                    }
                }
                _ = tokio::time::sleep_until(core.deadline().into()) => {}
                _ = tokio::time::sleep_until(meter.due().unwrap_or_else(Instant::now).into()), if meter.due().is_some() => {}
                _ = abort.cancelled() => return Err(core.leftover()),
            }
            continue;
        };
        match action {
            Action::Checkpoint(lsn) => {
                spool.checkpoint(lsn);
                confirmed = confirmed.max(lsn);
                metrics::gauge!(telemetry::SPOOL_UNCONFIRMED)
                    .set(spool.durable().saturating_sub(lsn) as f64);
            }
            Action::Read {
                lane,
                from,
                max,
                limit,
            } => {
                let reader = &mut readers[lane_index(lane)];
                let r = match reader.take() {
                    Some(r) if r.next() == from => r,
                    _ => spool.reader(from),
                };
                match spool::read(r, max, limit).await {
                    Ok((mut r, read)) => {
                        metrics::counter!(telemetry::SPOOL_REPLAYED).increment(read.records as u64);
                        let missing = r.take_missing();
                        let lost = core.records(
                            &read.bytes,
                            read.records,
                            read.complete_to,
                            &missing,
                            Instant::now(),
                            now_ms(),
                        );
                        if let (Some(first), Some(last)) = (lost.first(), lost.last()) {
                            metrics::counter!(telemetry::SPOOL_DROPPED)
                                .increment(lost.len() as u64);
                            error!(
                                readings = lost.len(),
                                first_lsn = first,
                                last_lsn = last,
                                "Readings deleted from the full spool (spool.when_full = \"drop_oldest\") before they reached MongoDB are lost."
                            );
                            if let Err(e) = spool.forget_lost(&lost) {
                                error!(error = %e, "Cannot update the spool's record of deleted readings; they may be counted again after a restart.");
                            }
                        }
                        *reader = Some(r);
                    }
                    Err(e) => {
                        error!(error = %e, "Cannot read the spool; retrying.");
                        core.read_failed();
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = abort.cancelled() => return Err(core.leftover()),
                        }
                    }
                }
                if let Some(r) = &mut replay {
                    if core.backlog() == 0 {
                        let secs = r.since.elapsed().as_secs_f64();
                        info!(
                            records = r.records,
                            seconds = format!("{secs:.1}"),
                            per_second = (r.records as f64 / secs.max(1e-3)) as u64,
                            "Spool replay done."
                        );
                        replay = None;
                    } else if r.logged.elapsed() >= Duration::from_secs(5) {
                        info!(
                            remaining = core.backlog(),
                            "Replaying the spool (LSNs left to read)."
                        );
                        r.logged = Instant::now();
                    }
                }
            }
            Action::Resolve(req) => {
                let Ok(resolution) = store.resolve(&req, &abort).await else {
                    return Err(core.leftover());
                };
                let dropped = core.resolved(resolution);
                if dropped > 0 && std::mem::take(&mut interrupted) {
                    info!(samples = dropped, "{}", store.interrupted_and_applied());
                } else if dropped > 0 {
                    info!(
                        samples = dropped,
                        "Skipped replayed samples that MongoDB already has."
                    );
                }
            }
            Action::Write(mut batch) => {
                let started = Instant::now();
                health.flush_started();
                let Ok(written) = store.write(&mut batch, &abort).await else {
                    return Err(core.leftover());
                };
                let report = core.written(batch, written, Instant::now(), now_ms());
                health.set_deadletter_bytes_written(core.deadletter_bytes_written());
                meter.drained += report.backlog_stored;
                record(&report, started.elapsed());
                health.flush_finished(report.samples_stored);
                if report.unknown > 0 {
                    interrupted = true;
                    info!(
                        samples = report.unknown,
                        "A write was interrupted; learning what MongoDB has before sending those samples again."
                    );
                }
                debug!(
                    statements = report.statements,
                    samples = report.samples_stored,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "Flushed."
                );
            }
            Action::Seal {
                now_ms,
                late,
                first,
            } => {
                if late {
                    debug!(
                        "Sealing while late readings of the closing windows are still in memory; they go into new buckets."
                    );
                }
                let started = Instant::now();
                let sealed = store.seal(now_ms, confirmed, first).await;
                sealing += started.elapsed();
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
                        if std::mem::take(&mut closer_failing) {
                            info!("The closer works again.");
                        }
                        (store.seal_cutoff(now_ms), sealed.more)
                    }
                    Err(e) => {
                        if !std::mem::replace(&mut closer_failing, true) {
                            tracing::warn!(error = %e, "The closer could not seal buckets; retrying at its next interval.");
                        }
                        (None, false)
                    }
                };
                if !more {
                    // The closer run's time: its chunks together.
                    metrics::histogram!(telemetry::CLOSER_SECONDS)
                        .record(std::mem::take(&mut sealing).as_secs_f64());
                }
                core.sealed(Instant::now(), now_ms, cutoff, more);
            }
            Action::Done => return Ok(()),
        }
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
