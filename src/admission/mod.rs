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

mod deadletters;
mod receive;
pub(crate) mod sensors;
pub mod sparkplug;
pub mod thinning;

pub(crate) use deadletters::*;

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::bucket::{Sample, Shape};
use crate::clock::now_ms;
use crate::decode::Decoder;
use crate::front::acks::AckQueue;
use crate::handoff::Feed;
use crate::ingest::{AckToken, Acker, Message};
use crate::spool::{EntryRef, RecordRef, Spool};
use crate::telemetry;
use crate::telemetry::Reporter;
pub use sensors::SensorLimit;

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

    /// Appends one record to the batch's bytes at `*next` (the next LSN),
    /// which it moves on.
    fn append(&mut self, next: &mut u64, received_ms: i64, entry: EntryRef<'_>) {
        RecordRef {
            lsn: *next,
            received_ms,
            entry,
        }
        .encode_into(&mut self.bytes);
        *next += 1;
    }

    /// Appends a sample of `sensor` ([`Arrivals::append`]).
    fn sample(&mut self, next: &mut u64, received_ms: i64, sensor: &str, sample: &Sample) {
        let doc = sample.doc.as_bytes();
        self.append(next, received_ms, EntryRef::Sample { sensor, doc });
    }
}

/// Messages taken from the channel at once, when that many are waiting.
const MAX_BATCH_MESSAGES: usize = 512;

/// A batch takes no more messages once its records hold this many bytes:
/// one spool append stays within the bytes a group commit leaves unsynced
/// ([`crate::spool`]'s `MAX_UNSYNCED`), so a power cut tears only whole
/// batches' worth at the end.
pub(crate) const MAX_BATCH_BYTES: usize = 256 << 10;

/// How often the spool gauges are refreshed.
const GAUGE_EVERY: Duration = Duration::from_millis(100);
/// How often thinned fields are looked at for a silent run to end.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How often the quietest sensors are told to the status page.
const QUIET_EVERY: Duration = Duration::from_secs(2);
/// How often PUBACKs that did not fit into a client's request channel are
/// offered again. A wait for room, not a retry after a failure (no
/// [`crate::retry::Backoff`]): rumqttc's channel says nothing when it has
/// room, and its event loop empties it at every poll.
const ACK_ROOM_EVERY: Duration = Duration::from_millis(2);

/// A message waiting for its acknowledgement.
struct Unacked {
    /// `None` for QoS 0: nothing to send.
    ack: Option<AckToken>,
    received_ms: i64,
}

pub(crate) struct Admission {
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
    /// The last value taken in from each topic: a retained copy of it is
    /// passed over ([`crate::front::retained`]).
    last_values: crate::front::retained::LastValues,
}

/// The byte budgets of `limits.max_memory` the admission takes from and
/// gives to.
pub(crate) struct Budgets {
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
                crate::store::left_out_window(settings),
                settings.limits.split().thinning,
            ),
            thinning_hold,
            queue: budgets.queue,
            feed_budget: budgets.feed,
            deadletter_room: DeadLetterRoom::new(
                settings.spool.max_size,
                settings.limits.max_deadletter_rate,
            ),
            last_values: recovered.last_values.clone(),
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
                self.sweep_thinning().await;
            }
            if self.tell_quiet && quiet_dirty && quiet_at.elapsed() >= QUIET_EVERY {
                quiet_at = Instant::now();
                quiet_dirty = false;
                self.health.set_quiet(self.sensors.quietest(10));
            }
            let full = self.spool_full(&mut full_since);
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
                _ = tokio::time::sleep(ACK_ROOM_EVERY), if self.acker.waiting() > 0 => {
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
        self.finish(rx, acks, reporter, abort).await
    }

    /// After the stop: the messages already received are spooled, the
    /// points thinning holds stored, and every PUBACK due handed to the
    /// client; `Err` with how many stay unacknowledged.
    async fn finish(
        mut self,
        mut rx: mpsc::Receiver<Message>,
        mut acks: AckQueue<Unacked>,
        mut reporter: Reporter,
        abort: CancellationToken,
    ) -> Result<(), usize> {
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
                _ = tokio::time::sleep(ACK_ROOM_EVERY) => {}
                _ = abort.cancelled() => return Err(acks.len() + self.acker.waiting()),
            }
        }
        if acks.is_empty() {
            Ok(())
        } else {
            Err(acks.len())
        }
    }

    /// Ends the runs of silent thinned fields (after their max_interval, or
    /// the longest silent first when runs hold more than their share of
    /// memory), stores their held points, and moves the spool's hold.
    async fn sweep_thinning(&mut self) {
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

    /// Whether the spool is full, saying so when that changes.
    fn spool_full(&self, full_since: &mut Option<Instant>) -> bool {
        let full = self.spool.is_full();
        match (full, *full_since) {
            (true, None) => {
                *full_since = Some(Instant::now());
                error!(
                bytes = self.spool.bytes(),
                max_size = self.spool.max_size(),
                queued_bytes = self.spool.queued(),
                "Spool is full: not acknowledging new messages until the database takes the backlog. The broker keeps them up to its own per-client limit (Mosquitto: max_queued_messages, 1000 by default, then it drops them); spool.when_full = \"drop_oldest\" keeps the newest instead."
            );
            }
            (false, Some(t)) => {
                info!(after = ?Duration::from_secs(t.elapsed().as_secs()), "Spool has room again; taking messages.");
                *full_since = None;
            }
            _ => {}
        }
        full
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
                batch.sample(&mut self.next_lsn, now_ms(), &sensor, &sample);
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
        // The admission's table and the spool's copy.
        let topics = self.last_values.len() * 2 * crate::front::retained::BYTES_PER_TOPIC;
        metrics::gauge!(telemetry::MEMORY_BYTES, "part" => "retained").set(topics as f64);
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
            true => thinning::read_back(
                &dir,
                spool,
                next_lsn,
                crate::store::left_out_window(settings),
            ),
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
