//! Dead letters at the front door: everything refused of a message as one
//! dead letter in the spool, within the dead letters' share of it and their
//! rate ([`DeadLetterRoom`]).

use super::*;
use std::time::{Duration, Instant};

use crate::deadletter;
use crate::ingest::Message;
use crate::spool::EntryRef;
use crate::telemetry;
use crate::telemetry::Reporter;

/// Dead letters may take at most this share of `spool.max_size`: bad
/// input alone never fills the spool and stops the good sensors.
pub(crate) const DEADLETTER_SHARE: f64 = 0.1;

/// The dead letters spooled and not yet in MongoDB, in bytes: they free
/// their share as the pipeline writes them (oldest first, by the bytes it
/// reports written) or as the checkpoint passes them.
#[derive(Debug)]
pub(crate) struct DeadLetterRoom {
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

impl Admission {
    /// Everything refused of a message, as one dead letter in the spool
    /// (within the dead letters' share of it, else counted and dropped).
    pub(super) fn dead_letter(
        &mut self,
        m: &Message,
        refused: &deadletter::Refusals,
        reporter: &mut Reporter,
        batch: &mut Arrivals,
    ) {
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
            metrics::counter!(telemetry::DEAD_LETTER_PAYLOADS_CUT, "cause" => cause).increment(1);
        }
        let doc = deadletter::for_message(
            self.tag,
            lsn,
            m.received_ms,
            &m.topic,
            &m.payload,
            refused,
            keep,
        );
        let doc = bson::to_vec(&doc).unwrap_or_default();
        let confirmed = self.spool.checkpointed();
        let written = self.health.deadletter_bytes_written();
        if self
            .deadletter_room
            .admit(lsn, doc.len() as u64, confirmed, written, charged)
        {
            batch.append(
                &mut self.next_lsn,
                m.received_ms,
                EntryRef::DeadLetter { doc: &doc },
            );
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
