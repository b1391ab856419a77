//! `format = "cbor"`: a CBOR (RFC 8949) map, or an array of maps, read as
//! a JSON payload is: the same `timestamp_field`, `sensor_field`, paths,
//! flattening and limits (ciborium decodes it; map keys must be text).
//! Dates (tags 0 and 1), bignums, decimal fractions and bigfloats are read
//! as [`super::item`] says; a byte string is left out of its sample.

use super::{DecodeError, Decoded, Message, Reading};

/// The samples of one CBOR message.
pub(super) fn decode(msg: &Message<'_>, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let item = super::item::read_cbor(msg.payload).map_err(DecodeError::BadPayload)?;
    super::json::decode_item(msg, out, &item)
}
