//! Topic patterns and payload formats -> [`Reading`]s. Pure: no I/O, no
//! clock (the caller passes "now"), never panics on any input.
//!
//! One MQTT message decodes to zero or more readings plus zero or more
//! rejections. A rejection of the whole message (bad JSON, unknown topic, too
//! large) leaves no readings; a rejection of one sample (bad timestamp, bad
//! field name, a clock far off) leaves the message's other samples intact.
//!
//! Each payload format is one file and one arm of [`PayloadFormat`]:
//! [`json`] (and [`cbor`] and [`msgpack`], read as JSON is), [`number`],
//! [`value`], [`senml`], [`opcua`], [`line`] and [`sparkplug`]. Two keep
//! state in the [`Decoder`]: the alias maps of Sparkplug B edge nodes, and
//! the EngineeringUnits of OPC UA writers' metadata (`opcua::Units`, in
//! memory, bounded). Adding a format means a new file with a
//! `decode` function, its arm in the enum (its name in [`PayloadFormat::NAMES`]
//! and in `FromStr`) and its arm in [`Decoder::decode`]; the configuration
//! learns the name from here.

mod cbor;
#[cfg(test)]
mod collisions;
#[cfg(test)]
mod corpus;
mod item;
mod json;
pub(crate) mod line;
mod msgpack;
mod number;
mod opcua;
pub(crate) mod paths;
mod senml;
pub mod sparkplug;
mod topic;
mod value;

use std::fmt;

pub use json::{parse_timestamp, text_timestamp_in};
pub use paths::{Arrays, Path, Selection};
pub use topic::{TopicMatch, TopicPattern};

/// How a subscription's payloads are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFormat {
    /// A JSON object, or an array of objects ([`json`]).
    Json,
    /// A bare number; its field name comes from `{field}` or `field`
    /// ([`number`]).
    Number,
    /// Eclipse Sparkplug B protobuf under `spBv1.0/...` ([`sparkplug`]).
    SparkplugB,
    /// One bare value: a number, a boolean or text ([`value`]).
    Value,
    /// Sensor Measurement Lists in JSON, RFC 8428 ([`senml`]).
    Senml,
    /// OPC UA PubSub JSON messages, OPC 10000-14 ([`opcua`]).
    OpcUa,
    /// SenML in CBOR, RFC 8428 section 6 ([`senml`]).
    SenmlCbor,
    /// A CBOR map or array of maps, read as JSON is ([`cbor`]).
    Cbor,
    /// A MessagePack map or array of maps, read as JSON is ([`msgpack`]).
    MsgPack,
    /// InfluxDB line protocol, a sample per line ([`line`]).
    LineProtocol,
}

impl PayloadFormat {
    /// The names a subscription's `format` may take.
    pub(crate) const NAMES: &'static [&'static str] = &[
        "json",
        "cbor",
        "msgpack",
        "number",
        "value",
        "senml",
        "senml_cbor",
        "opcua",
        "line_protocol",
        "sparkplug_b",
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            PayloadFormat::Json => "json",
            PayloadFormat::Number => "number",
            PayloadFormat::SparkplugB => "sparkplug_b",
            PayloadFormat::Value => "value",
            PayloadFormat::Senml => "senml",
            PayloadFormat::OpcUa => "opcua",
            PayloadFormat::SenmlCbor => "senml_cbor",
            PayloadFormat::Cbor => "cbor",
            PayloadFormat::MsgPack => "msgpack",
            PayloadFormat::LineProtocol => "line_protocol",
        }
    }
}

impl std::str::FromStr for PayloadFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(PayloadFormat::Json),
            "number" => Ok(PayloadFormat::Number),
            "sparkplug_b" => Ok(PayloadFormat::SparkplugB),
            "value" => Ok(PayloadFormat::Value),
            "senml" => Ok(PayloadFormat::Senml),
            "opcua" => Ok(PayloadFormat::OpcUa),
            "senml_cbor" => Ok(PayloadFormat::SenmlCbor),
            "cbor" => Ok(PayloadFormat::Cbor),
            "msgpack" => Ok(PayloadFormat::MsgPack),
            "line_protocol" => Ok(PayloadFormat::LineProtocol),
            other => Err(not_one_of(PayloadFormat::NAMES, other)),
        }
    }
}

/// The error for a name that is not one of `names` (a configuration value).
pub(crate) fn not_one_of(names: &[&str], got: &str) -> String {
    let names: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    format!("must be one of {}, got {got:?}", names.join(", "))
}

/// Sensor ids unless `bucket.sensor_id_pattern` says otherwise: letters,
/// digits, `-`, `_`, `.`, `:`, 1 to 128 of them.
pub const DEFAULT_SENSOR_ID_PATTERN: &str = "[A-Za-z0-9._:-]{1,128}";

/// One `[[subscription]]`: which topics, and how their payloads are read.
#[derive(Debug, Clone)]
pub struct Subscription {
    pub pattern: TopicPattern,
    pub format: PayloadFormat,
    /// Where a structured payload's fields, time and sensor id are
    /// (`root`, `include`, `exclude`, `rename`, `flatten`, `arrays`,
    /// `timestamp_field`, `sensor_field`; see [`paths`]).
    pub selection: Selection,
    /// The zone of times written without a UTC offset (`timezone`); without
    /// one such a time is refused.
    pub timezone: Option<chrono_tz::Tz>,
    /// `format = "line_protocol"`: how a line's measurement and tags make
    /// its sensor id (`sensor_template`, see [`line`]).
    pub sensor_template: Option<String>,
    /// Field name for `format = "number"` when the topic has no `{field}`.
    pub field: Option<String>,
    pub qos: u8,
    /// `format = "sparkplug_b"` with `request_rebirth = true`: ask an edge
    /// node for a rebirth at most this often.
    pub rebirth_min_interval: Option<std::time::Duration>,
    /// What an MQTT 5 message's properties say (`[mqtt] protocol = "5"`).
    pub from_properties: FromProperties,
    /// `retained`: what a message the broker sends with the RETAIN flag
    /// (the topic's last value, sent again because palletd subscribed) is
    /// taken for.
    pub retained: Retained,
    /// `[subscription.thinning.<field>]`: the fields whose readings are
    /// thinned, by stored name, and their rules ([`crate::thin`]).
    pub thinning: Vec<(String, crate::thin::Rule)>,
}

impl Subscription {
    /// A subscription with everything but its topic and format at the
    /// defaults (timestamp field `ts`, sensor from the topic, QoS 1).
    pub fn new(pattern: TopicPattern, format: PayloadFormat) -> Self {
        Subscription {
            pattern,
            format,
            selection: Selection::default(),
            timezone: None,
            sensor_template: None,
            field: None,
            qos: 1,
            rebirth_min_interval: None,
            from_properties: FromProperties::default(),
            retained: Retained::Changed,
            thinning: Vec::new(),
        }
    }

    /// Whether its messages must be read in the order a device sent them,
    /// so it stays on one connection, unshared ([`crate::front::plan`]):
    /// a Sparkplug B node's BIRTH before its DATA, and a thinned field's
    /// points in time order ([`crate::thin`]).
    pub(crate) fn in_order(&self) -> bool {
        self.format == PayloadFormat::SparkplugB || !self.thinning.is_empty()
    }

    /// What the configuration calls the sensor id's field (for messages).
    pub(crate) fn sensor_field_name(&self) -> String {
        self.selection
            .sensor
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_default()
    }
}

/// What a message the broker sends with the RETAIN flag is taken for (a
/// subscription's `retained`). The flag marks the broker's copy of a
/// topic's last value, sent because a subscription was made (MQTT 3.1.1
/// §3.3.1.3: one forwarded live has it cleared).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retained {
    /// `"changed"` (the default): stored when it differs from the last
    /// message palletd took in from that topic, else passed over
    /// (`retained_seen`); see [`crate::front::retained`].
    #[default]
    Changed,
    /// `"store"`: stored every time the broker sends it.
    Store,
    /// `"skip"`: never stored (`retained`).
    Skip,
}

impl Retained {
    /// The names `retained` may take.
    pub(crate) const NAMES: &'static [&'static str] = &["changed", "store", "skip"];

    /// The value `retained = name` means.
    pub(crate) fn parse(name: &str) -> Result<Retained, String> {
        match name {
            "changed" => Ok(Retained::Changed),
            "store" => Ok(Retained::Store),
            "skip" => Ok(Retained::Skip),
            other => Err(not_one_of(Retained::NAMES, other)),
        }
    }
}

/// A subscription's use of MQTT 5 message properties; all off by default
/// (and under MQTT 3.1.1, which has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FromProperties {
    /// `timestamp_property`: the user property that holds the time of the
    /// message's samples that carry none of their own (epoch number or RFC
    /// 3339 text, read as a payload's timestamp field is). A message
    /// without it is stamped with its arrival time, as without the setting.
    pub timestamp: Option<String>,
    /// `sensor_property`: the user property that names the sensor, in
    /// place of the topic's `{sensor}` (a payload's `sensor_field` still
    /// wins for its sample). Without it the topic's `{sensor}` is used, and
    /// a topic without one refuses the message (`bad_sensor`).
    pub sensor: Option<String>,
    /// `format_from_content_type`: a message's content type, when it names
    /// a format palletd reads (`application/json` or a `+json` type:
    /// json; `text/plain`: number), chooses the format over `format`.
    pub content_type: bool,
}

/// An MQTT 5 message's properties that decoding may read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    pub user: Vec<(String, String)>,
    pub content_type: Option<String>,
}

impl Properties {
    /// The first user property of this name (MQTT 5 allows repeats).
    pub(crate) fn user(&self, name: &str) -> Option<&str> {
        self.user
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The payload format a content type names, if palletd reads it.
    pub(crate) fn format(&self) -> Option<PayloadFormat> {
        let ct = self.content_type.as_deref()?;
        let media = ct.split(';').next().unwrap_or_default().trim();
        let media = media.to_ascii_lowercase();
        if media == "application/senml+json" {
            Some(PayloadFormat::Senml)
        } else if media == "application/senml+cbor" {
            Some(PayloadFormat::SenmlCbor)
        } else if media == "application/cbor" {
            Some(PayloadFormat::Cbor)
        } else if media == "application/msgpack" || media == "application/x-msgpack" {
            Some(PayloadFormat::MsgPack)
        } else if media == "application/json" || media.ends_with("+json") {
            Some(PayloadFormat::Json)
        } else if media == "text/plain" {
            Some(PayloadFormat::Number)
        } else {
            None
        }
    }
}

/// A value of one field of a sample.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    /// Stored and rolled up. JSON integers become doubles too, so that a
    /// field's rollups never mix types (integers beyond 2^53 lose precision).
    Num(f64),
    /// Stored, not rolled up.
    Str(String),
    /// Stored, not rolled up.
    Bool(bool),
    /// A point in time, milliseconds since the Unix epoch (a BSON date).
    /// Stored, not rolled up.
    Date(i64),
    /// An integer palletd records itself (Sparkplug B's `_bdSeq`), stored
    /// as a BSON long, not rolled up: a sequence number, not a measurement.
    Int(i64),
}

/// One sample of one sensor: a timestamp in milliseconds since the Unix epoch
/// (BSON dates have millisecond precision) and its fields in payload order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reading {
    pub sensor: String,
    pub ts_ms: i64,
    pub fields: Vec<(String, FieldValue)>,
    /// Its place among the samples of its message (a JSON array's element;
    /// 0 for a message of one), for what a dead letter says it refused.
    pub index: usize,
    /// The units its payload gave (field name, unit: SenML's `u`), kept
    /// once per bucket as `units.<field>`, not per sample.
    pub units: Vec<(String, String)>,
}

/// A reading as one line of JSON, as `palletd try` prints it: its sensor,
/// time (RFC 3339), fields under their stored names, and units.
pub fn reading_json(r: &Reading) -> String {
    let fields: serde_json::Map<String, serde_json::Value> = r
        .fields
        .iter()
        .map(|(name, v)| {
            let v = match v {
                FieldValue::Num(x) => serde_json::json!(x),
                FieldValue::Str(s) => serde_json::json!(s),
                FieldValue::Bool(b) => serde_json::json!(b),
                FieldValue::Date(t) => serde_json::json!({ "$date": crate::clock::iso(*t) }),
                FieldValue::Int(i) => serde_json::json!(i),
            };
            (name.clone(), v)
        })
        .collect();
    let mut line = serde_json::json!({
        "sensor": r.sensor,
        "ts": crate::clock::iso(r.ts_ms),
        "fields": fields,
    });
    if !r.units.is_empty() {
        let units: serde_json::Map<String, serde_json::Value> = r
            .units
            .iter()
            .map(|(f, u)| (f.clone(), serde_json::json!(u)))
            .collect();
        line["units"] = serde_json::Value::Object(units);
    }
    line.to_string()
}

/// Why a message or a sample was rejected. `cause()` is a bounded label for
/// metrics and log throttling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("payload of {size} bytes exceeds mqtt.max_payload_size ({limit} bytes)")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("topic {0:?} matches no subscription pattern")]
    UnknownTopic(String),
    #[error("invalid sensor id: {0}")]
    BadSensor(String),
    #[error("invalid payload: {0}")]
    BadPayload(String),
    #[error("sample {index}: invalid timestamp: {message}")]
    BadTimestamp { index: usize, message: String },
    #[error("sample {index}: timestamp {ts} is {what}")]
    TimeOutOfRange {
        index: usize,
        ts: String,
        what: String,
    },
    #[error("sample {index}: {message}")]
    BadField { index: usize, message: String },
    /// Two values for one field of one sample (a repeated key, a
    /// flattened name meeting a literal one, two renames onto one name,
    /// two SenML records of one name, unit and time).
    #[error("sample {index}: two values for the field {name:?} (a repeated name): refused rather than keep one of them")]
    FieldCollision { index: usize, name: String },
    /// A Sparkplug B DATA metric that no BIRTH named.
    #[error("unknown Sparkplug alias: {0}")]
    UnknownAlias(String),
    /// A configured limit (`[limits]`) was exceeded; `cause` names which.
    #[error("{message}")]
    OverLimit {
        cause: &'static str,
        message: String,
    },
}

impl DecodeError {
    /// The index of the sample it refused, when it refused one sample.
    pub(crate) fn index(&self) -> Option<usize> {
        match self {
            DecodeError::BadTimestamp { index, .. }
            | DecodeError::TimeOutOfRange { index, .. }
            | DecodeError::BadField { index, .. }
            | DecodeError::FieldCollision { index, .. } => Some(*index),
            _ => None,
        }
    }

    pub fn cause(&self) -> &'static str {
        match self {
            DecodeError::PayloadTooLarge { .. } => "payload_too_large",
            DecodeError::UnknownTopic(_) => "unknown_topic",
            DecodeError::BadSensor(_) => "bad_sensor",
            DecodeError::BadPayload(_) => "bad_payload",
            DecodeError::BadTimestamp { .. } => "bad_timestamp",
            DecodeError::TimeOutOfRange { .. } => "time_out_of_range",
            DecodeError::BadField { .. } => "bad_field",
            DecodeError::FieldCollision { .. } => "field_collision",
            DecodeError::UnknownAlias(_) => "unknown_alias",
            DecodeError::OverLimit { cause, .. } => cause,
        }
    }
}

/// A field name MongoDB cannot take as part of a path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field name {0:?} is not allowed: it must be non-empty, must not contain '.' or NUL, must not start with '$'")]
pub struct BadFieldName(pub String);

/// Checks a field name: `sum.<name>` must be a valid MongoDB path.
pub fn check_field_name(name: &str) -> Result<(), BadFieldName> {
    if name.is_empty() || name.contains('.') || name.starts_with('$') || name.contains('\0') {
        return Err(BadFieldName(name.to_string()));
    }
    Ok(())
}

/// Field names of a stored sample that are not data: the sample's time,
/// and in time series mode its sensor and LSN (palletd's own flags start
/// with `_`).
pub const RESERVED: &[&str] = &["ts", "sensorId", "lsn"];

/// The field name a payload's name is stored under, the same in every
/// format: `%`, `.` and NUL anywhere, and `$` or `_` as the first
/// character, are written `%` and two hex digits (`%25`, `%2E`, `%00`,
/// `%24`, `%5F`); a name equal to one palletd writes itself ([`RESERVED`])
/// has its first character written so (`%74s`). So every name maps to a
/// valid MongoDB field name, distinct names to distinct fields, and none to
/// palletd's own fields (`ts`, `sensorId`, `lsn`, and its flags, which
/// start with `_`: `_id`, `_state`, `_historical`). Borrowed when nothing
/// needs escaping (the usual case).
pub fn field_name(name: &str) -> std::borrow::Cow<'_, str> {
    let reserved = RESERVED.contains(&name);
    let escape = |i: usize, c: char| {
        matches!(c, '%' | '.' | '\0') || (i == 0 && (matches!(c, '$' | '_') || reserved))
    };
    if !name.char_indices().any(|(i, c)| escape(i, c)) {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 6);
    for (i, c) in name.char_indices() {
        if escape(i, c) {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The payload's name of a field name made by [`field_name`]; `None` for a
/// field it cannot have made (palletd's own flags, a bad escape).
pub fn original_name(field: &str) -> Option<String> {
    if field.starts_with('_') {
        return None;
    }
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = field.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Longest sensor id accepted.
pub(crate) const MAX_SENSOR_ID_LEN: usize = 128;

/// One message as every payload format takes it: the subscription it
/// matched and what the topic filled in, when it arrived, and the limits.
/// Each format's `decode(&Message, &mut Decoded)` returns the readings, or
/// an error refusing the whole message; refusals of some of its samples go
/// to [`Decoded::errors`] (vector's `Deserializer::parse` has this shape).
pub(crate) struct Message<'a> {
    pub sub: &'a Subscription,
    pub topic: &'a str,
    pub matched: TopicMatch<'a>,
    pub payload: &'a [u8],
    /// When it arrived.
    pub now_ms: i64,
    /// The time of its samples that carry none of their own: the arrival
    /// time, or the `timestamp_property`'s.
    pub time_ms: i64,
    pub limits: &'a Limits,
}

/// A field left out of a sample that is stored (a value palletd cannot
/// take: too long, out of range, too deep, an array with `arrays =
/// "drop"`). Counted by `cause` (one of the dead letter causes); a sample
/// whose every field is left out is refused instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub index: usize,
    pub cause: &'static str,
    pub message: String,
}

impl Dropped {
    /// Field `name` of sample `index` left out, for `why` (from
    /// [`take_field`]).
    pub(crate) fn of(index: usize, name: &str, (cause, why): (&'static str, String)) -> Dropped {
        Dropped {
            index,
            cause,
            message: format!("field {:?}: {why}", truncate(name, 64)),
        }
    }

    /// The refusal of a sample with nothing else in it.
    pub(crate) fn into_error(self) -> DecodeError {
        let message = format!("sample {}: {}", self.index, self.message);
        match self.cause {
            "bad_field" => DecodeError::BadField {
                index: self.index,
                message: self.message,
            },
            cause => DecodeError::OverLimit { cause, message },
        }
    }
}

/// What one MQTT message decoded to.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Decoded {
    pub readings: Vec<Reading>,
    pub errors: Vec<DecodeError>,
    /// Fields left out of the stored readings.
    pub dropped: Vec<Dropped>,
    /// What a Sparkplug B message did besides (empty for other formats).
    pub sparkplug: sparkplug::Effects,
    /// Why a message that stores nothing and is not refused was passed
    /// over ([`SKIPPED_METADATA`], [`SKIPPED_RETAINED`]), counted in
    /// `palletd_messages_skipped_total{reason}`.
    pub skipped: Option<&'static str>,
    /// The index of the subscription whose pattern took the topic.
    pub subscription: Option<usize>,
}

/// A topic with a `$` level that no pattern names (Homie's attributes).
pub(crate) const SKIPPED_METADATA: &str = "metadata";
/// A retained message on a subscription with `retained = "skip"`.
pub const SKIPPED_RETAINED: &str = "retained";
/// A retained message that is a copy of the last value palletd took in
/// from its topic (`retained = "changed"`, see [`crate::front::retained`]).
pub const SKIPPED_RETAINED_SEEN: &str = "retained_seen";
/// A message that decodes to no field at all: routine traffic (a status
/// report with none of the fields a subscription reads), neither stored
/// nor refused.
pub const SKIPPED_NO_FIELDS: &str = "no_fields";

impl Decoded {
    /// A message passed over for `reason`.
    pub fn skipped(reason: &'static str) -> Decoded {
        Decoded {
            skipped: Some(reason),
            ..Decoded::default()
        }
    }
}

/// Time bounds and size limits the decoder applies.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_payload_size: usize,
    pub max_lateness_ms: i64,
    pub max_future_ms: i64,
    pub max_samples_per_message: usize,
    pub max_fields_per_sample: usize,
    pub max_field_name_length: usize,
    pub max_string_length: usize,
    /// Anchored pattern every sensor id must match.
    pub sensor_id_pattern: regex::Regex,
    /// What Sparkplug B BIRTHs may teach in all (`limits.max_sparkplug_*`).
    pub max_sparkplug_nodes: usize,
    pub max_sparkplug_devices_per_node: usize,
    pub max_sparkplug_aliases: usize,
    /// The Sparkplug B state's estimated bytes in all (its share of
    /// `limits.max_memory`).
    pub max_sparkplug_bytes: usize,
}

/// Decodes messages for a set of subscriptions.
#[derive(Debug, Clone)]
pub struct Decoder {
    subscriptions: Vec<Subscription>,
    limits: Limits,
    /// The Sparkplug B edge nodes heard from (empty without such a
    /// subscription).
    sparkplug: sparkplug::State,
    /// The EngineeringUnits OPC UA metadata gave.
    opcua_units: opcua::Units,
}

impl Decoder {
    /// The subscriptions, in the configuration's order.
    pub(crate) fn subscriptions(&self) -> &[Subscription] {
        &self.subscriptions
    }

    pub fn new(subscriptions: Vec<Subscription>, limits: Limits) -> Self {
        Decoder {
            subscriptions,
            limits,
            sparkplug: sparkplug::State::default(),
            opcua_units: opcua::Units::default(),
        }
    }

    /// The limits every message is checked against.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether a subscription has `format = "sparkplug_b"`.
    pub(crate) fn has_sparkplug(&self) -> bool {
        self.subscriptions
            .iter()
            .any(|s| s.format == PayloadFormat::SparkplugB)
    }

    /// What Sparkplug B messages taught (to save: [`sparkplug::State`]).
    pub fn sparkplug_state(&self) -> &sparkplug::State {
        &self.sparkplug
    }

    /// Starts from a saved Sparkplug B state.
    pub(crate) fn set_sparkplug_state(&mut self, state: sparkplug::State) {
        self.sparkplug = state;
    }

    /// What a message on `topic` that the broker sent with the RETAIN flag
    /// is taken for: its subscription's `retained` (a topic no pattern
    /// takes: the default, [`Retained::Changed`]).
    pub fn retained_rule(&self, topic: &str) -> Retained {
        self.subscriptions
            .iter()
            .find(|s| s.pattern.matches(topic).is_some())
            .map_or(Retained::Changed, |s| s.retained)
    }

    /// The format of the subscription whose pattern takes `topic`.
    pub(crate) fn format_of(&self, topic: &str) -> Option<PayloadFormat> {
        self.subscriptions
            .iter()
            .find(|s| s.pattern.matches(topic).is_some())
            .map(|s| s.format)
    }

    /// The `retained` of the subscription a message was decoded by
    /// ([`Decoded::subscription`]; none: the default).
    pub(crate) fn retained_of(&self, subscription: Option<usize>) -> Retained {
        subscription
            .and_then(|i| self.subscriptions.get(i))
            .map_or(Retained::Changed, |s| s.retained)
    }

    /// Decodes one message received at `now_ms`.
    pub fn decode(&mut self, topic: &str, payload: &[u8], now_ms: i64) -> Decoded {
        self.decode_with(topic, payload, None, now_ms)
    }

    /// Decodes one message received at `now_ms`, with its MQTT 5
    /// properties (`None` under MQTT 3.1.1).
    pub fn decode_with(
        &mut self,
        topic: &str,
        payload: &[u8],
        props: Option<&Properties>,
        now_ms: i64,
    ) -> Decoded {
        let mut out = Decoded::default();
        if payload.len() > self.limits.max_payload_size {
            out.errors.push(DecodeError::PayloadTooLarge {
                size: payload.len(),
                limit: self.limits.max_payload_size,
            });
            return out;
        }
        let Some((index, sub, mut matched)) = (self.subscriptions.iter().enumerate())
            .find_map(|(i, s)| s.pattern.matches(topic).map(|m| (i, s, m)))
        else {
            if topic.split('/').any(|level| level.starts_with('$')) {
                // Metadata under a subscribed filter (Homie's `$name`,
                // `$unit`): no pattern takes a `$` level but by a literal.
                out.skipped = Some(SKIPPED_METADATA);
            } else {
                out.errors
                    .push(DecodeError::UnknownTopic(topic.to_string()));
            }
            return out;
        };
        out.subscription = Some(index);
        let from = &sub.from_properties;
        let user = |name: &Option<String>| props?.user(name.as_deref()?);
        if let Some(sensor) = user(&from.sensor) {
            matched.sensor = Some(sensor);
        } else if let (Some(name), None, None) =
            (&from.sensor, matched.sensor, &sub.selection.sensor)
        {
            out.errors.push(DecodeError::BadSensor(format!(
                "the message has no user property {name:?} and the topic names no sensor"
            )));
            return out;
        }
        let time_ms = match user(&from.timestamp).map(json::text_or_number_timestamp) {
            None => now_ms,
            Some(Ok(ts)) => ts,
            Some(Err(message)) => {
                out.errors.push(DecodeError::BadTimestamp {
                    index: 0,
                    message: format!(
                        "user property {:?}: {message}",
                        from.timestamp.as_deref().unwrap_or_default()
                    ),
                });
                return out;
            }
        };
        // Only where the subscription asks (it lowercases the type).
        let format = match from.content_type {
            true => props.and_then(Properties::format).unwrap_or(sub.format),
            false => sub.format,
        };
        let message = Message {
            sub,
            topic,
            matched,
            payload,
            now_ms,
            time_ms,
            limits: &self.limits,
        };
        let result = match format {
            PayloadFormat::Number => number::decode(&message, &mut out),
            PayloadFormat::Value => value::decode(&message, &mut out),
            PayloadFormat::Senml => senml::decode(&message, &mut out),
            PayloadFormat::OpcUa => opcua::decode(&message, &mut out, &mut self.opcua_units),
            PayloadFormat::SenmlCbor => senml::decode_cbor(&message, &mut out),
            PayloadFormat::Cbor => cbor::decode(&message, &mut out),
            PayloadFormat::MsgPack => msgpack::decode(&message, &mut out),
            PayloadFormat::LineProtocol => line::decode(&message, &mut out),
            PayloadFormat::Json => json::decode(&message, &mut out),
            PayloadFormat::SparkplugB => self.sparkplug.decode(&message, &mut out),
        };
        match result {
            // In place: a message's readings are not moved again.
            Ok(mut readings) => {
                let made = readings.len();
                // A sample with no field is never stored; a message left
                // with none is routine traffic (a status report with none
                // of the fields a subscription reads): passed over.
                readings.retain(|r| !r.fields.is_empty());
                if made > 0 && readings.is_empty() && out.errors.is_empty() {
                    out.skipped = Some(SKIPPED_NO_FIELDS);
                }
                readings.retain(|r| {
                    let refused = match repeated_field(r) {
                        Some(name) => Err(collision(r.index, name)),
                        None => self.check_time(r, now_ms, r.index),
                    };
                    match refused {
                        Ok(()) => true,
                        Err(e) => {
                            out.errors.push(e);
                            false
                        }
                    }
                });
                debug_assert!(out.readings.is_empty());
                out.readings = readings;
            }
            Err(e) => out.errors.push(e),
        }
        out
    }

    fn check_time(&self, r: &Reading, now_ms: i64, index: usize) -> Result<(), DecodeError> {
        let what = if r.ts_ms > now_ms.saturating_add(self.limits.max_future_ms) {
            "in the future beyond bucket.max_future"
        } else if r.ts_ms < now_ms.saturating_sub(self.limits.max_lateness_ms) {
            "older than bucket.max_lateness"
        } else {
            return Ok(());
        };
        Err(DecodeError::TimeOutOfRange {
            index,
            ts: crate::clock::iso(r.ts_ms),
            what: format!("{what} (received at {})", crate::clock::iso(now_ms)),
        })
    }
}

/// A field name a reading gives twice, if any: every format's samples are
/// checked once made (the JSON family's walker refuses them as it reads),
/// so no format reduces two values to one without a trace.
fn repeated_field(r: &Reading) -> Option<&str> {
    let names = || r.fields.iter().map(|(n, _)| n.as_str());
    if r.fields.len() <= 16 {
        return names()
            .enumerate()
            .find(|(i, n)| names().skip(i + 1).any(|m| m == *n))
            .map(|(_, n)| n);
    }
    let mut seen = std::collections::HashSet::with_capacity(r.fields.len());
    names().find(|n| !seen.insert(*n))
}

pub(crate) fn check_sensor(id: &str, limits: &Limits) -> Result<(), DecodeError> {
    if id.is_empty() {
        return Err(DecodeError::BadSensor("empty sensor id".into()));
    }
    if id.len() > MAX_SENSOR_ID_LEN {
        return Err(DecodeError::BadSensor(format!(
            "longer than {MAX_SENSOR_ID_LEN} bytes"
        )));
    }
    if !limits.sensor_id_pattern.is_match(id) {
        return Err(DecodeError::BadSensor(format!(
            "{:?} does not match bucket.sensor_id_pattern",
            truncate(id, 64)
        )));
    }
    Ok(())
}

/// The rejection of a message with `n` samples, over
/// `limits.max_samples_per_message`.
pub(crate) fn too_many_samples(n: usize, limits: &Limits) -> DecodeError {
    DecodeError::OverLimit {
        cause: "too_many_samples",
        message: format!(
            "{n} samples in one message exceed limits.max_samples_per_message ({})",
            limits.max_samples_per_message
        ),
    }
}

/// The refusal of sample `index` for giving field `name` (as stored)
/// two values: nothing is reduced to one of them silently.
pub(crate) fn collision(index: usize, name: &str) -> DecodeError {
    DecodeError::FieldCollision {
        index,
        name: truncate(name, 64).to_string(),
    }
}

/// The rejection of sample `index` with `n` fields, over
/// `limits.max_fields_per_sample`.
pub(crate) fn too_many_fields(index: usize, n: usize, limits: &Limits) -> DecodeError {
    DecodeError::OverLimit {
        cause: "too_many_fields",
        message: format!(
            "sample {index}: {n} fields exceed limits.max_fields_per_sample ({})",
            limits.max_fields_per_sample
        ),
    }
}

/// The samples a format grouped, less those over
/// `limits.max_fields_per_sample` (refused into `errors`).
pub(crate) fn within_field_cap(
    samples: Vec<Reading>,
    limits: &Limits,
    errors: &mut Vec<DecodeError>,
) -> Vec<Reading> {
    let mut kept = Vec::with_capacity(samples.len());
    for s in samples {
        if s.fields.len() > limits.max_fields_per_sample {
            errors.push(too_many_fields(s.index, s.fields.len(), limits));
        } else {
            kept.push(s);
        }
    }
    kept
}

/// A field as palletd stores it, the same in every format: its name
/// escaped ([`field_name`]) and its value; or, for a value it cannot take,
/// the cause it is left out for ([`Dropped`]) and why.
pub(crate) fn take_field(
    name: &str,
    value: FieldValue,
    limits: &Limits,
) -> Result<(String, FieldValue), (&'static str, String)> {
    if name.is_empty() {
        return Err(("bad_field", "an empty field name".into()));
    }
    if name.len() > limits.max_field_name_length {
        return Err((
            "field_name_too_long",
            format!(
                "a name of {} bytes exceeds limits.max_field_name_length ({})",
                name.len(),
                limits.max_field_name_length
            ),
        ));
    }
    match &value {
        FieldValue::Str(s) if s.len() > limits.max_string_length => Err((
            "string_too_long",
            format!(
                "{} bytes, over limits.max_string_length ({})",
                s.len(),
                limits.max_string_length
            ),
        )),
        FieldValue::Num(x) if !x.is_finite() => Err(("bad_field", "number out of range".into())),
        _ => Ok((field_name(name).into_owned(), value)),
    }
}

/// The sensor id the topic gives, checked, if its pattern has `{sensor}`.
pub(crate) fn topic_sensor<'a>(msg: &Message<'a>) -> Result<Option<&'a str>, DecodeError> {
    match msg.matched.sensor {
        Some(s) => check_sensor(s, msg.limits).map(|()| Some(s)),
        None => Ok(None),
    }
}

/// The sensor id and field name a topic gives a message of one value
/// (`{sensor}`, and `{field}` or the subscription's `field`).
pub(crate) fn topic_field<'a>(msg: &Message<'a>) -> Result<(&'a str, &'a str), DecodeError> {
    let sensor = msg.matched.sensor.unwrap_or_default();
    check_sensor(sensor, msg.limits)?;
    let field = msg
        .matched
        .field
        .or(msg.sub.field.as_deref())
        .unwrap_or_default();
    if field.is_empty() {
        return Err(DecodeError::BadField {
            index: 0,
            message: "an empty field name".into(),
        });
    }
    Ok((sensor, field))
}

pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl fmt::Display for PayloadFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: i64 = 1_787_234_400_000; // 2026-08-20T14:00:00Z

    fn sub(topic: &str, format: PayloadFormat) -> Subscription {
        Subscription::new(TopicPattern::parse(topic).unwrap(), format)
    }

    fn test_limits() -> Limits {
        Limits {
            max_payload_size: 1024,
            max_lateness_ms: 7 * 86_400_000,
            max_future_ms: 300_000,
            max_samples_per_message: 10,
            max_fields_per_sample: 5,
            max_field_name_length: 16,
            max_string_length: 32,
            sensor_id_pattern: regex::Regex::new(&format!("^(?:{})$", DEFAULT_SENSOR_ID_PATTERN))
                .unwrap(),
            max_sparkplug_nodes: 100,
            max_sparkplug_devices_per_node: 100,
            max_sparkplug_aliases: 10_000,
            max_sparkplug_bytes: 64 << 20,
        }
    }

    fn decoder() -> Decoder {
        let mut by_payload = sub("fleet/telemetry", PayloadFormat::Json);
        by_payload.selection.sensor = Some(Path::key_or_pointer("device").unwrap());
        Decoder::new(
            vec![
                sub("sensors/{sensor}/telemetry", PayloadFormat::Json),
                sub("plant/{sensor}/{field}", PayloadFormat::Number),
                by_payload,
            ],
            test_limits(),
        )
    }

    #[test]
    fn mqtt5_properties_give_time_sensor_and_format() {
        let mut by_props = sub("plant/{sensor}/{field}", PayloadFormat::Number);
        by_props.from_properties = FromProperties {
            timestamp: Some("time".into()),
            sensor: Some("device".into()),
            content_type: true,
        };
        let mut d = Decoder::new(vec![by_props], test_limits());
        let props = |user: &[(&str, &str)], ct: Option<&str>| Properties {
            user: user
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            content_type: ct.map(str::to_string),
        };
        let p = props(
            &[("device", "dev-1"), ("time", &(NOW - 5000).to_string())],
            None,
        );
        let r = d.decode_with("plant/p7/temp", b"21.5", Some(&p), NOW);
        assert_eq!(
            (r.readings[0].sensor.as_str(), r.readings[0].ts_ms),
            ("dev-1", NOW - 5000)
        );
        // Seconds and RFC 3339, as a payload's field is read.
        let p = props(&[("time", &((NOW - 7000) / 1000).to_string())], None);
        let r = d.decode_with("plant/p7/temp", b"1", Some(&p), NOW);
        assert_eq!(
            (r.readings[0].sensor.as_str(), r.readings[0].ts_ms),
            ("p7", NOW - 7000)
        );
        let p = props(&[("time", "2026-08-20T13:59:00Z")], None);
        assert_eq!(
            d.decode_with("plant/p7/temp", b"1", Some(&p), NOW).readings[0].ts_ms,
            NOW - 60_000
        );
        // Refused as a payload's would be: a bad time, a time out of range.
        let p = props(&[("time", "soon")], None);
        assert_eq!(
            d.decode_with("plant/p7/temp", b"1", Some(&p), NOW).errors[0].cause(),
            "bad_timestamp"
        );
        let p = props(&[("time", &(NOW + 86_400_000).to_string())], None);
        assert_eq!(
            d.decode_with("plant/p7/temp", b"1", Some(&p), NOW).errors[0].cause(),
            "time_out_of_range"
        );
        let p = props(&[("device", "bad id!")], None);
        assert_eq!(
            d.decode_with("plant/p7/temp", b"1", Some(&p), NOW).errors[0].cause(),
            "bad_sensor"
        );
        // The content type chooses JSON over the subscription's number.
        let p = props(&[], Some("application/vnd.acme+json"));
        let r = d.decode_with("plant/p7/temp", br#"{"temp": 3, "hum": 4}"#, Some(&p), NOW);
        assert_eq!(r.readings[0].fields.len(), 2, "{r:?}");
        let p = props(&[], Some("application/octet-stream"));
        assert_eq!(
            d.decode_with("plant/p7/temp", b"2", Some(&p), NOW)
                .readings
                .len(),
            1
        );
        // No properties (MQTT 3.1.1): as before.
        assert_eq!(d.decode("plant/p7/temp", b"2", NOW).readings[0].ts_ms, NOW);
    }

    #[test]
    fn json_object_with_rfc3339_timestamp() {
        let d = decoder().decode(
            "sensors/s1/telemetry",
            br#"{"ts": "2026-08-20T14:00:03Z", "temp": 21.7, "humidity": 45, "ok": true, "note": "x", "gone": null}"#,
            NOW,
        );
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        let r = &d.readings[0];
        assert_eq!(r.sensor, "s1");
        assert_eq!(r.ts_ms, NOW + 3000);
        let names: Vec<&str> = r.fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), 4);
        assert!(r
            .fields
            .contains(&("humidity".into(), FieldValue::Num(45.0))));
        assert!(r.fields.contains(&("ok".into(), FieldValue::Bool(true))));
        assert!(r
            .fields
            .contains(&("note".into(), FieldValue::Str("x".into()))));
    }

    #[test]
    fn array_gives_several_samples_and_missing_ts_means_arrival() {
        let d = decoder().decode(
            "sensors/s1/telemetry",
            br#"[{"temp": 1}, {"temp": 2, "ts": 1787234401}]"#,
            NOW,
        );
        assert_eq!(d.readings.len(), 2);
        assert_eq!(d.readings[0].ts_ms, NOW);
        assert_eq!(d.readings[1].ts_ms, NOW + 1000);
    }

    #[test]
    fn bare_number_takes_field_from_topic() {
        let d = decoder().decode("plant/p7/pressure", b" 1013.25\n", NOW);
        assert_eq!(
            d.readings,
            vec![Reading {
                sensor: "p7".into(),
                ts_ms: NOW,
                fields: vec![("pressure".into(), FieldValue::Num(1013.25))],
                index: 0,
                units: Vec::new(),
            }]
        );
        assert_eq!(
            decoder().decode("plant/p7/pressure", b"NaN", NOW).errors[0].cause(),
            "bad_payload"
        );
        assert_eq!(
            decoder().decode("plant/p7/pressure", b"abc", NOW).errors[0].cause(),
            "bad_payload"
        );
    }

    #[test]
    fn sensor_from_payload_field() {
        let d = decoder().decode("fleet/telemetry", br#"{"device": "d-9", "v": 1}"#, NOW);
        assert_eq!(d.readings[0].sensor, "d-9");
        assert_eq!(
            d.readings[0].fields,
            vec![("v".into(), FieldValue::Num(1.0))]
        );
        let d = decoder().decode("fleet/telemetry", br#"{"v": 1}"#, NOW);
        assert_eq!(d.errors[0].cause(), "bad_sensor");
    }

    /// Names that would collide with what palletd writes itself, or that
    /// MongoDB cannot take in a path, are escaped, the same way whichever
    /// format they come in (before, JSON refused some and the number
    /// format and a topic's `{field}` none).
    #[test]
    fn reserved_and_awkward_names_are_escaped_the_same_way_in_every_format() {
        let d = decoder().decode(
            "fleet/telemetry",
            br#"{"device": "d1", "sensorId": 1, "lsn": 2, "_id": 3, "a.b": 4, "$set": 5}"#,
            NOW,
        );
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        let names: Vec<&str> = d.readings[0].fields.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(names, ["%73ensorId", "%6Csn", "%5Fid", "a%2Eb", "%24set"]);
        for (field, stored) in [
            ("ts", "%74s"),
            ("lsn", "%6Csn"),
            ("_id", "%5Fid"),
            ("x", "x"),
        ] {
            let d = decoder().decode(&format!("plant/p7/{field}"), b"1", NOW);
            assert_eq!(d.readings[0].fields[0].0, stored, "{{field}} = {field}");
        }
        for name in ["%73ensorId", "a%2Eb", "%74s"] {
            assert_eq!(
                field_name(&original_name(name).unwrap()),
                name,
                "reversible"
            );
        }
    }

    #[test]
    fn garbage_is_rejected_with_a_cause() {
        let cases: &[(&str, &[u8], &str)] = &[
            ("sensors/s1/telemetry", b"{not json", "bad_payload"),
            ("sensors/s1/telemetry", b"42", "bad_payload"),
            ("sensors/s1/telemetry", b"[]", "bad_payload"),
            ("sensors/s1/telemetry", b"[1]", "bad_payload"),
            ("sensors//telemetry", b"{}", "bad_sensor"),
            ("nowhere/s1", b"{}", "unknown_topic"),
            (
                "sensors/s1/telemetry",
                br#"{"ts": "soon"}"#,
                "bad_timestamp",
            ),
            (
                "sensors/s1/telemetry",
                br#"{"ts": 4102444800, "v": 1}"#,
                "time_out_of_range",
            ),
            (
                "sensors/s1/telemetry",
                br#"{"ts": 946684800, "v": 1}"#,
                "time_out_of_range",
            ),
        ];
        for (topic, payload, cause) in cases {
            let d = decoder().decode(topic, payload, NOW);
            assert!(
                d.readings.is_empty(),
                "{topic} {:?}",
                String::from_utf8_lossy(payload)
            );
            assert_eq!(d.errors.len(), 1);
            assert_eq!(d.errors[0].cause(), *cause, "{:?}", d.errors[0]);
        }
        let big = vec![b' '; 2000];
        assert_eq!(
            decoder().decode("sensors/s1/telemetry", &big, NOW).errors[0].cause(),
            "payload_too_large"
        );
    }

    #[test]
    fn limits_reject_with_their_own_cause() {
        let mut d = decoder();
        let many: Vec<serde_json::Value> = (0..11).map(|i| serde_json::json!({ "v": i })).collect();
        let cases: Vec<(&str, String, &str)> = vec![
            (
                "sensors/s1/telemetry",
                serde_json::Value::Array(many).to_string(),
                "too_many_samples",
            ),
            (
                "sensors/s1/telemetry",
                r#"{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6}"#.into(),
                "too_many_fields",
            ),
            (
                "sensors/s1/telemetry",
                r#"{"abcdefghijklmnopq":1}"#.into(),
                "field_name_too_long",
            ),
            (
                "sensors/s1/telemetry",
                format!(r#"{{"s":"{}"}}"#, "x".repeat(33)),
                "string_too_long",
            ),
            (
                "sensors/bad$id/telemetry",
                r#"{"v":1}"#.into(),
                "bad_sensor",
            ),
            (
                "sensors/has space/telemetry",
                r#"{"v":1}"#.into(),
                "bad_sensor",
            ),
        ];
        for (topic, payload, cause) in cases {
            let out = d.decode(topic, payload.as_bytes(), NOW);
            assert!(out.readings.is_empty(), "{payload}");
            assert_eq!(out.errors[0].cause(), cause, "{payload}");
        }
        let ok = d.decode(
            "sensors/a.b:c-d_e/telemetry",
            br#"{"a":1,"b":2,"c":3,"d":4,"e":5}"#,
            NOW,
        );
        assert_eq!(ok.readings.len(), 1);
    }

    fn selecting(f: impl FnOnce(&mut Selection)) -> Decoder {
        let mut s = sub("dev/{sensor}", PayloadFormat::Json);
        f(&mut s.selection);
        Decoder::new(vec![s], test_limits())
    }

    fn names(r: &Reading) -> Vec<&str> {
        r.fields.iter().map(|f| f.0.as_str()).collect()
    }

    /// Nested objects become fields by path, arrays by index (or left out
    /// with `arrays = "drop"`), and a field palletd cannot take is left
    /// out and counted while the rest is stored.
    #[test]
    fn nested_values_are_flattened_and_what_cannot_be_taken_is_left_out() {
        let p = br#"{"a":{"b":1,"c":{"d":true}},"l":[1,"x"],"s":"yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"}"#;
        let d = selecting(|_| {}).decode("dev/d1", p, NOW);
        assert!(d.errors.is_empty(), "{d:?}");
        assert_eq!(
            names(&d.readings[0]),
            ["a%2Eb", "a%2Ec%2Ed", "l%2E0", "l%2E1"]
        );
        assert_eq!(d.dropped.len(), 1);
        assert_eq!(d.dropped[0].cause, "string_too_long");
        let d = selecting(|s| {
            s.separator = "_".into();
            s.arrays = Arrays::Drop;
        })
        .decode("dev/d1", p, NOW);
        assert_eq!(names(&d.readings[0]), ["a_b", "a_c_d"]);
        let causes: Vec<&str> = d.dropped.iter().map(|d| d.cause).collect();
        assert_eq!(causes, ["bad_field", "string_too_long"]);
        // Deeper than MAX_DEPTH: left out.
        let deep = format!("{{\"ok\":1,\"x\":{}1{}}}", "[".repeat(20), "]".repeat(20));
        let d = selecting(|_| {}).decode("dev/d1", deep.as_bytes(), NOW);
        assert_eq!(names(&d.readings[0]), ["ok"]);
        assert_eq!(d.dropped[0].cause, "bad_field");
        // Nothing usable remains: the sample is refused for it.
        let d = selecting(|_| {}).decode("dev/d1", br#"{"abcdefghijklmnopqrstuvwxyz":1}"#, NOW);
        assert_eq!(d.errors[0].cause(), "field_name_too_long");
        assert!(d.readings.is_empty() && d.dropped.is_empty());
        // The field cap counts flattened fields: past it, refused.
        let d =
            selecting(|_| {}).decode("dev/d1", br#"{"a":{"b":1,"c":2,"d":3},"e":[4,5,6]}"#, NOW);
        assert_eq!(d.errors[0].cause(), "too_many_fields");
    }

    /// Paths choose the sample, its fields, names, time and sensor.
    #[test]
    fn paths_choose_root_fields_names_time_and_sensor() {
        let d = selecting(|s| {
            s.root = Path::parse("/params", false).unwrap();
            s.include = vec![Path::parse("/*/v", true).unwrap()];
            s.exclude = vec![Path::parse("/b", true).unwrap()];
            s.rename = vec![(Path::parse("/a/v", false).unwrap(), "temp".into())];
            s.timestamp = Path::key_or_pointer("/meta/at").unwrap();
            s.sensor = Some(Path::key_or_pointer("/meta/id").unwrap());
        })
        .decode(
            "dev/x",
            br#"{"id":"no","params":{"meta":{"id":"d7","at":"2026-08-20T13:59:59Z"},"a":{"v":1,"w":2},"b":{"v":3},"c":{"v":4}}}"#,
            NOW,
        );
        assert!(d.errors.is_empty(), "{d:?}");
        let r = &d.readings[0];
        assert_eq!((r.sensor.as_str(), r.ts_ms), ("d7", NOW - 1000));
        assert_eq!(names(r), ["temp", "c%2Ev"]);
    }

    /// A local time needs a zone; an epoch with a fraction is exact to the
    /// millisecond.
    #[test]
    fn local_times_need_a_zone_and_fractions_count() {
        let mut d = decoder();
        let e = d.decode(
            "sensors/s1/telemetry",
            br#"{"ts":"2026-08-20T14:00:00","v":1}"#,
            NOW,
        );
        assert_eq!(e.errors[0].cause(), "bad_timestamp");
        assert!(
            e.errors[0].to_string().contains("timezone"),
            "{}",
            e.errors[0]
        );
        let r = d.decode(
            "sensors/s1/telemetry",
            br#"{"ts":1787234399.12,"v":1}"#,
            NOW,
        );
        assert_eq!(r.readings[0].ts_ms, NOW - 880);
        let mut s = sub("sensors/{sensor}/telemetry", PayloadFormat::Json);
        s.timezone = Some(chrono_tz::Tz::America__New_York);
        let mut d = Decoder::new(vec![s], test_limits());
        let r = d.decode(
            "sensors/s1/telemetry",
            br#"{"ts":"2026-08-20 10:00:00","v":1}"#,
            NOW,
        );
        assert_eq!(r.readings[0].ts_ms, NOW);
    }

    /// CBOR and MessagePack maps are read as JSON is: the same payload in
    /// each gives the same samples; SenML in CBOR, with the RFC's integer
    /// labels, the same as SenML in JSON.
    #[test]
    fn cbor_and_msgpack_read_as_json_and_senml_cbor_as_senml() {
        let payload = serde_json::json!({
            "ts": "2026-08-20T13:59:59Z",
            "AM2301": {"Temperature": 24.6, "Humidity": 58.2},
            "ok": true, "tag": "x", "l": [1, 2]
        });
        let mut d = Decoder::new(
            vec![
                sub("j/{sensor}", PayloadFormat::Json),
                sub("c/{sensor}", PayloadFormat::Cbor),
                sub("m/{sensor}", PayloadFormat::MsgPack),
                sub("sj/{sensor}", PayloadFormat::Senml),
                sub("sc/{sensor}", PayloadFormat::SenmlCbor),
            ],
            Limits {
                max_fields_per_sample: 10,
                ..test_limits()
            },
        );
        let json = d.decode("j/a", payload.to_string().as_bytes(), NOW);
        let mut cbor = Vec::new();
        ciborium::into_writer(&payload, &mut cbor).unwrap();
        let from_cbor = d.decode("c/a", &cbor, NOW);
        let from_msgpack = d.decode("m/a", &rmp_serde::to_vec_named(&payload).unwrap(), NOW);
        assert!(
            json.errors.is_empty() && json.readings.len() == 1,
            "{json:?}"
        );
        assert_eq!(
            (json.subscription, from_cbor.subscription),
            (Some(0), Some(1))
        );
        let same = |d: Decoded| Decoded {
            subscription: json.subscription,
            ..d
        };
        assert_eq!(same(from_cbor), json);
        assert_eq!(same(from_msgpack), json);
        assert_eq!(json.readings[0].ts_ms, NOW - 1000);
        assert!(d.decode("c/a", b"\xff\x00", NOW).errors[0].cause() == "bad_payload");
        // RFC 8428 5.1.2 in JSON, and in CBOR with its labels (bn -2, n 0,
        // u 1, v 2).
        use ciborium::Value as C;
        let json_pack = br#"[{"bn":"urn:dev:ow:10e2073a01080063:","n":"voltage","u":"V","v":120.1},{"n":"current","u":"A","v":1.2}]"#;
        let cbor_pack = C::Array(vec![
            C::Map(vec![
                (
                    C::Integer((-2).into()),
                    C::Text("urn:dev:ow:10e2073a01080063:".into()),
                ),
                (C::Integer(0.into()), C::Text("voltage".into())),
                (C::Integer(1.into()), C::Text("V".into())),
                (C::Integer(2.into()), C::Float(120.1)),
            ]),
            C::Map(vec![
                (C::Integer(0.into()), C::Text("current".into())),
                (C::Integer(1.into()), C::Text("A".into())),
                (C::Integer(2.into()), C::Float(1.2)),
            ]),
        ]);
        let mut bytes = Vec::new();
        ciborium::into_writer(&cbor_pack, &mut bytes).unwrap();
        let from_json = d.decode("sj/m", json_pack, NOW);
        assert_eq!(from_json.readings[0].units.len(), 2, "{from_json:?}");
        let from_cbor = d.decode("sc/m", &bytes, NOW);
        assert_eq!(from_cbor.readings, from_json.readings);
        assert_eq!(from_cbor.errors, from_json.errors);
    }

    #[test]
    fn one_bad_sample_keeps_the_others() {
        let d = decoder().decode(
            "sensors/s1/telemetry",
            br#"[{"temp": 1}, {"ts": 4102444800, "temp": 2}, {"temp": 3}]"#,
            NOW,
        );
        assert_eq!(d.readings.len(), 2);
        assert_eq!(d.errors.len(), 1);
        assert!(
            d.errors[0].to_string().starts_with("sample 1:"),
            "{}",
            d.errors[0]
        );
    }

    proptest! {
        #[test]
        fn decode_never_panics_on_any_bytes(topic in "[a-z/{}+#]{0,20}", payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decoder().decode(&topic, &payload, NOW);
        }

        #[test]
        fn decoded_readings_are_valid(payload in "[\\[\\]{}\",:0-9a-z.$ -]{0,80}") {
            let d = decoder().decode("sensors/s1/telemetry", payload.as_bytes(), NOW);
            for r in d.readings {
                prop_assert_eq!(r.sensor.as_str(), "s1");
                for (name, v) in &r.fields {
                    prop_assert!(check_field_name(name).is_ok());
                    if let FieldValue::Num(x) = v { prop_assert!(x.is_finite()); }
                }
                prop_assert!((r.ts_ms - NOW).abs() <= 7 * 86_400_000);
            }
        }
    }
}
