//! palletd's decoders against the reference implementations in the
//! package registries, on every example of `tests/corpus` in their
//! formats: PyPI's `cbor2` (CBOR), `msgpack` (MessagePack, its Timestamp
//! extension read as a time) and `line-protocol-parser` (InfluxDB line
//! protocol), run by `reference.py`. For each payload, what the reference
//! reads and what palletd stores must agree:
//!
//! - every value the reference reads under a path (numbers, text,
//!   booleans, times) is stored under that path's field name with the same
//!   value, or the sample is refused with a cause;
//! - a value of a kind palletd does not store (a byte string, an unknown
//!   extension or tag, a non-finite number, a key that is not text) is
//!   never passed over in silence: the sample is refused with a cause;
//! - nothing is stored that the reference does not read, and a payload the
//!   reference refuses is refused.
//!
//! Where palletd reads a payload otherwise by a documented rule, the
//! exemption is listed with it.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use palletd::decode::{field_name, Decoded, Decoder, FieldValue};
use serde_json::{json, Value};

/// Where scripts/install-test-services puts the reference implementations.
fn reference_path() -> std::path::PathBuf {
    let home = std::env::var("HOME").expect("HOME");
    let dir = std::path::Path::new(&home).join(".cache/palletd-test/pyref");
    for module in ["cbor2", "msgpack", "line_protocol_parser"] {
        assert!(
            dir.join(module).exists(),
            "{module} (PyPI) is not in {}: run scripts/install-test-services",
            dir.display()
        );
    }
    dir
}

/// The reference's answer to each request, in order.
fn reference(requests: &[Value]) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/suite/reference.py");
    let mut child = Command::new("python3")
        .arg(script)
        .env("PYTHONPATH", reference_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3: run scripts/install-test-services");
    let mut input = String::new();
    for r in requests {
        input.push_str(&r.to_string());
        input.push('\n');
    }
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "reference.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), requests.len());
    answers
}

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

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A decoder of these formats, with the limits widened to the examples'
/// (times back to 1970, long texts, many fields).
fn decoder() -> Decoder {
    let text = r#"
[mqtt]
url = "mqtt://127.0.0.1:1883"
client_id = "reference"

[mongodb]
uri = "mongodb://127.0.0.1:27017"
database = "reference"

[bucket]
max_lateness = "30000d"

[limits]
max_fields_per_sample = 1000
max_string_length = 4096

[[subscription]]
topic = "cbor/{sensor}"
format = "cbor"

[[subscription]]
topic = "msgpack/{sensor}"
format = "msgpack"

[[subscription]]
topic = "lp/{sensor}"
format = "line_protocol"
"#;
    let settings = palletd::config::parse(text, None).unwrap_or_else(|e| panic!("{e:?}"));
    Decoder::new(settings.subscriptions.clone(), settings.decode_limits())
}

/// Whether a stored value is the reference's leaf.
fn same(stored: &FieldValue, leaf: &Value) -> bool {
    let v = &leaf["value"];
    match (stored, leaf["kind"].as_str().unwrap()) {
        (FieldValue::Num(x), "num") => v.as_f64() == Some(*x),
        (FieldValue::Str(s), "str") => v.as_str() == Some(s),
        (FieldValue::Bool(b), "bool") => v.as_bool() == Some(*b),
        (FieldValue::Date(ms), "date") => v.as_i64() == Some(*ms),
        _ => false,
    }
}

/// Compares one sample's stored fields with the reference's leaves;
/// `refused` is whether palletd refused anything of it (with a cause),
/// `whole` whether that refusal took the whole sample.
fn compare(
    id: &str,
    fields: &[(String, FieldValue)],
    (refused, whole): (bool, bool),
    leaves: &[Value],
    problems: &mut Vec<String>,
) {
    let other = leaves.iter().any(|l| l["kind"] == "other");
    // A refusal the reference's reading does not explain is a valid
    // encoding refused; a value palletd cannot store and does not refuse
    // is passed over in silence.
    if refused != other {
        problems.push(format!(
            "{id}: refused: {refused}, stored {fields:?}; the reference reads {leaves:?}"
        ));
        return;
    }
    if whole {
        return;
    }
    let mut stored: BTreeMap<&str, &FieldValue> =
        fields.iter().map(|(n, v)| (n.as_str(), v)).collect();
    for l in leaves {
        let path = l["path"].as_str().unwrap();
        let got = stored.remove(&*field_name(path));
        match (l["kind"].as_str().unwrap(), got) {
            ("null" | "other", None) => {}
            (_, Some(g)) if same(g, l) => {}
            (_, g) => problems.push(format!(
                "{id}: {path} stored as {g:?}, the reference reads {l}"
            )),
        }
    }
    if !stored.is_empty() {
        problems.push(format!(
            "{id}: stored beyond the reference's reading: {stored:?}"
        ));
    }
}

/// The fields of the one sample a wrapped item makes, whether anything of
/// it was refused and whether all of it was.
fn one_sample(out: &Decoded) -> (Vec<(String, FieldValue)>, (bool, bool)) {
    let fields = out
        .readings
        .first()
        .map(|r| r.fields.clone())
        .unwrap_or_default();
    let refused = !out.errors.is_empty();
    (fields, (refused, refused && out.readings.is_empty()))
}

/// CBOR (RFC 8949's every example) and MessagePack (every type of its
/// spec), each data item the value `v` of a map.
#[test]
fn cbor_and_msgpack_read_as_cbor2_and_msgpack_read_them() {
    let mut d = decoder();
    let mut cases = Vec::new();
    for (format, head) in [
        ("cbor", &[0xa1, 0x61, b'v']),
        ("msgpack", &[0x81, 0xa1, b'v']),
    ] {
        for e in corpus(format) {
            let id = format!("{format}/{}", e["id"].as_str().unwrap());
            if id.contains("rfc8428") {
                continue; // SenML's: a pack, not a data item
            }
            let mut payload = head.to_vec();
            payload.extend(hex(e["payload_hex"].as_str().unwrap()));
            cases.push((id, format, payload));
        }
    }
    let requests: Vec<Value> = (cases.iter())
        .map(|(_, f, p)| json!({"format": f, "hex": to_hex(p)}))
        .collect();
    let answers = reference(&requests);
    let mut problems = Vec::new();
    for ((id, format, payload), answer) in cases.iter().zip(&answers) {
        let out = d.decode(&format!("{format}/dev"), payload, palletd_now());
        if let Some(why) = answer["error"].as_str() {
            if out.errors.is_empty() {
                problems.push(format!(
                    "{id}: the reference refuses it ({why}), palletd read {out:?}"
                ));
            }
            continue;
        }
        let (fields, refused) = one_sample(&out);
        compare(
            id,
            &fields,
            refused,
            answer["leaves"].as_array().unwrap(),
            &mut problems,
        );
    }
    assert!(cases.len() >= 160, "{} examples", cases.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// "now" for the decoder: the examples carry their own times or none.
fn palletd_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The InfluxDB line protocol references' every example: each line read
/// as line-protocol-parser reads it (its tags stored as text fields: the
/// subscription names no sensor_template), at its time where that time is
/// in nanoseconds (palletd tells a time's unit by its magnitude; the
/// examples written with another precision are checked against their
/// meaning in src/decode/corpus.rs).
#[test]
fn line_protocol_reads_as_line_protocol_parser_reads_it() {
    let mut d = decoder();
    let examples = corpus("line_protocol");
    let requests: Vec<Value> = (examples.iter())
        .map(|e| json!({"format": "line_protocol", "text": e["payload_text"]}))
        .collect();
    let answers = reference(&requests);
    let mut problems = Vec::new();
    for (e, answer) in examples.iter().zip(&answers) {
        let id = format!("line_protocol/{}", e["id"].as_str().unwrap());
        let payload = e["payload_text"].as_str().unwrap();
        let out = d.decode("lp/dev", payload.as_bytes(), palletd_now());
        let lines = answer["lines"].as_array().unwrap();
        let refused = lines.iter().filter(|l| l.get("error").is_some()).count();
        if out.errors.len() != refused {
            problems.push(format!(
                "{id}: the reference refuses {refused} lines, palletd {:?}",
                out.errors
            ));
            continue;
        }
        let read: Vec<&Value> = lines.iter().filter(|l| l.get("error").is_none()).collect();
        if read.len() != out.readings.len() {
            problems.push(format!(
                "{id}: the reference reads {read:?}, palletd {out:?}"
            ));
            continue;
        }
        for (l, r) in read.iter().zip(&out.readings) {
            let mut leaves: Vec<Value> = l["fields"].as_array().unwrap().clone();
            for (k, v) in l["tags"].as_object().unwrap() {
                leaves.push(json!({"path": k, "kind": "str", "value": v}));
            }
            compare(&id, &r.fields, (false, false), &leaves, &mut problems);
            if let Some(t) = l["time"]
                .as_i64()
                .filter(|t| t.unsigned_abs() >= 100_000_000_000_000_000)
            {
                if r.ts_ms != t.div_euclid(1_000_000) {
                    problems.push(format!("{id}: time {} for the reference's {t} ns", r.ts_ms));
                }
            }
        }
    }
    assert!(examples.len() >= 90, "{} examples", examples.len());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
