//! `format = "number"`: the payload is one bare number (`21.7`); the field
//! name comes from the topic's `{field}` or the subscription's `field`, the
//! time is the arrival time (or an MQTT 5 user property's, see
//! `timestamp_property`).

use super::{truncate, DecodeError, Decoded, FieldValue, Message, Reading};

/// The one sample of a bare number (nothing is refused alone).
pub(super) fn decode(msg: &Message<'_>, _out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let (payload, now_ms) = (msg.payload, msg.time_ms);
    let (sensor, field) = super::topic_field(msg)?;
    let field = super::field_name(field);
    let text = std::str::from_utf8(payload)
        .map_err(|_| DecodeError::BadPayload("not UTF-8 text".into()))?
        .trim();
    let value: f64 = text
        .parse()
        .map_err(|_| DecodeError::BadPayload(format!("not a number: {:?}", truncate(text, 64))))?;
    if !value.is_finite() {
        return Err(DecodeError::BadPayload(format!(
            "not a finite number: {text:?}"
        )));
    }
    Ok(vec![Reading {
        sensor: sensor.to_string(),
        ts_ms: now_ms,
        fields: vec![(field.to_string(), FieldValue::Num(value))],
        index: 0,
        units: Vec::new(),
    }])
}
