//! Configuration: the TOML file as written turned into validated
//! [`Settings`].
//!
//! Loading never stops at the first problem: every section is read on its own
//! and every value is checked, so `palletd check-config` prints all errors at
//! once, each with its TOML path (`mqtt.keep_alive: ...`).
//!
//! - One file per section, each with the section as written (a `Raw...`
//!   serde struct, `deny_unknown_fields`), its validation (an `impl
//!   Validator`) and its settings: `mqtt` (with TLS), `mongodb`,
//!   `subscription` (with thinning), `bucket`, `flush`, `closer`,
//!   `storage` (with retention and latest), `rollup`, `limits` (its
//!   "auto" default is `memory`), [`spool`], `http`.
//! - `validate`: the validator that collects errors and warnings and
//!   reads the shared value types (`raw` holds the raw size they share).
//! - `settings`: [`Settings`], all the sections together.

mod bucket;
mod closer;
mod flush;
mod http;
mod limits;
pub mod memory;
mod mongodb;
mod mqtt;
pub mod presets;
mod raw;
mod rollup;
mod settings;
pub(crate) mod spool;
mod storage;
mod subscription;
#[cfg(test)]
mod tests;
mod validate;

pub use mongodb::{MongoSettings, WriteConcern, COMPRESSORS};
pub use mqtt::{parse_mqtt_url, MqttProtocol, MqttSettings, MqttTls};
pub use settings::*;
use validate::{check_name, resolve, Validator};
pub use {bucket::*, closer::*, flush::*, http::*, limits::*, rollup::*, storage::*};

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::decode::{Limits, PayloadFormat, Subscription, TopicPattern};
use mongodb::RawMongo;
use mqtt::RawMqtt;
use raw::RawSize;
use spool::RawSpool;
use subscription::RawSubscription;

/// The annotated example configuration; `palletd print-config` prints it and
/// `config.toml.example` is exactly this text.
pub const EXAMPLE: &str = include_str!("../../config.toml.example");

pub use crate::decode::DEFAULT_SENSOR_ID_PATTERN;

/// Where the spool lives unless `spool.dir` says otherwise: the systemd
/// `StateDirectory=palletd`.
pub(crate) const DEFAULT_SPOOL_DIR: &str = "/var/lib/palletd/spool";

/// `flush.max_delay` unless set: how long a reading may wait in memory
/// before it is written (see the README for the trade-off).
pub(crate) const DEFAULT_MAX_DELAY: &str = "10s";

/// `flush.max_delay_limit` unless set: how far the delay may stretch when
/// the database cannot keep up with `max_delay`.
pub(crate) const DEFAULT_MAX_DELAY_LIMIT: &str = "5m";

/// Largest `bucket.max_bytes`: half of MongoDB's 16 MiB document limit leaves
/// room for rollups and a sample that is counted but not yet pushed.
pub(crate) const MAX_BUCKET_BYTES: u64 = 8 * 1024 * 1024;

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
    pub(crate) fn expose(&self) -> &str {
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
    let mut settings = parse(&text, path.parent()).map_err(|errors| ConfigErrors {
        file: path.to_owned(),
        errors,
    })?;
    let inline = inline_secrets(&text);
    if !inline.is_empty() && validate::readable_by_others(path) {
        settings.warnings.push(format!(
            "{} holds {} and is readable by every user; make it readable by palletd only (chmod 600), or keep the secret in a file of its own (mqtt.password_file, mongodb.uri_file)",
            path.display(),
            inline.join(" and ")
        ));
    }
    Ok(settings)
}

/// The secrets a configuration's text holds itself: `mqtt.password`,
/// `http.password`, `http.token`, a `mongodb.uri` with a password.
fn inline_secrets(text: &str) -> Vec<&'static str> {
    let Ok(table) = toml::from_str::<toml::Table>(text) else {
        return Vec::new();
    };
    let key = |section: &str, key: &str| table.get(section)?.get(key)?.as_str().map(str::to_string);
    let mut found = Vec::new();
    for (section, name, what) in [
        ("mqtt", "password", "mqtt.password"),
        ("http", "password", "http.password"),
        ("http", "token", "http.token"),
    ] {
        if key(section, name).is_some() {
            found.push(what);
        }
    }
    let uri_password = key("mongodb", "uri").is_some_and(|uri| {
        let rest = uri.split_once("://").map_or("", |(_, r)| r);
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        authority
            .rsplit_once('@')
            .is_some_and(|(user, _)| user.contains(':'))
    });
    if uri_password {
        found.push("a password in mongodb.uri");
    }
    found
}

/// What one section's settings cannot check alone: Sparkplug B and
/// thinning need a palletd to see all of a sensor's messages (no
/// `mqtt.share_group`), MQTT 5 properties need MQTT 5.
fn across_sections(v: &mut Validator, mqtt: Option<&MqttSettings>, subscriptions: &[Subscription]) {
    if let (Some(m), Some(i)) = (
        mqtt,
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
    for (i, s) in subscriptions.iter().enumerate() {
        if s.thinning.is_empty() {
            continue;
        }
        if mqtt.is_some_and(|m| m.share_group.is_some()) {
            v.err(
                format!("subscription[{i}].thinning"),
                "cannot be used with mqtt.share_group: each palletd would thin its share of a sensor's readings alone, and the bound would not hold",
            );
        }
    }
    if let Some(m) = mqtt {
        for (i, s) in subscriptions.iter().enumerate() {
            if m.protocol == MqttProtocol::V311 && s.from_properties != Default::default() {
                v.err(
                    format!("subscription[{i}]"),
                    "timestamp_property, sensor_property and format_from_content_type read MQTT 5 message properties: they need mqtt.protocol = \"5\"",
                );
            }
        }
    }
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
    let raw_rollups: Vec<RawRollup> = v.tables(&table, "rollup", false);
    let subs: Vec<RawSubscription> = v.tables(&table, "subscription", true);

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
    let http = v.http(http, base);
    let mut spool = v.spool(spool, base);
    let mut limits = v.limits(limits);
    let subscriptions: Vec<Subscription> = subs
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| v.subscription(s, &format!("subscription[{i}]")))
        .collect();
    limits.sparkplug = subscriptions
        .iter()
        .any(|s| s.format == PayloadFormat::SparkplugB);
    limits.thinning = subscriptions.iter().any(|s| !s.thinning.is_empty());
    spool.max_queued = limits.split().spool;
    // A topic per sensor is the common case; a device with a topic per
    // field has more, and its least recently changed topics are forgotten
    // first (a retained copy of theirs is then stored again).
    spool.last_values = limits.max_sensors;
    let rollups = v.rollups(raw_rollups, bucket.window);
    across_sections(&mut v, mqtt.as_ref(), &subscriptions);
    if let Some(m) = &mqtt {
        spool.redelivery = m.redelivery();
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
