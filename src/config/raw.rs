//! The TOML file as written: plain serde structs, no validation beyond types.
//!
//! Durations and sizes are kept as written (strings) so that validation can
//! report every bad value with its path instead of stopping at the first.

use serde::Deserialize;

/// A size written either as a number of bytes or as a string like `"256KiB"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawSize {
    Bytes(u64),
    Text(String),
}

/// A write concern: `"majority"` or a number of nodes.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawWriteConcern {
    Nodes(i64),
    Tag(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMqtt {
    pub url: String,
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub password_file: Option<String>,
    pub password_env: Option<String>,
    pub keep_alive: Option<String>,
    pub max_inflight: Option<i64>,
    pub max_packet_size: Option<RawSize>,
    pub max_payload_size: Option<RawSize>,
    pub share_group: Option<String>,
    pub connections: Option<i64>,
    pub protocol: Option<String>,
    pub session_expiry: Option<String>,
    pub receive_maximum: Option<i64>,
    pub tls: Option<RawMqttTls>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMqttTls {
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub server_name: Option<String>,
    pub insecure_skip_verify: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub max_samples_per_message: Option<i64>,
    pub max_fields_per_sample: Option<i64>,
    pub max_field_name_length: Option<i64>,
    pub max_string_length: Option<i64>,
    pub max_sensors: Option<i64>,
    pub max_sparkplug_nodes: Option<i64>,
    pub max_sparkplug_devices_per_node: Option<i64>,
    pub max_sparkplug_aliases: Option<i64>,
    pub max_memory: Option<RawSize>,
    pub max_deadletter_rate: Option<RawSize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMongo {
    pub uri: Option<String>,
    pub uri_file: Option<String>,
    pub database: String,
    pub collection: Option<String>,
    pub write_concern: Option<RawWriteConcern>,
    pub journal: Option<bool>,
    pub compressors: Option<Vec<String>>,
    pub compression_level: Option<i64>,
    pub write_time_limit: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBucket {
    pub window: Option<String>,
    pub max_samples: Option<i64>,
    pub max_bytes: Option<RawSize>,
    pub max_lateness: Option<String>,
    pub max_future: Option<String>,
    pub sensor_id_pattern: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFlush {
    pub max_delay: Option<String>,
    pub max_delay_limit: Option<String>,
    /// Before `max_delay`: read as it, with a warning.
    pub interval: Option<String>,
    pub max_pending_samples: Option<i64>,
    pub backfill_share: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCloser {
    pub interval: Option<String>,
    pub grace: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStorage {
    pub mode: Option<String>,
    pub granularity: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetention {
    pub expire_after: Option<String>,
    pub deadletter_expire_after: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLatest {
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSpool {
    pub dir: Option<String>,
    pub max_size: Option<RawSize>,
    pub fsync: Option<String>,
    pub compress: Option<bool>,
    pub when_full: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    pub listen: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub password_file: Option<String>,
    pub password_env: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<String>,
    pub token_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSubscription {
    pub topic: String,
    pub format: Option<String>,
    pub timestamp_field: Option<String>,
    pub sensor_field: Option<String>,
    pub field: Option<String>,
    pub qos: Option<i64>,
    pub request_rebirth: Option<bool>,
    pub rebirth_min_interval: Option<String>,
    pub timestamp_property: Option<String>,
    pub sensor_property: Option<String>,
    pub format_from_content_type: Option<bool>,
    pub timezone: Option<String>,
    pub sensor_template: Option<String>,
    pub root: Option<String>,
    pub include: Option<Vec<String>>,
    pub exclude: Option<Vec<String>>,
    pub rename: Option<std::collections::BTreeMap<String, String>>,
    pub flatten: Option<String>,
    pub arrays: Option<String>,
    pub units: Option<std::collections::BTreeMap<String, Vec<String>>>,
    pub retained: Option<String>,
    pub thinning: Option<std::collections::BTreeMap<String, RawThinning>>,
}

/// `[subscription.thinning.<field>]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawThinning {
    pub kind: String,
    pub deviation: Option<f64>,
    pub deviation_percent: Option<f64>,
    pub span: Option<Vec<f64>>,
    pub max_interval: Option<String>,
    pub min_interval: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRollup {
    pub interval: String,
    pub expire_after: Option<String>,
    pub partial: Option<bool>,
}
