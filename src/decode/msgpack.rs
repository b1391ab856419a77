//! `format = "msgpack"`: a MessagePack map, or an array of maps, read as a
//! JSON payload is: the same `timestamp_field`, `sensor_field`, paths,
//! flattening and limits (rmpv decodes it; map keys must be text). The
//! Timestamp extension (type -1) is a date, as [`super::item`] says;
//! binary values and other extensions are left out of their sample.

use super::{DecodeError, Decoded, Message, Reading};

/// The samples of one MessagePack message.
pub(super) fn decode(msg: &Message<'_>, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let item = super::item::read_msgpack(msg.payload).map_err(DecodeError::BadPayload)?;
    super::json::decode_item(msg, out, &item)
}
