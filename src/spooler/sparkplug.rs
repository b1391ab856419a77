//! The Sparkplug B state file: `sparkplug.json` in the spool directory
//! holds the alias maps, `bdSeq`s and online flags of every edge node and
//! device palletd has heard a BIRTH from ([`crate::decode::sparkplug::State`]).
//!
//! The spooler saves it (a new file, fsync, rename, fsync of the directory)
//! before it appends a batch of messages that changed it, so a BIRTH is
//! never acknowledged before what it taught is on disk: after a crash or a
//! restart, DATA messages decode with the aliases of the last BIRTH. If the
//! save fails (a full or broken disk), palletd says so at ERROR, counts it
//! and tries again with the next batch that changes the state; if it is
//! lost, DATA messages go to the dead letter as `unknown_alias` (with their
//! payload) until the node's next BIRTH, so nothing is lost silently.
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

pub struct StateFile {
    path: PathBuf,
    /// A change not yet saved (an earlier save failed).
    unsaved: bool,
}

impl StateFile {
    pub fn new(spool_dir: &Path) -> StateFile {
        StateFile {
            path: spool_dir.join(FILE_NAME),
            unsaved: false,
        }
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

    /// Notes that `state` changed; [`StateFile::save_if_changed`] saves it.
    pub fn changed(&mut self) {
        self.unsaved = true;
    }

    /// Saves `state` if it changed since the last successful save.
    pub async fn save_if_changed(&mut self, state: &State) {
        if !self.unsaved {
            return;
        }
        let bytes = crate::decode::sparkplug::save(state);
        let path = self.path.clone();
        let saved = tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        match saved {
            Ok(()) => self.unsaved = false,
            Err(e) => {
                metrics::counter!(telemetry::SPARKPLUG_SAVE_ERRORS).increment(1);
                warn!(path = %self.path.display(), error = %e, "Cannot save the Sparkplug B state; trying again with the next BIRTH or DEATH. Until it is saved, a restart forgets the aliases learnt since the last save.");
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
