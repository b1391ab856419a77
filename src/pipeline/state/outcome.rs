//! What the store reported back: resolved samples, a written flush, a
//! seal; and the checkpoint that follows from them.

use super::*;
use std::time::Instant;

use crate::bucket::Samples;
use crate::deadletter::{self, Refusal};
use crate::handoff::{Batch, Outcome, Resolution, Written};
use crate::pipeline::policy::{self};

impl Core {
    /// The store's answer to an [`Action::Resolve`]; returns how many
    /// samples MongoDB already had.
    pub(crate) fn resolved(&mut self, resolution: Resolution) -> usize {
        self.busy = None;
        self.outage |= resolution.met_errors;
        let mut dropped = 0;
        if let Some((lane, ids)) = self.flushing.take() {
            let pending = self.lane(lane);
            for id in &ids {
                dropped += pending.resolve(*id, &resolution.applied);
            }
            self.flushing = Some((lane, ids));
        }
        self.update_checkpoint();
        dropped
    }

    /// The store's report of an [`Action::Write`]: `batch` is handed back
    /// with its outcomes.
    pub(crate) fn written(
        &mut self,
        batch: Batch,
        written: Written,
        now: Instant,
        now_ms: i64,
    ) -> Flushed {
        self.now = now;
        let Some(Busy::Write {
            lane,
            started,
            spooled_deadletter_bytes,
            ..
        }) = self.busy.take()
        else {
            return Flushed::default();
        };
        // The store writes a batch's dead letters before it returns.
        self.deadletter_bytes_written += spooled_deadletter_bytes;
        let took = now.saturating_duration_since(started);
        // (A write left empty by a resolve says nothing of the database.)
        if written.met_errors || batch.runs.iter().any(|r| !r.samples.is_empty()) {
            self.outage = written.met_errors;
        }
        if !written.met_errors {
            // (Time spent waiting out an outage says nothing of the share.)
            self.share.add(lane == Lane::Backlog, took, now);
            if lane == Lane::Live && written.statements > 0 {
                self.policy.flush_took(took);
                self.live
                    .set_early_ms(self.policy.early().as_millis() as i64);
            }
        } else {
            self.policy.met_errors();
        }
        let mut report = Flushed {
            statements: written.statements as u64,
            buckets_created: written.buckets_created,
            bytes_rewritten: written.bytes_rewritten,
            deadletters: batch.deadletters.len() as u64,
            ..Flushed::default()
        };
        let window = self.config.shape.window_ms;
        report.lane = Some(lane);
        report.ages.reserve(batch.samples());
        let mono = self.mono(now);
        for mut run in batch.runs {
            let outcomes = std::mem::take(&mut run.outcomes);
            let samples = std::mem::take(&mut run.samples);
            let mut back = Samples::new();
            let mut uncertain = 0;
            for (i, sample) in samples.iter().enumerate() {
                match outcomes.get(i).unwrap_or(&Outcome::NotSent) {
                    Outcome::Applied => {
                        report.samples_stored += 1;
                        report
                            .ages
                            .push((now_ms - sample.ts_ms).max(0) as f64 / 1000.0);
                        let start = self.config.shape.window_start(sample.ts_ms);
                        if self.sealed_until.is_some_and(|t| start + window <= t) {
                            report.late_into_sealed += 1;
                        }
                    }
                    Outcome::Rejected(error) => {
                        report.rejected += 1;
                        self.refusals.push(Refusal {
                            cause: "rejected_by_database",
                            sensor: run.sensor.clone(),
                            error: error.clone(),
                        });
                        let doc = deadletter::for_sample(
                            self.config.tags.of(sample.lsn),
                            sample.lsn,
                            now_ms,
                            &run.sensor,
                            sample.doc,
                            "rejected_by_database",
                            error,
                        );
                        self.hold_made_deadletter(sample.lsn, &doc, now);
                    }
                    Outcome::Unknown => {
                        report.unknown += 1;
                        back.push(sample);
                        uncertain = back.len();
                    }
                    Outcome::NotSent => back.push(sample),
                }
            }
            self.lane(lane).put_back(run, back, uncertain, mono);
        }
        if lane == Lane::Backlog {
            report.backlog_stored = report.samples_stored;
            if report.samples_stored > 0 && !written.met_errors {
                self.backlog_batch = policy::backlog_batch(report.samples_stored, took);
            }
        }
        self.update_checkpoint();
        report
    }

    /// The report of an [`Action::Seal`] at `now_ms`: windows ending at or
    /// before `cutoff` are sealed (`None`: the seal failed, or the mode has
    /// none), or, with `more`, a chunk of them and the next is to follow.
    /// Once a seal is over, open-bucket memory that no write can need
    /// again is forgotten, and with it the sensors that hold nothing.
    pub(crate) fn sealed(&mut self, now: Instant, now_ms: i64, cutoff: Option<i64>, more: bool) {
        let began = match self.busy.take() {
            Some(Busy::Seal(began)) => began,
            _ => now,
        };
        self.now = now;
        if more {
            // The next chunk, of the same run (it holds back and flushes
            // first what a seal at `now_ms` would).
            self.policy.seal_paused(now);
            self.seal_at = Some((now_ms, 0, false));
            self.seal_next = Some(now + now.saturating_duration_since(began) * SEAL_WAIT);
            return;
        }
        self.policy.sealed(now);
        let shape = self.config.shape;
        // Samples older than max_lateness are refused before they get here.
        let mut keep_from = shape.window_start(now_ms - self.config.max_lateness_ms);
        if let Some(cutoff) = cutoff {
            self.sealed_until = Some(cutoff);
            keep_from = keep_from.max(cutoff - shape.window_ms + 1);
        }
        self.live.forget_before(keep_from);
        self.backlog.forget_before(keep_from);
    }

    /// Moves the checkpoint to the lowest LSN still needed.
    pub(super) fn update_checkpoint(&mut self) {
        let in_flight = match self.busy {
            Some(Busy::Write { low, .. }) => low,
            _ => None,
        };
        let unread = self.range.on_disk().then_some(self.range.from());
        let low = [
            Some(self.cursor),
            unread,
            self.live.min_lsn(),
            self.backlog.min_lsn(),
            self.deadletters.iter().map(|d| d.0).min(),
            in_flight,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(self.cursor);
        if low > self.checkpoint_sent {
            self.checkpoint_due = Some(low);
        }
    }

    /// Checks the bookkeeping of memory (tests).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let flushing = |lane| match &self.flushing {
            Some((l, ids)) if *l == lane => ids.as_slice(),
            _ => &[],
        };
        self.live.check(flushing(Lane::Live));
        self.backlog.check(flushing(Lane::Backlog));
    }

    /// What is left if shutdown gives up now.
    pub(crate) fn leftover(&self) -> Leftover {
        let (samples, deadletters) = match self.busy {
            Some(Busy::Write {
                samples,
                deadletters,
                ..
            }) => (samples, deadletters),
            _ => (0, 0),
        };
        Leftover {
            samples: self.pending() + samples,
            dead_letters: self.deadletters.len() + deadletters,
            unacknowledged: 0,
        }
    }
}
