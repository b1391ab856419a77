//! The flush policy: which sensors to flush, and when to seal. Sans-IO: it
//! is told the time and what memory holds, and answers "should I now?".
//!
//! - Every `flush.interval` everything is flushed; a sensor earlier, once
//!   it holds enough samples to fill its open bucket (it is *ready*).
//! - Everything at once when memory is full (`flush.max_pending_samples`),
//!   right after samples were read back from the spool, and at shutdown.
//! - Every `closer.interval`: one flush of everything, then a seal, so
//!   what arrived before the seal is in its bucket when it is sealed. The
//!   first seal is due at start (it also sets the collection up early).
//! - Pacing by the database: when an interval flush took more than half
//!   the interval (and met no database error: after an outage the time went
//!   into retries), the next one waits as long as it took, so the database
//!   is busy about half the time at most and, under load, each statement
//!   carries more samples instead of the database receiving the same number
//!   of ever smaller statements.

use std::time::{Duration, Instant};

/// Which sensors a flush takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Every sensor with pending samples.
    All,
    /// Only the sensors that can fill their open bucket.
    Ready,
}

/// What the policy needs to know of memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    /// Samples and dead letters waiting to be written.
    pub pending: usize,
    pub max_pending: usize,
    /// Some sensor can fill its open bucket.
    pub has_ready: bool,
}

#[derive(Debug)]
pub struct FlushPolicy {
    flush_every: Duration,
    seal_every: Duration,
    next_flush: Instant,
    next_seal: Instant,
    /// A flush of everything is due regardless of the clock.
    all_now: bool,
    /// The flush before a due seal is done: seal next.
    seal_ready: bool,
}

impl FlushPolicy {
    pub fn new(flush_every: Duration, seal_every: Duration, now: Instant) -> FlushPolicy {
        FlushPolicy {
            flush_every,
            seal_every,
            next_flush: now + flush_every,
            next_seal: now,
            all_now: false,
            seal_ready: false,
        }
    }

    /// What to flush at `now`, if anything.
    pub fn due(&self, now: Instant, memory: Memory) -> Option<Selection> {
        let all = self.all_now
            || memory.pending >= memory.max_pending
            || now >= self.next_flush
            || (now >= self.next_seal && !self.seal_ready);
        if all {
            Some(Selection::All)
        } else if memory.has_ready {
            Some(Selection::Ready)
        } else {
            None
        }
    }

    /// Flush everything as soon as possible (after a read from the spool,
    /// at shutdown).
    pub fn flush_all_now(&mut self) {
        self.all_now = true;
    }

    /// A flush of `selection` that started at `started` ended at `now`;
    /// `met_errors`: the database failed meanwhile.
    pub fn flushed(
        &mut self,
        selection: Selection,
        started: Instant,
        now: Instant,
        met_errors: bool,
    ) {
        if selection != Selection::All {
            return;
        }
        self.all_now = false;
        if started >= self.next_seal {
            self.seal_ready = true;
        }
        if started >= self.next_flush {
            let took = now.saturating_duration_since(started);
            self.next_flush = if took * 2 > self.flush_every && !met_errors {
                now + took
            } else {
                // The interval's own rhythm; when ticks were missed, one
                // interval after this flush started.
                let scheduled = self.next_flush + self.flush_every;
                if scheduled < started {
                    started + self.flush_every
                } else {
                    scheduled
                }
            };
        }
    }

    /// Whether a seal is due now (its flush done).
    pub fn seal_due(&self, now: Instant) -> bool {
        self.seal_ready && now >= self.next_seal
    }

    /// A seal ran at `now` (successfully or not: the next one retries).
    pub fn sealed(&mut self, now: Instant) {
        self.seal_ready = false;
        let scheduled = self.next_seal + self.seal_every;
        self.next_seal = if scheduled < now {
            now + self.seal_every
        } else {
            scheduled
        };
    }

    /// When the policy wants to be asked again at the latest.
    pub fn deadline(&self) -> Instant {
        self.next_flush.min(self.next_seal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn memory(pending: usize, has_ready: bool) -> Memory {
        Memory {
            pending,
            max_pending: 100,
            has_ready,
        }
    }

    #[test]
    fn a_seal_is_due_at_start_after_one_flush_of_everything() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(SEC, 60 * SEC, t0);
        assert_eq!(p.due(t0, memory(0, false)), Some(Selection::All));
        assert!(!p.seal_due(t0), "the flush comes first");
        p.flushed(Selection::All, t0, t0, false);
        assert!(p.seal_due(t0));
        p.sealed(t0);
        assert!(!p.seal_due(t0 + 59 * SEC));
        assert_eq!(p.due(t0, memory(5, false)), None);
        assert_eq!(p.deadline(), t0 + SEC);
    }

    #[test]
    fn ready_sensors_go_early_and_everything_at_the_interval() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(SEC, 60 * SEC, t0);
        p.flushed(Selection::All, t0, t0, false);
        p.sealed(t0);
        assert_eq!(p.due(t0, memory(5, true)), Some(Selection::Ready));
        p.flushed(Selection::Ready, t0, t0, false);
        assert_eq!(
            p.due(t0 + SEC, memory(5, false)),
            Some(Selection::All),
            "a ready flush does not move the interval"
        );
        assert_eq!(
            p.due(t0, memory(100, false)),
            Some(Selection::All),
            "memory full"
        );
        p.flush_all_now();
        assert_eq!(p.due(t0, memory(1, false)), Some(Selection::All));
    }

    #[test]
    fn a_slow_flush_delays_the_next_by_its_duration_unless_it_met_errors() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(SEC, 600 * SEC, t0);
        p.flushed(Selection::All, t0, t0, false);
        p.sealed(t0);
        let t1 = t0 + SEC;
        p.flushed(Selection::All, t1, t1 + 3 * SEC, false);
        assert_eq!(
            p.deadline(),
            t1 + 6 * SEC,
            "waits as long as the flush took"
        );
        let t2 = t1 + 6 * SEC;
        p.flushed(Selection::All, t2, t2 + 30 * SEC, true);
        assert!(
            p.deadline() <= t2 + 30 * SEC,
            "after an outage the next flush is not held back"
        );
        let t3 = t2 + 30 * SEC;
        p.flushed(Selection::All, t3, t3 + SEC / 10, false);
        assert_eq!(p.deadline(), t3 + SEC, "a quick flush keeps the rhythm");
    }

    #[test]
    fn a_busy_pipeline_still_seals() {
        let t0 = Instant::now();
        let mut p = FlushPolicy::new(SEC, 10 * SEC, t0);
        p.flushed(Selection::All, t0, t0, false);
        p.sealed(t0);
        let t = t0 + 10 * SEC;
        assert_eq!(p.due(t, memory(50, false)), Some(Selection::All));
        p.flushed(Selection::All, t, t, false);
        assert!(p.seal_due(t), "one flush, then the seal, however busy");
        assert_eq!(p.due(t, memory(50, false)), None);
    }
}
