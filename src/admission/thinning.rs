//! Thinning at admission: each thinned field of each sensor goes through
//! its rule ([`crate::thin`]) in the order the readings are spooled, and
//! the verdict is written into the reading's spool record
//! ([`crate::bucket::THIN`]). A replay reads the verdicts back, so it
//! stores what the first pass stored, in either lane, after any crash;
//! the summaries and rollups are made from every reading, stored or not.
//!
//! A swinging door's last point of a run is known only when a later
//! point comes: it is spooled then as a record of its own
//! ([`crate::bucket::ARCHIVE`]), and so are the points still held when a
//! field has been silent for its `max_interval` ([`Thinning::sweep`]) and
//! every point held at a clean shutdown ([`Thinning::finish`]).
//!
//! In time series mode there is no bucket to summarise the readings left
//! out: each sensor's values left out are summed up per window
//! ([`LeftOut`]) and spooled as a record of their own
//! ([`crate::bucket::LEFT_OUT`]) when a reading of the sensor comes in
//! another window, when the first of them is the smallest `max_interval`
//! of the sensor's rules old (the sweep), and at a clean shutdown; the
//! rollups add them to the documents' own.
//!
//! After a crash the held points are read back: the spool keeps the
//! record of every point held ([`crate::spool::Spool::hold`], at most a
//! field's `max_interval` old, as the sweep ends silent runs), and
//! `thinning.lsn` in the spool's directory says from where. At start
//! each field's last record tells whether its run ended; the point of one
//! that did not is stored then ([`read_back`]), and every field starts a
//! new run. A reader's line through it is as good as the one the run
//! would have ended with: every point dropped before it was within the
//! bound of the line to it. The values left out since a sensor's last
//! summary of their window are summed up again from the same records
//! (held from the first of them, at most its `max_interval` old) and
//! stored at start.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::bucket::{LeftOut, Sample, SampleRef, Thinned, THIN};
use crate::decode::{FieldValue, Reading};
use crate::record::EntryRef;
use crate::spool::Spool;
use crate::thin::{Field, Point, Rule, DEADBAND, SWINGING_DOOR};

/// One field's state and when a reading of it last came.
#[derive(Debug)]
struct FieldState {
    name: String,
    field: Field,
    received_ms: i64,
    /// The LSN of the record of the point its swinging door holds.
    held_lsn: Option<u64>,
}

/// One sensor's fields, and its values left out not yet spooled.
#[derive(Debug, Default)]
struct SensorState {
    fields: Vec<FieldState>,
    open: Option<Open>,
}

/// One sensor's values left out in one window, since its last summary
/// (time series mode).
#[derive(Debug)]
struct Open {
    window: i64,
    /// The LSN of the first of their records (held in the spool).
    first_lsn: u64,
    /// When it is spooled at the latest: the smallest `max_interval` of
    /// the sensor's rules after its first reading came.
    due_ms: i64,
    sums: LeftOut,
}

impl Open {
    /// (time, summary) to spool: the time is its latest reading's.
    fn take(self) -> (i64, LeftOut) {
        (self.sums.last_ts().unwrap_or(self.window), self.sums)
    }
}

/// The thinning state of every sensor with a thinned field.
#[derive(Debug)]
pub struct Thinning {
    sensors: HashMap<String, SensorState>,
    /// Points received, stored, and taken as they were (out of order
    /// beyond what the rule remembers), per rule kind, since the last
    /// count was taken ([`Thinning::take_counts`]).
    counts: Vec<Counts>,
    /// Time series mode: `bucket.window` in ms; the values left out are
    /// summed up per sensor and window ([`LeftOut`]).
    left_out_window: Option<i64>,
    /// Thinning's share of `limits.max_memory` ([`Thinning::bytes`]).
    max_bytes: usize,
    sensors_ended: u64,
    /// [`Thinning::bytes`] as the last sweep left it.
    swept_bytes: usize,
}

/// What to spool for one sensor besides its readings' records.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Later {
    /// Points stored later than their readings came: by time, each with
    /// the fields whose run ends there.
    pub points: Vec<(i64, Vec<(String, f64)>)>,
    /// Readings left out, summed up per window, each as of its latest
    /// reading's time (time series mode).
    pub left_out: Vec<(i64, LeftOut)>,
}

impl Later {
    pub fn len(&self) -> usize {
        self.points.len() + self.left_out.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its records' samples, the points first, LSNs from `lsn` on.
    pub fn samples(&self, lsn: u64) -> Vec<Sample> {
        let mut out = Vec::with_capacity(self.len());
        for (ts_ms, fields) in &self.points {
            let fields: Vec<(&str, f64)> = fields.iter().map(|f| (f.0.as_str(), f.1)).collect();
            out.push(Sample::archive(*ts_ms, &fields, lsn + out.len() as u64));
        }
        for (ts_ms, left) in &self.left_out {
            out.push(Sample::left_out(*ts_ms, left, lsn + out.len() as u64));
        }
        out
    }
}

impl Thinning {
    /// `left_out_window`: `bucket.window` in ms in time series mode, where
    /// the values left out are summed up ([`LeftOut`]); `None` in bucket
    /// mode, where each bucket does it. `max_bytes`: what the runs may
    /// hold ([`Thinning::sweep`]).
    pub fn new(left_out_window: Option<i64>, max_bytes: usize) -> Thinning {
        Thinning {
            sensors: HashMap::new(),
            counts: Vec::new(),
            left_out_window,
            max_bytes,
            sensors_ended: 0,
            swept_bytes: 0,
        }
    }

    /// Thins `reading` under `rules` (received at `now_ms`): what its
    /// sample says of each thinned field, and what of the sensor's
    /// earlier readings is now to be spooled ([`Later`]).
    /// The reading's record is spooled at `next_lsn` after those.
    pub fn thin<'r>(
        &mut self,
        rules: &'r [(String, Rule)],
        reading: &Reading,
        now_ms: i64,
        next_lsn: u64,
    ) -> (Vec<Thinned<'r>>, Later) {
        let mut thinned = Vec::new();
        let mut later = Later::default();
        if rules.is_empty() {
            return (thinned, later);
        }
        // The fields whose door now holds this reading's point.
        let mut held_here = Vec::new();
        // Looked up by reference: a key is made once per sensor.
        if !self.sensors.contains_key(&reading.sensor) {
            self.sensors
                .insert(reading.sensor.clone(), SensorState::default());
        }
        let SensorState { fields, open } = self
            .sensors
            .get_mut(&reading.sensor)
            .expect("just inserted");
        for (name, rule) in rules {
            let Some((_, value)) = reading.fields.iter().find(|f| f.0 == *name) else {
                continue;
            };
            let state = match fields.iter_mut().position(|f| f.name == *name) {
                Some(i) => &mut fields[i],
                None => {
                    fields.push(FieldState {
                        name: name.clone(),
                        field: Field::new(*rule),
                        received_ms: now_ms,
                        held_lsn: None,
                    });
                    fields.last_mut().expect("just pushed")
                }
            };
            if state.field.rule() != rule {
                // The rule changed (a reload): a new run.
                state.field = Field::new(*rule);
            }
            state.received_ms = now_ms;
            let verdict = match value {
                FieldValue::Num(x) => state.field.offer(Point {
                    t: reading.ts_ms,
                    v: *x,
                }),
                _ => state.field.offer_other(),
            };
            for e in &verdict.earlier {
                add(&mut later.points, *e, name);
            }
            match state.field.held() {
                None => state.held_lsn = None,
                Some(h) if h.t == reading.ts_ms && !verdict.passed => held_here.push(name),
                // Still the point of an earlier record.
                Some(_) => {}
            }
            let stored = verdict.keep as u64 + verdict.earlier.len() as u64;
            let unordered = (verdict.passed && matches!(value, FieldValue::Num(_))) as u64;
            count(&mut self.counts, rule.kind(), 1, stored, unordered);
            if verdict.passed {
                // Stored as it is: no rule acted on it.
                continue;
            }
            thinned.push(Thinned {
                field: name,
                kind: rule.kind(),
                bound: rule.bound(),
                dropped: !verdict.keep,
            });
        }
        // Time series mode: the values left out, summed up per window.
        let dropped = || thinned.iter().filter(|t| t.dropped);
        if let (Some(w), Some(_)) = (self.left_out_window, dropped().next()) {
            let window = reading.ts_ms.div_euclid(w) * w;
            if open.as_ref().is_some_and(|o| o.window != window) {
                later.left_out.extend(open.take().map(Open::take));
            }
            let o = open.get_or_insert_with(|| Open {
                window,
                first_lsn: next_lsn + later.len() as u64,
                due_ms: now_ms + rules.iter().map(|r| max_interval(&r.1)).min().unwrap_or(0),
                sums: LeftOut::default(),
            });
            for t in dropped() {
                let value = reading.fields.iter().find(|f| f.0 == t.field);
                if let Some((_, FieldValue::Num(x))) = value {
                    o.sums.add(t.field, reading.ts_ms, *x, t.kind, t.bound);
                }
            }
            // Nothing of it is left to store: no document of its own.
            let nothing = reading
                .fields
                .iter()
                .all(|f| dropped().any(|t| t.field == f.0));
            o.sums.count += nothing as i32;
        }
        let lsn = next_lsn + later.len() as u64;
        for f in fields.iter_mut().filter(|f| held_here.contains(&&f.name)) {
            f.held_lsn = Some(lsn);
        }
        (thinned, later)
    }

    /// The LSN of the oldest record the state needs after a crash: of a
    /// point held, or of a value left out not yet summed up in the spool
    /// (`None`: none).
    pub(crate) fn oldest_held(&self) -> Option<u64> {
        let sensors = self.sensors.values();
        let points = sensors
            .clone()
            .flat_map(|s| &s.fields)
            .filter_map(|f| f.held_lsn);
        let left_out = sensors.filter_map(|s| Some(s.open.as_ref()?.first_lsn));
        points.chain(left_out).min()
    }

    /// Ends the runs of fields not heard from for their `max_interval`
    /// (at `now_ms`), and takes the values left out that are due (or all
    /// of them, `all_left_out`: the spool is full and no longer keeps
    /// their records): what to spool now, per sensor. A sensor left with
    /// nothing held is forgotten.
    ///
    /// Beyond `max_bytes`, the runs of the sensors heard from longest ago
    /// end too, until the state holds three quarters of it (counted in
    /// `sensors_ended`): a run may end at any point, its held point
    /// stored, and the bound holds; what is lost is what a longer run
    /// would have left out.
    pub(crate) fn sweep(&mut self, now_ms: i64, all_left_out: bool) -> Vec<(String, Later)> {
        let mut out = self.end_runs(
            |f| now_ms - f.received_ms >= max_interval(f.field.rule()),
            |o| all_left_out || now_ms >= o.due_ms,
        );
        let total = self.bytes();
        self.swept_bytes = total;
        if total > self.max_bytes {
            // (last heard, bytes) per sensor, the longest-silent first.
            let mut by_age: Vec<(i64, usize)> = (self.sensors.iter())
                .map(|(name, s)| {
                    let heard = s.fields.iter().map(|f| f.received_ms).max();
                    (heard.unwrap_or(i64::MIN), sensor_bytes(name, s))
                })
                .collect();
            by_age.sort_unstable();
            let (mut held, mut cutoff) = (total, i64::MIN);
            for (heard, bytes) in by_age {
                if held <= self.max_bytes / 4 * 3 {
                    break;
                }
                (held, cutoff) = (held - bytes, heard);
            }
            let before = self.sensors.len();
            out.extend(self.end_runs(|f| f.received_ms <= cutoff, |_| false));
            self.sensors_ended += (before - self.sensors.len()) as u64;
            self.swept_bytes = self.bytes();
        }
        out
    }

    /// The state's bytes as the last sweep left them (what the gauge
    /// shows; summed once per sweep, not again).
    pub(crate) fn swept_bytes(&self) -> usize {
        self.swept_bytes
    }

    /// Ends every run (a clean shutdown): what to spool.
    pub(crate) fn finish(&mut self) -> Vec<(String, Later)> {
        self.end_runs(|_| true, |_| true)
    }

    fn end_runs(
        &mut self,
        due: impl Fn(&FieldState) -> bool,
        due_left_out: impl Fn(&Open) -> bool,
    ) -> Vec<(String, Later)> {
        let mut out = Vec::new();
        let counts = &mut self.counts;
        self.sensors.retain(|sensor, s| {
            let mut later = Later::default();
            s.fields.retain_mut(|f| {
                if !due(f) {
                    return true;
                }
                if let Some(p) = f.field.finish() {
                    add(&mut later.points, p, &f.name);
                    count(counts, f.field.rule().kind(), 0, 1, 0);
                }
                false
            });
            if s.fields.is_empty() || s.open.as_ref().is_some_and(&due_left_out) {
                later.left_out.extend(s.open.take().map(Open::take));
            }
            if !later.is_empty() {
                out.push((sensor.clone(), later));
            }
            !s.fields.is_empty()
        });
        out
    }

    /// The points counted per rule kind since the last call.
    pub(crate) fn take_counts(&mut self) -> Vec<Counts> {
        std::mem::take(&mut self.counts)
    }

    /// Fields whose state is kept.
    #[cfg(test)]
    pub(crate) fn fields(&self) -> usize {
        self.sensors.values().map(|s| s.fields.len()).sum()
    }

    /// Heap bytes of the state (an estimate).
    pub fn bytes(&self) -> usize {
        let sensors = self.sensors.iter();
        sensors.map(|(name, s)| sensor_bytes(name, s)).sum()
    }

    /// Sensors whose runs ended to keep within `max_bytes`, since the
    /// last call.
    pub(crate) fn take_sensors_ended(&mut self) -> u64 {
        std::mem::take(&mut self.sensors_ended)
    }
}

/// Heap bytes of one sensor's state (an estimate).
fn sensor_bytes(name: &str, s: &SensorState) -> usize {
    let f = &s.fields;
    name.len()
        + 64
        + f.capacity() * std::mem::size_of::<FieldState>()
        + (f.iter())
            .map(|f| f.name.capacity() + f.field.heap_bytes())
            .sum::<usize>()
        + (s.open.as_ref()).map_or(0, |o| std::mem::size_of::<Open>() + o.sums.heap_bytes())
}

/// The file that says from which LSN the held points' records are kept.
pub(crate) fn lsn_path(spool_dir: &Path) -> PathBuf {
    spool_dir.join("thinning.lsn")
}

/// Records the LSN the held points' records begin at: a new file put in
/// place, not synced (a stale or lost one makes the read-back start
/// earlier, which is safe).
pub(crate) fn save_lsn(spool_dir: &Path, lsn: u64) -> io::Result<()> {
    let path = lsn_path(spool_dir);
    let tmp = path.with_extension("lsn.tmp");
    std::fs::write(&tmp, format!("{lsn}\n"))?;
    std::fs::rename(&tmp, &path)
}

/// Reads back what thinning held when palletd stopped, from
/// `thinning.lsn` on: each swinging door field's last record whose point
/// was held and not stored since, and (`left_out_window`: time series
/// mode) the values left out since their sensor's last summary of their
/// window; per sensor, to be spooled now.
///
/// Without `thinning.lsn` no earlier run thinned (it writes the file at
/// its start): nothing is read, and the file is written now. An
/// unreadable one is read from the spool's first record.
pub(crate) fn read_back(
    spool_dir: &Path,
    spool: &Spool,
    next_lsn: u64,
    left_out_window: Option<i64>,
) -> Vec<(String, Later)> {
    let from = match std::fs::read_to_string(lsn_path(spool_dir)) {
        Ok(text) => text.trim().parse::<u64>().unwrap_or(0),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Err(e) = save_lsn(spool_dir, next_lsn) {
                warn!(error = %e, "Cannot write thinning.lsn in the spool's directory; after a crash the held points are looked for from the spool's first record.");
            }
            return Vec::new();
        }
        Err(_) => 0,
    };
    let mut state = ReadBack {
        held: HashMap::new(),
        left_out: HashMap::new(),
        window: left_out_window,
    };
    let mut reader = spool.reader(from);
    while reader.next() < next_lsn {
        let read = match reader.read(READ_BACK_RECORDS, next_lsn) {
            Ok(read) => read,
            Err(e) => {
                warn!(error = %e, "Cannot read back the points thinning held at the last stop; the runs they ended start anew without them.");
                break;
            }
        };
        for r in crate::spool::parse(&read.bytes) {
            let EntryRef::Sample { sensor, doc } = r.entry else {
                continue;
            };
            let Some(s) = bson::RawDocument::from_bytes(doc)
                .ok()
                .and_then(|d| SampleRef::from_doc(d, r.lsn))
            else {
                continue;
            };
            state.seen(sensor, s);
        }
        if read.records == 0 {
            break;
        }
    }
    let mut out: HashMap<String, Later> = HashMap::new();
    for ((sensor, field), p) in state.held {
        if let Some(p) = p {
            add(&mut out.entry(sensor).or_default().points, p, &field);
        }
    }
    for ((sensor, _), sums) in state.left_out {
        let ts_ms = sums.last_ts().unwrap_or_default();
        out.entry(sensor).or_default().left_out.push((ts_ms, sums));
    }
    out.into_iter().collect()
}

/// What the records read back say.
struct ReadBack {
    /// (sensor, field) -> the held point, or none (the run ended).
    held: HashMap<(String, String), Option<Point>>,
    /// (sensor, window) -> the values left out since its last summary.
    left_out: HashMap<(String, i64), LeftOut>,
    /// `bucket.window` in ms in time series mode.
    window: Option<i64>,
}

impl ReadBack {
    /// What one sample record says of its sensor's runs and values left
    /// out.
    fn seen(&mut self, sensor: &str, s: SampleRef<'_>) {
        // A point stored at or after the one held ends its run.
        let ends = |held: &mut Option<Point>| {
            if held.is_some_and(|h| h.t <= s.ts_ms) {
                *held = None;
            }
        };
        let window = self.window.map(|w| s.ts_ms.div_euclid(w) * w);
        if s.is_left_out() {
            // Summed up: everything left out before it in its window.
            if let Some(w) = window {
                self.left_out.remove(&(sensor.to_string(), w));
            }
            return;
        }
        if s.is_archive() {
            for (name, _) in s.doc.iter().flatten() {
                if let Some(held) = self.held.get_mut(&(sensor.to_string(), name.to_string())) {
                    ends(held);
                }
            }
            return;
        }
        let Ok(Some(bson::RawBsonRef::Document(thin))) = s.doc.get(THIN) else {
            return;
        };
        if let Some(w) = window {
            let mut left = (thin.iter().flatten())
                .filter_map(|(name, rule)| {
                    let rule = rule.as_document()?;
                    let kind = match rule.get_str("k") {
                        Ok(SWINGING_DOOR) => SWINGING_DOOR,
                        _ => DEADBAND,
                    };
                    Some((name, rule.get_f64("v").ok()?, kind, rule.get_f64("b").ok()?))
                })
                .peekable();
            if left.peek().is_some() {
                let sums = (self.left_out).entry((sensor.to_string(), w)).or_default();
                for (name, x, kind, bound) in left {
                    sums.add(name, s.ts_ms, x, kind, bound);
                }
                // Nothing of it is left to store: no document of its own.
                sums.count += !s.pushes() as i32;
            }
        }
        for (name, rule) in thin.iter().flatten() {
            let Some(rule) = rule.as_document() else {
                continue;
            };
            if rule.get_str("k").ok() != Some(SWINGING_DOOR) {
                continue;
            }
            // Dropped: the newest dropped point is held until a record says
            // it was stored; kept: the run starts there, nothing held.
            let held = (self.held)
                .entry((sensor.to_string(), name.to_string()))
                .or_default();
            match rule.get_f64("v") {
                Ok(v) if held.is_none_or(|h| h.t < s.ts_ms) => {
                    *held = Some(Point { t: s.ts_ms, v })
                }
                Ok(_) => {}
                Err(_) => ends(held),
            }
        }
    }
}

/// Records read back at a time.
const READ_BACK_RECORDS: usize = 8192;

fn max_interval(rule: &Rule) -> i64 {
    match *rule {
        Rule::Deadband {
            max_interval_ms, ..
        }
        | Rule::SwingingDoor {
            max_interval_ms, ..
        } => max_interval_ms,
    }
}

/// Adds field `name`'s point `p` to the points to store, merged by time.
fn add(archived: &mut Vec<(i64, Vec<(String, f64)>)>, p: Point, name: &str) {
    match archived.iter_mut().find(|a| a.0 == p.t) {
        Some(a) => a.1.push((name.to_string(), p.v)),
        None => archived.push((p.t, vec![(name.to_string(), p.v)])),
    }
}

/// Points of one rule kind: received, stored, unordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub kind: &'static str,
    pub received: u64,
    pub stored: u64,
    pub unordered: u64,
}

fn count(counts: &mut Vec<Counts>, kind: &'static str, received: u64, stored: u64, unordered: u64) {
    match counts.iter_mut().find(|c| c.kind == kind) {
        Some(c) => {
            c.received += received;
            c.stored += stored;
            c.unordered += unordered;
        }
        None => counts.push(Counts {
            kind,
            received,
            stored,
            unordered,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(sensor: &str, ts_ms: i64, fields: &[(&str, FieldValue)]) -> Reading {
        Reading {
            sensor: sensor.into(),
            ts_ms,
            fields: fields
                .iter()
                .map(|(n, v)| (n.to_string(), v.clone()))
                .collect(),
            ..Reading::default()
        }
    }

    /// Each sensor's fields have runs of their own; a silent field's held
    /// point is stored by the sweep after its max_interval, and the sensor
    /// is then forgotten.
    #[test]
    fn sensors_and_fields_are_thinned_apart_and_a_silent_run_is_ended() {
        let rules = vec![(
            "t".to_string(),
            Rule::SwingingDoor {
                deviation: 0.5,
                max_interval_ms: 60_000,
            },
        )];
        let mut th = Thinning::new(None, usize::MAX);
        let num = |x: f64| FieldValue::Num(x);
        for (i, s) in ["a", "b"].iter().enumerate() {
            let (t, arch) = th.thin(&rules, &reading(s, 1000, &[("t", num(i as f64))]), 0, 1);
            assert!(!t[0].dropped && arch.is_empty(), "a first point is stored");
        }
        let (t, _) = th.thin(
            &rules,
            &reading("a", 2000, &[("t", num(0.1)), ("u", num(9.0))]),
            0,
            5,
        );
        assert_eq!(t.len(), 1, "u has no rule");
        assert!(t[0].dropped, "held");
        let (t, arch) = th.thin(&rules, &reading("a", 3000, &[("t", num(5.0))]), 0, 6);
        assert!(t[0].dropped);
        assert_eq!(
            arch.points,
            vec![(2000, vec![("t".to_string(), 0.1)])],
            "the run's last point"
        );
        assert!(arch.left_out.is_empty(), "bucket mode sums nothing up");
        // "b" has nothing held; "a" holds its 5.0.
        assert!(th.sweep(59_999, false).is_empty());
        let swept = th.sweep(60_000, false);
        let points = vec![(3000, vec![("t".to_string(), 5.0)])];
        assert_eq!(
            swept,
            vec![(
                "a".to_string(),
                Later {
                    points,
                    left_out: vec![]
                }
            )]
        );
        assert_eq!(th.fields(), 0, "both forgotten");
        let counts = th.take_counts();
        let want = Counts {
            kind: "swinging_door",
            received: 4,
            stored: 4,
            unordered: 0,
        };
        assert_eq!(counts, vec![want]);
    }

    /// Beyond their share of memory the runs of the sensors heard from
    /// longest ago end, their held points to be stored, down to three
    /// quarters of the share.
    #[test]
    fn beyond_its_memory_the_longest_silent_sensors_runs_end() {
        let rules = vec![(
            "t".to_string(),
            Rule::SwingingDoor {
                deviation: 0.5,
                max_interval_ms: 3_600_000,
            },
        )];
        let feed = |th: &mut Thinning| {
            for i in 0..100i64 {
                for k in 0..3 {
                    let r = reading(
                        &format!("s{i:03}"),
                        1000 * k,
                        &[("t", FieldValue::Num(0.1 * k as f64))],
                    );
                    th.thin(&rules, &r, i, 1);
                }
            }
        };
        let mut all = Thinning::new(None, usize::MAX);
        feed(&mut all);
        let total = all.bytes();
        assert!(all.sweep(100, false).is_empty());
        let mut th = Thinning::new(None, total / 2);
        feed(&mut th);
        let ended = th.sweep(100, false);
        assert!(th.bytes() <= total / 2 / 4 * 3, "{} of {total}", th.bytes());
        assert_eq!(th.swept_bytes(), th.bytes(), "what the gauge shows");
        let n = th.take_sensors_ended() as usize;
        assert_eq!(ended.len(), n, "each stores its held point");
        assert!((60..70).contains(&n), "{n} of 100 ended");
        assert_eq!(th.fields(), 100 - n);
        for (sensor, later) in &ended {
            assert!(sensor.as_str() < "s070", "the longest-silent: {sensor}");
            assert_eq!(later.points, vec![(2000, vec![("t".to_string(), 0.2)])]);
        }
        assert!(th.sweep(101, false).is_empty(), "within its share again");
    }

    /// In time series mode the values left out are summed up per sensor
    /// and window: spooled when a reading comes in another window, when
    /// due, or at the end; `count` only of readings left with nothing.
    #[test]
    fn values_left_out_are_summed_up_per_window_in_time_series_mode() {
        let band = Rule::Deadband {
            band: 1.0,
            max_interval_ms: 60_000,
            min_interval_ms: 0,
        };
        let rules = vec![("t".to_string(), band), ("u".to_string(), band)];
        let mut th = Thinning::new(Some(10_000), usize::MAX);
        let num = |x: f64| FieldValue::Num(x);
        let r = |ts, t, u: Option<f64>| {
            let mut f = vec![("t", num(t))];
            f.extend(u.map(|u| ("u", num(u))));
            reading("a", ts, &f)
        };
        // LSN 1: both stored; 2: t left out, u stored; 3: both left out.
        let (_, later) = th.thin(&rules, &r(1000, 20.0, Some(5.0)), 0, 1);
        assert!(later.is_empty() && th.oldest_held().is_none());
        let (t, _) = th.thin(&rules, &r(2000, 20.5, Some(9.0)), 0, 2);
        assert!(t[0].dropped && !t[1].dropped);
        assert_eq!(th.oldest_held(), Some(2), "from the first value left out");
        let (_, later) = th.thin(&rules, &r(3000, 20.2, Some(9.5)), 0, 3);
        assert!(later.is_empty());
        // The next window: the first one's values are spooled before it.
        let (t, later) = th.thin(&rules, &r(12_000, 20.9, None), 500, 4);
        assert!(t[0].dropped);
        assert!(later.points.is_empty());
        let [(ts, left)] = &later.left_out[..] else {
            panic!("{later:?}")
        };
        assert_eq!(*ts, 3000, "as of its latest reading");
        let mut want = LeftOut::default();
        want.add("t", 2000, 20.5, DEADBAND, 1.0);
        want.add("t", 3000, 20.2, DEADBAND, 1.0);
        want.add("u", 3000, 9.5, DEADBAND, 1.0);
        want.count = 1;
        assert_eq!(left, &want);
        let samples = later.samples(4);
        assert_eq!(samples.len(), 1);
        assert!(samples[0].as_ref().is_left_out() && !samples[0].as_ref().is_reading());
        assert_eq!(samples[0].lsn, 4);
        // Its reading goes after: LSN 5, where the second window's begin.
        assert_eq!(th.oldest_held(), Some(5));
        // Due the smallest max_interval after its first reading came.
        assert!(th.sweep(60_499, false).is_empty());
        let swept = th.sweep(60_500, false);
        assert_eq!(swept.len(), 1);
        assert_eq!(swept[0].1.left_out[0].1.count, 1);
        assert!(th.oldest_held().is_none());
        // A full spool takes them all at once; so does the end.
        th.thin(&rules, &r(13_000, 25.0, None), 61_000, 6);
        th.thin(&rules, &r(14_000, 25.1, None), 61_000, 7);
        assert_eq!(th.sweep(61_000, true)[0].1.left_out.len(), 1);
        th.thin(&rules, &r(15_000, 25.2, None), 61_000, 8);
        assert_eq!(th.finish()[0].1.left_out.len(), 1);
        assert_eq!(th.fields(), 0);
    }
}
