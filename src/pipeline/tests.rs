//! The pipeline core against a model of the spool and of each storage mode,
//! driven by arbitrary sequences of records, flush outcomes (success,
//! permanent rejection, ambiguous error, not sent), crashes and restarts.
//!
//! The model store behaves like the real one: the bucket mode applies a
//! flush as one ordered command (a prefix per sensor) and resolves with the
//! highest applied LSN per sensor; the time series mode applies any subset
//! of an interrupted insert and resolves LSN by LSN. A sample whose value is
//! negative is refused for good by the database, every time it is sent.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::core::{Action, Config, Core};
use crate::bucket::{Sample, SampleRef, Shape};
use crate::decode::{FieldValue, Reading};
use crate::flush::{Batch, Outcome, Resolution, Resolve, Written};
use crate::spool::{Entry, Record};
use crate::spooler::Feed;

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
    /// again from the checkpoint.
    Restart,
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
        ].prop_map(Step::Next),
        4 => (1u8..6).prop_map(Step::Run),
        1 => Just(Step::Restart),
    ]
}

/// The spool, the database and the pipeline core of one process.
struct World {
    mode: Mode,
    /// Every record appended, in LSN order.
    log: Vec<Record>,
    next_lsn: u64,
    durable: u64,
    checkpoint: u64,
    /// LSN -> how many times stored; applied LSNs per sensor in order.
    stored: HashMap<u64, usize>,
    applied: HashMap<String, Vec<u64>>,
    dead: HashSet<u64>,
    fate: Fate,
    max_pending: usize,
    core: Core,
    t0: Instant,
    now: Instant,
    now_ms: i64,
    /// Records appended since the last sync, with whether each was offered.
    unsynced: Vec<(usize, bool)>,
}

fn config(mode: Mode, from: u64, fresh_from: u64, max_pending: usize) -> Config {
    Config {
        shape: SHAPE,
        tag: 1,
        max_pending,
        max_lateness_ms: 3_600_000,
        max_delay: Duration::from_secs(1),
        seal_every: Duration::from_secs(60),
        seal_grace_ms: (mode == Mode::Buckets).then_some(5_000),
        from,
        fresh_from,
    }
}

fn sample(lsn: u64, ts_ms: i64, value: i8) -> Sample {
    Sample::encode(
        &Reading {
            sensor: String::new(),
            ts_ms,
            fields: vec![("v".into(), FieldValue::Num(value as f64))],
        },
        lsn,
    )
}

fn poisoned(s: SampleRef<'_>) -> bool {
    s.nums().any(|(_, v)| v < 0.0)
}

impl World {
    fn new(mode: Mode, max_pending: usize) -> World {
        let t0 = Instant::now();
        World {
            mode,
            log: Vec::new(),
            next_lsn: 1000,
            durable: 1000,
            checkpoint: 1000,
            stored: HashMap::new(),
            applied: HashMap::new(),
            dead: HashSet::new(),
            fate: Fate::Fine,
            max_pending,
            core: Core::new(config(mode, 1000, 1000, max_pending), t0),
            t0,
            now: t0,
            now_ms: 1_800_000_000_000,
            unsynced: Vec::new(),
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

    /// The spooler offers what it appended once it is appended (before it
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
            Step::DeadLetter { offered } => self.append(
                Entry::DeadLetter {
                    doc: bson::to_vec(&bson::doc! {}).unwrap(),
                },
                *offered,
            ),
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
            Step::Restart => self.restart(),
        }
        Ok(())
    }

    /// A crash: memory is gone; what was appended is durable (what was not
    /// would never have been acknowledged). The next run starts from the
    /// checkpoint.
    fn restart(&mut self) {
        self.unsynced.clear();
        self.durable = self.next_lsn;
        // A new run starts its LSNs later (the spool takes the clock).
        self.next_lsn += 100;
        self.core = Core::new(
            config(self.mode, self.checkpoint, self.next_lsn, self.max_pending),
            self.now,
        );
        self.core.set_durable(self.durable);
    }

    /// Carries out one action; false when there was none.
    fn act(&mut self) -> Result<bool, TestCaseError> {
        self.core.check();
        let Some(action) = self.core.poll(self.now, self.now_ms) else {
            return Ok(false);
        };
        match action {
            Action::Checkpoint(lsn) => {
                // Never past a record that is not in the database.
                for rec in self
                    .log
                    .iter()
                    .filter(|r| r.lsn < lsn && r.lsn >= self.checkpoint)
                {
                    let done = match &rec.entry {
                        Entry::Sample { .. } => {
                            self.stored.contains_key(&rec.lsn) || self.dead.contains(&rec.lsn)
                        }
                        Entry::DeadLetter { .. } => self.dead.contains(&rec.lsn),
                        Entry::MessageId { .. } => true,
                    };
                    prop_assert!(
                        done,
                        "checkpoint {} passes LSN {} which is not in the database",
                        lsn,
                        rec.lsn
                    );
                }
                prop_assert!(lsn >= self.checkpoint, "the checkpoint never goes back");
                self.checkpoint = lsn;
            }
            Action::Read { from, max, limit } => {
                prop_assert!(limit <= self.durable);
                let mut bytes = Vec::new();
                let mut n = 0;
                for r in self
                    .log
                    .iter()
                    .filter(|r| r.lsn >= from && r.lsn < limit)
                    .take(max)
                {
                    r.encode_into(&mut bytes);
                    n += 1;
                }
                self.core
                    .records(&bytes, n, max, limit, self.now, self.now_ms);
            }
            Action::Resolve(req) => {
                let r = self.resolve(&req);
                self.core.resolved(r);
            }
            Action::Write(mut batch) => {
                for r in &batch.runs {
                    prop_assert!(
                        r.samples.iter().all(|s| s.lsn < self.durable),
                        "only durable records are written"
                    );
                }
                let fate = std::mem::replace(&mut self.fate, Fate::Fine);
                match self.write(&mut batch, fate) {
                    Some(written) => {
                        self.core.written(batch, written, self.now, self.now_ms);
                    }
                    None => self.restart(),
                }
            }
            Action::Seal { now_ms } => {
                // Nothing held of a window the seal closes (a sample the
                // database refuses never goes into a bucket).
                let held = self.log.iter().filter(|r| r.lsn >= self.checkpoint);
                for r in held.filter(|_| self.mode == Mode::Buckets) {
                    if let Entry::Sample { doc, .. } = &r.entry {
                        let d = bson::RawDocument::from_bytes(doc).unwrap();
                        let sample = SampleRef::from_doc(d, r.lsn).unwrap();
                        let ts = sample.ts_ms;
                        let closed = !poisoned(sample)
                            && SHAPE.window_start(ts) + SHAPE.window_ms <= now_ms - 5_000;
                        prop_assert!(
                            !closed
                                || self.stored.contains_key(&r.lsn)
                                || self.dead.contains(&r.lsn)
                                || r.lsn >= self.core.cursor(),
                            "sealing a window while holding its sample {}",
                            r.lsn
                        );
                    }
                }
                self.core.sealed(self.now, now_ms, Some(now_ms - 5_000));
            }
            Action::Done => return Ok(false),
        }
        Ok(true)
    }

    fn resolve(&self, req: &[Resolve]) -> Resolution {
        let mut out = Resolution::default();
        for r in req {
            match self.mode {
                Mode::Buckets => {
                    let mark = self
                        .applied
                        .get(&r.sensor)
                        .and_then(|a| a.iter().max().copied())
                        .unwrap_or(0);
                    out.applied
                        .extend(r.samples.iter().map(|s| s.0).filter(|l| *l <= mark));
                    out.watermarks.insert(r.sensor.clone(), mark);
                }
                Mode::Timeseries => out.applied.extend(
                    r.samples
                        .iter()
                        .map(|s| s.0)
                        .filter(|l| self.stored.contains_key(l)),
                ),
            }
        }
        out
    }

    fn store(&mut self, sensor: &str, lsn: u64) {
        *self.stored.entry(lsn).or_default() += 1;
        self.applied
            .entry(sensor.to_string())
            .or_default()
            .push(lsn);
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
        for d in &batch.deadletters {
            self.dead.insert(d.0);
        }
        let mut written = Written::default();
        // Statements: one per sample here, in batch order.
        let mut order: Vec<(usize, usize)> = batch
            .runs
            .iter()
            .enumerate()
            .flat_map(|(r, run)| (0..run.samples.len()).map(move |s| (r, s)))
            .collect();
        for run in batch.runs.iter_mut() {
            run.outcomes = vec![Outcome::NotSent; run.samples.len()];
        }
        let mut k = 0;
        while k < order.len() {
            if crash_at.is_some_and(|c| k >= c) {
                return None;
            }
            let (r, s) = order[k];
            let run = &mut batch.runs[r];
            let lsn = run.samples.get(s).lsn;
            let poison = poisoned(run.samples.get(s));
            if let Fate::Ambiguous { at, len, applied } = fate {
                if k >= at {
                    // This command's statements: unknown; a part applied.
                    let end = (at + len).min(order.len());
                    for (j, &(r2, s2)) in order[at..end].iter().enumerate() {
                        let sensor = batch.runs[r2].sensor.clone();
                        let lsn = batch.runs[r2].samples.get(s2).lsn;
                        let took = match self.mode {
                            Mode::Buckets => j < applied,
                            Mode::Timeseries => j % 2 == applied % 2,
                        };
                        let poison = poisoned(batch.runs[r2].samples.get(s2));
                        if took && !poison && (self.mode == Mode::Timeseries || j < applied) {
                            self.store(&sensor, lsn);
                        }
                        batch.runs[r2].outcomes[s2] = Outcome::Unknown;
                        if self.mode == Mode::Buckets && poison && j < applied {
                            // An ordered command stops at its first error.
                            break;
                        }
                    }
                    written.met_errors = true;
                    return Some(written);
                }
            }
            k += 1;
            if poison {
                run.outcomes[s] = Outcome::Rejected("poison".into());
                if self.mode == Mode::Buckets {
                    // As the store does: the sensor's later statements wait
                    // for the next flush.
                    let rest: Vec<(usize, usize)> =
                        order[k..].iter().copied().filter(|o| o.0 != r).collect();
                    order.truncate(k);
                    order.extend(rest);
                }
            } else {
                let sensor = run.sensor.clone();
                run.outcomes[s] = Outcome::Applied;
                self.store(&sensor, lsn);
                written.statements += 1;
            }
        }
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

    /// Every record is in the database exactly once: a sample stored (or,
    /// poisoned, dead-lettered), a dead letter written.
    fn check(&self) -> Result<(), TestCaseError> {
        for rec in &self.log {
            match &rec.entry {
                Entry::Sample { doc, .. } => {
                    let d = bson::RawDocument::from_bytes(doc).unwrap();
                    let s = SampleRef::from_doc(d, rec.lsn).unwrap();
                    if poisoned(s) {
                        prop_assert!(
                            self.dead.contains(&rec.lsn),
                            "poisoned {} dead-lettered",
                            rec.lsn
                        );
                        prop_assert!(!self.stored.contains_key(&rec.lsn));
                    } else {
                        prop_assert_eq!(
                            self.stored.get(&rec.lsn).copied(),
                            Some(1),
                            "sample {} stored once",
                            rec.lsn
                        );
                    }
                }
                Entry::DeadLetter { .. } => prop_assert!(self.dead.contains(&rec.lsn)),
                Entry::MessageId { .. } => {}
            }
        }
        Ok(())
    }
}

fn run(mode: Mode, max_pending: usize, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut w = World::new(mode, max_pending);
    for s in steps {
        w.step(s)?;
    }
    w.drain()?;
    w.check()?;
    let _ = w.t0;
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
}

/// A restart with a backlog larger than memory: one sensor's samples were
/// written far past the checkpoint (another sensor's sample held it back),
/// so the watermark learned from the first replayed batch must settle the
/// sensor's samples in later batches too.
#[test]
fn a_watermark_settles_replayed_samples_read_after_it_was_learned() {
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
    steps.push(Step::Restart);
    for s in &steps {
        w.step(s).unwrap();
    }
    assert_eq!(
        w.stored.len(),
        16,
        "sensor 0 was written past the checkpoint"
    );
    assert_eq!(w.checkpoint, 1000, "held back by sensor 1");
    w.drain().unwrap();
    w.check().unwrap();
}
