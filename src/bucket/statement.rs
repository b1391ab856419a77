//! One upsert statement and its BSON: the filter with the caps, the
//! `$push`, the rollups and the LSN pair.

use super::*;
use bson::{rawdoc, RawArrayBuf, RawBson, RawDocumentBuf};

/// One upsert statement: k consecutive samples of one sensor and window,
/// a range of the sensor's run of samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub start_ms: i64,
    /// Which of the run's samples it carries.
    pub range: std::ops::Range<usize>,
    /// How many of them it pushes into `samples` (all, but for what
    /// thinning dropped).
    pub pushed: u32,
    pub bytes: u32,
    /// The fill of the bucket this statement expects to extend; `None` when
    /// it expects to start a new bucket (or the fill is unknown).
    pub base: Option<Fill>,
    /// The bucket it writes ([`bucket_id`]): the one it extends, or the
    /// next. A bucket there that it does not fit makes the upsert's insert
    /// collide on `_id` (E11000): it goes to `seq + 1` ([`Statement::collided`]).
    pub seq: u32,
    /// The spool id its samples were written under ([`crate::spool_ids`]): a
    /// statement never carries samples of two.
    pub tag: u32,
    /// It starts bucket `seq` and leaves `seq - 1`, whose fill palletd
    /// knew, with a little room ([`plan`]): that bucket is done, to be
    /// sealed early like a full one.
    pub leaves: bool,
}

impl Statement {
    /// The samples it adds to its bucket's `count`.
    pub(crate) fn count(&self) -> u32 {
        self.pushed
    }

    /// What the gateway knows of the bucket's fill after the statement was
    /// applied; `inserted` tells whether the upsert created a new bucket.
    pub(crate) fn fill_after(&self, inserted: bool) -> Option<Fill> {
        let k = Fill {
            count: self.count(),
            bytes: self.bytes,
            seq: self.seq,
        };
        match (inserted, self.base) {
            (true, _) => Some(k),
            (false, Some(b)) => Some(Fill {
                count: b.count + k.count,
                bytes: b.bytes + k.bytes,
                seq: self.seq,
            }),
            (false, None) => None,
        }
    }

    /// Its bucket is there and it does not fit (full, or sealed): it goes
    /// to the next one, whose fill is unknown.
    pub(crate) fn collided(&mut self) {
        self.seq += 1;
        self.base = None;
        self.leaves = false;
    }
}

/// Statement `i` of a sensor's plan collided ([`Statement::collided`]);
/// the plan's later statements of its window that aimed no further go to
/// its new bucket too (they would collide the same way, a round trip
/// each).
pub(crate) fn collided(plan: &mut [Statement], i: usize) {
    plan[i].collided();
    let (start, seq) = (plan[i].start_ms, plan[i].seq);
    for st in plan[i + 1..].iter_mut() {
        if st.start_ms == start && st.seq < seq {
            st.seq = seq;
            st.base = None;
        }
    }
}

impl Statement {
    /// `{q, u, upsert: true}` for the `update` command; `samples` is the run
    /// the statement was planned from.
    ///
    /// `shard_key`: `sensorId` and `startTs` go into the filter as
    /// equalities (a sharded cluster routes an upsert by its shard key and
    /// refuses one without it), else into `$setOnInsert`. The `_id` names
    /// the sensor and window either way, and the filter without them costs
    /// SecantusDB 2-30% less (`bench/probes/statement_shapes.py`: commands
    /// of 1,000 upserts of 3 fields, 2,891-3,368/s against 2,700-3,021/s).
    pub fn to_bson(
        &self,
        sensor: &str,
        samples: &Samples,
        shape: &Shape,
        shard_key: bool,
    ) -> RawDocumentBuf {
        let k = self.count();
        let start = bson::DateTime::from_millis(self.start_ms);
        let end = bson::DateTime::from_millis(self.start_ms + shape.window_ms);
        // Equalities are copied into a bucket the upsert inserts.
        let mut q = rawdoc! { "_id": bucket_id(sensor, self.start_ms, self.seq) };
        let mut on_insert = rawdoc! {};
        let key = if shard_key { &mut q } else { &mut on_insert };
        key.append("sensorId", sensor);
        key.append("startTs", start);
        on_insert.append("endTs", end);
        q.append("closed", false);
        q.append("count", rawdoc! { "$lte": (shape.max_samples - k) as i32 });
        q.append(
            "size",
            rawdoc! { "$lte": (shape.max_bytes - self.bytes) as i32 },
        );
        let mut each = RawArrayBuf::new();
        let mut min_ts = i64::MAX;
        let mut max_ts = i64::MIN;
        let mut first_lsn = u64::MAX;
        let mut last_lsn = 0;
        // Summaries per numeric field, in order of first appearance.
        let mut fields: Vec<(&str, FieldSummary)> = Vec::new();
        // The units the samples gave, the latest of each field.
        let mut units: Vec<(&str, bson::RawBsonRef<'_>)> = Vec::new();
        // Thinning: the readings the statement represents, and per thinned
        // field its rule and the points it pushes.
        let mut readings = 0i32;
        let mut thinned = false;
        let mut rules: Vec<(&str, &str, f64, i32)> = Vec::new();
        for s in self.range.clone().map(|i| samples.get(i)) {
            let (doc, sample_units) = s.stored();
            readings += !s.is_archive() as i32;
            thinned |= s.is_archive();
            for (name, kind, bound) in s.rules() {
                thinned = true;
                let pushed = doc.get(name).ok().flatten().is_some() as i32;
                match rules.iter_mut().find(|r| r.0 == name) {
                    Some(r) => *r = (name, kind, bound, r.3 + pushed),
                    None => rules.push((name, kind, bound, pushed)),
                }
            }
            if s.is_archive() {
                let fields = s.doc.iter().flatten();
                for (name, _) in fields.filter(|f| f.0 != "ts" && !f.0.starts_with('_')) {
                    match rules.iter_mut().find(|r| r.0 == name) {
                        Some(r) => r.3 += 1,
                        None => rules.push((name, "", 0.0, 1)),
                    }
                }
            }
            if s.pushes() {
                each.push(RawBson::Document(doc));
            }
            for (name, unit) in sample_units.into_iter().flat_map(|u| u.iter().flatten()) {
                match units.iter_mut().find(|u| u.0 == name) {
                    Some(u) => u.1 = unit,
                    None => units.push((name, unit)),
                }
            }
            min_ts = min_ts.min(s.ts_ms);
            max_ts = max_ts.max(s.ts_ms);
            first_lsn = first_lsn.min(s.lsn);
            last_lsn = last_lsn.max(s.lsn);
            for (name, x) in s.nums() {
                match fields.iter_mut().find(|r| r.0 == name) {
                    Some(r) => r.1.add(s.ts_ms, x),
                    None => fields.push((name, FieldSummary::of(s.ts_ms, x))),
                }
            }
        }
        let mut inc = rawdoc! { "count": k as i32, "size": self.bytes as i32 };
        let mut set = RawDocumentBuf::new();
        if thinned {
            inc.append("thinned", readings - k as i32);
            for (name, kind, bound, pushed) in rules {
                inc.append(format!("thinning.{name}.stored"), pushed);
                if !kind.is_empty() {
                    set.append(format!("thinning.{name}.kind"), kind);
                    set.append(format!("thinning.{name}.{}", bound_name(kind)), bound);
                }
            }
        }
        let mut min = rawdoc! { "minTs": bson::DateTime::from_millis(min_ts) };
        let mut max = rawdoc! { "maxTs": bson::DateTime::from_millis(max_ts) };
        for (name, f) in fields {
            inc.append(format!("sum.{name}"), f.sum);
            inc.append(format!("n.{name}"), f.n);
            min.append(format!("min.{name}"), f.min);
            max.append(format!("max.{name}"), f.max);
            min.append(format!("first.{name}"), edge(f.first));
            max.append(format!("last.{name}"), edge(f.last));
        }
        let mut push = rawdoc! { "samples": { "$each": each } };
        push.append(
            lsns_field(self.tag),
            rawdoc! { "$each": [first_lsn as i64, last_lsn as i64] },
        );
        let mut u = rawdoc! {
            "$push": push,
            "$inc": inc,
            "$min": min,
            "$max": max,
            "$setOnInsert": on_insert,
        };
        for (name, unit) in units {
            set.append(format!("units.{name}"), unit.to_raw_bson());
        }
        if !set.is_empty() {
            u.append("$set", set);
        }
        rawdoc! { "q": q, "u": u, "upsert": true }
    }
}

/// What a bucket calls a thinning rule's bound: a deadband's `band`, a
/// swinging door's `deviation`.
pub(super) fn bound_name(kind: &str) -> &'static str {
    if kind == crate::thin::DEADBAND {
        "band"
    } else {
        "deviation"
    }
}
