//! The Sparkplug B decoder on any bytes, several messages in a row so that
//! what a BIRTH teaches is used by the DATA after it.
//!
//! Input: messages separated by the byte 0xFE; the first byte of each picks
//! its topic (edge node or device, BIRTH, DATA, DEATH, a command, a bad
//! topic), the rest is its payload. Every decoded reading must have a valid
//! sensor id and field names MongoDB takes; nothing may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use palletd::decode::{
    check_field_name, Decoder, FieldValue, Limits, PayloadFormat, Subscription, TopicPattern,
    DEFAULT_SENSOR_ID_PATTERN,
};

const TOPICS: &[&str] = &[
    "spBv1.0/G/NBIRTH/N",
    "spBv1.0/G/NDATA/N",
    "spBv1.0/G/DBIRTH/N/D",
    "spBv1.0/G/DDATA/N/D",
    "spBv1.0/G/DDEATH/N/D",
    "spBv1.0/G/NDEATH/N",
    "spBv1.0/G/NCMD/N",
    "spBv1.0/STATE/host",
    "spBv1.0/G/NDATA/N/extra",
];

const NOW: i64 = 1_787_234_400_000;

fn decoder() -> Decoder {
    let limits = Limits {
        max_payload_size: 1 << 20,
        max_lateness_ms: 7 * 86_400_000,
        max_future_ms: 300_000,
        max_samples_per_message: 1000,
        max_fields_per_sample: 8,
        max_field_name_length: 64,
        max_string_length: 1024,
        sensor_id_pattern: regex::Regex::new(&format!("^(?:{DEFAULT_SENSOR_ID_PATTERN})$"))
            .unwrap(),
        max_sparkplug_nodes: 100,
        max_sparkplug_devices_per_node: 100,
        max_sparkplug_aliases: 10_000,
        max_sparkplug_bytes: 64 << 20,
    };
    Decoder::new(
        vec![Subscription {
            rebirth_min_interval: Some(std::time::Duration::from_secs(60)),
            ..Subscription::new(
                TopicPattern::parse("spBv1.0/#").unwrap(),
                PayloadFormat::SparkplugB,
            )
        }],
        limits,
    )
}

fuzz_target!(|data: &[u8]| {
    let mut d = decoder();
    for (i, message) in data.split(|b| *b == 0xFE).take(16).enumerate() {
        let Some((pick, payload)) = message.split_first() else {
            continue;
        };
        let topic = TOPICS[usize::from(*pick) % TOPICS.len()];
        let out = d.decode(topic, payload, NOW + i as i64);
        for r in &out.readings {
            assert!(r.sensor.starts_with("G:N"));
            assert!(r.fields.len() <= 8, "{:?}", r.fields);
            for (name, v) in &r.fields {
                assert!(check_field_name(name).is_ok(), "{name:?}");
                if let FieldValue::Num(x) = v {
                    assert!(x.is_finite());
                }
            }
        }
        // What is saved of the state loads back and saves the same (the
        // sequence numbers and rebirth times are not saved).
        let saved = palletd::decode::sparkplug::snapshot(d.sparkplug_state(), 0);
        let (loaded, _) = palletd::decode::sparkplug::load(&saved).expect("a saved state loads");
        assert_eq!(palletd::decode::sparkplug::snapshot(&loaded, 0), saved);
    }
});
