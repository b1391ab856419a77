//! The validated settings of every section together: what the rest of
//! palletd reads ([`Settings`]). Each section's own settings are in its
//! file.

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
    pub(crate) fn shape(&self) -> crate::bucket::Shape {
        crate::bucket::Shape {
            window_ms: self.bucket.window.as_millis() as i64,
            max_samples: self.bucket.max_samples,
            max_bytes: self.bucket.max_bytes,
        }
    }
}
