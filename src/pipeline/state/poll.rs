//! Deciding what to do next ([`Core::poll`]): a seal, a flush of either
//! lane, a resolve, a read, a checkpoint.

use super::*;
use std::time::Instant;

use crate::handoff::{Batch, Resolve};
use crate::pipeline::pending::SensorId;

impl Core {
    /// What to do now, if anything; `None`: wait for an event or the
    /// [`Core::deadline`].
    pub(crate) fn poll(&mut self, now: Instant, now_ms: i64) -> Option<Action> {
        self.now = now;
        self.blocked = false;
        if self.busy.is_some() {
            return None;
        }
        if let Some(lsn) = self.checkpoint_due.take() {
            self.checkpoint_sent = lsn;
            return Some(Action::Checkpoint(lsn));
        }
        // Nothing reaches MongoDB before it is durable in the spool (the
        // backlog lane reads only durable records).
        let live_durable = self.durable >= self.cursor;
        // A flush being prepared goes on (its samples were resolved); a
        // resolve before a fall-back goes on to the fall-back, and so does
        // a live one whose resolve met an outage that left the live lane
        // behind (written, it would end the outage with everything that
        // waited still ahead of new readings).
        if let Some((lane, ids)) = self.flushing.take() {
            let to_fall_back = std::mem::take(&mut self.resolving_to_fall_back)
                || (lane == Lane::Live
                    && !self.stopping
                    && live_durable
                    && self.outage
                    && self.live_behind(self.mono(now)));
            if !to_fall_back {
                return self.flush_or_wait(lane, ids, live_durable || lane == Lane::Backlog, now);
            }
        }
        if self.stopping {
            if self.held() == 0 {
                return Some(Action::Done);
            }
            let live = self.live.all();
            if !live.is_empty() || self.backlog.count() == 0 {
                return self.flush_or_wait(Lane::Live, live, live_durable, now);
            }
            let ids = self.backlog.all();
            return Some(self.flush(Lane::Backlog, ids, now));
        }
        // A seal's next chunk comes first once it waited long enough, else
        // after whatever else is due (below).
        let chunking = self.seal_next.is_some();
        if self.policy.seal_due(now) && self.seal_next.is_none_or(|t| now >= t) {
            if let Some(action) = self.seal(now, now_ms, live_durable) {
                return Some(action);
            }
        }
        let mono = self.mono(now);
        if self.cursor >= self.durable {
            self.caught_up_ms = mono;
        }
        if live_durable && self.live_behind(mono) {
            // The samples whose last write had an unknown outcome are
            // resolved before memory lets them go: read again they could be
            // found deleted from a full spool, fate unknown.
            let ids = self.live.all();
            let resolve = self.resolves(Lane::Live, &ids);
            if !resolve.is_empty() {
                self.busy = Some(Busy::Resolve);
                self.flushing = Some((Lane::Live, ids));
                self.resolving_to_fall_back = true;
                return Some(Action::Resolve(resolve));
            }
            self.fall_back();
            if let Some(lsn) = self.checkpoint_due.take() {
                self.checkpoint_sent = lsn;
                return Some(Action::Checkpoint(lsn));
            }
        }
        self.retune(now);
        let pressure = self.live_room() == 0 && self.live.count() > 0;
        let deadletters_due = self.deadletter_bytes >= DEADLETTER_FLUSH_BYTES
            || self
                .deadletters_since
                .is_some_and(|t| mono - t >= self.config.max_delay.as_millis() as i64);
        let backlog_ready = self.backlog.count() >= self.backlog_batch
            || (self.backlog.count() > 0 && !self.range.on_disk());
        let backlog_turn = backlog_ready && self.share.backlog_owed(self.config.backfill_share);
        if backlog_turn {
            return Some(self.flush_backlog(now));
        }
        if self.policy.may_flush(now, pressure) {
            if !live_durable {
                self.blocked = pressure || deadletters_due || self.live.may_be_due(mono);
            } else {
                let ids = self.live.due(mono, pressure, MAX_SENSORS_PER_FLUSH);
                if !ids.is_empty() || deadletters_due {
                    return Some(self.flush(Lane::Live, ids, now));
                }
            }
        }
        if let Some(read) = self.read_due() {
            return Some(read);
        }
        if self.backlog.count() > 0 {
            return Some(self.flush_backlog(now));
        }
        if chunking {
            return self.seal(now, now_ms, live_durable);
        }
        None
    }

    /// A read of records, when a lane has room for what waits on disk: the
    /// live lane up to the durable end, the backlog up to its range's end.
    fn read_due(&mut self) -> Option<Action> {
        if self.cursor < self.durable && self.live_room() > 0 {
            self.busy = Some(Busy::Read(Lane::Live));
            return Some(Action::Read {
                lane: Lane::Live,
                from: self.cursor,
                max: self.live_room().min(CATCH_UP_BATCH),
                limit: self.durable,
            });
        }
        if self.range.on_disk()
            && self.backlog.count() < self.backlog_batch
            && self.backlog_room() > 0
        {
            self.busy = Some(Busy::Read(Lane::Backlog));
            return Some(Action::Read {
                lane: Lane::Backlog,
                from: self.range.from(),
                max: self.backlog_room().min(CATCH_UP_BATCH),
                limit: self.range.to(),
            });
        }
        None
    }

    /// A seal that is due: first the live sensors holding windows it
    /// closes, then the seal itself, held back to before the backlog's
    /// oldest window (`None`: nothing to do for it now).
    pub(super) fn seal(&mut self, now: Instant, now_ms: i64, live_durable: bool) -> Option<Action> {
        let Some(grace) = self.config.seal_grace_ms else {
            self.seal_next = None;
            self.busy = Some(Busy::Seal(now));
            self.policy.seal_began(now);
            return Some(Action::Seal {
                now_ms,
                late: false,
                first: true,
            });
        };
        let (at, rounds, first) = *self.seal_at.get_or_insert((now_ms, 0, true));
        // Windows the backlog holds readings of stay open (a seal at `at`
        // closes windows ending by `at - grace`); while some of it is still
        // on disk, of unknown age, nothing is sealed.
        if self.range.on_disk() {
            self.seal_at = None;
            self.seal_next = None;
            return None;
        }
        let at = match self.backlog.min_ts() {
            Some(ts) => at.min(self.config.shape.window_start(ts) + grace),
            None => at,
        };
        let closing = self.live.holding_windows_ending_by(at - grace);
        if rounds < SEAL_FLUSH_ROUNDS && !closing.is_empty() {
            self.seal_at = Some((at, rounds + 1, first));
            return self.flush_or_wait(Lane::Live, closing, live_durable, now);
        }
        self.seal_at = None;
        self.seal_next = None;
        self.busy = Some(Busy::Seal(now));
        self.policy.seal_began(now);
        Some(Action::Seal {
            now_ms: at,
            late: !closing.is_empty(),
            first,
        })
    }

    pub(super) fn flush_backlog(&mut self, now: Instant) -> Action {
        let ids = self
            .backlog
            .oldest(MAX_SENSORS_PER_FLUSH, self.backlog_batch);
        self.flush(Lane::Backlog, ids, now)
    }

    pub(super) fn flush_or_wait(
        &mut self,
        lane: Lane,
        ids: Vec<SensorId>,
        can_write: bool,
        now: Instant,
    ) -> Option<Action> {
        if can_write {
            Some(self.flush(lane, ids, now))
        } else {
            self.flushing = Some((lane, ids));
            self.blocked = true;
            None
        }
    }

    /// The next step of a flush of a lane's sensors `ids`: resolve their
    /// uncertain samples first, then write them with the dead letters in
    /// memory.
    pub(super) fn flush(&mut self, lane: Lane, ids: Vec<SensorId>, now: Instant) -> Action {
        let resolve = self.resolves(lane, &ids);
        if !resolve.is_empty() {
            self.busy = Some(Busy::Resolve);
            self.flushing = Some((lane, ids));
            return Action::Resolve(resolve);
        }
        let max_statements = self.config.max_statements;
        let (runs, left) = self.lane(lane).take_within(&ids, max_statements);
        if lane == Lane::Live {
            self.policy
                .flushed(now, left || ids.len() >= MAX_SENSORS_PER_FLUSH);
        }
        let deadletters = std::mem::take(&mut self.deadletters);
        self.deadletter_bytes = 0;
        let spooled_deadletter_bytes = std::mem::take(&mut self.spooled_deadletter_bytes);
        self.deadletters_since = None;
        let low = runs
            .iter()
            .filter_map(|r| r.samples.first().map(|s| s.lsn))
            .chain(deadletters.iter().map(|d| d.0))
            .min();
        let batch = Batch { runs, deadletters };
        self.busy = Some(Busy::Write {
            lane,
            low,
            samples: batch.samples(),
            deadletters: batch.deadletters.len(),
            spooled_deadletter_bytes,
            started: now,
        });
        Action::Write(batch)
    }

    /// What to ask the store about the uncertain samples of a lane's
    /// sensors `ids`.
    pub(super) fn resolves(&self, lane: Lane, ids: &[SensorId]) -> Vec<Resolve> {
        let pending = match lane {
            Lane::Live => &self.live,
            Lane::Backlog => &self.backlog,
        };
        ids.iter()
            .filter_map(|id| {
                let samples = pending.uncertain(*id);
                (!samples.is_empty()).then(|| Resolve {
                    sensor: pending.name(*id).to_string(),
                    samples,
                })
            })
            .collect()
    }
}
