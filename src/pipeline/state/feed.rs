//! Taking readings in: records fed by the admission or read back from
//! the spool, held in a lane's memory, and the live lane falling back to the
//! backlog.

use super::*;
use std::time::Instant;

use crate::bucket::SampleRef;
use crate::deadletter::{self, DeadLetter, Refusal};
use crate::handoff::Feed;
use crate::pipeline::backlog::{self};
use crate::record::{parse, EntryRef};

impl Core {
    /// Records the admission appended: taken into the live lane if they
    /// continue it and fit; else they stay on disk.
    pub(crate) fn feed(&mut self, f: Feed, now: Instant, now_ms: i64) {
        if f.first != self.cursor
            || f.records > self.live_room()
            || !self.fits_bytes(f.bytes.len() + SLOT_BYTES * f.records)
        {
            return;
        }
        self.hold_records(Lane::Live, &f.bytes, f.spooled.min(now), now_ms);
        self.cursor = f.end;
        self.update_checkpoint();
    }

    /// Records read back from the spool for an [`Action::Read`] (as
    /// written, `n` of them), how far the range asked for is read
    /// (`complete_to`: every LSN below it was returned or is absent for
    /// good), and the sample LSNs of the range read that `spool.when_full =
    /// "drop_oldest"` deleted. Returns those of them that were still needed,
    /// in order: lost (the spool is to forget them, see
    /// [`crate::spool::Spool::forget_lost`]).
    pub(crate) fn records(
        &mut self,
        bytes: &[u8],
        n: usize,
        complete_to: u64,
        missing: &[u64],
        now: Instant,
        now_ms: i64,
    ) -> Vec<u64> {
        let Some(Busy::Read(lane)) = self.busy.take() else {
            return Vec::new();
        };
        let lost: Vec<u64> = (missing.iter().copied())
            .filter(|lsn| lane == Lane::Live || !self.range.skips(*lsn))
            .collect();
        let last = self.hold_records(lane, bytes, now, now_ms);
        let at = last.map_or(complete_to, |l| (l + 1).max(complete_to));
        match lane {
            Lane::Live => self.cursor = self.cursor.max(at),
            Lane::Backlog => self.range.read(at, n),
        }
        self.update_checkpoint();
        lost
    }

    /// A read failed: nothing changes, it is asked again.
    pub(crate) fn read_failed(&mut self) {
        self.busy = None;
    }

    /// Puts encoded records into a lane; returns the last LSN.
    pub(super) fn hold_records(
        &mut self,
        lane: Lane,
        bytes: &[u8],
        now: Instant,
        now_ms: i64,
    ) -> Option<u64> {
        let mut last = None;
        let (mut records, mut samples) = (0usize, 0usize);
        for rec in parse(bytes) {
            last = Some(rec.lsn);
            records += 1;
            match rec.entry {
                EntryRef::Sample { sensor, doc } => {
                    samples += 1;
                    let sample = bson::RawDocument::from_bytes(doc)
                        .ok()
                        .and_then(|d| SampleRef::from_doc(d, rec.lsn));
                    match sample {
                        Some(s) => self.hold(lane, sensor, s, now, now_ms),
                        None => {
                            tracing::error!(
                                lsn = rec.lsn,
                                "Unreadable sample in the spool; skipped."
                            )
                        }
                    }
                }
                // Kept as the bytes spooled (checked by the record's CRC;
                // its elements walked once here).
                EntryRef::DeadLetter { doc } => {
                    match bson::RawDocumentBuf::from_bytes(doc.to_vec())
                        .ok()
                        .filter(|d| d.iter().all(|e| e.is_ok()))
                    {
                        Some(d) => {
                            self.spooled_deadletter_bytes += doc.len() as u64;
                            self.hold_deadletter((rec.lsn, d), doc.len(), now)
                        }
                        None => tracing::error!(
                            lsn = rec.lsn,
                            "Unreadable dead letter in the spool; skipped."
                        ),
                    }
                }
                EntryRef::MessageId { .. }
                | EntryRef::Sparkplug { .. }
                | EntryRef::LastValue { .. } => {}
            }
        }
        if lane == Lane::Backlog && records > 0 {
            let seen = samples as f64 / records as f64;
            self.samples_per_record = 0.9 * self.samples_per_record + 0.1 * seen;
        }
        if records > 0 {
            let seen = (bytes.len() + SLOT_BYTES * records) as f64 / records as f64;
            self.record_bytes = 0.9 * self.record_bytes + 0.1 * seen;
        }
        last
    }

    /// Holds a dead letter made here (of a sample refused after it was
    /// spooled).
    pub(super) fn hold_made_deadletter(&mut self, lsn: u64, doc: &bson::Document, now: Instant) {
        match bson::RawDocumentBuf::from_document(doc) {
            Ok(raw) => {
                let bytes = raw.as_bytes().len();
                self.hold_deadletter((lsn, raw), bytes, now)
            }
            Err(e) => tracing::error!(lsn, error = %e, "Cannot encode a dead letter; skipped."),
        }
    }

    /// Holds a dead letter of `bytes` (as BSON).
    pub(super) fn hold_deadletter(&mut self, d: DeadLetter, bytes: usize, now: Instant) {
        if self.deadletters.is_empty() {
            self.deadletters_since = Some(self.mono(now));
        }
        self.deadletter_bytes += bytes;
        self.deadletters.push(d);
    }

    /// Puts a sample into a lane. One that no longer fits in a bucket
    /// (`bucket.max_bytes` was lowered since it was spooled) goes to the dead
    /// letter; it is never dropped silently.
    pub(super) fn hold(
        &mut self,
        lane: Lane,
        sensor: &str,
        sample: SampleRef<'_>,
        now: Instant,
        now_ms: i64,
    ) {
        if let Err(too_big) = self.config.shape.check(sample) {
            let error = too_big.to_string();
            self.refusals.push(Refusal {
                cause: "sample_too_large",
                sensor: sensor.to_string(),
                error: error.clone(),
            });
            let doc = deadletter::for_sample(
                self.config.tags.of(sample.lsn),
                sample.lsn,
                now_ms,
                sensor,
                sample.doc,
                "sample_too_large",
                &error,
            );
            self.hold_made_deadletter(sample.lsn, &doc, now);
            return;
        }
        if lane == Lane::Backlog && self.range.skips(sample.lsn) {
            return;
        }
        let mono = self.mono(now);
        self.lane(lane).push(sensor, sample, mono);
    }

    /// Whether the live lane fell behind ([`backlog::falls_behind`]).
    pub(super) fn live_behind(&self, mono: i64) -> bool {
        // The oldest waiting sample: in memory, or on disk unread since the
        // live lane last caught up (across an outage nothing is read).
        let unread_since = (self.cursor < self.durable).then_some(self.caught_up_ms);
        let oldest_since = self
            .live
            .oldest_since_ms()
            .into_iter()
            .chain(unread_since)
            .min();
        let lag = backlog::Lag {
            outage: self.outage,
            oldest_since,
            on_disk: self.durable.saturating_sub(self.cursor),
        };
        backlog::falls_behind(
            lag,
            mono,
            self.behind_ms(),
            (self.config.max_pending / 2) as u64,
        )
    }

    /// The live lane's samples and the records on disk that are behind
    /// become backlog; the live lane starts again at the first record
    /// spooled less than [`Core::behind`] ago (at the durable end when the
    /// spool's history does not say; at most half of memory's worth from
    /// it). The readings that arrived while the database came back are
    /// not behind: as backlog, they would wait for all of it.
    /// Nothing may be in flight, and the live lane must be durable.
    pub(super) fn fall_back(&mut self) {
        // What the live lane read of the range and no longer holds is in
        // MongoDB (or a dead letter): only its pending samples are read
        // again, and only those it did not know the fate of are uncertain.
        let live_low = self.live.min_lsn().unwrap_or(self.cursor);
        let (pending, uncertain) = self.live.held_lsns();
        let deadletters = self.deadletters.iter().map(|d| d.0);
        let half_memory = (self.config.max_pending / 2) as u64;
        let to = self
            .recent_from
            .unwrap_or(self.durable)
            .max(self.durable.saturating_sub(half_memory))
            .clamp(self.cursor, self.durable);
        self.range
            .take_in(live_low, self.cursor, to, pending, deadletters);
        self.backlog.mark_uncertain(uncertain);
        let dropped = self.live.evict();
        self.outage = false;
        self.cursor = to;
        if to < self.durable {
            // What it left on disk for the live lane is at most this old.
            self.caught_up_ms = self.mono(self.now) - self.behind_ms();
        }
        tracing::info!(
            samples = dropped,
            records = self.range.to().saturating_sub(self.range.from()),
            "Live readings fell behind; the backlog drains in the background while live readings go first."
        );
        self.update_checkpoint();
    }
}
