//! `format = "json"`: an object `{"ts": ..., "temp": 21.7, ...}` or an array
//! of such objects (several samples, one acknowledgement).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{check_field_name, check_sensor, truncate, DecodeError, FieldValue, Limits, Reading};
use super::{Subscription, TopicMatch};

pub(super) fn decode(
    sub: &Subscription,
    m: TopicMatch<'_>,
    payload: &[u8],
    now_ms: i64,
    limits: &Limits,
    errors: &mut Vec<DecodeError>,
) -> Result<Vec<Reading>, DecodeError> {
    let top: Top<'_> = serde_json::from_slice(payload)
        .map_err(|e| DecodeError::BadPayload(format!("invalid JSON: {e}")))?;
    let objects = match top {
        Top::Object(o) => vec![o],
        Top::Array(items) => {
            if items.is_empty() {
                return Err(DecodeError::BadPayload("empty array: no samples".into()));
            }
            if items.len() > limits.max_samples_per_message {
                return Err(super::too_many_samples(items.len(), limits));
            }
            let mut objects = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    Some(o) => objects.push(o),
                    None => {
                        return Err(DecodeError::BadPayload(format!(
                            "array element {i} is not an object"
                        )))
                    }
                }
            }
            objects
        }
        Top::Other => {
            return Err(DecodeError::BadPayload(
                "expected a JSON object or an array of objects".into(),
            ))
        }
    };
    let topic_sensor = match (&sub.sensor_field, m.sensor) {
        (None, Some(s)) => {
            check_sensor(s, limits)?;
            Some(s)
        }
        _ => None,
    };
    let mut readings = Vec::with_capacity(objects.len());
    for (index, mut obj) in objects.into_iter().enumerate() {
        match sample_from_object(sub, topic_sensor, &mut obj, index, now_ms, limits) {
            Ok(r) => readings.push(r),
            Err(e) => errors.push(e),
        }
    }
    Ok(readings)
}

/// A JSON value as a sample's field needs it, borrowed from the payload
/// where it can be (no map, no tree: decoding is on the per-reading path).
#[derive(Debug)]
enum Json<'a> {
    Null,
    Bool(bool),
    Num(serde_json::Number),
    Str(Cow<'a, str>),
    /// An object or an array (refused inside a sample).
    Nested,
}

/// An object's fields in payload order; a repeated key keeps its last value.
#[derive(Debug, Default)]
struct Object<'a>(Vec<(Cow<'a, str>, Json<'a>)>);

impl<'a> Object<'a> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn remove(&mut self, key: &str) -> Option<Json<'a>> {
        let i = self.0.iter().position(|(k, _)| k == key)?;
        Some(self.0.remove(i).1)
    }
}

/// A payload: one object, an array of objects (`None` for an element that
/// is not one), or anything else.
enum Top<'a> {
    Object(Object<'a>),
    Array(Vec<Option<Object<'a>>>),
    Other,
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Json<'de>, E> {
                Ok(Json::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Json<'de>, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Json<'de>, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Json<'de>, E> {
                Ok(Json::Num(n.into()))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Json<'de>, E> {
                Ok(Json::Num(n.into()))
            }
            fn visit_f64<E: de::Error>(self, x: f64) -> Result<Json<'de>, E> {
                // serde_json hands only finite floats.
                Ok(serde_json::Number::from_f64(x).map_or(Json::Null, Json::Num))
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Json<'de>, E> {
                Ok(Json::Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Json<'de>, E> {
                Ok(Json::Str(Cow::Owned(s.to_string())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Json<'de>, E> {
                Ok(Json::Str(Cow::Owned(s)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Json::Nested)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Json::Nested)
            }
        }
        d.deserialize_any(V)
    }
}

/// A key, borrowed from the payload unless it has escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct K;
        impl<'de> Visitor<'de> for K {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_string())))
            }
        }
        d.deserialize_str(K)
    }
}

/// An object, as the fields of one sample.
fn visit_object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Object<'de>, A::Error> {
    let mut out = Object(Vec::with_capacity(map.size_hint().unwrap_or(4)));
    while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
        let value: Json<'de> = map.next_value()?;
        match out.0.iter_mut().find(|(k, _)| *k == key) {
            Some(e) => e.1 = value,
            None => out.0.push((key, value)),
        }
    }
    Ok(out)
}

impl<'de> Deserialize<'de> for Top<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// An array element: an object, or something that is not one.
        struct Element<'a>(Option<Object<'a>>);
        impl<'de> Deserialize<'de> for Element<'de> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct E;
                impl<'de> Visitor<'de> for E {
                    type Value = Element<'de>;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("a JSON value")
                    }
                    fn visit_map<A: MapAccess<'de>>(
                        self,
                        map: A,
                    ) -> Result<Element<'de>, A::Error> {
                        visit_object(map).map(|o| Element(Some(o)))
                    }
                    fn visit_seq<A: SeqAccess<'de>>(
                        self,
                        mut seq: A,
                    ) -> Result<Element<'de>, A::Error> {
                        while seq.next_element::<IgnoredAny>()?.is_some() {}
                        Ok(Element(None))
                    }
                    fn visit_unit<X: de::Error>(self) -> Result<Element<'de>, X> {
                        Ok(Element(None))
                    }
                    fn visit_bool<X: de::Error>(self, _: bool) -> Result<Element<'de>, X> {
                        Ok(Element(None))
                    }
                    fn visit_i64<X: de::Error>(self, _: i64) -> Result<Element<'de>, X> {
                        Ok(Element(None))
                    }
                    fn visit_u64<X: de::Error>(self, _: u64) -> Result<Element<'de>, X> {
                        Ok(Element(None))
                    }
                    fn visit_f64<X: de::Error>(self, _: f64) -> Result<Element<'de>, X> {
                        Ok(Element(None))
                    }
                    fn visit_str<X: de::Error>(self, _: &str) -> Result<Element<'de>, X> {
                        Ok(Element(None))
                    }
                }
                d.deserialize_any(E)
            }
        }

        struct T;
        impl<'de> Visitor<'de> for T {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object or an array of objects")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Top<'de>, A::Error> {
                visit_object(map).map(Top::Object)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top<'de>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(1));
                while let Some(Element(e)) = seq.next_element()? {
                    items.push(e);
                }
                Ok(Top::Array(items))
            }
            fn visit_unit<X: de::Error>(self) -> Result<Top<'de>, X> {
                Ok(Top::Other)
            }
            fn visit_bool<X: de::Error>(self, _: bool) -> Result<Top<'de>, X> {
                Ok(Top::Other)
            }
            fn visit_i64<X: de::Error>(self, _: i64) -> Result<Top<'de>, X> {
                Ok(Top::Other)
            }
            fn visit_u64<X: de::Error>(self, _: u64) -> Result<Top<'de>, X> {
                Ok(Top::Other)
            }
            fn visit_f64<X: de::Error>(self, _: f64) -> Result<Top<'de>, X> {
                Ok(Top::Other)
            }
            fn visit_str<X: de::Error>(self, _: &str) -> Result<Top<'de>, X> {
                Ok(Top::Other)
            }
        }
        d.deserialize_any(T)
    }
}

fn sample_from_object(
    sub: &Subscription,
    topic_sensor: Option<&str>,
    obj: &mut Object<'_>,
    index: usize,
    now_ms: i64,
    limits: &Limits,
) -> Result<Reading, DecodeError> {
    if obj.len() > limits.max_fields_per_sample + 2 {
        return Err(DecodeError::OverLimit {
            cause: "too_many_fields",
            message: format!(
                "sample {index}: {} fields exceed limits.max_fields_per_sample ({})",
                obj.len(),
                limits.max_fields_per_sample
            ),
        });
    }
    let sensor = match &sub.sensor_field {
        Some(f) => match obj.remove(f) {
            Some(Json::Str(s)) => {
                check_sensor(&s, limits)?;
                s.into_owned()
            }
            Some(Json::Num(n)) => {
                let s = n.to_string();
                check_sensor(&s, limits)?;
                s
            }
            Some(_) => {
                return Err(DecodeError::BadSensor(format!(
                    "sample {index}: field {f:?} is not a string"
                )))
            }
            None => {
                return Err(DecodeError::BadSensor(format!(
                    "sample {index}: field {f:?} is missing"
                )))
            }
        },
        None => topic_sensor.unwrap_or_default().to_string(),
    };
    let ts_ms = match obj.remove(&sub.timestamp_field) {
        None => now_ms,
        Some(v) => timestamp(&v).map_err(|message| DecodeError::BadTimestamp { index, message })?,
    };
    let mut fields = Vec::with_capacity(obj.len());
    for (name, value) in std::mem::take(&mut obj.0) {
        if name.len() > limits.max_field_name_length {
            return Err(DecodeError::OverLimit {
                cause: "field_name_too_long",
                message: format!(
                    "sample {index}: a field name of {} bytes exceeds limits.max_field_name_length ({})",
                    name.len(),
                    limits.max_field_name_length
                ),
            });
        }
        let value = match value {
            Json::Null => continue,
            Json::Bool(b) => FieldValue::Bool(b),
            Json::Str(s) if s.len() > limits.max_string_length => {
                return Err(DecodeError::OverLimit {
                    cause: "string_too_long",
                    message: format!(
                        "sample {index}: field {:?} has {} bytes, over limits.max_string_length ({})",
                        truncate(&name, 64),
                        s.len(),
                        limits.max_string_length
                    ),
                })
            }
            Json::Str(s) => FieldValue::Str(s.into_owned()),
            Json::Num(n) => match n.as_f64() {
                Some(f) if f.is_finite() => FieldValue::Num(f),
                _ => {
                    return Err(DecodeError::BadField {
                        index,
                        message: format!("field {name:?}: number out of range"),
                    })
                }
            },
            Json::Nested => {
                return Err(DecodeError::BadField {
                    index,
                    message: format!("field {name:?}: nested objects and arrays are not supported"),
                })
            }
        };
        check_field_name(&name).map_err(|e| DecodeError::BadField {
            index,
            message: e.to_string(),
        })?;
        if name == "ts" {
            return Err(DecodeError::BadField {
                index,
                message: "field \"ts\" is reserved for the sample timestamp".into(),
            });
        }
        fields.push((name.into_owned(), value));
    }
    if fields.len() > limits.max_fields_per_sample {
        return Err(DecodeError::OverLimit {
            cause: "too_many_fields",
            message: format!(
                "sample {index}: {} fields exceed limits.max_fields_per_sample ({})",
                fields.len(),
                limits.max_fields_per_sample
            ),
        });
    }
    Ok(Reading {
        sensor,
        ts_ms,
        fields,
    })
}

fn timestamp(v: &Json<'_>) -> Result<i64, String> {
    match v {
        Json::Str(s) => text_timestamp(s),
        Json::Num(n) => number_timestamp(n),
        Json::Null => Err("expected RFC 3339 text or an epoch number, got null".into()),
        Json::Bool(b) => Err(format!(
            "expected RFC 3339 text or an epoch number, got {b}"
        )),
        Json::Nested => {
            Err("expected RFC 3339 text or an epoch number, got an object or array".into())
        }
    }
}

/// RFC 3339 text, or an epoch number whose unit is told by its magnitude:
/// below 1e11 seconds, below 1e14 milliseconds, below 1e17 microseconds,
/// else nanoseconds. Integers are truncated to the millisecond (floor),
/// fractional numbers rounded to the nearest millisecond.
pub fn parse_timestamp(v: &serde_json::Value) -> Result<i64, String> {
    match v {
        serde_json::Value::String(s) => text_timestamp(s),
        serde_json::Value::Number(n) => number_timestamp(n),
        other => Err(format!(
            "expected RFC 3339 text or an epoch number, got {other}"
        )),
    }
}

fn text_timestamp(s: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("{:?} is not RFC 3339: {e}", truncate(s, 64)))
}

fn number_timestamp(n: &serde_json::Number) -> Result<i64, String> {
    // Integers exactly (nanoseconds exceed f64 precision), floats rounded.
    if let Some(i) = n.as_i64() {
        let ms = match i.unsigned_abs() {
            a if a < 100_000_000_000 => i.checked_mul(1000),
            a if a < 100_000_000_000_000 => Some(i),
            a if a < 100_000_000_000_000_000 => Some(i.div_euclid(1000)),
            _ => Some(i.div_euclid(1_000_000)),
        };
        return ms
            .filter(|ms| ms.unsigned_abs() <= 8_640_000_000_000_000)
            .ok_or_else(|| format!("{n} is outside the representable date range"));
    }
    let x = n.as_f64().ok_or("not a number")?;
    if !x.is_finite() {
        return Err("not a finite number".into());
    }
    let ms = match x.abs() {
        a if a < 1e11 => x * 1e3,
        a if a < 1e14 => x,
        a if a < 1e17 => x / 1e3,
        _ => x / 1e6,
    };
    if ms.abs() > 8.64e15 {
        return Err(format!("{n} is outside the representable date range"));
    }
    Ok(ms.round() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_787_234_400_000; // 2026-08-20T14:00:00Z

    #[test]
    fn epoch_units_are_told_by_magnitude() {
        let secs = NOW / 1000;
        for (v, want) in [
            (serde_json::json!(secs), NOW),
            (serde_json::json!(secs as f64 + 0.25), NOW + 250),
            (serde_json::json!(NOW), NOW),
            (serde_json::json!(NOW * 1000 + 999), NOW),
            (serde_json::json!(NOW * 1_000_000 + 1), NOW),
        ] {
            assert_eq!(parse_timestamp(&v), Ok(want), "{v}");
        }
        assert!(parse_timestamp(&serde_json::json!("yesterday")).is_err());
        assert!(parse_timestamp(&serde_json::json!(true)).is_err());
        assert_eq!(
            parse_timestamp(&serde_json::json!("2026-08-20T16:00:00+02:00")),
            Ok(NOW)
        );
    }
}
