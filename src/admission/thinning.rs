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
//! After a crash the held points are read back: the spool keeps the
//! record of every point held ([`crate::spool::Spool::hold`], at most a
//! field's `max_interval` old, as the sweep ends silent runs), and
//! `thinning.lsn` in the spool's directory says from where. At start
//! each field's last record tells whether its run ended; the point of one
//! that did not is stored then ([`read_back`]), and every field starts a
//! new run. A reader's line through it is as good as the one the run
//! would have ended with: every point dropped before it was within the
//! bound of the line to it.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::bucket::{SampleRef, Thinned, THIN};
use crate::decode::{FieldValue, Reading};
use crate::record::EntryRef;
use crate::spool::Spool;
use crate::thin::{Field, Point, Rule, SWINGING_DOOR};

/// One field's state and when a reading of it last came.
#[derive(Debug)]
struct FieldState {
    name: String,
    field: Field,
    received_ms: i64,
    /// The LSN of the record of the point its swinging door holds.
    held_lsn: Option<u64>,
}

/// The thinning state of every sensor with a thinned field.
#[derive(Debug, Default)]
pub struct Thinning {
    sensors: HashMap<String, Vec<FieldState>>,
    /// Points received, stored, and taken as they were (out of order
    /// beyond what the rule remembers), per rule kind, since the last
    /// count was taken ([`Thinning::take_counts`]).
    counts: Vec<Counts>,
}

/// Points of one sensor to store later than their readings came: by
/// time, each with the fields whose run ends there.
pub type Archived = Vec<(i64, Vec<(String, f64)>)>;

impl Thinning {
    /// Thins `reading` under `rules` (received at `now_ms`): what its
    /// sample says of each thinned field, and the points of the sensor's
    /// earlier readings that are now to be stored.
    /// The reading's record is spooled at `next_lsn` after the points.
    pub fn thin<'r>(
        &mut self,
        rules: &'r [(String, Rule)],
        reading: &Reading,
        now_ms: i64,
        next_lsn: u64,
    ) -> (Vec<Thinned<'r>>, Archived) {
        let mut thinned = Vec::new();
        let mut archived: Archived = Vec::new();
        if rules.is_empty() {
            return (thinned, archived);
        }
        // The fields whose door now holds this reading's point.
        let mut held_here = Vec::new();
        // Looked up by reference: a key is made once per sensor.
        if !self.sensors.contains_key(&reading.sensor) {
            self.sensors.insert(reading.sensor.clone(), Vec::new());
        }
        let fields = self
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
                add(&mut archived, *e, name);
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
        let lsn = next_lsn + archived.len() as u64;
        for f in fields.iter_mut().filter(|f| held_here.contains(&&f.name)) {
            f.held_lsn = Some(lsn);
        }
        (thinned, archived)
    }

    /// The LSN of the oldest record of a point held (`None`: none is).
    pub fn oldest_held(&self) -> Option<u64> {
        self.sensors
            .values()
            .flatten()
            .filter_map(|f| f.held_lsn)
            .min()
    }

    /// Ends the runs of fields not heard from for their `max_interval`
    /// (at `now_ms`): their held points, per sensor, to be stored now; a
    /// sensor left with nothing held is forgotten.
    pub fn sweep(&mut self, now_ms: i64) -> Vec<(String, Archived)> {
        self.end_runs(|f| now_ms - f.received_ms >= max_interval(f.field.rule()))
    }

    /// Ends every run (a clean shutdown): the held points to store.
    pub fn finish(&mut self) -> Vec<(String, Archived)> {
        self.end_runs(|_| true)
    }

    fn end_runs(&mut self, due: impl Fn(&FieldState) -> bool) -> Vec<(String, Archived)> {
        let mut out = Vec::new();
        let counts = &mut self.counts;
        self.sensors.retain(|sensor, fields| {
            let mut archived: Archived = Vec::new();
            fields.retain_mut(|f| {
                if !due(f) {
                    return true;
                }
                if let Some(p) = f.field.finish() {
                    add(&mut archived, p, &f.name);
                    count(counts, f.field.rule().kind(), 0, 1, 0);
                }
                false
            });
            if !archived.is_empty() {
                out.push((sensor.clone(), archived));
            }
            !fields.is_empty()
        });
        out
    }

    /// The points counted per rule kind since the last call.
    pub fn take_counts(&mut self) -> Vec<Counts> {
        std::mem::take(&mut self.counts)
    }

    /// Fields whose state is kept.
    pub fn fields(&self) -> usize {
        self.sensors.values().map(Vec::len).sum()
    }

    /// Heap bytes of the state (an estimate).
    pub fn bytes(&self) -> usize {
        self.sensors
            .iter()
            .map(|(s, f)| {
                s.capacity()
                    + 64
                    + f.capacity() * std::mem::size_of::<FieldState>()
                    + (f.iter())
                        .map(|f| f.name.capacity() + f.field.heap_bytes())
                        .sum::<usize>()
            })
            .sum()
    }
}

/// The file that says from which LSN the held points' records are kept.
pub fn lsn_path(spool_dir: &Path) -> PathBuf {
    spool_dir.join("thinning.lsn")
}

/// Records the LSN the held points' records begin at: a new file put in
/// place, not synced (a stale or lost one makes the read-back start
/// earlier, which is safe).
pub fn save_lsn(spool_dir: &Path, lsn: u64) -> io::Result<()> {
    let path = lsn_path(spool_dir);
    let tmp = path.with_extension("lsn.tmp");
    std::fs::write(&tmp, format!("{lsn}\n"))?;
    std::fs::rename(&tmp, &path)
}

/// Reads back the points held when palletd stopped: each swinging door
/// field's last record from `thinning.lsn` on, whose point was held and
/// not stored since (per sensor, to be stored now).
///
/// Without `thinning.lsn` no earlier run thinned (it writes the file at
/// its start): nothing is read, and the file is written now. An
/// unreadable one is read from the spool's first record.
pub fn read_back(spool_dir: &Path, spool: &Spool, next_lsn: u64) -> Vec<(String, Archived)> {
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
    // (sensor, field) -> the held point, or none (the run ended).
    let mut last: HashMap<(String, String), Option<Point>> = HashMap::new();
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
            seen(&mut last, sensor, s);
        }
        if read.records == 0 {
            break;
        }
    }
    let mut out: HashMap<String, Archived> = HashMap::new();
    for ((sensor, field), p) in last {
        if let Some(p) = p {
            add(out.entry(sensor).or_default(), p, &field);
        }
    }
    out.into_iter().collect()
}

/// What one sample record says of its sensor's runs.
fn seen(last: &mut HashMap<(String, String), Option<Point>>, sensor: &str, s: SampleRef<'_>) {
    // A point stored at or after the one held ends its run.
    let ends = |held: &mut Option<Point>| {
        if held.is_some_and(|h| h.t <= s.ts_ms) {
            *held = None;
        }
    };
    if s.is_archive() {
        for (name, _) in s.doc.iter().flatten() {
            if let Some(held) = last.get_mut(&(sensor.to_string(), name.to_string())) {
                ends(held);
            }
        }
        return;
    }
    let Ok(Some(bson::RawBsonRef::Document(thin))) = s.doc.get(THIN) else {
        return;
    };
    for (name, rule) in thin.iter().flatten() {
        let Some(rule) = rule.as_document() else {
            continue;
        };
        if rule.get_str("k").ok() != Some(SWINGING_DOOR) {
            continue;
        }
        // Dropped: the newest dropped point is held until a record says
        // it was stored; kept: the run starts there, nothing held.
        let held = last
            .entry((sensor.to_string(), name.to_string()))
            .or_default();
        match rule.get_f64("v") {
            Ok(v) if held.is_none_or(|h| h.t < s.ts_ms) => *held = Some(Point { t: s.ts_ms, v }),
            Ok(_) => {}
            Err(_) => ends(held),
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
fn add(archived: &mut Archived, p: Point, name: &str) {
    match archived.iter_mut().find(|a| a.0 == p.t) {
        Some(a) => a.1.push((name.to_string(), p.v)),
        None => archived.push((p.t, vec![(name.to_string(), p.v)])),
    }
}

/// Points of one rule kind: received, stored, unordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
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
        let mut th = Thinning::default();
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
            arch,
            vec![(2000, vec![("t".to_string(), 0.1)])],
            "the run's last point"
        );
        // "b" has nothing held; "a" holds its 5.0.
        assert!(th.sweep(59_999).is_empty());
        let swept = th.sweep(60_000);
        assert_eq!(
            swept,
            vec![("a".to_string(), vec![(3000, vec![("t".to_string(), 5.0)])])]
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
}
