//! `format = "opcua"`: OPC UA PubSub JSON (OPC 10000-14, 7.2.5): a
//! NetworkMessage (`"MessageType": "ua-data"`, its DataSetMessages in
//! `Messages`), one DataSetMessage, or an array of them (a publisher with
//! the NetworkMessage header off).
//!
//! - The sensor is the topic's `{sensor}` when the subscription has one,
//!   else `<PublisherId>:<DataSetWriterId>` (the DataSetMessage's own
//!   PublisherId, else the NetworkMessage's; `DataSetWriterName` when
//!   there is no id).
//! - A field is a Payload entry: a value (the non-reversible encoding,
//!   RawData), a Variant (`{"Type": 11, "Body": 25.5}`, or 1.05's
//!   `{"UaType": 11, "Value": 25.5}`) or a DataValue (`{"Value": ...,
//!   "Status": ..., "SourceTimestamp": ...}` as OPC 10000-6 writes it;
//!   `StatusCode` for `Status` too, as some publishers write it). A structure's fields and
//!   an array's elements become fields by path, as nested JSON does
//!   (`Coordinate.X`, `Measurements.0`).
//! - A field's time is its SourceTimestamp, else the DataSetMessage's
//!   Timestamp, else the message's time; fields of one time are one
//!   sample. A StatusCode other than Good (0) is kept as the field
//!   `<name>.StatusCode`, the DataSetMessage's Status as `StatusCode`.
//! - A `ua-metadata` message (DataSetMetaData) stores nothing; the
//!   EngineeringUnits of its fields (a field's `Properties`) are kept
//!   ([`Units`]) and go with that writer's fields from then on, once per
//!   bucket (`units: {Temperature: "°C"}`): the EUInformation's
//!   DisplayName, else the UNECE code its UnitId packs (`CEL`).
//! - A DataSetMessage without a header (1.05's minimal form, A.3.2: the
//!   fields alone, `{"Active": true, "Temperature": 25.5}`) is its fields;
//!   its sensor is then the topic's `{sensor}`.
//! - Other message types (`ua-keepalive`, `ua-status`, a DataSetMessage
//!   with a header and without Payload) store nothing and are not
//!   refused.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::{check_sensor, DecodeError, Decoded, FieldValue, Message, Reading};

/// The most field units kept from metadata, over all writers (at most
/// about 200 bytes each: a name within `limits.max_field_name_length`, a
/// unit of at most [`MAX_UNIT_LEN`]): a writer beyond is refused with its
/// metadata message.
pub(crate) const MAX_UNITS: usize = 10_000;

/// The longest unit text kept; a longer one is not read.
pub(crate) const MAX_UNIT_LEN: usize = 64;

/// The EngineeringUnits `ua-metadata` messages gave, by writer
/// (`<PublisherId>:<DataSetWriterId>`) and field. Kept in memory only: a
/// publisher sends its metadata when it starts and when it changes (and
/// retains it, which palletd receives on subscribe through a plain
/// subscription); a bucket that has its units keeps them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Units {
    by_writer: HashMap<String, HashMap<String, String>>,
    count: usize,
}

impl Units {
    fn of(&self, writer: Option<&str>, field: &str) -> Option<&str> {
        self.by_writer.get(writer?)?.get(field).map(String::as_str)
    }

    /// A writer's units now; `false` (nothing changed) past [`MAX_UNITS`].
    fn set(&mut self, writer: String, units: HashMap<String, String>) -> bool {
        let old = self.by_writer.get(&writer).map_or(0, HashMap::len);
        if self.count - old + units.len() > MAX_UNITS {
            return false;
        }
        self.count = self.count - old + units.len();
        if units.is_empty() {
            self.by_writer.remove(&writer);
        } else {
            self.by_writer.insert(writer, units);
        }
        true
    }
}

/// The members of a DataSetMessage's header (OPC 10000-14, 7.2.5.4): a
/// DataSetMessage without any of them and without a Payload is its
/// fields (no header at all).
const HEADER: &[&str] = &[
    "DataSetWriterId",
    "DataSetWriterName",
    "PublisherId",
    "WriterGroupName",
    "SequenceNumber",
    "MetaDataVersion",
    "MinorVersion",
    "Timestamp",
    "Status",
    "MessageType",
];

/// DataSetMessages and their NetworkMessage's PublisherId.
type DataSetMessages<'a> = (Option<String>, Vec<&'a Map<String, Value>>);

/// The samples of one PubSub JSON message.
pub(super) fn decode(
    msg: &Message<'_>,
    out: &mut Decoded,
    units: &mut Units,
) -> Result<Vec<Reading>, DecodeError> {
    let limits = msg.limits;
    let top: Value = serde_json::from_slice(msg.payload)
        .map_err(|e| DecodeError::BadPayload(format!("invalid JSON: {e}")))?;
    // The tree keeps one value of a repeated key: such a message is
    // refused as a whole (its DataSetMessages are not told apart).
    if let Some(key) = super::json::repeated_key(msg.payload) {
        return Err(super::collision(0, &key));
    }
    if let Value::Object(o) = &top {
        if o.get("MessageType").and_then(Value::as_str) == Some("ua-metadata") {
            learn_units(o, units, limits.max_field_name_length)?;
            return Ok(Vec::new());
        }
    }
    let Some((publisher, messages)) = dataset_messages(&top)? else {
        return Ok(Vec::new());
    };
    let topic_sensor = super::topic_sensor(msg)?;
    let mut got = Gathered {
        samples: Vec::new(),
        by_time: HashMap::new(),
        max_fields: limits.max_fields_per_sample,
    };
    for (i, m) in messages.into_iter().enumerate() {
        let top_fields = Value::Object(m.clone());
        if got.samples.len() > limits.max_samples_per_message {
            break;
        }
        if m.get("MessageType")
            .and_then(Value::as_str)
            .is_some_and(|t| t != "ua-deltaframe" && t != "ua-keyframe")
        {
            continue;
        }
        let payload = match m.get("Payload") {
            Some(p) => p,
            // Without a header (1.05, A.3.2: an empty
            // DataSetMessageContentMask) a DataSetMessage is its fields.
            None if !m.is_empty() && !m.keys().any(|k| HEADER.contains(&k.as_str())) => &top_fields,
            None => continue, // a keep-alive
        };
        let Value::Object(payload) = payload else {
            out.errors.push(DecodeError::BadField {
                index: i,
                message: format!("DataSetMessage {i}: Payload is not an object"),
            });
            continue;
        };
        let writer = writer_id(m, publisher.as_deref());
        let sensor = match sensor_of(topic_sensor, writer.as_deref(), i, limits) {
            Ok(sensor) => sensor,
            Err(e) => {
                out.errors.push(e);
                continue;
            }
        };
        let header_time = match m.get("Timestamp") {
            None => msg.time_ms,
            Some(t) => match time(t) {
                Ok(t) => t,
                Err(message) => {
                    out.errors
                        .push(DecodeError::BadTimestamp { index: i, message });
                    continue;
                }
            },
        };
        if let Some(code) = m.get("Status").and_then(status_code).filter(|c| *c != 0) {
            got.add(
                &sensor,
                header_time,
                "StatusCode".into(),
                FieldValue::Num(code as f64),
                None,
            );
        }
        for (name, field) in payload {
            let Some((value, ts)) =
                field_value(name, field, header_time, (i, &sensor), &mut got, out)
            else {
                continue;
            };
            // A structure's or an array's unit goes with each of its leaves.
            let unit = units.of(writer.as_deref(), name);
            let mut leaves = Vec::new();
            flatten(name, variant(value), 0, &mut leaves);
            for (name, v) in leaves {
                let too_deep = ("bad_field", "nested deeper than 16 levels".to_string());
                match v
                    .ok_or(too_deep)
                    .and_then(|v| super::take_field(&name, v, limits))
                {
                    Ok((field, v)) => got.add(&sensor, ts, field, v, unit),
                    Err(why) => out.dropped.push(super::Dropped::of(i, &name, why)),
                }
            }
        }
    }
    if got.samples.len() > limits.max_samples_per_message {
        return Err(super::too_many_samples(got.samples.len(), limits));
    }
    Ok(super::within_field_cap(
        got.samples,
        limits,
        &mut out.errors,
    ))
}

/// A payload field's value and time: a DataValue's (its non-zero
/// StatusCode added as a field of its own) or a bare value at the
/// message's time; `None` when there is nothing to store (a bad
/// SourceTimestamp, noted in `out`, or a DataValue without a value).
fn field_value<'a>(
    name: &str,
    field: &'a Value,
    header_time: i64,
    (i, sensor): (usize, &str),
    got: &mut Gathered,
    out: &mut Decoded,
) -> Option<(&'a Value, i64)> {
    match data_value(field) {
        Some(dv) => {
            if let Some(code) = dv.status.filter(|c| *c != 0) {
                let ts = dv.source.as_ref().and_then(|t| time(t).ok());
                got.add(
                    sensor,
                    ts.unwrap_or(header_time),
                    super::field_name(&format!("{name}.StatusCode")).into_owned(),
                    FieldValue::Num(code as f64),
                    None,
                );
            }
            let ts = match dv.source.map(time) {
                None => header_time,
                Some(Ok(t)) => t,
                Some(Err(message)) => {
                    out.dropped.push(super::Dropped {
                        index: i,
                        cause: "bad_field",
                        message: format!("field {name:?}: SourceTimestamp {message}"),
                    });
                    return None;
                }
            };
            match dv.value {
                Some(v) => Some((v, ts)),
                None => None,
            }
        }
        None => Some((field, header_time)),
    }
}

/// A message's readings: one per (sensor, time), in the order they first
/// appear.
struct Gathered {
    samples: Vec<Reading>,
    by_time: HashMap<(String, i64), usize>,
    max_fields: usize,
}

impl Gathered {
    /// Adds a field to the reading of `sensor` at `ts_ms`. Past the sample
    /// cap the message is refused; a sample past the field cap is refused
    /// later (one field over is enough to know).
    fn add(
        &mut self,
        sensor: &str,
        ts_ms: i64,
        name: String,
        value: FieldValue,
        unit: Option<&str>,
    ) {
        let next = self.samples.len();
        let at = *self
            .by_time
            .entry((sensor.to_string(), ts_ms))
            .or_insert(next);
        if at == next {
            self.samples.push(Reading {
                sensor: sensor.to_string(),
                ts_ms,
                index: next,
                ..Reading::default()
            });
        }
        let sample = &mut self.samples[at];
        if sample.fields.len() <= self.max_fields {
            if let Some(unit) = unit {
                sample.units.push((name.clone(), unit.to_string()));
            }
            sample.fields.push((name, value));
        }
    }
}

/// The DataSetMessages of a payload (a NetworkMessage's, an array of
/// them, or one alone) and the NetworkMessage's PublisherId; `None` for a
/// NetworkMessage of another type than data.
fn dataset_messages(top: &Value) -> Result<Option<DataSetMessages<'_>>, DecodeError> {
    Ok(Some(match top {
        Value::Object(o) if o.contains_key("Messages") => {
            match o.get("MessageType").and_then(Value::as_str) {
                Some("ua-data") | None => {}
                Some(_) => return Ok(None),
            }
            let Some(Value::Array(items)) = o.get("Messages") else {
                return Err(DecodeError::BadPayload(
                    "a NetworkMessage's Messages must be an array".into(),
                ));
            };
            (id_text(o.get("PublisherId")), objects(items)?)
        }
        Value::Object(o) => (None, vec![o]),
        Value::Array(items) => (None, objects(items)?),
        _ => {
            return Err(DecodeError::BadPayload(
                "expected an OPC UA PubSub JSON NetworkMessage or DataSetMessage".into(),
            ))
        }
    }))
}

/// A DataSetMessage's sensor: the topic's, else its writer's id.
fn sensor_of(
    topic_sensor: Option<&str>,
    writer: Option<&str>,
    i: usize,
    limits: &super::Limits,
) -> Result<String, DecodeError> {
    match (topic_sensor, writer) {
        (Some(s), _) => Ok(s.to_string()),
        (None, Some(id)) => {
            check_sensor(id, limits)?;
            Ok(id.to_string())
        }
        (None, None) => Err(DecodeError::BadSensor(format!(
            "DataSetMessage {i}: no PublisherId or DataSetWriterId, and the topic names no sensor"
        ))),
    }
}

/// A DataSetMessage's writer: `<PublisherId>:<DataSetWriterId>` (its own
/// PublisherId, else the NetworkMessage's; `DataSetWriterName` when there
/// is no writer id; either alone when the other is missing).
fn writer_id(m: &Map<String, Value>, publisher: Option<&str>) -> Option<String> {
    let publisher = id_text(m.get("PublisherId")).or_else(|| publisher.map(str::to_string));
    let writer = id_text(m.get("DataSetWriterId")).or_else(|| id_text(m.get("DataSetWriterName")));
    match (publisher, writer) {
        (Some(p), Some(w)) => Some(format!("{p}:{w}")),
        (p, w) => p.or(w),
    }
}

/// Keeps the EngineeringUnits of a `ua-metadata` message's fields
/// (`MetaData.Fields[].Properties`, the key `EngineeringUnits`) as its
/// writer's, in place of what that writer's metadata gave before.
fn learn_units(
    o: &Map<String, Value>,
    units: &mut Units,
    max_name: usize,
) -> Result<(), DecodeError> {
    let Some(writer) = writer_id(o, None) else {
        return Err(DecodeError::BadPayload(
            "a ua-metadata message without PublisherId or DataSetWriterId".into(),
        ));
    };
    let fields = o
        .get("MetaData")
        .and_then(|m| m.get("Fields"))
        .and_then(Value::as_array);
    let mut found = HashMap::new();
    for field in fields.into_iter().flatten() {
        let Some(name) = field
            .get("Name")
            .and_then(Value::as_str)
            .filter(|n| n.len() <= max_name)
        else {
            continue;
        };
        let properties = field.get("Properties").and_then(Value::as_array);
        let eu = properties.into_iter().flatten().find(|p| {
            let key = p.get("Key");
            let key = key.and_then(|k| k.get("Name")).or(key);
            key.and_then(Value::as_str) == Some("EngineeringUnits")
        });
        if let Some(unit) = eu.and_then(|p| p.get("Value")).and_then(unit_text) {
            found.insert(name.to_string(), unit);
        }
    }
    if units.set(writer, found) {
        Ok(())
    } else {
        Err(DecodeError::OverLimit {
            cause: "too_many_sensors",
            message: format!(
                "the units of {MAX_UNITS} OPC UA fields are kept at most: this writer's metadata is not"
            ),
        })
    }
}

/// An EUInformation's text, in a Variant and an ExtensionObject or bare:
/// its DisplayName (a LocalizedText `{"Text": ...}` or, non-reversibly, a
/// string), else its UnitId as the UNECE common code it packs (4408652:
/// `CEL`).
fn unit_text(v: &Value) -> Option<String> {
    let mut eu = variant(v);
    for body in ["Body", "UaBody"] {
        if let Some(b) = eu.get(body).filter(|b| b.is_object()) {
            eu = b;
        }
    }
    let display = eu.get("DisplayName");
    let text = display.and_then(|d| d.get("Text")).or(display);
    if let Some(t) = text.and_then(Value::as_str) {
        return (!t.is_empty() && t.len() <= MAX_UNIT_LEN).then(|| t.to_string());
    }
    let id = eu
        .get("UnitId")?
        .as_u64()
        .filter(|&id| id > 0 && id < 1 << 24)?;
    let code: String = id.to_be_bytes()[5..]
        .iter()
        .filter(|b| **b != 0)
        .map(|b| *b as char)
        .collect();
    code.chars()
        .all(|c| c.is_ascii_alphanumeric())
        .then_some(code)
}

/// The objects of an array of DataSetMessages.
fn objects(items: &[Value]) -> Result<Vec<&Map<String, Value>>, DecodeError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_object().ok_or_else(|| {
                DecodeError::BadPayload(format!("DataSetMessage {i} is not an object"))
            })
        })
        .collect()
}

/// A PublisherId or DataSetWriterId as text (they are numbers or strings).
fn id_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A StatusCode: a number, or `{"Code": n, "Symbol": ...}` (1.05).
fn status_code(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::Object(o) => o.get("Code").and_then(Value::as_u64).or(Some(0)),
        _ => None,
    }
}

fn time(v: &Value) -> Result<i64, String> {
    match v {
        Value::String(s) => super::json::text_timestamp_in(s, None),
        other => Err(format!("{other} is not an OPC UA DateTime")),
    }
}

/// A field as a DataValue: its value, status and source time.
struct DataValue<'a> {
    value: Option<&'a Value>,
    status: Option<u64>,
    source: Option<&'a Value>,
}

/// `Some` when the field is encoded as a DataValue (an object with any of
/// its members and nothing a structure would have instead).
fn data_value(v: &Value) -> Option<DataValue<'_>> {
    let o = v.as_object()?;
    const MEMBERS: &[&str] = &[
        "Value",
        "Status",
        "StatusCode",
        "SourceTimestamp",
        "SourcePicoseconds",
        "ServerTimestamp",
        "ServerPicoseconds",
        "UaType",
        "Type",
        "Body",
    ];
    let is_dv = o.contains_key("Status")
        || o.contains_key("StatusCode")
        || o.contains_key("SourceTimestamp")
        || o.contains_key("ServerTimestamp");
    if !is_dv || !o.keys().all(|k| MEMBERS.contains(&k.as_str())) {
        return None;
    }
    // 1.05 compact: the Variant's members are the DataValue's own.
    let value = if o.contains_key("UaType") {
        Some(v)
    } else {
        o.get("Value")
    };
    Some(DataValue {
        value,
        status: o
            .get("Status")
            .or(o.get("StatusCode"))
            .and_then(status_code),
        source: o.get("SourceTimestamp"),
    })
}

/// A Variant's value: `{"Type": t, "Body": b}` (1.04 reversible) or
/// `{"UaType": t, "Value": v}` (1.05); anything else is the value itself.
fn variant(v: &Value) -> &Value {
    match v.as_object() {
        Some(o) if o.len() <= 3 && o.contains_key("Body") && o.contains_key("Type") => &o["Body"],
        Some(o) if o.len() <= 4 && o.contains_key("UaType") && o.contains_key("Value") => {
            &o["Value"]
        }
        _ => v,
    }
}

/// A value's leaves by path (`None` past the depth bound).
fn flatten(name: &str, v: &Value, depth: usize, out: &mut Vec<(String, Option<FieldValue>)>) {
    if depth > super::paths::MAX_DEPTH {
        out.push((name.to_string(), None));
        return;
    }
    match v {
        Value::Null => {}
        Value::Bool(b) => out.push((name.to_string(), Some(FieldValue::Bool(*b)))),
        Value::Number(n) => {
            if let Some(x) = n.as_f64().filter(|x| x.is_finite()) {
                out.push((name.to_string(), Some(FieldValue::Num(x))));
            }
        }
        Value::String(s) => out.push((name.to_string(), Some(FieldValue::Str(s.clone())))),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                flatten(&format!("{name}.{i}"), variant(item), depth + 1, out);
            }
        }
        Value::Object(o) => {
            for (k, item) in o {
                flatten(&format!("{name}.{k}"), variant(item), depth + 1, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The units kept are bounded in all: a writer whose metadata would
    /// pass the bound is refused and keeps what it had; one that shrinks
    /// makes room.
    #[test]
    fn units_kept_are_bounded() {
        let mut units = Units::default();
        let fields = |n: usize| {
            (0..n)
                .map(|i| (format!("f{i}"), "Cel".to_string()))
                .collect()
        };
        assert!(units.set("a:1".into(), fields(MAX_UNITS - 10)));
        assert!(!units.set("b:1".into(), fields(11)));
        assert_eq!(units.of(Some("b:1"), "f0"), None);
        assert!(units.set("b:1".into(), fields(10)));
        assert!(units.set("a:1".into(), fields(1)));
        assert!(units.set("c:1".into(), fields(MAX_UNITS - 11)));
        assert_eq!(units.of(Some("c:1"), "f5"), Some("Cel"));
        assert_eq!(units.count, MAX_UNITS);
    }
}
