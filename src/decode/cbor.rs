//! `format = "cbor"`: a CBOR (RFC 8949) map, or an array of maps, read as
//! a JSON payload is: the same `timestamp_field`, `sensor_field`, paths,
//! flattening and limits (ciborium decodes it; map keys must be text).
//! A byte string, or a map key that is not text, refuses the message.

use super::{DecodeError, Decoded, Message, Reading};

/// The samples of one CBOR message.
pub(super) fn decode(msg: &Message<'_>, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let value = value(msg.payload)?;
    super::json::decode_value(msg, out, &value)
}

/// A CBOR item as the JSON value it maps to.
pub(super) fn value(payload: &[u8]) -> Result<serde_json::Value, DecodeError> {
    ciborium::de::from_reader_with_recursion_limit(payload, 128).map_err(|e| {
        DecodeError::BadPayload(format!("invalid CBOR, or not one JSON can hold: {e}"))
    })
}
