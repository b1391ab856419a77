//! What memory holds per sensor: its pending samples (compact, in LSN
//! order), what palletd knows of its open buckets, when its oldest pending
//! sample arrived, and whether its samples may already be in MongoDB.
//! Sans-IO.
//!
//! # When a sensor is due
//! Like a partitioned batcher with a batch and a timer per key: a sensor is
//! *ready* once its samples fill its open bucket (by count or bytes) or
//! span three windows or more (history: waiting fills nothing), and
//! *due* once its oldest pending sample has waited the delay
//! (`flush.max_delay`, stretched by the flush policy when the database
//! cannot keep up: [`Pending::set_delay_ms`]). Each time a sensor's queue
//! goes from empty to holding something, its arrival joins a FIFO (every
//! sensor waits the same delay, so the FIFO is in deadline order whatever
//! the delay is now; a sensor due at once goes to the front); an entry
//! whose sensor was flushed meanwhile is stale and skipped. Under memory
//! pressure the oldest sensors go first.
//!
//! # Uncertain samples
//! A sample is *uncertain* when it may already be in MongoDB: it was read
//! back from below [`Pending::uncertain_below`] (spooled by an earlier run,
//! or read again after memory let it go), or it was sent in a write whose
//! result is unknown. Uncertain samples are always the first ones of their
//! sensor's queue (samples arrive in LSN order, and unknown ones go back to
//! the front), so a count says which.
//!
//! # Order
//! A sensor's queue is in LSN order, and every sample of the sensor read
//! between two of its samples that is not in MongoDB yet is in the queue
//! between them: a flush takes the whole queue, and what comes back goes
//! back to the front. That is what lets a statement name its samples by
//! their first and last LSN ([`crate::bucket`]).
//!
//! # Bounded bookkeeping
//! Sensors live in a slab indexed by a small id. A sensor with nothing
//! pending and nothing remembered of open buckets is forgotten
//! ([`Pending::forget_before`]), so 100,000 sensors that were active once
//! do not each keep memory for ever.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use crate::bucket::{Fills, SampleRef, Samples, Shape};
use crate::handoff::Run;

/// A sensor's index in the slab.
pub(crate) type SensorId = u32;

/// When a sensor's pending samples began to wait: it is due the delay
/// later, or then if `at_once`.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    since_ms: i64,
    id: SensorId,
    episode: u64,
    at_once: bool,
}

#[derive(Debug)]
struct SensorState {
    name: Box<str>,
    samples: Samples,
    /// The episode of the current pending samples (unique across sensors).
    episode: u64,
    /// The first `uncertain` samples may already be in MongoDB.
    uncertain: usize,
    /// When the oldest pending sample arrived (ms); while in flight, when
    /// the oldest taken one did (it comes back if the write fails).
    since_ms: i64,
    taken_since_ms: i64,
    fills: Fills,
    ready: bool,
    /// Its samples are out in a write.
    in_flight: bool,
    /// Only the front of its queue went out: the rest is due at once when
    /// the write is back.
    rest_left: bool,
    /// How many samples and bytes it held when last taken: the room to
    /// reserve when it starts holding again (no growing copy by copy).
    last_taken: (u32, u32),
}

/// Every sensor's pending samples.
#[derive(Debug)]
pub struct Pending {
    shape: Shape,
    /// Samples read with a lower LSN may already be in MongoDB.
    uncertain_below: u64,
    /// Samples that are uncertain when pushed, whatever their LSN.
    uncertain_lsns: HashSet<u64>,
    /// Whether sensors fall due by age and fill (the live lane); the
    /// backlog is taken oldest first ([`Pending::oldest`]) instead.
    timed: bool,
    /// How long a sensor's oldest sample waits before it is due.
    delay_ms: i64,
    /// A sensor due within this long is taken already (the flush policy's
    /// tick: the next flush may be a tick away).
    early_ms: i64,
    names: HashMap<Box<str>, SensorId>,
    slots: Vec<Option<SensorState>>,
    free: Vec<SensorId>,
    /// In the order the episodes began (those due at once in front).
    deadlines: VecDeque<Deadline>,
    /// The longest a sensor [`Pending::due`] took had waited past its
    /// deadline, since [`Pending::take_lateness`].
    late_ms: i64,
    /// (first pending LSN, sensor): the lowest LSN memory needs.
    firsts: BTreeSet<(u64, SensorId)>,
    ready: Vec<SensorId>,
    episodes: u64,
    count: usize,
    bytes: usize,
}

impl Pending {
    pub fn new(shape: Shape, uncertain_below: u64, delay_ms: i64) -> Pending {
        Pending {
            shape,
            uncertain_below,
            uncertain_lsns: HashSet::new(),
            timed: true,
            delay_ms,
            early_ms: 0,
            names: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            deadlines: VecDeque::new(),
            late_ms: 0,
            firsts: BTreeSet::new(),
            ready: Vec::new(),
            episodes: 0,
            count: 0,
            bytes: 0,
        }
    }

    /// Memory for a backlog: no deadlines, taken oldest first.
    pub(crate) fn untimed(mut self) -> Pending {
        self.timed = false;
        self
    }

    /// From now on a sensor is due once its oldest sample waited `ms`
    /// (those pending too).
    pub(crate) fn set_delay_ms(&mut self, ms: i64) {
        self.delay_ms = ms;
    }

    /// From now on a flush takes the sensors due within `ms` too, so no
    /// sensor waits past its deadline for the next flush a tick later.
    pub(crate) fn set_early_ms(&mut self, ms: i64) {
        self.early_ms = ms;
    }

    /// The longest a sensor taken by [`Pending::due`] had waited past its
    /// deadline since the last call (0 if none was late).
    pub(crate) fn take_lateness(&mut self) -> i64 {
        std::mem::take(&mut self.late_ms)
    }

    fn due_ms(&self, d: &Deadline) -> i64 {
        if d.at_once {
            d.since_ms
        } else {
            d.since_ms.saturating_add(self.delay_ms)
        }
    }

    /// Samples read from now on with an LSN below `lsn` may already be in
    /// MongoDB (memory let them go after some were written).
    #[cfg(test)]
    pub(crate) fn raise_uncertain_below(&mut self, lsn: u64) {
        self.uncertain_below = self.uncertain_below.max(lsn);
    }

    /// These samples, when pushed, are uncertain (with everything before
    /// them in their sensor's queue, so uncertain samples stay a prefix).
    pub(crate) fn mark_uncertain(&mut self, lsns: impl IntoIterator<Item = u64>) {
        self.uncertain_lsns.extend(lsns);
    }

    /// The LSNs held, and those of them that are uncertain.
    pub(crate) fn held_lsns(&self) -> (HashSet<u64>, Vec<u64>) {
        let mut held = HashSet::with_capacity(self.count);
        let mut uncertain = Vec::new();
        for s in self.slots.iter().flatten() {
            for (i, (lsn, _)) in s.samples.keys().enumerate() {
                held.insert(lsn);
                if i < s.uncertain {
                    uncertain.push(lsn);
                }
            }
        }
        (held, uncertain)
    }

    /// Samples held.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Document bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of sensors held in memory.
    #[cfg(test)]
    pub(crate) fn sensors(&self) -> usize {
        self.names.len()
    }

    fn state(&self, id: SensorId) -> Option<&SensorState> {
        self.slots.get(id as usize).and_then(|s| s.as_ref())
    }

    fn state_mut(&mut self, id: SensorId) -> Option<&mut SensorState> {
        self.slots.get_mut(id as usize).and_then(|s| s.as_mut())
    }

    /// The id of `sensor`, made if it is new.
    fn id(&mut self, sensor: &str) -> SensorId {
        if let Some(id) = self.names.get(sensor) {
            return *id;
        }
        let name: Box<str> = sensor.into();
        let state = SensorState {
            name: name.clone(),
            samples: Samples::new(),
            episode: 0,
            uncertain: 0,
            since_ms: 0,
            taken_since_ms: 0,
            fills: Fills::new(),
            ready: false,
            in_flight: false,
            rest_left: false,
            last_taken: (0, 0),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(state);
                id
            }
            None => {
                self.slots.push(Some(state));
                (self.slots.len() - 1) as SensorId
            }
        };
        self.names.insert(name, id);
        id
    }

    /// The name of a sensor.
    pub(crate) fn name(&self, id: SensorId) -> &str {
        self.state(id).map_or("", |s| &s.name)
    }

    /// Adds a sample that arrived at `now_ms` to its sensor's queue; it
    /// comes after every sample of the sensor already read.
    pub fn push(&mut self, sensor: &str, sample: SampleRef<'_>, now_ms: i64) {
        let id = self.id(sensor);
        let uncertain = sample.lsn < self.uncertain_below
            || (!self.uncertain_lsns.is_empty() && self.uncertain_lsns.remove(&sample.lsn));
        let Some(s) = self.state_mut(id) else {
            return;
        };
        let starts = s.samples.is_empty();
        if starts {
            s.samples
                .reserve(s.last_taken.0 as usize, s.last_taken.1 as usize);
            s.since_ms = now_ms;
        }
        s.samples.push(sample);
        if uncertain {
            // Uncertain samples stay a prefix of the queue.
            s.uncertain = s.samples.len();
        }
        self.count += 1;
        self.bytes += sample.doc.as_bytes().len();
        if starts {
            self.begin_episode(id, now_ms, false);
        }
        self.update_ready(id);
    }

    /// The sensor's queue began to hold something at `since_ms`: its
    /// deadline joins the FIFO (at the front and due then, `at_once`), its
    /// first LSN the set.
    fn begin_episode(&mut self, id: SensorId, since_ms: i64, at_once: bool) {
        self.episodes += 1;
        let episode = self.episodes;
        let timed = self.timed;
        let Some(s) = self.state_mut(id) else {
            return;
        };
        s.episode = episode;
        let first = s.samples.first().map(|x| x.lsn);
        if let Some(first) = first {
            self.firsts.insert((first, id));
        }
        if !timed {
            return;
        }
        let d = Deadline {
            since_ms,
            id,
            episode,
            at_once,
        };
        if at_once {
            self.deadlines.push_front(d);
        } else {
            self.deadlines.push_back(d);
        }
    }

    /// A sensor is ready once its samples can fill its open bucket; when
    /// that bucket has little room left ([`crate::bucket::Shape::little_room`]:
    /// its run will go whole to the next), once they fill a new one.
    fn update_ready(&mut self, id: SensorId) {
        if !self.timed {
            return;
        }
        let shape = self.shape;
        let Some(s) = self.state_mut(id) else {
            return;
        };
        let Some(last) = s.samples.last() else {
            return;
        };
        if s.ready {
            return;
        }
        let start = shape.window_start(last.ts_ms);
        let fill = s.fills.get(&start).copied().unwrap_or_default();
        let count = if shape.little_room(fill.count) {
            0
        } else {
            fill.count
        };
        let full = count as usize + s.samples.len() >= shape.max_samples as usize
            || fill.bytes as usize + s.samples.bytes() >= shape.max_bytes as usize;
        // Samples of three windows or more (history arriving, not a live
        // sensor crossing into the next window): the statements of the
        // older ones gain nothing by waiting.
        let spans = s
            .samples
            .first()
            .is_some_and(|f| shape.window_start(f.ts_ms) + shape.window_ms < start);
        if full || spans {
            s.ready = true;
            self.ready.push(id);
        }
    }

    /// The sensors a flush at `now_ms` takes, at most `max` of them: the
    /// ready ones, those whose oldest sample waited long enough (or will
    /// within [`Pending::set_early_ms`]), and, under
    /// `pressure`, the oldest others until half of memory is taken. Stale
    /// deadlines are dropped; due sensors beyond `max` wait for the next.
    pub(crate) fn due(&mut self, now_ms: i64, pressure: bool, max: usize) -> Vec<SensorId> {
        let mut ready: Vec<SensorId> = std::mem::take(&mut self.ready)
            .into_iter()
            .filter(|id| {
                self.state(*id)
                    .is_some_and(|s| s.ready && !s.samples.is_empty())
            })
            .collect();
        if ready.len() > max {
            self.ready = ready.split_off(max);
        }
        let mut out = ready;
        let mut chosen: HashSet<SensorId> = out.iter().copied().collect();
        let mut taken: usize = out
            .iter()
            .filter_map(|id| self.state(*id))
            .map(|s| s.samples.len())
            .sum();
        while out.len() < max {
            let Some(&d) = self.deadlines.front() else {
                break;
            };
            let id = d.id;
            let live = self
                .state(id)
                .is_some_and(|s| s.episode == d.episode && !s.samples.is_empty());
            if !live {
                self.deadlines.pop_front();
                continue;
            }
            let due = self.due_ms(&d);
            if due > now_ms + self.early_ms && !(pressure && taken * 2 < self.count) {
                break;
            }
            if !d.at_once {
                self.late_ms = self.late_ms.max(now_ms - due);
            }
            self.deadlines.pop_front();
            if chosen.insert(id) {
                taken += self.state(id).map_or(0, |s| s.samples.len());
                out.push(id);
            }
        }
        out
    }

    /// Whether a flush at `now_ms` may find a sensor due (a cheap look that
    /// may say yes for a deadline that turns out stale).
    pub(crate) fn may_be_due(&self, now_ms: i64) -> bool {
        !self.ready.is_empty()
            || self
                .deadlines
                .front()
                .is_some_and(|d| self.due_ms(d) <= now_ms + self.early_ms)
    }

    /// When the oldest pending sensor may be taken (it may be stale): its
    /// deadline, less the early margin.
    pub(crate) fn next_due_ms(&self) -> Option<i64> {
        (self.deadlines.front()).map(|d| self.due_ms(d).saturating_sub(self.early_ms))
    }

    /// Every sensor with pending samples.
    pub fn all(&self) -> Vec<SensorId> {
        self.names
            .values()
            .copied()
            .filter(|id| self.state(*id).is_some_and(|s| !s.samples.is_empty()))
            .collect()
    }

    /// The sensors holding a sample of a window that ends at or before
    /// `cutoff_ms` (the closer is about to seal it).
    pub(crate) fn holding_windows_ending_by(&self, cutoff_ms: i64) -> Vec<SensorId> {
        let window = self.shape.window_ms;
        self.names
            .values()
            .copied()
            .filter(|id| {
                self.state(*id).is_some_and(|s| {
                    s.samples
                        .keys()
                        .any(|(_, ts)| self.shape.window_start(ts) + window <= cutoff_ms)
                })
            })
            .collect()
    }

    /// (lsn, ts) of the uncertain samples of a sensor.
    pub(crate) fn uncertain(&self, id: SensorId) -> Vec<(u64, i64)> {
        self.state(id)
            .map_or_else(Vec::new, |s| s.samples.keys().take(s.uncertain).collect())
    }

    /// Settles the uncertain samples of a sensor: those in `applied` are in
    /// MongoDB and leave memory; the others are certainly not. Returns how
    /// many left.
    pub(crate) fn resolve(&mut self, id: SensorId, applied: &HashSet<u64>) -> usize {
        let Some(s) = self.state_mut(id) else {
            return 0;
        };
        let n = s.uncertain;
        let first_before = s.samples.first().map(|x| x.lsn);
        let (count, bytes) = (s.samples.len(), s.samples.bytes());
        let mut i = 0;
        s.samples.retain(|x| {
            i += 1;
            !(i <= n && applied.contains(&x.lsn))
        });
        s.uncertain = 0;
        let dropped = count - s.samples.len();
        let bytes = bytes - s.samples.bytes();
        let first_after = s.samples.first().map(|x| x.lsn);
        self.count -= dropped;
        self.bytes -= bytes;
        if first_before != first_after {
            if let Some(f) = first_before {
                self.firsts.remove(&(f, id));
            }
            if let Some(f) = first_after {
                self.firsts.insert((f, id));
            }
        }
        dropped
    }

    /// Takes the samples and open-bucket memory of `ids` for a flush. They
    /// must hold no uncertain samples.
    pub fn take(&mut self, ids: &[SensorId]) -> Vec<Run> {
        self.take_within(ids, usize::MAX).0
    }

    /// [`Pending::take`] of what makes at most `max_statements` statements
    /// ([`Samples::front_within`]; at least one sensor's first): a sensor
    /// with more is taken from the front (its queue stays in LSN order,
    /// the rest after what was taken, due at once when the write is back),
    /// and sensors after it are left due at once. Returns whether anything
    /// was left.
    pub(crate) fn take_within(
        &mut self,
        ids: &[SensorId],
        max_statements: usize,
    ) -> (Vec<Run>, bool) {
        let mut runs = Vec::with_capacity(ids.len());
        let mut budget = max_statements;
        let mut left = false;
        for &id in ids {
            let shape = self.shape;
            let Some(s) = self.slots.get_mut(id as usize).and_then(|s| s.as_mut()) else {
                continue;
            };
            if s.samples.is_empty() {
                continue;
            }
            if budget == 0 {
                // Due at once, in the next flush.
                left = true;
                let episode = s.episode;
                if self.timed {
                    self.deadlines.push_front(Deadline {
                        since_ms: i64::MIN,
                        id,
                        episode,
                        at_once: true,
                    });
                }
                continue;
            }
            debug_assert_eq!(s.uncertain, 0, "resolved before the write");
            let (n, statements) = s.samples.front_within(&shape, budget);
            budget = budget.saturating_sub(statements);
            if let Some(first) = s.samples.first() {
                self.firsts.remove(&(first.lsn, id));
            }
            let samples = s.samples.split_front(n);
            if let Some(first) = s.samples.first() {
                left = true;
                s.rest_left = true;
                self.firsts.insert((first.lsn, id));
            }
            self.count -= samples.len();
            self.bytes -= samples.bytes();
            s.last_taken = (samples.len() as u32, samples.bytes() as u32);
            s.taken_since_ms = s.since_ms;
            s.ready = false;
            s.in_flight = true;
            runs.push(Run {
                sensor: s.name.to_string(),
                samples,
                fills: std::mem::take(&mut s.fills),
                outcomes: Vec::new(),
            });
        }
        (runs, left)
    }

    /// Returns a run after its write: `back` are its samples that are not
    /// in MongoDB for sure (unknown or not sent), in LSN order, the first
    /// `uncertain` of them of unknown fate. They go before what arrived
    /// meanwhile, and are due at once.
    pub(crate) fn put_back(&mut self, run: Run, back: Samples, uncertain: usize, now_ms: i64) {
        let id = self.id(&run.sensor);
        let Some(s) = self.slots.get_mut(id as usize).and_then(|s| s.as_mut()) else {
            return;
        };
        s.in_flight = false;
        s.fills = run.fills;
        let rest_left = std::mem::take(&mut s.rest_left);
        if back.is_empty() {
            if rest_left && !s.samples.is_empty() {
                // The rest of a queue taken in part: due at once.
                let since = s.since_ms;
                self.begin_episode(id, since, true);
            }
            self.update_ready(id);
            return;
        }
        s.since_ms = s.taken_since_ms;
        if let Some(first) = s.samples.first() {
            self.firsts.remove(&(first.lsn, id));
        }
        let arrived = std::mem::replace(&mut s.samples, back);
        let newer_uncertain = s.uncertain;
        let returned = s.samples.len();
        s.uncertain = if newer_uncertain > 0 {
            returned + newer_uncertain
        } else {
            uncertain
        };
        self.count += returned;
        self.bytes += s.samples.bytes();
        s.samples.append(&arrived);
        self.begin_episode(id, now_ms, true);
        self.update_ready(id);
    }

    /// The lowest LSN held, if any.
    pub(crate) fn min_lsn(&self) -> Option<u64> {
        self.firsts.first().map(|f| f.0)
    }

    /// When the sensor holding the lowest LSN began to hold it (about the
    /// arrival of the oldest sample held).
    pub(crate) fn oldest_since_ms(&self) -> Option<i64> {
        let (_, id) = self.firsts.first()?;
        self.state(*id).map(|s| s.since_ms)
    }

    /// The smallest timestamp held (ms), if any (a scan: for the closer).
    pub(crate) fn min_ts(&self) -> Option<i64> {
        self.slots
            .iter()
            .flatten()
            .flat_map(|s| s.samples.keys().map(|k| k.1))
            .min()
    }

    /// The sensors holding the lowest LSNs, oldest first, until they hold
    /// `max_samples` (at least one sensor) or `max_sensors` of them.
    pub(crate) fn oldest(&self, max_sensors: usize, max_samples: usize) -> Vec<SensorId> {
        let mut out = Vec::new();
        let mut taken = 0;
        for &(_, id) in &self.firsts {
            if out.len() >= max_sensors || (taken >= max_samples && !out.is_empty()) {
                break;
            }
            taken += self.state(id).map_or(0, |s| s.samples.len());
            out.push(id);
        }
        out
    }

    /// Lets go of every pending sample (none may be in flight); what
    /// palletd knows of open buckets stays. Returns how many were held.
    pub(crate) fn evict(&mut self) -> usize {
        let n = self.count;
        for s in self.slots.iter_mut().flatten() {
            debug_assert!(!s.in_flight, "nothing in flight");
            s.samples = Samples::new();
            s.uncertain = 0;
            s.ready = false;
        }
        self.deadlines.clear();
        self.firsts.clear();
        self.ready.clear();
        self.count = 0;
        self.bytes = 0;
        n
    }

    /// Forgets open-bucket memory of windows that started before `start_ms`
    /// and drops sensors with nothing pending, nothing remembered and
    /// nothing in flight, so memory follows the sensors that are active.
    pub(crate) fn forget_before(&mut self, start_ms: i64) {
        let mut gone = Vec::new();
        for (id, slot) in self.slots.iter_mut().enumerate() {
            let Some(s) = slot else { continue };
            s.fills.retain(|w, _| *w >= start_ms);
            if s.samples.is_empty() && s.fills.is_empty() && !s.in_flight {
                gone.push((id as SensorId, s.name.clone()));
                *slot = None;
            }
        }
        for (id, name) in gone {
            self.names.remove(&name);
            self.free.push(id);
        }
        if self.names.is_empty() {
            // Nothing left: give the slab back too.
            self.slots = Vec::new();
            self.free = Vec::new();
        }
        self.deadlines.shrink_to_fit();
    }
}

impl Pending {
    /// Checks the bookkeeping against what is held (tests).
    #[cfg(test)]
    pub(crate) fn check(&self, flushing: &[SensorId]) {
        let states: Vec<&SensorState> = self.slots.iter().flatten().collect();
        assert_eq!(states.len(), self.names.len(), "one name per sensor");
        assert_eq!(
            self.count,
            states.iter().map(|s| s.samples.len()).sum::<usize>(),
            "count"
        );
        assert_eq!(
            self.bytes,
            states.iter().map(|s| s.samples.bytes()).sum::<usize>(),
            "bytes"
        );
        let firsts: BTreeSet<(u64, SensorId)> = self
            .names
            .values()
            .filter_map(|id| Some((self.state(*id)?.samples.first()?.lsn, *id)))
            .collect();
        assert_eq!(firsts, self.firsts, "first LSNs");
        for s in &states {
            assert!(s.uncertain <= s.samples.len());
            let id = self.names[&s.name];
            if self.timed && !s.samples.is_empty() && !flushing.contains(&id) {
                let live = self.deadlines.iter().any(|d| d.episode == s.episode);
                let ready = self
                    .ready
                    .iter()
                    .any(|id| self.state(*id).is_some_and(|x| x.episode == s.episode));
                assert!(live || ready || s.ready, "{} has a deadline", s.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::Sample;
    use crate::decode::{FieldValue, Reading};

    const SHAPE: Shape = Shape {
        window_ms: 60_000,
        max_samples: 3,
        max_bytes: 1000,
    };

    fn sample(ts_ms: i64, lsn: u64) -> Sample {
        Sample::encode(
            &Reading {
                sensor: "s".into(),
                ts_ms,
                fields: vec![("v".into(), FieldValue::Num(1.0))],
                ..Reading::default()
            },
            lsn,
        )
    }

    fn names(p: &Pending, ids: &[SensorId]) -> Vec<String> {
        let mut v: Vec<String> = ids.iter().map(|id| p.name(*id).to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_sensor_is_due_when_it_fills_its_bucket_or_its_oldest_sample_waited() {
        let mut p = Pending::new(SHAPE, 0, 1000);
        p.push("a", sample(0, 1).as_ref(), 0);
        p.push("b", sample(0, 2).as_ref(), 100);
        p.push("a", sample(1, 3).as_ref(), 200);
        assert!(
            p.due(900, false, usize::MAX).is_empty(),
            "nothing full, nothing old"
        );
        p.push("a", sample(2, 4).as_ref(), 300);
        let due = p.due(900, false, usize::MAX);
        assert_eq!(names(&p, &due), vec!["a"], "a fills its bucket");
        let runs = p.take(&due);
        assert_eq!(runs[0].samples.len(), 3);
        assert_eq!(p.count(), 1);
        assert!(
            p.due(1099, false, usize::MAX).is_empty(),
            "a's deadline went with it"
        );
        let due = p.due(1100, false, usize::MAX);
        assert_eq!(names(&p, &due), vec!["b"], "b's oldest waited 1 s");
    }

    /// A delay set later counts for the sensors already waiting, stretched
    /// or shrunk, in their order of arrival; a sensor taken past its
    /// deadline reports how late it was.
    #[test]
    fn a_new_delay_counts_for_the_sensors_already_waiting() {
        let mut p = Pending::new(SHAPE, 0, 1000);
        p.push("a", sample(0, 1).as_ref(), 0);
        p.push("b", sample(0, 2).as_ref(), 500);
        p.set_delay_ms(3000);
        assert!(p.due(2000, false, usize::MAX).is_empty(), "stretched");
        assert_eq!(p.next_due_ms(), Some(3000));
        let due = p.due(3200, false, usize::MAX);
        assert_eq!(names(&p, &due), vec!["a"]);
        assert_eq!(p.take_lateness(), 200);
        assert_eq!(p.take_lateness(), 0, "taken");
        p.set_delay_ms(100);
        assert!(p.may_be_due(3200), "shrunk: b is overdue");
        let due = p.due(3200, false, usize::MAX);
        assert_eq!(names(&p, &due), vec!["b"]);
        assert_eq!(p.take_lateness(), 2600);
    }

    /// With an early margin a sensor due within it is taken, none past it.
    #[test]
    fn a_sensor_due_within_the_early_margin_is_taken() {
        let mut p = Pending::new(SHAPE, 0, 1000);
        p.set_early_ms(100);
        p.push("a", sample(0, 1).as_ref(), 0);
        p.push("b", sample(0, 2).as_ref(), 50);
        assert_eq!(p.next_due_ms(), Some(900));
        assert!(!p.may_be_due(899));
        let due = p.due(920, false, usize::MAX);
        assert_eq!(names(&p, &due), vec!["a"], "b is due at 1050");
        assert_eq!(p.take_lateness(), 0, "taken before its deadline");
    }

    /// History arriving: samples of three windows make the sensor ready at
    /// once; a live sensor crossing into the next window (two) waits.
    #[test]
    fn a_sensor_holding_three_windows_is_ready_at_once() {
        let minute = SHAPE.window_ms;
        let mut p = Pending::new(SHAPE, 0, 1000);
        p.push("live", sample(minute - 1, 1).as_ref(), 0);
        p.push("live", sample(minute, 2).as_ref(), 0);
        p.push("history", sample(0, 3).as_ref(), 0);
        p.push("history", sample(2 * minute, 4).as_ref(), 0);
        let due = p.due(10, false, usize::MAX);
        assert_eq!(names(&p, &due), vec!["history"]);
    }

    #[test]
    fn a_flush_takes_at_most_so_many_sensors_and_the_rest_wait_their_turn() {
        let mut p = Pending::new(SHAPE, 0, 1000);
        for i in 0..5u64 {
            p.push(&format!("s{i}"), sample(0, i + 1).as_ref(), i as i64);
        }
        let first = p.due(2000, false, 2);
        assert_eq!(names(&p, &first), vec!["s0", "s1"], "the oldest first");
        p.take(&first);
        let second = p.due(2000, false, 2);
        assert_eq!(names(&p, &second), vec!["s2", "s3"]);
    }

    #[test]
    fn under_pressure_the_oldest_go_first_until_half_is_taken() {
        let mut p = Pending::new(SHAPE, 0, 10_000);
        for (i, sensor) in ["a", "b", "c", "d"].iter().enumerate() {
            p.push(sensor, sample(0, i as u64 + 1).as_ref(), i as i64);
        }
        assert!(p.due(10, false, usize::MAX).is_empty());
        let due = p.due(10, true, usize::MAX);
        assert_eq!(names(&p, &due), vec!["a", "b"]);
        assert_eq!(p.min_lsn(), Some(1));
    }

    #[test]
    fn samples_read_from_below_the_mark_are_uncertain_until_resolved() {
        let mut p = Pending::new(SHAPE, 100, 1000);
        p.push("a", sample(0, 10).as_ref(), 0);
        p.push("a", sample(0, 11).as_ref(), 0);
        let a = p.names["a"];
        assert_eq!(p.uncertain(a), vec![(10, 0), (11, 0)]);
        let dropped = p.resolve(a, &[10].into_iter().collect());
        assert_eq!(dropped, 1);
        assert!(p.uncertain(a).is_empty());
        assert_eq!(p.min_lsn(), Some(11));
        p.push("a", sample(0, 12).as_ref(), 0);
        assert_eq!(
            p.uncertain(a),
            vec![(11, 0), (12, 0)],
            "read later, still below (and uncertain ones stay a prefix)"
        );
        p.push("a", sample(0, 150).as_ref(), 0);
        assert_eq!(p.uncertain(a).len(), 2, "this run's is certain");
        p.raise_uncertain_below(200);
        p.push("b", sample(0, 160).as_ref(), 0);
        assert_eq!(p.uncertain(p.names["b"]), vec![(160, 0)], "read again");
        assert_eq!(p.count(), 4);
    }

    #[test]
    fn evicting_lets_go_of_the_samples_and_keeps_the_open_buckets() {
        let mut p = Pending::new(SHAPE, 0, 1000);
        p.push("a", sample(0, 1).as_ref(), 0);
        p.push("b", sample(0, 2).as_ref(), 50);
        p.push("a", sample(1, 3).as_ref(), 60);
        assert_eq!(p.oldest_since_ms(), Some(0));
        let a = p.names["a"];
        assert_eq!(
            p.oldest(10, 1),
            vec![a],
            "the lowest LSN first, one sensor at least"
        );
        assert_eq!(p.oldest(10, 100).len(), 2);
        assert_eq!(p.evict(), 3);
        assert_eq!((p.count(), p.bytes(), p.min_lsn()), (0, 0, None));
        assert!(p.due(i64::MAX, true, usize::MAX).is_empty());
        p.check(&[]);
        p.push("a", sample(2, 4).as_ref(), 70);
        assert_eq!(p.oldest_since_ms(), Some(70));
        p.check(&[]);
    }

    #[test]
    fn unknown_samples_go_back_to_the_front_as_uncertain_and_due() {
        let mut p = Pending::new(SHAPE, 0, 1000);
        p.push("a", sample(0, 1).as_ref(), 0);
        p.push("a", sample(0, 2).as_ref(), 0);
        let a = p.names["a"];
        let mut run = p.take(&[a]).remove(0);
        p.push("a", sample(0, 3).as_ref(), 50);
        let back = std::mem::take(&mut run.samples);
        p.put_back(run, back, 2, 100);
        assert_eq!(p.uncertain(a), vec![(1, 0), (2, 0)]);
        assert_eq!(p.min_lsn(), Some(1));
        assert_eq!(p.count(), 3);
        let due = p.due(100, false, usize::MAX);
        assert_eq!(names(&p, &due), vec!["a"], "due at once");
        p.forget_before(i64::MAX);
        assert_eq!(p.sensors(), 1, "a sensor with samples stays");
    }

    #[test]
    fn idle_sensors_are_forgotten_and_their_ids_reused() {
        let mut p = Pending::new(SHAPE, 0, 1000);
        for i in 0..100u64 {
            p.push(&format!("s{i}"), sample(0, i + 1).as_ref(), 0);
        }
        let all = p.all();
        for mut run in p.take(&all) {
            let samples = std::mem::take(&mut run.samples);
            assert_eq!(samples.len(), 1);
            p.put_back(run, Samples::new(), 0, 0);
        }
        assert_eq!(p.sensors(), 100);
        p.forget_before(i64::MAX);
        assert_eq!(p.sensors(), 0, "nothing pending, nothing remembered");
        p.push("new", sample(0, 500).as_ref(), 0);
        assert_eq!(p.sensors(), 1);
        assert_eq!(p.count(), 1);
    }

    #[test]
    fn the_closer_learns_which_sensors_hold_a_window_it_is_about_to_seal() {
        let mut p = Pending::new(SHAPE, 0, 1000);
        p.push("old", sample(0, 1).as_ref(), 0);
        p.push("new", sample(60_000, 2).as_ref(), 0);
        assert_eq!(names(&p, &p.holding_windows_ending_by(60_000)), vec!["old"]);
        assert!(p.holding_windows_ending_by(59_999).is_empty());
    }
}
