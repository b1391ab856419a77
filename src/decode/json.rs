//! `format = "json"`: an object `{"ts": ..., "temp": 21.7, ...}` or an array
//! of such objects (several samples, one acknowledgement).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::Subscription;
use super::{check_sensor, truncate, DecodeError, Decoded, FieldValue, Limits, Message, Reading};

/// The samples of one JSON message; a sample refused alone goes to
/// `out.errors`.
pub(super) fn decode(msg: &Message<'_>, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let (sub, m, payload, now_ms, limits) =
        (msg.sub, msg.matched, msg.payload, msg.time_ms, msg.limits);
    let errors = &mut out.errors;
    let seed = TopSeed {
        fields: limits.max_fields_per_sample + 2,
        samples: limits.max_samples_per_message,
    };
    let mut de = serde_json::Deserializer::from_slice(payload);
    let top = de::DeserializeSeed::deserialize(seed, &mut de)
        .and_then(|t| de.end().map(|()| t))
        .map_err(|e| DecodeError::BadPayload(format!("invalid JSON: {e}")))?;
    let objects = match top {
        Top::Object(o) => vec![o],
        Top::Array(items, extra) => {
            if items.is_empty() {
                return Err(DecodeError::BadPayload("empty array: no samples".into()));
            }
            if items.len() + extra > limits.max_samples_per_message {
                return Err(super::too_many_samples(items.len() + extra, limits));
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
/// At most the cap it was read with are kept; `extra` counts the keys past
/// it (skipped unread: the work stays linear in the payload's bytes).
#[derive(Debug, Default)]
struct Object<'a> {
    fields: Vec<(Cow<'a, str>, Json<'a>)>,
    extra: usize,
}

impl<'a> Object<'a> {
    fn len(&self) -> usize {
        self.fields.len() + self.extra
    }

    fn remove(&mut self, key: &str) -> Option<Json<'a>> {
        let i = self.fields.iter().position(|(k, _)| k == key)?;
        Some(self.fields.remove(i).1)
    }
}

/// A payload: one object, an array of objects (`None` for an element that
/// is not one) and how many elements past the cap were skipped, or anything
/// else.
enum Top<'a> {
    Object(Object<'a>),
    Array(Vec<Option<Object<'a>>>, usize),
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

/// Objects with more keys than this find repeated keys by a hash map.
const LINEAR_KEYS: usize = 16;

/// An object, as the fields of one sample: at most `cap` distinct keys are
/// kept; past them, keys are counted and their values skipped.
fn visit_object<'de, A: MapAccess<'de>>(mut map: A, cap: usize) -> Result<Object<'de>, A::Error> {
    let hint = map.size_hint().unwrap_or(4).min(cap);
    let mut out = Object {
        fields: Vec::with_capacity(hint),
        extra: 0,
    };
    let mut index: Option<std::collections::HashMap<Cow<'de, str>, usize>> = None;
    while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
        if out.fields.len() >= cap {
            map.next_value::<IgnoredAny>()?;
            out.extra += 1;
            continue;
        }
        let value: Json<'de> = map.next_value()?;
        let at = match &index {
            Some(index) => index.get(&key).copied(),
            None => {
                #[cfg(test)]
                tests::COMPARED.with(|c| c.set(c.get() + out.fields.len() as u64));
                out.fields.iter().position(|(k, _)| *k == key)
            }
        };
        match at {
            Some(i) => out.fields[i].1 = value,
            None => {
                if let Some(index) = &mut index {
                    index.insert(key.clone(), out.fields.len());
                }
                out.fields.push((key, value));
                if index.is_none() && out.fields.len() > LINEAR_KEYS {
                    index = Some(
                        out.fields
                            .iter()
                            .enumerate()
                            .map(|(i, (k, _))| (k.clone(), i))
                            .collect(),
                    );
                }
            }
        }
    }
    Ok(out)
}

/// Reads a payload with the caps of its samples and fields.
#[derive(Clone, Copy)]
struct TopSeed {
    /// Keys kept per object.
    fields: usize,
    /// Array elements read (the rest counted, skipped).
    samples: usize,
}

/// An array element: an object, or something that is not one.
struct Element<'a>(Option<Object<'a>>);

struct ElementSeed(usize);

impl<'de> de::DeserializeSeed<'de> for ElementSeed {
    type Value = Element<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Element<'de>, D::Error> {
        struct E(usize);
        impl<'de> Visitor<'de> for E {
            type Value = Element<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Element<'de>, A::Error> {
                visit_object(map, self.0).map(|o| Element(Some(o)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Element<'de>, A::Error> {
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
        d.deserialize_any(E(self.0))
    }
}

impl<'de> de::DeserializeSeed<'de> for TopSeed {
    type Value = Top<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Top<'de>, D::Error> {
        struct T(TopSeed);
        impl<'de> Visitor<'de> for T {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object or an array of objects")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Top<'de>, A::Error> {
                visit_object(map, self.0.fields).map(Top::Object)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top<'de>, A::Error> {
                let cap = self.0.samples;
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(1).min(cap));
                let mut extra = 0;
                loop {
                    if items.len() >= cap {
                        match seq.next_element::<IgnoredAny>()? {
                            Some(_) => extra += 1,
                            None => break,
                        }
                    } else {
                        match seq.next_element_seed(ElementSeed(self.0.fields))? {
                            Some(Element(e)) => items.push(e),
                            None => break,
                        }
                    }
                }
                Ok(Top::Array(items, extra))
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
        d.deserialize_any(T(self))
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
    for (name, value) in std::mem::take(&mut obj.fields) {
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
        if name.is_empty() {
            return Err(DecodeError::BadField {
                index,
                message: "an empty field name".into(),
            });
        }
        let field = match super::field_name(&name) {
            Cow::Borrowed(_) => name.into_owned(),
            Cow::Owned(escaped) => escaped,
        };
        fields.push((field, value));
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
        index,
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

/// A timestamp carried as text outside the payload (an MQTT 5 user
/// property): an epoch number or RFC 3339 text, read as in a payload.
pub fn text_or_number_timestamp(s: &str) -> Result<i64, String> {
    match serde_json::from_str::<serde_json::Number>(s.trim()) {
        Ok(n) => number_timestamp(&n),
        Err(_) => text_timestamp(s),
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

    thread_local! {
        /// Keys compared while looking for repeated ones, on this thread.
        pub static COMPARED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    fn limits(max_fields: usize) -> Limits {
        Limits {
            max_payload_size: 1 << 30,
            max_lateness_ms: i64::MAX / 4,
            max_future_ms: i64::MAX / 4,
            max_samples_per_message: 1000,
            max_fields_per_sample: max_fields,
            max_field_name_length: 64,
            max_string_length: 64,
            sensor_id_pattern: regex::Regex::new(".*").unwrap(),
            max_sparkplug_nodes: 100,
            max_sparkplug_devices_per_node: 100,
            max_sparkplug_aliases: 10_000,
        }
    }

    /// A JSON subscription to `sensors/{sensor}/telemetry`.
    fn telemetry() -> Subscription {
        Subscription {
            pattern: super::super::TopicPattern::parse("sensors/{sensor}/telemetry").unwrap(),
            format: super::super::PayloadFormat::Json,
            timestamp_field: "ts".into(),
            sensor_field: None,
            field: None,
            qos: 1,
            rebirth_min_interval: None,
            from_properties: Default::default(),
        }
    }

    fn message<'a>(
        sub: &'a Subscription,
        matched: crate::decode::TopicMatch<'a>,
        payload: &'a [u8],
        limits: &'a Limits,
    ) -> Message<'a> {
        Message {
            sub,
            topic: "sensors/s1/telemetry",
            matched,
            payload,
            now_ms: NOW,
            time_ms: NOW,
            limits,
        }
    }

    /// Decodes `payload` on `sensors/s1/telemetry`: (readings, errors,
    /// keys compared).
    fn decode_counting(payload: &[u8], max_fields: usize) -> (usize, Vec<DecodeError>, u64) {
        let sub = telemetry();
        let m = sub.pattern.matches("sensors/s1/telemetry").unwrap();
        COMPARED.with(|c| c.set(0));
        let mut out = Decoded::default();
        let limits = limits(max_fields);
        let readings = match decode(&message(&sub, m, payload, &limits), &mut out) {
            Ok(r) => r.len(),
            Err(e) => {
                out.errors.push(e);
                0
            }
        };
        (readings, out.errors, COMPARED.with(|c| c.get()))
    }

    /// A number is stored as exactly the double its text names (correctly
    /// rounded, as Rust's own parser and every JSON writer that prints the
    /// shortest round-tripping text expect). serde_json's default parser
    /// was a unit in the last place off for about one reading in seven of
    /// the backfill benchmark's weather (1.0427500721073601 was stored as
    /// 1.04275007210736), so a reading published by a program came back
    /// different from what it sent.
    #[test]
    fn numbers_are_stored_as_the_double_their_text_names() {
        let sub = telemetry();
        let m = sub.pattern.matches("sensors/s1/telemetry").unwrap();
        let texts = [
            "1.0427500721073601",
            "1013.3517782471374",
            "0.1",
            "2.2250738585072014e-308",
            "9007199254740993",
            "-6.02214076e23",
        ];
        for text in texts {
            let payload = format!("{{\"v\": {text}}}");
            let limits = limits(64);
            let r = decode(
                &message(&sub, m, payload.as_bytes(), &limits),
                &mut Decoded::default(),
            )
            .unwrap();
            let want: f64 = text.parse().unwrap();
            assert_eq!(r[0].fields[0].1, FieldValue::Num(want), "{text}");
        }
    }

    /// A wide object (15,000 distinct keys, far over the field limit) is
    /// refused after reading at most the limit's worth of keys; keys past
    /// it are skipped, and repeated keys are found by a hash map beyond a
    /// few: the work is linear in the payload's bytes. Before, every key
    /// was compared with every earlier one (112 million comparisons for
    /// this payload, 311 ms of CPU) and the limit checked at the end.
    #[test]
    fn a_wide_object_costs_work_linear_in_its_bytes() {
        let wide = |keys: usize| {
            let body: Vec<String> = (0..keys).map(|i| format!("\"k{i}\": {i}")).collect();
            format!("{{{}}}", body.join(","))
        };
        for max_fields in [64, 10_000] {
            let (n, errors, compared) = decode_counting(wide(15_000).as_bytes(), max_fields);
            assert_eq!(n, 0);
            assert_eq!(errors[0].cause(), "too_many_fields", "{errors:?}");
            assert!(
                compared <= 16 * 16,
                "{compared} key comparisons for 15,000 keys (limit {max_fields})"
            );
        }
        // Repeated keys keep the last value, below and above the threshold.
        let mut keys: Vec<String> = (0..40).map(|i| format!("\"k{i}\": 1")).collect();
        keys.push("\"k3\": 7".into());
        keys.push("\"k30\": 8".into());
        let payload = format!("{{{}}}", keys.join(","));
        let sub_limits = limits(64);
        let sub = telemetry();
        let m = sub.pattern.matches("sensors/s1/telemetry").unwrap();
        let msg = message(&sub, m, payload.as_bytes(), &sub_limits);
        let r = decode(&msg, &mut Decoded::default()).unwrap();
        assert_eq!(r[0].fields.len(), 40);
        assert_eq!(r[0].fields[3], ("k3".into(), FieldValue::Num(7.0)));
        assert_eq!(r[0].fields[30], ("k30".into(), FieldValue::Num(8.0)));
    }

    /// An array longer than the sample limit is refused after reading the
    /// limit's worth of objects; the rest is skipped, not kept.
    #[test]
    fn a_long_array_is_refused_without_keeping_it() {
        let items: Vec<String> = (0..5000).map(|i| format!("{{\"v\": {i}}}")).collect();
        let (n, errors, _) = decode_counting(format!("[{}]", items.join(",")).as_bytes(), 8);
        assert_eq!(n, 0);
        assert_eq!(errors[0].cause(), "too_many_samples");
        assert!(
            errors[0].to_string().contains("5000 samples"),
            "{}",
            errors[0]
        );
    }

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
