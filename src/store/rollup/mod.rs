//! Rollups (`[[rollup]]`): per sensor and interval (`1h`, `1d`...,
//! aligned to the Unix epoch, UTC), the count of readings and, per numeric
//! field, `sum`, `n`, `min`, `max`, `avg`, `first` and `last` (by reading
//! time; of readings with the same time, the smallest value is first and
//! the largest last), in `<collection>_<interval>`, one document per sensor
//! and interval start, with `computedAt` and `partial`.
//!
//! # When a rollup is written
//! Every flush, before its write, records the (rollup, sensor, interval)
//! keys it touches in `<collection>_rollup_due`, once per key and run
//! while the interval is open. An entry there is a block of [`BLOCK`]
//! consecutive intervals of one rollup and sensor (aligned to the epoch),
//! one bit each in `m`, so a flush sends one upsert per rollup, sensor
//! and block it touches, not per interval: a backfill of a year of hourly
//! readings records 137 blocks per sensor for a 1h rollup, where it
//! recorded 8,760 keys. An interval is due at its end plus
//! `closer.grace` (when its last window is sealed); an entry's `due` is
//! its earliest interval's. A key the write makes due within a hold
//! (`mongodb.write_time_limit` plus a second: late data, a backfill) is
//! recorded with every write that touches it, and its block's `hold`
//! moves to the hold's end, when the write is applied or cut off by the
//! server: no pass takes the block before; a write that took longer than
//! a second (retried) records them again after it. Each closer pass then
//! computes the rollups of the due intervals of the entries due and not
//! held, from the stored readings, upserts them, and clears their bits
//! (deleting an entry left with none) unless the entry's version changed
//! meanwhile. So a late reading makes its intervals be computed again, a
//! crash anywhere leaves the key for the next pass, and computing twice
//! gives the same document. With `partial = true` the pass also computes
//! the open intervals' keys, marked `partial: true`, and keeps them.
//! Entries of one interval each (written by palletd before blocks) are
//! read, computed and deleted the same way.
//!
//! Over buckets, a rollup is merged from the summaries every bucket of
//! the interval carries (`count`, and per field `sum`, `n`, `min`, `max`,
//! `first`, `last`: see [`crate::bucket`]), never from samples: the
//! pass reads a range of windows of several sensors at once (at most
//! [`SUMMARIES_PER_QUERY`] windows' summaries, streamed) and merges them
//! in palletd. Late data lands in a later bucket of its window, so
//! merging again is exact. Time series documents are aggregated on the
//! server, one interval per query.
//!
//! The files: this one records the keys a flush touches (the queue, its
//! entries' format) and wakes the passes; `pass.rs` runs them (the due
//! entries, the queries planned, the rollups computed, upserted and their
//! bits cleared); `merge.rs` is the merge arithmetic and the rollup
//! document (sans-IO); `read_back.rs` reads rollups back (`palletd query
//! --stats --rollup`, and the settled ones `/api/series` takes).
//!
//! The passes run on a task of their own, on the daemon's task tracker
//! like every task ([`Rollups::start_passes`]), woken by each closer run
//! with its time: computing many sensors' rollups
//! takes the database seconds, and flushes must not wait for it. A pass
//! that is still running when the closer runs again is followed by one
//! more; the queue's versions make a pass safe beside the writes.

use std::collections::{BTreeMap, HashSet};

use bson::{doc, rawdoc, Bson, Document};
use mongodb::options::IndexOptions;
use mongodb::{Database, IndexModel};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::mongo::{self, Mongo};
use super::read;
use super::statements::{Ids, Lost, Unordered};
use crate::config::{RollupSettings, Settings, StorageMode};
use crate::handoff::Batch;
use crate::retry::Aborted;
use crate::telemetry;

mod merge;
mod pass;
mod read_back;

pub use read_back::{read_rollups, settled, RollupRow};

/// Sensors one aggregation takes at most.
const SENSORS_PER_QUERY: usize = 500;

/// Due keys one pass takes at most (the rest wait for the next pass):
/// whole queue entries, until they hold this many intervals.
const KEYS_PER_PASS: i64 = 20_000;

/// Intervals one queue entry covers (a bit each of an `i64`).
const BLOCK: i64 = 64;

/// A key whose rollup cannot be written is tried again this much later.
const PARKED_FOR: std::time::Duration = std::time::Duration::from_secs(3600);

/// (rollup index, sensor, interval start ms).
type Key = (usize, String, i64);

/// Where the readings are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Buckets,
    Timeseries,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Rollup documents written (final and partial).
    pub written: u64,
    /// Write statements sent (rollup upserts and queue deletes).
    pub statements: u64,
    /// Keys whose rollup could not be written, set aside.
    pub parked: u64,
    /// It took [`KEYS_PER_PASS`] due keys: more may be due.
    pub more: bool,
}

pub(crate) struct Rollups {
    specs: Vec<RollupSettings>,
    /// `<collection>_rollup_due`.
    queue: String,
    /// Keys this run recorded whose interval is not due yet.
    recorded: HashSet<Key>,
    /// `flush.backfill_share`: of the time, what passes that follow each
    /// other take.
    share: f64,
    /// `mongodb.write_time_limit` plus [`mongo::FENCE_MARGIN`]: how long
    /// after its last attempt was sent a write may still be applied.
    hold_ms: i64,
    passes: Passes,
    /// Wakes the pass task with the closer's time.
    wake: Option<tokio::sync::watch::Sender<i64>>,
}

/// What a pass needs (a copy lives on the pass task).
#[derive(Clone)]
struct Passes {
    specs: Vec<RollupSettings>,
    /// The readings' collection.
    base: String,
    queue: String,
    source: Source,
    /// `bucket.window` in ms.
    window_ms: i64,
    /// `closer.grace` in ms.
    grace_ms: i64,
    /// The configured write concern ([`mongo::write_concern`]).
    concern: Document,
}

impl Rollups {
    /// `None` without `[[rollup]]`s.
    pub fn new(settings: &Settings) -> Option<Rollups> {
        if settings.rollups.is_empty() {
            return None;
        }
        let base = settings.mongodb.collection.clone();
        let queue = format!("{base}_rollup_due");
        Some(Rollups {
            specs: settings.rollups.clone(),
            queue: queue.clone(),
            recorded: HashSet::new(),
            share: settings.flush.backfill_share.clamp(0.05, 1.0),
            hold_ms: (settings.mongodb.write_time_limit + mongo::FENCE_MARGIN).as_millis() as i64,
            passes: Passes {
                specs: settings.rollups.clone(),
                base,
                queue,
                source: match settings.storage.mode {
                    StorageMode::Buckets => Source::Buckets,
                    StorageMode::Timeseries => Source::Timeseries,
                },
                window_ms: settings.bucket.window.as_millis() as i64,
                grace_ms: settings.closer.grace.as_millis() as i64,
                concern: mongo::write_concern(&settings.mongodb),
            },
            wake: None,
        })
    }

    /// Starts the task that runs the passes on `db`, on `tracker` (so the
    /// shutdown waits for it); until then [`Rollups::closer_ran`] runs
    /// them inline. It begins no pass once `done` (the pipeline finished:
    /// the closer runs no more) and ends at once on `abort`: a pass cut
    /// where it is leaves what it did not finish due (see the module's
    /// doc).
    ///
    /// A pass that left due keys (it takes [`KEYS_PER_PASS`] at most) is
    /// followed by another without waiting for the closer, after a pause
    /// that gives the passes `flush.backfill_share` of the time (at 0.5,
    /// as long as the pass took): a backfill's rollups follow it within a
    /// closer interval and a few passes, and the flushes keep the rest of
    /// the database's time.
    pub(crate) fn start_passes(
        &mut self,
        db: Database,
        tracker: &TaskTracker,
        [done, abort]: [CancellationToken; 2],
    ) {
        let (wake, mut woken) = tokio::sync::watch::channel(i64::MIN);
        let passes = self.passes.clone();
        let pause = (1.0 - self.share) / self.share;
        let run = async move {
            let mut failing = false;
            loop {
                tokio::select! {
                    changed = woken.changed() => if changed.is_err() { return },
                    _ = done.cancelled() => return,
                }
                loop {
                    let now_ms = *woken.borrow_and_update();
                    let started = std::time::Instant::now();
                    if !passes.run(&db, now_ms, &mut failing).await {
                        break;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(started.elapsed().mul_f64(pause)) => {}
                        _ = done.cancelled() => return,
                    }
                }
            }
        };
        tracker.spawn(async move {
            tokio::select! {
                _ = run => {}
                _ = abort.cancelled() => {}
            }
        });
        self.wake = Some(wake);
    }

    /// The closer ran at `now_ms` (its time, held back while a backlog
    /// drains): the pass task computes what is due by then.
    pub(crate) async fn closer_ran(&mut self, db: &Database, now_ms: i64) {
        match &self.wake {
            Some(wake) => {
                let _ = wake.send(now_ms);
            }
            None => {
                self.passes.run(db, now_ms, &mut false).await;
            }
        }
    }

    /// The rollups configured.
    pub(crate) fn specs(&self) -> &[RollupSettings] {
        &self.specs
    }

    /// The collection of a rollup (`<collection>_<interval>`).
    pub(crate) fn collection_of(base: &str, spec: &RollupSettings) -> String {
        format!("{base}_{}", spec.name)
    }

    /// Indexes: `{sensorId, start}` (unique; what a dashboard reads), the
    /// TTL on `start` per rollup, and `due` on the queue.
    pub(crate) async fn schema(&self, db: &Database) -> mongodb::error::Result<()> {
        for spec in &self.specs {
            let coll = Rollups::collection_of(&self.passes.base, spec);
            let index = IndexModel::builder()
                .keys(doc! { "sensorId": 1, "start": 1 })
                .options(IndexOptions::builder().unique(true).build())
                .build();
            db.collection::<Document>(&coll).create_index(index).await?;
            mongo::sync_ttl(db, &coll, "start", "start_ttl", spec.expire_after).await?;
        }
        let due = IndexModel::builder().keys(doc! { "due": 1 }).build();
        db.collection::<Document>(&self.queue)
            .create_index(due)
            .await?;
        Ok(())
    }

    fn due_ms(&self, key: &Key) -> i64 {
        self.passes.due_ms(&self.specs[key.0], key.2)
    }

    /// The keys a flush touches.
    fn keys(&self, batch: &Batch) -> Vec<Key> {
        let mut keys: HashSet<Key> = HashSet::new();
        for run in &batch.runs {
            for (i, spec) in self.specs.iter().enumerate() {
                let mut last = None;
                for s in run.samples.iter() {
                    let start = spec.start_of(s.ts_ms);
                    if last != Some(start) {
                        keys.insert((i, run.sensor.clone(), start));
                        last = Some(start);
                    }
                }
            }
        }
        keys.into_iter().collect()
    }

    /// Before a flush's write, at `now_ms`: records the keys it touches
    /// that this run has not recorded, and those due within the hold
    /// ([`Rollups::hold_ms`]; late data), due no sooner than the hold's
    /// end. Returns the keys, for [`Rollups::after_write`].
    pub(crate) async fn before_write(
        &mut self,
        m: &mut Mongo,
        batch: &Batch,
        now_ms: i64,
        abort: &CancellationToken,
    ) -> Result<Vec<Key>, Aborted> {
        let keys = self.keys(batch);
        let held = now_ms + self.hold_ms;
        let passes = &self.passes;
        self.recorded
            .retain(|k| passes.due_ms(&passes.specs[k.0], k.2) > held);
        let new: Vec<Key> = keys
            .iter()
            .filter(|k| self.due_ms(k) <= held || !self.recorded.contains(*k))
            .cloned()
            .collect();
        self.record(m, &new, held, abort).await?;
        for k in new {
            if self.due_ms(&k) > held {
                self.recorded.insert(k);
            }
        }
        Ok(keys)
    }

    /// After a flush's write that began (with [`Rollups::before_write`])
    /// at `began_ms` and returned at `now_ms`. A pass takes a key no
    /// sooner than the hold after the last attempt of a write to it was
    /// sent: by then the server has applied that write or cut it off
    /// (`maxTimeMS`), so what the pass reads holds it. A write that took
    /// at most [`mongo::FENCE_MARGIN`] sent every attempt within the hold
    /// `before_write` gave its keys; after a longer one (retried), the keys
    /// due within a hold from now are recorded again.
    pub(crate) async fn after_write(
        &mut self,
        m: &mut Mongo,
        keys: &[Key],
        began_ms: i64,
        now_ms: i64,
        abort: &CancellationToken,
    ) -> Result<(), Aborted> {
        if now_ms - began_ms <= mongo::FENCE_MARGIN.as_millis() as i64 {
            return Ok(());
        }
        let held = now_ms + self.hold_ms;
        let due: Vec<Key> = (keys.iter())
            .filter(|k| self.due_ms(k) <= held)
            .cloned()
            .collect();
        self.record(m, &due, held, abort).await
    }

    /// The queue entries that record `keys`: per rollup, sensor and
    /// block, its intervals' bits, their earliest and latest due time, and
    /// whether one is due by `not_before_ms` (then the block is held
    /// until then).
    fn blocks(&self, keys: &[Key], not_before_ms: i64) -> Vec<Block> {
        let mut out: BTreeMap<(usize, &str, i64), Block> = BTreeMap::new();
        for k in keys {
            let span = self.specs[k.0].interval_ms() * BLOCK;
            let start = k.2.div_euclid(span) * span;
            let bit = (k.2 - start) / self.specs[k.0].interval_ms();
            let due = self.due_ms(k);
            let b = out.entry((k.0, &k.1, start)).or_insert(Block {
                rollup: k.0,
                sensor: k.1.clone(),
                start,
                mask: 0,
                first_due: due,
                last_due: due,
                held: false,
            });
            b.mask |= 1 << bit;
            b.first_due = b.first_due.min(due);
            b.last_due = b.last_due.max(due);
            b.held |= due <= not_before_ms;
        }
        out.into_values().collect()
    }

    /// Upserts the queue entries of `keys` (bumping their versions), held
    /// until `not_before_ms` where a key is due by then, retrying until
    /// answered (idempotent: sent again whatever happened).
    async fn record(
        &self,
        m: &mut Mongo,
        keys: &[Key],
        not_before_ms: i64,
        abort: &CancellationToken,
    ) -> Result<(), Aborted> {
        let blocks = self.blocks(keys, not_before_ms);
        let w = Unordered {
            what: "record rollups to compute",
            command: "update",
            collection: &self.queue,
            field: "updates",
            ids: Ids::Upserted,
            lost: Lost::Resend,
        };
        let statement = |i: usize| {
            let b = &blocks[i];
            let mut latest = rawdoc! { "until": bson::DateTime::from_millis(b.last_due) };
            if b.held {
                latest.append("hold", bson::DateTime::from_millis(not_before_ms));
            }
            let name = self.specs[b.rollup].name.as_str();
            rawdoc! {
                "q": { "_id": format!("{name}|b{}|{}", b.start, b.sensor) },
                "u": {
                    "$bit": { "m": { "or": b.mask as i64 } },
                    "$min": { "due": bson::DateTime::from_millis(b.first_due) },
                    "$max": latest,
                    "$set": {
                        "r": name,
                        "s": b.sensor.as_str(),
                        "t": bson::DateTime::from_millis(b.start),
                    },
                    "$inc": { "v": 1_i64 },
                },
                "upsert": true,
            }
        };
        let sent = m.send_unordered(w, blocks.len(), statement, abort).await?;
        metrics::counter!(telemetry::ROLLUP_STATEMENTS).increment(sent.answered);
        for e in sent.refused {
            tracing::error!(index = e.index, code = e.code, error = %e.msg, "The database refused a rollup key; that interval's rollup may be missing.");
        }
        Ok(())
    }
}

/// One queue entry a flush records (see [`Rollups::blocks`]). Its `_id`
/// is `<rollup>|b<block start ms>|<sensorId>` (a rollup's name holds no
/// `|`; an entry of palletd before blocks has no `b`): a string, as an
/// `_id` that is a document was not served by the `_id` index on
/// SecantusDB (about 120 upserts/s, a backfill's keys took minutes). Its
/// parts are fields of the entry too (`r`, `s`, `t`).
#[derive(Debug, PartialEq)]
struct Block {
    rollup: usize,
    sensor: String,
    start: i64,
    /// Bit `i`: the interval `start + i * interval`.
    mask: u64,
    first_due: i64,
    last_due: i64,
    held: bool,
}

/// A queue entry read back: a block of intervals of one rollup and
/// sensor ([`Block`]), or one interval (written by palletd before blocks).
#[derive(Debug)]
struct Entry {
    rollup: String,
    sensor: String,
    /// The block's first interval (or the one interval).
    start: i64,
    /// Bit `i`: the interval `start + i * interval`; `None`: `start` alone.
    mask: Option<u64>,
    version: i64,
    id: Bson,
}

impl Entry {
    fn parse(e: &Document) -> Option<Entry> {
        let id = e.get("_id")?;
        // The key's parts: fields of the entry, or (an entry queued
        // before the `_id` was a string) of its `_id`.
        let parts = match id {
            Bson::Document(d) => d,
            _ => e,
        };
        let mask = match e.get("m") {
            Some(Bson::Int64(m)) => Some(*m as u64),
            Some(Bson::Int32(m)) => Some(*m as u32 as u64),
            _ => None,
        };
        Some(Entry {
            rollup: parts.get_str("r").ok()?.to_string(),
            sensor: parts.get_str("s").ok()?.to_string(),
            start: parts.get_datetime("t").ok()?.timestamp_millis(),
            mask,
            version: read::number(e.get("v")).unwrap_or(0.0) as i64,
            id: id.clone(),
        })
    }

    /// The starts of its intervals.
    fn intervals(&self, interval_ms: i64) -> Vec<i64> {
        match self.mask {
            None => vec![self.start],
            Some(m) => (0..BLOCK)
                .filter(|b| m >> b & 1 == 1)
                .map(|b| self.start + b * interval_ms)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::merge::{FieldRollup, Rollup};
    use super::pass::{queries, Query, SUMMARIES_PER_QUERY};
    use super::*;
    use proptest::prelude::*;

    const HOUR: i64 = 3_600_000;

    /// Buckets' parameters: windows of `window_ms`, intervals of
    /// `interval_ms`.
    fn bucket_queries(keys: &[(&str, i64)], interval_ms: i64, window_ms: i64) -> Vec<Query> {
        let windows = interval_ms / window_ms;
        queries(
            keys,
            interval_ms,
            (SUMMARIES_PER_QUERY / windows).max(1),
            |n| (SUMMARIES_PER_QUERY / (windows * n)).clamp(1, SENSORS_PER_QUERY as i64) as usize,
        )
    }

    /// Windows a query may read.
    fn windows(q: &Query, interval_ms: i64, window_ms: i64) -> i64 {
        q.sensors.len() as i64 * (q.to - q.from) / window_ms.min(interval_ms)
    }

    /// A backfill (three sensors, a year of hourly intervals) is a few
    /// range reads, not 8,760 queries of three sensors each (the old
    /// pass: one per interval); the live case (a thousand sensors, one
    /// interval) is a few queries of many sensors.
    #[test]
    fn a_backfill_and_a_live_interval_take_few_bounded_queries() {
        let names: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
        let year: Vec<(&str, i64)> = names[..3]
            .iter()
            .flat_map(|n| (0..8760).map(move |h| (n.as_str(), 400_000 * HOUR + h * HOUR)))
            .collect();
        for (interval, window) in [(HOUR, HOUR), (24 * HOUR, HOUR), (168 * HOUR, HOUR)] {
            let keys: Vec<(&str, i64)> = year
                .iter()
                .map(|(s, t)| (*s, t.div_euclid(interval) * interval))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let qs = bucket_queries(&keys, interval, window);
            assert!(qs.len() <= 6, "{interval}: {} queries", qs.len());
            assert!(qs
                .iter()
                .all(|q| windows(q, interval, window) <= SUMMARIES_PER_QUERY));
        }
        let live: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), 7 * HOUR)).collect();
        let qs = bucket_queries(&live, HOUR, 60_000);
        assert_eq!(
            qs.len(),
            1000_usize.div_ceil((SUMMARIES_PER_QUERY / 60) as usize)
        );
        assert!(qs.iter().all(|q| (q.from, q.to) == (7 * HOUR, 8 * HOUR)));
    }

    /// Rollups of the example configuration with `[[rollup]]`s of
    /// `intervals`.
    fn rollups_of(intervals: &[&str]) -> Rollups {
        let mut text = crate::config::EXAMPLE.to_string();
        for i in intervals {
            text += &format!("\n[[rollup]]\ninterval = \"{i}\"\n");
        }
        Rollups::new(&crate::config::parse(&text, None).unwrap()).unwrap()
    }

    /// The keys of readings at `hours` (hour numbers) of `sensors`.
    fn keys_of(r: &Rollups, sensors: &[&str], hours: &[i64]) -> Vec<Key> {
        let mut keys = std::collections::BTreeSet::new();
        for s in sensors {
            for h in hours {
                for (i, spec) in r.specs.iter().enumerate() {
                    keys.insert((i, s.to_string(), spec.start_of(h * HOUR)));
                }
            }
        }
        keys.into_iter().collect()
    }

    /// A backfill's flush (1,000 statements: three sensors' 334 hours)
    /// touches 1,056 keys of 1h, 1d and 7d rollups and records 24 entries:
    /// per sensor 6 blocks of 64 hours, one of 64 days, one of 64 weeks.
    #[test]
    fn a_backfill_flush_records_a_block_per_64_intervals_not_a_key_each() {
        let r = rollups_of(&["1h", "1d", "7d"]);
        let hours: Vec<i64> = (0..334).map(|h| 490_000 + h).collect();
        let keys = keys_of(&r, &["a", "b", "c"], &hours);
        assert_eq!(keys.len(), 3 * (334 + 15 + 3));
        let blocks = r.blocks(&keys, i64::MIN);
        assert_eq!(blocks.len(), 3 * (6 + 1 + 1));
        assert!(blocks.iter().all(|b| !b.held));
    }

    proptest! {
        /// Every key is a bit of exactly one block, of its rollup and
        /// sensor, which starts at a multiple of 64 intervals; a block's
        /// due times are its keys' earliest and latest, and it is held
        /// if one of its keys is due by the hold's end.
        #[test]
        fn every_key_is_one_bit_of_its_block(
            hours in proptest::collection::btree_set(0i64..20_000, 1..300),
            sensors in 1usize..4,
            hold in 0i64..20_000,
        ) {
            let r = rollups_of(&["1h", "1d"]);
            let names = ["a", "b", "c"];
            let hours: Vec<i64> = hours.into_iter().collect();
            let keys = keys_of(&r, &names[..sensors], &hours);
            let not_before = hold * HOUR;
            let blocks = r.blocks(&keys, not_before);
            let mut back = Vec::new();
            for b in &blocks {
                let interval = r.specs[b.rollup].interval_ms();
                prop_assert_eq!(b.start % (interval * BLOCK), 0);
                let mine: Vec<Key> = (0..BLOCK)
                    .filter(|i| b.mask >> i & 1 == 1)
                    .map(|i| (b.rollup, b.sensor.clone(), b.start + i * interval))
                    .collect();
                let dues: Vec<i64> = mine.iter().map(|k| r.due_ms(k)).collect();
                prop_assert_eq!(b.first_due, *dues.iter().min().unwrap());
                prop_assert_eq!(b.last_due, *dues.iter().max().unwrap());
                prop_assert_eq!(b.held, b.first_due <= not_before);
                back.extend(mine);
            }
            back.sort();
            prop_assert_eq!(back, keys);
        }

        /// Every key is in exactly one query, which names its sensor and
        /// holds its interval; no query reads more than
        /// SUMMARIES_PER_QUERY windows unless it is one sensor's one
        /// interval.
        #[test]
        fn every_key_is_in_one_bounded_query(
            raw in proptest::collection::vec((0u16..50, 0i64..3000), 0..3000),
            interval_windows in 1i64..200,
        ) {
            let window = 60_000;
            let interval = window * interval_windows;
            let names: Vec<String> = (0..50).map(|i| format!("s{i}")).collect();
            let keys: Vec<(&str, i64)> = raw
                .iter()
                .map(|(s, i)| (names[*s as usize].as_str(), i * interval))
                .collect();
            let qs = bucket_queries(&keys, interval, window);
            let mut seen = vec![0; keys.len()];
            for q in &qs {
                prop_assert!(q.from < q.to && (q.to - q.from) % interval == 0);
                prop_assert!(
                    windows(q, interval, window) <= SUMMARIES_PER_QUERY
                        || (q.sensors.len() == 1 && q.to - q.from == interval),
                    "{:?}", q
                );
                for &k in &q.keys {
                    seen[k] += 1;
                    let (s, t) = keys[k];
                    prop_assert!(q.sensors.iter().any(|x| x == s));
                    prop_assert!(q.from <= t && t + interval <= q.to);
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1), "{:?}", seen);
        }

        /// Merging the buckets' summaries of an interval, however its
        /// readings were cut into buckets (some without first and last, as
        /// palletd 0.1 wrote them), is the summary of all its readings.
        #[test]
        fn merged_bucket_summaries_are_the_summary_of_the_readings(
            readings in proptest::collection::vec((0i64..20, -8i32..8, any::<bool>(), 0usize..4), 1..60),
        ) {
            // (ts, value in halves, has "hum", bucket)
            let mut buckets: Vec<Vec<(i64, f64, bool)>> = vec![Vec::new(); 4];
            for (t, v, hum, b) in &readings {
                buckets[*b].push((*t, *v as f64 / 2.0, *hum));
            }
            let mut merged = Rollup::default();
            for (i, b) in buckets.iter().enumerate().filter(|(_, b)| !b.is_empty()) {
                let doc = summary(b, i % 2 == 0);
                let samples: Vec<Bson> = b
                    .iter()
                    .map(|(t, v, hum)| {
                        let mut s = doc! { "ts": bson::DateTime::from_millis(*t), "temp": v, "door": "x" };
                        if *hum { s.insert("hum", v * 3.0); }
                        Bson::Document(s)
                    })
                    .collect();
                if !merged.add_bucket(&doc) {
                    prop_assert!(i % 2 == 1);
                    merged.add_edges_of_samples(&samples);
                }
            }
            let all: Vec<(i64, f64, bool)> = buckets.concat();
            prop_assert_eq!(merged, summary_of(&all));
        }
    }

    /// The fields of a reading (ts, temp, has hum): temp, and hum = 3 temp.
    fn values(r: &(i64, f64, bool)) -> Vec<(&'static str, f64)> {
        let mut v = vec![("temp", r.1)];
        if r.2 {
            v.push(("hum", r.1 * 3.0));
        }
        v
    }

    /// The rollup of readings, computed the plain way: sorted.
    fn summary_of(rs: &[(i64, f64, bool)]) -> Rollup {
        let mut out = Rollup {
            count: rs.len() as i64,
            fields: BTreeMap::new(),
        };
        for field in ["temp", "hum"] {
            let mut vs: Vec<(i64, f64)> = rs
                .iter()
                .flat_map(|r| {
                    values(r)
                        .into_iter()
                        .filter(|v| v.0 == field)
                        .map(|v| (r.0, v.1))
                })
                .collect();
            if vs.is_empty() {
                continue;
            }
            vs.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
            let xs = || vs.iter().map(|v| v.1);
            out.fields.insert(
                field.to_string(),
                FieldRollup {
                    sum: xs().sum(),
                    n: vs.len() as i64,
                    min: xs().fold(f64::INFINITY, f64::min),
                    max: xs().fold(f64::NEG_INFINITY, f64::max),
                    first: vs.first().copied(),
                    last: vs.last().copied(),
                },
            );
        }
        out
    }

    /// A bucket document's summaries of readings `rs`, with or without
    /// `first` and `last`.
    fn summary(rs: &[(i64, f64, bool)], edges: bool) -> Document {
        let r = summary_of(rs);
        let mut d = doc! { "count": r.count };
        let edge = |e: Option<(i64, f64)>| {
            let (t, v) = e.unwrap();
            doc! { "t": bson::DateTime::from_millis(t), "v": v }
        };
        let mut parts: [Document; 6] = Default::default();
        for (field, f) in &r.fields {
            parts[0].insert(field, f.sum);
            parts[1].insert(field, f.n as i32);
            parts[2].insert(field, f.min);
            parts[3].insert(field, f.max);
            parts[4].insert(field, edge(f.first));
            parts[5].insert(field, edge(f.last));
        }
        let names = ["sum", "n", "min", "max", "first", "last"];
        for (name, p) in names.into_iter().zip(parts).take(if edges { 6 } else { 4 }) {
            d.insert(name, p);
        }
        d
    }
}
