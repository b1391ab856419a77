//! `format = "value"`: the payload is one value, as devices that publish a
//! topic per value send it (ESPHome, Home Assistant's statestream,
//! Tasmota's LWT): a number is stored as a number, `true`/`false` as a
//! boolean, a JSON string (`"Living Room"`, how statestream writes
//! attributes) as its text, a JSON array or object (a statestream
//! attribute holding a list: `["rgb", "xy"]`) as its JSON text, compact,
//! anything else (`ON`, `Online`) as the text itself, trimmed. `null` and
//! an empty payload (a retained value cleared) carry no value: the message
//! is passed over (`no_fields`). The field name comes from the topic's
//! `{field}` or the subscription's `field`, as for `number`; the time is
//! the arrival time (or an MQTT 5 user property's).

use super::{truncate, DecodeError, Decoded, FieldValue, Message, Reading};

/// The one sample of a bare value.
pub(super) fn decode(msg: &Message<'_>, _out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let (sensor, field) = super::topic_field(msg)?;
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
        Ok(serde_json::Value::Null) => return Ok(vec![empty(msg, sensor)]),
        Ok(v) => FieldValue::Str(v.to_string()),
        Err(_) if text.is_empty() => return Ok(vec![empty(msg, sensor)]),
        Err(_) => FieldValue::Str(text.to_string()),
    };
    // Its one field left out would leave nothing: the message is refused.
    let field = super::take_field(field, value, msg.limits)
        .map_err(|why| super::Dropped::of(0, field, why).into_error())?;
    Ok(vec![Reading {
        fields: vec![field],
        ..empty(msg, sensor)
    }])
}

/// The sample of a message without a value (passed over: no field).
fn empty(msg: &Message<'_>, sensor: &str) -> Reading {
    Reading {
        sensor: sensor.to_string(),
        ts_ms: msg.time_ms,
        fields: Vec::new(),
        index: 0,
        units: Vec::new(),
    }
}
