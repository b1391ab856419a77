//! `format = "msgpack"`: a MessagePack map, or an array of maps, read as a
//! JSON payload is: the same `timestamp_field`, `sensor_field`, paths,
//! flattening and limits (rmp-serde decodes it; map keys must be text).
//! Binary and extension values refuse the message.

use super::{DecodeError, Decoded, Message, Reading};

/// The samples of one MessagePack message.
pub(super) fn decode(msg: &Message<'_>, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let value: serde_json::Value = rmp_serde::from_slice(msg.payload).map_err(|e| {
        DecodeError::BadPayload(format!(
            "invalid MessagePack, or not one JSON can hold: {e}"
        ))
    })?;
    super::json::decode_value(msg, out, &value)
}
