//! The flush policy: when a flush may start, when to seal, and the
//! backlog's share of the database's time and flush size. Sans-IO: it
//! is told the time and answers "should I now?"; which sensors a flush
//! takes is [`super::pending::Pending::due`]'s answer (ready, overdue, or
//! the oldest under memory pressure).
//!
//! - A flush starts at most once per *tick* (a tenth of `flush.max_delay`,
//!   between 10 ms and 1 s), so sensors falling due close together share
//!   one command; at once after a full flush (one that took as many sensors
//!   as a flush may), under memory pressure and at shutdown.
//! - A sensor is taken once it falls due before the next flush could be
//!   over: within a tick plus the time flushes take lately (smoothed, at
//!   most a quarter of the delay; [`FlushPolicy::early`]), so its oldest
//!   reading is durable about when its delay is over, not a flush later.
//! - Pacing by the database comes from there being one flush at a time:
//!   when the database is the bottleneck, a flush takes longer, more
//!   sensors fall due meanwhile and wait longer, so the next command
//!   carries more sensors and each statement more samples.
//! - Every `closer.interval` a seal, after the sensors holding samples of
//!   the windows it closes were flushed (the pipeline core sees to that).
//!   The first seal is due at start (it also sets the collection up early).
//!
//! # The delay, tuned to the database
//! A sensor is due once its oldest sample waited the *delay*: at most
//! `flush.max_delay` while the database keeps up. When it does not (each
//! statement carries few samples and there are more sensors falling due
//! per second than statements the database takes: 100,000 sensors at one
//! reading in 20 s and a 10 s delay are 3,300 statements a second), due
//! sensors queue up and wait past their deadline. Every *period* (the
//! delay, at least a second) the policy looks at the longest such wait
//! of a sensor a flush took ([`FlushPolicy::retune`]):
//! - longer than half the delay in two periods in a row (one stall of the
//!   server is not a database that cannot keep up): the delay is
//!   stretched by half, up to `flush.max_delay_limit`, so each sensor is written less often with
//!   more samples per statement (unless memory is half full: then holding
//!   longer only moves the readings to disk; [`Retuned::HeldByMemory`]
//!   says so, and the core warns);
//! - shorter than an eighth of the delay for [`CALM_PERIODS`] periods in
//!   a row since the last stretch: it shrinks by a fifth, down to
//!   `flush.max_delay`, and keeps shrinking a period at a time while that
//!   lasts.
//!
//! A period in which a write met database errors (an outage: waiting says
//! nothing of the database's speed) changes nothing, and the time seals
//! took is taken off the wait (no flush starts during a chunk of a seal,
//! and the hourly seal of every sensor's bucket takes seconds in all). So under sustained
//! load a reading is durable within the delay plus half of it plus one
//! flush, the delay at most `max_delay_limit`; beyond that the database
//! cannot keep up even with the longest delay allowed, and the lag grows.

use std::time::{Duration, Instant};

/// Periods without a stretch before the delay may shrink.
pub(crate) const CALM_PERIODS: u32 = 4;

/// How long a backlog flush should take: live sensors falling due wait at
/// most about this long behind one.
const BACKLOG_FLUSH_TARGET: Duration = Duration::from_secs(1);

/// Backlog flush sizes (samples), whatever the last one measured.
pub(crate) const BACKLOG_FLUSH_MIN: usize = 1_000;
const BACKLOG_FLUSH_MAX: usize = 100_000;

/// Recent database time halves in this long (the backlog's share).
const SHARE_HALF_LIFE: Duration = Duration::from_secs(10);

/// The samples the next backlog flush takes, after one stored `stored` in
/// `took`: about [`BACKLOG_FLUSH_TARGET`]'s worth at that speed.
pub(crate) fn backlog_batch(stored: u64, took: Duration) -> usize {
    let per_sec = stored as f64 / took.as_secs_f64().max(1e-3);
    ((per_sec * BACKLOG_FLUSH_TARGET.as_secs_f64()) as usize)
        .clamp(BACKLOG_FLUSH_MIN, BACKLOG_FLUSH_MAX)
}

/// Recent database time of the live and the backlog lane, halving every
/// [`SHARE_HALF_LIFE`]: while both have work, the backlog gets
/// `flush.backfill_share` of it.
#[derive(Debug)]
pub(crate) struct Share {
    live: f64,
    backlog: f64,
    at: Instant,
}

impl Share {
    pub fn new(now: Instant) -> Share {
        Share {
            live: 0.0,
            backlog: 0.0,
            at: now,
        }
    }

    /// A flush of the backlog (or the live) lane took `took`, ending `now`.
    pub fn add(&mut self, backlog: bool, took: Duration, now: Instant) {
        let age = now.saturating_duration_since(self.at).as_secs_f64();
        let keep = 0.5f64.powf(age / SHARE_HALF_LIFE.as_secs_f64());
        self.live *= keep;
        self.backlog *= keep;
        self.at = now;
        match backlog {
            false => self.live += took.as_secs_f64(),
            true => self.backlog += took.as_secs_f64(),
        }
    }

    /// Whether the backlog had less than `share` of the recent time.
    pub(crate) fn backlog_owed(&self, share: f64) -> bool {
        self.backlog <= share * (self.live + self.backlog)
    }
}

#[derive(Debug)]
pub(crate) struct FlushPolicy {
    tick: Duration,
    seal_every: Duration,
    next_flush: Instant,
    next_seal: Instant,
    /// `flush.max_delay` and `flush.max_delay_limit`.
    base: Duration,
    limit: Duration,
    delay: Duration,
    period_from: Instant,
    /// A write of this period met database errors.
    errors: bool,
    /// Periods since the delay was last stretched (or since the start).
    calm: u32,
    /// When the seal in progress began, and how long seals took this
    /// period (no flush starts during one: that wait is not the flushes').
    seal_began: Option<Instant>,
    sealing: Duration,
    /// The last period was late too (a stretch takes two in a row: one
    /// stall of the server is not a database that cannot keep up).
    was_late: bool,
    /// How long live flushes take lately (smoothed).
    flush_time: Duration,
}

/// How [`FlushPolicy::retune`] changed the delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retuned {
    Stretched(Duration),
    Shrunk(Duration),
    /// It would have stretched, but memory is half full: the readings a
    /// longer delay holds have no room (`limits.max_memory`).
    HeldByMemory,
}

impl FlushPolicy {
    pub fn new(
        max_delay: Duration,
        max_delay_limit: Duration,
        seal_every: Duration,
        now: Instant,
    ) -> FlushPolicy {
        FlushPolicy {
            tick: Self::tick_of(max_delay),
            seal_every,
            next_flush: now,
            next_seal: now,
            base: max_delay,
            limit: max_delay_limit.max(max_delay),
            delay: max_delay,
            period_from: now,
            errors: false,
            calm: 0,
            seal_began: None,
            sealing: Duration::ZERO,
            was_late: false,
            flush_time: Duration::ZERO,
        }
    }

    /// A live flush that wrote took `took` (not counted while the database
    /// met errors: an outage says nothing of a flush's time).
    pub(crate) fn flush_took(&mut self, took: Duration) {
        self.flush_time = (self.flush_time * 3 + took) / 4;
    }

    /// How long before its deadline a sensor is taken: a tick (the next
    /// flush may be that far away) plus the time a flush takes lately, at
    /// most a quarter of the delay.
    pub(crate) fn early(&self) -> Duration {
        self.tick + self.flush_time.min(self.delay / 4)
    }

    /// How long a sensor's oldest sample waits before it is due now.
    pub(crate) fn delay(&self) -> Duration {
        self.delay
    }

    /// A write met database errors (this period changes nothing).
    pub(crate) fn met_errors(&mut self) {
        self.errors = true;
    }

    /// Whether the period is over at `now` (then call
    /// [`FlushPolicy::retune`]).
    pub(crate) fn period_over(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.period_from) >= self.period()
    }

    /// The delay, at least a second.
    fn period(&self) -> Duration {
        self.delay.max(Duration::from_secs(1))
    }

    /// At the end of a period: `late`, the longest a sensor taken in it
    /// had waited past its deadline (less the time seals took in it: the
    /// closer's hourly seal of every sensor's bucket can take seconds, and
    /// flushes wait for it); `memory_half_full`: stretching would only
    /// move readings to disk. Starts the next period.
    pub(crate) fn retune(
        &mut self,
        now: Instant,
        late: Duration,
        memory_half_full: bool,
    ) -> Option<Retuned> {
        self.period_from = now;
        let late = late.saturating_sub(std::mem::take(&mut self.sealing));
        if std::mem::take(&mut self.errors) {
            return None;
        }
        if late > self.delay / 2 {
            // Not calm, whether it can stretch or not.
            self.calm = 0;
            if std::mem::replace(&mut self.was_late, true) && self.delay < self.limit {
                if memory_half_full {
                    return Some(Retuned::HeldByMemory);
                }
                self.was_late = false;
                self.delay = (self.delay * 3 / 2).min(self.limit);
                return Some(Retuned::Stretched(self.delay));
            }
            return None;
        }
        self.was_late = false;
        self.calm = self.calm.saturating_add(1);
        if late < self.delay / 8 && self.calm >= CALM_PERIODS && self.delay > self.base {
            self.delay = (self.delay * 4 / 5).max(self.base);
            return Some(Retuned::Shrunk(self.delay));
        }
        None
    }

    /// A tenth of the delay, between 10 ms and 1 s.
    pub(crate) fn tick_of(max_delay: Duration) -> Duration {
        (max_delay / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Whether a flush may start at `now` (`urgent`: memory is full, or
    /// shutdown).
    pub(crate) fn may_flush(&self, now: Instant, urgent: bool) -> bool {
        urgent || now >= self.next_flush
    }

    /// A flush started at `started`; `full`: it took as many sensors as a
    /// flush may, so more may be due right away.
    pub(crate) fn flushed(&mut self, started: Instant, full: bool) {
        self.next_flush = if full { started } else { started + self.tick };
    }

    /// Whether a seal is due now.
    pub(crate) fn seal_due(&self, now: Instant) -> bool {
        now >= self.next_seal
    }

    /// A seal begins at `now`.
    pub(crate) fn seal_began(&mut self, now: Instant) {
        self.seal_began = Some(now);
    }

    /// A chunk of a seal ended at `now` and more are to follow (flushes
    /// may go in between).
    pub(crate) fn seal_paused(&mut self, now: Instant) {
        if let Some(began) = self.seal_began.take() {
            self.sealing += now.saturating_duration_since(began);
        }
    }

    /// A seal ran at `now` (successfully or not: the next one retries).
    pub(crate) fn sealed(&mut self, now: Instant) {
        self.seal_paused(now);
        let scheduled = self.next_seal + self.seal_every;
        self.next_seal = if scheduled < now {
            now + self.seal_every
        } else {
            scheduled
        };
    }

    /// When to be asked again at the latest, given when the oldest pending
    /// sensor falls due (and, while the delay is stretched, at the end of
    /// the period, so it shrinks back while nothing arrives).
    pub(crate) fn deadline(&self, next_due: Option<Instant>) -> Instant {
        let flush = next_due.map(|d| d.max(self.next_flush));
        let at = flush.map_or(self.next_seal, |f| f.min(self.next_seal));
        match self.delay > self.base {
            true => at.min(self.period_from + self.period()),
            false => at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn flushes_start_at_most_once_a_tick_unless_urgent() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(10 * SEC, 10 * SEC, 60 * SEC, t0);
        assert_eq!(FlushPolicy::tick_of(10 * SEC), SEC);
        assert_eq!(
            FlushPolicy::tick_of(Duration::from_millis(50)),
            Duration::from_millis(10)
        );
        assert!(p.may_flush(t0, false));
        p.flushed(t0, false);
        assert!(!p.may_flush(t0 + SEC / 2, false));
        assert!(p.may_flush(t0 + SEC / 2, true), "memory full");
        assert!(p.may_flush(t0 + SEC, false));
        p.flushed(t0 + SEC, true);
        assert!(p.may_flush(t0 + SEC, false), "after a full flush at once");
    }

    #[test]
    fn a_seal_is_due_at_start_and_then_every_interval() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(10 * SEC, 10 * SEC, 60 * SEC, t0);
        assert!(p.seal_due(t0));
        p.sealed(t0);
        assert!(!p.seal_due(t0 + 59 * SEC));
        assert!(p.seal_due(t0 + 60 * SEC));
        // Late: the next one an interval after this one.
        p.sealed(t0 + 200 * SEC);
        assert!(!p.seal_due(t0 + 259 * SEC));
        assert!(p.seal_due(t0 + 260 * SEC));
    }

    #[test]
    fn the_deadline_is_the_next_due_sensor_or_seal() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(10 * SEC, 10 * SEC, 60 * SEC, t0);
        p.sealed(t0);
        p.flushed(t0, false);
        assert_eq!(p.deadline(None), t0 + 60 * SEC);
        assert_eq!(p.deadline(Some(t0 + 5 * SEC)), t0 + 5 * SEC);
        assert_eq!(p.deadline(Some(t0)), t0 + SEC, "not before the tick");
        assert_eq!(p.deadline(Some(t0 + 90 * SEC)), t0 + 60 * SEC);
        // Stretched: asked again at the end of the period.
        let mut p = FlushPolicy::new(SEC, 60 * SEC, 60 * SEC, t0);
        p.sealed(t0);
        assert_eq!(p.deadline(None), t0 + 60 * SEC);
        p.retune(t0 + SEC, 2 * SEC, false);
        p.retune(t0 + 2 * SEC, 2 * SEC, false);
        assert_eq!(p.delay(), 1500 * SEC / 1000);
        assert_eq!(p.deadline(None), t0 + 3500 * SEC / 1000);
    }

    /// Due sensors waiting past their deadline two periods in a row stretch
    /// the delay by half, up to the limit; once they no longer wait, it
    /// shrinks back a fifth a period after CALM_PERIODS calm ones, down to
    /// max_delay. Errors and a half-full memory stop a stretch.
    #[test]
    fn the_delay_stretches_while_sensors_wait_past_it_and_shrinks_back() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(10 * SEC, 40 * SEC, 60 * SEC, t0);
        let mut t = t0;
        let mut period = |p: &mut FlushPolicy, late: Duration, full: bool| {
            assert!(!p.period_over(t + p.delay() - Duration::from_millis(1)));
            t += p.delay();
            assert!(p.period_over(t));
            p.retune(t, late, full)
        };
        assert_eq!(
            period(&mut p, 4 * SEC, false),
            None,
            "within half the delay"
        );
        assert_eq!(period(&mut p, 6 * SEC, false), None, "late once: a stall");
        assert_eq!(period(&mut p, 4 * SEC, false), None, "and not again");
        assert_eq!(period(&mut p, 6 * SEC, false), None, "late");
        assert_eq!(
            period(&mut p, 6 * SEC, false),
            Some(Retuned::Stretched(15 * SEC)),
            "twice in a row"
        );
        assert_eq!(period(&mut p, 8 * SEC, false), None);
        assert_eq!(
            period(&mut p, 8 * SEC, false),
            Some(Retuned::Stretched(22_500 * SEC / 1000))
        );
        assert_eq!(period(&mut p, 20 * SEC, false), None);
        p.met_errors();
        assert_eq!(period(&mut p, 20 * SEC, false), None, "an outage");
        assert_eq!(
            period(&mut p, 20 * SEC, true),
            Some(Retuned::HeldByMemory),
            "memory half full"
        );
        assert_eq!(
            period(&mut p, 20 * SEC, false),
            Some(Retuned::Stretched(33_750 * SEC / 1000))
        );
        assert_eq!(period(&mut p, 20 * SEC, false), None);
        assert_eq!(
            period(&mut p, 20 * SEC, false),
            Some(Retuned::Stretched(40 * SEC)),
            "the limit"
        );
        assert_eq!(
            period(&mut p, 30 * SEC, false),
            None,
            "at the limit, not calm"
        );
        assert_eq!(period(&mut p, 30 * SEC, false), None, "still at the limit");
        // Calm again: CALM_PERIODS periods, then a fifth a period.
        for _ in 1..CALM_PERIODS {
            assert_eq!(period(&mut p, SEC, false), None);
        }
        assert_eq!(period(&mut p, SEC, false), Some(Retuned::Shrunk(32 * SEC)));
        assert_eq!(
            period(&mut p, SEC, false),
            Some(Retuned::Shrunk(25_600 * SEC / 1000))
        );
        assert_eq!(
            period(&mut p, 5 * SEC, false),
            None,
            "not calm enough to shrink"
        );
        let mut shrunk = 0;
        while let Some(Retuned::Shrunk(d)) = period(&mut p, Duration::ZERO, false) {
            shrunk += 1;
            assert!(d >= 10 * SEC);
        }
        assert_eq!(p.delay(), 10 * SEC);
        assert!(shrunk >= 4, "{shrunk}");
    }

    /// Sensors that waited past their deadline for a seal (the closer's
    /// hourly seal of every bucket took 7 s in a soak at 10,000 sensors
    /// and stretched a delay that was keeping up) do not stretch it: the
    /// seal's time is taken off.
    #[test]
    fn a_wait_for_a_seal_does_not_stretch_the_delay() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(10 * SEC, 60 * SEC, 60 * SEC, t0);
        p.seal_began(t0 + SEC);
        p.sealed(t0 + 8 * SEC);
        assert_eq!(p.retune(t0 + 10 * SEC, 7_500 * SEC / 1000, false), None);
        assert_eq!(p.retune(t0 + 20 * SEC, 7_500 * SEC / 1000, false), None);
        assert_eq!(
            p.retune(t0 + 30 * SEC, 7_500 * SEC / 1000, false),
            Some(Retuned::Stretched(15 * SEC)),
            "the periods after count in full (two in a row)"
        );
    }
}
