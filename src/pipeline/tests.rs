//! The pipeline core against a model of the spool and of each storage mode,
//! driven by arbitrary sequences of records, flush outcomes (success,
//! permanent rejection, ambiguous error, not sent), crashes and restarts.
//!
//! The model store behaves like the real one: the bucket mode cuts each run
//! into statements with the real planner, applies a flush as one ordered
//! command (statements in order, stopping at a cut) and records each
//! applied statement's first and last LSN under its sensor and window; it
//! resolves a sample by those ranges, so a statement whose range holds a
//! sample it does not carry would lose that sample and fail the check. The
//! time series mode applies any subset of an interrupted insert and
//! resolves LSN by LSN. A statement holding a sample whose value is
//! negative is refused for good by the database, every time it is sent.
//!
//! Two instances ([`Fleet`]) share one model database: each has its own
//! spool id and its LSNs coincide with the other's, so a rule that let one
//! instance's ranges stand for the other's would lose samples (a mutant
//! keying the ranges without the spool id fails). A restart may find the
//! spool copied from another box: it takes a new spool id for new records
//! and keeps the old one for those it holds (`Step::Restart { renew }`);
//! the model store records a statement's range under the id of its first
//! sample and a dead letter under the id in its `_id`, so a planner that
//! let a statement cross the boundary, or a core that named a replayed
//! sample's dead letter with the new id, fails. A read stops early now and
//! then and says how far it got: a core that took a short read for the
//! whole range would skip records. A full spool's
//! `drop_oldest` is modelled with its tombstone: the core must count
//! exactly the readings it never wrote. Every seal publishes the spool's
//! checkpoint under its ids and removes every LSN pair below its id's
//! published checkpoint (the sealed buckets' shape without `lsns`), and a
//! sample below it resolves as applied: publishing the durable LSN instead
//! of the checkpoint, or removing every pair, fails the checks.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::state::{Action, Config, Core};
use crate::bucket::{self, Sample, SampleRef, Shape};
use crate::decode::{FieldValue, Reading};
use crate::handoff::Feed;
use crate::handoff::{Batch, Outcome, Resolution, Resolve, Written};
use crate::spool::{Entry, Record};
use crate::spool_ids::Tags;

const SHAPE: Shape = Shape {
    window_ms: 10_000,
    max_samples: 4,
    max_bytes: 10_000,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Buckets,
    Timeseries,
}

/// How the next write goes wrong, if it does.
#[derive(Debug, Clone, Copy)]
enum Fate {
    /// Applied (poisoned samples rejected).
    Fine,
    /// The command holding the `at`-th statement is cut: its reply is lost
    /// after the server applied `applied` of its statements (a prefix in
    /// bucket mode, every other one in time series mode).
    Ambiguous {
        at: usize,
        len: usize,
        applied: usize,
    },
    /// The process dies after the server applied the first `applied`
    /// statements of the flush.
    Crash { applied: usize },
    /// The database is away for this many seconds: the write retries
    /// until it is back, then goes through.
    Outage { secs: u8 },
}

#[derive(Debug, Clone)]
enum Step {
    /// A sample of `sensor` (negative `value`: poisoned), offered to memory
    /// or left on disk (the feed channel was full).
    Sample {
        sensor: u8,
        ts_s: u8,
        value: i8,
        offered: bool,
    },
    /// A message that decoded to a dead letter.
    DeadLetter { offered: bool },
    /// The spool syncs.
    Sync,
    /// Time passes.
    Tick(u16),
    /// The next write's fate.
    Next(Fate),
    /// Up to this many actions are carried out.
    Run(u8),
    /// The process is killed (everything spooled was durable) and starts
    /// again from the checkpoint; `renew`: it finds its spool was copied
    /// from another box and takes a new spool id for what it spools from
    /// then on (the records it holds keep the old one).
    Restart { renew: bool },
    /// `spool.when_full = "drop_oldest"` deletes this many of the oldest
    /// durable records at or above the checkpoint (their sample LSNs go
    /// into the tombstone).
    DropOldest(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => ((0u8..8).prop_map(|s| s.saturating_sub(4)), 0u8..40, -1i8..20, proptest::bool::weighted(0.8)).prop_map(|(sensor, ts_s, value, offered)| Step::Sample { sensor, ts_s, value, offered }),
        1 => any::<bool>().prop_map(|offered| Step::DeadLetter { offered }),
        2 => Just(Step::Sync),
        1 => (0u16..3000).prop_map(Step::Tick),
        2 => prop_oneof![
            Just(Fate::Fine),
            (0usize..6, 1usize..4, 0usize..4).prop_map(|(at, len, applied)| Fate::Ambiguous { at, len, applied }),
            (0usize..6).prop_map(|applied| Fate::Crash { applied }),
            (1u8..10).prop_map(|secs| Fate::Outage { secs }),
        ].prop_map(Step::Next),
        4 => (1u8..6).prop_map(Step::Run),
        1 => proptest::bool::weighted(0.3).prop_map(|renew| Step::Restart { renew }),
    ]
}

/// [`step`], with the spool now and then full and dropping its oldest.
fn step_dropping() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => step(),
        1 => (1u8..8).prop_map(Step::DropOldest),
    ]
}

/// A sample or dead letter in the database: (spool id, LSN). Two writers'
/// LSNs may be equal; their spool ids are not.
type Key = (u32, u64);

/// The database.
#[derive(Default)]
struct Db {
    /// How many times each sample was stored, and when (model ms).
    stored: HashMap<Key, usize>,
    stored_at: HashMap<Key, i64>,
    /// Per spool id, sensor and window, the first and last LSN of each
    /// statement applied (bucket mode; the `lsns.<spool id>` field).
    ranges: HashMap<(u32, String, i64), Vec<u64>>,
    dead: HashSet<Key>,
    /// Samples of a statement the database refused (they go to the dead
    /// letter, never into a bucket).
    refused: HashSet<Key>,
    /// The checkpoint each spool id published at its seals (the
    /// `<collection>_spools` documents): every seal publishes its spool's
    /// and removes every LSN pair below its id's (`Store::seal`).
    published: HashMap<u32, u64>,
}

impl Db {
    /// What a seal does to the LSN pairs, finer than the real one (which
    /// drops a spool's pairs of a sealed bucket when all are below): each
    /// pair below its id's published checkpoint goes, in every window.
    fn strip(&mut self) {
        for ((tag, _, _), pairs) in self.ranges.iter_mut() {
            let Some(&c) = self.published.get(tag) else {
                continue;
            };
            let kept: Vec<u64> = pairs
                .chunks_exact(2)
                .filter(|p| p[1] >= c)
                .flatten()
                .copied()
                .collect();
            *pairs = kept;
        }
    }
}

/// The spool, the database and the pipeline core of one process.
struct World {
    mode: Mode,
    /// Every record appended, in LSN order.
    log: Vec<Record>,
    next_lsn: u64,
    durable: u64,
    checkpoint: u64,
    /// This process's spool ids (the core's `tags`): renewed now and then.
    tags: Tags,
    /// The database (several writers share one: see [`Fleet`]).
    db: Db,
    fate: Fate,
    max_pending: usize,
    /// The core's `max_statements` from the next restart on.
    max_statements: usize,
    core: Core,
    t0: Instant,
    now: Instant,
    now_ms: i64,
    /// Records appended since the last sync, with whether each was offered.
    unsynced: Vec<(usize, bool)>,
    /// How long a write takes per sample (time passes during writes).
    write_cost: Duration,
    /// Records `drop_oldest` deleted; the sample LSNs of them no read has
    /// stepped over yet (the tombstone files); the readings the core
    /// counted as lost; whether a run found missing a reading an earlier
    /// run had spooled (and may have written before it was killed).
    deleted: HashSet<u64>,
    tombstone: std::collections::BTreeSet<u64>,
    lost: u64,
    /// Closer runs so far (every other one goes in two chunks).
    seals: u64,
    missed_an_earlier_runs: bool,
    /// The first LSN of this run.
    run_from: u64,
    /// Reads so far.
    reads: u64,
}

fn config(mode: Mode, from: u64, fresh_from: u64, max_pending: usize) -> Config {
    config_replaying(mode, from, fresh_from, max_pending, 0)
}

fn config_replaying(
    mode: Mode,
    from: u64,
    fresh_from: u64,
    max_pending: usize,
    replay_records: u64,
) -> Config {
    Config {
        shape: SHAPE,
        tags: Tags::new(1),
        max_pending,
        // About as tight as the count: both bounds take turns.
        max_pending_bytes: max_pending * 100,
        max_lateness_ms: 3_600_000,
        max_delay: Duration::from_secs(1),
        // The delay may stretch where the world's slow writes keep
        // sensors waiting past it: exactly once whatever it does.
        max_delay_limit: Duration::from_secs(4),
        behind: Duration::from_secs(3),
        backfill_share: 0.5,
        seal_every: Duration::from_secs(60),
        seal_grace_ms: (mode == Mode::Buckets).then_some(5_000),
        from,
        fresh_from,
        replay_records,
        // Small: flushes take sensors' queues in part.
        max_statements: 3,
    }
}

fn sample(lsn: u64, ts_ms: i64, value: i8) -> Sample {
    Sample::encode(
        &Reading {
            sensor: String::new(),
            ts_ms,
            fields: vec![("v".into(), FieldValue::Num(value as f64))],
            ..Reading::default()
        },
        lsn,
    )
}

fn poisoned(s: SampleRef<'_>) -> bool {
    s.nums().any(|(_, v)| v < 0.0)
}

impl World {
    fn new(mode: Mode, max_pending: usize) -> World {
        World::of_spool(1, mode, max_pending)
    }

    /// A process whose spool id is `tag`.
    fn of_spool(tag: u32, mode: Mode, max_pending: usize) -> World {
        let t0 = Instant::now();
        World {
            mode,
            log: Vec::new(),
            next_lsn: 1000,
            durable: 1000,
            checkpoint: 1000,
            tags: Tags::new(tag),
            db: Db::default(),
            fate: Fate::Fine,
            max_pending,
            max_statements: 3,
            core: Core::new(
                Config {
                    tags: Tags::new(tag),
                    ..config(mode, 1000, 1000, max_pending)
                },
                t0,
            ),
            t0,
            now: t0,
            now_ms: 1_800_000_000_000,
            unsynced: Vec::new(),
            write_cost: Duration::ZERO,
            deleted: HashSet::new(),
            tombstone: Default::default(),
            lost: 0,
            seals: 0,
            missed_an_earlier_runs: false,
            run_from: 1000,
            reads: 0,
        }
    }

    fn append(&mut self, entry: Entry, offered: bool) {
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        self.log.push(Record {
            lsn,
            received_ms: self.now_ms,
            entry,
        });
        self.unsynced.push((self.log.len() - 1, offered));
    }

    /// The admission offers what it appended once it is appended (before it
    /// is durable), one record per feed here.
    fn sync(&mut self) {
        for (i, offered) in std::mem::take(&mut self.unsynced) {
            let rec = &self.log[i];
            if offered {
                let feed = Feed {
                    first: rec.lsn,
                    end: rec.lsn + 1,
                    records: 1,
                    bytes: rec.encode().into(),
                    spooled: self.now,
                    held: None,
                };
                self.core.feed(feed, self.now, self.now_ms);
            }
        }
        self.durable = self.next_lsn;
        self.core.set_durable(self.durable);
    }

    fn step(&mut self, s: &Step) -> Result<(), TestCaseError> {
        match s {
            Step::Sample {
                sensor,
                ts_s,
                value,
                offered,
            } => {
                let ts = self.now_ms - 20_000 + *ts_s as i64 * 1000;
                let doc = sample(0, ts, *value).doc.into_bytes();
                self.append(
                    Entry::Sample {
                        sensor: format!("s{sensor}"),
                        doc,
                    },
                    *offered,
                );
            }
            // Its `_id` names the spool id it was spooled under, as the
            // admission makes it.
            Step::DeadLetter { offered } => {
                let id = crate::deadletter::id(self.tags.current(), self.next_lsn);
                self.append(
                    Entry::DeadLetter {
                        doc: bson::to_vec(&bson::doc! { "_id": id }).unwrap(),
                    },
                    *offered,
                )
            }
            Step::Sync => self.sync(),
            Step::Tick(ms) => {
                self.now += Duration::from_millis(*ms as u64);
                self.now_ms += *ms as i64;
            }
            Step::Next(f) => self.fate = *f,
            Step::Run(n) => {
                for _ in 0..*n {
                    if !self.act()? {
                        break;
                    }
                }
            }
            Step::Restart { renew } => {
                if *renew {
                    self.renew();
                }
                self.restart()
            }
            Step::DropOldest(k) => self.drop_oldest(*k as usize),
        }
        Ok(())
    }

    /// Deletes the `k` oldest durable records not confirmed yet, the way
    /// the appender deletes a segment: a tombstone keeps their sample LSNs.
    fn drop_oldest(&mut self, k: usize) {
        let oldest: Vec<(u64, bool)> = self
            .log
            .iter()
            .filter(|r| {
                r.lsn >= self.checkpoint && r.lsn < self.durable && !self.deleted.contains(&r.lsn)
            })
            .take(k)
            .map(|r| (r.lsn, matches!(r.entry, Entry::Sample { .. })))
            .collect();
        for (lsn, sample) in oldest {
            self.deleted.insert(lsn);
            if sample {
                self.tombstone.insert(lsn);
            }
        }
    }

    /// The spool turns out to be a copy: a new id from the next LSN on.
    fn renew(&mut self) {
        let old = self.tags.current();
        let mut previous = self.tags.previous().to_vec();
        previous.push((old, self.next_lsn));
        self.tags = Tags::with_previous(old + 1000, previous);
    }

    /// A crash: memory is gone; what was appended is durable (what was not
    /// would never have been acknowledged). The next run starts from the
    /// checkpoint.
    fn restart(&mut self) {
        self.unsynced.clear();
        // A new run starts its LSNs later (the spool takes the clock);
        // everything before them is durable.
        self.next_lsn += 100;
        self.durable = self.next_lsn;
        self.run_from = self.next_lsn;
        let replay = self.log.iter().filter(|r| r.lsn >= self.checkpoint).count();
        self.core = Core::new(
            Config {
                tags: self.tags.clone(),
                max_statements: self.max_statements,
                ..config_replaying(
                    self.mode,
                    self.checkpoint,
                    self.next_lsn,
                    self.max_pending,
                    replay as u64,
                )
            },
            self.now,
        );
        self.core.set_durable(self.durable);
    }

    /// Carries out one action; false when there was none.
    fn act(&mut self) -> Result<bool, TestCaseError> {
        self.core.check();
        let recent = self.recent_from();
        self.core.set_recent_from(recent);
        let Some(action) = self.core.poll(self.now, self.now_ms) else {
            return Ok(false);
        };
        match action {
            Action::Checkpoint(lsn) => self.checkpoint_taken(lsn)?,
            Action::Read {
                from, max, limit, ..
            } => self.read(from, max, limit)?,
            Action::Resolve(req) => {
                // An outage meets the resolve as it would a write.
                let outage = match self.fate {
                    Fate::Outage { secs } => {
                        self.fate = Fate::Fine;
                        self.wait_out(secs);
                        true
                    }
                    _ => false,
                };
                let mut r = self.resolve(&req);
                r.met_errors = outage;
                self.core.resolved(r);
                if outage {
                    self.sync();
                }
            }
            Action::Write(mut batch) => {
                for r in &batch.runs {
                    prop_assert!(
                        r.samples.iter().all(|s| s.lsn < self.durable),
                        "only durable records are written"
                    );
                }
                let fate = std::mem::replace(&mut self.fate, Fate::Fine);
                if let Fate::Outage { secs } = fate {
                    self.wait_out(secs);
                }
                let took = self.write_cost * batch.samples() as u32;
                self.now += took;
                self.now_ms += took.as_millis() as i64;
                match self.write(&mut batch, fate) {
                    Some(written) => {
                        self.core.written(batch, written, self.now, self.now_ms);
                        if matches!(fate, Fate::Outage { .. }) {
                            self.sync();
                        }
                    }
                    None => self.restart(),
                }
            }
            Action::Seal {
                now_ms,
                late,
                first,
            } => self.seal(now_ms, late, first)?,
            Action::Done => return Ok(false),
        }
        Ok(true)
    }

    /// The checkpoint stored: never past a record not in the database.
    fn checkpoint_taken(&mut self, lsn: u64) -> Result<(), TestCaseError> {
        // Never past a record that is not in the database.
        for rec in self
            .log
            .iter()
            .filter(|r| r.lsn < lsn && r.lsn >= self.checkpoint)
        {
            let done = self.deleted.contains(&rec.lsn)
                || match &rec.entry {
                    Entry::Sample { .. } => {
                        self.db
                            .stored
                            .contains_key(&(self.tags.of(rec.lsn), rec.lsn))
                            || self.db.dead.contains(&(self.tags.of(rec.lsn), rec.lsn))
                    }
                    Entry::DeadLetter { .. } => {
                        self.db.dead.contains(&(self.tags.of(rec.lsn), rec.lsn))
                    }
                    Entry::MessageId { .. } | Entry::Sparkplug { .. } | Entry::LastValue { .. } => {
                        true
                    }
                };
            prop_assert!(
                done,
                "checkpoint {} passes LSN {} which is not in the database",
                lsn,
                rec.lsn
            );
        }
        // The appender prunes the tombstones below it.
        self.tombstone = self.tombstone.split_off(&lsn);
        prop_assert!(lsn >= self.checkpoint, "the checkpoint never goes back");
        self.checkpoint = lsn;
        Ok(())
    }

    /// A read of the log, as the spool's reader does it.
    fn read(&mut self, from: u64, max: usize, limit: u64) -> Result<(), TestCaseError> {
        prop_assert!(limit <= self.durable);
        // Every third read stops early (say at the end of a segment
        // being written): it says how far it got, not `limit`.
        self.reads += 1;
        let take = match self.reads % 3 {
            0 => (max / 2).max(1),
            _ => max,
        };
        let mut bytes = Vec::new();
        let mut n = 0;
        let mut end = limit;
        let mut stopped = false;
        for r in self
            .log
            .iter()
            .filter(|r| r.lsn >= from && r.lsn < limit && !self.deleted.contains(&r.lsn))
            .take(max)
        {
            if n == take {
                stopped = true;
                break;
            }
            r.encode_into(&mut bytes);
            n += 1;
            end = r.lsn + 1;
        }
        if n < max && !stopped {
            end = limit;
        }
        // The reader reports what it stepped over; the spool forgets
        // what the core counted.
        let missing: Vec<u64> = self.tombstone.range(from..end).copied().collect();
        let lost = self
            .core
            .records(&bytes, n, end, &missing, self.now, self.now_ms);
        for l in &lost {
            self.tombstone.remove(l);
        }
        self.missed_an_earlier_runs |= lost.iter().any(|l| *l < self.run_from);
        self.lost += lost.len() as u64;
        Ok(())
    }

    /// A seal, as the model's database does it.
    fn seal(&mut self, now_ms: i64, late: bool, first: bool) -> Result<(), TestCaseError> {
        // Nothing held of a window the seal closes (a sample the
        // database refuses never goes into a bucket, nor do those
        // refused with it).
        // (Unless late readings of them kept arriving through the
        // core's flush rounds: then they go into new buckets.)
        let held = self.log.iter().filter(|r| r.lsn >= self.checkpoint);
        for r in held.filter(|_| self.mode == Mode::Buckets && !late) {
            if let Entry::Sample { doc, .. } = &r.entry {
                let d = bson::RawDocument::from_bytes(doc).unwrap();
                let sample = SampleRef::from_doc(d, r.lsn).unwrap();
                let ts = sample.ts_ms;
                let closed = !poisoned(sample)
                    && !self.db.refused.contains(&(self.tags.of(r.lsn), r.lsn))
                    && SHAPE.window_start(ts) + SHAPE.window_ms <= now_ms - 5_000;
                prop_assert!(
                    !closed
                        || self.db.stored.contains_key(&(self.tags.of(r.lsn), r.lsn))
                        || self.db.dead.contains(&(self.tags.of(r.lsn), r.lsn))
                        || self.deleted.contains(&r.lsn)
                        || r.lsn >= self.core.cursor(),
                    "sealing a window while holding its sample {}",
                    r.lsn
                );
            }
        }
        // The pipeline's checkpoint, under the spool's current id
        // (an earlier id may be another box's too).
        // (Published at a closer run's first chunk only, as the
        // store does.)
        if first {
            let c = self.db.published.entry(self.tags.current()).or_default();
            *c = (*c).max(self.checkpoint);
        }
        self.db.strip();
        // Every other closer run goes in two chunks (the model's
        // database seals it all in the first).
        self.seals += 1;
        let more = self.mode == Mode::Buckets && first && self.seals.is_multiple_of(2);
        self.core
            .sealed(self.now, now_ms, Some(now_ms - 5_000), more);
        Ok(())
    }

    /// The database is away for `secs` while an action waits: readings
    /// keep arriving (the admission appends them), the pipeline reads none.
    fn wait_out(&mut self, secs: u8) {
        for _ in 0..secs {
            let doc = sample(0, self.now_ms, 1).doc.into_bytes();
            self.append(
                Entry::Sample {
                    sensor: "s7".into(),
                    doc,
                },
                false,
            );
            self.now += Duration::from_secs(1);
            self.now_ms += 1000;
        }
    }

    /// The first durable record received less than `behind` ago (the
    /// durable end when none is), as the spool's history says.
    fn recent_from(&self) -> Option<u64> {
        let horizon = self.now_ms - self.core.behind().as_millis() as i64;
        let mut durable = self.log.iter().filter(|r| r.lsn < self.durable);
        Some(
            durable
                .find(|r| r.received_ms > horizon)
                .map_or(self.durable, |r| r.lsn),
        )
    }

    fn resolve(&self, req: &[Resolve]) -> Resolution {
        let mut out = Resolution::default();
        for r in req {
            for &(lsn, ts) in &r.samples {
                let held = match self.mode {
                    Mode::Buckets => {
                        self.db
                            .ranges
                            .get(&(self.tags.of(lsn), r.sensor.clone(), SHAPE.window_start(ts)))
                            .is_some_and(|pairs| bucket::ranges_hold(pairs, lsn))
                            || self
                                .db
                                .published
                                .get(&self.tags.of(lsn))
                                .is_some_and(|&c| lsn < c)
                    }
                    Mode::Timeseries => self.db.stored.contains_key(&(self.tags.of(lsn), lsn)),
                };
                if held || self.db.dead.contains(&(self.tags.of(lsn), lsn)) {
                    out.applied.insert(lsn);
                }
            }
        }
        out
    }

    /// Applies one statement: its samples stored, its range recorded.
    fn apply(&mut self, run: &crate::handoff::Run, range: std::ops::Range<usize>) {
        let (mut lo, mut hi) = (u64::MAX, 0);
        for i in range.clone() {
            let s = run.samples.get(i);
            *self
                .db
                .stored
                .entry((self.tags.of(s.lsn), s.lsn))
                .or_default() += 1;
            self.db
                .stored_at
                .insert((self.tags.of(s.lsn), s.lsn), self.now_ms);
            lo = lo.min(s.lsn);
            hi = hi.max(s.lsn);
        }
        let start = SHAPE.window_start(run.samples.get(range.start).ts_ms);
        self.db
            .ranges
            // Under the id of its first sample, as the real statement does.
            .entry((
                self.tags.of(run.samples.get(range.start).lsn),
                run.sensor.clone(),
                start,
            ))
            .or_default()
            .extend([lo, hi]);
    }

    /// The store's write, with the fate: `None` when the process died.
    fn write(&mut self, batch: &mut Batch, fate: Fate) -> Option<Written> {
        // Dead letters first (idempotent by LSN).
        let crash_at = match fate {
            Fate::Crash { applied } => Some(applied),
            _ => None,
        };
        if crash_at == Some(0) {
            return None;
        }
        // Under the spool id in its `_id`, as the real insert does.
        for d in &batch.deadletters {
            let id = d.1.get_object_id("_id").expect("a dead letter's _id");
            let tag = u32::from_be_bytes(id.bytes()[..4].try_into().unwrap());
            self.db.dead.insert((tag, d.0));
        }
        let mut written = Written::default();
        // Statements in order: the real planner's in bucket mode, one per
        // sample in time series mode.
        let mut order: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
        for (r, run) in batch.runs.iter_mut().enumerate() {
            run.outcomes = vec![Outcome::NotSent; run.samples.len()];
            match self.mode {
                Mode::Buckets => order.extend(
                    bucket::plan(&run.samples, &mut run.fills, &SHAPE, &self.tags)
                        .into_iter()
                        .map(|st| (r, st.range)),
                ),
                Mode::Timeseries => order.extend((0..run.samples.len()).map(|i| (r, i..i + 1))),
            }
        }
        let poison = |batch: &Batch, (r, range): &(usize, std::ops::Range<usize>)| {
            range
                .clone()
                .any(|i| poisoned(batch.runs[*r].samples.get(i)))
        };
        for (k, st) in order.iter().enumerate() {
            if crash_at.is_some_and(|c| k >= c) {
                return None;
            }
            if let Fate::Ambiguous { at, len, applied } = fate {
                if k >= at {
                    // This command's statements: unknown; a part applied.
                    let end = (at + len).min(order.len());
                    for (j, st2) in order[at..end].iter().enumerate() {
                        let took = match self.mode {
                            Mode::Buckets => j < applied,
                            Mode::Timeseries => j % 2 == applied % 2,
                        };
                        let refused = poison(batch, st2);
                        if took && !refused {
                            self.apply(&batch.runs[st2.0], st2.1.clone());
                        }
                        batch.runs[st2.0].outcomes[st2.1.clone()].fill(Outcome::Unknown);
                        if self.mode == Mode::Buckets && refused && j < applied {
                            // An ordered command stops at its first error.
                            break;
                        }
                    }
                    written.met_errors = true;
                    return Some(written);
                }
            }
            let outcome = if poison(batch, st) {
                let (run, tags) = (&batch.runs[st.0], &self.tags);
                self.db.refused.extend(st.1.clone().map(|i| {
                    let lsn = run.samples.get(i).lsn;
                    (tags.of(lsn), lsn)
                }));
                Outcome::Rejected("poison".into())
            } else {
                self.apply(&batch.runs[st.0], st.1.clone());
                written.statements += 1;
                Outcome::Applied
            };
            batch.runs[st.0].outcomes[st.1.clone()].fill(outcome);
        }
        written.met_errors |= matches!(fate, Fate::Outage { .. });
        Some(written)
    }

    /// Runs everything to the end: the spool synced, no faults.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        self.fate = Fate::Fine;
        self.sync();
        for _ in 0..10_000 {
            if !self.act()? {
                if self.core.pending() == 0
                    && self.core.backlog() == 0
                    && self.checkpoint == self.core.cursor()
                {
                    return Ok(());
                }
                self.now += Duration::from_secs(2);
                self.now_ms += 2000;
            }
        }
        prop_assert!(false, "the pipeline did not drain");
        Ok(())
    }

    /// Every record is in the database exactly once: a sample stored or,
    /// poisoned (or in a statement with a poisoned one), dead-lettered; a
    /// dead letter written.
    fn check(&self) -> Result<(), TestCaseError> {
        // What `drop_oldest` deleted is stored at most once, or lost: the
        // core counts exactly those it never wrote (of those an earlier
        // run spooled, it may count some that run wrote before it was
        // killed: it cannot ask MongoDB about a reading it cannot read).
        let mut lost = 0;
        let mut deleted_and_done = 0;
        for rec in self.log.iter().filter(|r| self.deleted.contains(&r.lsn)) {
            if let Entry::Sample { .. } = rec.entry {
                let stored = self
                    .db
                    .stored
                    .get(&(self.tags.of(rec.lsn), rec.lsn))
                    .copied()
                    .unwrap_or(0);
                prop_assert!(stored <= 1, "deleted sample {} stored twice", rec.lsn);
                match stored == 1 || self.db.dead.contains(&(self.tags.of(rec.lsn), rec.lsn)) {
                    true => deleted_and_done += 1,
                    false => lost += 1,
                }
            }
        }
        if self.missed_an_earlier_runs {
            prop_assert!(
                (lost..=lost + deleted_and_done).contains(&self.lost),
                "counted {} lost of {} lost (+{} written)",
                self.lost,
                lost,
                deleted_and_done
            );
        } else {
            prop_assert_eq!(self.lost, lost, "every lost reading counted once");
        }
        for rec in self.log.iter().filter(|r| !self.deleted.contains(&r.lsn)) {
            match &rec.entry {
                Entry::Sample { doc, .. } => {
                    let d = bson::RawDocument::from_bytes(doc).unwrap();
                    let s = SampleRef::from_doc(d, rec.lsn).unwrap();
                    if poisoned(s) {
                        prop_assert!(
                            self.db.dead.contains(&(self.tags.of(rec.lsn), rec.lsn)),
                            "poisoned {} dead-lettered",
                            rec.lsn
                        );
                        prop_assert!(!self
                            .db
                            .stored
                            .contains_key(&(self.tags.of(rec.lsn), rec.lsn)));
                    } else if !self.db.dead.contains(&(self.tags.of(rec.lsn), rec.lsn)) {
                        prop_assert_eq!(
                            self.db
                                .stored
                                .get(&(self.tags.of(rec.lsn), rec.lsn))
                                .copied(),
                            Some(1),
                            "sample {} stored once",
                            rec.lsn
                        );
                    } else {
                        prop_assert!(
                            !self
                                .db
                                .stored
                                .contains_key(&(self.tags.of(rec.lsn), rec.lsn)),
                            "sample {} dead-lettered and stored",
                            rec.lsn
                        );
                    }
                }
                Entry::DeadLetter { .. } => {
                    prop_assert!(self.db.dead.contains(&(self.tags.of(rec.lsn), rec.lsn)))
                }
                Entry::MessageId { .. } | Entry::Sparkplug { .. } | Entry::LastValue { .. } => {}
            }
        }
        Ok(())
    }
}

fn run(mode: Mode, max_pending: usize, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut w = World::new(mode, max_pending);
    // Writes take time, so the live lane falls behind now and then and the
    // backlog's share of the time matters.
    w.write_cost = Duration::from_millis(40);
    for s in steps {
        w.step(s)?;
    }
    w.drain()?;
    w.check()?;
    let _ = w.t0;
    Ok(())
}

/// Two palletd instances, each with its own spool, spool id and core,
/// writing the same sensors into one database, their LSNs alike (both
/// spools start at the same LSN and the same time): one instance's replay
/// must skip exactly what it applied, nothing the other applied.
struct Fleet {
    worlds: [World; 2],
    /// The database, lent to the instance taking a step.
    db: Db,
}

impl Fleet {
    fn new(mode: Mode, max_pending: usize) -> Fleet {
        let mut worlds = [1, 2].map(|tag| World::of_spool(tag, mode, max_pending));
        for w in &mut worlds {
            w.write_cost = Duration::from_millis(40);
        }
        Fleet {
            worlds,
            db: Db::default(),
        }
    }

    /// Runs `f` on instance `i`, with the database.
    fn on<R>(&mut self, i: usize, f: impl FnOnce(&mut World) -> R) -> R {
        let w = &mut self.worlds[i];
        std::mem::swap(&mut w.db, &mut self.db);
        let r = f(w);
        std::mem::swap(&mut w.db, &mut self.db);
        r
    }
}

fn run_fleet(mode: Mode, max_pending: usize, steps: &[(bool, Step)]) -> Result<(), TestCaseError> {
    let mut fleet = Fleet::new(mode, max_pending);
    for (second, s) in steps {
        fleet.on(*second as usize, |w| w.step(s))?;
    }
    for i in 0..2 {
        fleet.on(i, |w| w.drain())?;
    }
    for i in 0..2 {
        fleet.on(i, |w| w.check())?;
    }
    Ok(())
}

/// Without permanent rejections: any crash, any ambiguous write.
fn no_poison(steps: Vec<Step>) -> Vec<Step> {
    steps
        .into_iter()
        .map(|s| match s {
            Step::Sample {
                sensor,
                ts_s,
                value,
                offered,
            } => Step::Sample {
                sensor,
                ts_s,
                value: value.max(0),
                offered,
            },
            other => other,
        })
        .collect()
}

fn no_poison_pairs(steps: Vec<(bool, Step)>) -> Vec<(bool, Step)> {
    let (who, steps): (Vec<bool>, Vec<Step>) = steps.into_iter().unzip();
    who.into_iter().zip(no_poison(steps)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn buckets_store_every_sample_exactly_once_through_crashes_and_lost_replies(max_pending in 2usize..16, steps in proptest::collection::vec(step(), 1..150)) {
        run(Mode::Buckets, max_pending, &no_poison(steps))?;
    }

    #[test]
    fn buckets_dead_letter_every_rejected_sample_exactly_once_through_crashes(max_pending in 2usize..16, steps in proptest::collection::vec(step(), 1..150)) {
        run(Mode::Buckets, max_pending, &steps)?;
    }

    #[test]
    fn timeseries_store_every_sample_exactly_once_through_everything(max_pending in 2usize..16, steps in proptest::collection::vec(step(), 1..150)) {
        run(Mode::Timeseries, max_pending, &steps)?;
    }

    #[test]
    fn two_instances_writing_the_same_sensors_store_each_sample_exactly_once(max_pending in 2usize..16, steps in proptest::collection::vec((any::<bool>(), step()), 1..200)) {
        run_fleet(Mode::Buckets, max_pending, &no_poison_pairs(steps))?;
    }

    #[test]
    fn two_instances_in_time_series_mode_store_each_sample_exactly_once(max_pending in 2usize..16, steps in proptest::collection::vec((any::<bool>(), step()), 1..200)) {
        run_fleet(Mode::Timeseries, max_pending, &steps)?;
    }

    #[test]
    fn buckets_count_exactly_what_a_full_spool_dropped(max_pending in 2usize..16, steps in proptest::collection::vec(step_dropping(), 1..150)) {
        run(Mode::Buckets, max_pending, &steps)?;
    }

    #[test]
    fn timeseries_count_exactly_what_a_full_spool_dropped(max_pending in 2usize..16, steps in proptest::collection::vec(step_dropping(), 1..150)) {
        run(Mode::Timeseries, max_pending, &steps)?;
    }
}

/// A restart with a backlog larger than memory: one sensor's samples were
/// written far past the checkpoint (another sensor's sample held it back),
/// so what was applied is found in later replayed batches too.
#[test]
fn a_restart_finds_what_was_written_past_the_checkpoint_in_every_replayed_batch() {
    let mut w = World::new(Mode::Buckets, 6);
    let sample = |sensor: u8| Step::Sample {
        sensor,
        ts_s: 1,
        value: 1,
        offered: true,
    };
    // Sensor 1's lone sample stays pending; sensor 0 fills its bucket
    // (4 samples) again and again and is flushed alone each time.
    // (The first run does the start-up seal. A tick apart: a flush starts
    // at most once a tick; sensor 1's delay of 1 s does not run out.)
    let mut steps = vec![Step::Run(5), sample(1), Step::Sync, Step::Run(5)];
    for _ in 0..4 {
        steps.extend([
            Step::Tick(150),
            sample(0),
            sample(0),
            sample(0),
            sample(0),
            Step::Sync,
            Step::Run(5),
        ]);
    }
    steps.push(Step::Restart { renew: false });
    for s in &steps {
        w.step(s).unwrap();
    }
    assert_eq!(
        w.db.stored.len(),
        16,
        "sensor 0 was written past the checkpoint"
    );
    assert_eq!(w.checkpoint, 1000, "held back by sensor 1");
    w.drain().unwrap();
    w.check().unwrap();
}

/// After a restart, a live reading is written with its normal lag (its
/// delay plus about a flush) while the backlog the spool held, which takes
/// seconds to write, is still draining; everything is stored once. (After
/// an outage the same happens; the property tests and tests/suite/wan.rs cover
/// that.)
/// Across an outage the pipeline reads nothing while its write waits, so
/// what arrived meanwhile is on disk, not in memory: that counts as falling
/// behind too, and it becomes backlog instead of being written as live.
#[test]
fn readings_left_on_disk_across_an_outage_become_backlog() {
    let mut w = World::new(Mode::Buckets, 1_000);
    w.step(&Step::Sample {
        sensor: 0,
        ts_s: 30,
        value: 1,
        offered: true,
    })
    .unwrap();
    w.sync();
    w.fate = Fate::Outage { secs: 9 };
    let mut fell_back = false;
    for _ in 0..200 {
        if !w.act().unwrap() {
            w.now += Duration::from_millis(100);
            w.now_ms += 100;
        }
        if matches!(w.fate, Fate::Fine) && w.core.backlog_status().readings > 0 {
            fell_back = true;
            break;
        }
    }
    assert!(
        fell_back,
        "the readings that arrived during the outage became backlog"
    );
    w.drain().unwrap();
    w.check().unwrap();
    assert_eq!(w.db.stored.len(), 10);
}

/// The link is cut under a write (its reply lost) and stays cut while
/// palletd asks what that write applied: once the database is back, what
/// waited is backlog, as across an outage met by a write, and the flush
/// that was being prepared does not write it all ahead of new readings
/// (it did: the first write after the resolve cleared the outage; `bench
/// wan` saw the probe's lag p99 at 14 s after a 60 s cut, 4.5 s before).
#[test]
fn an_outage_met_while_resolving_a_cut_write_makes_a_backlog() {
    let mut w = World::new(Mode::Buckets, 1_000);
    for ts_s in [30, 31] {
        w.step(&Step::Sample {
            sensor: 0,
            ts_s,
            value: 1,
            offered: true,
        })
        .unwrap();
    }
    w.sync();
    w.fate = Fate::Ambiguous {
        at: 0,
        len: 1,
        applied: 0,
    };
    let mut cut = false;
    let mut fell_back = false;
    for _ in 0..200 {
        if !w.act().unwrap() {
            w.now += Duration::from_millis(100);
            w.now_ms += 100;
        }
        // The write was cut: the database is away while it is resolved.
        if !cut && matches!(w.fate, Fate::Fine) {
            cut = true;
            w.fate = Fate::Outage { secs: 9 };
        }
        if cut && matches!(w.fate, Fate::Fine) && w.core.backlog_status().readings > 0 {
            fell_back = true;
            break;
        }
    }
    assert!(
        fell_back,
        "the readings that waited out the outage became backlog"
    );
    // Those that arrived within `behind` (3 s, a reading a second) of the
    // database's return are not behind: the live lane read them (and the
    // backlog lane nothing yet).
    let live = w.core.pending();
    assert!(
        (2..=3).contains(&live),
        "the live lane goes on from the records of the last 3 s, not the durable end ({live} held)"
    );
    w.drain().unwrap();
    w.check().unwrap();
    assert_eq!(w.db.stored.len(), 11);
}

#[test]
fn after_a_restart_live_readings_go_first_while_the_backlog_drains() {
    let mut w = World::new(Mode::Buckets, 200_000);
    // 0.2 ms per sample: the 30,000 backlog readings take 6 s to write.
    w.write_cost = Duration::from_micros(200);
    w.step(&Step::Run(3)).unwrap();
    for i in 0..30_000u32 {
        w.step(&Step::Sample {
            sensor: (i % 30) as u8,
            ts_s: (i % 40) as u8,
            value: 1,
            offered: true,
        })
        .unwrap();
    }
    w.sync();
    // Killed before any of it was written: on the restart it is all
    // backlog, and readings arriving from then on are live. (Flushes of
    // the size palletd runs with: the lag bound below is about their time.)
    w.max_statements = crate::pipeline::MAX_STATEMENTS_PER_FLUSH;
    w.step(&Step::Restart { renew: false }).unwrap();
    assert!(w.core.backlog_status().readings > 0);
    let backlog = 30_000 - w.db.stored.len();
    let live_lsn = w.next_lsn;
    let arrived = w.now_ms;
    w.step(&Step::Sample {
        sensor: 99,
        ts_s: 30,
        value: 1,
        offered: true,
    })
    .unwrap();
    w.sync();
    let mut backlog_left_when_live_stored = None;
    for _ in 0..10_000 {
        if !w.act().unwrap() {
            w.now += Duration::from_millis(100);
            w.now_ms += 100;
        }
        if backlog_left_when_live_stored.is_none()
            && w.db.stored.contains_key(&(w.tags.of(live_lsn), live_lsn))
        {
            backlog_left_when_live_stored = Some(30_000 - (w.db.stored.len() - 1));
            assert!(
                w.core.backlog_status().readings > 0,
                "the backlog is reported"
            );
        }
        if w.db.stored.len() == 30_001 {
            break;
        }
    }
    let left = backlog_left_when_live_stored.expect("the live reading was stored");
    assert!(
        left >= backlog / 2,
        "the live reading went first: {left} of {backlog} backlog readings left"
    );
    let lag = w.db.stored_at[&(w.tags.of(live_lsn), live_lsn)] - arrived;
    assert!(
        lag <= 3_500,
        "live lag {lag} ms: max_delay (1 s) plus about one backlog flush (1 s) and its own"
    );
    w.drain().unwrap();
    w.check().unwrap();
    assert_eq!(w.core.backlog_status().readings, 0);
}

/// Memory is bounded in bytes, not only in samples: records of 2 KiB each
/// against 64 KiB for pending samples (the count bound far away). The core
/// takes in what fits, leaves the rest on disk and reads it back as room
/// frees; it never holds more than its bytes and one record, and every
/// sample is stored in the end.
#[test]
fn memory_held_stays_within_its_bytes_whatever_the_records_size() {
    const BUDGET: usize = 64 * 1024;
    const RECORDS: usize = 2_000;
    let mut w = World::new(Mode::Buckets, 1_000_000);
    w.core = Core::new(
        Config {
            max_pending_bytes: BUDGET,
            ..config(Mode::Buckets, 1000, 1000, 1_000_000)
        },
        w.t0,
    );
    let text = "x".repeat(2000);
    let mut peak = 0;
    let mut record = 0;
    for i in 0..RECORDS {
        let reading = Reading {
            ts_ms: w.now_ms,
            fields: vec![("note".into(), FieldValue::Str(text.clone()))],
            ..Reading::default()
        };
        let doc = Sample::encode(&reading, 0).doc.into_bytes();
        record = record.max(doc.len());
        w.append(
            Entry::Sample {
                sensor: format!("s{}", i % 100),
                doc,
            },
            true,
        );
        w.sync();
        peak = peak.max(w.core.held_bytes());
        if i % 20 == 19 {
            for _ in 0..5 {
                w.act().unwrap();
                peak = peak.max(w.core.held_bytes());
            }
        }
        w.now += Duration::from_millis(1);
        w.now_ms += 1;
    }
    assert!(
        peak <= BUDGET + record + 64,
        "held {peak} bytes, budget {BUDGET}"
    );
    assert!(peak > BUDGET / 2, "the budget was reached ({peak} bytes)");
    w.drain().unwrap();
    w.check().unwrap();
    assert_eq!(w.db.stored.len(), RECORDS);
}

/// A closer run's seal goes in chunks (the hour's seal of 10,000 sensors'
/// buckets is tens of seconds of the server's time): a flush that falls
/// due goes before the next chunk until the chunk waited seven times what
/// the last one took, and with nothing due the next chunk follows at
/// once, at the run's time; the run is over when a chunk reports no more.
#[test]
fn flushes_go_between_the_chunks_of_a_seal_and_it_keeps_a_share() {
    let mut w = World::new(Mode::Buckets, 1000);
    // Carries out checkpoints; returns the first other action.
    fn next(w: &mut World) -> Option<Action> {
        loop {
            match w.core.poll(w.now, w.now_ms)? {
                Action::Checkpoint(lsn) => w.checkpoint = lsn,
                other => return Some(other),
            }
        }
    }
    fn pass(w: &mut World, ms: u64) {
        w.now += Duration::from_millis(ms);
        w.now_ms += ms as i64;
    }
    fn flush(w: &mut World, mut batch: Batch) {
        let written = w.write(&mut batch, Fate::Fine).unwrap();
        w.core.written(batch, written, w.now, w.now_ms);
    }
    fn due_sensor(w: &mut World, sensor: u8) {
        w.step(&Step::Sample {
            sensor,
            ts_s: 30,
            value: 1,
            offered: true,
        })
        .unwrap();
        w.sync();
    }
    let Some(Action::Seal {
        now_ms: at,
        first: true,
        ..
    }) = next(&mut w)
    else {
        panic!("a seal is due at start");
    };
    // Its first chunk takes 1 s, with more to go.
    pass(&mut w, 1_000);
    w.core.sealed(w.now, at, Some(at - 5_000), true);
    // A sensor falls due 2 s later: its flush goes first (the chunk waits
    // up to 7 s).
    due_sensor(&mut w, 1);
    pass(&mut w, 2_000);
    let Some(Action::Write(batch)) = next(&mut w) else {
        panic!("the due flush before the next chunk");
    };
    flush(&mut w, batch);
    // Nothing else due: the next chunk at once, of the same run.
    let Some(Action::Seal {
        now_ms,
        first: false,
        ..
    }) = next(&mut w)
    else {
        panic!("the next chunk");
    };
    assert_eq!(now_ms, at);
    pass(&mut w, 1_000);
    w.core.sealed(w.now, at, Some(at - 5_000), true);
    // Flushes keep falling due; once the chunk waited 7 s, it goes first.
    due_sensor(&mut w, 2);
    pass(&mut w, 7_000);
    let Some(Action::Seal {
        now_ms,
        first: false,
        ..
    }) = next(&mut w)
    else {
        panic!("the chunk's turn");
    };
    assert_eq!(now_ms, at);
    w.core.sealed(w.now, at, Some(at - 5_000), false);
    let Some(Action::Write(batch)) = next(&mut w) else {
        panic!("then the flush");
    };
    flush(&mut w, batch);
    assert!(next(&mut w).is_none(), "the run is over");
    assert_eq!(w.db.stored.len(), 2);
}
