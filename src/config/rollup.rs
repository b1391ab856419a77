//! `[[rollup]]`: summaries per sensor and interval beside the buckets.

use super::*;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRollup {
    pub interval: String,
    pub expire_after: Option<String>,
    pub partial: Option<bool>,
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
    pub(crate) fn interval_ms(&self) -> i64 {
        self.interval.as_millis() as i64
    }

    /// The start of the interval holding `ts_ms`.
    pub(crate) fn start_of(&self, ts_ms: i64) -> i64 {
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

impl Validator {
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
}
