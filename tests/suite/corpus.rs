//! Every example of `tests/corpus` (the specifications' and the device
//! families' own published payloads) through a real Mosquitto into a real
//! SecantusDB, with the presets as `print-config --preset` prints them:
//! each published as its device publishes it (its topic, QoS and RETAIN
//! flag; a format's bare data item as the value `v` of a map, on a topic of
//! its own), and each stored exactly as palletd's decoder reads it, every
//! reading once at its time with its fields and units, every refused
//! message one dead letter. What the decoder makes of each example is
//! checked against what its specification means in `src/decode/corpus.rs`
//! (the two together: every example stored as its spec means).

use crate::common;

use std::collections::BTreeMap;

use bson::{Bson, Document};
use common::*;
use palletd::decode::{Decoder, FieldValue, Reading};
use rumqttc::QoS;
use serde_json::Value;

const FAMILIES: &[&str] = &[
    "tasmota",
    "zigbee2mqtt",
    "shelly",
    "esphome",
    "homeassistant",
    "homie",
];

fn corpus(name: &str) -> Vec<Value> {
    let path = format!("{}/tests/corpus/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v: Value = serde_json::from_str(&text).unwrap();
    v["examples"].as_array().unwrap().clone()
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// One message as a device publishes it.
struct Message {
    id: String,
    topic: String,
    payload: Vec<u8>,
    qos: QoS,
    retain: bool,
}

/// Every example of every corpus, as the messages that carry it.
fn messages() -> Vec<Message> {
    let mut out = Vec::new();
    let mut push = |id: String, topic: String, payload: Vec<u8>, e: &Value| {
        let qos = match e["qos"].as_u64() {
            Some(0) => QoS::AtMostOnce,
            _ => QoS::AtLeastOnce,
        };
        let retain = e["retain"].as_bool().unwrap_or(false);
        out.push(Message {
            id,
            topic,
            payload,
            qos,
            retain,
        });
    };
    for family in FAMILIES {
        for e in corpus(family) {
            let Some(topic) = e["topic"].as_str() else {
                continue; // a fragment its docs print without a topic
            };
            // Statestream's base topic is the operator's: the preset's.
            let topic = match *family {
                "homeassistant" => {
                    let rest = topic.split_once('/').map_or(topic, |t| t.1);
                    format!("homeassistant/statestream/{rest}")
                }
                _ => topic.to_string(),
            };
            let payload = e["payload_text"].as_str().unwrap_or_default();
            let id = format!("{family}/{}", e["id"].as_str().unwrap());
            push(id, topic, payload.as_bytes().to_vec(), &e);
        }
    }
    for (i, e) in corpus("senml").iter().enumerate() {
        let id = format!("senml/{}", e["id"].as_str().unwrap());
        let media = e["media_type"].as_str().unwrap_or_default();
        match (e["payload_text"].as_str(), e["payload_hex"].as_str()) {
            (Some(t), _) if media.contains("json") || t.trim_start().starts_with('[') => {
                push(id, format!("corpus/senml/e{i}"), t.as_bytes().to_vec(), e)
            }
            (_, Some(h)) if media.contains("cbor") || id.contains("cbor") => {
                push(id, format!("corpus/senml-cbor/e{i}"), hex(h), e)
            }
            _ => {} // SenML in XML and EXI: formats palletd does not read
        }
    }
    // A bare data item is the value of `v` in a map of its format.
    for (name, head) in [
        ("cbor", &[0xa1, 0x61, b'v']),
        ("msgpack", &[0x81, 0xa1, b'v']),
    ] {
        for (i, e) in corpus(name).iter().enumerate() {
            let id = format!("{name}/{}", e["id"].as_str().unwrap());
            if id.contains("rfc8428") {
                continue; // SenML's, published above
            }
            let mut payload = head.to_vec();
            payload.extend(hex(e["payload_hex"].as_str().unwrap()));
            push(id, format!("corpus/{name}/e{i}"), payload, e);
        }
    }
    for (i, e) in corpus("line_protocol").iter().enumerate() {
        let id = format!("line_protocol/{}", e["id"].as_str().unwrap());
        let payload = e["payload_text"].as_str().unwrap().as_bytes().to_vec();
        push(id, format!("corpus/lp/e{i}"), payload, e);
    }
    for (i, e) in corpus("opcua").iter().enumerate() {
        let id = format!("opcua/{}", e["id"].as_str().unwrap());
        let payload = e["payload_text"].as_str().unwrap().as_bytes().to_vec();
        // A message without a header names no publisher: its topic does.
        let topic = match e["means"][0]["publisher"].is_null() {
            true => format!("corpus/opcua/min/e{i}"),
            false => "opcua/json/data/MyPublisher".to_string(),
        };
        push(id, topic, payload, e);
    }
    out
}

/// A stored sample: its time and its fields.
type Stored = (i64, BTreeMap<String, Bson>);

fn bson_of(v: &FieldValue) -> Bson {
    match v {
        FieldValue::Num(x) => Bson::Double(*x),
        FieldValue::Str(s) => Bson::String(s.clone()),
        FieldValue::Bool(b) => Bson::Boolean(*b),
        FieldValue::Date(ms) => Bson::DateTime(bson::DateTime::from_millis(*ms)),
        FieldValue::Int(i) => Bson::Int64(*i),
    }
}

/// A sample's fields, without its time and sequence number, in name order.
fn fields_of(sample: &Document) -> BTreeMap<String, Bson> {
    sample
        .iter()
        .filter(|(k, _)| !palletd::decode::RESERVED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// One reading the decoder makes of an example: its sensor, its fields,
/// and its time, or the range of times it falls in when the example's
/// time is relative to its arrival (SenML's relative times, a message
/// without one).
struct Expected {
    example: String,
    sensor: String,
    fields: BTreeMap<String, Bson>,
    ts: std::ops::RangeInclusive<i64>,
}

fn expected(before: &[Reading], after: &[Reading], example: &str) -> Vec<Expected> {
    assert_eq!(before.len(), after.len(), "{example}: readings by arrival");
    before
        .iter()
        .zip(after)
        .map(|(a, b)| Expected {
            example: example.to_string(),
            sensor: a.sensor.clone(),
            fields: a
                .fields
                .iter()
                .map(|(n, v)| (n.clone(), bson_of(v)))
                .collect(),
            ts: a.ts_ms.min(b.ts_ms)..=a.ts_ms.max(b.ts_ms),
        })
        .collect()
}

#[tokio::test]
async fn every_published_example_is_stored_as_the_decoder_reads_it() {
    let stack = Stack::start("corpus", |c| {
        FAMILIES
            .iter()
            .copied()
            .chain(["opcua"])
            .fold(c, Config::preset)
            .subscription(&[
                ("topic", "corpus/senml/{sensor}".into()),
                ("format", "senml".into()),
            ])
            .subscription(&[
                ("topic", "corpus/senml-cbor/{sensor}".into()),
                ("format", "senml_cbor".into()),
            ])
            .subscription(&[
                ("topic", "corpus/cbor/{sensor}".into()),
                ("format", "cbor".into()),
            ])
            .subscription(&[
                ("topic", "corpus/msgpack/{sensor}".into()),
                ("format", "msgpack".into()),
            ])
            .subscription(&[
                ("topic", "corpus/lp/{sensor}".into()),
                ("format", "line_protocol".into()),
            ])
            .subscription(&[
                ("topic", "corpus/opcua/min/{sensor}".into()),
                ("format", "opcua".into()),
            ])
            // The examples' times go back to 2009 (and their dates to 0001,
            // as values).
            .set("bucket.max_lateness", "8000d")
            .set("limits.max_string_length", 4096)
    })
    .await;
    let messages = messages();
    // A retained message equal to its topic's last value is passed over
    // by the retained rule; no example repeats one (so each is read).
    for (i, m) in messages.iter().enumerate() {
        let repeat = messages[..i]
            .iter()
            .any(|p| p.topic == m.topic && p.payload == m.payload);
        assert!(!(m.retain && repeat), "{} repeats a retained value", m.id);
    }
    let settings = stack.config.settings();
    // A documented message on a topic no subscription takes (a command, a
    // bridge's own message) never reaches palletd; it is published all
    // the same.
    let filters: Vec<String> = (settings.subscriptions.iter())
        .map(|s| s.pattern.filter())
        .collect();
    let delivered: Vec<bool> = (messages.iter())
        .map(|m| filters.iter().any(|f| rumqttc::matches(&m.topic, f)))
        .collect();
    let received = delivered.iter().filter(|d| **d).count();
    let outside: Vec<&str> = (messages.iter().zip(&delivered))
        .filter(|(_, d)| !**d)
        .map(|(m, _)| m.id.as_str())
        .collect();
    eprintln!("outside the subscriptions: {outside:?}");
    let mut decoder = Decoder::new(settings.subscriptions.clone(), settings.decode_limits());
    let before = now_ms();
    let decoded_before: Vec<_> = (messages.iter())
        .map(|m| decoder.decode(&m.topic, &m.payload, before))
        .collect();

    let mut device = stack.publisher().await;
    for m in &messages {
        device
            .publish_as(&m.topic, m.payload.clone(), m.qos, m.retain)
            .await;
    }
    device.flush().await;
    stack
        .palletd
        .wait_metric("palletd_messages_received_total", received as f64)
        .await;
    stack.palletd.nothing_left_to_write().await;
    let after = now_ms();

    let mut want = Vec::new();
    let mut refused = Vec::new();
    let mut units: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for ((m, a), _) in (messages.iter().zip(&decoded_before))
        .zip(&delivered)
        .filter(|(_, d)| **d)
    {
        let b = decoder.decode(&m.topic, &m.payload, after);
        want.extend(expected(&a.readings, &b.readings, &m.id));
        for r in &a.readings {
            units
                .entry(r.sensor.clone())
                .or_default()
                .extend(r.units.iter().cloned());
        }
        if !a.errors.is_empty() {
            refused.push(m.topic.clone());
        }
    }
    assert!(
        received > 300 && want.len() > 300,
        "{received} messages delivered, {} readings expected",
        want.len()
    );

    // Each expected reading is one stored sample, and nothing else is.
    let mut stored: BTreeMap<String, Vec<Stored>> = BTreeMap::new();
    let mut stored_units: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for b in stack.docs("readings").await {
        let sensor = b.get_str("sensorId").unwrap().to_string();
        if let Ok(u) = b.get_document("units") {
            let u = u
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()));
            stored_units.entry(sensor.clone()).or_default().extend(u);
        }
        for s in b.get_array("samples").unwrap() {
            let s = s.as_document().unwrap();
            let ts = s.get_datetime("ts").unwrap().timestamp_millis();
            stored
                .entry(sensor.clone())
                .or_default()
                .push((ts, fields_of(s)));
        }
    }
    let mut problems = Vec::new();
    for w in &want {
        let samples = stored.entry(w.sensor.clone()).or_default();
        match samples
            .iter()
            .position(|(ts, f)| w.ts.contains(ts) && *f == w.fields)
        {
            Some(i) => {
                samples.swap_remove(i);
            }
            None => problems.push(format!(
                "{}: {} at {:?} not stored: {:?}",
                w.example, w.sensor, w.ts, w.fields
            )),
        }
    }
    for (sensor, left) in &stored {
        for (ts, f) in left {
            problems.push(format!(
                "stored beyond the decoder's reading: {sensor} at {ts}: {f:?}"
            ));
        }
    }
    units.retain(|_, u| !u.is_empty());
    if units != stored_units {
        problems.push(format!("units {stored_units:?}, read {units:?}"));
    }
    // Each refused message is one dead letter, under its topic.
    let mut dead: Vec<String> = (stack.docs("readings_deadletter").await.iter())
        .map(|d| d.get_str("topic").unwrap().to_string())
        .collect();
    dead.sort();
    refused.sort();
    if dead != refused {
        problems.push(format!("dead letters {dead:?}, refused {refused:?}"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
