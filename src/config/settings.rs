//! The validated settings, section by section: what the rest of palletd
//! reads ([`Settings`]); the sections with files of their own
//! ([`super::mqtt`], [`super::mongodb`], [`super::spool`]) aside.

use super::*;

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
            max_sparkplug_bytes: self.limits.split().sparkplug,
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
    /// BIRTHs may teach (what the state and its snapshot sparkplug.json hold);
    /// a BIRTH beyond them goes to the dead letter.
    pub max_sparkplug_nodes: usize,
    pub max_sparkplug_devices_per_node: usize,
    pub max_sparkplug_aliases: usize,
    /// Bytes palletd's buffers may hold in all (see [`LimitSettings::split`]).
    pub max_memory: u64,
    /// Where `max_memory` came from.
    pub max_memory_from: MemoryBudgetFrom,
    /// A subscription decodes Sparkplug B: its state takes a share.
    pub sparkplug: bool,
    /// A subscription thins a field: the runs take a share.
    pub thinning: bool,
    /// Bytes of dead letters spooled per second in the long run (a minute's
    /// worth at once).
    pub max_deadletter_rate: u64,
}

/// Where `limits.max_memory` came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBudgetFrom {
    /// The configuration.
    Set,
    /// "auto" (or not set): an eighth of the memory palletd may use, known
    /// or not ([`super::memory`]).
    Auto { available: Option<u64> },
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
    /// What Sparkplug B BIRTHs taught (beyond: the longest-silent edge
    /// node is forgotten); 0 without a Sparkplug B subscription.
    pub sparkplug: usize,
    /// Thinning's runs (beyond: the longest-silent sensors' runs end);
    /// 0 without a thinned field.
    pub thinning: usize,
}

impl LimitSettings {
    /// An eighth for the ingest queue, a sixteenth for the spool's write
    /// queue, an eighth for the feed, an eighth for the Sparkplug B state
    /// (with a Sparkplug B subscription), an eighth for thinning's runs
    /// (with a thinned field), the rest for what waits for MongoDB.
    pub fn split(&self) -> MemorySplit {
        let all = self.max_memory as usize;
        let sparkplug = if self.sparkplug { all / 8 } else { 0 };
        let thinning = if self.thinning { all / 8 } else { 0 };
        MemorySplit {
            ingest: all / 8,
            spool: all / 16,
            feed: all / 8,
            pending: all - 2 * (all / 8) - all / 16 - sparkplug - thinning,
            sparkplug,
            thinning,
        }
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
pub(super) fn interval_name(d: Duration) -> String {
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
    /// Credentials the status page and `/metrics` require (`/healthz` and
    /// `/readyz` stay open for probes); both `None`: no credentials.
    pub auth: HttpAuth,
}

/// `[http]` credentials: a request passes with either.
#[derive(Debug, Clone, Default)]
pub struct HttpAuth {
    /// HTTP Basic: `username` and `password`.
    pub basic: Option<(String, Secret)>,
    /// `Authorization: Bearer <token>`.
    pub token: Option<Secret>,
}

impl HttpAuth {
    /// Whether any credentials are required.
    pub fn required(&self) -> bool {
        self.basic.is_some() || self.token.is_some()
    }
}
