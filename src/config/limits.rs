//! `[limits]`: what palletd may hold (memory, sensors, payloads), and
//! `limits.max_memory` split into byte budgets ([`MemorySplit`]; its default is
//! [`super::memory`]'s).

use super::*;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
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

impl Validator {
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
}
