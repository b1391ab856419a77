//! `format = "senml"`: Sensor Measurement Lists, JSON (RFC 8428): an array
//! of records, resolved as the RFC's section 4.6 says. Base fields (`bn`,
//! `bt`, `bu`, `bv`, `bs`) hold until a later record changes them; a
//! record's name is `bn` + `n`, its time `bt` + `t` in seconds (a resolved
//! time below 2^28 is relative to now: to the message's time), its value
//! `v` + `bv` (or `vs`, `vb`, `vd`; a sum `s` + `bs`).
//!
//! Records become samples by time: all records of one sensor at one time
//! are one sample. The sensor is the base name in effect, without the
//! separator it ends in (`urn:dev:ow:10e2073a01080063:` is the sensor
//! `urn:dev:ow:10e2073a01080063`); when the subscription has the topic's
//! `{sensor}` (or the MQTT 5 `sensor_property`), a pack of one base name
//! is that sensor, and a pack whose base name changes between records (a
//! gateway's pack of several devices) is a sensor per base name,
//! `<topic's sensor>:<base name>`. A record's field is its own name `n`,
//! or `value` when it has none (a base name naming the one measurement);
//! a name the pack gives with more than one unit (RFC 8428, 5.1.3: a
//! sensor's humidity, longitude and latitude, all under its base name) is
//! told apart by its unit, `<name>_<unit>` (`value_lon`; `%` in a unit is
//! stored escaped, `value_%25RH`). A sum is the field `<field>_sum`. A
//! record's unit (`u`, or `bu`) is kept once per bucket (see
//! [`Reading::units`]). Two records of one name, unit and time refuse
//! their sample (`field_collision`).
//!
//! Refused: a pack that is not an array of objects, a field the RFC says
//! must be understood (a key ending in `_`), a version above 10. A record
//! with a bad name, time or value refuses its sample.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use super::{check_sensor, DecodeError, Decoded, FieldValue, Message, Reading};

/// Below this a resolved time is relative to now (RFC 8428, 4.5.3).
const RELATIVE: f64 = 268_435_456.0;

/// One record as the RFC names its fields (the JSON labels).
#[derive(Debug, Default, Deserialize)]
struct Record<'a> {
    #[serde(borrow, default)]
    bn: Option<Cow<'a, str>>,
    bt: Option<f64>,
    #[serde(borrow, default)]
    bu: Option<Cow<'a, str>>,
    bv: Option<f64>,
    bs: Option<f64>,
    bver: Option<i64>,
    #[serde(borrow, default)]
    n: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    u: Option<Cow<'a, str>>,
    v: Option<f64>,
    #[serde(borrow, default)]
    vs: Option<Cow<'a, str>>,
    vb: Option<bool>,
    #[serde(borrow, default)]
    vd: Option<Cow<'a, str>>,
    s: Option<f64>,
    t: Option<f64>,
    /// Any other label: only to find the must-understand ones.
    #[serde(flatten, borrow)]
    other: BTreeMap<Cow<'a, str>, serde::de::IgnoredAny>,
}

/// The samples of one SenML pack in JSON.
pub(super) fn decode(msg: &Message<'_>, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let records: Vec<Record<'_>> = serde_json::from_slice(msg.payload)
        .map_err(|e| DecodeError::BadPayload(format!("not a SenML pack (RFC 8428): {e}")))?;
    resolve(msg, out, &records)
}

/// The labels of SenML in CBOR (RFC 8428, Table 6).
const CBOR_LABELS: &[(i64, &str)] = &[
    (-1, "bver"),
    (-2, "bn"),
    (-3, "bt"),
    (-4, "bu"),
    (-5, "bv"),
    (-6, "bs"),
    (0, "n"),
    (1, "u"),
    (2, "v"),
    (3, "vs"),
    (4, "vb"),
    (5, "s"),
    (6, "t"),
    (7, "ut"),
    (8, "vd"),
];

/// The samples of one SenML pack in CBOR: integer labels as the RFC's
/// table names them, a data value (`vd`, a byte string) as the base64url
/// text SenML JSON carries.
pub(super) fn decode_cbor(
    msg: &Message<'_>,
    out: &mut Decoded,
) -> Result<Vec<Reading>, DecodeError> {
    use base64::Engine as _;
    let bad = |e: String| DecodeError::BadPayload(format!("not a SenML CBOR pack (RFC 8428): {e}"));
    let pack: ciborium::Value = ciborium::de::from_reader_with_recursion_limit(msg.payload, 16)
        .map_err(|e| bad(e.to_string()))?;
    let ciborium::Value::Array(items) = pack else {
        return Err(bad("not an array".into()));
    };
    let mut records = Vec::with_capacity(items.len());
    for item in items {
        let ciborium::Value::Map(entries) = item else {
            return Err(bad("a record is not a map".into()));
        };
        let mut record = serde_json::Map::new();
        for (key, value) in entries {
            let label = match &key {
                ciborium::Value::Integer(i) => {
                    let i = i128::from(*i);
                    match CBOR_LABELS.iter().find(|(n, _)| i128::from(*n) == i) {
                        Some((_, name)) => name.to_string(),
                        // A label the table does not name, kept under its
                        // number (labels that must be understood are text).
                        None => format!("#{i}"),
                    }
                }
                ciborium::Value::Text(t) => t.clone(),
                _ => return Err(bad("a label is neither an integer nor text".into())),
            };
            let value = match value {
                ciborium::Value::Bytes(b) => serde_json::Value::String(
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b),
                ),
                ciborium::Value::Integer(i) => match i64::try_from(i128::from(i)) {
                    Ok(i) => serde_json::json!(i),
                    Err(_) => serde_json::json!(i128::from(i) as f64),
                },
                ciborium::Value::Float(x) => serde_json::json!(x),
                ciborium::Value::Text(t) => serde_json::Value::String(t),
                ciborium::Value::Bool(b) => serde_json::Value::Bool(b),
                _ => {
                    return Err(bad(format!(
                        "label {label:?} holds an array, a map, a tag or null"
                    )))
                }
            };
            record.insert(label, value);
        }
        records.push(serde_json::Value::Object(record));
    }
    let pack = serde_json::Value::Array(records);
    let records = Vec::<Record<'_>>::deserialize(&pack).map_err(|e| bad(e.to_string()))?;
    resolve(msg, out, &records)
}

/// A pack's records resolved into samples.
fn resolve<'a>(
    msg: &Message<'_>,
    out: &mut Decoded,
    records: &[Record<'a>],
) -> Result<Vec<Reading>, DecodeError> {
    let limits = msg.limits;
    if records.is_empty() {
        return Err(DecodeError::BadPayload("an empty pack: no records".into()));
    }
    let topic_sensor = super::topic_sensor(msg)?;
    // Each record resolved, with the base name in effect for it.
    let mut base = Base::default();
    let mut resolved: Vec<(usize, Cow<'a, str>, Resolved<'a>)> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if let Some(label) = r.other.keys().find(|k| k.ends_with('_')) {
            return Err(DecodeError::BadPayload(format!(
                "record {i}: label {label:?} must be understood (RFC 8428, 4.4) and palletd does not know it"
            )));
        }
        if let Some(v) = r.bver.filter(|v| *v > 10) {
            return Err(DecodeError::BadPayload(format!(
                "record {i}: SenML version {v} is newer than 10"
            )));
        }
        base.update(r);
        match base.resolve(r, msg.time_ms) {
            Ok(Some(x)) => resolved.push((i, base.name.clone(), x)),
            Ok(None) => {}
            Err(message) => out.errors.push(DecodeError::BadField {
                index: i,
                message: format!("record {i}: {message}"),
            }),
        }
    }
    // With the topic's sensor, a pack of one base name is that sensor; a
    // pack whose base name changes (a gateway's, several devices) is a
    // sensor per base name, under the topic's.
    let several = {
        let mut names = resolved.iter().map(|r| &r.1);
        let first = names.next();
        names.any(|n| Some(n) != first)
    };
    // A name given with more than one unit in the pack is told apart by
    // its unit (RFC 8428 resolves a record by its name and unit).
    let mut units_of: HashMap<(&str, &str), Vec<Option<&str>>> = HashMap::new();
    for (_, bn, r) in &resolved {
        let seen = units_of.entry((bn.as_ref(), r.field.as_ref())).or_default();
        if !seen.contains(&r.unit.as_deref()) {
            seen.push(r.unit.as_deref());
        }
    }
    // (sensor, time) -> its sample, in the order first seen.
    let mut samples: Vec<Reading> = Vec::new();
    let mut by_time: HashMap<(String, i64), usize> = Default::default();
    for (i, bn, r) in &resolved {
        let id = bn.trim_end_matches([':', '/', '.', '-', '_']);
        let sensor = match topic_sensor {
            Some(s) if several && !id.is_empty() => format!("{s}:{id}"),
            Some(s) => s.to_string(),
            None => id.to_string(),
        };
        if topic_sensor.is_none() || several {
            if let Err(e) = check_sensor(&sensor, limits) {
                out.errors.push(e);
                continue;
            }
        }
        let field = match (units_of[&(bn.as_ref(), r.field.as_ref())].len(), &r.unit) {
            (2.., Some(u)) => format!("{}_{u}", r.field),
            _ => r.field.to_string(),
        };
        let next = samples.len();
        let at = *by_time.entry((sensor.clone(), r.ts_ms)).or_insert(next);
        if at == next {
            if samples.len() >= limits.max_samples_per_message {
                return Err(super::too_many_samples(samples.len() + 1, limits));
            }
            samples.push(Reading {
                sensor,
                ts_ms: r.ts_ms,
                index: next,
                ..Reading::default()
            });
        }
        let sample = &mut samples[at];
        for (suffix, value) in &r.values {
            // One past the cap is enough to refuse the sample.
            if sample.fields.len() > limits.max_fields_per_sample {
                break;
            }
            let name = format!("{field}{suffix}");
            match super::take_field(&name, value.clone(), limits) {
                Ok((field, value)) => {
                    if let Some(unit) = &r.unit {
                        set(&mut sample.units, &field, unit.to_string());
                    }
                    // A second value of a field (one name, unit and time
                    // twice) stays: the sample is refused for it.
                    sample.fields.push((field, value));
                }
                Err(why) => out.dropped.push(super::Dropped::of(*i, &name, why)),
            }
        }
    }
    Ok(super::within_field_cap(samples, limits, &mut out.errors))
}

/// Sets `name` in a list of names and values: the last one wins.
fn set<T>(list: &mut Vec<(String, T)>, name: &str, value: T) {
    match list.iter_mut().find(|(n, _)| n == name) {
        Some(slot) => slot.1 = value,
        None => list.push((name.to_string(), value)),
    }
}

/// The base fields in effect.
#[derive(Debug, Default)]
struct Base<'a> {
    name: Cow<'a, str>,
    time: f64,
    unit: Option<Cow<'a, str>>,
    value: f64,
    sum: f64,
}

/// One record resolved: its time, field name (its own name, or `value`),
/// unit, and values by what follows the field's name (`""`, `"_sum"`).
struct Resolved<'a> {
    ts_ms: i64,
    field: Cow<'a, str>,
    unit: Option<Cow<'a, str>>,
    values: Vec<(&'static str, FieldValue)>,
}

impl<'a> Base<'a> {
    fn update(&mut self, r: &Record<'a>) {
        if let Some(bn) = &r.bn {
            self.name = bn.clone();
        }
        if let Some(bt) = r.bt {
            self.time = bt;
        }
        if let Some(bu) = &r.bu {
            self.unit = Some(bu.clone());
        }
        if let Some(bv) = r.bv {
            self.value = bv;
        }
        if let Some(bs) = r.bs {
            self.sum = bs;
        }
    }

    /// The record's fields; `None` for a record of base fields only.
    fn resolve(&self, r: &Record<'a>, now_ms: i64) -> Result<Option<Resolved<'a>>, String> {
        let name = r.n.as_deref().unwrap_or_default();
        let full = format!("{}{name}", self.name);
        check_name(&full)?;
        let field = match &r.n {
            Some(n) if !n.is_empty() => n.clone(),
            _ => Cow::Borrowed("value"),
        };
        let mut values = Vec::new();
        let finite = |x: f64, what: &str| {
            if x.is_finite() {
                Ok(x)
            } else {
                Err(format!("{full:?}: {what} out of range"))
            }
        };
        if let Some(v) = r.v {
            values.push(("", FieldValue::Num(finite(self.value + v, "value")?)));
        } else if let Some(vs) = &r.vs {
            values.push(("", FieldValue::Str(vs.to_string())));
        } else if let Some(vb) = r.vb {
            values.push(("", FieldValue::Bool(vb)));
        } else if let Some(vd) = &r.vd {
            values.push(("", FieldValue::Str(vd.to_string())));
        }
        if let Some(s) = r.s {
            values.push(("_sum", FieldValue::Num(finite(self.sum + s, "sum")?)));
        }
        if values.is_empty() {
            return Ok(None);
        }
        let t = self.time + r.t.unwrap_or(0.0);
        let secs = if t.abs() < RELATIVE {
            now_ms as f64 / 1e3 + t
        } else {
            t
        };
        let ms = (secs * 1e3).round();
        if !ms.is_finite() || ms.abs() > 8.64e15 {
            return Err(format!(
                "{full:?}: time {t} is outside the representable date range"
            ));
        }
        Ok(Some(Resolved {
            ts_ms: ms as i64,
            field,
            unit: r.u.clone().or_else(|| self.unit.clone()),
            values,
        }))
    }
}

/// RFC 8428, 4.5.1: a name is 1 or more of `A-Z a-z 0-9 - : . / _`,
/// starting with a letter or digit.
fn check_name(name: &str) -> Result<(), String> {
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-:./_".contains(&b))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name {:?} is not a SenML name (letters, digits, - : . / _, starting with a letter or digit)",
            super::truncate(name, 64)
        ))
    }
}
