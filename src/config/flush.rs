//! `[flush]`: how long a reading may wait in memory, and how the flushes
//! are sized.

use super::*;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFlush {
    pub max_delay: Option<String>,
    pub max_delay_limit: Option<String>,
    /// Before `max_delay`: read as it, with a warning.
    pub interval: Option<String>,
    pub max_pending_samples: Option<i64>,
    pub backfill_share: Option<f64>,
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

impl Validator {
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
}
