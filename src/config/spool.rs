//! `[spool]`: where and how the local log is kept (the spool itself is
//! [`crate::spool`]; its settings are part of the configuration, which
//! names no edge).

use std::path::PathBuf;

use super::*;
use serde::Deserialize;

/// When the spool syncs to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// Group commit: one fsync for all appends since the last one.
    Batch,
    /// An fsync after every append.
    Always,
    /// Never (tests only): a crash of the machine loses acknowledged data.
    Off,
}

/// What happens at `spool.max_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Stop taking messages (the broker keeps them).
    Stop,
    /// Delete the oldest segment (its readings are lost, and logged).
    DropOldest,
}

/// Spool settings.
#[derive(Debug, Clone)]
pub struct SpoolSettings {
    pub dir: PathBuf,
    pub max_size: u64,
    pub fsync: Fsync,
    /// Compress segments the appender moved on from.
    pub compress: bool,
    pub when_full: WhenFull,
    /// Bytes of appends on their way to the appender thread (its queue);
    /// past them [`crate::spool::Spool::append`] waits. Counted against `max_size` too,
    /// so a slow disk cannot carry the spool past it.
    pub max_queued: usize,
    /// How many message identities per MQTT session the spool keeps (the
    /// broker's in-flight window), and which session each connection
    /// index of an older spool's records meant: see
    /// [`crate::front::window`].
    pub redelivery: crate::front::window::Redelivery,
    /// How many topics' last values the spool keeps (and the admission
    /// decides by), to recognise retained copies
    /// ([`crate::front::retained`]).
    pub last_values: usize,
    /// Keep every segment from the start until each of these holders
    /// says with [`crate::spool::Spool::hold`] which records it needs: the
    /// Sparkplug B state's changes are replayed from the spool, and so are
    /// the points thinning holds, so nothing they need is deleted before
    /// the admission has read them.
    pub held: Vec<Holder>,
}

/// What keeps records in the spool past the checkpoint
/// ([`crate::spool::Spool::hold`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The Sparkplug B state's changes since its snapshot.
    Sparkplug = 0,
    /// The points thinning holds ([`crate::admission::thinning`]).
    Thinning = 1,
}

/// [`SpoolSettings::max_queued`] of `limits.max_memory`'s default.
pub const DEFAULT_MAX_QUEUED: usize = 4 << 20;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSpool {
    pub dir: Option<String>,
    pub max_size: Option<RawSize>,
    pub fsync: Option<String>,
    pub compress: Option<bool>,
    pub when_full: Option<String>,
}

impl Validator {
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
            last_values: 100_000,
            held: Vec::new(),
        }
    }
}
