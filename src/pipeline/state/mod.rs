//! The pipeline's state and decisions, sans-IO: it takes events (records
//! from the admission or read back from the spool, the durable LSN, what the
//! store reports, the time) and returns what to do next as an [`Action`]
//! (read records back, resolve uncertain samples, write a flush, store a
//! checkpoint, seal), the way rumqttc's `MqttState` returns packets and
//! never touches a socket.
//!
//! # Two lanes: live readings first
//! Memory holds two [`Pending`]s. The *live* lane takes the admission's feed
//! (and, after a short gap, reads the log from its cursor on); its sensors
//! fall due by age and fill. The *backlog* lane holds what palletd fell
//! behind on: it reads an LSN range of the log ([`super::backlog`]), in
//! order, and is written oldest first in flushes sized to take about a
//! second. When the live lane falls behind (across an outage its oldest
//! sample, in memory or unread on disk, waited [`Config::behind`], or more
//! unread records piled up than half of memory), memory lets go of the live
//! lane's samples, the backlog range grows to take them and what waits on
//! disk, and the live lane starts again at the records spooled within the
//! last `behind` (the spool's history of its durable end says which; the
//! readings that arrived while the database came back are not behind):
//! live readings are written with their normal lag while the
//! backlog drains with the capacity left. Of the part of that range the
//! live lane had read, only the samples it still held are read again (the
//! others are in MongoDB or dead letters), and what it had not read is
//! certainly not in MongoDB. (Samples whose last write had an unknown
//! outcome are resolved and written before memory lets them go: read again
//! they could be found deleted from a full spool, fate unknown.) A sample's
//! wait counts from when it was spooled, however late memory takes it in.
//! When both lanes have work, the backlog gets
//! [`Config::backfill_share`] of the database's time (recent flush time,
//! halving every 10 s); when the live lane has nothing due, all of it.
//!
//! # What a flush takes
//! Each live sensor is flushed by its own fill and age ([`super::pending`]):
//! when its samples fill its open bucket, when its oldest sample waited
//! `flush.max_delay` (or will before the next flush could be over: a tick
//! and the time flushes take lately), or, when memory is full, oldest
//! first. Under sustained load a reading is therefore durable within
//! about `max_delay` (plus the wait for the flush before it when the
//! database is the bottleneck). Before a seal, every live sensor holding samples of a
//! window the seal closes is flushed, and the seal leaves open the windows
//! the backlog still holds readings of (all of them while some of the
//! backlog is still on disk), so palletd's own holding never makes late
//! data. Dead letters go with the next flush, or on their own
//! once the oldest waited `max_delay`. A flush takes one lane's sensors.
//!
//! # Exactly once
//! Only durable records are written (a flush waits until the spool is
//! durable up to the cursor). A sample that may already be in MongoDB
//! (spooled by an earlier run, read again after memory let it go, or sent
//! in a write whose reply was lost) is *uncertain*; before a sensor's
//! samples are written, its uncertain ones are resolved with the store,
//! and those MongoDB has leave memory. At most one action is outstanding
//! at a time. Within a lane a sensor's queue is in LSN order and holds
//! every sample of the sensor read between two of its samples that is not
//! in MongoDB yet, so a statement can name its samples by their first and
//! last LSN (the lanes never share a statement): the store's rule for
//! "already applied" holds in whatever order the lanes write.
//!
//! # The checkpoint
//! The checkpoint is the lowest LSN still needed: the start of the unread
//! backlog, the live cursor, the lowest sample or dead letter in memory, or
//! the lowest one of the flush in flight. Everything below it is in MongoDB
//! (or was dead-lettered there).

use std::time::{Duration, Instant};

use super::backlog::Backlog;
use super::pending::{Pending, SensorId};
use super::policy::{self, FlushPolicy, Retuned, Share};
use crate::bucket::Shape;
use crate::deadletter::{DeadLetter, Refusal};
use crate::handoff::{Batch, Resolve};
use crate::spool_ids::Tags;

mod feed;
mod outcome;
mod poll;

/// Records read from the spool per read step.
pub(crate) const CATCH_UP_BATCH: usize = 50_000;

/// Flushes of the sensors holding windows a seal closes, before the seal
/// goes ahead anyway (samples for those windows keep arriving late).
const SEAL_FLUSH_ROUNDS: u32 = 3;

/// While flushes keep the database busy, a seal's chunk waits this many
/// times its predecessor's time before it goes first (an eighth of the
/// database's time at least for the seal, the rest for the flushes: a
/// seal is not urgent, a reading's delay is; a soak at 10,000 sensors saw
/// the lag p99 at 27 s while a seal of 10,000 full buckets had a quarter).
const SEAL_WAIT: u32 = 7;

/// Sensors one flush takes at most (its command stays small enough to be
/// quick, and the sensors it wrote start their next delay early; the rest
/// go in the next flush, at once).
pub(crate) const MAX_SENSORS_PER_FLUSH: usize = 1000;

/// Statements one flush sends at most (about: [`Samples::front_within`](crate::bucket::Samples::front_within)
/// counts a statement per window run and full bucket): a sensor with a
/// year of hourly windows pending is written over several flushes, from
/// the front of its queue, as a thousand sensors with one window each are
/// in one. What the database pays per flush follows this, not the sensors.
pub const MAX_STATEMENTS_PER_FLUSH: usize = 1000;

/// Bytes of memory a held sample costs besides its document (its slot).
const SLOT_BYTES: usize = 32;

/// Dead letters held in memory are written as soon as they hold this many
/// bytes (else after `max_delay`, like a sensor): a flood of large ones
/// neither takes the memory of good readings nor waits in the spool.
const DEADLETTER_FLUSH_BYTES: usize = 1 << 20;

/// How the core is set up.
#[derive(Debug, Clone)]
pub struct Config {
    pub shape: Shape,
    /// The spool ids its records were written under (dead-letter ids).
    pub tags: Tags,
    pub max_pending: usize,
    /// Memory for samples and dead letters, in bytes (its share of
    /// `limits.max_memory`): what does not fit stays on disk.
    pub max_pending_bytes: usize,
    pub max_lateness_ms: i64,
    /// How long a sensor's oldest pending sample may wait (`flush.max_delay`).
    pub max_delay: Duration,
    /// How far the policy may stretch that delay (`flush.max_delay_limit`).
    pub max_delay_limit: Duration,
    /// The live lane is behind once its oldest sample waited this long
    /// (or three delays, the delay stretched): its samples become backlog
    /// and it starts again at the newest records.
    pub behind: Duration,
    /// The share of the database's time the backlog gets while live
    /// readings are due too (0 to 1).
    pub backfill_share: f64,
    pub seal_every: Duration,
    /// A seal at `now` closes the windows ending at or before `now - grace`;
    /// `None` when the storage mode has no seal.
    pub seal_grace_ms: Option<i64>,
    /// The checkpoint: the first LSN memory is missing at start.
    pub from: u64,
    /// The first LSN of this run: records below it were spooled by an
    /// earlier run and may be in MongoDB already.
    pub fresh_from: u64,
    /// How many records lie from `from` to `fresh_from` (LSNs jump at a
    /// restart, so the range does not say).
    pub replay_records: u64,
    /// Statements a flush sends at most ([`MAX_STATEMENTS_PER_FLUSH`]; the
    /// tests make it small).
    pub max_statements: usize,
}

impl Config {
    /// The core's configuration from the settings, for a spool whose
    /// records are written under `tags` and that starts with
    /// `replay_records` records to replay from `checkpoint` on and appends
    /// from `next_lsn`; `seal_grace_ms` as the storage mode seals (`None`:
    /// it has no seal).
    pub(crate) fn from_settings(
        s: &crate::config::Settings,
        tags: Tags,
        checkpoint: u64,
        next_lsn: u64,
        replay_records: u64,
        seal_grace_ms: Option<i64>,
    ) -> Config {
        Config {
            shape: s.shape(),
            tags,
            max_pending: s.flush.max_pending_samples,
            max_pending_bytes: s.limits.split().pending,
            max_lateness_ms: s.bucket.max_lateness.as_millis() as i64,
            max_delay: s.flush.max_delay,
            max_delay_limit: s.flush.max_delay_limit,
            behind: Config::behind_for(s.flush.max_delay),
            backfill_share: s.flush.backfill_share,
            seal_every: s.closer.interval,
            seal_grace_ms,
            // Nothing to replay: no backlog to read.
            from: match replay_records {
                0 => next_lsn,
                _ => checkpoint,
            },
            fresh_from: next_lsn,
            replay_records,
            max_statements: MAX_STATEMENTS_PER_FLUSH,
        }
    }

    /// `behind` for a `max_delay`: three delays (at least 1 s), so a
    /// reading that waited its delay and a slow flush or two is not behind.
    pub(crate) fn behind_for(max_delay: Duration) -> Duration {
        (max_delay * 3).max(Duration::from_secs(1))
    }
}

/// Which memory a flush or read is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    Live,
    Backlog,
}

/// What the task should do next.
#[derive(Debug)]
pub(crate) enum Action {
    /// Store this checkpoint (everything below is in MongoDB).
    Checkpoint(u64),
    /// Read up to `max` records from `from` on, below `limit`, and hand
    /// them to [`Core::records`].
    Read {
        lane: Lane,
        from: u64,
        max: usize,
        limit: u64,
    },
    /// Ask the store which of these samples are in MongoDB; hand the answer
    /// to [`Core::resolved`].
    Resolve(Vec<Resolve>),
    /// Write this flush; hand it back with the outcomes to [`Core::written`].
    Write(Batch),
    /// Seal the windows that are over at `now_ms` (held back, while a
    /// backlog drains, to before the backlog's oldest window); report with
    /// [`Core::sealed`]. `late`: after [`SEAL_FLUSH_ROUNDS`] flushes, live
    /// sensors still hold samples of windows it closes (late readings kept
    /// arriving); they go into new buckets. A seal goes in chunks: `first`
    /// is a closer run's first; while the store reports more to seal, the
    /// next chunk follows with one other action at most in between (a
    /// flush that fell due), so the hour's seal never holds flushes up for
    /// its whole length.
    Seal {
        now_ms: i64,
        late: bool,
        first: bool,
    },
    /// Shutdown: everything in memory is written.
    Done,
}

/// What a finished flush did, for the task to record as metrics and logs
/// (the core names no metric).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Flushed {
    /// The lane it wrote.
    pub lane: Option<Lane>,
    /// The age (now minus its timestamp, seconds) of each sample stored.
    pub ages: Vec<f64>,
    pub samples_stored: u64,
    /// Of those, from the backlog.
    pub backlog_stored: u64,
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

/// What is behind, for metrics, `/readyz` and the STATUS line.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct BacklogStatus {
    /// Readings not yet in MongoDB that the live lane gave up on or a
    /// restart left: in memory, plus an estimate of those on disk.
    pub readings: u64,
    /// The smallest timestamp of those in memory (ms).
    pub oldest_ts_ms: Option<i64>,
}

/// The action in progress.
#[derive(Debug, Clone, Copy)]
enum Busy {
    Read(Lane),
    Resolve,
    Write {
        lane: Lane,
        low: Option<u64>,
        samples: usize,
        deadletters: usize,
        /// Bytes of the spooled dead letters in the write.
        spooled_deadletter_bytes: u64,
        started: Instant,
    },
    /// Since when.
    Seal(Instant),
}

pub struct Core {
    config: Config,
    policy: FlushPolicy,
    /// When the policy last warned that memory held the delay back.
    policy_limit_warned: Option<Instant>,
    live: Pending,
    backlog: Pending,
    deadletters: Vec<DeadLetter>,
    /// When the oldest dead letter in memory arrived (monotonic ms).
    deadletters_since: Option<i64>,
    /// Samples refused on the way (dead-lettered here), for the task to
    /// count and log ([`Core::take_refusals`]).
    refusals: Vec<Refusal>,
    /// The live lane's first LSN not in memory: records from it on are on
    /// disk only (or not written yet).
    cursor: u64,
    /// The backlog's range of the spool not read yet.
    range: Backlog,
    /// Everything below this LSN is durable in the spool.
    durable: u64,
    checkpoint_sent: u64,
    checkpoint_due: Option<u64>,
    busy: Option<Busy>,
    /// The lane and sensors of the flush being prepared (resolved, then
    /// written).
    flushing: Option<(Lane, Vec<SensorId>)>,
    /// The resolve in progress is for a fall-back, not a flush.
    resolving_to_fall_back: bool,
    /// The seal being prepared: its time (ms), how many flushes of the
    /// sensors holding windows it closes were made for it, and whether it
    /// is its closer run's first chunk.
    seal_at: Option<(i64, u32, bool)>,
    /// Windows ending at or before this were sealed by the last seal.
    sealed_until: Option<i64>,
    /// A seal in chunks is under way: its next chunk goes when nothing else
    /// is to be done, or first from this time on (a chunk that took `d`
    /// waits up to [`SEAL_WAIT`] x `d`: at least an eighth of the
    /// database's time while flushes keep it busy, all of it otherwise).
    seal_next: Option<Instant>,
    stopping: bool,
    /// The last poll wanted to write but the spool was not durable yet.
    blocked: bool,
    share: Share,
    /// Samples the next backlog flush takes (from the last one's speed).
    backlog_batch: usize,
    /// The last write had to wait for the database (an outage).
    outage: bool,
    /// When the live lane had last read everything durable (mono ms): what
    /// waits on disk unread is at most this old.
    caught_up_ms: i64,
    /// The durable end as it was [`Core::behind`] ago, from the spool's
    /// history (`None`: it does not reach back that far): records from it
    /// on are not behind, and a fall-back leaves them to the live lane.
    recent_from: Option<u64>,
    /// Samples per record read back (to estimate the backlog on disk).
    samples_per_record: f64,
    /// Bytes per record taken in lately (to size reads by bytes).
    record_bytes: f64,
    /// Bytes of the dead letters held, and of those of them read from the
    /// spool (not made here from a refused sample).
    deadletter_bytes: usize,
    spooled_deadletter_bytes: u64,
    /// Bytes of spooled dead letters written to MongoDB so far (the
    /// admission's dead-letter share frees by them).
    deadletter_bytes_written: u64,
    /// The core's monotonic clock starts here (deadlines never follow a
    /// step of the wall clock).
    epoch: Instant,
    /// The time of the last poll.
    now: Instant,
}

impl Core {
    pub fn new(config: Config, now: Instant) -> Core {
        let max_delay_ms = config.max_delay.as_millis() as i64;
        // What an earlier run left is the first backlog; live readings go
        // first from the start.
        let cursor = config.from.max(config.fresh_from);
        Core {
            policy: FlushPolicy::new(
                config.max_delay,
                config.max_delay_limit,
                config.seal_every,
                now,
            ),
            policy_limit_warned: None,
            live: {
                let mut live = Pending::new(config.shape, config.fresh_from, max_delay_ms);
                live.set_early_ms(FlushPolicy::tick_of(config.max_delay).as_millis() as i64);
                live
            },
            backlog: Pending::new(config.shape, config.fresh_from, max_delay_ms).untimed(),
            deadletters: Vec::new(),
            deadletters_since: None,
            refusals: Vec::new(),
            cursor,
            range: Backlog::new(config.from, cursor, config.replay_records),
            durable: cursor,
            checkpoint_sent: config.from,
            checkpoint_due: None,
            busy: None,
            flushing: None,
            resolving_to_fall_back: false,
            seal_at: None,
            sealed_until: None,
            seal_next: None,
            stopping: false,
            blocked: false,
            share: Share::new(now),
            backlog_batch: policy::BACKLOG_FLUSH_MIN,
            outage: false,
            caught_up_ms: 0,
            recent_from: None,
            samples_per_record: 0.5,
            record_bytes: 128.0,
            deadletter_bytes: 0,
            spooled_deadletter_bytes: 0,
            deadletter_bytes_written: 0,
            epoch: now,
            now,
            config,
        }
    }

    /// Monotonic ms of `now` since the core started.
    fn mono(&self, now: Instant) -> i64 {
        now.saturating_duration_since(self.epoch).as_millis() as i64
    }

    fn lane(&mut self, lane: Lane) -> &mut Pending {
        match lane {
            Lane::Live => &mut self.live,
            Lane::Backlog => &mut self.backlog,
        }
    }

    /// Samples held in memory.
    pub(crate) fn pending(&self) -> usize {
        self.live.count() + self.backlog.count()
    }

    /// Samples in memory not yet in MongoDB, the flush in flight included.
    pub(crate) fn unwritten(&self) -> usize {
        self.leftover().samples
    }

    /// The live lane's first LSN not in memory.
    #[cfg(test)]
    pub(crate) fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Records on disk that memory does not hold yet.
    pub(crate) fn backlog(&self) -> u64 {
        self.range.unread() + self.durable.saturating_sub(self.cursor)
    }

    /// What the backlog lane holds and has yet to read (a scan of memory:
    /// call it about once a second).
    pub(crate) fn backlog_status(&self) -> BacklogStatus {
        let unread = self.range.unread() as f64;
        BacklogStatus {
            readings: self.backlog.count() as u64 + (unread * self.samples_per_record) as u64,
            oldest_ts_ms: self.backlog.min_ts(),
        }
    }

    fn held(&self) -> usize {
        self.pending() + self.deadletters.len()
    }

    /// Bytes memory holds: each sample's document and its slot, and the
    /// dead letters.
    pub(crate) fn held_bytes(&self) -> usize {
        self.live.bytes()
            + self.backlog.bytes()
            + SLOT_BYTES * self.pending()
            + self.deadletter_bytes
    }

    /// Bytes of spooled dead letters written to MongoDB since the start.
    pub(crate) fn deadletter_bytes_written(&self) -> u64 {
        self.deadletter_bytes_written
    }

    /// Room for the live lane, in records: whatever memory has left, by
    /// count and by bytes (at the records' mean size lately).
    fn live_room(&self) -> usize {
        let bytes = self
            .config
            .max_pending_bytes
            .saturating_sub(self.held_bytes());
        let by_bytes = (bytes as f64 / self.record_bytes.max(1.0)) as usize;
        self.config
            .max_pending
            .saturating_sub(self.held())
            .min(by_bytes)
    }

    /// `behind`, or three delays while the policy stretched the delay.
    fn behind_ms(&self) -> i64 {
        self.behind().as_millis() as i64
    }

    /// How long the live lane's oldest sample waits before it is behind:
    /// `behind`, or three delays while the policy stretched the delay.
    pub(crate) fn behind(&self) -> Duration {
        self.config.behind.max(self.policy.delay() * 3)
    }

    /// The durable end as it was [`Core::behind`] ago (`None`: unknown).
    pub(crate) fn set_recent_from(&mut self, lsn: Option<u64>) {
        self.recent_from = lsn;
    }

    /// How long a sensor's oldest reading waits now (`flush.max_delay`, or
    /// stretched by the policy).
    pub(crate) fn delay(&self) -> Duration {
        self.policy.delay()
    }

    /// The delay, if the policy stretched it beyond `flush.max_delay`.
    pub(crate) fn stretched_delay(&self) -> Option<Duration> {
        let d = self.policy.delay();
        (d > self.config.max_delay).then_some(d)
    }

    /// The samples refused since the last call (dead-lettered here: too
    /// large for a bucket, or refused by the database), for the task to
    /// count and log.
    pub(crate) fn take_refusals(&mut self) -> Vec<Refusal> {
        std::mem::take(&mut self.refusals)
    }

    /// At the end of a policy period: the delay follows how long due
    /// sensors waited past it ([`FlushPolicy::retune`]).
    fn retune(&mut self, now: Instant) {
        if !self.policy.period_over(now) {
            return;
        }
        let late = Duration::from_millis(self.live.take_lateness().max(0) as u64);
        let half_full = self.held() * 2 >= self.config.max_pending
            || self.held_bytes() * 2 >= self.config.max_pending_bytes;
        let Some(retuned) = self.policy.retune(now, late, half_full) else {
            return;
        };
        let delay = self.policy.delay();
        self.live.set_delay_ms(delay.as_millis() as i64);
        self.live
            .set_early_ms(self.policy.early().as_millis() as i64);
        let shown = humantime::format_duration(Duration::from_millis(delay.as_millis() as u64));
        let late = humantime::format_duration(Duration::from_millis(late.as_millis() as u64));
        match retuned {
            Retuned::Stretched(_) => tracing::info!(
                delay = %shown,
                late_by = %late,
                "The database is not keeping up with the flush delay: sensors wait longer, so each statement carries more readings."
            ),
            Retuned::Shrunk(_) => tracing::info!(
                delay = %shown,
                "The database keeps up again: the flush delay shrinks."
            ),
            Retuned::HeldByMemory => {
                // Once per flush.max_delay_limit at most: it holds while
                // the load lasts.
                let quiet = self.policy_limit_warned.is_some_and(|at| {
                    now.saturating_duration_since(at) < self.config.max_delay_limit
                });
                if !quiet {
                    self.policy_limit_warned = Some(now);
                    tracing::warn!(
                        delay = %shown,
                        late_by = %late,
                        "The database is not keeping up with the flush delay, and the delay cannot stretch: half of the memory for pending readings (limits.max_memory) is in use. Readings wait on disk and are written with fewer to a statement; raise limits.max_memory (docs/performance.md, sizing)."
                    );
                }
            }
        }
    }

    /// Whether records of `bytes` fit into memory now.
    fn fits_bytes(&self, bytes: usize) -> bool {
        self.held_bytes() + bytes <= self.config.max_pending_bytes
    }

    /// Room for the backlog lane: at most half of memory.
    fn backlog_room(&self) -> usize {
        (self.config.max_pending / 2)
            .saturating_sub(self.backlog.count())
            .min(self.live_room())
    }

    /// The spool is durable below `lsn`.
    pub(crate) fn set_durable(&mut self, lsn: u64) {
        self.durable = self.durable.max(lsn);
    }

    /// A flush waits until the spool is durable up to this LSN.
    pub(crate) fn needs_durable(&self) -> Option<u64> {
        self.blocked.then_some(self.cursor)
    }

    /// When to call [`Core::poll`] again if nothing else happens.
    pub(crate) fn deadline(&self) -> Instant {
        let mono_now = self.mono(self.now);
        let due = [
            self.live.next_due_ms(),
            self.deadletters_since
                .map(|t| t + self.config.max_delay.as_millis() as i64),
            self.live
                .oldest_since_ms()
                .map(|t| t + self.behind_ms() + 1),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|ms| self.now + Duration::from_millis((ms - mono_now).max(0) as u64));
        self.policy.deadline(due)
    }

    /// Whether shutdown began.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping
    }

    /// Shutdown: flush what memory holds, read nothing more, seal nothing.
    pub(crate) fn stop(&mut self) {
        self.stopping = true;
    }
}
