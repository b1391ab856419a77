//! `[storage]`, `[retention]` and `[latest]`: the storage mode, how long
//! what is stored is kept, and the latest value per sensor.

use super::*;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStorage {
    pub mode: Option<String>,
    pub granularity: Option<String>,
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
    pub(crate) const NAMES: &'static [&'static str] = &["buckets", "timeseries"];
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetention {
    pub expire_after: Option<String>,
    pub deadletter_expire_after: Option<String>,
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLatest {
    pub enabled: Option<bool>,
}

/// `[latest]`: `<collection>_latest`, one document per sensor holding its
/// newest sample, written with every flush.
#[derive(Debug, Clone)]
pub struct LatestSettings {
    pub enabled: bool,
}

impl Validator {
    pub(super) fn storage(&mut self, s: RawStorage) -> StorageSettings {
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

    /// `"off"` turns a retention off; otherwise a positive duration of whole
    /// seconds (TTL indexes count in seconds).
    pub(super) fn retention_value(
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

    pub(super) fn retention(&mut self, r: RawRetention) -> RetentionSettings {
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
}
