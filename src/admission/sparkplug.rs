//! The Sparkplug B state file: `sparkplug.json` in the spool directory
//! holds the alias maps, `bdSeq`s and online flags of every edge node and
//! device palletd has heard a BIRTH from ([`crate::decode::sparkplug::State`]).
//!
//! The admission saves it (a new file, fsync, rename, fsync of the directory)
//! at most every [`SAVE_EVERY`], and holds the acknowledgements of the
//! messages from the first batch that changed it since the last save until
//! a save covers them ([`StateFile::gate`]): a BIRTH is never acknowledged
//! before what it taught is on disk (after a crash or a restart, DATA
//! messages decode with the aliases of the last BIRTH), and a mass rebirth
//! of a thousand nodes costs a few saves, not one per batch. If a save
//! fails (a full or broken disk), palletd says so, counts it and tries
//! again at the next interval, the acknowledgements waiting meanwhile.
//!
//! A file that cannot be read as a state is moved aside to
//! `sparkplug.json.unreadable` and palletd starts without aliases.

use std::io::Write;
use std::path::{Path, PathBuf};

use tracing::{error, info, warn};

use crate::decode::sparkplug::State;
use crate::telemetry;

/// The file's name in the spool directory.
pub const FILE_NAME: &str = "sparkplug.json";

/// Saves are at least this far apart.
pub const SAVE_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

pub struct StateFile {
    path: PathBuf,
    /// The first LSN of the first batch that changed the state since the
    /// last save: acknowledgements of messages from there on wait.
    unsaved_from: Option<u64>,
    /// A change in the batch being made.
    changed: bool,
    last_save: Option<std::time::Instant>,
    /// When evictions were last said (at most once a minute).
    evictions_said: Option<std::time::Instant>,
    /// Evictions since.
    evictions_unsaid: u64,
}

impl StateFile {
    pub fn new(spool_dir: &Path) -> StateFile {
        StateFile {
            path: spool_dir.join(FILE_NAME),
            unsaved_from: None,
            changed: false,
            last_save: None,
            evictions_said: None,
            evictions_unsaid: 0,
        }
    }

    /// Counts edge nodes evicted from a full state, said at most once a
    /// minute; `state` as it is now.
    pub fn evicted(&mut self, nodes: u32, state: &State, budget: usize) {
        metrics::counter!(telemetry::SPARKPLUG_EVICTED).increment(u64::from(nodes));
        self.evictions_unsaid += u64::from(nodes);
        if self
            .evictions_said
            .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(60))
        {
            return;
        }
        let (nodes_now, devices, aliases) = state.size();
        warn!(
            evicted = self.evictions_unsaid,
            nodes = nodes_now,
            devices,
            aliases,
            bytes = state.bytes(),
            budget,
            "The Sparkplug B state is full (limits.max_sparkplug_nodes, max_sparkplug_aliases, or its share of limits.max_memory): palletd forgot the edge nodes silent the longest; each is asked for a rebirth when heard again, its DATA dead-lettered as unknown_alias until then. Counted in palletd_sparkplug_nodes_evicted_total (said at most once a minute). If these nodes are real, raise the limit."
        );
        self.evictions_said = Some(std::time::Instant::now());
        self.evictions_unsaid = 0;
    }

    /// Messages whose records lie at or above this LSN wait for a save.
    pub fn gate(&self) -> u64 {
        self.unsaved_from.unwrap_or(u64::MAX)
    }

    /// The batch starting at `first` is appended: if it changed the state,
    /// its messages wait for the next save.
    pub fn batch_done(&mut self, first: u64) {
        if std::mem::take(&mut self.changed) {
            self.unsaved_from.get_or_insert(first);
        }
    }

    /// When the next save is due, if one is.
    pub fn save_due(&self) -> Option<std::time::Instant> {
        self.unsaved_from?;
        Some(
            self.last_save
                .map_or_else(std::time::Instant::now, |t| t + SAVE_EVERY),
        )
    }

    /// The saved state, or an empty one (none saved yet, or unreadable).
    pub fn load(&self) -> State {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return State::default(),
            Err(e) => {
                error!(path = %self.path.display(), error = %e, "Cannot read the Sparkplug B state; starting without aliases: DATA goes to the dead letter as unknown_alias until each node's next BIRTH.");
                return State::default();
            }
        };
        match crate::decode::sparkplug::load(&bytes) {
            Ok(state) => {
                let (nodes, devices, aliases) = state.size();
                info!(nodes, devices, aliases, "Sparkplug B state loaded.");
                state
            }
            Err(e) => {
                let aside = self.path.with_extension("json.unreadable");
                let _ = std::fs::rename(&self.path, &aside);
                error!(path = %self.path.display(), moved_to = %aside.display(), error = %e, "The Sparkplug B state is unreadable; starting without aliases: DATA goes to the dead letter as unknown_alias until each node's next BIRTH.");
                State::default()
            }
        }
    }

    /// Notes that the state changed in the batch being made.
    pub fn changed(&mut self) {
        self.changed = true;
    }

    /// Saves `state` (everything taught by the batches made so far) if a
    /// change waits; true when nothing waits any more.
    pub async fn save(&mut self, state: &State) -> bool {
        if self.unsaved_from.is_none() {
            return true;
        }
        self.last_save = Some(std::time::Instant::now());
        let bytes = crate::decode::sparkplug::save(state);
        let path = self.path.clone();
        let saved = tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        match saved {
            Ok(()) => {
                metrics::counter!(telemetry::SPARKPLUG_STATE_SAVES).increment(1);
                self.unsaved_from = None;
                true
            }
            Err(e) => {
                metrics::counter!(telemetry::SPARKPLUG_SAVE_ERRORS).increment(1);
                warn!(path = %self.path.display(), error = %e, "Cannot save the Sparkplug B state; trying again shortly. The BIRTHs and DEATHs it holds are not acknowledged until it is saved.");
                false
            }
        }
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
