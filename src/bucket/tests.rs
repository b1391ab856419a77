use super::*;
use crate::decode::{FieldValue, Reading};
use crate::spool_ids::Tags;
use proptest::prelude::*;

/// One spool id for every sample.
const ONE: Tags = Tags::new(1);

/// 260 bytes: two small samples with their summaries fit, three do not.
const SHAPE: Shape = Shape {
    window_ms: 1000,
    max_samples: 5,
    max_bytes: 260,
};

fn sample(ts_ms: i64, lsn: u64, extra: usize) -> Sample {
    let mut fields = vec![("v".to_string(), FieldValue::Num(lsn as f64))];
    if extra > 0 {
        fields.push(("pad".into(), FieldValue::Str("x".repeat(extra))));
    }
    Sample::encode(
        &Reading {
            sensor: "s".into(),
            ts_ms,
            fields,
            ..Reading::default()
        },
        lsn,
    )
}

fn owned(samples: impl IntoIterator<Item = Sample>) -> Samples {
    let v: Vec<Sample> = samples.into_iter().collect();
    v.iter().map(|s| s.as_ref()).collect()
}

/// The front of a queue within a number of statements is what
/// [`plan`] makes of it within that number, and splitting it off keeps
/// both parts whole and in order.
#[test]
fn the_front_within_some_statements_is_what_plan_makes_of_it() {
    // Windows of 1 s, at most 5 samples a bucket: windows 0, 0, 0, 1,
    // then 7 samples of window 2 (two buckets), then window 3.
    let ts = [
        0, 10, 20, 1000, 2000, 2001, 2002, 2003, 2004, 2005, 2006, 3000,
    ];
    let all = owned(ts.iter().enumerate().map(|(i, t)| sample(*t, i as u64, 0)));
    let planned = plan(&all, &mut Fills::new(), &SHAPE, &ONE).len();
    assert_eq!(all.front_within(&SHAPE, 100), (12, planned));
    assert_eq!(all.front_within(&SHAPE, 1), (3, 1));
    assert_eq!(all.front_within(&SHAPE, 2), (4, 2));
    assert_eq!(all.front_within(&SHAPE, 3), (9, 3));
    assert_eq!(all.front_within(&SHAPE, 0), (3, 1), "never nothing");
    let mut rest = all.clone();
    let front = rest.split_front(4);
    assert_eq!(
        front.keys().collect::<Vec<_>>(),
        all.keys().take(4).collect::<Vec<_>>()
    );
    assert_eq!(
        rest.keys().collect::<Vec<_>>(),
        all.keys().skip(4).collect::<Vec<_>>()
    );
    assert_eq!(front.bytes() + rest.bytes(), all.bytes());
    for (i, s) in rest.iter().enumerate() {
        assert_eq!(s.doc, all.get(i + 4).doc);
    }
    let mut whole = all.clone();
    assert_eq!(whole.split_front(12), all);
    assert!(whole.is_empty());
}

/// A model of the database: buckets by `_id` and the filter semantics
/// of the upsert.
#[derive(Default)]
struct Db {
    buckets: Vec<B>,
}

struct B {
    start: i64,
    seq: u32,
    closed: bool,
    count: u32,
    size: u32,
    msgs: Vec<u64>,
}

impl Db {
    /// Applies a statement: `Ok(inserted)`, or `Err` for E11000 (its
    /// bucket is there and it does not fit).
    fn apply(&mut self, st: &Statement, samples: &Samples, shape: &Shape) -> Result<bool, ()> {
        let k = st.count();
        let msgs = st.range.clone().map(|i| samples.get(i).lsn);
        match self
            .buckets
            .iter_mut()
            .find(|b| (b.start, b.seq) == (st.start_ms, st.seq))
        {
            Some(b)
                if !b.closed
                    && b.count <= shape.max_samples - k
                    && b.size <= shape.max_bytes - st.bytes =>
            {
                b.count += k;
                b.size += st.bytes;
                b.msgs.extend(msgs);
                Ok(false)
            }
            Some(_) => Err(()),
            None => {
                self.buckets.push(B {
                    start: st.start_ms,
                    seq: st.seq,
                    closed: false,
                    count: k,
                    size: st.bytes,
                    msgs: msgs.collect(),
                });
                Ok(true)
            }
        }
    }

    /// Applies statement `i` of a plan as the store does, going to the
    /// next bucket on a collision ([`collided`]), and records the fill
    /// it learned. Returns the collisions.
    fn write(
        &mut self,
        plan: &mut [Statement],
        i: usize,
        samples: &Samples,
        shape: &Shape,
        memory: &mut Fills,
    ) -> u32 {
        let mut collisions = 0;
        let inserted = loop {
            match self.apply(&plan[i], samples, shape) {
                Ok(inserted) => break inserted,
                Err(()) => {
                    collided(plan, i);
                    collisions += 1;
                }
            }
        };
        let st = &plan[i];
        match st.fill_after(inserted) {
            Some(f) => memory.insert(st.start_ms, f),
            None => memory.remove(&st.start_ms),
        }
        collisions
    }
}

/// A bucket's `_id` names its sensor, window and sequence number
/// unambiguously, whatever the sensor id holds; another `_id` has none.
#[test]
fn a_bucket_id_gives_back_its_sequence_number() {
    for (sensor, start, seq) in [("s-1", 3_600_000, 0), ("a|1|2", -1000, 7), ("", 0, 42)] {
        let id = bucket_id(sensor, start, seq);
        assert_eq!(seq_of(&id), Some(seq), "{id}");
        assert!(id.starts_with(sensor));
    }
    assert_ne!(bucket_id("a|1", 2, 3), bucket_id("a", 12, 3));
    assert_eq!(seq_of("64f0c0ffee00000000000000"), None);
    assert_eq!(seq_of("a|b|c"), None);
    let samples = owned([sample(1500, 1, 0)]);
    let st = &plan(&samples, &mut Fills::new(), &SHAPE, &ONE)[0];
    let d = bson::Document::try_from(st.to_bson("s", &samples, &SHAPE, true).as_ref()).unwrap();
    let q = d.get_document("q").unwrap();
    assert_eq!(
        q.get_str("_id"),
        Ok("s|1000|0"),
        "the first bucket of its window"
    );
    let mut next = st.clone();
    next.collided();
    let d = bson::Document::try_from(next.to_bson("s", &samples, &SHAPE, true).as_ref()).unwrap();
    assert_eq!(d.get_document("q").unwrap().get_str("_id"), Ok("s|1000|1"));
}

#[test]
fn a_run_fills_the_open_bucket_then_starts_new_ones() {
    let mut memory = Fills::from([(
        0,
        Fill {
            count: 3,
            bytes: 60,
            seq: 0,
        },
    )]);
    let samples = owned((0..9).map(|i| sample(i, i as u64, 0)));
    let out = plan(&samples, &mut memory, &SHAPE, &ONE);
    let counts: Vec<u32> = out.iter().map(|s| s.count()).collect();
    assert_eq!(counts, vec![2, 5, 2]);
    assert_eq!(
        out[0].base,
        Some(Fill {
            count: 3,
            bytes: 60,
            seq: 0,
        })
    );
    assert_eq!(out[1].base, None);
    assert_eq!(memory.get(&0).unwrap().count, 2);
}

#[test]
fn a_run_that_overflows_a_nearly_full_bucket_starts_the_next_whole() {
    let shape = Shape {
        max_samples: 16,
        max_bytes: 100_000,
        ..SHAPE
    };
    let almost = |count| {
        Fills::from([(
            0,
            Fill {
                count,
                bytes: count * 20,
                seq: 3,
            },
        )])
    };
    // One of 16 left (a sixteenth): the run of 5 goes whole to bucket 4.
    let samples = owned((0..5).map(|i| sample(i, i as u64, 0)));
    let mut memory = almost(15);
    let out = plan(&samples, &mut memory, &shape, &ONE);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!((out[0].seq, out[0].base, out[0].leaves), (4, None, true));
    assert_eq!(memory.get(&0).map(|f| (f.count, f.seq)), Some((5, 4)));
    // A run that fits what is left goes in, as before.
    let one = owned((0..1).map(|i| sample(i, i as u64, 0)));
    let mut memory = almost(15);
    let out = plan(&one, &mut memory, &shape, &ONE);
    assert_eq!((out.len(), out[0].seq, out[0].leaves), (1, 3, false));
    // More room than a sixteenth: filled first, then the next.
    let mut memory = almost(14);
    let out = plan(&samples, &mut memory, &shape, &ONE);
    let cut: Vec<(u32, u32, bool)> = out.iter().map(|s| (s.seq, s.count(), s.leaves)).collect();
    assert_eq!(cut, vec![(3, 2, false), (4, 3, false)]);
    // A run larger than a bucket fills the open one first.
    let many = owned((0..20).map(|i| sample(i, i as u64, 0)));
    let mut memory = almost(15);
    let out = plan(&many, &mut memory, &shape, &ONE);
    let cut: Vec<(u32, u32)> = out.iter().map(|s| (s.seq, s.count())).collect();
    assert_eq!(cut, vec![(3, 1), (4, 16), (5, 3)]);
}

#[test]
fn runs_follow_arrival_order_across_windows() {
    let mut memory = Fills::new();
    let ts = [0, 10, 1500, 20, 1600];
    let samples = owned(ts.iter().enumerate().map(|(i, t)| sample(*t, i as u64, 0)));
    let roomy = Shape {
        max_bytes: 1000,
        ..SHAPE
    };
    let out = plan(&samples, &mut memory, &roomy, &ONE);
    let starts: Vec<i64> = out.iter().map(|s| s.start_ms).collect();
    assert_eq!(starts, vec![0, 1000, 0, 1000]);
    // The second run of window 0 continues the bucket the first one began.
    assert_eq!(
        out[2].base,
        Some(Fill {
            count: 2,
            bytes: out[0].bytes,
            seq: 0,
        })
    );
}

#[test]
fn a_run_is_cut_where_the_spool_id_of_its_samples_changes() {
    let mut memory = Fills::new();
    let samples = owned((0..4).map(|i| sample(i, 10 + i as u64, 0)));
    let tags = Tags::with_previous(2, vec![(1, 12)]);
    let out = plan(&samples, &mut memory, &SHAPE, &tags);
    let cut: Vec<(u32, u32)> = out.iter().map(|s| (s.tag, s.count())).collect();
    assert_eq!(cut[0], (1, 2), "one window, two spool ids: {cut:?}");
    assert!(cut[1..].iter().all(|c| c.0 == 2), "{cut:?}");
    assert_eq!(cut[1..].iter().map(|c| c.1).sum::<u32>(), 2);
}

#[test]
fn size_cap_cuts_statements() {
    let mut memory = Fills::new();
    // A statement costs its samples and, once, the summaries of "v".
    let one = sample(0, 0, 20).bytes();
    let v = summary_cost("v");
    assert!(v + one * 2 <= 260 && v + one * 3 > 260, "{one}");
    let samples = owned((0..5).map(|i| sample(i, i as u64, 20)));
    let out = plan(&samples, &mut memory, &SHAPE, &ONE);
    let counts: Vec<u32> = out.iter().map(|s| s.count()).collect();
    assert_eq!(counts, vec![2, 2, 1]);
}

#[test]
fn a_sample_reads_back_from_its_document() {
    let s = sample(1234, 9, 3);
    let back = SampleRef::from_doc(&s.doc, 9).unwrap();
    assert_eq!(back, s.as_ref());
    let held = owned([sample(5, 1, 0), s.clone(), sample(7, 3, 9)]);
    assert_eq!(held.get(1), s.as_ref(), "compact samples read back whole");
    assert_eq!(held.len(), 3);
    assert_eq!(
        held.bytes(),
        held.iter().map(|x| x.bytes() as usize).sum::<usize>()
    );
}

/// MongoDB's rules for a collection sharded on `{sensorId, startTs}`
/// (hashed or not): an upsert (`updateOne`, `upsert: true`) needs every
/// shard key field as an equality in its filter, and no statement may
/// change a shard key field. Then each statement goes to one shard.
#[test]
fn every_statement_targets_one_shard_of_a_collection_sharded_on_sensor_and_window() {
    let samples = owned([sample(100, 1, 0), sample(900, 2, 0), sample(1500, 3, 0)]);
    let mut fills = Fills::default();
    let plan = plan(&samples, &mut fills, &SHAPE, &ONE);
    assert!(plan.len() >= 2, "two windows");
    for st in &plan {
        let d =
            bson::Document::try_from(st.to_bson("s-1", &samples, &SHAPE, true).as_ref()).unwrap();
        assert_eq!(d.get_bool("upsert"), Ok(true));
        assert!(!d.get_bool("multi").unwrap_or(false), "updateOne");
        let q = d.get_document("q").unwrap();
        assert_eq!(q.get("sensorId"), Some(&bson::Bson::String("s-1".into())));
        assert!(
            matches!(q.get("startTs"), Some(bson::Bson::DateTime(_))),
            "startTs an equality, not an operator: {q}"
        );
        for (op, fields) in d.get_document("u").unwrap() {
            let fields = fields.as_document().unwrap();
            for key in ["sensorId", "startTs"] {
                assert!(!fields.contains_key(key), "{op} writes {key}");
            }
        }
    }
}

/// Off a sharded cluster the filter is the `_id`, `closed` and the
/// caps; the sensor and window go in on insert, so the bucket an upsert
/// makes is the same either way.
#[test]
fn without_a_shard_key_the_sensor_and_window_are_set_on_insert() {
    let samples = owned([sample(1500, 1, 0)]);
    let plan = plan(&samples, &mut Fills::default(), &SHAPE, &ONE);
    let d = |key: bool| {
        bson::Document::try_from(plan[0].to_bson("s-1", &samples, &SHAPE, key).as_ref()).unwrap()
    };
    let keys = |d: &bson::Document, part: &[&str]| {
        let mut doc = d.clone();
        for p in part {
            doc = doc.get_document(p).unwrap().clone();
        }
        doc.keys().cloned().collect::<Vec<_>>()
    };
    let (routed, direct) = (d(true), d(false));
    assert_eq!(
        keys(&direct, &["q"]),
        ["_id", "closed", "count", "size"],
        "{direct}"
    );
    assert_eq!(
        keys(&direct, &["u", "$setOnInsert"]),
        ["sensorId", "startTs", "endTs"]
    );
    assert_eq!(keys(&routed, &["u", "$setOnInsert"]), ["endTs"]);
    let q = routed.get_document("q").unwrap();
    let on_insert = direct
        .get_document("u")
        .unwrap()
        .get_document("$setOnInsert")
        .unwrap();
    for k in ["sensorId", "startTs"] {
        assert_eq!(q.get(k), on_insert.get(k), "{k}");
    }
    assert_eq!(
        routed.get_document("q").unwrap().get("_id"),
        direct.get_document("q").unwrap().get("_id")
    );
}

/// Units ride in a sample's document to the statement, which sets
/// them on the bucket once (the latest of each field) and pushes the
/// samples without them.
#[test]
fn units_are_set_once_per_bucket_not_pushed_per_sample() {
    let reading = |ts: i64, unit: &str| Reading {
        sensor: "s".into(),
        ts_ms: ts,
        fields: vec![
            ("temp".into(), FieldValue::Num(1.0)),
            ("hum".into(), FieldValue::Num(2.0)),
        ],
        index: 0,
        units: vec![("temp".into(), unit.into()), ("hum".into(), "%RH".into())],
    };
    let samples: Samples = [
        Sample::encode(&reading(1, "Cel"), 1),
        Sample::encode(&reading(2, "K"), 2),
    ]
    .iter()
    .map(Sample::as_ref)
    .collect();
    let st = Statement {
        start_ms: 0,
        range: 0..2,
        pushed: 2,
        bytes: samples.bytes() as u32,
        base: None,
        tag: 1,
        seq: 0,
        leaves: false,
    };
    let d = bson::Document::try_from(st.to_bson("s", &samples, &SHAPE, false).as_ref()).unwrap();
    let u = d.get_document("u").unwrap();
    let set = u.get_document("$set").unwrap();
    assert_eq!(set, &bson::doc! { "units.temp": "K", "units.hum": "%RH" });
    let each = u
        .get_document("$push")
        .unwrap()
        .get_document("samples")
        .unwrap()
        .get_array("$each")
        .unwrap();
    for s in each {
        let s = s.as_document().unwrap();
        assert!(!s.contains_key(UNITS), "{s}");
        assert_eq!(s.get_f64("temp"), Ok(1.0));
    }
    // Without units, no $set.
    let plain = owned([sample(1, 4, 0)]);
    let st = Statement {
        range: 0..1,
        pushed: 1,
        ..st
    };
    let d = bson::Document::try_from(st.to_bson("s", &plain, &SHAPE, false).as_ref()).unwrap();
    assert!(!d.get_document("u").unwrap().contains_key("$set"));
}

/// A statement pushes what thinning kept and the points it stored
/// late, counts what it pushes against the caps, and summarises every
/// reading, dropped or not, once.
#[test]
fn a_thinned_statement_pushes_the_kept_and_summarises_every_reading() {
    let r = |ts_ms: i64, t: f64| Reading {
        sensor: "s".into(),
        ts_ms,
        fields: vec![
            ("t".into(), FieldValue::Num(t)),
            ("d".into(), FieldValue::Str("x".into())),
        ],
        ..Reading::default()
    };
    let rule = |dropped| Thinned {
        field: "t",
        kind: crate::thin::SWINGING_DOOR,
        bound: 0.5,
        dropped,
    };
    let only_t = |ts_ms: i64, t: f64| Reading {
        fields: vec![("t".into(), FieldValue::Num(t))],
        ..r(ts_ms, t)
    };
    let samples = owned([
        Sample::encode_thinned(&r(1, 1.0), 1, &[rule(false)]),
        Sample::encode_thinned(&only_t(2, 2.0), 2, &[rule(true)]),
        Sample::archive(2, &[("t", 2.0)], 3),
        Sample::encode_thinned(&only_t(3, 9.0), 4, &[rule(true)]),
    ]);
    let pushes: Vec<bool> = samples.iter().map(|s| s.pushes()).collect();
    assert_eq!(pushes, [true, false, true, false]);
    // palletd's own first field (Sparkplug B's death) without thinning.
    let death = Reading {
        fields: vec![("_state".into(), FieldValue::Str("offline".into()))],
        ..r(4, 0.0)
    };
    assert!(Sample::encode(&death, 5).as_ref().pushes());
    let shape = Shape {
        max_samples: 2,
        max_bytes: 10_000,
        ..SHAPE
    };
    let plan = plan(&samples, &mut Fills::new(), &shape, &ONE);
    assert_eq!(plan.len(), 1, "two pushed fit a bucket of two: {plan:?}");
    assert_eq!((plan[0].range.clone(), plan[0].count()), (0..4, 2));
    let d =
        bson::Document::try_from(plan[0].to_bson("s", &samples, &shape, false).as_ref()).unwrap();
    let u = d.get_document("u").unwrap();
    let pushed = u
        .get_document("$push")
        .unwrap()
        .get_document("samples")
        .unwrap();
    let pushed: Vec<String> = pushed
        .get_array("$each")
        .unwrap()
        .iter()
        .map(|s| format!("{}", s.as_document().unwrap()))
        .collect();
    assert_eq!(pushed.len(), 2);
    assert!(
        pushed[0].contains("\"d\": \"x\"") && pushed[0].contains("\"t\": 1"),
        "{pushed:?}"
    );
    assert!(
        !pushed[1].contains("_archive") && pushed[1].contains("\"t\": 2 }"),
        "{pushed:?}"
    );
    let inc = u.get_document("$inc").unwrap();
    assert_eq!(inc.get_i32("count"), Ok(2));
    assert_eq!(inc.get_i32("thinned"), Ok(1), "3 readings in 2 samples");
    assert_eq!(
        inc.get_f64("sum.t"),
        Ok(12.0),
        "1 + 2 + 9, the archived 2 once"
    );
    assert_eq!(inc.get_i32("n.t"), Ok(3));
    assert_eq!(inc.get_i32("thinning.t.stored"), Ok(2));
    assert_eq!(u.get_document("$max").unwrap().get_f64("max.t"), Ok(9.0));
    let set = u.get_document("$set").unwrap();
    assert_eq!(set.get_str("thinning.t.kind"), Ok("swinging_door"));
    assert_eq!(set.get_f64("thinning.t.deviation"), Ok(0.5));
    // What the latest value shows: the whole reading.
    let whole = samples.get(3).whole();
    assert_eq!(whole.get_f64("t").unwrap(), 9.0);
    assert!(whole.get("_thin").unwrap().is_none());
}

#[test]
fn statement_bson_has_caps_and_rollups() {
    let samples = owned([sample(1, 4, 0), sample(2, 2, 0)]);
    let st = Statement {
        start_ms: 0,
        range: 0..2,
        pushed: 2,
        bytes: 40,
        base: None,
        tag: 0xab,
        seq: 0,
        leaves: false,
    };
    let field = lsns_field(0xab);
    assert_eq!(field, "lsns.s000000ab");
    let d = bson::Document::try_from(st.to_bson("s", &samples, &SHAPE, true).as_ref()).unwrap();
    assert_eq!(d.get_document("q").unwrap().get_str("sensorId"), Ok("s"));
    let pushed = d
        .get_document("u")
        .unwrap()
        .get_document("$push")
        .unwrap()
        .get_document(&field)
        .unwrap()
        .get_array("$each")
        .unwrap()
        .clone();
    assert_eq!(
        pushed,
        vec![bson::Bson::Int64(2), bson::Bson::Int64(4)],
        "the first and last LSN of the statement"
    );
    assert!(ranges_hold(&[2, 4, 9, 9], 3));
    assert!(ranges_hold(&[2, 4, 9, 9], 9));
    assert!(!ranges_hold(&[2, 4, 9, 9], 5));
    let q = d.get_document("q").unwrap();
    assert_eq!(q.get_document("count").unwrap().get_i32("$lte").unwrap(), 3);
    assert_eq!(
        q.get_document("size").unwrap().get_i32("$lte").unwrap(),
        220
    );
    let u = d.get_document("u").unwrap();
    assert_eq!(
        u.get_document("$inc").unwrap().get_f64("sum.v").unwrap(),
        6.0
    );
    assert_eq!(u.get_document("$inc").unwrap().get_i32("n.v").unwrap(), 2);
    assert_eq!(
        u.get_document("$min").unwrap().get_f64("min.v").unwrap(),
        2.0
    );
    assert_eq!(
        u.get_document("$max").unwrap().get_f64("max.v").unwrap(),
        4.0
    );
    let each = u
        .get_document("$push")
        .unwrap()
        .get_document("samples")
        .unwrap()
        .get_array("$each")
        .unwrap();
    assert_eq!(each.len(), 2);
    assert!(d.get_bool("upsert").unwrap());
    // First and last by time, as {t, v}: $min and $max keep them.
    let edge = |op: &str, f: &str| {
        let e = u.get_document(op).unwrap().get_document(f).unwrap();
        (
            e.get_datetime("t").unwrap().timestamp_millis(),
            e.get_f64("v").unwrap(),
        )
    };
    assert_eq!(edge("$min", "first.v"), (1, 4.0));
    assert_eq!(edge("$max", "last.v"), (2, 2.0));
}

/// Of readings with the same time, the smallest value is first and the
/// largest last, as MongoDB orders `{t, v}` (the rollups' rule).
#[test]
fn first_and_last_break_ties_by_value() {
    let mut f = FieldSummary::of(5, 3.0);
    for (t, x) in [(5, -1.0), (9, 2.0), (9, 7.0), (5, 0.5), (9, 4.0)] {
        f.add(t, x);
    }
    assert_eq!((f.first, f.last), ((5, -1.0), (9, 7.0)));
    assert_eq!((f.n, f.sum, f.min, f.max), (6, 15.5, -1.0, 7.0));
}

/// A sample with numeric fields of these names.
fn sample_with(ts_ms: i64, lsn: u64, names: &[String]) -> Sample {
    let fields = names
        .iter()
        .map(|n| (n.clone(), FieldValue::Num(lsn as f64)))
        .collect();
    Sample::encode(
        &Reading {
            sensor: "s".into(),
            ts_ms,
            fields,
            ..Reading::default()
        },
        lsn,
    )
}

proptest! {
    /// What a bucket really holds, its samples and a summary entry per
    /// distinct numeric name in each of its summaries, is within the
    /// size palletd counts for it, and that within `max_bytes`, however
    /// many distinct names its samples bring (before, `size` counted
    /// the samples alone, and a bucket of many names could pass 16 MB).
    #[test]
    fn a_bucket_holds_no_more_than_its_counted_size(
        batches in proptest::collection::vec(
            proptest::collection::vec((0i64..2000, proptest::collection::vec(0usize..40, 1..4)), 1..20), 1..6),
    ) {
        let shape = Shape { window_ms: 1000, max_samples: 50, max_bytes: 2000 };
        let mut db = Db::default();
        let mut memory = Fills::new();
        let mut all = std::collections::HashMap::new();
        let mut lsn = 0u64;
        for batch in &batches {
            let made: Vec<Sample> = batch.iter().map(|(ts, names)| {
                lsn += 1;
                let names: Vec<String> = names.iter().map(|i| format!("field_{i}_{}", "x".repeat(i % 9))).collect();
                sample_with(*ts, lsn, &names)
            }).filter(|s| shape.check(s.as_ref()).is_ok()).collect();
            let samples = owned(made.iter().cloned());
            for s in made { all.insert(s.lsn, s); }
            let mut out = plan(&samples, &mut memory, &shape, &ONE);
            for i in 0..out.len() {
                db.write(&mut out, i, &samples, &shape, &mut memory);
            }
        }
        for b in &db.buckets {
            let samples: Vec<&Sample> = b.msgs.iter().map(|l| &all[l]).collect();
            let names: std::collections::HashSet<&str> = samples.iter().flat_map(|s| s.as_ref().nums().map(|(n, _)| n)).collect();
            // An entry per name in each of sum, n, min, max and the
            // seal's avg, and its {t, v} in first and last, as BSON
            // writes them.
            let entry = |n: &str| bson::to_vec(&bson::doc! { n: 0.0f64 }).unwrap().len() as u32 - 5;
            let edge = |n: &str| {
                let e = bson::doc! { n: { "t": bson::DateTime::from_millis(0), "v": 0.0f64 } };
                bson::to_vec(&e).unwrap().len() as u32 - 5
            };
            let held = samples.iter().map(|s| s.bytes()).sum::<u32>()
                + names.iter().map(|n| 5 * entry(n) + 2 * edge(n)).sum::<u32>();
            prop_assert!(held <= b.size, "holds {} for a counted size of {}", held, b.size);
            prop_assert!(b.size <= shape.max_bytes);
        }
    }

    /// No sample lost or duplicated, caps never exceeded, per-sensor
    /// arrival order kept within each bucket, whatever the memory knows.
    #[test]
    fn planning_keeps_every_sample_once_within_caps(
        flushes in proptest::collection::vec(
            proptest::collection::vec((0i64..4000, 0usize..80), 0..30), 1..8),
        forget in proptest::collection::vec(any::<bool>(), 8),
    ) {
        let mut db = Db::default();
        let mut memory = Fills::new();
        let mut msg = 0u64;
        let mut sent = Vec::new();
        for (i, batch) in flushes.iter().enumerate() {
            if forget[i] { memory = Fills::new(); }
            let samples = owned(batch.iter().map(|(ts, pad)| { msg += 1; sent.push(msg); sample(*ts, msg, *pad) }));
            let known = memory.clone();
            let mut out = plan(&samples, &mut memory, &SHAPE, &ONE);
            prop_assert_eq!(out.iter().flat_map(|st| st.range.clone()).collect::<Vec<_>>(), (0..samples.len()).collect::<Vec<_>>());
            for i in 0..out.len() {
                let st = out[i].clone();
                prop_assert!(st.count() >= 1);
                prop_assert!(st.range.clone().all(|i| SHAPE.window_start(samples.get(i).ts_ms) == st.start_ms));
                let collisions = db.write(&mut out, i, &samples, &SHAPE, &mut memory);
                // In a window palletd knows, a statement collides at
                // most once: its bucket number is the newest, though
                // its fill may be short (an append of unknown fill
                // before it in the same flush), and the next is free.
                prop_assert!(collisions <= 1 || !known.contains_key(&st.start_ms), "{} collisions", collisions);
            }
        }
        let mut stored: Vec<u64> = db.buckets.iter().flat_map(|b| b.msgs.iter().copied()).collect();
        for b in &db.buckets {
            prop_assert!(b.count <= SHAPE.max_samples && b.size <= SHAPE.max_bytes);
            prop_assert!(b.msgs.windows(2).all(|w| w[0] < w[1]), "arrival order kept");
        }
        stored.sort();
        prop_assert_eq!(stored, sent);
    }

    /// With closer runs between flushes (sealing every window that
    /// ended by a cutoff and forgetting its memory), every sample is
    /// still stored exactly once, sealed buckets are never written
    /// again, and no bucket exceeds a cap.
    #[test]
    fn closer_runs_never_lose_duplicate_or_overfill(
        flushes in proptest::collection::vec(
            (proptest::collection::vec((0i64..6000, 0usize..60), 0..20), proptest::option::of(0i64..7000)), 1..10),
    ) {
        let mut db = Db::default();
        let mut memory = Fills::new();
        let mut msg = 0u64;
        let mut sent = Vec::new();
        for (batch, closer_cutoff) in &flushes {
            let samples = owned(batch.iter().map(|(ts, pad)| { msg += 1; sent.push(msg); sample(*ts, msg, *pad) }));
            let mut out = plan(&samples, &mut memory, &SHAPE, &ONE);
            for i in 0..out.len() {
                let sealed_before: Vec<(u32, usize)> = db.buckets.iter().filter(|b| b.closed).map(|b| (b.count, b.msgs.len())).collect();
                db.write(&mut out, i, &samples, &SHAPE, &mut memory);
                let sealed_after: Vec<(u32, usize)> = db.buckets.iter().filter(|b| b.closed).map(|b| (b.count, b.msgs.len())).collect();
                prop_assert_eq!(sealed_before, sealed_after, "a sealed bucket was written");
            }
            if let Some(cutoff) = closer_cutoff {
                for b in db.buckets.iter_mut().filter(|b| b.start + SHAPE.window_ms <= *cutoff) {
                    b.closed = true;
                }
                memory.retain(|start, _| start + SHAPE.window_ms > *cutoff);
            }
        }
        for b in &db.buckets {
            prop_assert!(b.count <= SHAPE.max_samples && b.size <= SHAPE.max_bytes);
        }
        let mut stored: Vec<u64> = db.buckets.iter().flat_map(|b| b.msgs.iter().copied()).collect();
        stored.sort();
        prop_assert_eq!(stored, sent);
    }
}

/// Two empty lookups in a row make a sensor quiet; a bucket found, or
/// one met by a collision, ends it.
#[test]
fn a_sensor_is_quiet_after_two_empty_lookups_until_a_bucket_turns_up() {
    let mut f = Fills::new();
    f.looked_up(false);
    assert!(!f.quiet());
    f.looked_up(false);
    assert!(f.quiet());
    f.surprised();
    assert!(!f.quiet());
    f.looked_up(false);
    f.looked_up(true);
    f.looked_up(false);
    assert!(!f.quiet());
    f.looked_up(false);
    f.retain(|_, _| false);
    assert!(f.quiet(), "forgetting windows keeps what lookups found");
}

/// A window newer than every one palletd knows of a sensor is taken to
/// be empty (no lookup at each window's start for a live sensor); an
/// older one, or any after a collision until the next lookup, is not.
#[test]
fn a_window_newer_than_every_known_one_is_taken_to_be_empty() {
    let mut f = Fills::new();
    assert!(!f.assume_empty(3_600_000), "nothing known: look it up");
    f.looked_up(true);
    f.insert(3_600_000, Fill::default());
    assert!(f.assume_empty(7_200_000));
    assert!(!f.assume_empty(0), "an older window may have buckets");
    f.insert(0, Fill::default());
    assert!(f.assume_empty(7_200_000));
    assert!(!f.assume_empty(1_800_000), "between known windows");
    f.surprised();
    assert!(!f.assume_empty(7_200_000), "a collision: look up again");
    f.looked_up(true);
    assert!(f.assume_empty(7_200_000));
}
