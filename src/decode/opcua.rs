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
//!   "StatusCode": ..., "SourceTimestamp": ...}`). A structure's fields and
//!   an array's elements become fields by path, as nested JSON does
//!   (`Coordinate.X`, `Measurements.0`).
//! - A field's time is its SourceTimestamp, else the DataSetMessage's
//!   Timestamp, else the message's time; fields of one time are one
//!   sample. A StatusCode other than Good (0) is kept as the field
//!   `<name>.StatusCode`, the DataSetMessage's Status as `StatusCode`.
//! - Other message types (`ua-metadata`, `ua-keepalive`, `ua-status`, a
//!   DataSetMessage without Payload) store nothing and are not refused.

use serde_json::{Map, Value};

use super::{check_sensor, DecodeError, Decoded, FieldValue, Message, Reading};

/// The samples of one PubSub JSON message.
pub(super) fn decode(msg: &Message<'_>, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let limits = msg.limits;
    let top: Value = serde_json::from_slice(msg.payload)
        .map_err(|e| DecodeError::BadPayload(format!("invalid JSON: {e}")))?;
    let (publisher, messages): (Option<String>, Vec<&Map<String, Value>>) = match &top {
        Value::Object(o) if o.contains_key("Messages") => {
            match o.get("MessageType").and_then(Value::as_str) {
                Some("ua-data") | None => {}
                Some(_) => return Ok(Vec::new()),
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
    };
    let topic_sensor = super::topic_sensor(msg)?;
    let mut samples: Vec<Reading> = Vec::new();
    let mut by_time: std::collections::HashMap<(String, i64), usize> = Default::default();
    for (i, m) in messages.into_iter().enumerate() {
        if samples.len() > limits.max_samples_per_message {
            break;
        }
        if m.get("MessageType")
            .and_then(Value::as_str)
            .is_some_and(|t| t != "ua-deltaframe" && t != "ua-keyframe")
        {
            continue;
        }
        let Some(payload) = m.get("Payload") else {
            continue; // a keep-alive
        };
        let Value::Object(payload) = payload else {
            out.errors.push(DecodeError::BadField {
                index: i,
                message: format!("DataSetMessage {i}: Payload is not an object"),
            });
            continue;
        };
        let sensor = match topic_sensor {
            Some(s) => s.to_string(),
            None => {
                let publisher = id_text(m.get("PublisherId")).or_else(|| publisher.clone());
                let writer = id_text(m.get("DataSetWriterId"))
                    .or_else(|| id_text(m.get("DataSetWriterName")));
                let id = match (publisher, writer) {
                    (Some(p), Some(w)) => format!("{p}:{w}"),
                    (None, Some(w)) => w,
                    (Some(p), None) => p,
                    (None, None) => {
                        out.errors.push(DecodeError::BadSensor(format!(
                            "DataSetMessage {i}: no PublisherId or DataSetWriterId, and the topic names no sensor"
                        )));
                        continue;
                    }
                };
                if let Err(e) = check_sensor(&id, limits) {
                    out.errors.push(e);
                    continue;
                }
                id
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
        // Past the sample cap the message is refused; a sample past the
        // field cap is refused below (one field over is enough to know).
        let mut add = |ts_ms: i64, name: String, value: FieldValue| {
            let next = samples.len();
            let at = *by_time.entry((sensor.clone(), ts_ms)).or_insert(next);
            if at == next {
                samples.push(Reading {
                    sensor: sensor.clone(),
                    ts_ms,
                    index: next,
                    ..Reading::default()
                });
            }
            if samples[at].fields.len() <= limits.max_fields_per_sample {
                samples[at].fields.push((name, value));
            }
        };
        if let Some(code) = m.get("Status").and_then(status_code).filter(|c| *c != 0) {
            add(
                header_time,
                "StatusCode".into(),
                FieldValue::Num(code as f64),
            );
        }
        for (name, field) in payload {
            let (value, ts) = match data_value(field) {
                Some(dv) => {
                    if let Some(code) = dv.status.filter(|c| *c != 0) {
                        let ts = dv.source.as_ref().and_then(|t| time(t).ok());
                        add(
                            ts.unwrap_or(header_time),
                            super::field_name(&format!("{name}.StatusCode")).into_owned(),
                            FieldValue::Num(code as f64),
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
                            continue;
                        }
                    };
                    match dv.value {
                        Some(v) => (v, ts),
                        None => continue,
                    }
                }
                None => (field, header_time),
            };
            let mut leaves = Vec::new();
            flatten(name, variant(value), 0, &mut leaves);
            for (name, v) in leaves {
                let too_deep = ("bad_field", "nested deeper than 16 levels".to_string());
                match v
                    .ok_or(too_deep)
                    .and_then(|v| super::take_field(&name, v, limits))
                {
                    Ok((field, v)) => add(ts, field, v),
                    Err(why) => out.dropped.push(super::Dropped::of(i, &name, why)),
                }
            }
        }
    }
    if samples.len() > limits.max_samples_per_message {
        return Err(super::too_many_samples(samples.len(), limits));
    }
    Ok(super::within_field_cap(samples, limits, &mut out.errors))
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
        "StatusCode",
        "SourceTimestamp",
        "SourcePicoseconds",
        "ServerTimestamp",
        "ServerPicoseconds",
        "UaType",
        "Type",
        "Body",
    ];
    let is_dv = o.contains_key("StatusCode")
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
        status: o.get("StatusCode").and_then(status_code),
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
