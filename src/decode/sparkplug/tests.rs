//! The Sparkplug B decoder against hand-made payloads: births, deaths,
//! data by alias, limits, sequence numbers, rebirth requests.

use super::metric::float_as_written;
use super::*;
use crate::decode::{
    Decoder, Limits, PayloadFormat, Subscription, TopicPattern, DEFAULT_SENSOR_ID_PATTERN,
};
use proptest::prelude::*;

const NOW: i64 = 1_787_234_400_000;

fn decoder(rebirth: bool) -> Decoder {
    let limits = Limits {
        max_payload_size: 1 << 20,
        max_lateness_ms: 7 * 86_400_000,
        max_future_ms: 300_000,
        max_samples_per_message: 100,
        max_fields_per_sample: 4,
        max_field_name_length: 64,
        max_string_length: 32,
        sensor_id_pattern: regex::Regex::new(&format!("^(?:{DEFAULT_SENSOR_ID_PATTERN})$"))
            .unwrap(),
        max_sparkplug_nodes: 100,
        max_sparkplug_devices_per_node: 100,
        max_sparkplug_aliases: 10_000,
        max_sparkplug_bytes: 64 << 20,
    };
    Decoder::new(
        vec![Subscription {
            rebirth_min_interval: rebirth.then(|| std::time::Duration::from_secs(60)),
            ..Subscription::new(
                TopicPattern::parse("spBv1.0/#").unwrap(),
                PayloadFormat::SparkplugB,
            )
        }],
        limits,
    )
}

fn metric(name: Option<&str>, alias: u64, datatype: DataType, value: Value) -> proto::Metric {
    proto::Metric {
        name: name.map(Into::into),
        alias: Some(alias),
        datatype: Some(datatype as u32),
        value: Some(value),
        ..Default::default()
    }
}

fn payload(seq: u64, metrics: Vec<proto::Metric>) -> Vec<u8> {
    proto::Payload {
        timestamp: Some(NOW as u64),
        seq: Some(seq),
        metrics,
        ..Default::default()
    }
    .encode_to_vec()
}

fn nbirth(bd_seq: u64) -> Vec<u8> {
    payload(
        0,
        vec![
            metric(Some("bdSeq"), 0, DataType::Int64, Value::LongValue(bd_seq)),
            metric(Some("Temp.C"), 1, DataType::Float, Value::FloatValue(20.5)),
            metric(Some("Count"), 2, DataType::Int16, Value::IntValue(0xFFFF)),
        ],
    )
}

/// The fields of samples at one time as one reading.
fn merged(readings: &[Reading]) -> Reading {
    let mut r = readings[0].clone();
    for other in &readings[1..] {
        assert_eq!((&other.sensor, other.ts_ms), (&r.sensor, r.ts_ms));
        r.fields.extend(other.fields.iter().cloned());
    }
    r
}

fn field<'a>(r: &'a Reading, name: &str) -> Option<&'a FieldValue> {
    r.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
}

/// A Float is stored as the decimal the device meant (the shortest one
/// that reads back as the same f32), not as its exact value widened.
#[test]
fn a_float_is_stored_as_the_shortest_decimal_of_its_f32() {
    assert_eq!(f64::from(18.85f32), 18.850000381469727);
    assert_eq!(float_as_written(18.85), 18.85);
    assert_eq!(float_as_written(0.1), 0.1);
    assert_eq!(float_as_written(-3.4e38), -3.4e38);
    assert_eq!(float_as_written(f32::MIN_POSITIVE), 1.1754944e-38);
    for x in [18.85f32, 0.1, 1.0 / 3.0, 16_777_217.0, f32::MAX, -0.0] {
        assert_eq!(float_as_written(x) as f32, x, "reads back as the same f32");
    }
    let mut d = decoder(false);
    d.decode("spBv1.0/G/NBIRTH/N", &nbirth(3), NOW);
    let data = payload(
        1,
        vec![proto::Metric {
            alias: Some(1),
            value: Some(Value::FloatValue(18.85)),
            ..Default::default()
        }],
    );
    let out = d.decode("spBv1.0/G/NDATA/N", &data, NOW);
    assert_eq!(
        field(&out.readings[0], "Temp%2EC"),
        Some(&FieldValue::Num(18.85))
    );
}

/// BIRTHs teach at most the nodes, aliases and estimated bytes in all
/// the limits allow: beyond, the edge nodes heard from the longest ago are
/// forgotten (evicted) to make room, so junk nodes never keep a real one
/// out; a node that alone would pass them, or a new device beyond
/// `max_sparkplug_devices_per_node`, is refused, the state unchanged.
/// Before, a new node beyond the limits was refused for good (junk nodes
/// kept their places across restarts), and a refused BIRTH of a new node
/// left it behind, empty.
#[test]
fn births_teach_no_more_than_the_limits_and_evict_the_longest_silent() {
    let cause = |out: &crate::decode::Decoded| out.errors.first().map(|e| e.cause());
    let at = |s: i64| NOW + s * 1000;
    let mut d = decoder(false);
    d.limits.max_sparkplug_nodes = 2;
    d.limits.max_sparkplug_devices_per_node = 1;
    assert_eq!(
        cause(&d.decode("spBv1.0/G/NBIRTH/N1", &nbirth(0), at(0))),
        None
    );
    assert_eq!(
        cause(&d.decode("spBv1.0/G/NBIRTH/N2", &nbirth(0), at(2))),
        None
    );
    // N1 speaks again: N2 is now the longest silent.
    let data = payload(
        1,
        vec![metric(None, 1, DataType::Float, Value::FloatValue(1.0))],
    );
    assert_eq!(cause(&d.decode("spBv1.0/G/NDATA/N1", &data, at(4))), None);
    let third = d.decode("spBv1.0/G/NBIRTH/N3", &nbirth(0), at(6));
    assert_eq!(cause(&third), None);
    assert_eq!(third.sparkplug.evicted, 1);
    assert!(!third.sparkplug.changes.is_empty());
    assert_eq!(d.sparkplug_state().size().0, 2);
    // N2 was forgotten: its DATA cannot be named.
    let out = d.decode("spBv1.0/G/NDATA/N2", &data, at(7));
    assert_eq!(cause(&out), Some("unknown_alias"));
    assert_eq!(cause(&d.decode("spBv1.0/G/NDATA/N1", &data, at(7))), None);
    assert_eq!(
        cause(&d.decode("spBv1.0/G/DBIRTH/N1/D1", &nbirth(0), at(8))),
        None
    );
    assert_eq!(
        cause(&d.decode("spBv1.0/G/DBIRTH/N1/D2", &nbirth(0), at(8))),
        Some("too_many_sparkplug_devices")
    );
}

/// BIRTHs teach at most `max_sparkplug_aliases` in all: a node's new
/// BIRTH replaces its own, the longest silent node goes, and one node
/// that alone would pass the limit is refused and not kept.
#[test]
fn births_teach_no_more_aliases_than_the_limit() {
    let cause = |out: &crate::decode::Decoded| out.errors.first().map(|e| e.cause());
    let at = |s: i64| NOW + s * 1000;
    // Three aliases per BIRTH, at most 7 in all.
    let mut d = decoder(false);
    d.limits.max_sparkplug_aliases = 7;
    d.decode("spBv1.0/G/NBIRTH/N1", &nbirth(0), at(0));
    d.decode("spBv1.0/G/NBIRTH/N2", &nbirth(0), at(2));
    // Replacing a node's own aliases is no growth.
    let again = d.decode("spBv1.0/G/NBIRTH/N2", &nbirth(2), at(3));
    assert_eq!((cause(&again), again.sparkplug.evicted), (None, 0));
    // N1's device would make 9: N2, silent the longest, goes.
    let out = d.decode("spBv1.0/G/DBIRTH/N1/D1", &nbirth(0), at(4));
    assert_eq!((cause(&out), out.sparkplug.evicted), (None, 1));
    assert_eq!(d.sparkplug_state().size(), (1, 1, 6));
    // A node that alone would pass the limit is refused, and not kept.
    let big: Vec<proto::Metric> = (0..8)
        .map(|a| {
            metric(
                Some(&format!("m{a}")),
                a,
                DataType::Double,
                Value::DoubleValue(1.0),
            )
        })
        .collect();
    let out = d.decode("spBv1.0/G/NBIRTH/BIG", &payload(0, big), at(5));
    assert_eq!(cause(&out), Some("too_many_sparkplug_aliases"));
    assert_eq!(d.sparkplug_state().size(), (1, 1, 6), "nothing changed");
}

/// BIRTHs teach at most `max_sparkplug_bytes` in all (recounted the same
/// at load); one node alone over them is refused and not kept.
#[test]
fn births_teach_no_more_bytes_than_the_limit() {
    let cause = |out: &crate::decode::Decoded| out.errors.first().map(|e| e.cause());
    let at = |s: i64| NOW + s * 1000;
    let data = payload(
        1,
        vec![metric(None, 1, DataType::Float, Value::FloatValue(1.0))],
    );
    // Bytes: each node of three aliases is 820 bytes here.
    let mut d = decoder(false);
    d.limits.max_sparkplug_bytes = 2_500;
    for n in 0..10 {
        let out = d.decode(&format!("spBv1.0/G/NBIRTH/N{n}"), &nbirth(0), at(n));
        assert_eq!(cause(&out), None, "N{n}");
        let state = d.sparkplug_state();
        assert!(state.bytes() <= 2_500, "{} after N{n}", state.bytes());
    }
    let (nodes, _, _) = d.sparkplug_state().size();
    assert_eq!(nodes, 3, "{} bytes", d.sparkplug_state().bytes());
    // The newest three stayed.
    for n in 7..10 {
        let out = d.decode(&format!("spBv1.0/G/NDATA/N{n}"), &data, at(20));
        assert_eq!(cause(&out), None, "N{n}");
    }
    let saved = load(&snapshot(d.sparkplug_state(), 0)).unwrap().0;
    assert_eq!(
        saved.bytes(),
        d.sparkplug_state().bytes(),
        "recounted at load"
    );
    let out = d.decode(
        "spBv1.0/G/NBIRTH/N1",
        &payload(
            0,
            (0..30)
                .map(|a| {
                    metric(
                        Some(&format!("metric{a}")),
                        a,
                        DataType::Double,
                        Value::DoubleValue(1.0),
                    )
                })
                .collect(),
        ),
        at(21),
    );
    assert_eq!(
        cause(&out),
        Some("too_many_sparkplug_aliases"),
        "alone over the bytes"
    );
    assert_eq!(d.sparkplug_state().size().0, 3, "and not kept");
}

/// A metric name too long for a field is not learnt from a BIRTH.
#[test]
fn births_do_not_learn_names_too_long_for_a_field() {
    // A name too long for a field is not learnt.
    let mut d = decoder(false);
    d.limits.max_field_name_length = 5;
    let out = d.decode("spBv1.0/G/NBIRTH/N1", &nbirth(0), NOW);
    assert!(
        out.errors
            .iter()
            .any(|e| e.cause() == "field_name_too_long"),
        "{:?}",
        out.errors
    );
    assert_eq!(
        d.sparkplug_state().size().2,
        2,
        "bdSeq and Count, not Temp%2EC"
    );
    let saved = load(&snapshot(d.sparkplug_state(), 0)).unwrap().0;
    assert_eq!(
        saved.aliases,
        d.sparkplug_state().aliases,
        "recounted at load"
    );
}

/// A payload's metrics are counted before any is decoded.
#[test]
fn too_many_metrics_are_refused_before_they_are_decoded() {
    let mut d = decoder(false);
    let many: Vec<proto::Metric> = (0..401)
        .map(|i| metric(Some("m"), i, DataType::Double, Value::DoubleValue(1.0)))
        .collect();
    let out = d.decode("spBv1.0/G/NBIRTH/N1", &payload(0, many), NOW);
    assert_eq!(
        out.errors[0].cause(),
        "too_many_samples",
        "{:?}",
        out.errors
    );
    assert_eq!(count_metrics(&nbirth(0), 10), Ok(3));
    assert!(count_metrics(&[0x12, 0xff], 10).is_err(), "cut short");
}

#[test]
fn birth_then_data_by_alias() {
    let mut d = decoder(false);
    let out = d.decode("spBv1.0/G/NBIRTH/N", &nbirth(3), NOW);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert!(!out.sparkplug.changes.is_empty());
    // Five fields over samples of at most four.
    assert_eq!(out.readings.len(), 2);
    let r = &merged(&out.readings);
    assert_eq!(r.sensor, "G:N");
    assert_eq!(field(r, "Temp%2EC"), Some(&FieldValue::Num(20.5)));
    assert_eq!(field(r, "Count"), Some(&FieldValue::Num(-1.0)));
    assert_eq!(field(r, STATE), Some(&FieldValue::Str("online".into())));
    assert_eq!(field(r, BD_SEQ), Some(&FieldValue::Int(3)));
    let data = payload(
        1,
        vec![proto::Metric {
            alias: Some(1),
            timestamp: Some(NOW as u64 + 5),
            value: Some(Value::FloatValue(21.0)),
            ..Default::default()
        }],
    );
    let out = d.decode("spBv1.0/G/NDATA/N", &data, NOW);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert!(out.sparkplug.changes.is_empty());
    assert_eq!(
        out.readings,
        vec![Reading {
            sensor: "G:N".into(),
            ts_ms: NOW + 5,
            fields: vec![("Temp%2EC".into(), FieldValue::Num(21.0))],
            index: 0,
            units: Vec::new(),
        }]
    );
}

#[test]
fn the_state_survives_serialization() {
    let mut d = decoder(false);
    d.decode("spBv1.0/G/NBIRTH/N", &nbirth(1), NOW);
    let saved = snapshot(d.sparkplug_state(), 0);
    let mut fresh = decoder(false);
    fresh.set_sparkplug_state(load(&saved).unwrap().0);
    let data = payload(
        1,
        vec![proto::Metric {
            alias: Some(2),
            value: Some(Value::IntValue(7)),
            ..Default::default()
        }],
    );
    let out = fresh.decode("spBv1.0/G/NDATA/N", &data, NOW);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(
        field(&out.readings[0], "Count"),
        Some(&FieldValue::Num(7.0))
    );
}

#[test]
fn unknown_alias_is_its_own_rejection_and_asks_for_a_rebirth_once() {
    let mut d = decoder(true);
    let data = payload(
        5,
        vec![proto::Metric {
            alias: Some(9),
            value: Some(Value::IntValue(7)),
            ..Default::default()
        }],
    );
    let out = d.decode("spBv1.0/G/NDATA/N", &data, NOW);
    assert_eq!(out.errors[0].cause(), "unknown_alias");
    assert_eq!(out.sparkplug.rebirth.as_deref(), Some("spBv1.0/G/NCMD/N"));
    // Only a BIRTH adds a node to what is saved (fuzz regression).
    assert_eq!(d.sparkplug_state().size(), (0, 0, 0));
    assert!(out.sparkplug.changes.is_empty());
    let out = d.decode("spBv1.0/G/NDATA/N", &data, NOW + 1000);
    assert_eq!(out.errors[0].cause(), "unknown_alias");
    assert_eq!(out.sparkplug.rebirth, None, "rate-limited");
    d.decode("spBv1.0/G/NBIRTH/N", &nbirth(1), NOW);
    // A known alias and an unknown one: the known is stored.
    let mixed = payload(
        1,
        vec![
            proto::Metric {
                alias: Some(1),
                value: Some(Value::FloatValue(1.0)),
                ..Default::default()
            },
            proto::Metric {
                alias: Some(42),
                value: Some(Value::FloatValue(1.0)),
                ..Default::default()
            },
        ],
    );
    let out = d.decode("spBv1.0/G/NDATA/N", &mixed, NOW + 61_000);
    assert_eq!(out.readings.len(), 1);
    assert_eq!(out.errors.len(), 1);
    assert_eq!(out.errors[0].cause(), "unknown_alias");
    assert!(out.sparkplug.rebirth.is_some());
}

#[test]
fn nodes_never_born_do_not_grow_memory_without_bound() {
    let mut d = decoder(true);
    let data = payload(1, vec![]);
    for i in 0..MAX_UNBORN + 50 {
        let out = d.decode(&format!("spBv1.0/G/NDATA/n{i}"), &data, NOW);
        assert!(out.sparkplug.rebirth.is_some());
    }
    assert_eq!(d.sparkplug.unborn_asked.len(), MAX_UNBORN);
    let death = d.decode("spBv1.0/G/NDEATH/never", &payload(0, vec![]), NOW);
    assert_eq!(death.readings[0].sensor, "G:never");
    assert_eq!(d.sparkplug_state().size(), (0, 0, 0));
}

#[test]
fn sequence_gaps_and_late_messages_are_counted_and_stored() {
    let mut d = decoder(false);
    d.decode("spBv1.0/G/NBIRTH/N", &nbirth(1), NOW);
    let data = |seq| {
        payload(
            seq,
            vec![proto::Metric {
                alias: Some(1),
                value: Some(Value::FloatValue(seq as f32)),
                ..Default::default()
            }],
        )
    };
    let gaps = |d: &mut Decoder, seq| {
        let out = d.decode("spBv1.0/G/NDATA/N", &data(seq), NOW);
        assert_eq!(out.readings.len(), 1);
        (out.sparkplug.seq_gaps, out.sparkplug.out_of_order)
    };
    assert_eq!(gaps(&mut d, 1), (0, 0));
    assert_eq!(gaps(&mut d, 4), (1, 0));
    assert_eq!(gaps(&mut d, 3), (0, 1));
    assert_eq!(gaps(&mut d, 5), (0, 0));
    for s in 6..=255 {
        assert_eq!(gaps(&mut d, s), (0, 0));
    }
    assert_eq!(gaps(&mut d, 0), (0, 0), "255 wraps to 0");
}

#[test]
fn deaths_mark_node_and_devices_offline_by_bd_seq() {
    let mut d = decoder(false);
    d.decode("spBv1.0/G/NBIRTH/N", &nbirth(7), NOW);
    let dbirth = payload(
        1,
        vec![metric(
            Some("on"),
            1,
            DataType::Boolean,
            Value::BooleanValue(true),
        )],
    );
    let out = d.decode("spBv1.0/G/DBIRTH/N/D1", &dbirth, NOW);
    assert_eq!(out.readings[0].sensor, "G:N:D1");
    let death = |bd| {
        payload(
            0,
            vec![metric(
                Some("bdSeq"),
                0,
                DataType::Int64,
                Value::LongValue(bd),
            )],
        )
    };
    let stale = d.decode("spBv1.0/G/NDEATH/N", &death(6), NOW + 10);
    assert!(stale.readings.is_empty());
    assert!(stale.sparkplug.stale_death);
    let out = d.decode("spBv1.0/G/NDEATH/N", &death(7), NOW + 10);
    let sensors: Vec<&str> = out.readings.iter().map(|r| r.sensor.as_str()).collect();
    assert_eq!(sensors, vec!["G:N", "G:N:D1"]);
    for r in &out.readings {
        assert_eq!(r.ts_ms, NOW + 10);
        assert_eq!(field(r, STATE), Some(&FieldValue::Str("offline".into())));
        assert_eq!(field(r, BD_SEQ), Some(&FieldValue::Int(7)));
    }
    let ddeath = d.decode("spBv1.0/G/DDEATH/N/D1", &payload(2, vec![]), NOW);
    assert_eq!(
        field(&ddeath.readings[0], STATE),
        Some(&FieldValue::Str("offline".into()))
    );
}

#[test]
fn types_historical_skipped_and_split() {
    let mut d = decoder(false);
    let mut hist = metric(Some("old"), 5, DataType::Double, Value::DoubleValue(1.5));
    hist.is_historical = Some(true);
    hist.timestamp = Some(NOW as u64 - 60_000);
    let metrics = vec![
        metric(Some("a"), 1, DataType::Int8, Value::IntValue(0xFF)),
        metric(Some("b"), 2, DataType::UInt64, Value::LongValue(1 << 40)),
        metric(
            Some("c"),
            3,
            DataType::String,
            Value::StringValue("x".into()),
        ),
        metric(
            Some("d"),
            4,
            DataType::DateTime,
            Value::LongValue(NOW as u64),
        ),
        metric(
            Some("set"),
            6,
            DataType::Boolean,
            Value::BooleanValue(false),
        ),
        metric(
            Some("table"),
            7,
            DataType::Int8,
            Value::DatasetValue(proto::Opaque {}),
        ),
        proto::Metric {
            name: Some("blob".into()),
            datatype: Some(17),
            value: Some(Value::BytesValue(vec![1, 2])),
            ..Default::default()
        },
        proto::Metric {
            name: Some("gone".into()),
            datatype: Some(10),
            is_null: Some(true),
            ..Default::default()
        },
        hist,
    ];
    let out = d.decode("spBv1.0/G/NBIRTH/N", &payload(0, metrics), NOW);
    assert_eq!(out.sparkplug.skipped, vec!["Bytes"]);
    // "table" says Int8 but carries a dataset: a bad field, not stored.
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    assert_eq!(out.errors[0].cause(), "bad_field");
    let old = &out.readings[0];
    assert_eq!(old.ts_ms, NOW - 60_000);
    assert_eq!(field(old, "old"), Some(&FieldValue::Num(1.5)));
    assert_eq!(field(old, HISTORICAL), Some(&FieldValue::Bool(true)));
    // 5 metrics and the state flags at NOW: split into samples of 4.
    let now: Vec<&Reading> = out.readings.iter().filter(|r| r.ts_ms == NOW).collect();
    assert_eq!(now.len(), 2);
    assert!(now.iter().all(|r| r.fields.len() <= 4));
    let all: Vec<&(String, FieldValue)> = now.iter().flat_map(|r| &r.fields).collect();
    assert!(all.contains(&&("a".into(), FieldValue::Num(-1.0))));
    assert!(all.contains(&&("b".into(), FieldValue::Num((1u64 << 40) as f64))));
    assert!(all.contains(&&("c".into(), FieldValue::Str("x".into()))));
    assert!(all.contains(&&("d".into(), FieldValue::Date(NOW))));
    assert!(all.contains(&&("set".into(), FieldValue::Bool(false))));
}

#[test]
fn commands_and_host_state_are_left_alone_and_bad_topics_rejected() {
    let mut d = decoder(false);
    for topic in [
        "spBv1.0/G/NCMD/N",
        "spBv1.0/G/DCMD/N/D",
        "spBv1.0/STATE/host",
    ] {
        let out = d.decode(topic, b"\x01\x02garbage", NOW);
        assert!(out.readings.is_empty() && out.errors.is_empty(), "{topic}");
    }
    for topic in [
        "spBv1.0/G/XDATA/N",
        "spBv1.0/G/NDATA",
        "spBv1.0/G/DDATA/N",
        "spBv1.0/G/NDATA/N/D",
    ] {
        let out = d.decode(topic, &nbirth(1), NOW);
        assert_eq!(out.errors[0].cause(), "bad_payload", "{topic}");
    }
    let out = d.decode("spBv1.0/G/NBIRTH/N", b"\xff\xff\xff", NOW);
    assert_eq!(out.errors[0].cause(), "bad_payload");
}

#[test]
fn field_names_of_awkward_metrics() {
    for (metric, field) in [
        ("Inputs/Temp", "Inputs/Temp"),
        ("a.b", "a%2Eb"),
        ("$set", "%24set"),
        ("_x", "%5Fx"),
        ("ts", "%74s"),
        ("lsn", "%6Csn"),
        ("100%", "100%25"),
        ("a$b_c", "a$b_c"),
    ] {
        assert_eq!(field_name(metric), field);
        assert_eq!(metric_name(field).as_deref(), Some(metric));
    }
    assert_eq!(metric_name(STATE), None);
}

proptest! {
    #[test]
    fn field_names_are_valid_distinct_and_reversible(name in "\\PC{1,12}|[._$%tsln]{1,6}") {
        let f = field_name(&name);
        prop_assert!(crate::decode::check_field_name(&f).is_ok(), "{f:?}");
        prop_assert!(!f.starts_with('_'));
        prop_assert!(!RESERVED.contains(&f.as_ref()));
        prop_assert_eq!(metric_name(&f), Some(name));
    }

    #[test]
    fn decode_never_panics(kind in "(N|D)(BIRTH|DATA|DEATH)", bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut d = decoder(true);
        let topic = if kind.starts_with('D') { format!("spBv1.0/G/{kind}/N/D") } else { format!("spBv1.0/G/{kind}/N") };
        let _ = d.decode(&topic, &bytes, NOW);
    }

    /// Whatever BIRTHs, DATA and DEATHs come, under small limits, the
    /// counts kept up to date are the state's own, and within the limits.
    #[test]
    fn the_counts_kept_are_the_states_own(steps in proptest::collection::vec((0..6usize, 0..4u8, 0..3u8, 0..6u64, 0..40i64), 1..60)) {
        let mut d = decoder(true);
        d.limits.max_sparkplug_nodes = 4;
        d.limits.max_sparkplug_devices_per_node = 2;
        d.limits.max_sparkplug_aliases = 20;
        d.limits.max_sparkplug_bytes = 3_000;
        for (node, kind, device, aliases, second) in steps {
            let metrics: Vec<proto::Metric> = (0..aliases)
                .map(|a| metric(Some(&format!("m{a}")), a, DataType::Double, Value::DoubleValue(1.0)))
                .collect();
            let body = payload(0, metrics);
            let topic = match kind {
                0 => format!("spBv1.0/G/NBIRTH/N{node}"),
                1 => format!("spBv1.0/G/DBIRTH/N{node}/D{device}"),
                2 => format!("spBv1.0/G/NDATA/N{node}"),
                _ => format!("spBv1.0/G/NDEATH/N{node}"),
            };
            let _ = d.decode(&topic, &body, NOW + second * 1000);
            let state = d.sparkplug_state();
            let recounted = load(&snapshot(state, 0)).unwrap().0;
            prop_assert_eq!(state.bytes(), recounted.bytes());
            prop_assert_eq!(state.aliases, recounted.aliases);
            prop_assert_eq!(state.silence.len(), state.nodes.len());
            prop_assert!(state.bytes() <= 3_000 && state.aliases <= 20 && state.nodes.len() <= 4);
        }
    }

    /// A snapshot made a node at a time while BIRTHs, DEATHs and
    /// evictions go on, with every change from its start replayed onto it,
    /// is the state at the end (what a start after a crash reads).
    #[test]
    fn a_snapshot_made_while_the_state_changes_and_its_changes_replayed_is_the_state(
        steps in proptest::collection::vec((0..6usize, 0..5u8, 0..3u8, 0..4u64), 1..60),
        begin in 0..60usize,
    ) {
        let mut d = decoder(true);
        d.limits.max_sparkplug_nodes = 4;
        d.limits.max_sparkplug_devices_per_node = 2;
        d.limits.max_sparkplug_aliases = 20;
        let mut changes: Vec<Change> = Vec::new();
        // (index of the first change it must replay, lines so far, the key
        // to go on after, done).
        let mut snap: Option<(usize, Vec<u8>, Option<SnapshotAt>, bool)> = None;
        for (i, (node, kind, device, aliases)) in steps.iter().enumerate() {
            if i == begin.min(steps.len() - 1) {
                snap = Some((changes.len(), snapshot_header(7), None, false));
            }
            if let Some((_, lines, after, done)) = &mut snap {
                if !*done {
                    let next = d.sparkplug_state().snapshot_lines(after.as_ref(), lines, 1);
                    *done = next.is_none();
                    *after = next;
                }
            }
            let metrics: Vec<proto::Metric> = (0..*aliases)
                .map(|a| metric(Some(&format!("m{a}{kind}")), a, DataType::Double, Value::DoubleValue(1.0)))
                .collect();
            let topic = match kind {
                0 => format!("spBv1.0/G/NBIRTH/N{node}"),
                1 => format!("spBv1.0/G/DBIRTH/N{node}/D{device}"),
                2 => format!("spBv1.0/G/DDEATH/N{node}/D{device}"),
                3 => format!("spBv1.0/G/NDATA/N{node}"),
                _ => format!("spBv1.0/G/NDEATH/N{node}"),
            };
            let out = d.decode(&topic, &payload(0, metrics), NOW);
            changes.extend(out.sparkplug.changes.iter().cloned());
        }
        let (from, mut lines, mut after, mut done) = snap.expect("begun");
        while !done {
            after = d.sparkplug_state().snapshot_lines(after.as_ref(), &mut lines, 1);
            done = after.is_none();
        }
        let (mut replayed, lsn) = load(&lines).unwrap();
        prop_assert_eq!(lsn, Some(7));
        for c in &changes[from..] {
            let json = serde_json::to_vec(c).unwrap();
            replayed.apply(&serde_json::from_slice(&json).unwrap(), 0);
        }
        replayed.recount();
        prop_assert_eq!(
            String::from_utf8(snapshot(&replayed, 0)).unwrap(),
            String::from_utf8(snapshot(d.sparkplug_state(), 0)).unwrap()
        );
        prop_assert_eq!(replayed.bytes(), d.sparkplug_state().bytes());
    }
}
