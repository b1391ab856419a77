//! `format = "json"`: an object `{"ts": ..., "temp": 21.7, ...}` or an array
//! of such objects (several samples, one acknowledgement).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::item::Item;
use super::paths::{Arrays, Selection, Step, MAX_DEPTH};
use super::{check_sensor, truncate, DecodeError, Decoded, Dropped, FieldValue, Limits};
use super::{Message, Reading, Subscription};

/// The samples of one JSON message; a sample refused alone goes to
/// `out.errors`.
pub(super) fn decode(msg: &Message<'_>, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
    let mut sink = Sink::new(msg);
    let mut de = serde_json::Deserializer::from_slice(msg.payload);
    let top = de::DeserializeSeed::deserialize(TopSeed(&mut sink), &mut de)
        .and_then(|t| de.end().map(|()| t))
        .map_err(|e| DecodeError::BadPayload(format!("invalid JSON: {e}")))?;
    sink.finish(top, out)
}

/// The samples of a payload another format decoded to an [`Item`] (CBOR,
/// MessagePack), read with the same paths and limits as JSON.
pub(super) fn decode_item(
    msg: &Message<'_>,
    out: &mut Decoded,
    item: &Item,
) -> Result<Vec<Reading>, DecodeError> {
    let mut sink = Sink::new(msg);
    let top = de::DeserializeSeed::deserialize(TopSeed(&mut sink), item)
        .map_err(|e| DecodeError::BadPayload(e.to_string()))?;
    sink.finish(top, out)
}

/// The first key a JSON payload repeats within one object, for formats
/// read into a tree that keeps one value per key (OPC UA PubSub JSON);
/// `None` for a payload without (or not JSON: its own parse says why).
pub(super) fn repeated_key(payload: &[u8]) -> Option<String> {
    struct Check;
    impl<'de> de::DeserializeSeed<'de> for Check {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Check {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E: de::Error>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element_seed(Check)?.is_some() {}
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut keys: Vec<Cow<'de, str>> = Vec::new();
            while let Some(Key(k)) = map.next_key::<Key<'de>>()? {
                if keys.contains(&k) {
                    return Err(de::Error::custom(format!("\u{0}{k}")));
                }
                keys.push(k);
                map.next_value_seed(Check)?;
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_slice(payload);
    match de::DeserializeSeed::deserialize(Check, &mut de) {
        Ok(()) => None,
        Err(e) => {
            let text = e.to_string();
            let at = text.find('\u{0}')?;
            let key = &text[at + 1..];
            // serde_json appends " at line L column C".
            Some(
                key.rsplit_once(" at line ")
                    .map_or(key, |k| k.0)
                    .to_string(),
            )
        }
    }
}

/// Where a payload's objects go as they are read: each becomes a sample
/// (or a refusal) at once, so an object lives no longer than its own
/// parse and no list of them is built.
struct Sink<'s, 'a> {
    msg: &'s Message<'a>,
    /// The topic's sensor id (checked; refused only once the payload is
    /// known to have the right shape).
    topic_sensor: Result<Option<&'a str>, DecodeError>,
    readings: Vec<Reading>,
    errors: Vec<DecodeError>,
    dropped: Vec<Dropped>,
    /// Array elements read (within the cap), objects or not.
    elements: usize,
    /// The first array element that is not an object.
    not_object: Option<usize>,
}

impl<'s, 'a> Sink<'s, 'a> {
    fn new(msg: &'s Message<'a>) -> Self {
        let topic_sensor = match (&msg.sub.selection.sensor, msg.matched.sensor) {
            (None, Some(s)) => check_sensor(s, msg.limits).map(|()| Some(s)),
            _ => Ok(None),
        };
        Sink {
            msg,
            topic_sensor,
            // Most messages are one object.
            readings: Vec::with_capacity(1),
            errors: Vec::new(),
            dropped: Vec::new(),
            elements: 0,
            not_object: None,
        }
    }

    /// The sample of the object just read.
    fn take(&mut self, obj: Object<'_>) {
        let index = self.elements;
        self.elements += 1;
        let (Ok(topic_sensor), None) = (&self.topic_sensor, self.not_object) else {
            return;
        };
        let msg = self.msg;
        match sample_from_object(
            msg.sub,
            *topic_sensor,
            obj,
            index,
            msg.time_ms,
            msg.limits,
            &mut self.dropped,
        ) {
            Ok(r) => self.readings.push(r),
            Err(e) => self.errors.push(e),
        }
    }

    /// An array element that is not an object.
    fn not_an_object(&mut self) {
        self.not_object.get_or_insert(self.elements);
        self.elements += 1;
    }

    /// The samples, once the whole payload was read as `top`.
    fn finish(self, top: Top, out: &mut Decoded) -> Result<Vec<Reading>, DecodeError> {
        let limits = self.msg.limits;
        match top {
            Top::Object => {}
            Top::Array { extra } => {
                if self.elements == 0 {
                    return Err(DecodeError::BadPayload("empty array: no samples".into()));
                }
                if self.elements + extra > limits.max_samples_per_message {
                    return Err(super::too_many_samples(self.elements + extra, limits));
                }
                if let Some(i) = self.not_object {
                    return Err(DecodeError::BadPayload(format!(
                        "array element {i} is not an object"
                    )));
                }
            }
            Top::Other => {
                return Err(DecodeError::BadPayload(
                    "expected a JSON object or an array of objects".into(),
                ))
            }
        }
        self.topic_sensor?;
        out.errors.extend(self.errors);
        out.dropped.extend(self.dropped);
        Ok(self.readings)
    }
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
    /// A point in time, milliseconds since the epoch (CBOR, MessagePack:
    /// see [`super::item`]).
    Date(i64),
    /// A value palletd cannot store as a field, and why (CBOR,
    /// MessagePack: see [`super::item`]).
    Opaque(Cow<'a, str>),
}

/// One sample as read from an object: its fields in payload order
/// (flattened names, see [`super::paths`]), its timestamp and sensor
/// values, and what was left out. A repeated name keeps its last value. At
/// most the cap it was read with are kept; `extra` counts the fields past
/// it, which are not kept.
#[derive(Debug, Default)]
struct Object<'a> {
    fields: Vec<(Cow<'a, str>, Json<'a>)>,
    extra: usize,
    ts: Option<Json<'a>>,
    sensor: Option<Json<'a>>,
    /// The units read, by their entry in the selection's `units`.
    unit_values: Vec<Option<Cow<'a, str>>>,
    /// The fields a unit applies to: (field, entry in `units`).
    unit_of: Vec<(usize, usize)>,
    /// Fields left out while reading (cause, name, why).
    dropped: Vec<(&'static str, String, &'static str)>,
    /// A name given a second value (a repeated key, a flattened name
    /// meeting a literal one, two renames onto one name): the sample is
    /// refused, never reduced to one of them.
    collision: Option<String>,
}

impl Object<'_> {
    fn len(&self) -> usize {
        self.fields.len() + self.extra
    }
}

/// What a payload was: one object, an array (and how many elements past
/// the cap were skipped), or anything else.
enum Top {
    Object,
    Array { extra: usize },
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
            fn visit_newtype_struct<D: Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Json<'de>, D::Error> {
                Ok(Json::Date(i64::deserialize(d)?))
            }
            fn visit_borrowed_bytes<E: de::Error>(self, why: &'de [u8]) -> Result<Json<'de>, E> {
                Ok(Json::Opaque(String::from_utf8_lossy(why)))
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

/// Reads one object as a sample: follows the paths the selection reads
/// (what it does not read is skipped unparsed), flattens what is nested,
/// keeps at most `cap` distinct fields (past them, fields are counted, not
/// kept: the work stays linear in the payload's bytes).
struct Walk<'s, 'de> {
    sel: &'s Selection,
    cap: usize,
    /// Keys and indices from the object to the value being read (no
    /// allocation up to four levels).
    path: smallvec::SmallVec<[Cow<'de, str>; 4]>,
    /// The selection is the flat default ([`Selection::is_plain`]).
    plain: bool,
    obj: Object<'de>,
    index: Option<std::collections::HashMap<Cow<'de, str>, usize>>,
}

impl<'s, 'de> Walk<'s, 'de> {
    fn object<A: MapAccess<'de>>(
        sel: &'s Selection,
        cap: usize,
        map: A,
    ) -> Result<Object<'de>, A::Error> {
        let hint = map.size_hint().unwrap_or(4).min(cap);
        let mut walk = Walk {
            sel,
            cap,
            path: smallvec::SmallVec::new(),
            plain: sel.is_plain(),
            obj: Object {
                fields: Vec::with_capacity(hint),
                ..Object::default()
            },
            index: None,
        };
        walk.map(map)?;
        Ok(walk.obj)
    }

    fn map<A: MapAccess<'de>>(&mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            self.path.push(key);
            let step = match (self.plain, self.path.as_slice()) {
                // The flat default: only the time and sensor keys differ.
                (true, [key]) => self.sel.top_step(key),
                _ => self.sel.step(&self.path),
            };
            match step {
                Step::Skip => {
                    map.next_value::<IgnoredAny>()?;
                }
                Step::Timestamp => self.obj.ts = Some(map.next_value()?),
                Step::Sensor => self.obj.sensor = Some(map.next_value()?),
                Step::Unit(i) => self.unit(i, map.next_value()?),
                Step::Read if self.too_deep() => {
                    map.next_value::<IgnoredAny>()?;
                }
                Step::Read => map.next_value_seed(Node(self))?,
            }
            self.path.pop();
        }
        Ok(())
    }

    fn seq<A: SeqAccess<'de>>(&mut self, mut seq: A) -> Result<(), A::Error> {
        let in_sample = self.path.len() > self.sel.root.len();
        if !in_sample || self.sel.arrays == Arrays::Drop {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            if in_sample {
                self.drop("bad_field", "an array (arrays = \"drop\")");
            }
            return Ok(());
        }
        let mut i = 0usize;
        loop {
            self.path.push(Cow::Owned(i.to_string()));
            let more = match self.sel.step(&self.path) {
                Step::Skip => seq.next_element::<IgnoredAny>()?.is_some(),
                Step::Timestamp => seq
                    .next_element::<Json>()?
                    .map(|v| self.obj.ts = Some(v))
                    .is_some(),
                Step::Sensor => seq
                    .next_element::<Json>()?
                    .map(|v| self.obj.sensor = Some(v))
                    .is_some(),
                Step::Unit(i) => seq
                    .next_element::<Json>()?
                    .map(|v| self.unit(i, v))
                    .is_some(),
                Step::Read if self.too_deep() => seq.next_element::<IgnoredAny>()?.is_some(),
                Step::Read => seq.next_element_seed(Node(self))?.is_some(),
            };
            self.path.pop();
            if !more {
                return Ok(());
            }
            i += 1;
        }
    }

    /// The text of a unit the selection names (anything else is not one).
    fn unit(&mut self, i: usize, value: Json<'de>) {
        if let Json::Str(unit) = value {
            let units = &mut self.obj.unit_values;
            units.resize(units.len().max(i + 1), None);
            units[i] = Some(unit);
        }
    }

    /// Whether the value at the path is too deep to follow (it is left out
    /// and counted).
    fn too_deep(&mut self) -> bool {
        if self.path.len() <= self.sel.root.len() + MAX_DEPTH {
            return false;
        }
        self.drop("bad_field", "nested deeper than 16 levels");
        true
    }

    fn drop(&mut self, cause: &'static str, why: &'static str) {
        let name = self.sel.name(&self.path).into_owned();
        self.obj.dropped.push((cause, name, why));
    }

    /// A value at the path: a field of the sample when the path is below
    /// the root.
    fn leaf<E>(&mut self, value: Json<'de>) -> Result<(), E> {
        if self.path.len() <= self.sel.root.len() {
            return Ok(());
        }
        let (key, unit) = match (self.plain, self.path.as_slice()) {
            (true, [key]) => (key.clone(), None),
            _ => (self.sel.name(&self.path), self.sel.unit_of(&self.path)),
        };
        let fields = &mut self.obj.fields;
        let at = match &self.index {
            Some(index) => index.get(&key).copied(),
            None => {
                #[cfg(test)]
                tests::COMPARED.with(|c| c.set(c.get() + fields.len() as u64));
                fields.iter().position(|(k, _)| *k == key)
            }
        };
        match at {
            Some(_) => {
                self.obj.collision.get_or_insert_with(|| key.into_owned());
            }
            None if fields.len() >= self.cap => self.obj.extra += 1,
            None => {
                if let Some(index) = &mut self.index {
                    index.insert(key.clone(), fields.len());
                }
                if let Some(unit) = unit {
                    self.obj.unit_of.push((fields.len(), unit));
                }
                fields.push((key, value));
                if self.index.is_none() && fields.len() > LINEAR_KEYS {
                    self.index = Some(
                        fields
                            .iter()
                            .enumerate()
                            .map(|(i, (k, _))| (k.clone(), i))
                            .collect(),
                    );
                }
            }
        }
        Ok(())
    }
}

/// The value at a walk's path.
struct Node<'w, 's, 'de>(&'w mut Walk<'s, 'de>);

impl<'de> de::DeserializeSeed<'de> for Node<'_, '_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.leaf(Json::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.0.leaf(Json::Null)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<(), E> {
        self.0.leaf(Json::Bool(b))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<(), E> {
        self.0.leaf(Json::Num(n.into()))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<(), E> {
        self.0.leaf(Json::Num(n.into()))
    }
    fn visit_f64<E: de::Error>(self, x: f64) -> Result<(), E> {
        // serde_json hands only finite floats.
        self.0
            .leaf(serde_json::Number::from_f64(x).map_or(Json::Null, Json::Num))
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<(), E> {
        self.0.leaf(Json::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        self.0.leaf(Json::Str(Cow::Owned(s.to_string())))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<(), E> {
        self.0.leaf(Json::Str(Cow::Owned(s)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        self.0.seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        self.0.map(map)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let ms = i64::deserialize(d)?;
        self.0.leaf(Json::Date(ms))
    }
    fn visit_borrowed_bytes<E: de::Error>(self, why: &'de [u8]) -> Result<(), E> {
        self.0.leaf(Json::Opaque(String::from_utf8_lossy(why)))
    }
}

/// Reads a payload into its sink.
struct TopSeed<'k, 's, 'a>(&'k mut Sink<'s, 'a>);

/// An array element: an object is taken as a sample, anything else noted.
struct ElementSeed<'k, 's, 'a>(&'k mut Sink<'s, 'a>);

impl<'de> de::DeserializeSeed<'de> for ElementSeed<'_, '_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ElementSeed<'_, '_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let sink = self.0;
        let msg = sink.msg;
        let obj = Walk::object(&msg.sub.selection, msg.limits.max_fields_per_sample, map)?;
        sink.take(obj);
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.0.not_an_object();
        Ok(())
    }
    fn visit_unit<X: de::Error>(self) -> Result<(), X> {
        self.0.not_an_object();
        Ok(())
    }
    fn visit_bool<X: de::Error>(self, _: bool) -> Result<(), X> {
        self.visit_unit()
    }
    fn visit_i64<X: de::Error>(self, _: i64) -> Result<(), X> {
        self.visit_unit()
    }
    fn visit_u64<X: de::Error>(self, _: u64) -> Result<(), X> {
        self.visit_unit()
    }
    fn visit_f64<X: de::Error>(self, _: f64) -> Result<(), X> {
        self.visit_unit()
    }
    fn visit_str<X: de::Error>(self, _: &str) -> Result<(), X> {
        self.visit_unit()
    }
}

impl<'de> de::DeserializeSeed<'de> for TopSeed<'_, '_, '_> {
    type Value = Top;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Top, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_, '_, '_> {
    type Value = Top;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object or an array of objects")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Top, A::Error> {
        let sink = self.0;
        let msg = sink.msg;
        let obj = Walk::object(&msg.sub.selection, msg.limits.max_fields_per_sample, map)?;
        sink.take(obj);
        Ok(Top::Object)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top, A::Error> {
        let sink = self.0;
        let cap = sink.msg.limits.max_samples_per_message;
        let mut extra = 0;
        loop {
            if sink.elements >= cap {
                match seq.next_element::<IgnoredAny>()? {
                    Some(_) => extra += 1,
                    None => break,
                }
            } else if seq.next_element_seed(ElementSeed(sink))?.is_none() {
                break;
            }
        }
        Ok(Top::Array { extra })
    }
    fn visit_unit<X: de::Error>(self) -> Result<Top, X> {
        Ok(Top::Other)
    }
    fn visit_bool<X: de::Error>(self, _: bool) -> Result<Top, X> {
        Ok(Top::Other)
    }
    fn visit_i64<X: de::Error>(self, _: i64) -> Result<Top, X> {
        Ok(Top::Other)
    }
    fn visit_u64<X: de::Error>(self, _: u64) -> Result<Top, X> {
        Ok(Top::Other)
    }
    fn visit_f64<X: de::Error>(self, _: f64) -> Result<Top, X> {
        Ok(Top::Other)
    }
    fn visit_str<X: de::Error>(self, _: &str) -> Result<Top, X> {
        Ok(Top::Other)
    }
}

fn sample_from_object(
    sub: &Subscription,
    topic_sensor: Option<&str>,
    obj: Object<'_>,
    index: usize,
    now_ms: i64,
    limits: &Limits,
    dropped: &mut Vec<Dropped>,
) -> Result<Reading, DecodeError> {
    if obj.len() > limits.max_fields_per_sample {
        return Err(super::too_many_fields(index, obj.len(), limits));
    }
    if let Some(name) = &obj.collision {
        return Err(super::collision(index, name));
    }
    let sensor = match &sub.selection.sensor {
        Some(_) => {
            let f = sub.sensor_field_name();
            match obj.sensor {
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
            }
        }
        None => topic_sensor.unwrap_or_default().to_string(),
    };
    let ts_ms = match &obj.ts {
        None => now_ms,
        Some(v) => timestamp(v, sub.timezone)
            .map_err(|message| DecodeError::BadTimestamp { index, message })?,
    };
    let mut left_out: Vec<Dropped> = obj
        .dropped
        .into_iter()
        .map(|(cause, name, why)| Dropped::of(index, &name, (cause, why.into())))
        .collect();
    let mut fields = Vec::with_capacity(obj.fields.len());
    let mut units = Vec::new();
    for (i, (name, value)) in obj.fields.into_iter().enumerate() {
        let value = match value {
            // Objects and arrays are walked into fields; Nested is a
            // timestamp's or sensor's value only.
            Json::Null | Json::Nested => continue,
            Json::Opaque(why) => {
                left_out.push(Dropped::of(index, &name, ("bad_field", why.into_owned())));
                continue;
            }
            Json::Date(ms) => FieldValue::Date(ms),
            Json::Bool(b) => FieldValue::Bool(b),
            Json::Str(s) => FieldValue::Str(s.into_owned()),
            Json::Num(n) => FieldValue::Num(n.as_f64().unwrap_or(f64::NAN)),
        };
        match super::take_field(&name, value, limits) {
            Ok(field) => {
                let unit = obj.unit_of.iter().find(|(f, _)| *f == i);
                if let Some(Some(unit)) = unit.and_then(|(_, u)| obj.unit_values.get(*u)) {
                    units.push((field.0.clone(), unit.to_string()));
                }
                fields.push(field);
            }
            Err(why) => left_out.push(Dropped::of(index, &name, why)),
        }
    }
    if fields.is_empty() && !left_out.is_empty() {
        // Nothing usable remains: the sample is refused for what was left
        // out of it.
        return Err(left_out.swap_remove(0).into_error());
    }
    dropped.append(&mut left_out);
    Ok(Reading {
        sensor,
        ts_ms,
        fields,
        index,
        units,
    })
}

fn timestamp(v: &Json<'_>, tz: Option<chrono_tz::Tz>) -> Result<i64, String> {
    match v {
        Json::Str(s) => text_timestamp_in(s, tz),
        Json::Num(n) => number_timestamp(n),
        Json::Null => Err("expected RFC 3339 text or an epoch number, got null".into()),
        Json::Bool(b) => Err(format!(
            "expected RFC 3339 text or an epoch number, got {b}"
        )),
        Json::Nested => {
            Err("expected RFC 3339 text or an epoch number, got an object or array".into())
        }
        Json::Date(ms) => Ok(*ms),
        Json::Opaque(why) => Err(format!("expected a time, got {why}")),
    }
}

/// A timestamp carried as text outside the payload (an MQTT 5 user
/// property): an epoch number or RFC 3339 text, read as in a payload.
pub(crate) fn text_or_number_timestamp(s: &str) -> Result<i64, String> {
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
    text_timestamp_in(s, None)
}

/// Local date-times without an offset, as devices write them (Tasmota's
/// `Time`, a PLC's clock): `2026-12-03T09:44:30`, a space for the `T`,
/// with or without fractions of a second.
const LOCAL_FORMATS: &[&str] = &["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S%.f"];

/// RFC 3339 text, or with a time zone a local date-time without an
/// offset, read in that zone. A local time that a clock change skips is
/// refused; one it repeats (the hour after summer time ends) is taken as
/// the earlier of the two.
pub fn text_timestamp_in(s: &str, tz: Option<chrono_tz::Tz>) -> Result<i64, String> {
    let s = s.trim();
    let rfc3339 = match chrono::DateTime::parse_from_rfc3339(s) {
        Ok(t) => return Ok(t.timestamp_millis()),
        Err(e) => e,
    };
    let local = LOCAL_FORMATS
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(s, f).ok());
    match (local, tz) {
        (Some(local), Some(tz)) => {
            use chrono::TimeZone;
            match tz.from_local_datetime(&local) {
                chrono::LocalResult::Single(t) => Ok(t.timestamp_millis()),
                chrono::LocalResult::Ambiguous(early, _) => Ok(early.timestamp_millis()),
                chrono::LocalResult::None => Err(format!(
                    "{:?} does not exist in {tz} (a clock change skips it)",
                    truncate(s, 64)
                )),
            }
        }
        (Some(_), None) => Err(format!(
            "{:?} has no UTC offset: set the subscription's timezone (e.g. timezone = \"Europe/Berlin\") to read it as local time",
            truncate(s, 64)
        )),
        (None, _) => Err(format!("{:?} is not RFC 3339: {rfc3339}", truncate(s, 64))),
    }
}

pub(super) fn number_timestamp(n: &serde_json::Number) -> Result<i64, String> {
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
            max_sparkplug_bytes: 64 << 20,
        }
    }

    /// A JSON subscription to `sensors/{sensor}/telemetry`.
    fn telemetry() -> Subscription {
        Subscription::new(
            super::super::TopicPattern::parse("sensors/{sensor}/telemetry").unwrap(),
            super::super::PayloadFormat::Json,
        )
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
    /// refused keeping at most the limit's worth of keys; keys past it are
    /// counted, and repeated keys are found by a hash map beyond a few:
    /// the work is linear in the payload's bytes. Before, every key
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
        // A repeated key refuses the sample, below and above the threshold
        // at which keys are found by a hash map.
        for repeated in ["k3", "k30"] {
            let mut keys: Vec<String> = (0..40).map(|i| format!("\"k{i}\": 1")).collect();
            keys.push(format!("\"{repeated}\": 7"));
            let payload = format!("{{{}}}", keys.join(","));
            let sub_limits = limits(64);
            let sub = telemetry();
            let m = sub.pattern.matches("sensors/s1/telemetry").unwrap();
            let msg = message(&sub, m, payload.as_bytes(), &sub_limits);
            let mut out = Decoded::default();
            let r = decode(&msg, &mut out).unwrap();
            assert!(r.is_empty(), "{r:?}");
            assert_eq!(
                out.errors,
                [DecodeError::FieldCollision {
                    index: 0,
                    name: repeated.into()
                }]
            );
        }
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
