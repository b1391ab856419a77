//! The backlog's range of the spool, sans-IO: what the backlog lane has
//! yet to read, `[from, to)`, and the rules that spare it second reads.
//!
//! - When the live lane falls behind ([`falls_behind`]), the range grows
//!   to take what the live lane held and what waits on disk up to the
//!   records spooled within the last `behind` ([`Backlog::take_in`],
//!   which the live lane keeps); it stays one range (it continues
//!   where the unread one is, or starts at the live lane's oldest sample).
//! - Of the part the live lane had read, only the samples it still held
//!   are read again ([`Backlog::skips`]): the others are in MongoDB or
//!   dead letters. What it had not read is certainly not in MongoDB.
//! - Samples of the range that were refused and wait in memory as dead
//!   letters are not read again either.
//! - Reads move `from` on ([`Backlog::read`]); once it reaches `to`, the
//!   range is empty and forgets what it spared.

use std::collections::HashSet;

/// The backlog's unread range of the spool.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    from: u64,
    to: u64,
    /// Records in `[from, to)` (this run's LSNs are consecutive; across
    /// runs an estimate).
    unread: u64,
    /// Samples in the range that were refused and wait in memory as dead
    /// letters: not read again.
    refused: HashSet<u64>,
    /// Parts of the range the live lane had read: `[from, to)` and the
    /// LSNs in it that were still pending then. The others were stored (or
    /// dead-lettered) and are not read again.
    reread: Vec<(u64, u64, HashSet<u64>)>,
}

impl Backlog {
    /// `[from, to)` of `records` records (what an earlier run left).
    pub fn new(from: u64, to: u64, records: u64) -> Backlog {
        Backlog {
            from,
            to,
            unread: records,
            ..Backlog::default()
        }
    }

    /// The first LSN not read yet.
    pub(crate) fn from(&self) -> u64 {
        self.from
    }

    /// The end of the range (exclusive).
    pub(crate) fn to(&self) -> u64 {
        self.to
    }

    /// Records not read yet.
    pub(crate) fn unread(&self) -> u64 {
        self.unread
    }

    /// Whether some of the range is still on disk, unread.
    pub(crate) fn on_disk(&self) -> bool {
        self.from < self.to
    }

    /// A read of `n` records reached `at` (the next LSN to read).
    pub(crate) fn read(&mut self, at: u64, n: usize) {
        self.from = self.from.max(at);
        if self.on_disk() {
            self.unread = self.unread.saturating_sub(n as u64);
        } else {
            self.unread = 0;
            self.refused = HashSet::new();
        }
        let read_to = self.from;
        self.reread.retain(|r| r.1 > read_to);
    }

    /// Whether a read skips the sample `lsn`: it was refused and waits as
    /// a dead letter, or the live lane had read it and no longer held it
    /// (it is in MongoDB).
    pub(crate) fn skips(&self, lsn: u64) -> bool {
        self.refused.contains(&lsn)
            || self
                .reread
                .iter()
                .any(|(from, to, pending)| (*from..*to).contains(&lsn) && !pending.contains(&lsn))
    }

    /// The live lane falls back: the range takes `[live_low, to)` (or
    /// continues from its end), where the live lane had read up to
    /// `cursor` and still held `pending`; the dead letters waiting in
    /// memory (`deadletters`, by LSN) are not read again. The live lane goes
    /// on from `to` (at most the durable end).
    pub(crate) fn take_in(
        &mut self,
        live_low: u64,
        cursor: u64,
        to: u64,
        pending: HashSet<u64>,
        deadletters: impl Iterator<Item = u64>,
    ) {
        let from = if self.on_disk() {
            self.to
        } else {
            self.from = live_low;
            self.unread = 0;
            live_low
        };
        self.unread += pending.len() as u64 + to.saturating_sub(cursor);
        if from < cursor {
            self.reread.push((from, cursor, pending));
        }
        let low = self.from;
        self.refused.extend(deadletters.filter(|l| *l >= low));
        self.to = to;
    }
}

/// What tells whether the live lane fell behind.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lag {
    /// The last write had to retry (an outage).
    pub outage: bool,
    /// When the oldest waiting sample arrived (monotonic ms): in memory,
    /// or on disk unread since the live lane last caught up.
    pub oldest_since: Option<i64>,
    /// Records on disk the live lane has not read.
    pub on_disk: u64,
}

/// Whether the live lane fell behind at `mono`: its oldest sample waited
/// `behind_ms` across an outage, or more records wait on disk than half of
/// memory (`half_memory` samples) holds. (A database that is merely slow
/// makes sensors wait longer and statements larger; that pacing is not
/// falling behind.)
pub(crate) fn falls_behind(lag: Lag, mono: i64, behind_ms: i64, half_memory: u64) -> bool {
    let old = lag.outage && lag.oldest_since.is_some_and(|t| mono - t >= behind_ms);
    old || lag.on_disk > half_memory
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fall-back takes the live lane's held samples and what it had not
    /// read; of what it had read, only what it still held is read again;
    /// refused samples are skipped; reading to the end forgets both.
    #[test]
    fn a_fall_back_spares_what_the_live_lane_stored() {
        let mut b = Backlog::new(100, 100, 0);
        assert!(!b.on_disk());
        // The live lane read up to 150 and still holds 120 and 130; the
        // spool is durable to 170; 140 waits as a dead letter.
        b.take_in(110, 150, 170, [120, 130].into(), [140, 90].into_iter());
        assert_eq!((b.from(), b.to(), b.unread()), (110, 170, 22));
        assert!(b.skips(115), "read by the live lane and stored");
        assert!(!b.skips(120) && !b.skips(130), "held: read again");
        assert!(b.skips(140), "a dead letter in memory");
        assert!(!b.skips(160), "never read");
        // A second fall-back continues the range.
        b.take_in(175, 180, 200, HashSet::new(), std::iter::empty());
        assert_eq!((b.from(), b.to(), b.unread()), (110, 200, 42));
        b.read(150, 10);
        assert_eq!(b.unread(), 32);
        assert!(b.skips(140));
        b.read(200, 32);
        assert!(!b.on_disk());
        assert_eq!(b.unread(), 0);
        assert!(!b.skips(140), "forgotten once read to the end");
    }

    #[test]
    fn the_live_lane_falls_behind_across_an_outage_or_far_behind_on_disk() {
        let lag = |outage, since, on_disk| Lag {
            outage,
            oldest_since: since,
            on_disk,
        };
        assert!(!falls_behind(lag(false, Some(0), 10), 5_000, 3_000, 100));
        assert!(falls_behind(lag(true, Some(0), 10), 5_000, 3_000, 100));
        assert!(!falls_behind(lag(true, Some(4_000), 10), 5_000, 3_000, 100));
        assert!(!falls_behind(lag(true, None, 10), 5_000, 3_000, 100));
        assert!(falls_behind(lag(false, None, 101), 0, 3_000, 100));
    }
}
