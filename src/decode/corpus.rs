//! The specifications' own examples as the decoders' test corpus
//! (`tests/corpus/*.json`: each file names its sources, versions and
//! sections, and says for each example what its specification means by
//! it). Every example is decoded as a device publishes it, through the
//! preset of its family as `palletd print-config --preset` prints it or
//! the format's subscription, and what palletd makes of it is checked
//! against that meaning: each value at its time, with its unit, under the
//! name palletd's rules give it (`flatten = "."`: a nested key's path,
//! stored escaped; a SenML record's name, told apart by its unit where a
//! pack gives one name several), and nothing dropped without a cause.
//! Where palletd stores an example otherwise by a documented rule, the
//! exemption says which (`EXEMPT`).
//!
//! The end-to-end run of the same corpus through a real broker and
//! database is `tests/suite/corpus.rs`; the comparison with reference
//! implementations (cbor2, msgpack, line-protocol-parser) is
//! `tests/suite/reference.rs`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::*;

/// 2026-12-06T12:00:00Z: "now" for the examples (relative SenML times).
const NOW: i64 = 1_796_558_400_000;

fn corpus(family: &str) -> Value {
    let text = match family {
        "senml" => include_str!("../../tests/corpus/senml.json"),
        "cbor" => include_str!("../../tests/corpus/cbor.json"),
        "msgpack" => include_str!("../../tests/corpus/msgpack.json"),
        "line_protocol" => include_str!("../../tests/corpus/line_protocol.json"),
        "opcua" => include_str!("../../tests/corpus/opcua.json"),
        "tasmota" => include_str!("../../tests/corpus/tasmota.json"),
        "zigbee2mqtt" => include_str!("../../tests/corpus/zigbee2mqtt.json"),
        "shelly" => include_str!("../../tests/corpus/shelly.json"),
        "esphome" => include_str!("../../tests/corpus/esphome.json"),
        "homeassistant" => include_str!("../../tests/corpus/homeassistant.json"),
        "homie" => include_str!("../../tests/corpus/homie.json"),
        other => panic!("no corpus {other}"),
    };
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{family}: {e}"))
}

fn examples(family: &str) -> Vec<Value> {
    corpus(family)["examples"].as_array().unwrap().clone()
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn limits() -> Limits {
    Limits {
        max_payload_size: 1 << 20,
        // The examples' times go back to 1970 and 0001.
        max_lateness_ms: i64::MAX / 4,
        max_future_ms: i64::MAX / 4,
        max_samples_per_message: 10_000,
        max_fields_per_sample: 1000,
        max_field_name_length: 256,
        max_string_length: 4096,
        sensor_id_pattern: regex::Regex::new(&format!("^(?:{DEFAULT_SENSOR_ID_PATTERN})$"))
            .unwrap(),
        max_sparkplug_nodes: 100,
        max_sparkplug_devices_per_node: 100,
        max_sparkplug_aliases: 10_000,
        max_sparkplug_bytes: 64 << 20,
    }
}

fn decoder_for(subs: Vec<Subscription>) -> Decoder {
    Decoder::new(subs, limits())
}

/// A preset's subscriptions, as `print-config --preset` prints them.
fn preset(name: &str) -> Decoder {
    let text = crate::config::presets::example_with(name).unwrap();
    let settings = crate::config::parse(&text, None).unwrap();
    decoder_for(settings.subscriptions)
}

fn sub(topic: &str, format: PayloadFormat) -> Subscription {
    Subscription::new(TopicPattern::parse(topic).unwrap(), format)
}

/// A JSON value's leaves as palletd flattens them (`flatten = "."`,
/// `arrays = "index"`): (path, value). Nulls carry nothing.
fn leaves(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Null => {}
        Value::Object(o) => {
            for (k, v) in o {
                leaves(&join(prefix, k), v, out);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                leaves(&join(prefix, &i.to_string()), v, out);
            }
        }
        v => out.push((prefix.to_string(), v.clone())),
    }
}

fn join(prefix: &str, key: &str) -> String {
    match prefix.is_empty() {
        true => key.to_string(),
        false => format!("{prefix}.{key}"),
    }
}

/// Whether a stored field's value is the value the spec means.
fn same(stored: &FieldValue, meant: &Value) -> bool {
    match (stored, meant) {
        (FieldValue::Num(x), Value::Number(n)) => n.as_f64().is_some_and(|m| *x == m),
        // Numbers JSON cannot hold (bignums) are written as text.
        (FieldValue::Num(x), Value::String(s)) => s.parse::<f64>().is_ok_and(|m| *x == m),
        (FieldValue::Str(s), Value::String(m)) => s == m,
        (FieldValue::Bool(b), Value::Bool(m)) => b == m,
        _ => false,
    }
}

/// What went wrong with one example, if anything.
fn report(id: &str, problems: &mut Vec<String>, what: String) {
    problems.push(format!("{id}: {what}"));
}

/// The fields of a decoded message: (sensor, ts, name) -> value.
fn fields_of(d: &Decoded) -> BTreeMap<(String, i64, String), FieldValue> {
    let mut out = BTreeMap::new();
    for r in &d.readings {
        for (name, v) in &r.fields {
            out.insert((r.sensor.clone(), r.ts_ms, name.clone()), v.clone());
        }
    }
    out
}

/// SenML time: absolute seconds, or relative to now (RFC 8428, 4.5.3).
fn senml_time(t: &Value) -> i64 {
    match t {
        Value::String(s) => {
            let rel: f64 = s.strip_prefix("relative:").unwrap().parse().unwrap();
            NOW + (rel * 1000.0).round() as i64
        }
        Value::Number(n) => (n.as_f64().unwrap() * 1000.0).round() as i64,
        other => panic!("time {other}"),
    }
}

/// RFC 8428, sections 1, 2, 5 and 6: every record of every pack in JSON
/// and CBOR is one value at its time, with its unit; nothing more.
#[test]
fn senml_every_example_of_rfc_8428() {
    let mut problems = Vec::new();
    let mut d = decoder_for(vec![
        sub("senml/{sensor}", PayloadFormat::Senml),
        sub("senml-cbor/{sensor}", PayloadFormat::SenmlCbor),
    ]);
    let mut checked = 0;
    for e in examples("senml") {
        let id = e["id"].as_str().unwrap();
        let media = e["media_type"].as_str().unwrap_or_default();
        let (topic, payload) = match (e["payload_text"].as_str(), e["payload_hex"].as_str()) {
            (Some(t), _) if media.contains("json") || t.trim_start().starts_with('[') => {
                ("senml/dev", t.as_bytes().to_vec())
            }
            (_, Some(h)) if media.contains("cbor") || id.contains("cbor") => {
                ("senml-cbor/dev", hex(h))
            }
            // SenML in XML and EXI (sections 7 and 8): formats palletd
            // does not read.
            _ => continue,
        };
        checked += 1;
        let out = d.decode(topic, &payload, NOW);
        let text = String::from_utf8_lossy(&payload);
        if text.contains("...") {
            // 5.1.2's open-ended stream is printed cut off: not JSON.
            if out.errors.is_empty() || !out.readings.is_empty() {
                report(
                    id,
                    &mut problems,
                    format!("a cut-off pack is refused: {out:?}"),
                );
            }
            continue;
        }
        let mut values = fields_of(&out);
        let units: Vec<(i64, String, String)> = out
            .readings
            .iter()
            .flat_map(|r| {
                r.units
                    .iter()
                    .map(move |(f, u)| (r.ts_ms, f.clone(), u.clone()))
            })
            .collect();
        for m in e["means"].as_array().unwrap() {
            if m["value"].is_null() {
                continue; // a record of base fields only
            }
            let ts = senml_time(&m["time"]);
            let found = values
                .iter()
                .find(|((_, t, _), v)| *t == ts && same(v, &m["value"]))
                .map(|(k, _)| k.clone());
            match found {
                None => report(id, &mut problems, format!("{m} not stored in {out:?}")),
                Some(k) => {
                    if let Some(u) = m["unit"].as_str() {
                        if !units
                            .iter()
                            .any(|(t, f, uu)| *t == ts && *f == k.2 && uu == u)
                        {
                            report(id, &mut problems, format!("unit {u} of {k:?}"));
                        }
                    }
                    values.remove(&k);
                }
            }
        }
        if !values.is_empty() {
            report(
                id,
                &mut problems,
                format!("stored beyond the spec: {values:?}"),
            );
        }
        if !out.errors.is_empty() || !out.dropped.is_empty() {
            report(
                id,
                &mut problems,
                format!("refused: {:?} {:?}", out.errors, out.dropped),
            );
        }
    }
    assert!(checked >= 14, "{checked} SenML examples checked");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // 5.1.3: one base name, its humidity, longitude, latitude and
    // battery told apart by their units.
    let pack = examples("senml")
        .into_iter()
        .find(|e| e["section"] == "5.1.3")
        .unwrap();
    let out = d.decode(
        "senml/dev",
        pack["payload_text"].as_str().unwrap().as_bytes(),
        NOW,
    );
    let names: std::collections::BTreeSet<&str> = out
        .readings
        .iter()
        .flat_map(|r| r.fields.iter().map(|(n, _)| n.as_str()))
        .collect();
    assert_eq!(
        names,
        ["value_%25EL", "value_%25RH", "value_lat", "value_lon"].into(),
        "{out:?}"
    );
}

/// The field a CBOR or MessagePack example is stored as, wrapped as the
/// value of `v` in a map: what its spec means, by palletd's rules.
enum Meant {
    /// These fields (flattened from `v`).
    Fields(Vec<(String, Value)>),
    /// A date, milliseconds since the epoch.
    Date(i64),
    /// No field: the message is passed over.
    Nothing,
    /// Left out with a cause (a byte string, an extension, NaN, a
    /// simple value): the sample, with nothing else in it, is refused.
    Refused(&'static str),
}

/// RFC 8949 Appendix A (and 3.2.3, 3.4.4): every data item, as the value
/// of a field.
#[test]
fn cbor_every_example_of_rfc_8949_as_a_field() {
    let mut d = decoder_for(vec![sub("cbor/{sensor}", PayloadFormat::Cbor)]);
    let mut problems = Vec::new();
    let mut checked = 0;
    for e in examples("cbor") {
        let id = e["id"].as_str().unwrap();
        if id.starts_with("rfc8428") {
            continue; // SenML's, checked there
        }
        let m = &e["means"][0];
        let ty = m["type"].as_str().unwrap_or_default();
        let meant = if ty.starts_with("tag 0") || ty.starts_with("tag 1 ") {
            let t = m["time_utc"].as_str().or(m["time"].as_str()).unwrap();
            Meant::Date(
                chrono::DateTime::parse_from_rfc3339(t)
                    .unwrap()
                    .timestamp_millis(),
            )
        } else if ty.contains("bstr") || ty.starts_with("tag 23") || ty.starts_with("tag 24") {
            Meant::Refused("bad_field")
        } else if ty == "simple" {
            // An unassigned simple value: ciborium does not read it, the
            // message is refused (item.rs).
            Meant::Refused("bad_payload")
        } else if matches!(m["value"].as_str(), Some("NaN" | "Infinity" | "-Infinity")) {
            Meant::Refused("bad_field")
        } else if ty.starts_with("map")
            && m["note"]
                .as_str()
                .is_some_and(|n| n.contains("non-string keys"))
        {
            Meant::Refused("bad_payload")
        } else {
            let mut fields = Vec::new();
            leaves("v", &m["value"], &mut fields);
            match fields.is_empty() {
                true => Meant::Nothing,
                false => Meant::Fields(fields),
            }
        };
        let item = hex(e["payload_hex"].as_str().unwrap());
        // {"v": item}
        let mut payload = vec![0xa1, 0x61, b'v'];
        payload.extend_from_slice(&item);
        checked += 1;
        check_wrapped(
            id,
            d.decode("cbor/dev", &payload, NOW),
            meant,
            &mut problems,
        );
    }
    assert!(checked >= 80, "{checked} CBOR examples checked");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The MessagePack specification: every type family, and the Timestamp
/// extension in its three forms, as the value of a field.
#[test]
fn msgpack_every_type_of_the_spec_as_a_field() {
    let mut d = decoder_for(vec![sub("mp/{sensor}", PayloadFormat::MsgPack)]);
    let mut problems = Vec::new();
    let mut checked = 0;
    for e in examples("msgpack") {
        let id = e["id"].as_str().unwrap();
        let item = hex(e["payload_hex"].as_str().unwrap());
        // {"v": item}
        let mut payload = vec![0x81, 0xa1, b'v'];
        payload.extend_from_slice(&item);
        let m = &e["means"][0];
        let ty = m["type"].as_str().unwrap_or_default();
        checked += 1;
        if e["valid"] == false {
            let out = d.decode("mp/dev", &payload, NOW);
            if out.errors.is_empty() {
                report(id, &mut problems, format!("invalid, not refused: {out:?}"));
            }
            continue;
        }
        let meant = if ty.starts_with("timestamp") {
            let secs = m["value"]["seconds"].as_i64().unwrap();
            let nanos = m["value"]["nanoseconds"].as_i64().unwrap();
            Meant::Date(secs * 1000 + nanos / 1_000_000)
        } else if ty.contains("ext")
            || ty.starts_with("bin")
            || matches!(m["value"].as_str(), Some("NaN" | "Infinity" | "-Infinity"))
        {
            Meant::Refused("bad_field")
        } else if ty.contains("map") && m["note"].as_str().is_some_and(|n| n.contains("any type")) {
            Meant::Refused("bad_payload")
        } else {
            let mut fields = Vec::new();
            leaves("v", &m["value"], &mut fields);
            match fields.is_empty() {
                true => Meant::Nothing,
                false => Meant::Fields(fields),
            }
        };
        check_wrapped(id, d.decode("mp/dev", &payload, NOW), meant, &mut problems);
    }
    assert!(checked >= 80, "{checked} MessagePack examples checked");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn check_wrapped(id: &str, out: Decoded, meant: Meant, problems: &mut Vec<String>) {
    match meant {
        Meant::Nothing => {
            if out.skipped != Some(SKIPPED_NO_FIELDS) || !out.errors.is_empty() {
                report(id, problems, format!("expected no field: {out:?}"));
            }
        }
        Meant::Refused(cause) => {
            if out.errors.first().map(|e| e.cause()) != Some(cause) || !out.readings.is_empty() {
                report(id, problems, format!("expected refused ({cause}): {out:?}"));
            }
        }
        Meant::Date(ms) => {
            let got = out.readings.first().and_then(|r| r.fields.first());
            if got.map(|f| &f.1) != Some(&FieldValue::Date(ms)) {
                report(id, problems, format!("expected the date {ms}: {out:?}"));
            }
        }
        Meant::Fields(fields) => {
            let got: Vec<(String, FieldValue)> = out
                .readings
                .first()
                .map(|r| r.fields.clone())
                .unwrap_or_default();
            let ok = got.len() == fields.len()
                && fields.iter().all(|(name, v)| {
                    got.iter()
                        .any(|(n, g)| *n == field_name(name) && same(g, v))
                });
            if !ok || !out.errors.is_empty() {
                report(id, problems, format!("expected {fields:?}: {out:?}"));
            }
        }
    }
}

/// Line protocol examples palletd stores otherwise, by a rule of its own
/// (each said in `line.rs`, the README and here).
const LINE_EXEMPT: &[(&str, &str)] = &[
    ("v1faq-time-as-field-key", "InfluxDB refuses `time` as a key; palletd reserves ts, sensorId and lsn, not time"),
    ("v1faq-time-as-tag-key", "likewise"),
    ("v1faq-escaped-quote-in-field-key", "v2's escaping rules (the current reference): in a key only commas, equals signs and spaces are escaped, so `va\\\"ue` keeps its backslash; v1's FAQ reads `va\"ue`"),
    ("v1faq-duplicate-point", "the FAQ's time 1234567890 in nanoseconds is 1970-01-01T00:00:01.23; palletd tells a time's unit by its magnitude and reads it as seconds (2009-02-13T23:31:30), as a device's time that small always is"),
    ("v1faq-duplicate-point-uniq-tag", "likewise"),
    ("v1faq-duplicate-point-plus-1ns", "likewise"),
];

/// The InfluxDB line protocol references (v1 and v2, Telegraf's output):
/// every line a sample with its fields (and its tags, as text fields:
/// the subscription names no `sensor_template`), at its time.
#[test]
fn line_protocol_every_example_of_the_references() {
    let mut d = decoder_for(vec![sub("lp/{sensor}", PayloadFormat::LineProtocol)]);
    let mut problems = Vec::new();
    for e in examples("line_protocol") {
        let id = e["id"].as_str().unwrap();
        if LINE_EXEMPT.iter().any(|(x, _)| *x == id) {
            continue;
        }
        let payload = e["payload_text"].as_str().unwrap();
        let out = d.decode("lp/dev", payload.as_bytes(), NOW);
        if e["valid"] == false {
            if out.errors.is_empty() {
                report(id, &mut problems, format!("invalid, not refused: {out:?}"));
            }
            continue;
        }
        let means = e["means"].as_array().unwrap();
        if out.readings.len() != means.len() || !out.errors.is_empty() {
            report(
                id,
                &mut problems,
                format!("{} lines meant: {out:?}", means.len()),
            );
            continue;
        }
        for (m, r) in means.iter().zip(&out.readings) {
            let ts = match m["timestamp"].as_i64() {
                None => NOW,
                Some(t)
                    if m["precision_note"]
                        .as_str()
                        .is_some_and(|p| p.starts_with('s')) =>
                {
                    t * 1000
                }
                Some(t) => t.div_euclid(1_000_000),
            };
            if r.ts_ms != ts {
                report(
                    id,
                    &mut problems,
                    format!("time {} for {ts} in {r:?}", r.ts_ms),
                );
            }
            let mut want: Vec<(String, Value)> = m["tags"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (k, f) in m["fields"].as_object().unwrap() {
                want.push((k.clone(), f["value"].clone()));
            }
            let ok = r.fields.len() == want.len()
                && want.iter().all(|(k, v)| {
                    r.fields
                        .iter()
                        .any(|(n, g)| *n == field_name(k) && same(g, v))
                });
            if !ok {
                report(id, &mut problems, format!("meant {want:?}: {r:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// OPC UA fields (of DataSet3, wherever it is sent) palletd stores
/// otherwise, by a rule of its own: (field, why).
const OPCUA_EXEMPT: &[(&str, &str)] = &[
    ("Int64Value", "a 64-bit integer written as JSON text (\"1\"): without the writer's metadata palletd cannot tell it from a string, and stores the text"),
    ("UInt64Value", "likewise"),
];

/// OPC 10000-14 (1.05; 1.04 publishes no JSON example): every field of
/// every DataSetMessage at its time (its SourceTimestamp, else its
/// DataSetMessage's Timestamp, else the message's), a status other than
/// Good as `<field>.StatusCode`. Messages without a header (A.3.2.5) go on
/// a topic naming their writer.
#[test]
fn opcua_every_json_example_of_part_14() {
    let mut d = decoder_for(vec![
        sub("opcua/json/data/#", PayloadFormat::OpcUa),
        sub("opcua/min/{sensor}", PayloadFormat::OpcUa),
    ]);
    let mut problems = Vec::new();
    for e in examples("opcua") {
        let id = e["id"].as_str().unwrap();
        let payload = e["payload_text"].as_str().unwrap();
        let topic = match e["means"][0]["publisher"].is_null() {
            true => "opcua/min/writer",
            false => "opcua/json/data/MyPublisher",
        };
        let out = d.decode(topic, payload.as_bytes(), NOW);
        if e["payload_is_valid_json"] == false {
            if out.errors.is_empty() {
                report(id, &mut problems, format!("not JSON, not refused: {out:?}"));
            }
            continue;
        }
        let mut stored = fields_of(&out);
        for m in e["means"].as_array().unwrap() {
            let ts = [&m["source_timestamp"], &m["message_timestamp"]]
                .into_iter()
                .find_map(|t| t.as_str())
                .map_or(NOW, |t| {
                    chrono::DateTime::parse_from_rfc3339(t)
                        .unwrap()
                        .timestamp_millis()
                });
            let field = m["field"].as_str().unwrap();
            if OPCUA_EXEMPT.iter().any(|(f, _)| *f == field) {
                stored.retain(|(_, _, n), _| *n != field_name(field));
                continue;
            }
            let mut want = Vec::new();
            leaves(field, &m["value"], &mut want);
            if m["status"].as_str().is_some_and(|s| s != "Good") {
                let code = m["status"].as_str().unwrap();
                let code = u64::from_str_radix(code.trim_start_matches("0x"), 16).unwrap();
                // A DataValue's own status goes with its field; a
                // DataSetMessage's, which applies to all its values, is
                // stored once, as StatusCode.
                match m["status_source"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("DataValue")
                {
                    true => want.push((format!("{field}.StatusCode"), Value::from(code))),
                    false => {
                        let k = stored
                            .keys()
                            .find(|(_, t, n)| *t == ts && n == "StatusCode");
                        match k.cloned() {
                            Some(k) if same(&stored[&k], &Value::from(code)) => {
                                stored.remove(&k);
                            }
                            _ if want.is_empty() => {}
                            _ => {
                                // Taken by another field of the message.
                            }
                        }
                    }
                }
            }
            for (name, v) in want {
                let key = stored
                    .keys()
                    .find(|(_, t, n)| *t == ts && *n == field_name(&name))
                    .cloned();
                match key {
                    Some(k) if same(&stored[&k], &v) => {
                        stored.remove(&k);
                    }
                    Some(k) => report(
                        id,
                        &mut problems,
                        format!("{name} = {:?}, meant {v}", stored[&k]),
                    ),
                    None => report(
                        id,
                        &mut problems,
                        format!("{name} = {v} at {ts} not stored: {out:?}"),
                    ),
                }
            }
        }
        if !stored.is_empty() {
            report(
                id,
                &mut problems,
                format!("stored beyond the spec: {stored:?}"),
            );
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// What a preset leaves out of its family's documented messages, by its
/// own configuration (the preset's file says why): (family, field path
/// prefix).
const LEFT_OUT: &[(&str, &str)] = &[
    // tasmota.toml: STATE's include list takes the numbers and the relays.
    ("tasmota", "Uptime"),
    ("tasmota", "SleepMode"),
    ("tasmota", "Sleep"),
    ("tasmota", "Vcc"),
    ("tasmota", "Wifi.AP"),
    ("tasmota", "Wifi.SSId"),
    ("tasmota", "Wifi.BSSId"),
    ("tasmota", "Wifi.Channel"),
    ("tasmota", "Wifi.Mode"),
    ("tasmota", "Wifi.Downtime"),
    ("tasmota", "ENERGY.TotalStartTime"),
    ("tasmota", "Wifi.DeepSleep"),
    ("tasmota", "Wifi.Heap"),
    // shelly.toml: the cloud connection is configuration.
    ("shelly", "cloud"),
    // zigbee2mqtt.toml: the update notices.
    ("zigbee2mqtt", "update"),
];

/// Each device family's documented messages (the corpus files say which
/// pages), through its preset: a message on a topic the preset
/// subscribes is stored as its documentation means, each field under its
/// path at its time, but what the preset leaves out by its configuration
/// ([`LEFT_OUT`]); one on another topic never reaches palletd (a command,
/// a bridge's own message, metadata) and is listed, not stored.
#[test]
fn device_families_documented_messages_through_their_presets() {
    let mut problems = Vec::new();
    let mut outside: Vec<String> = Vec::new();
    for family in [
        "tasmota",
        "zigbee2mqtt",
        "shelly",
        "esphome",
        "homeassistant",
        "homie",
    ] {
        let mut d = preset(family);
        let tz: chrono_tz::Tz = "Europe/Berlin".parse().unwrap();
        for e in examples(family) {
            let id = format!("{family}/{}", e["id"].as_str().unwrap());
            let Some(topic) = e["topic"].as_str() else {
                continue; // a fragment the docs print without a topic
            };
            // Statestream's base topic is the operator's: the preset's.
            let topic = match family {
                "homeassistant" => {
                    let rest = topic.split_once('/').map_or(topic, |t| t.1);
                    format!("homeassistant/statestream/{rest}")
                }
                _ => topic.to_string(),
            };
            let payload = e["payload_text"].as_str().unwrap_or_default();
            let out = d.decode(&topic, payload.as_bytes(), NOW);
            let means: Vec<&Value> = e["means"].as_array().unwrap().iter().collect();
            if out.errors.iter().any(|e| e.cause() == "unknown_topic") || out.subscription.is_none()
            {
                outside.push(format!(
                    "{id} ({topic}): {}",
                    if means.is_empty() {
                        "not a reading"
                    } else {
                        "a reading the preset does not take"
                    }
                ));
                continue;
            }
            if means.is_empty() {
                continue;
            }
            let json = serde_json::from_str::<Value>(payload).is_ok()
                || !payload.trim_start().starts_with('{');
            if !json {
                // Printed with a defect (comments, a missing brace): refused.
                if out.errors.is_empty() {
                    report(
                        &id,
                        &mut problems,
                        format!("not JSON, not refused: {out:?}"),
                    );
                }
                continue;
            }
            if !out.errors.is_empty() || !out.dropped.is_empty() {
                report(
                    &id,
                    &mut problems,
                    format!("refused: {:?} {:?}", out.errors, out.dropped),
                );
                continue;
            }
            let m = means[0];
            let ts = match m["time"].as_str() {
                None => NOW,
                Some(t) => json::text_timestamp_in(t, Some(tz)).unwrap(),
            };
            let mut want: Vec<(String, Value)> = Vec::new();
            for (k, v) in m["fields"].as_object().unwrap() {
                leaves(k, v, &mut want);
            }
            let single = d
                .subscriptions()
                .iter()
                .any(|s| s.pattern.matches(&topic).is_some() && s.format == PayloadFormat::Value);
            // Statestream's last_updated and last_changed are values of the
            // entity (its state's times), stored as text at their arrival,
            // not the time of another reading.
            let ts = match (
                family,
                m["fields"].as_object().and_then(|f| f.keys().next()),
            ) {
                ("homeassistant", Some(k)) if k.starts_with("last_") => NOW,
                _ => ts,
            };
            let got: Vec<&Reading> = out.readings.iter().collect();
            if single {
                // One value per topic: its name is the topic's.
                // A list or an object: stored as its JSON text.
                let as_text = |g: &FieldValue| match g {
                    FieldValue::Str(s) => {
                        serde_json::from_str::<Value>(s).ok()
                            == serde_json::from_str::<Value>(payload).ok()
                    }
                    _ => false,
                };
                let ok = got.len() == 1
                    && got[0].fields.len() == 1
                    && (want.len() == 1 && same(&got[0].fields[0].1, &want[0].1)
                        || want.len() > 1 && as_text(&got[0].fields[0].1));
                if !ok || got.first().is_some_and(|r| r.ts_ms != ts) {
                    report(
                        &id,
                        &mut problems,
                        format!("meant {want:?} at {ts}: {out:?}"),
                    );
                }
                continue;
            }
            let mut stored: BTreeMap<String, FieldValue> = BTreeMap::new();
            for r in &got {
                if r.ts_ms != ts {
                    report(&id, &mut problems, format!("time {} meant {ts}", r.ts_ms));
                }
                stored.extend(r.fields.iter().cloned());
            }
            for (name, v) in want {
                match stored.remove(&*field_name(&name)) {
                    Some(g) if same(&g, &v) => {}
                    Some(g) => report(&id, &mut problems, format!("{name} = {g:?}, meant {v}")),
                    None if LEFT_OUT
                        .iter()
                        .any(|(f, p)| *f == family && name.starts_with(p)) => {}
                    None => report(
                        &id,
                        &mut problems,
                        format!("{name} = {v} not stored: {out:?}"),
                    ),
                }
            }
            if !stored.is_empty() {
                report(
                    &id,
                    &mut problems,
                    format!("stored beyond the documentation: {stored:?}"),
                );
            }
        }
    }
    eprintln!("outside the presets' topics:\n{}", outside.join("\n"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
