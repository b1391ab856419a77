//! No format reduces two values to one without a trace: a property over
//! every payload format. A message is made of values that are all
//! different, under names drawn from a few that meet each other in every
//! way a format allows (a repeated key, a nested path flattened onto a
//! literal name, a rename onto a name, a tag and a field of one name,
//! SenML's names told apart by unit, `_sum` and base names, Sparkplug's
//! repeated metric names and aliases), and decoded. Each value is either
//! stored (once, under one field) or the decode says why not: a refusal
//! with its cause or a field left out with its cause. A value is never
//! stored that the message did not hold.

use proptest::prelude::*;

use super::*;

const NOW: i64 = 1_796_558_400_000;

/// Names that meet: `a.b` is also the flattened path of `{"a": {"b"}}`,
/// `r` is renamed onto `a`, `a_b` is SenML's `a` in unit `b`, `a_sum` its
/// sum.
const NAMES: &[&str] = &["a", "b", "a.b", "r", "a_b", "a_sum"];

fn decoder() -> Decoder {
    let text = r#"
[mqtt]
url = "mqtt://127.0.0.1:1883"
client_id = "collisions"

[mongodb]
uri = "mongodb://127.0.0.1:27017"
database = "collisions"

[[subscription]]
topic = "json/{sensor}"
format = "json"
rename = { "/r" = "a" }

[[subscription]]
topic = "cbor/{sensor}"
format = "cbor"
rename = { "/r" = "a" }

[[subscription]]
topic = "msgpack/{sensor}"
format = "msgpack"
rename = { "/r" = "a" }

[[subscription]]
topic = "senml/{sensor}"
format = "senml"

[[subscription]]
topic = "senml-cbor/{sensor}"
format = "senml_cbor"

[[subscription]]
topic = "lp/{sensor}"
format = "line_protocol"

[[subscription]]
topic = "opcua/{sensor}"
format = "opcua"

[[subscription]]
topic = "spBv1.0/#"
format = "sparkplug_b"

[[subscription]]
topic = "number/{sensor}/{field}"
format = "number"

[[subscription]]
topic = "value/{sensor}/{field}"
format = "value"
"#;
    let settings = crate::config::parse(text, None).unwrap_or_else(|e| panic!("{e:?}"));
    Decoder::new(settings.subscriptions.clone(), settings.decode_limits())
}

/// The values of a message: `value(i)` for the i-th, all different.
fn value(i: usize) -> f64 {
    i as f64 + 0.25
}

/// Whether the decode accounts for every value sent: each stored once at
/// most and only what was sent, the rest refused or left out with a cause.
fn accounted(out: &Decoded, sent: &[f64], own: &[&str]) -> Result<(), TestCaseError> {
    let mut seen = vec![0; sent.len()];
    for r in &out.readings {
        for (name, v) in &r.fields {
            if own.contains(&name.as_str()) {
                continue; // not a value of the message (Sparkplug's state, bdSeq)
            }
            let x = match v {
                FieldValue::Num(x) => Some(*x),
                // A line protocol tag is text.
                FieldValue::Str(s) => s.parse::<f64>().ok(),
                _ => None,
            };
            let Some(i) = x.and_then(|x| sent.iter().position(|s| *s == x)) else {
                return Err(TestCaseError::fail(format!(
                    "{name} = {v:?} was not sent: {out:?}"
                )));
            };
            seen[i] += 1;
        }
    }
    prop_assert!(
        seen.iter().all(|n| *n <= 1),
        "a value stored twice: {out:?}"
    );
    let missing = seen.iter().filter(|n| **n == 0).count();
    prop_assert!(
        missing == 0 || !out.errors.is_empty() || !out.dropped.is_empty(),
        "{missing} of {} values gone without a trace: {out:?}",
        sent.len()
    );
    Ok(())
}

/// The first `n` values.
fn values(n: usize) -> Vec<f64> {
    (0..n).map(value).collect()
}

/// A value's place in a message: its name, nested (`a.b` as `{"a":
/// {"b": v}}`) or literal.
fn entries() -> impl Strategy<Value = Vec<(usize, bool)>> {
    prop::collection::vec((0..NAMES.len(), any::<bool>()), 1..7)
}

/// The map of a message's entries, as a tree of (key, value) pairs in
/// order (a key may repeat).
enum Tree {
    Num(f64),
    Map(Vec<(String, Tree)>),
}

fn tree(entries: &[(usize, bool)]) -> Tree {
    Tree::Map(
        entries
            .iter()
            .enumerate()
            .map(|(i, &(n, nested))| {
                let name = NAMES[n];
                match (nested, name.split_once('.')) {
                    (true, Some((outer, inner))) => (
                        outer.to_string(),
                        Tree::Map(vec![(inner.to_string(), Tree::Num(value(i)))]),
                    ),
                    _ => (name.to_string(), Tree::Num(value(i))),
                }
            })
            .collect(),
    )
}

fn json_text(t: &Tree) -> String {
    match t {
        Tree::Num(x) => x.to_string(),
        Tree::Map(m) => {
            let items: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}:{}", serde_json::json!(k), json_text(v)))
                .collect();
            format!("{{{}}}", items.join(","))
        }
    }
}

fn cbor(t: &Tree) -> ciborium::Value {
    match t {
        Tree::Num(x) => ciborium::Value::Float(*x),
        Tree::Map(m) => ciborium::Value::Map(
            m.iter()
                .map(|(k, v)| (ciborium::Value::Text(k.clone()), cbor(v)))
                .collect(),
        ),
    }
}

fn msgpack(t: &Tree) -> rmpv::Value {
    match t {
        Tree::Num(x) => rmpv::Value::F64(*x),
        Tree::Map(m) => rmpv::Value::Map(
            m.iter()
                .map(|(k, v)| (rmpv::Value::from(k.as_str()), msgpack(v)))
                .collect(),
        ),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// JSON, CBOR and MessagePack maps: repeated keys, a nested path
    /// meeting a literal dotted name, a rename onto a name.
    #[test]
    fn maps_keep_or_account_for_every_value(entries in entries()) {
        let mut d = decoder();
        let t = tree(&entries);
        let json = json_text(&t);
        accounted(&d.decode("json/s", json.as_bytes(), NOW), &values(entries.len()), &[])?;
        let mut bytes = Vec::new();
        ciborium::into_writer(&cbor(&t), &mut bytes).unwrap();
        accounted(&d.decode("cbor/s", &bytes, NOW), &values(entries.len()), &[])?;
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &msgpack(&t)).unwrap();
        accounted(&d.decode("msgpack/s", &bytes, NOW), &values(entries.len()), &[])?;
        // OPC UA's Payload is such a map, of raw values or DataValues.
        let payload = match entries.len() % 2 {
            0 => json,
            _ => json_text(&Tree::Map(match t {
                Tree::Map(m) => m
                    .into_iter()
                    .map(|(k, v)| (k, Tree::Map(vec![("Value".into(), v)])))
                    .collect(),
                Tree::Num(_) => unreachable!(),
            })),
        };
        let ua = format!(
            r#"{{"MessageId":"m","MessageType":"ua-data","PublisherId":"P","Messages":[{{"DataSetWriterId":1,"Payload":{payload}}}]}}"#
        );
        accounted(&d.decode("opcua/s", ua.as_bytes(), NOW), &values(entries.len()), &[])?;
    }

    /// SenML packs (JSON and CBOR): records of few names, units, times and
    /// base names, sums among them.
    #[test]
    fn senml_packs_keep_or_account_for_every_record(
        records in prop::collection::vec(
            (0..NAMES.len(), prop::option::of(0..3usize), 0..2i64, prop::option::of(0..2usize), any::<bool>()),
            1..7,
        )
    ) {
        let mut d = decoder();
        let units = ["Cel", "b", "%RH"];
        let mut pack = Vec::new();
        let mut cbor_pack = Vec::new();
        for (i, (n, u, t, bn, sum)) in records.iter().enumerate() {
            let mut r = serde_json::Map::new();
            let mut c = Vec::new();
            if let Some(bn) = bn {
                let bn = format!("dev{bn}:");
                r.insert("bn".into(), bn.clone().into());
                c.push((ciborium::Value::Integer((-2).into()), ciborium::Value::Text(bn)));
            }
            r.insert("n".into(), NAMES[*n].into());
            c.push((ciborium::Value::Integer(0.into()), ciborium::Value::Text(NAMES[*n].into())));
            if let Some(u) = u {
                r.insert("u".into(), units[*u].into());
                c.push((ciborium::Value::Integer(1.into()), ciborium::Value::Text(units[*u].into())));
            }
            let (key, label) = if *sum { ("s", 5) } else { ("v", 2) };
            r.insert(key.into(), value(i).into());
            c.push((ciborium::Value::Integer(label.into()), ciborium::Value::Float(value(i))));
            let t = 1_796_558_000 + t;
            r.insert("t".into(), t.into());
            c.push((ciborium::Value::Integer(6.into()), ciborium::Value::Integer(t.into())));
            pack.push(serde_json::Value::Object(r));
            cbor_pack.push(ciborium::Value::Map(c));
        }
        let json = serde_json::to_vec(&pack).unwrap();
        accounted(&d.decode("senml/s", &json, NOW), &values(records.len()), &[])?;
        let mut bytes = Vec::new();
        ciborium::into_writer(&ciborium::Value::Array(cbor_pack), &mut bytes).unwrap();
        accounted(&d.decode("senml-cbor/s", &bytes, NOW), &values(records.len()), &[])?;
    }

    /// Line protocol: a line's tags and fields of few names (a key
    /// repeated, a tag and a field of one name), and lines of one series
    /// at one time.
    #[test]
    fn lines_keep_or_account_for_every_value(
        lines in prop::collection::vec(prop::collection::vec((0..NAMES.len(), any::<bool>()), 1..5), 1..3)
    ) {
        let mut d = decoder();
        let mut text = Vec::new();
        let mut i = 0;
        for entries in &lines {
            let mut tags = Vec::new();
            let mut fields = Vec::new();
            for (n, tag) in entries {
                match tag {
                    true => tags.push(format!(",{}={}", NAMES[*n], value(i))),
                    false => fields.push(format!("{}={}", NAMES[*n], value(i))),
                }
                i += 1;
            }
            if fields.is_empty() {
                fields.push(format!("f={}", value(i)));
                i += 1;
            }
            text.push(format!("m{} {} 1796558000000000000", tags.concat(), fields.join(",")));
        }
        accounted(&d.decode("lp/s", text.join("\n").as_bytes(), NOW), &values(i), &[])?;
    }

    /// Sparkplug B: a birth of metrics of few names (one repeated under two
    /// aliases), then data by alias, an alias repeated at one time.
    #[test]
    fn sparkplug_keeps_or_accounts_for_every_metric(
        names in prop::collection::vec(0..NAMES.len(), 1..6),
        data in prop::collection::vec(0..6u64, 1..6),
    ) {
        use sparkplug::proto;
        let mut d = decoder();
        let metric = |name: Option<&str>, alias: u64, v: f64| proto::Metric {
            name: name.map(Into::into),
            alias: Some(alias),
            datatype: Some(sparkplug::DataType::Double as u32),
            value: Some(proto::metric::Value::DoubleValue(v)),
            ..Default::default()
        };
        let payload = |seq: u64, metrics: Vec<proto::Metric>| {
            prost::Message::encode_to_vec(&proto::Payload {
                timestamp: Some(NOW as u64),
                seq: Some(seq),
                metrics,
                ..Default::default()
            })
        };
        let mut birth = vec![proto::Metric {
            name: Some("bdSeq".into()),
            datatype: Some(sparkplug::DataType::Int64 as u32),
            value: Some(proto::metric::Value::LongValue(1)),
            ..Default::default()
        }];
        for (i, n) in names.iter().enumerate() {
            birth.push(metric(Some(NAMES[*n]), i as u64 + 1, value(i)));
        }
        let own = [sparkplug::STATE, sparkplug::BD_SEQ, "bdSeq"];
        let out = d.decode("spBv1.0/G/NBIRTH/N", &payload(0, birth), NOW);
        accounted(&out, &values(names.len()), &own)?;
        let metrics: Vec<proto::Metric> = (data.iter().enumerate())
            .map(|(i, alias)| metric(None, alias % names.len() as u64 + 1, value(i)))
            .collect();
        let out = d.decode("spBv1.0/G/NDATA/N", &payload(1, metrics), NOW);
        accounted(&out, &values(data.len()), &own)?;
    }

    /// One value a message (`number`, `value`): stored, once.
    #[test]
    fn single_values_are_stored_once(x in -1e9..1e9f64) {
        let mut d = decoder();
        let text = x.to_string();
        for topic in ["number/s/a", "value/s/a"] {
            let out = d.decode(topic, text.as_bytes(), NOW);
            accounted(&out, &[x], &[])?;
            prop_assert_eq!(out.readings.len(), 1);
            prop_assert_eq!(out.readings[0].fields.len(), 1);
        }
    }
}
