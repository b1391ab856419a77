//! Payload decoding and topic matching: any topic and payload bytes either
//! decode to valid readings or to typed errors, never a panic. Every format
//! that needs no state (and OPC UA, whose metadata state each input starts
//! without): JSON (flat, nested, chosen by paths, with a time
//! zone; CBOR and MessagePack read the same way), number, value, SenML in
//! JSON and CBOR, OPC UA PubSub JSON and line protocol; topic patterns
//! (several `{field}` levels, `$` levels never captured).
#![no_main]

use libfuzzer_sys::fuzz_target;
use palletd::decode::{Subscription, DEFAULT_SENSOR_ID_PATTERN};
use palletd::decode::{check_field_name, field_name, original_name, RESERVED};
use palletd::decode::{Arrays, Decoder, FieldValue, Limits, Path, PayloadFormat, TopicPattern};

fn subscription(topic: &str, format: PayloadFormat, sensor_field: Option<&str>) -> Subscription {
    let mut s = Subscription::new(TopicPattern::parse(topic).unwrap(), format);
    s.selection.sensor = sensor_field.map(|f| Path::key_or_pointer(f).unwrap());
    s
}

/// The paths of a subscription like the Shelly preset's, and a zone.
fn selecting() -> Subscription {
    let mut s = subscription("rpc/{sensor}", PayloadFormat::Json, None);
    let pointer = |p: &str| Path::parse(p, true).unwrap();
    s.selection.root = pointer("/params");
    s.selection.include = vec![pointer("/*/tC"), pointer("/a"), pointer("/l/*")];
    s.selection.exclude = vec![pointer("/a/id")];
    s.selection.rename = vec![(pointer("/a/v"), "temp".into())];
    s.selection.timestamp = Path::key_or_pointer("/meta/ts").unwrap();
    s.selection.sensor = Some(Path::key_or_pointer("/meta/src").unwrap());
    s.timezone = Some(chrono_tz::Europe::Berlin);
    s
}

const NOW: i64 = 1_787_234_400_000;

fn decoder() -> Decoder {
    Decoder::new(
        vec![
            subscription("sensors/{sensor}/telemetry", PayloadFormat::Json, None),
            subscription("plant/{sensor}/{field}", PayloadFormat::Number, None),
            subscription("fleet/#", PayloadFormat::Json, Some("device")),
            subscription("value/{sensor}/{field}", PayloadFormat::Value, None),
            // Homie's: a field of two levels; `$` levels are metadata.
            subscription("homie/{sensor}/{field}/{field}", PayloadFormat::Value, None),
            subscription("senml/{sensor}", PayloadFormat::Senml, None),
            // SenML with the sensor from each record's base name.
            subscription("packs/#", PayloadFormat::Senml, None),
            subscription("opcua/#", PayloadFormat::OpcUa, None),
            subscription("cbor/{sensor}", PayloadFormat::Cbor, None),
            subscription("msgpack/{sensor}", PayloadFormat::MsgPack, None),
            subscription("senmlc/{sensor}", PayloadFormat::SenmlCbor, None),
            subscription("lp/{sensor}", PayloadFormat::LineProtocol, None),
            Subscription {
                sensor_template: Some("{host}:{measurement}".into()),
                ..subscription("lpt/#", PayloadFormat::LineProtocol, None)
            },
            selecting(),
            {
                let mut s = subscription("flat/{sensor}", PayloadFormat::Json, None);
                s.selection.separator = "_".into();
                s.selection.arrays = Arrays::Drop;
                s
            },
        ],
        Limits {
            max_payload_size: 64 * 1024,
            max_lateness_ms: 7 * 86_400_000,
            max_future_ms: 300_000,
            max_samples_per_message: 100,
            max_fields_per_sample: 32,
            max_field_name_length: 64,
            max_string_length: 256,
            sensor_id_pattern: regex::Regex::new(&format!("^(?:{DEFAULT_SENSOR_ID_PATTERN})$")).unwrap(),
            max_sparkplug_nodes: 100,
            max_sparkplug_devices_per_node: 100,
            max_sparkplug_aliases: 10_000,
            max_sparkplug_bytes: 64 << 20,
        },
    )
}

static DECODER: std::sync::OnceLock<Decoder> = std::sync::OnceLock::new();

fuzz_target!(|data: &[u8]| {
    // First line: the topic; the rest: the payload.
    let split = data.iter().position(|b| *b == b'\n').unwrap_or(data.len());
    let topic = String::from_utf8_lossy(&data[..split]);
    let payload = data.get(split + 1..).unwrap_or_default();
    // Decoding takes the decoder mutably (Sparkplug state); these formats
    // have none, so each input gets a copy of the one decoder.
    let out = DECODER.get_or_init(decoder).clone().decode(&topic, payload, NOW);
    for r in &out.readings {
        assert!(!r.sensor.is_empty() && r.sensor.len() <= 128);
        assert!((r.ts_ms - NOW).abs() <= 7 * 86_400_000);
        assert!(r.fields.len() <= 32);
        for (name, value) in &r.fields {
            // Escaped the one way of every format: valid, none of
            // palletd's own, and the payload's name recoverable.
            assert!(check_field_name(name).is_ok(), "{name:?}");
            assert!(!RESERVED.contains(&name.as_str()) && !name.starts_with('_'), "{name:?}");
            let original = original_name(name).expect("an escape field_name made");
            assert_eq!(field_name(&original), name.as_str());
            if let FieldValue::Num(x) = value {
                assert!(x.is_finite());
            }
        }
        // Units name fields of the sample, escaped the same way.
        for (name, _) in &r.units {
            assert!(check_field_name(name).is_ok(), "{name:?}");
        }
    }
    // Topic patterns: parsing any text never panics, and a parsed pattern
    // matches its own filter's shape; matched against the payload as a
    // topic, no capture holds a `$` level.
    if let Ok(p) = TopicPattern::parse(&topic) {
        let _ = p.matches(&p.filter());
        if let Some(m) = std::str::from_utf8(payload).ok().and_then(|t| p.matches(t)) {
            for capture in [m.sensor, m.field].into_iter().flatten() {
                assert!(!capture.split('/').any(|l| l.starts_with('$')), "{capture:?}");
            }
        }
    }
});
