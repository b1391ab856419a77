//! The smaller sections' validation: `[storage]`, `[bucket]`, `[flush]`,
//! `[closer]`, `[[rollup]]`, `[retention]`, `[limits]`, `[spool]`,
//! `[http]`.

use super::*;

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

    pub(super) fn flush(&mut self, f: RawFlush) -> FlushSettings {
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

    pub(super) fn closer(&mut self, c: RawCloser) -> CloserSettings {
        CloserSettings {
            interval: self.positive_duration("closer.interval", c.interval.as_deref(), "1m"),
            grace: self.duration("closer.grace", c.grace.as_deref(), "5m"),
        }
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

    /// `[[rollup]]`s: an interval that is not a whole number of windows
    /// would cut a window (a bucket's samples) in two, so it is an error;
    /// two with the same interval too.
    pub(super) fn rollups(&mut self, raw: Vec<RawRollup>, window: Duration) -> Vec<RollupSettings> {
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

    pub(super) fn limits(&mut self, l: RawLimits) -> LimitSettings {
        let (max_memory, max_memory_from) = match l.max_memory {
            None => super::memory::auto(),
            Some(RawSize::Text(t)) if t.trim() == "auto" => super::memory::auto(),
            raw => (
                self.size("limits.max_memory", raw, super::memory::AUTO_MIN),
                MemoryBudgetFrom::Set,
            ),
        };
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
            max_memory_from,
            max_deadletter_rate,
            // Set once the subscriptions are read.
            sparkplug: false,
            thinning: false,
        }
    }

    pub(super) fn spool(&mut self, s: RawSpool, base: Option<&Path>) -> spool::SpoolSettings {
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
            redelivery: Default::default(),
            held: Vec::new(),
        }
    }

    pub(super) fn http(&mut self, h: RawHttp, base: Option<&Path>) -> HttpSettings {
        let password = self.secret(
            "http.password",
            h.password,
            h.password_file,
            h.password_env,
            base,
        );
        let token = self.secret("http.token", h.token, h.token_file, h.token_env, base);
        let basic = match (h.username, password) {
            (Some(user), Some(password)) => {
                if user.is_empty() || user.contains(':') {
                    self.err("http.username", "must be non-empty and without ':'");
                }
                Some((user, password))
            }
            (None, Some(_)) => {
                self.err("http.username", "a password needs a username");
                None
            }
            (Some(_), None) => {
                self.err("http.password", "a username needs a password");
                None
            }
            (None, None) => None,
        };
        for (key, secret) in [
            ("http.password", basic.as_ref().map(|b| &b.1)),
            ("http.token", token.as_ref()),
        ] {
            if secret.is_some_and(|s| s.expose().is_empty()) {
                self.err(key, "must not be empty");
            }
        }
        let auth = HttpAuth { basic, token };
        let text = h.listen.unwrap_or_else(|| "127.0.0.1:9464".into());
        if text.trim().is_empty() {
            return HttpSettings { listen: None, auth };
        }
        match text.trim().parse() {
            Ok(addr) => HttpSettings {
                listen: Some(addr),
                auth,
            },
            Err(_) => {
                self.err("http.listen", format!("{text:?} is not an address:port (e.g. \"127.0.0.1:9464\"; empty to turn off)"));
                HttpSettings { listen: None, auth }
            }
        }
    }
}
