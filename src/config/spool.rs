//! `[spool]`: where and how the local log is kept (the spool itself is
//! [`crate::spool`]; its settings are part of the configuration, which
//! names no edge).

use std::path::PathBuf;

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
    /// Keep every segment from the start until [`crate::spool::Spool::hold`]
    /// says which records may go: set when the Sparkplug B state's changes
    /// are replayed from the spool, so that nothing it needs is deleted
    /// before the admission has read its snapshot.
    pub held: bool,
}

/// [`SpoolSettings::max_queued`] of `limits.max_memory`'s default.
pub const DEFAULT_MAX_QUEUED: usize = 4 << 20;
