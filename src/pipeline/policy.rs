//! The flush policy: when a flush may start, and when to seal. Sans-IO: it
//! is told the time and answers "should I now?"; which sensors a flush
//! takes is [`super::pending::Pending::due`]'s answer (ready, overdue, or
//! the oldest under memory pressure).
//!
//! - A flush starts at most once per *tick* (a tenth of `flush.max_delay`,
//!   between 10 ms and 1 s), so sensors falling due close together share
//!   one command; at once after a full flush (one that took as many sensors
//!   as a flush may), under memory pressure and at shutdown.
//! - Pacing by the database comes from there being one flush at a time:
//!   when the database is the bottleneck, a flush takes longer, more
//!   sensors fall due meanwhile and wait longer, so the next command
//!   carries more sensors and each statement more samples.
//! - Every `closer.interval` a seal, after the sensors holding samples of
//!   the windows it closes were flushed (the pipeline core sees to that).
//!   The first seal is due at start (it also sets the collection up early).

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct FlushPolicy {
    tick: Duration,
    seal_every: Duration,
    next_flush: Instant,
    next_seal: Instant,
}

impl FlushPolicy {
    pub fn new(max_delay: Duration, seal_every: Duration, now: Instant) -> FlushPolicy {
        FlushPolicy {
            tick: Self::tick_of(max_delay),
            seal_every,
            next_flush: now,
            next_seal: now,
        }
    }

    /// A tenth of the delay, between 10 ms and 1 s.
    pub fn tick_of(max_delay: Duration) -> Duration {
        (max_delay / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// Whether a flush may start at `now` (`urgent`: memory is full, or
    /// shutdown).
    pub fn may_flush(&self, now: Instant, urgent: bool) -> bool {
        urgent || now >= self.next_flush
    }

    /// A flush started at `started`; `full`: it took as many sensors as a
    /// flush may, so more may be due right away.
    pub fn flushed(&mut self, started: Instant, full: bool) {
        self.next_flush = if full { started } else { started + self.tick };
    }

    /// Whether a seal is due now.
    pub fn seal_due(&self, now: Instant) -> bool {
        now >= self.next_seal
    }

    /// A seal ran at `now` (successfully or not: the next one retries).
    pub fn sealed(&mut self, now: Instant) {
        let scheduled = self.next_seal + self.seal_every;
        self.next_seal = if scheduled < now {
            now + self.seal_every
        } else {
            scheduled
        };
    }

    /// When to be asked again at the latest, given when the oldest pending
    /// sensor falls due.
    pub fn deadline(&self, next_due: Option<Instant>) -> Instant {
        let flush = next_due.map(|d| d.max(self.next_flush));
        flush.map_or(self.next_seal, |f| f.min(self.next_seal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn flushes_start_at_most_once_a_tick_unless_urgent() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(10 * SEC, 60 * SEC, t0);
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
        let mut p = FlushPolicy::new(10 * SEC, 60 * SEC, t0);
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
        let mut p = FlushPolicy::new(10 * SEC, 60 * SEC, t0);
        p.sealed(t0);
        p.flushed(t0, false);
        assert_eq!(p.deadline(None), t0 + 60 * SEC);
        assert_eq!(p.deadline(Some(t0 + 5 * SEC)), t0 + 5 * SEC);
        assert_eq!(p.deadline(Some(t0)), t0 + SEC, "not before the tick");
        assert_eq!(p.deadline(Some(t0 + 90 * SEC)), t0 + 60 * SEC);
    }
}
