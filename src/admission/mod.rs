//! The admission task: decodes each message, appends what it carried (samples,
//! dead letters, the message's identity) to the spool with fresh LSNs, and
//! acknowledges the message as soon as the spool is durable up to its last
//! record. It never waits for the database.
//!
//! What it appended is also offered to the pipeline in memory (a bounded
//! channel, never awaited); a batch the pipeline has no room for stays on
//! disk only, and the pipeline reads it back later (catch-up).
//!
//! When the spool is full ([`crate::spool::Spool::is_full`]: at
//! `spool.max_size` with `when_full = "stop"`, or when `"drop_oldest"` has
//! nothing left to drop), the admission stops taking messages: they stay
//! unacknowledged at the broker until the checkpoint frees segments. It
//! says so at ERROR, with the numbers.
//!
//! The ordered queue that releases PUBACKs in arrival order is
//! [`crate::front::acks`]; [`sensors`] is the bound on distinct sensors
//! (`limits.max_sensors`).

pub mod sensors;
pub mod sparkplug;
pub mod thinning;

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::bucket::{Sample, Shape};
use crate::clock::now_ms;
use crate::deadletter;
use crate::decode::Decoder;
use crate::front::acks::AckQueue;
use crate::ingest::{AckToken, Acker, Disposition, Identity, Message, Void};
use crate::spool::{EntryRef, RecordRef, SessionId, Spool};
use crate::telemetry;
use crate::telemetry::Reporter;
pub use sensors::SensorLimit;

use crate::flush::Feed;

/// Messages handled together: one spool append and one feed for all.
struct Arrivals {
    first: u64,
    bytes: Vec<u8>,
    samples: usize,
    /// Points thinning stores after their readings ([`thinning`]).
    archived: usize,
    deadletters: usize,
    messages: usize,
    /// Sparkplug B messages by type, counted once per batch.
    sparkplug: Vec<(&'static str, u64)>,
}

impl Arrivals {
    fn new(first: u64) -> Arrivals {
        Arrivals {
            first,
            bytes: Vec::new(),
            samples: 0,
            archived: 0,
            deadletters: 0,
            messages: 0,
            sparkplug: Vec::new(),
        }
    }
}

/// Messages taken from the channel at once, when that many are waiting.
const MAX_BATCH_MESSAGES: usize = 512;

/// A batch takes no more messages once its records hold this many bytes:
/// one spool append stays within the bytes a group commit leaves unsynced
/// ([`crate::spool`]'s `MAX_UNSYNCED`), so a power cut tears only whole
/// batches' worth at the end.
pub const MAX_BATCH_BYTES: usize = 256 << 10;

/// How often the spool gauges are refreshed.
const GAUGE_EVERY: Duration = Duration::from_millis(100);
/// How often thinned fields are looked at for a silent run to end.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How often the quietest sensors are told to the status page.
const QUIET_EVERY: Duration = Duration::from_secs(2);

/// A message waiting for its acknowledgement.
struct Unacked {
    /// `None` for QoS 0: nothing to send.
    ack: Option<AckToken>,
    received_ms: i64,
}

pub struct Admission {
    decoder: Decoder,
    acker: Acker,
    spool: Spool,
    /// The LSN of the next record.
    next_lsn: u64,
    /// The first LSN of this run: what a settling voids below when no
    /// resume of its session was told first (the ingest always tells it
    /// first; this only keeps a void from reaching into this run).
    run_start: u64,
    /// Per session key, the LSN from which its records are what the broker
    /// resent and newer, since it last resumed the session.
    resumed_at: std::collections::HashMap<u64, u64>,
    /// The spool's tag, for dead-letter ids.
    tag: u32,
    /// A sample must fit in an empty bucket of this shape.
    shape: Shape,
    feed: mpsc::Sender<Feed>,
    sensors: SensorLimit,
    /// Where the quietest sensors are told (the status page).
    health: std::sync::Arc<crate::telemetry::Health>,
    /// Whether the status page's quietest sensors come from here (when
    /// `[latest]` is off; else they are read from `<collection>_latest`,
    /// which knows the sensors silent since before this start too).
    tell_quiet: bool,
    /// Where the Sparkplug B state's snapshots go (with a `sparkplug_b`
    /// subscription).
    sparkplug: Option<sparkplug::StateFile>,
    /// Each thinned field's run ([`thinning`]).
    thinning: thinning::Thinning,
    /// Where thinning's hold on the spool is, and what is still to do
    /// about it ([`ThinningHold`]).
    thinning_hold: ThinningHold,
    /// Bytes of messages ingest handed on and not yet taken here.
    queue: std::sync::Arc<crate::budget::Budget>,
    /// Bytes of batches offered to the pipeline and not yet taken in: a
    /// batch that does not fit stays on disk only (it is read back).
    feed_budget: std::sync::Arc<crate::budget::Budget>,
    /// Dead letters in the spool not yet in MongoDB, within their share.
    deadletter_room: DeadLetterRoom,
}

/// Dead letters may take at most this share of `spool.max_size`: bad
/// input alone never fills the spool and stops the good sensors.
pub const DEADLETTER_SHARE: f64 = 0.1;

/// The dead letters spooled and not yet in MongoDB, in bytes: they free
/// their share as the pipeline writes them (oldest first, by the bytes it
/// reports written) or as the checkpoint passes them.
#[derive(Debug)]
pub struct DeadLetterRoom {
    limit: u64,
    /// (LSN, bytes) of each, oldest first.
    held: std::collections::VecDeque<(u64, u64)>,
    bytes: u64,
    /// The pipeline's count of dead-letter bytes written that has been
    /// taken off `held` already.
    credited: u64,
    /// Bytes per second dead letters may be spooled at in the long run
    /// (`limits.max_deadletter_rate`), a minute's worth at once: what a
    /// flood costs the database stays bounded too.
    rate: f64,
    tokens: f64,
    refilled: Option<Instant>,
    /// When a dropped one was last logged, and how many since.
    logged: Option<(Instant, u64)>,
}

impl DeadLetterRoom {
    /// Room for `DEADLETTER_SHARE` of a spool of `max_size` bytes, at
    /// `rate` bytes per second.
    pub fn new(max_size: u64, rate: u64) -> DeadLetterRoom {
        let rate = rate as f64;
        DeadLetterRoom {
            limit: (max_size as f64 * DEADLETTER_SHARE) as u64,
            held: Default::default(),
            bytes: 0,
            credited: 0,
            rate,
            tokens: Self::burst_of(rate),
            refilled: None,
            logged: None,
        }
    }

    /// A minute's worth, and at least two of the largest dead letters.
    fn burst_of(rate: f64) -> f64 {
        (rate * 60.0).max(2.0 * (deadletter::PAYLOAD_MAX as f64 + 16_384.0))
    }

    /// Whether a dead letter of `bytes` keeps within the rate now.
    fn rate_allows(&mut self, bytes: u64, now: Instant) -> bool {
        if let Some(then) = self.refilled {
            let add = now.saturating_duration_since(then).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + add).min(Self::burst_of(self.rate));
        }
        self.refilled = Some(now);
        self.tokens >= bytes as f64
    }

    /// Whether a dead letter of `bytes` may be spooled at `lsn`: everything
    /// below `confirmed` is in MongoDB, and `written` bytes of spooled dead
    /// letters were written since the start. It is counted if so.
    /// (`charged`: it counts against the rate; one whose payload was cut
    /// to [`deadletter::PAYLOAD_CUT`] does not.)
    fn admit(&mut self, lsn: u64, bytes: u64, confirmed: u64, written: u64, charged: bool) -> bool {
        let mut credit = written.saturating_sub(self.credited);
        while let Some(&(l, b)) = self.held.front() {
            if l < confirmed || b <= credit {
                credit = credit.saturating_sub(b);
                self.credited += b;
                self.held.pop_front();
                self.bytes -= b;
            } else {
                break;
            }
        }
        if self.held.is_empty() {
            // Bytes written of dead letters of an earlier run (a replay)
            // free nothing of this one's.
            self.credited = self.credited.max(written);
        }
        let admitted = self.bytes + bytes <= self.limit;
        if admitted {
            self.held.push_back((lsn, bytes));
            self.bytes += bytes;
            if charged {
                self.tokens -= bytes as f64;
            }
        }
        metrics::gauge!(telemetry::SPOOL_DEADLETTER_BYTES).set(self.bytes as f64);
        admitted
    }
}

/// The byte budgets of `limits.max_memory` the admission takes from and
/// gives to.
pub struct Budgets {
    /// Messages ingest handed on and not yet taken here.
    pub queue: std::sync::Arc<crate::budget::Budget>,
    /// Batches offered to the pipeline and not yet taken in.
    pub feed: std::sync::Arc<crate::budget::Budget>,
}

impl Admission {
    /// The admission of `spool` (opened: `recovered` says where it goes on),
    /// decoding by the settings' subscriptions, acknowledging through
    /// `acker`, offering what it spools on `feed`. With a `sparkplug_b`
    /// subscription, the decoder starts from the Sparkplug B state saved in
    /// the spool's directory.
    pub fn new(
        settings: &crate::config::Settings,
        acker: Acker,
        spool: Spool,
        recovered: &crate::spool::Recovery,
        feed: mpsc::Sender<Feed>,
        health: std::sync::Arc<crate::telemetry::Health>,
        budgets: Budgets,
    ) -> Admission {
        let mut decoder = Decoder::new(settings.subscriptions.clone(), settings.decode_limits());
        let sparkplug = decoder.has_sparkplug().then(|| {
            let (file, state) =
                sparkplug::StateFile::open(&settings.spool.dir, &spool, recovered.next_lsn);
            decoder.set_sparkplug_state(state);
            let bytes = decoder.sparkplug_state().bytes();
            metrics::gauge!(telemetry::MEMORY_BYTES, "part" => "sparkplug").set(bytes as f64);
            file
        });
        let thinning_hold = ThinningHold::open(settings, &spool, recovered.next_lsn);
        Admission {
            decoder,
            acker,
            spool,
            next_lsn: recovered.next_lsn,
            run_start: recovered.next_lsn,
            resumed_at: Default::default(),
            tag: recovered.tags.current(),
            shape: settings.shape(),
            feed,
            sensors: SensorLimit::new(
                settings.limits.max_sensors,
                (settings.bucket.window + settings.closer.grace).as_millis() as i64,
            ),
            health,
            tell_quiet: !settings.latest.enabled,
            sparkplug,
            thinning: thinning::Thinning::new(
                left_out_window(settings),
                settings.limits.split().thinning,
            ),
            thinning_hold,
            queue: budgets.queue,
            feed_budget: budgets.feed,
            deadletter_room: DeadLetterRoom::new(
                settings.spool.max_size,
                settings.limits.max_deadletter_rate,
            ),
        }
    }

    /// Runs until `stop`; then spools what is already received, waits until
    /// it is durable and releases the acknowledgements. Returns the number of
    /// messages left unacknowledged if `abort` cut that short.
    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<Message>,
        stop: CancellationToken,
        abort: CancellationToken,
    ) -> Result<(), usize> {
        let mut acks: AckQueue<Unacked> = AckQueue::default();
        let mut reporter = Reporter::default();
        let mut full_since: Option<Instant> = None;
        // (first LSN, received) of a message at most once a second, to tell
        // the age of the oldest record the checkpoint has not passed.
        let mut marks: std::collections::VecDeque<(u64, i64)> = Default::default();
        let mut gauges_at = Instant::now() - GAUGE_EVERY;
        let mut quiet_at = Instant::now() - QUIET_EVERY;
        let mut quiet_dirty = false;
        // The last turn made a chunk of a Sparkplug B snapshot.
        let mut chunk_last = false;
        let mut swept_at = Instant::now();
        // The points held at the last stop, read back, are stored first.
        let read_back = std::mem::take(&mut self.thinning_hold.read_back);
        self.spool_archived(read_back).await;
        self.thinning_hold.start_end = self.next_lsn;
        loop {
            if gauges_at.elapsed() >= GAUGE_EVERY {
                gauges_at = Instant::now();
                self.gauges(&mut marks, &acks);
            }
            if swept_at.elapsed() >= SWEEP_EVERY {
                swept_at = Instant::now();
                let ended = self.thinning.sweep(now_ms(), self.spool.is_full());
                self.spool_archived(ended).await;
                let over = self.thinning.take_sensors_ended();
                if over > 0 {
                    metrics::counter!(telemetry::THINNING_ENDED).increment(over);
                    if !self.thinning_hold.over_budget {
                        tracing::warn!(sensors = over, "Thinning's runs hold more than their share of limits.max_memory: the runs of the sensors heard from longest ago end early (their points held are stored and the bound holds; they store more points). Raise limits.max_memory, or thin fewer fields.");
                    }
                }
                self.thinning_hold.over_budget = over > 0;
                self.hold_for_thinning();
                if self.thinning_hold.active {
                    metrics::gauge!(telemetry::MEMORY_BYTES, "part" => "thinning")
                        .set(self.thinning.swept_bytes() as f64);
                }
            }
            if self.tell_quiet && quiet_dirty && quiet_at.elapsed() >= QUIET_EVERY {
                quiet_at = Instant::now();
                quiet_dirty = false;
                self.health.set_quiet(self.sensors.quietest(10));
            }
            let full = self.spool.is_full();
            match (full, full_since) {
                (true, None) => {
                    full_since = Some(Instant::now());
                    error!(
                        bytes = self.spool.bytes(),
                        max_size = self.spool.max_size(),
                        queued_bytes = self.spool.queued(),
                        "Spool is full: not acknowledging new messages until the database takes the backlog. The broker keeps them up to its own per-client limit (Mosquitto: max_queued_messages, 1000 by default, then it drops them); spool.when_full = \"drop_oldest\" keeps the newest instead."
                    );
                }
                (false, Some(t)) => {
                    info!(after = ?Duration::from_secs(t.elapsed().as_secs()), "Spool has room again; taking messages.");
                    full_since = None;
                }
                _ => {}
            }
            // The Sparkplug B state's snapshot: when to begin one, and
            // where its next chunk goes while one is written.
            let snapshot_due = self
                .sparkplug
                .as_ref()
                .and_then(|f| f.due(self.decoder.sparkplug_state()));
            let chunk_to = self.sparkplug.as_ref().and_then(|f| f.sender());
            // Alternating with batches while messages wait.
            let chunk_wanted = chunk_to.is_some() && (!chunk_last || rx.is_empty());
            chunk_last = false;
            let snapshotting = self.sparkplug.as_ref().is_some_and(|f| f.writing());
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                changed = self.spool.durable_changed() => {
                    if changed.is_err() {
                        error!("The spool's appender stopped; no more acknowledgements.");
                        return Err(acks.len());
                    }
                    self.release(&mut acks);
                }
                // A chunk of the Sparkplug B snapshot being written, when
                // its thread has room: before messages, or a flood would
                // keep it from ending (and the spool from letting go of
                // the changes since the last one); while messages wait, a
                // chunk and a batch take turns.
                permit = room_for_chunk(chunk_to), if chunk_wanted => {
                    if let Some(f) = &mut self.sparkplug {
                        f.step(self.decoder.sparkplug_state(), permit);
                    }
                    chunk_last = true;
                }
                m = rx.recv(), if !full => match m {
                    Some(m) => {
                        quiet_dirty = true;
                        // Take what else is waiting: one append, one feed.
                        let mut batch = Arrivals::new(self.next_lsn);
                        self.receive(m, &mut acks, &mut reporter, &mut batch);
                        while batch.messages < MAX_BATCH_MESSAGES
                            && batch.bytes.len() < MAX_BATCH_BYTES
                        {
                            match rx.try_recv() {
                                Ok(m) => self.receive(m, &mut acks, &mut reporter, &mut batch),
                                Err(_) => break,
                            }
                        }
                        self.send(batch).await;
                    }
                    None => break,
                },
                // Tell the quietest sensors once more after the last message.
                _ = tokio::time::sleep(QUIET_EVERY.saturating_sub(quiet_at.elapsed())), if self.tell_quiet && quiet_dirty => {}
                // While messages wait for their acknowledgement, the gauges
                // (the oldest unacknowledged one's age) stay current.
                _ = tokio::time::sleep(GAUGE_EVERY.saturating_sub(gauges_at.elapsed())), if !acks.is_empty() => {}
                // Silent thinned fields' runs end after their max_interval,
                // and the spool's hold for thinning follows.
                _ = tokio::time::sleep(SWEEP_EVERY.saturating_sub(swept_at.elapsed())), if self.thinning_hold.active => {}
                // While full, look again shortly: checkpoints free segments.
                _ = tokio::time::sleep(Duration::from_millis(200)), if full => {}
                // PUBACKs that did not fit into the client's queue.
                _ = tokio::time::sleep(Duration::from_millis(2)), if self.acker.waiting() > 0 => {
                    self.acker.retry();
                }
                // A snapshot of the Sparkplug B state: begun when due, made
                // a chunk at a time between messages, its end taken.
                _ = tokio::time::sleep_until(snapshot_due.unwrap_or_else(Instant::now).into()), if snapshot_due.is_some() => {
                    let lsn = self.next_lsn;
                    if let Some(f) = &mut self.sparkplug {
                        f.begin(lsn);
                    }
                }
                written = snapshot_written(&mut self.sparkplug), if snapshotting => {
                    if let Some(f) = &mut self.sparkplug {
                        f.end(written);
                    }
                }
            }
        }
        rx.close();
        while let Some(m) = rx.recv().await {
            let mut batch = Arrivals::new(self.next_lsn);
            self.receive(m, &mut acks, &mut reporter, &mut batch);
            self.send(batch).await;
        }
        // The points thinning still holds are stored: a clean stop ends
        // every run.
        let ended = self.thinning.finish();
        self.spool_archived(ended).await;
        let end = self.next_lsn;
        self.hold_for_thinning();
        loop {
            self.release(&mut acks);
            if self.spool.durable() >= end {
                break;
            }
            tokio::select! {
                changed = self.spool.durable_changed() => if changed.is_err() { break },
                _ = abort.cancelled() => return Err(acks.len()),
            }
        }
        self.release(&mut acks);
        // Hand every due PUBACK to the client before ingest disconnects.
        while !self.acker.retry() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(2)) => {}
                _ = abort.cancelled() => return Err(acks.len() + self.acker.waiting()),
            }
        }
        if acks.is_empty() {
            Ok(())
        } else {
            Err(acks.len())
        }
    }

    /// Keeps the records of the points thinning holds in the spool, and
    /// says from where in `thinning.lsn` ([`thinning`]): from the oldest
    /// one's, or from what was read back at start until the points stored
    /// then are durable. A full spool lets go: a crash then loses the
    /// held points (the bound of their runs), never a reading.
    fn hold_for_thinning(&mut self) {
        let h = &mut self.thinning_hold;
        if !h.active || self.spool.durable() < h.start_end {
            return;
        }
        let full = self.spool.is_full();
        let lsn = match self.thinning.oldest_held() {
            Some(lsn) if !full => lsn,
            _ => self.next_lsn,
        };
        if full && !h.let_go && self.thinning.oldest_held().is_some() {
            tracing::warn!("The spool is full: it no longer keeps the records of the points thinning holds; after a crash now, the runs they would end start anew without them (readings are not lost, the error bound of those runs is).");
        }
        h.let_go = full;
        if lsn == h.lsn {
            return;
        }
        if let Err(e) = thinning::save_lsn(&h.dir, lsn) {
            if !h.save_failed {
                tracing::warn!(error = %e, "Cannot write thinning.lsn in the spool's directory; after a crash the held points are looked for from an older record (slower start, nothing lost).");
            }
            h.save_failed = true;
        } else {
            h.save_failed = false;
        }
        self.spool.hold(crate::spool::Holder::Thinning, lsn);
        h.lsn = lsn;
    }

    /// Spools the points of ended runs and the values left out that are
    /// due ([`thinning::Thinning::sweep`]).
    async fn spool_archived(&mut self, ended: Vec<(String, thinning::Later)>) {
        if ended.is_empty() {
            return;
        }
        let mut batch = Arrivals::new(self.next_lsn);
        for (sensor, later) in ended {
            for sample in later.samples(self.next_lsn) {
                RecordRef {
                    lsn: self.next_lsn,
                    received_ms: now_ms(),
                    entry: EntryRef::Sample {
                        sensor: &sensor,
                        doc: sample.doc.as_bytes(),
                    },
                }
                .encode_into(&mut batch.bytes);
                self.next_lsn += 1;
                batch.archived += 1;
            }
        }
        self.send(batch).await;
    }

    /// Releases the acknowledgements of the messages whose records are
    /// durable (a Sparkplug B change among them too: nothing else waits).
    fn release(&mut self, acks: &mut AckQueue<Unacked>) {
        let durable = self.spool.durable();
        let acker = &mut self.acker;
        let released = acks.pop_ready(durable, |u| {
            if let Some(a) = u.ack {
                acker.ack(a);
            }
        });
        // The gauge is refreshed while messages wait; the last release
        // leaves nothing waiting to refresh it.
        if released > 0 && acks.is_empty() {
            metrics::gauge!(telemetry::OLDEST_UNACKED_SECONDS).set(0.0);
        }
    }

    /// Refreshes the spool and acknowledgement gauges.
    fn gauges(&self, marks: &mut std::collections::VecDeque<(u64, i64)>, acks: &AckQueue<Unacked>) {
        let checkpoint = self.spool.checkpointed();
        while marks.len() > 1 && marks[1].0 <= checkpoint {
            marks.pop_front();
        }
        if marks.back().is_none_or(|m| now_ms() - m.1 >= 1000) {
            marks.push_back((self.next_lsn, now_ms()));
        }
        let oldest = marks
            .front()
            .filter(|m| m.0 < self.next_lsn && checkpoint < self.next_lsn);
        metrics::gauge!(telemetry::SPOOL_OLDEST_SECONDS)
            .set(oldest.map_or(0.0, |m| (now_ms() - m.1).max(0) as f64 / 1000.0));
        metrics::counter!(telemetry::SPOOL_FSYNCS).absolute(self.spool.fsyncs());
        let oldest = acks
            .oldest()
            .map_or(0.0, |u| (now_ms() - u.received_ms).max(0) as f64 / 1000.0);
        metrics::gauge!(telemetry::OLDEST_UNACKED_SECONDS).set(oldest);
        metrics::gauge!(telemetry::SPOOL_BYTES).set(self.spool.bytes() as f64);
    }

    /// Appends a batch to the spool, then offers it to the pipeline.
    async fn send(&mut self, batch: Arrivals) {
        for (kind, n) in &batch.sparkplug {
            metrics::counter!(telemetry::SPARKPLUG_MESSAGES, "type" => *kind).increment(*n);
        }
        if batch.bytes.is_empty() {
            return;
        }
        metrics::counter!(telemetry::SAMPLES_DECODED).increment(batch.samples as u64);
        for c in self.thinning.take_counts() {
            let points = |outcome| metrics::counter!(telemetry::THINNING_POINTS, "rule" => c.kind, "outcome" => outcome);
            points("received").increment(c.received);
            points("stored").increment(c.stored);
            points("unordered").increment(c.unordered);
        }
        let mut feed = Feed {
            first: batch.first,
            end: self.next_lsn,
            records: batch.samples + batch.archived + batch.deadletters,
            bytes: batch.bytes.into(),
            spooled: Instant::now(),
            held: None,
        };
        if self
            .spool
            .append(feed.bytes.clone(), feed.end)
            .await
            .is_err()
        {
            error!("The spool's appender stopped; the messages are left to the broker.");
            return;
        }
        // Never wait for the pipeline: what it cannot take now (no room in
        // the channel or in the feed's byte budget) it reads back from the
        // spool.
        match crate::budget::Held::try_take(&self.feed_budget, feed.bytes.len()) {
            Some(held) => {
                feed.held = Some(std::sync::Arc::new(held));
                let _ = self.feed.try_send(feed);
            }
            None => metrics::counter!(telemetry::FEED_SKIPPED).increment(1),
        }
    }

    /// Counts what a Sparkplug B message did, spools the changes it made to
    /// the state (records of their own, before its samples) and sends a
    /// rebirth request.
    fn sparkplug_outcome(
        &mut self,
        o: &crate::decode::sparkplug::Effects,
        now_ms: i64,
        batch: &mut Arrivals,
    ) {
        let Some(kind) = o.kind else { return };
        match batch.sparkplug.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => batch.sparkplug.push((kind, 1)),
        }
        if o.seq_gaps > 0 {
            metrics::counter!(telemetry::SPARKPLUG_SEQ_GAPS).increment(u64::from(o.seq_gaps));
        }
        if o.out_of_order > 0 {
            metrics::counter!(telemetry::SPARKPLUG_OUT_OF_ORDER)
                .increment(u64::from(o.out_of_order));
        }
        for datatype in &o.skipped {
            metrics::counter!(telemetry::SPARKPLUG_SKIPPED, "datatype" => *datatype).increment(1);
        }
        if o.stale_death {
            metrics::counter!(telemetry::SPARKPLUG_STALE_DEATHS).increment(1);
        }
        for change in &o.changes {
            let json = serde_json::to_vec(change).expect("a change serializes");
            RecordRef {
                lsn: self.next_lsn,
                received_ms: now_ms,
                entry: EntryRef::Sparkplug { change: &json },
            }
            .encode_into(&mut batch.bytes);
            self.next_lsn += 1;
            if let Some(file) = &mut self.sparkplug {
                file.changed(json.len());
            }
        }
        if !o.changes.is_empty() {
            if let Some(file) = &mut self.sparkplug {
                let state = self.decoder.sparkplug_state();
                if o.evicted > 0 {
                    file.evicted(o.evicted, state, self.decoder.limits().max_sparkplug_bytes);
                }
                metrics::gauge!(telemetry::MEMORY_BYTES, "part" => "sparkplug")
                    .set(state.bytes() as f64);
            }
        }
        if let Some(topic) = &o.rebirth {
            let payload = crate::decode::sparkplug::rebirth_payload(now_ms);
            let sent = self.acker.publish_nowait(topic.clone(), payload);
            let outcome = if sent { "sent" } else { "dropped" };
            metrics::counter!(telemetry::SPARKPLUG_REBIRTHS, "outcome" => outcome).increment(1);
            info!(topic = ?topic, sent, "Asked a Sparkplug B edge node for a rebirth.");
        }
    }

    /// Decodes a message into `batch` and queues its acknowledgement (due
    /// once the batch is durable).
    fn receive(
        &mut self,
        m: Message,
        acks: &mut AckQueue<Unacked>,
        reporter: &mut Reporter,
        batch: &mut Arrivals,
    ) {
        self.queue.sub(m.cost());
        let unacked = Unacked {
            ack: m.ack,
            received_ms: m.received_ms,
        };
        // Records of the session's identities that are not a message's
        // samples: a redelivery's, where it arrived again, and those that
        // void earlier ones (crate::front::window), which the connection
        // waits to be durable before it subscribes.
        let identity = match (m.disposition, m.id) {
            (Disposition::Store, _) | (Disposition::Probe, _) | (_, None) => None,
            (Disposition::Redelivery, Some(id)) => Some(id),
            (Disposition::Void(Void::Reset), Some(id)) => Some(Identity {
                digest: self.next_lsn,
                ..id
            }),
            (Disposition::Void(Void::Settled), Some(id)) => Some(Identity {
                digest: *self.resumed_at.get(&id.session).unwrap_or(&self.run_start),
                ..id
            }),
            (Disposition::Resumed, Some(id)) => {
                self.resumed_at.insert(id.session, self.next_lsn);
                return;
            }
        };
        if let Some(id) = identity {
            RecordRef {
                lsn: self.next_lsn,
                received_ms: m.received_ms,
                entry: EntryRef::MessageId {
                    session: SessionId::Key(id.session),
                    pkid: id.pkid,
                    digest: id.digest,
                },
            }
            .encode_into(&mut batch.bytes);
            self.next_lsn += 1;
        }
        if m.disposition != Disposition::Store {
            // A redelivery of what is spooled, palletd's own probe, or a
            // void: acknowledged (or told) once everything before it is
            // durable, nothing stored.
            if m.disposition == Disposition::Redelivery {
                metrics::counter!(telemetry::REDELIVERIES_SKIPPED).increment(1);
            }
            acks.push(self.next_lsn, unacked);
            self.release(acks);
            return;
        }
        let decoded = if m.retained && self.decoder.skips_retained(&m.topic) {
            crate::decode::Decoded::skipped(crate::decode::SKIPPED_RETAINED)
        } else {
            self.decoder
                .decode_with(&m.topic, &m.payload, m.props.as_deref(), m.received_ms)
        };
        if let Some(reason) = decoded.skipped {
            metrics::counter!(telemetry::MESSAGES_SKIPPED, "reason" => reason).increment(1);
        }
        self.sparkplug_outcome(&decoded.sparkplug, m.received_ms, batch);
        batch.messages += 1;
        let bytes = &mut batch.bytes;
        let mut append = |lsn: u64, entry: EntryRef<'_>| {
            RecordRef {
                lsn,
                received_ms: m.received_ms,
                entry,
            }
            .encode_into(bytes);
        };
        // Everything refused of the message goes into one dead letter.
        let mut refused = deadletter::Refusals::default();
        for e in &decoded.errors {
            refused.add(e.cause(), e.index(), || e.to_string());
        }
        for d in &decoded.dropped {
            reporter.dropped(d.cause, &m.topic, &d.message);
        }
        let rules = (decoded.subscription)
            .and_then(|i| self.decoder.subscriptions().get(i))
            .map_or(&[][..], |s| &s.thinning[..]);
        for reading in &decoded.readings {
            if !self.sensors.admit(&reading.sensor, m.received_ms) {
                let max = self.sensors.max;
                refused.add("too_many_sensors", Some(reading.index), || {
                    format!(
                        "sensor {:?} is new and limits.max_sensors ({max}) active sensors are already tracked",
                        reading.sensor
                    )
                });
                continue;
            }
            // The verdicts go into the records (a replay reads them back);
            // the points of earlier readings that end a run go first.
            let (thinned, later) = self
                .thinning
                .thin(rules, reading, m.received_ms, self.next_lsn);
            for sample in later.samples(self.next_lsn) {
                append(
                    self.next_lsn,
                    EntryRef::Sample {
                        sensor: &reading.sensor,
                        doc: sample.doc.as_bytes(),
                    },
                );
                self.next_lsn += 1;
                batch.archived += 1;
            }
            let sample = Sample::encode_thinned(reading, self.next_lsn, &thinned);
            if let Err(too_big) = self.shape.check(sample.as_ref()) {
                refused.add("sample_too_large", Some(reading.index), || {
                    too_big.to_string()
                });
                continue;
            }
            append(
                self.next_lsn,
                EntryRef::Sample {
                    sensor: &reading.sensor,
                    doc: sample.doc.as_bytes(),
                },
            );
            self.next_lsn += 1;
            batch.samples += 1;
        }
        if !refused.is_empty() {
            for r in refused.causes() {
                reporter.report(r.cause, &m.topic, &r.error, r.count);
            }
            let lsn = self.next_lsn;
            // Faster than limits.max_deadletter_rate, a dead letter keeps
            // only the start of its payload: every refused message is
            // recorded, a flood of large ones costs little.
            let whole = (m.payload.len().min(deadletter::PAYLOAD_MAX) + 1024) as u64;
            let charged = self.deadletter_room.rate_allows(whole, Instant::now());
            let keep = if charged {
                deadletter::PAYLOAD_MAX
            } else {
                deadletter::PAYLOAD_CUT
            };
            if keep < m.payload.len().min(deadletter::PAYLOAD_MAX) {
                let cause = refused.causes()[0].cause;
                metrics::counter!(telemetry::DEAD_LETTER_PAYLOADS_CUT, "cause" => cause)
                    .increment(1);
            }
            let doc = deadletter::for_message(
                self.tag,
                lsn,
                m.received_ms,
                &m.topic,
                &m.payload,
                &refused,
                keep,
            );
            let doc = bson::to_vec(&doc).unwrap_or_default();
            let confirmed = self.spool.checkpointed();
            let written = self.health.deadletter_bytes_written();
            if self
                .deadletter_room
                .admit(lsn, doc.len() as u64, confirmed, written, charged)
            {
                append(lsn, EntryRef::DeadLetter { doc: &doc });
                self.next_lsn += 1;
                batch.deadletters += 1;
            } else {
                let cause = refused.causes()[0].cause;
                let room = &mut self.deadletter_room;
                metrics::counter!(telemetry::DEAD_LETTERS_DROPPED, "cause" => cause).increment(1);
                match &mut room.logged {
                    Some((at, n)) if at.elapsed() < Duration::from_secs(60) => *n += 1,
                    _ => {
                        let suppressed = room.logged.map_or(0, |l| l.1);
                        tracing::warn!(
                            topic = ?m.topic,
                            cause,
                            share_bytes = room.limit,
                            suppressed,
                            "Dead letters fill their share of the spool (a tenth of spool.max_size) until MongoDB takes them: this one is dropped, counted in palletd_dead_letters_dropped_total. Good readings are spooled as ever."
                        );
                        room.logged = Some((Instant::now(), 0));
                    }
                }
            }
        }
        // The message's identity goes last: recovery cuts a torn write off
        // at its first bad byte, so a message whose identity is recovered
        // has all its records in the spool, and its redelivery may be
        // skipped. (First, a redelivery of a message whose samples were cut
        // with the torn tail was taken as spooled, and its readings lost.)
        if let Some(id) = m.id {
            append(
                self.next_lsn,
                EntryRef::MessageId {
                    session: SessionId::Key(id.session),
                    pkid: id.pkid,
                    digest: id.digest,
                },
            );
            self.next_lsn += 1;
        }
        acks.push(self.next_lsn, unacked);
    }
}

/// Thinning's hold on the spool ([`Admission::hold_for_thinning`]).
struct ThinningHold {
    /// A subscription thins, or an earlier run did (`thinning.lsn`).
    active: bool,
    dir: std::path::PathBuf,
    /// The LSN held from (`u64::MAX`: none; 0 until the first hold).
    lsn: u64,
    /// What thinning held at the last stop, to spool at start.
    read_back: Vec<(String, thinning::Later)>,
    /// The LSN after those: the read-back records stay held until it is
    /// durable.
    start_end: u64,
    let_go: bool,
    save_failed: bool,
    /// The last sweep ended runs for memory (a WARN when it begins).
    over_budget: bool,
}

impl ThinningHold {
    fn open(settings: &crate::config::Settings, spool: &Spool, next_lsn: u64) -> ThinningHold {
        let dir = settings.spool.dir.clone();
        let active = settings
            .subscriptions
            .iter()
            .any(|s| !s.thinning.is_empty())
            || thinning::lsn_path(&dir).exists();
        let read_back = match active {
            true => thinning::read_back(&dir, spool, next_lsn, left_out_window(settings)),
            false => Vec::new(),
        };
        let points: usize = read_back.iter().map(|r| r.1.points.len()).sum();
        let left_out: usize = read_back.iter().map(|r| r.1.left_out.len()).sum();
        if points + left_out > 0 {
            info!(
                points,
                left_out,
                "Thinning: storing the points held at the last stop and the readings left out not yet summed up, read back from the spool."
            );
        }
        ThinningHold {
            active,
            dir,
            lsn: 0,
            read_back,
            start_end: u64::MAX,
            let_go: false,
            save_failed: false,
            over_budget: false,
        }
    }
}

/// `bucket.window` in ms in time series mode, where thinning sums up the
/// values it leaves out per window ([`thinning::Thinning::new`]).
fn left_out_window(settings: &crate::config::Settings) -> Option<i64> {
    (settings.storage.mode == crate::config::StorageMode::Timeseries)
        .then_some(settings.bucket.window.as_millis() as i64)
}

/// Room for a chunk of a snapshot on its way to the writing thread.
async fn room_for_chunk(
    to: Option<mpsc::Sender<sparkplug::Chunk>>,
) -> Option<mpsc::OwnedPermit<sparkplug::Chunk>> {
    to?.reserve_owned().await.ok()
}

/// The end of the snapshot being written (never, if none is).
async fn snapshot_written(file: &mut Option<sparkplug::StateFile>) -> std::io::Result<()> {
    match file {
        Some(f) => f.finished().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::DeadLetterRoom;
    use std::time::{Duration, Instant};

    #[test]
    fn dead_letters_free_their_share_as_they_are_written_or_checkpointed() {
        // A share of 100 bytes.
        let mut room = DeadLetterRoom::new(1000, 1 << 30);
        assert!(room.admit(1, 60, 0, 0, true));
        assert!(room.admit(2, 40, 0, 0, true));
        assert!(
            !room.admit(3, 1, 0, 0, false),
            "full while nothing is written"
        );
        // The pipeline wrote the first (60 bytes): its room is free.
        assert!(room.admit(4, 60, 0, 60, true));
        assert!(!room.admit(5, 1, 0, 60, true));
        // The checkpoint passed the second.
        assert!(room.admit(6, 40, 3, 60, true));
        assert_eq!(room.bytes, 100);
        // Everything written: what an earlier run's replay adds to the
        // count frees nothing of what comes next.
        assert!(room.admit(7, 100, 0, 60 + 100 + 500, true));
        assert!(!room.admit(8, 1, 0, 60 + 100 + 500, true));
    }

    #[test]
    fn dead_letters_come_in_at_their_rate_after_a_minutes_burst() {
        // 10 KiB/s: a minute's burst is 600 KiB (over twice the largest
        // dead letter), then 10 KiB a second.
        let mut room = DeadLetterRoom::new(1 << 40, 10 * 1024);
        let t = Instant::now();
        let mut n = 0;
        while room.rate_allows(1024, t) {
            assert!(room.admit(n, 1024, 0, 0, true));
            n += 1;
        }
        assert_eq!(n, 600, "the burst");
        // Over the rate, cut ones are still admitted (the share allows).
        assert!(room.admit(n, 300, 0, 0, false));
        let later = t + Duration::from_secs(3);
        let mut m = 0;
        while room.rate_allows(1024, later) {
            assert!(room.admit(n + 1 + m, 1024, 0, 0, true));
            m += 1;
        }
        assert_eq!(m, 30, "three seconds' worth");
    }
}
