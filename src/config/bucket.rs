//! `[bucket]`: the window and the caps of a bucket document.

use super::*;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBucket {
    pub window: Option<String>,
    pub max_samples: Option<i64>,
    pub max_bytes: Option<RawSize>,
    pub max_lateness: Option<String>,
    pub max_future: Option<String>,
    pub sensor_id_pattern: Option<String>,
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

impl Validator {
    pub(super) fn bucket(&mut self, b: RawBucket) -> BucketSettings {
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
}
