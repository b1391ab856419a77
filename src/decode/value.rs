//! `format = "value"`: the payload is one value, as devices that publish a
//! topic per value send it (ESPHome, Home Assistant's statestream,
//! Tasmota's LWT): a number is stored as a number, `true`/`false` as a
//! boolean, a JSON string (`"Living Room"`, how statestream writes
//! attributes) as its text, anything else (`ON`, `Online`) as the text
//! itself, trimmed. The field name comes from the topic's `{field}` or the
//! subscription's `field`, as for `number`; the time is the arrival time
//! (or an MQTT 5 user property's).

use super::{check_sensor, truncate, DecodeError, Decoded, FieldValue, Message, Reading};

/// The one sample of a bare value.
pub(super) fn decode(msg: &Message<'_>, _out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let (sub, m, limits) = (msg.sub, msg.matched, msg.limits);
    let sensor = m.sensor.unwrap_or_default();
    check_sensor(sensor, limits)?;
    let field = m.field.or(sub.field.as_deref()).unwrap_or_default();
    if field.is_empty() {
        return Err(DecodeError::BadField {
            index: 0,
            message: "an empty field name".into(),
        });
    }
    let text = std::str::from_utf8(msg.payload)
        .map_err(|_| DecodeError::BadPayload("not UTF-8 text".into()))?
        .trim();
    let value = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Number(n)) => match n.as_f64() {
            Some(x) if x.is_finite() => FieldValue::Num(x),
            _ => {
                return Err(DecodeError::BadPayload(format!(
                    "number out of range: {:?}",
                    truncate(text, 64)
                )))
            }
        },
        Ok(serde_json::Value::Bool(b)) => FieldValue::Bool(b),
        Ok(serde_json::Value::String(s)) => FieldValue::Str(s),
        Ok(serde_json::Value::Null) => {
            return Err(DecodeError::BadPayload("null: no value".into()))
        }
        Ok(_) => {
            return Err(DecodeError::BadPayload(
                "a JSON object or array: use format = \"json\"".into(),
            ))
        }
        Err(_) if text.is_empty() => return Err(DecodeError::BadPayload("empty: no value".into())),
        Err(_) => FieldValue::Str(text.to_string()),
    };
    if let FieldValue::Str(s) = &value {
        if s.len() > limits.max_string_length {
            return Err(DecodeError::OverLimit {
                cause: "string_too_long",
                message: format!(
                    "a value of {} bytes, over limits.max_string_length ({})",
                    s.len(),
                    limits.max_string_length
                ),
            });
        }
    }
    Ok(vec![Reading {
        sensor: sensor.to_string(),
        ts_ms: msg.time_ms,
        fields: vec![(super::field_name(field).into_owned(), value)],
        index: 0,
        units: Vec::new(),
    }])
}
