//! A CBOR or MessagePack payload as the JSON walker reads it ([`Item`]):
//! a tree that keeps what JSON has no word for and the walker must see.
//!
//! - Every entry of a map, in order, a repeated key too (a map type
//!   dedupes silently; the walker refuses the sample, `field_collision`).
//! - Points in time: CBOR's tag 0 (RFC 3339 text) and tag 1 (epoch
//!   seconds), MessagePack's Timestamp extension (type -1, its 32, 64 and
//!   96-bit forms), stored as dates (BSON has milliseconds: finer parts are
//!   cut, toward the past).
//! - Numbers a tag makes: bignums (tags 2 and 3), decimal fractions (tag
//!   4: `m x 10^e`) and bigfloats (tag 5: `m x 2^e`), as numbers (doubles,
//!   as every number palletd stores). Other tags are read as the item they
//!   wrap.
//! - CBOR's `undefined` is read as `null`: no value, nothing stored.
//! - Values palletd cannot store as a field (a byte string, another
//!   MessagePack extension, a NaN or an infinity, text that is not UTF-8)
//!   are left out of their sample with the cause `bad_field` and why,
//!   counted; the sample's other fields are kept. An unassigned CBOR
//!   simple value (RFC 8949 Appendix A's `simple(16)`) refuses the
//!   message: ciborium does not read it.
//!
//! The walker reads an item through `serde` like a JSON document
//! ([`Item`] is a `Deserializer`); a date reaches its visitor as a
//! newtype struct holding milliseconds, a value left out as bytes holding
//! why.

use serde::de::{self, IntoDeserializer};

/// A payload item.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Item {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Text(String),
    /// Milliseconds since the Unix epoch.
    Date(i64),
    /// Not storable as a field: why.
    Opaque(String),
    Array(Vec<Item>),
    /// Entries in order, repeated keys kept.
    Map(Vec<(Item, Item)>),
}

/// Nesting deeper than this refuses the payload (the walker stops at
/// fewer levels: [`super::paths::MAX_DEPTH`]).
const MAX_DEPTH: usize = 128;

/// Seconds since the epoch as milliseconds, toward the past; `None`
/// outside the dates BSON holds.
fn seconds_to_ms(secs: f64) -> Option<i64> {
    let ms = (secs * 1e3).floor();
    (ms.is_finite() && ms.abs() <= 8.64e15).then_some(ms as i64)
}

fn float(x: f64) -> Item {
    match x.is_finite() {
        true => Item::Float(x),
        false => Item::Opaque(format!("{x} is not a number palletd stores")),
    }
}

/// A CBOR item (RFC 8949), read by ciborium.
pub(super) fn from_cbor(v: ciborium::Value) -> Item {
    use ciborium::Value as V;
    match v {
        V::Null => Item::Null,
        V::Bool(b) => Item::Bool(b),
        V::Integer(i) => Item::Int(i128::from(i)),
        V::Float(x) => float(x),
        V::Text(t) => Item::Text(t),
        V::Bytes(_) => Item::Opaque("a byte string".into()),
        V::Array(items) => Item::Array(items.into_iter().map(from_cbor).collect()),
        V::Map(entries) => Item::Map(
            entries
                .into_iter()
                .map(|(k, v)| (from_cbor(k), from_cbor(v)))
                .collect(),
        ),
        V::Tag(tag, inner) => cbor_tag(tag, *inner),
        _ => Item::Opaque("a CBOR item palletd does not know".into()),
    }
}

/// A tagged CBOR item (RFC 8949, 3.4).
fn cbor_tag(tag: u64, inner: ciborium::Value) -> Item {
    use ciborium::Value as V;
    let bad = |what: &str| Item::Opaque(format!("tag {tag}: {what}"));
    match (tag, inner) {
        (0, V::Text(t)) => match chrono::DateTime::parse_from_rfc3339(t.trim()) {
            Ok(d) => Item::Date(d.timestamp_millis()),
            Err(e) => bad(&format!("{t:?} is not an RFC 3339 date/time: {e}")),
        },
        (1, V::Integer(i)) => match seconds_to_ms(i128::from(i) as f64) {
            Some(ms) => Item::Date(ms),
            None => bad("outside the representable date range"),
        },
        (1, V::Float(x)) => match seconds_to_ms(x) {
            Some(ms) => Item::Date(ms),
            None => bad("outside the representable date range"),
        },
        (2 | 3, V::Bytes(b)) => {
            // An unsigned magnitude, big-endian; tag 3 means -1 - n.
            let n = b.iter().fold(0f64, |n, byte| n * 256.0 + f64::from(*byte));
            let exact = (b.len() <= 15)
                .then(|| b.iter().fold(0i128, |n, byte| (n << 8) | i128::from(*byte)));
            match (tag, exact) {
                (2, Some(n)) => Item::Int(n),
                (3, Some(n)) => Item::Int(-1 - n),
                (2, None) => float(n),
                _ => float(-1.0 - n),
            }
        }
        (4 | 5, V::Array(parts)) => {
            let number = |v: &V| match v {
                V::Integer(i) => Some(i128::from(*i) as f64),
                _ => None,
            };
            match parts.as_slice() {
                [e, m] => match (number(e), number(m)) {
                    (Some(e), Some(m)) if tag == 4 => float(decimal(m, e)),
                    (Some(e), Some(m)) => float(m * 2f64.powf(e)),
                    _ => bad("exponent and mantissa must be integers"),
                },
                _ => bad("not [exponent, mantissa]"),
            }
        }
        (0..=5, _) => bad("the wrong type of item for its tag"),
        (_, inner) => from_cbor(inner),
    }
}

/// `m x 10^e`, rounded once (a negative exponent divides, so 273.15 from
/// 27315 and -2 is the double nearest 273.15).
fn decimal(m: f64, e: f64) -> f64 {
    match e >= 0.0 {
        true => m * 10f64.powf(e),
        false => m / 10f64.powf(-e),
    }
}

/// A MessagePack item, read by rmpv.
pub(super) fn from_msgpack(v: rmpv::Value) -> Item {
    use rmpv::Value as V;
    match v {
        V::Nil => Item::Null,
        V::Boolean(b) => Item::Bool(b),
        V::Integer(i) => match (i.as_i64(), i.as_u64()) {
            (Some(i), _) => Item::Int(i128::from(i)),
            (_, Some(u)) => Item::Int(i128::from(u)),
            _ => Item::Opaque("an integer out of range".into()),
        },
        V::F32(x) => float(f64::from(x)),
        V::F64(x) => float(x),
        V::String(s) => match s.into_str() {
            Some(t) => Item::Text(t),
            None => Item::Opaque("text that is not UTF-8".into()),
        },
        V::Binary(_) => Item::Opaque("a byte string".into()),
        V::Array(items) => Item::Array(items.into_iter().map(from_msgpack).collect()),
        V::Map(entries) => Item::Map(
            entries
                .into_iter()
                .map(|(k, v)| (from_msgpack(k), from_msgpack(v)))
                .collect(),
        ),
        V::Ext(-1, data) => timestamp_ext(&data),
        V::Ext(t, _) => Item::Opaque(format!("a MessagePack extension of type {t}")),
    }
}

/// The MessagePack Timestamp extension (type -1): 32 bits of seconds; 30
/// bits of nanoseconds and 34 of seconds; or 32 bits of nanoseconds and
/// 64 signed bits of seconds. Big-endian.
fn timestamp_ext(data: &[u8]) -> Item {
    let (secs, nanos): (i64, u32) = match data.len() {
        4 => (
            i64::from(u32::from_be_bytes([data[0], data[1], data[2], data[3]])),
            0,
        ),
        8 => {
            let all = u64::from_be_bytes(data.try_into().unwrap_or([0; 8]));
            ((all & 0x3_ffff_ffff) as i64, (all >> 34) as u32)
        }
        12 => (
            i64::from_be_bytes(data[4..12].try_into().unwrap_or([0; 8])),
            u32::from_be_bytes([data[0], data[1], data[2], data[3]]),
        ),
        n => return Item::Opaque(format!("a Timestamp extension of {n} bytes")),
    };
    if nanos >= 1_000_000_000 {
        return Item::Opaque("a Timestamp with 1e9 or more nanoseconds".into());
    }
    match secs
        .checked_mul(1000)
        .and_then(|ms| ms.checked_add(i64::from(nanos / 1_000_000)))
        .filter(|ms| ms.unsigned_abs() <= 8_640_000_000_000_000)
    {
        Some(ms) => Item::Date(ms),
        None => Item::Opaque("a Timestamp outside the representable date range".into()),
    }
}

/// A CBOR payload (at most [`MAX_DEPTH`] levels).
pub(super) fn read_cbor(payload: &[u8]) -> Result<Item, String> {
    ciborium::de::from_reader_with_recursion_limit::<ciborium::Value, _>(payload, MAX_DEPTH)
        .map(from_cbor)
        .map_err(|e| format!("invalid CBOR: {e}"))
}

/// Whether a MessagePack item holds the byte the spec says is never used
/// (0xc1) where an item starts: rmpv reads it as nil, the spec as no
/// MessagePack at all. `None`: the bytes end within an item (rmpv says
/// why).
fn never_used(mut b: &[u8]) -> Option<bool> {
    let mut pending: u64 = 1;
    let take = |b: &mut &[u8], n: usize| -> Option<u64> {
        let (head, rest) = (b.get(..n)?, b.get(n..)?);
        *b = rest;
        Some(head.iter().fold(0u64, |a, x| a << 8 | u64::from(*x)))
    };
    while pending > 0 {
        pending -= 1;
        let m = take(&mut b, 1)? as u8;
        // (bytes to skip, items that follow)
        let (skip, items) = match m {
            0xc1 => return Some(true),
            0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => (0, 0),
            0x80..=0x8f => (0, 2 * u64::from(m & 0x0f)),
            0x90..=0x9f => (0, u64::from(m & 0x0f)),
            0xa0..=0xbf => (u64::from(m & 0x1f), 0),
            0xc4 | 0xd9 => (take(&mut b, 1)?, 0),
            0xc5 | 0xda => (take(&mut b, 2)?, 0),
            0xc6 | 0xdb => (take(&mut b, 4)?, 0),
            0xc7 => (take(&mut b, 1)? + 1, 0),
            0xc8 => (take(&mut b, 2)? + 1, 0),
            0xc9 => (take(&mut b, 4)? + 1, 0),
            0xca => (4, 0),
            0xcb => (8, 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xce | 0xd2 => (4, 0),
            0xcf | 0xd3 => (8, 0),
            0xd4 => (2, 0),
            0xd5 => (3, 0),
            0xd6 => (5, 0),
            0xd7 => (9, 0),
            0xd8 => (17, 0),
            0xdc => (0, take(&mut b, 2)?),
            0xdd => (0, take(&mut b, 4)?),
            0xde => (0, 2 * take(&mut b, 2)?),
            0xdf => (0, 2 * take(&mut b, 4)?),
        };
        b = b.get(usize::try_from(skip).ok()?..)?;
        pending = pending.checked_add(items)?;
    }
    Some(false)
}

/// A MessagePack payload (at most [`MAX_DEPTH`] levels; nothing may
/// follow the item; the byte the spec never uses, 0xc1, refuses it).
pub(super) fn read_msgpack(payload: &[u8]) -> Result<Item, String> {
    if never_used(payload) == Some(true) {
        return Err("invalid MessagePack: 0xc1, a byte the format never uses".into());
    }
    let mut rest = payload;
    let v = rmpv::decode::read_value_with_max_depth(&mut rest, MAX_DEPTH)
        .map_err(|e| format!("invalid MessagePack: {e}"))?;
    if !rest.is_empty() {
        return Err(format!(
            "invalid MessagePack: {} bytes after the item",
            rest.len()
        ));
    }
    Ok(from_msgpack(v))
}

impl<'de> de::Deserializer<'de> for &'de Item {
    type Error = de::value::Error;

    fn deserialize_any<V: de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self {
            Item::Null => visitor.visit_unit(),
            Item::Bool(b) => visitor.visit_bool(*b),
            Item::Int(i) => match (i64::try_from(*i), u64::try_from(*i)) {
                (Ok(i), _) => visitor.visit_i64(i),
                (_, Ok(u)) => visitor.visit_u64(u),
                _ => visitor.visit_f64(*i as f64),
            },
            Item::Float(x) => visitor.visit_f64(*x),
            Item::Text(t) => visitor.visit_borrowed_str(t),
            Item::Date(ms) => {
                visitor.visit_newtype_struct(de::value::I64Deserializer::<Self::Error>::new(*ms))
            }
            Item::Opaque(why) => visitor.visit_borrowed_bytes(why.as_bytes()),
            Item::Array(items) => visitor.visit_seq(de::value::SeqDeserializer::new(items.iter())),
            Item::Map(entries) => visitor.visit_map(de::value::MapDeserializer::new(
                entries.iter().map(|(k, v)| (k, v)),
            )),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

impl<'de> IntoDeserializer<'de, de::value::Error> for &'de Item {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn cbor_tags_become_dates_and_numbers() {
        // RFC 8949, Appendix A.
        let date = |h: &str| read_cbor(&hex(h)).unwrap();
        assert_eq!(
            date("c074323031332d30332d32315432303a30343a30305a"),
            Item::Date(1_363_896_240_000)
        );
        assert_eq!(date("c11a514b67b0"), Item::Date(1_363_896_240_000));
        assert_eq!(date("c1fb41d452d9ec200000"), Item::Date(1_363_896_240_500));
        assert_eq!(
            date("c249010000000000000000"),
            Item::Int(18_446_744_073_709_551_616)
        );
        assert_eq!(
            date("c349010000000000000000"),
            Item::Int(-18_446_744_073_709_551_617)
        );
        assert_eq!(
            date("c48221196ab3"),
            Item::Float(273.15),
            "decimal fraction"
        );
        assert_eq!(date("c5822003"), Item::Float(1.5), "bigfloat");
        assert!(matches!(date("4401020304"), Item::Opaque(_)), "bytes");
        assert!(matches!(date("f97c00"), Item::Opaque(_)), "infinity");
        assert_eq!(
            date("d82076687474703a2f2f7777772e6578616d706c652e636f6d"),
            Item::Text("http://www.example.com".into()),
            "a tag palletd does not know: what it wraps"
        );
        // Repeated keys are kept.
        assert_eq!(
            date("a2616101616102"),
            Item::Map(vec![
                (Item::Text("a".into()), Item::Int(1)),
                (Item::Text("a".into()), Item::Int(2)),
            ])
        );
    }

    #[test]
    fn msgpack_timestamps_in_their_three_forms() {
        // fixext4 -1: 32-bit seconds.
        assert_eq!(
            read_msgpack(&hex("d6ff5e0be100")).unwrap(),
            Item::Date(1_577_836_800_000)
        );
        // fixext8 -1: 30 bits of nanoseconds (500 ms) and 34 of seconds.
        let all: u64 = (500_000_000u64 << 34) | 1_577_837_824;
        let mut b = hex("d7ff");
        b.extend_from_slice(&all.to_be_bytes());
        assert_eq!(read_msgpack(&b).unwrap(), Item::Date(1_577_837_824_500));
        // ext8 12 -1: 32-bit nanoseconds, 64-bit signed seconds (before 1970).
        let mut b = hex("c70cff");
        b.extend_from_slice(&1_000_000u32.to_be_bytes());
        b.extend_from_slice(&(-1i64).to_be_bytes());
        assert_eq!(read_msgpack(&b).unwrap(), Item::Date(-999));
        assert!(matches!(
            read_msgpack(&hex("d40105")).unwrap(),
            Item::Opaque(_)
        ));
        assert!(read_msgpack(&hex("c0c0")).is_err(), "bytes after the item");
        assert!(
            read_msgpack(&hex("81a176c1")).is_err(),
            "0xc1 is never used"
        );
        assert!(read_msgpack(&hex("81a176c0")).is_ok());
    }
}
