//! Configuration: the TOML file as written ([`raw`]) turned into validated
//! [`Settings`].
//!
//! Loading never stops at the first problem: every section is read on its own
//! and every value is checked, so `palletd check-config` prints all errors at
//! once, each with its TOML path (`mqtt.keep_alive: ...`).

mod raw;
pub mod spool;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::decode::{Limits, PayloadFormat, Subscription, TopicPattern};
use raw::{
    RawBucket, RawCloser, RawFlush, RawHttp, RawLatest, RawLimits, RawMongo, RawMqtt, RawMqttTls,
    RawRetention, RawRollup, RawSize, RawSpool, RawStorage, RawSubscription, RawWriteConcern,
};

/// The annotated example configuration; `palletd print-config` prints it and
/// `config.toml.example` is exactly this text.
pub const EXAMPLE: &str = include_str!("../../config.toml.example");

pub use crate::decode::DEFAULT_SENSOR_ID_PATTERN;

/// Where the spool lives unless `spool.dir` says otherwise: the systemd
/// `StateDirectory=palletd`.
pub const DEFAULT_SPOOL_DIR: &str = "/var/lib/palletd/spool";

/// `flush.max_delay` unless set: how long a reading may wait in memory
/// before it is written (see the README for the trade-off).
pub const DEFAULT_MAX_DELAY: &str = "10s";

/// `flush.max_delay_limit` unless set: how far the delay may stretch when
/// the database cannot keep up with `max_delay`.
pub const DEFAULT_MAX_DELAY_LIMIT: &str = "5m";

/// Largest `bucket.max_bytes`: half of MongoDB's 16 MiB document limit leaves
/// room for rollups and a sample that is counted but not yet pushed.
pub const MAX_BUCKET_BYTES: u64 = 8 * 1024 * 1024;

/// One problem in a configuration file, with the TOML path it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a configuration file.
#[derive(Debug, thiserror::Error)]
pub struct ConfigErrors {
    pub file: PathBuf,
    pub errors: Vec<ConfigError>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} configuration error(s):",
            self.file.display(),
            self.errors.len()
        )?;
        for e in &self.errors {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

/// A secret string: its `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for the one place that hands it to a client library.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Validated configuration of the whole pipeline.
#[derive(Debug, Clone)]
pub struct Settings {
    pub mqtt: MqttSettings,
    pub mongodb: MongoSettings,
    pub storage: StorageSettings,
    pub bucket: BucketSettings,
    pub flush: FlushSettings,
    pub closer: CloserSettings,
    pub retention: RetentionSettings,
    pub latest: LatestSettings,
    pub http: HttpSettings,
    pub spool: spool::SpoolSettings,
    pub limits: LimitSettings,
    pub subscriptions: Vec<Subscription>,
    /// `[[rollup]]`: summaries per sensor and interval, kept by the closer.
    pub rollups: Vec<RollupSettings>,
    /// Not errors, but worth the operator's attention: printed by
    /// `check-config`, logged at start.
    pub warnings: Vec<String>,
}

impl Settings {
    /// What the decoder checks every message against.
    pub fn decode_limits(&self) -> Limits {
        Limits {
            max_payload_size: self.mqtt.max_payload_size,
            max_lateness_ms: self.bucket.max_lateness.as_millis() as i64,
            max_future_ms: self.bucket.max_future.as_millis() as i64,
            max_samples_per_message: self.limits.max_samples_per_message,
            max_fields_per_sample: self.limits.max_fields_per_sample,
            max_field_name_length: self.limits.max_field_name_length,
            max_string_length: self.limits.max_string_length,
            sensor_id_pattern: self.bucket.sensor_id_pattern.clone(),
            max_sparkplug_nodes: self.limits.max_sparkplug_nodes,
            max_sparkplug_devices_per_node: self.limits.max_sparkplug_devices_per_node,
            max_sparkplug_aliases: self.limits.max_sparkplug_aliases,
        }
    }

    /// The bucket shape: window and caps, in the planner's units.
    pub fn shape(&self) -> crate::bucket::Shape {
        crate::bucket::Shape {
            window_ms: self.bucket.window.as_millis() as i64,
            max_samples: self.bucket.max_samples,
            max_bytes: self.bucket.max_bytes,
        }
    }
}

/// Limits against hostile or broken input; each rejection is counted and
/// dead-lettered.
#[derive(Debug, Clone)]
pub struct LimitSettings {
    pub max_samples_per_message: usize,
    pub max_fields_per_sample: usize,
    pub max_field_name_length: usize,
    pub max_string_length: usize,
    /// Distinct sensors palletd keeps track of; a new sensor beyond it goes
    /// to the dead letter until idle ones are forgotten.
    pub max_sensors: usize,
    /// Sparkplug B edge nodes, devices per node and aliases in all that
    /// BIRTHs may teach (what sparkplug.json holds and is rewritten whole);
    /// a BIRTH beyond them goes to the dead letter.
    pub max_sparkplug_nodes: usize,
    pub max_sparkplug_devices_per_node: usize,
    pub max_sparkplug_aliases: usize,
    /// Bytes palletd's buffers may hold in all (see [`LimitSettings::split`]).
    pub max_memory: u64,
    /// Bytes of dead letters spooled per second in the long run (a minute's
    /// worth at once).
    pub max_deadletter_rate: u64,
}

/// What each part may hold of `limits.max_memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySplit {
    /// Messages received, on their way to the spool (beyond: palletd stops
    /// reading from the broker).
    pub ingest: usize,
    /// Encoded batches on their way into the spool's files (beyond: the
    /// admission waits for the disk, and ingest behind it).
    pub spool: usize,
    /// Spooled batches on their way to the pipeline's memory (beyond: read
    /// back from the spool).
    pub feed: usize,
    /// Samples and dead letters waiting for MongoDB (beyond: they wait on
    /// disk).
    pub pending: usize,
}

impl LimitSettings {
    /// An eighth for the ingest queue, a sixteenth for the spool's write
    /// queue, an eighth for the feed, the rest for what waits for MongoDB.
    pub fn split(&self) -> MemorySplit {
        let all = self.max_memory as usize;
        MemorySplit {
            ingest: all / 8,
            spool: all / 16,
            feed: all / 8,
            pending: all - 2 * (all / 8) - all / 16,
        }
    }
}

#[derive(Debug, Clone)]
pub struct MqttSettings {
    pub host: String,
    pub port: u16,
    /// Stable id: the broker keeps the persistent session (and the messages
    /// palletd has not acknowledged yet) under it.
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub keep_alive: Duration,
    /// How many unacknowledged QoS 1/2 messages the broker sends before it
    /// waits (Mosquitto: `max_inflight_messages`, default 20); sizes the
    /// hand-off channel inside palletd.
    pub max_inflight: usize,
    /// Largest MQTT packet the client accepts; a bigger one breaks the
    /// connection, so the broker's own limit should be at most this.
    pub max_packet_size: usize,
    /// Payloads larger than this go to the dead letter.
    pub max_payload_size: usize,
    /// Subscribe as `$share/<group>/<filter>`: the broker spreads messages
    /// over every client of the group (several palletd instances).
    pub share_group: Option<String>,
    /// TLS for `mqtts://` URLs.
    pub tls: Option<MqttTls>,
}

#[derive(Debug, Clone, Default)]
pub struct MqttTls {
    /// CA certificates (PEM) that sign the broker's certificate; without it
    /// the Mozilla roots bundled with palletd are used.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the broker's certificate must carry, when it differs from
    /// the URL's host (e.g. connecting by IP address).
    pub server_name: Option<String>,
    /// Accept any certificate. Labs only; logged loudly.
    pub insecure_skip_verify: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteConcern {
    Majority,
    Nodes(u32),
}

#[derive(Debug, Clone)]
pub struct MongoSettings {
    pub uri: Secret,
    pub database: String,
    pub collection: String,
    pub write_concern: WriteConcern,
    pub journal: bool,
    /// Wire compression palletd offers the server, in order of preference
    /// (`compressors=` in the URI takes precedence).
    pub compressors: Vec<String>,
    /// Every write command's `maxTimeMS`: how long a write palletd lost
    /// sight of can still be running on the server ([`crate::store`]).
    pub write_time_limit: std::time::Duration,
}

/// The wire compressors palletd is built with.
pub const COMPRESSORS: &[&str] = &["zstd", "zlib", "snappy"];

impl MongoSettings {
    /// The dead-letter collection, `<collection>_deadletter`.
    pub fn deadletter_collection(&self) -> String {
        format!("{}_deadletter", self.collection)
    }

    /// `<collection>_latest`: each sensor's newest sample (`[latest]`).
    pub fn latest_collection(&self) -> String {
        format!("{}_latest", self.collection)
    }

    /// `<collection>_flat`: a view of one document per reading (bucket mode).
    pub fn flat_view(&self) -> String {
        format!("{}_flat", self.collection)
    }
}

/// How readings are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageMode {
    /// palletd's bucket documents (rollups, closer, caps in the filter).
    Buckets,
    /// A MongoDB native time series collection, one document per reading;
    /// the server builds its own buckets.
    Timeseries,
}

impl StorageMode {
    /// The names `storage.mode` may take; each is one file in `src/store/`.
    pub const NAMES: &'static [&'static str] = &["buckets", "timeseries"];
}

impl std::str::FromStr for StorageMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "buckets" => Ok(StorageMode::Buckets),
            "timeseries" => Ok(StorageMode::Timeseries),
            other => Err(crate::decode::not_one_of(StorageMode::NAMES, other)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageSettings {
    pub mode: StorageMode,
    /// Time series granularity: "seconds", "minutes" or "hours".
    pub granularity: &'static str,
}

#[derive(Debug, Clone)]
pub struct BucketSettings {
    pub window: Duration,
    pub max_samples: u32,
    pub max_bytes: u32,
    /// Samples older than now minus this are a clock problem: dead letter.
    pub max_lateness: Duration,
    /// Samples newer than now plus this are a clock problem: dead letter.
    pub max_future: Duration,
    /// Sensor ids must match this (anchored) pattern.
    pub sensor_id_pattern: regex::Regex,
}

#[derive(Debug, Clone)]
pub struct FlushSettings {
    /// A sensor's samples are written once the oldest has waited this long
    /// (or earlier, when they fill the sensor's open bucket).
    pub max_delay: Duration,
    /// How far the flush policy may stretch the delay when the database
    /// cannot keep up with `max_delay` (at least `max_delay`; equal: never).
    pub max_delay_limit: Duration,
    /// Memory cap: at this many buffered samples palletd flushes and stops
    /// reading from the broker until the flush succeeds.
    pub max_pending_samples: usize,
    /// While a backlog drains, the share of the database's time it gets
    /// when live readings are due too (it gets all of it otherwise).
    pub backfill_share: f64,
}

#[derive(Debug, Clone)]
pub struct CloserSettings {
    /// How often the closer runs.
    pub interval: Duration,
    /// A bucket is sealed once its window ended more than this long ago, so
    /// samples that arrive a little late still join the open bucket.
    pub grace: Duration,
}

/// One `[[rollup]]`: per sensor and interval (aligned to the Unix epoch,
/// UTC), the count and per numeric field sum, n, min, max, avg, first and
/// last, in `<collection>_<name>`.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupSettings {
    /// `1h`, `1d`, `15m`...: the collection's suffix.
    pub name: String,
    /// A whole number of `bucket.window`.
    pub interval: Duration,
    /// TTL on the interval start; `None` keeps them forever.
    pub expire_after: Option<Duration>,
    /// Keep the current interval's document up to date (`partial: true`).
    pub partial: bool,
}

impl RollupSettings {
    pub fn interval_ms(&self) -> i64 {
        self.interval.as_millis() as i64
    }

    /// The start of the interval holding `ts_ms`.
    pub fn start_of(&self, ts_ms: i64) -> i64 {
        ts_ms.div_euclid(self.interval_ms()) * self.interval_ms()
    }
}

/// `1d`, `6h`, `15m`, `30s`, `500ms`: the largest unit that divides.
fn interval_name(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, name) in [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ] {
        if ms.is_multiple_of(unit) {
            return format!("{}{name}", ms / unit);
        }
    }
    format!("{ms}ms")
}

#[derive(Debug, Clone)]
pub struct RetentionSettings {
    /// Buckets are deleted this long after their window ended (TTL index on
    /// `endTs`); `None` keeps them forever.
    pub expire_after: Option<Duration>,
    /// Dead letters are deleted this long after they were received (TTL index
    /// on `receivedAt`); `None` keeps them forever. Default 7 days.
    pub deadletter_expire_after: Option<Duration>,
}

/// `[latest]`: `<collection>_latest`, one document per sensor holding its
/// newest sample, written with every flush.
#[derive(Debug, Clone)]
pub struct LatestSettings {
    pub enabled: bool,
}

#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None` (an
    /// empty `listen`) turns the endpoint off.
    pub listen: Option<std::net::SocketAddr>,
}

const SECTIONS: &[&str] = &[
    "mqtt",
    "mongodb",
    "storage",
    "bucket",
    "flush",
    "closer",
    "retention",
    "latest",
    "http",
    "spool",
    "limits",
    "subscription",
    "rollup",
];

/// Reads and validates a configuration file.
pub fn load(path: &Path) -> Result<Settings, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
        file: path.to_owned(),
        errors: vec![ConfigError {
            path: String::new(),
            message: format!("cannot read file: {e}"),
        }],
    })?;
    parse(&text, path.parent()).map_err(|errors| ConfigErrors {
        file: path.to_owned(),
        errors,
    })
}

/// Parses and validates configuration text. `base` resolves relative
/// `password_file` paths (the config file's directory).
pub fn parse(text: &str, base: Option<&Path>) -> Result<Settings, Vec<ConfigError>> {
    let mut v = Validator::default();
    let table: toml::Table = match toml::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            v.err("", format!("invalid TOML: {}", e.message().trim()));
            return Err(v.errors);
        }
    };
    for key in table.keys() {
        if !SECTIONS.contains(&key.as_str()) {
            v.err(
                key,
                format!("unknown section (expected one of {})", SECTIONS.join(", ")),
            );
        }
    }
    let mqtt: Option<RawMqtt> = v.section(&table, "mqtt", true);
    let mongo: Option<RawMongo> = v.section(&table, "mongodb", true);
    let storage: RawStorage = v.section(&table, "storage", false).unwrap_or_default();
    let bucket: RawBucket = v.section(&table, "bucket", false).unwrap_or_default();
    let flush: RawFlush = v.section(&table, "flush", false).unwrap_or_default();
    let closer: RawCloser = v.section(&table, "closer", false).unwrap_or_default();
    let retention: RawRetention = v.section(&table, "retention", false).unwrap_or_default();
    let latest: RawLatest = v.section(&table, "latest", false).unwrap_or_default();
    let http: RawHttp = v.section(&table, "http", false).unwrap_or_default();
    let spool: RawSpool = v.section(&table, "spool", false).unwrap_or_default();
    let limits: RawLimits = v.section(&table, "limits", false).unwrap_or_default();
    let mut raw_rollups: Vec<RawRollup> = Vec::new();
    match table.get("rollup") {
        None => {}
        Some(toml::Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                if let Some(r) = v.value(item, &format!("rollup[{i}]")) {
                    raw_rollups.push(r);
                }
            }
        }
        Some(_) => v.err("rollup", "must be an array of tables ([[rollup]])"),
    }
    let mut subs: Vec<RawSubscription> = Vec::new();
    match table.get("subscription") {
        None => v.err("subscription", "at least one [[subscription]] is required"),
        Some(toml::Value::Array(items)) => {
            if items.is_empty() {
                v.err("subscription", "at least one [[subscription]] is required");
            }
            for (i, item) in items.iter().enumerate() {
                if let Some(s) = v.value(item, &format!("subscription[{i}]")) {
                    subs.push(s);
                }
            }
        }
        Some(_) => v.err(
            "subscription",
            "must be an array of tables ([[subscription]])",
        ),
    }

    let mqtt = mqtt.and_then(|m| v.mqtt(m, base));
    let mongodb = mongo.map(|m| v.mongo(m, base));
    let storage = v.storage(storage);
    let bucket = v.bucket(bucket);
    let flush = v.flush(flush);
    let closer = v.closer(closer);
    let retention = v.retention(retention);
    let latest = LatestSettings {
        enabled: latest.enabled.unwrap_or(true),
    };
    let http = v.http(http);
    let mut spool = v.spool(spool, base);
    let limits = v.limits(limits);
    spool.max_queued = limits.split().spool;
    let subscriptions: Vec<Subscription> = subs
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| v.subscription(s, &format!("subscription[{i}]")))
        .collect();
    let rollups = v.rollups(raw_rollups, bucket.window);
    if let (Some(m), Some(i)) = (
        &mqtt,
        subscriptions
            .iter()
            .position(|s| s.format == PayloadFormat::SparkplugB),
    ) {
        if m.share_group.is_some() {
            v.err(
                format!("subscription[{i}].format"),
                "\"sparkplug_b\" cannot be used with mqtt.share_group: an edge node's BIRTH and its DATA must reach the same palletd (give each instance its own groups or nodes instead)",
            );
        }
    }

    match (mqtt, mongodb) {
        (Some(mqtt), Some(mongodb)) if v.errors.is_empty() => Ok(Settings {
            mqtt,
            mongodb,
            storage,
            bucket,
            flush,
            closer,
            retention,
            latest,
            http,
            spool,
            limits,
            subscriptions,
            rollups,
            warnings: v.warnings,
        }),
        _ => Err(v.errors),
    }
}

#[derive(Default)]
struct Validator {
    errors: Vec<ConfigError>,
    warnings: Vec<String>,
}

impl Validator {
    fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }

    fn section<T: DeserializeOwned>(
        &mut self,
        table: &toml::Table,
        name: &str,
        required: bool,
    ) -> Option<T> {
        match table.get(name) {
            Some(value @ toml::Value::Table(_)) => self.value(value, name),
            Some(_) => {
                self.err(name, "must be a table");
                None
            }
            None => {
                if required {
                    self.err(name, "missing required section");
                }
                None
            }
        }
    }

    /// Deserializes one value, recording every error with its full path.
    ///
    /// serde stops at the first error, so after each one the offending key is
    /// taken out and the value read again; a required key taken out this way
    /// is not reported a second time as missing.
    fn value<T: DeserializeOwned>(&mut self, value: &toml::Value, prefix: &str) -> Option<T> {
        let mut value = value.clone();
        let mut reported: Vec<Vec<String>> = Vec::new();
        for _ in 0..64 {
            let e = match serde_path_to_error::deserialize(value.clone()) {
                Ok(v) => return reported.is_empty().then_some(v),
                Err(e) => e,
            };
            let mut keys: Vec<String> = e
                .path()
                .iter()
                .filter_map(|seg| match seg {
                    serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                    _ => None,
                })
                .collect();
            let message = e.into_inner().to_string();
            // serde names a missing field in the message only.
            let missing = message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next())
                .map(str::to_string);
            if let Some(field) = &missing {
                keys.push(field.clone());
            }
            let path = std::iter::once(prefix.to_string())
                .chain(keys.iter().cloned())
                .collect::<Vec<_>>()
                .join(".");
            if !reported.contains(&keys) {
                // serde may quote the value; never for a key that holds a secret.
                let secret = keys
                    .last()
                    .is_some_and(|k| k.contains("password") || k.starts_with("uri"));
                match missing {
                    Some(_) => self.err(path, "required key is missing"),
                    None if secret => self.err(
                        path,
                        "has the wrong type (value not shown: it may be a secret)",
                    ),
                    None => self.err(path, message),
                }
            }
            if missing.is_some() || keys.is_empty() || !remove_key(&mut value, &keys) {
                return None;
            }
            reported.push(keys);
        }
        None
    }

    fn duration(&mut self, path: &str, raw: Option<&str>, default: &str) -> Duration {
        let text = raw.unwrap_or(default);
        match humantime::parse_duration(text) {
            Ok(d) => d,
            Err(e) => {
                self.err(
                    path,
                    format!("invalid duration {text:?}: {e} (e.g. \"500ms\", \"1h\")"),
                );
                humantime::parse_duration(default).unwrap_or_default()
            }
        }
    }

    fn positive_duration(&mut self, path: &str, raw: Option<&str>, default: &str) -> Duration {
        let d = self.duration(path, raw, default);
        if d.is_zero() {
            self.err(path, "must be greater than zero");
        }
        d
    }

    fn size(&mut self, path: &str, raw: Option<RawSize>, default: u64) -> u64 {
        match raw {
            None => default,
            Some(RawSize::Bytes(n)) => n,
            Some(RawSize::Text(t)) => match t.trim().parse::<bytesize::ByteSize>() {
                Ok(b) => b.as_u64(),
                Err(e) => {
                    self.err(path, format!("invalid size {t:?}: {e} (e.g. \"256KiB\")"));
                    default
                }
            },
        }
    }

    fn int_in(&mut self, path: &str, raw: Option<i64>, default: i64, min: i64, max: i64) -> i64 {
        let n = raw.unwrap_or(default);
        if n < min || n > max {
            self.err(path, format!("must be between {min} and {max}, got {n}"));
            return default;
        }
        n
    }

    fn mqtt(&mut self, m: RawMqtt, base: Option<&Path>) -> Option<MqttSettings> {
        let (host, port, tls_url) = match parse_mqtt_url(&m.url) {
            Ok(hp) => hp,
            Err(e) => {
                self.err("mqtt.url", e);
                (String::new(), 0, false)
            }
        };
        if m.client_id.trim().is_empty() {
            self.err(
                "mqtt.client_id",
                "must not be empty: the persistent session is kept under it",
            );
        } else if m.client_id.len() > 65535 {
            self.err("mqtt.client_id", "is too long");
        }
        if let Some(g) = &m.share_group {
            if g.is_empty() || g.contains(['/', '+', '#']) {
                self.err(
                    "mqtt.share_group",
                    "must be a non-empty name without '/', '+' or '#'",
                );
            }
        }
        let tls = match (tls_url, m.tls) {
            (true, raw) => Some(self.mqtt_tls(raw.unwrap_or_default(), base)),
            (false, Some(_)) => {
                self.err("mqtt.tls", "TLS settings need an mqtts:// URL");
                None
            }
            (false, None) => None,
        };
        let sources = [
            m.password.is_some(),
            m.password_file.is_some(),
            m.password_env.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() > 1 {
            self.err(
                "mqtt.password",
                "set only one of password, password_file and password_env",
            );
        }
        let password = if let Some(p) = m.password {
            Some(Secret::new(p))
        } else if let Some(f) = m.password_file {
            let p = resolve(base, &f);
            self.warn_if_readable_by_others("mqtt.password_file", &p);
            match std::fs::read_to_string(&p) {
                Ok(s) => Some(Secret::new(s.trim_end_matches(['\r', '\n']))),
                Err(e) => {
                    self.err(
                        "mqtt.password_file",
                        format!("cannot read {}: {e}", p.display()),
                    );
                    None
                }
            }
        } else if let Some(var) = m.password_env {
            match std::env::var(&var) {
                Ok(v) => Some(Secret::new(v)),
                Err(_) => {
                    self.err(
                        "mqtt.password_env",
                        format!("environment variable {var:?} is not set"),
                    );
                    None
                }
            }
        } else {
            None
        };
        if password.is_some() && m.username.is_none() {
            self.err("mqtt.username", "a password needs a username");
        }
        let keep_alive = self.duration("mqtt.keep_alive", m.keep_alive.as_deref(), "30s");
        if keep_alive < Duration::from_secs(5) || keep_alive > Duration::from_secs(65535) {
            self.err("mqtt.keep_alive", "must be between 5s and 18h12m15s");
        }
        let max_inflight = self.int_in("mqtt.max_inflight", m.max_inflight, 20, 1, 65535) as usize;
        let max_packet_size = self.size("mqtt.max_packet_size", m.max_packet_size, 4 << 20);
        let max_payload_size = self.size("mqtt.max_payload_size", m.max_payload_size, 256 << 10);
        if max_packet_size > 256 << 20 {
            self.err(
                "mqtt.max_packet_size",
                "must be at most 256MiB (the MQTT limit)",
            );
        }
        if max_payload_size == 0 || max_payload_size > max_packet_size {
            self.err(
                "mqtt.max_payload_size",
                "must be between 1 byte and mqtt.max_packet_size",
            );
        }
        Some(MqttSettings {
            host,
            port,
            client_id: m.client_id,
            username: m.username,
            password,
            keep_alive,
            max_inflight,
            max_packet_size: max_packet_size as usize,
            max_payload_size: max_payload_size as usize,
            share_group: m.share_group,
            tls,
        })
    }

    fn mqtt_tls(&mut self, t: RawMqttTls, base: Option<&Path>) -> MqttTls {
        let file = |v: &mut Validator, key: &str, f: Option<String>| -> Option<PathBuf> {
            let p = resolve(base, &f?);
            if let Err(e) = std::fs::metadata(&p) {
                v.err(
                    format!("mqtt.tls.{key}"),
                    format!("cannot read {}: {e}", p.display()),
                );
            }
            Some(p)
        };
        let ca_file = file(self, "ca_file", t.ca_file);
        let cert_file = file(self, "cert_file", t.cert_file);
        let key_file = file(self, "key_file", t.key_file);
        if let Some(k) = &key_file {
            self.warn_if_readable_by_others("mqtt.tls.key_file", k);
        }
        if cert_file.is_some() != key_file.is_some() {
            self.err(
                "mqtt.tls.key_file",
                "a client certificate needs both cert_file and key_file",
            );
        }
        if let Some(name) = &t.server_name {
            if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
                self.err(
                    "mqtt.tls.server_name",
                    format!("{name:?} is not a DNS name or IP address"),
                );
            }
        }
        let insecure_skip_verify = t.insecure_skip_verify.unwrap_or(false);
        if insecure_skip_verify {
            self.warnings.push(
                "mqtt.tls.insecure_skip_verify = true: the broker's certificate is NOT checked; anyone on the path can read and change the traffic. For labs only.".into(),
            );
        }
        MqttTls {
            ca_file,
            cert_file,
            key_file,
            server_name: t.server_name,
            insecure_skip_verify,
        }
    }

    /// A secret file others can read is a leak waiting to happen: warn.
    fn warn_if_readable_by_others(&mut self, key: &str, path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.permissions().mode() & 0o004 != 0 {
                self.warnings.push(format!(
                    "{key}: {} is readable by every user; make it readable by palletd only (chmod 600)",
                    path.display()
                ));
            }
        }
    }

    fn mongo(&mut self, m: RawMongo, base: Option<&Path>) -> MongoSettings {
        let uri = match (m.uri, m.uri_file) {
            (Some(_), Some(_)) => {
                self.err("mongodb.uri_file", "set either uri or uri_file, not both");
                String::new()
            }
            (Some(u), None) => u,
            (None, Some(f)) => {
                let p = resolve(base, &f);
                self.warn_if_readable_by_others("mongodb.uri_file", &p);
                match std::fs::read_to_string(&p) {
                    Ok(u) => u.trim().to_string(),
                    Err(e) => {
                        self.err(
                            "mongodb.uri_file",
                            format!("cannot read {}: {e}", p.display()),
                        );
                        String::new()
                    }
                }
            }
            (None, None) => {
                self.err("mongodb.uri", "required: set uri or uri_file");
                String::new()
            }
        };
        if !(uri.is_empty() || uri.starts_with("mongodb://") || uri.starts_with("mongodb+srv://")) {
            self.err(
                "mongodb.uri",
                "must start with mongodb:// or mongodb+srv://",
            );
        }
        check_name(
            self,
            "mongodb.database",
            &m.database,
            &['/', '\\', '.', ' ', '"', '$'],
        );
        let collection = m.collection.unwrap_or_else(|| "readings".into());
        check_name(self, "mongodb.collection", &collection, &['$']);
        if collection.starts_with("system.") {
            self.err("mongodb.collection", "must not start with \"system.\"");
        }
        let write_concern = match m.write_concern {
            None => WriteConcern::Majority,
            Some(RawWriteConcern::Tag(t)) if t == "majority" => WriteConcern::Majority,
            Some(RawWriteConcern::Tag(t)) => {
                self.err(
                    "mongodb.write_concern",
                    format!("must be \"majority\" or a number of nodes, got {t:?}"),
                );
                WriteConcern::Majority
            }
            Some(RawWriteConcern::Nodes(n)) if (1..=50).contains(&n) => {
                WriteConcern::Nodes(n as u32)
            }
            Some(RawWriteConcern::Nodes(n)) => {
                self.err(
                    "mongodb.write_concern",
                    format!("a number of nodes must be between 1 and 50, got {n} (0 would not wait for the write)"),
                );
                WriteConcern::Majority
            }
        };
        let journal = m.journal.unwrap_or(true);
        if let WriteConcern::Nodes(n) = write_concern {
            self.warnings.push(format!(
                "mongodb.write_concern = {n}: a write is acknowledged once {n} node(s) have it; if that is not a majority of the replica set's voting members, an election can roll it back after palletd counted it as stored, and the reading is lost. \"majority\" (the default) gives the exactly-once the README describes"
            ));
        }
        if !journal {
            self.warnings.push(
                "mongodb.journal = false: a write is acknowledged before it is in the server's journal; a server crash can lose it after palletd counted it as stored. journal = true (the default) gives the exactly-once the README describes".into(),
            );
        }
        let compressors = m.compressors.unwrap_or_else(|| vec!["zstd".into()]);
        for c in &compressors {
            if !COMPRESSORS.contains(&c.as_str()) {
                self.err(
                    "mongodb.compressors",
                    format!(
                        "unknown compressor {c:?} (one of {})",
                        COMPRESSORS.join(", ")
                    ),
                );
            }
        }
        let write_time_limit = self.positive_duration(
            "mongodb.write_time_limit",
            m.write_time_limit.as_deref(),
            "10s",
        );
        if write_time_limit < std::time::Duration::from_millis(100) {
            self.err("mongodb.write_time_limit", "must be at least 100ms");
        }
        MongoSettings {
            uri: Secret::new(uri),
            database: m.database,
            collection,
            write_concern,
            journal,
            compressors,
            write_time_limit,
        }
    }

    fn bucket(&mut self, b: RawBucket) -> BucketSettings {
        let window = self.positive_duration("bucket.window", b.window.as_deref(), "1h");
        if !window.subsec_nanos().is_multiple_of(1_000_000) {
            self.err("bucket.window", "must be a whole number of milliseconds");
        }
        let max_samples = self.int_in("bucket.max_samples", b.max_samples, 200, 1, 100_000) as u32;
        let max_bytes = self.size("bucket.max_bytes", b.max_bytes, 256 << 10);
        if !(64..=MAX_BUCKET_BYTES).contains(&max_bytes) {
            self.err("bucket.max_bytes", "must be between 64 bytes and 8MiB");
        }
        let max_lateness =
            self.positive_duration("bucket.max_lateness", b.max_lateness.as_deref(), "7d");
        let max_future = self.duration("bucket.max_future", b.max_future.as_deref(), "5m");
        let pattern = b
            .sensor_id_pattern
            .unwrap_or_else(|| DEFAULT_SENSOR_ID_PATTERN.into());
        let sensor_id_pattern = match regex::Regex::new(&format!("^(?:{pattern})$")) {
            Ok(r) => r,
            Err(e) => {
                self.err("bucket.sensor_id_pattern", format!("invalid regex: {e}"));
                regex::Regex::new(&format!("^(?:{DEFAULT_SENSOR_ID_PATTERN})$"))
                    .unwrap_or_else(|_| unreachable!())
            }
        };
        BucketSettings {
            window,
            max_samples,
            max_bytes: max_bytes.min(MAX_BUCKET_BYTES) as u32,
            max_lateness,
            max_future,
            sensor_id_pattern,
        }
    }

    fn flush(&mut self, f: RawFlush) -> FlushSettings {
        let (path, raw) = match (f.max_delay, f.interval) {
            (Some(_), Some(_)) => {
                self.err(
                    "flush.interval",
                    "set flush.max_delay only (flush.interval is its old name)",
                );
                ("flush.max_delay", None)
            }
            (None, Some(old)) => {
                self.warnings.push(
                    "flush.interval is now called flush.max_delay (each sensor is written once its oldest reading waited that long); the value is used as max_delay".into(),
                );
                ("flush.interval", Some(old))
            }
            (d, None) => ("flush.max_delay", d),
        };
        let max_delay = self.positive_duration(path, raw.as_deref(), DEFAULT_MAX_DELAY);
        let max_delay_limit = match f.max_delay_limit.as_deref() {
            Some(raw) => {
                self.positive_duration("flush.max_delay_limit", Some(raw), DEFAULT_MAX_DELAY_LIMIT)
            }
            // Unset: the default, or max_delay if that is longer.
            None => self
                .positive_duration("flush.max_delay_limit", None, DEFAULT_MAX_DELAY_LIMIT)
                .max(max_delay),
        };
        if max_delay_limit < max_delay {
            self.err(
                "flush.max_delay_limit",
                format!(
                    "must be at least flush.max_delay ({}), got {}",
                    humantime::format_duration(max_delay),
                    humantime::format_duration(max_delay_limit)
                ),
            );
        }
        let max_pending_samples = self.int_in(
            "flush.max_pending_samples",
            f.max_pending_samples,
            1_000_000,
            1,
            100_000_000,
        ) as usize;
        let backfill_share = f.backfill_share.unwrap_or(0.5);
        if !(0.0..=1.0).contains(&backfill_share) {
            self.err(
                "flush.backfill_share",
                format!("must be between 0 and 1, got {backfill_share}"),
            );
        }
        FlushSettings {
            max_delay,
            max_delay_limit: max_delay_limit.max(max_delay),
            max_pending_samples,
            backfill_share: backfill_share.clamp(0.0, 1.0),
        }
    }

    fn storage(&mut self, s: RawStorage) -> StorageSettings {
        let mode = match s
            .mode
            .as_deref()
            .unwrap_or("buckets")
            .parse::<StorageMode>()
        {
            Ok(m) => m,
            Err(e) => {
                self.err("storage.mode", e);
                StorageMode::Buckets
            }
        };
        let granularity = match s.granularity.as_deref() {
            None | Some("seconds") => "seconds",
            Some("minutes") => "minutes",
            Some("hours") => "hours",
            Some(other) => {
                self.err(
                    "storage.granularity",
                    format!("must be \"seconds\", \"minutes\" or \"hours\", got {other:?}"),
                );
                "seconds"
            }
        };
        StorageSettings { mode, granularity }
    }

    fn closer(&mut self, c: RawCloser) -> CloserSettings {
        CloserSettings {
            interval: self.positive_duration("closer.interval", c.interval.as_deref(), "1m"),
            grace: self.duration("closer.grace", c.grace.as_deref(), "5m"),
        }
    }

    /// `"off"` turns a retention off; otherwise a positive duration of whole
    /// seconds (TTL indexes count in seconds).
    fn retention_value(
        &mut self,
        path: &str,
        raw: Option<&str>,
        default: Option<&str>,
    ) -> Option<Duration> {
        let text = raw.or(default)?;
        if text.trim() == "off" {
            return None;
        }
        let d = self.positive_duration(path, Some(text), "1s");
        if d.subsec_nanos() != 0 {
            self.err(path, "must be a whole number of seconds");
        }
        if d.as_secs() > i32::MAX as u64 {
            self.err(path, "is longer than a TTL index allows (about 68 years)");
        }
        Some(d)
    }

    /// `[[rollup]]`s: an interval that is not a whole number of windows
    /// would cut a window (a bucket's samples) in two, so it is an error;
    /// two with the same interval too.
    fn rollups(&mut self, raw: Vec<RawRollup>, window: Duration) -> Vec<RollupSettings> {
        let mut out: Vec<RollupSettings> = Vec::new();
        for (i, r) in raw.into_iter().enumerate() {
            let path = format!("rollup[{i}]");
            let interval =
                self.positive_duration(&format!("{path}.interval"), Some(&r.interval), "1h");
            if interval.is_zero() {
                continue;
            }
            if window.is_zero() || !interval.as_millis().is_multiple_of(window.as_millis()) {
                self.err(
                    format!("{path}.interval"),
                    format!(
                        "{} is not a whole number of bucket.window ({}): a window's buckets must fall in one interval",
                        r.interval,
                        interval_name(window)
                    ),
                );
                continue;
            }
            let name = interval_name(interval);
            if out.iter().any(|o| o.name == name) {
                self.err(
                    format!("{path}.interval"),
                    format!("a rollup of {name} is configured twice"),
                );
                continue;
            }
            let expire_after = self.retention_value(
                &format!("{path}.expire_after"),
                r.expire_after.as_deref(),
                None,
            );
            out.push(RollupSettings {
                name,
                interval,
                expire_after,
                partial: r.partial.unwrap_or(false),
            });
        }
        out
    }

    fn retention(&mut self, r: RawRetention) -> RetentionSettings {
        RetentionSettings {
            expire_after: self.retention_value(
                "retention.expire_after",
                r.expire_after.as_deref(),
                None,
            ),
            deadletter_expire_after: self.retention_value(
                "retention.deadletter_expire_after",
                r.deadletter_expire_after.as_deref(),
                Some("7d"),
            ),
        }
    }

    fn limits(&mut self, l: RawLimits) -> LimitSettings {
        let max_memory = self.size("limits.max_memory", l.max_memory, 64 << 20);
        if max_memory < 4 << 20 {
            self.err("limits.max_memory", "must be at least 4MiB");
        }
        let max_deadletter_rate = self.size(
            "limits.max_deadletter_rate",
            l.max_deadletter_rate,
            64 << 10,
        );
        if max_deadletter_rate < 1024 {
            self.err(
                "limits.max_deadletter_rate",
                "must be at least 1KiB (a second)",
            );
        }
        let mut n = |key: &str, raw: Option<i64>, default: i64, max: i64| {
            self.int_in(&format!("limits.{key}"), raw, default, 1, max) as usize
        };
        LimitSettings {
            max_samples_per_message: n(
                "max_samples_per_message",
                l.max_samples_per_message,
                1000,
                1_000_000,
            ),
            max_fields_per_sample: n("max_fields_per_sample", l.max_fields_per_sample, 64, 10_000),
            max_field_name_length: n("max_field_name_length", l.max_field_name_length, 64, 1024),
            max_string_length: n("max_string_length", l.max_string_length, 1024, 1 << 20),
            max_sensors: n("max_sensors", l.max_sensors, 100_000, 100_000_000),
            max_sparkplug_nodes: n(
                "max_sparkplug_nodes",
                l.max_sparkplug_nodes,
                1000,
                1_000_000,
            ),
            max_sparkplug_devices_per_node: n(
                "max_sparkplug_devices_per_node",
                l.max_sparkplug_devices_per_node,
                1000,
                1_000_000,
            ),
            max_sparkplug_aliases: n(
                "max_sparkplug_aliases",
                l.max_sparkplug_aliases,
                100_000,
                100_000_000,
            ),
            max_memory,
            max_deadletter_rate,
        }
    }

    fn spool(&mut self, s: RawSpool, base: Option<&Path>) -> spool::SpoolSettings {
        use spool::{Fsync, WhenFull};
        let dir = s.dir.unwrap_or_else(|| DEFAULT_SPOOL_DIR.into());
        if dir.trim().is_empty() {
            self.err("spool.dir", "must not be empty");
        }
        let dir = PathBuf::from(&dir);
        let dir = match base {
            Some(b) if dir.is_relative() => b.join(dir),
            _ => dir,
        };
        let max_size = self.size("spool.max_size", s.max_size, 1 << 30);
        if max_size < 64 * 1024 {
            self.err("spool.max_size", "must be at least 64KiB");
        }
        let fsync = match s.fsync.as_deref() {
            None | Some("batch") => Fsync::Batch,
            Some("always") => Fsync::Always,
            Some("off") => Fsync::Off,
            Some(other) => {
                self.err(
                    "spool.fsync",
                    format!("must be \"batch\", \"always\" or \"off\", got {other:?}"),
                );
                Fsync::Batch
            }
        };
        let when_full = match s.when_full.as_deref() {
            None | Some("stop") => WhenFull::Stop,
            Some("drop_oldest") => WhenFull::DropOldest,
            Some(other) => {
                self.err(
                    "spool.when_full",
                    format!("must be \"stop\" or \"drop_oldest\", got {other:?}"),
                );
                WhenFull::Stop
            }
        };
        spool::SpoolSettings {
            dir,
            max_size,
            fsync,
            compress: s.compress.unwrap_or(true),
            when_full,
            max_queued: spool::DEFAULT_MAX_QUEUED,
        }
    }

    fn http(&mut self, h: RawHttp) -> HttpSettings {
        let text = h.listen.unwrap_or_else(|| "127.0.0.1:9464".into());
        if text.trim().is_empty() {
            return HttpSettings { listen: None };
        }
        match text.trim().parse() {
            Ok(addr) => HttpSettings { listen: Some(addr) },
            Err(_) => {
                self.err("http.listen", format!("{text:?} is not an address:port (e.g. \"127.0.0.1:9464\"; empty to turn off)"));
                HttpSettings { listen: None }
            }
        }
    }

    fn subscription(&mut self, s: RawSubscription, path: &str) -> Option<Subscription> {
        let pattern = match TopicPattern::parse(&s.topic) {
            Ok(p) => Some(p),
            Err(e) => {
                self.err(format!("{path}.topic"), e);
                None
            }
        };
        let format = match s
            .format
            .as_deref()
            .unwrap_or("json")
            .parse::<PayloadFormat>()
        {
            Ok(f) => f,
            Err(e) => {
                self.err(format!("{path}.format"), e);
                PayloadFormat::Json
            }
        };
        let timestamp_field_set = s.timestamp_field.is_some();
        let timestamp_field = s.timestamp_field.unwrap_or_else(|| "ts".into());
        if let Err(e) = crate::decode::check_field_name(&timestamp_field) {
            self.err(format!("{path}.timestamp_field"), e.to_string());
        }
        if let Some(f) = &s.sensor_field {
            if let Err(e) = crate::decode::check_field_name(f) {
                self.err(format!("{path}.sensor_field"), e.to_string());
            }
            if format == PayloadFormat::Number {
                self.err(format!("{path}.sensor_field"), "needs format = \"json\"");
            }
        }
        if let Some(f) = &s.field {
            if let Err(e) = crate::decode::check_field_name(f) {
                self.err(format!("{path}.field"), e.to_string());
            }
        }
        let qos = self.int_in(&format!("{path}.qos"), s.qos, 1, 0, 2) as u8;
        let rebirth_min_interval = self.positive_duration(
            &format!("{path}.rebirth_min_interval"),
            s.rebirth_min_interval.as_deref(),
            "1m",
        );
        let sparkplug = format == PayloadFormat::SparkplugB;
        let rebirth_min_interval = match s.request_rebirth {
            Some(true) if sparkplug => Some(rebirth_min_interval),
            Some(true) => {
                self.err(
                    format!("{path}.request_rebirth"),
                    "needs format = \"sparkplug_b\"",
                );
                None
            }
            _ => None,
        };
        let pattern = pattern?;
        if sparkplug {
            for (key, set) in [
                ("sensor_field", s.sensor_field.is_some()),
                ("field", s.field.is_some()),
                ("timestamp_field", timestamp_field_set),
            ] {
                if set {
                    self.err(
                        format!("{path}.{key}"),
                        "does not apply to format = \"sparkplug_b\" (sensor ids, field names and times come from the Sparkplug topic and payload)",
                    );
                }
            }
            if pattern.has_sensor() || pattern.has_field() || !s.topic.starts_with("spBv1.0/") {
                self.err(
                    format!("{path}.topic"),
                    "format = \"sparkplug_b\" needs an MQTT filter in the Sparkplug namespace without placeholders, e.g. \"spBv1.0/#\" or \"spBv1.0/Plant1/#\"",
                );
            }
        } else if s.sensor_field.is_none() && !pattern.has_sensor() {
            self.err(
                format!("{path}.topic"),
                "needs a {sensor} placeholder, or set sensor_field to read the sensor id from the payload",
            );
        }
        if format == PayloadFormat::Number && !pattern.has_field() && s.field.is_none() {
            self.err(
                format!("{path}.field"),
                "format = \"number\" needs a {field} placeholder in the topic or a field name here",
            );
        }
        Some(Subscription {
            pattern,
            format,
            timestamp_field,
            sensor_field: s.sensor_field,
            field: s.field,
            qos,
            rebirth_min_interval,
        })
    }
}

/// Removes the key at `path` from nested tables; false if it was not there.
fn remove_key(value: &mut toml::Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut v = value;
    for p in parents {
        match v.get_mut(p.as_str()) {
            Some(next) => v = next,
            None => return false,
        }
    }
    v.as_table_mut().is_some_and(|t| t.remove(last).is_some())
}

fn check_name(v: &mut Validator, path: &str, name: &str, forbidden: &[char]) {
    if name.is_empty() {
        v.err(path, "must not be empty");
    } else if let Some(c) = name.chars().find(|c| forbidden.contains(c) || *c == '\0') {
        v.err(path, format!("must not contain {c:?}"));
    } else if name.len() > 120 {
        v.err(path, "is longer than 120 bytes");
    }
}

/// `mqtt://host:port` (port 1883 by default) or `mqtts://host:port` (TLS,
/// port 8883 by default): (host, port, tls). Errors never repeat the URL,
/// which might carry a password.
pub fn parse_mqtt_url(text: &str) -> Result<(String, u16, bool), String> {
    let url = url::Url::parse(text).map_err(|e| format!("invalid URL: {e}"))?;
    let (tls, default_port) = match url.scheme() {
        "mqtt" | "tcp" => (false, 1883),
        "mqtts" | "ssl" => (true, 8883),
        other => {
            return Err(format!(
                "unsupported scheme {other:?}: use mqtt://host:port or mqtts://host:port"
            ))
        }
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "put credentials in mqtt.username and mqtt.password_file, not in the URL".into(),
        );
    }
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or("no host in the URL")?;
    if url.path() != "" && url.path() != "/" {
        return Err(format!("unexpected path {:?} in the URL", url.path()));
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((host, url.port().unwrap_or(default_port), tls))
}

/// A path from the configuration: relative to the config file's directory.
fn resolve(base: Option<&Path>, path: &str) -> PathBuf {
    match base {
        Some(b) if Path::new(path).is_relative() => b.join(path),
        _ => PathBuf::from(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [mqtt]
        url = "mqtt://127.0.0.1:1883"
        client_id = "palletd-test"
        [mongodb]
        uri = "mongodb://127.0.0.1:27017"
        database = "palletd"
        [[subscription]]
        topic = "sensors/{sensor}/telemetry"
    "#;

    fn errors(text: &str) -> Vec<String> {
        parse(text, None)
            .err()
            .unwrap_or_default()
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn example_config_parses_and_validates() {
        let s = parse(EXAMPLE, None).expect("the example config is valid");
        assert_eq!(s.mongodb.collection, "readings");
        assert_eq!(s.bucket.max_samples, 200);
        assert_eq!(s.bucket.max_bytes, 256 * 1024);
        assert_eq!(s.flush.max_delay, Duration::from_secs(10));
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let s = parse(MINIMAL, None).unwrap();
        assert_eq!(s.mqtt.port, 1883);
        assert_eq!(s.mqtt.keep_alive, Duration::from_secs(30));
        assert_eq!(s.mongodb.write_concern, WriteConcern::Majority);
        assert!(s.mongodb.journal);
        assert_eq!(s.bucket.window, Duration::from_secs(3600));
        assert_eq!(s.flush.max_pending_samples, 1_000_000);
        assert_eq!(s.subscriptions[0].qos, 1);
        assert_eq!(s.closer.interval, Duration::from_secs(60));
        assert_eq!(s.closer.grace, Duration::from_secs(300));
        assert_eq!(s.storage.mode, StorageMode::Buckets);
        assert_eq!(s.retention.expire_after, None);
        assert_eq!(
            s.retention.deadletter_expire_after,
            Some(Duration::from_secs(7 * 86400))
        );
        assert_eq!(s.subscriptions[0].timestamp_field, "ts");
    }

    #[test]
    fn every_error_is_reported_with_its_path() {
        let text = MINIMAL
            .replace(
                "mqtt://127.0.0.1:1883\"",
                "mqtt://127.0.0.1:1883\"\nkeep_alive = \"soon\"",
            )
            .replace(
                "database = \"palletd\"",
                "database = \"palletd\"\nwrite_concern = 0",
            )
            + "[bucket]\nmax_bytes = \"9MiB\"\nwindow = \"0s\"\n[flush]\nbogus = 1\n";
        let errs = errors(&text);
        let joined = errs.join("\n");
        assert!(
            joined.contains("mqtt.keep_alive: invalid duration"),
            "{joined}"
        );
        assert!(joined.contains("mongodb.write_concern:"), "{joined}");
        assert!(joined.contains("bucket.max_bytes:"), "{joined}");
        assert!(
            joined.contains("bucket.window: must be greater than zero"),
            "{joined}"
        );
        assert!(joined.contains("flush.bogus: unknown field"), "{joined}");
        assert_eq!(errs.len(), 5, "{joined}");
    }

    #[test]
    fn missing_and_unknown_keys_name_their_path() {
        let text = MINIMAL.replace("client_id = \"palletd-test\"", "clientid = \"x\"");
        let joined = errors(&text).join("\n");
        assert!(joined.contains("mqtt.clientid: unknown field"), "{joined}");
        let text = MINIMAL.replace("client_id = \"palletd-test\"", "");
        let joined = errors(&text).join("\n");
        assert!(
            joined.contains("mqtt.client_id: required key is missing"),
            "{joined}"
        );
        let joined = errors(&(MINIMAL.to_string() + "[extra]\n")).join("\n");
        assert!(joined.contains("extra: unknown section"), "{joined}");
    }

    #[test]
    fn subscription_errors_carry_their_index() {
        let text = MINIMAL.to_string()
            + "[[subscription]]\ntopic = \"a/{sensor}/{sensor}\"\n[[subscription]]\ntopic = \"b/{sensor}\"\nformat = \"number\"\nqos = 3\n";
        let joined = errors(&text).join("\n");
        assert!(joined.contains("subscription[1].topic:"), "{joined}");
        assert!(joined.contains("subscription[2].field:"), "{joined}");
        assert!(joined.contains("subscription[2].qos:"), "{joined}");
    }

    #[test]
    fn storage_mode_is_checked() {
        let s = parse(
            &(MINIMAL.to_string()
                + "[storage]\nmode = \"timeseries\"\ngranularity = \"minutes\"\n"),
            None,
        )
        .unwrap();
        assert_eq!(s.storage.mode, StorageMode::Timeseries);
        assert_eq!(s.storage.granularity, "minutes");
        let joined =
            errors(&(MINIMAL.to_string() + "[storage]\nmode = \"ts\"\ngranularity = \"days\"\n"))
                .join("\n");
        assert!(joined.contains("storage.mode: must be"), "{joined}");
        assert!(joined.contains("storage.granularity: must be"), "{joined}");
    }

    #[test]
    fn a_write_concern_short_of_majority_and_journal_is_warned_about() {
        let plain = parse(MINIMAL, None).unwrap();
        assert!(plain.warnings.is_empty(), "{:?}", plain.warnings);
        let text = MINIMAL.replace(
            "database = \"palletd\"",
            "database = \"palletd\"\nwrite_concern = 1\njournal = false",
        );
        let s = parse(&text, None).unwrap();
        let joined = s.warnings.join("\n");
        assert!(joined.contains("mongodb.write_concern = 1"), "{joined}");
        assert!(joined.contains("an election can roll it back"), "{joined}");
        assert!(joined.contains("mongodb.journal = false"), "{joined}");
    }

    #[test]
    fn flush_interval_is_read_as_max_delay_with_a_warning() {
        let s = parse(
            &(MINIMAL.to_string() + "[flush]\ninterval = \"3s\"\n"),
            None,
        )
        .unwrap();
        assert_eq!(s.flush.max_delay, Duration::from_secs(3));
        assert!(
            s.warnings.iter().any(|w| w.contains("flush.max_delay")),
            "{:?}",
            s.warnings
        );
        let joined =
            errors(&(MINIMAL.to_string() + "[flush]\ninterval = \"3s\"\nmax_delay = \"2s\"\n"))
                .join("\n");
        assert!(joined.contains("flush.interval:"), "{joined}");
    }

    /// `flush.max_delay_limit`: 5 minutes unless set, never below
    /// max_delay (an error when set so; unset, it follows a longer one).
    #[test]
    fn the_delay_limit_is_five_minutes_and_never_below_max_delay() {
        let s = parse(MINIMAL, None).unwrap();
        assert_eq!(s.flush.max_delay_limit, Duration::from_secs(300));
        let flush = |t: &str| MINIMAL.to_string() + "[flush]\n" + t;
        let s = parse(&flush("max_delay = \"10m\"\n"), None).unwrap();
        assert_eq!(s.flush.max_delay_limit, Duration::from_secs(600));
        let s = parse(&flush("max_delay_limit = \"30s\"\n"), None).unwrap();
        assert_eq!(s.flush.max_delay_limit, Duration::from_secs(30));
        let joined = errors(&flush("max_delay = \"1m\"\nmax_delay_limit = \"30s\"\n")).join("\n");
        assert!(
            joined.contains("flush.max_delay_limit: must be at least flush.max_delay (1m)"),
            "{joined}"
        );
    }

    #[test]
    fn sparkplug_subscriptions_take_the_namespace_and_no_shared_group() {
        let sub = "[[subscription]]\ntopic = \"spBv1.0/Plant1/#\"\nformat = \"sparkplug_b\"\n";
        let s = parse(&(MINIMAL.to_string() + sub), None).unwrap();
        assert_eq!(s.subscriptions[1].format, PayloadFormat::SparkplugB);
        assert_eq!(
            s.subscriptions[1].rebirth_min_interval, None,
            "off by default"
        );
        let on =
            MINIMAL.to_string() + sub + "request_rebirth = true\nrebirth_min_interval = \"30s\"\n";
        assert_eq!(
            parse(&on, None).unwrap().subscriptions[1].rebirth_min_interval,
            Some(Duration::from_secs(30))
        );
        let cases = [
            (
                MINIMAL.replace("client_id = \"palletd-test\"", "client_id = \"palletd-test\"\nshare_group = \"g\"") + sub,
                "subscription[1].format: \"sparkplug_b\" cannot be used with mqtt.share_group",
            ),
            (
                MINIMAL.to_string() + "[[subscription]]\ntopic = \"spBv1.0/{sensor}/#\"\nformat = \"sparkplug_b\"\n",
                "subscription[1].topic: format = \"sparkplug_b\" needs an MQTT filter in the Sparkplug namespace",
            ),
            (
                MINIMAL.to_string() + sub + "sensor_field = \"x\"\n",
                "subscription[1].sensor_field: does not apply",
            ),
            (
                MINIMAL.to_string() + "request_rebirth = true\n",
                "subscription[0].request_rebirth: needs format = \"sparkplug_b\"",
            ),
        ];
        for (text, want) in cases {
            let joined = errors(&text).join("\n");
            assert!(joined.contains(want), "{want}\n{joined}");
        }
    }

    #[test]
    fn rollups_are_whole_numbers_of_windows_each_once() {
        let text = MINIMAL.to_string()
            + "[[rollup]]\ninterval = \"1h\"\nexpire_after = \"400d\"\n[[rollup]]\ninterval = \"1d\"\npartial = true\n";
        let s = parse(&text, None).unwrap();
        let names: Vec<&str> = s.rollups.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["1h", "1d"]);
        assert_eq!(
            s.rollups[0].expire_after,
            Some(Duration::from_secs(400 * 86400))
        );
        assert!(s.rollups[1].partial && !s.rollups[0].partial);
        assert_eq!(s.rollups[1].start_of(86_400_000 * 3 + 5), 86_400_000 * 3);
        assert_eq!(
            s.rollups[0].start_of(-1),
            -3_600_000,
            "aligned to the epoch"
        );
        let bad = MINIMAL.to_string()
            + "[[rollup]]\ninterval = \"90m\"\n[[rollup]]\ninterval = \"60m\"\n[[rollup]]\ninterval = \"1h\"\n";
        let joined = errors(&bad).join("\n");
        assert!(
            joined.contains("rollup[0].interval: 90m is not a whole number of bucket.window (1h)"),
            "{joined}"
        );
        assert!(
            joined.contains("rollup[2].interval: a rollup of 1h is configured twice"),
            "{joined}"
        );
    }

    #[test]
    fn retention_can_be_set_or_turned_off() {
        let text = MINIMAL.to_string()
            + "[retention]\nexpire_after = \"30d\"\ndeadletter_expire_after = \"off\"\n";
        let s = parse(&text, None).unwrap();
        assert_eq!(
            s.retention.expire_after,
            Some(Duration::from_secs(30 * 86400))
        );
        assert_eq!(s.retention.deadletter_expire_after, None);
        let joined =
            errors(&(MINIMAL.to_string() + "[retention]\nexpire_after = \"1500ms\"\n")).join("\n");
        assert!(
            joined.contains("retention.expire_after: must be a whole number of seconds"),
            "{joined}"
        );
    }

    #[test]
    fn bad_url_and_toml_syntax_are_errors() {
        let joined = errors(&MINIMAL.replace("mqtt://127.0.0.1:1883", "http://x")).join("\n");
        assert!(joined.contains("mqtt.url: unsupported scheme"), "{joined}");
        let joined = errors("[mqtt\nurl=").join("\n");
        assert!(joined.contains("invalid TOML"), "{joined}");
    }

    #[test]
    fn a_secret_of_the_wrong_type_is_not_echoed() {
        let text = MINIMAL.replace(
            "client_id = \"palletd-test\"",
            "client_id = \"c\"\nusername = \"u\"\npassword = 987654321",
        );
        let joined = errors(&text).join("\n");
        assert!(
            joined.contains("mqtt.password: has the wrong type"),
            "{joined}"
        );
        assert!(!joined.contains("987654321"), "{joined}");
    }

    #[test]
    fn secrets_do_not_print() {
        let text = MINIMAL.replace(
            "client_id = \"palletd-test\"",
            "client_id = \"c\"\nusername = \"u\"\npassword = \"hunter2\"",
        );
        let s = parse(&text, None).unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(
            s.mqtt.password.as_ref().map(Secret::expose),
            Some("hunter2")
        );
    }
}
