//! The Sparkplug B state ([`crate::decode::sparkplug::State`]: the alias
//! maps, `bdSeq`s and online flags of every edge node and device palletd
//! has heard a BIRTH from), kept across restarts without holding any
//! acknowledgement for it.
//!
//! - **Changes go into the spool.** Each BIRTH, DEATH and eviction is a
//!   record of its own ([`crate::decode::sparkplug::Change`]) appended with
//!   the message's samples, so it is durable by the same group commit and
//!   the message's PUBACK waits for nothing more than any other's.
//! - **Snapshots are made in the background.** Once changes have waited
//!   [`SNAPSHOT_EVERY`] (or their bytes reach the state's estimated size,
//!   at least [`SNAPSHOT_CHANGE_BYTES`]), the admission writes the nodes
//!   into `sparkplug.json` a chunk of [`CHUNK_BYTES`] at a time between
//!   messages, a thread writing them to a new file (fsync, rename, fsync
//!   of the directory); no copy of the whole state is made. The file's
//!   first line is the LSN the snapshot began at.
//! - **A start replays.** The snapshot is read, then every change the
//!   spool holds from its LSN on is applied in order (each sets what it
//!   names, so a node the snapshot already holds changed is set again to
//!   the same). The spool keeps the segments holding those records,
//!   confirmed or not, until the next snapshot is in place
//!   ([`crate::spool::Spool::hold`]): a snapshot that cannot be written
//!   keeps them, unless the spool is full or failing, when palletd lets
//!   them go and deletes the snapshot (after a crash then, every node is
//!   asked for a rebirth rather than decoded with old aliases).
//!
//! A file that cannot be read is moved aside to `sparkplug.json.unreadable`
//! and palletd starts without aliases. A `sparkplug.json` of palletd before
//! snapshots (one JSON object) is read as complete and written anew in the
//! new form at start.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::{error, info, warn};

use crate::decode::sparkplug::{self as sp, Change, State};
use crate::retry::Backoff;
use crate::spool::{EntryRef, Spool};
use crate::telemetry;

/// The file's name in the spool directory.
pub(crate) const FILE_NAME: &str = "sparkplug.json";

/// A snapshot begins once the oldest change it would take has waited this
/// long ...
pub(crate) const SNAPSHOT_EVERY: Duration = Duration::from_secs(30);
/// ... or once the changes since the last one hold this many bytes (or the
/// state's estimated bytes, if more): a start replays little.
pub(crate) const SNAPSHOT_CHANGE_BYTES: usize = 1 << 20;
/// Bytes of a snapshot made at a time on the admission task.
pub const CHUNK_BYTES: usize = 64 << 10;
/// A failed snapshot is tried again after a backoff from this...
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// ...to this (a disk that stays full is not written every second).
const RETRY_CAP: Duration = Duration::from_secs(60);
/// Records read at a time when a start replays the changes.
const REPLAY_RECORDS: usize = 8192;

/// Changes spooled and not yet in a snapshot.
#[derive(Debug, Clone, Copy)]
struct Pending {
    since: Instant,
    bytes: usize,
}

impl Pending {
    fn merge(a: Option<Pending>, b: Option<Pending>) -> Option<Pending> {
        match (a, b) {
            (Some(a), Some(b)) => Some(Pending {
                since: a.since.min(b.since),
                bytes: a.bytes.saturating_add(b.bytes),
            }),
            (a, b) => a.or(b),
        }
    }
}

/// Lines of a snapshot, and whether they are its last.
pub(crate) type Chunk = (Vec<u8>, bool);

/// A snapshot being written.
struct Writing {
    /// The LSN it began at: the changes from here on are replayed onto it.
    lsn: u64,
    /// The header is written.
    started: bool,
    /// Where the lines go on.
    after: Option<sp::SnapshotAt>,
    /// To the writing thread; `None` once the last chunk went.
    tx: Option<mpsc::Sender<Chunk>>,
    done: oneshot::Receiver<io::Result<()>>,
    /// The changes it takes (back to pending if it fails).
    takes: Option<Pending>,
}

pub(crate) struct StateFile {
    path: PathBuf,
    spool: Spool,
    pending: Option<Pending>,
    writing: Option<Writing>,
    /// No snapshot begins before this (after a failure).
    not_before: Option<Instant>,
    /// The wait after a failure.
    retry: Backoff,
    /// When evictions were last said (at most once a minute).
    evictions_said: Option<Instant>,
    /// Evictions since.
    evictions_unsaid: u64,
}

impl StateFile {
    /// Reads the snapshot in `spool_dir`, replays the spool's changes from
    /// its LSN up to `next_lsn` and, when that changed anything (or there
    /// was no snapshot of this form), writes a new one at `next_lsn` before
    /// anything is taken. Blocking: at start only.
    pub(crate) fn open(spool_dir: &Path, spool: &Spool, next_lsn: u64) -> (StateFile, State) {
        let mut file = StateFile {
            path: spool_dir.join(FILE_NAME),
            spool: spool.clone(),
            pending: None,
            writing: None,
            not_before: None,
            retry: Backoff::new(RETRY_FIRST, RETRY_CAP),
            evictions_said: None,
            evictions_unsaid: 0,
        };
        let (mut state, from) = file.load();
        // Changes replayed onto the snapshot; `None`: there was no snapshot
        // of this form to replay onto, or its changes could not be read.
        let replayed = match from {
            Some(lsn) => match replay(&mut state, spool, lsn, next_lsn) {
                Ok(n) => Some(n),
                Err(e) => {
                    error!(error = %e, "Cannot read the spool's Sparkplug B changes since the last snapshot; starting without aliases: DATA goes to the dead letter as unknown_alias until each node's next BIRTH.");
                    state = State::default();
                    None
                }
            },
            None => None,
        };
        state.recount();
        let (nodes, devices, aliases) = state.size();
        info!(
            nodes,
            devices,
            aliases,
            replayed = replayed.unwrap_or(0),
            "Sparkplug B state loaded."
        );
        spool.hold(crate::spool::Holder::Sparkplug, from.unwrap_or(next_lsn));
        if replayed == Some(0) {
            // The snapshot is current: the replay starts there next time too.
            return (file, state);
        }
        let written = write_whole(&file.path, &state, next_lsn);
        // If it fails, the next is due at once (after the retry's wait).
        let due_now = Pending {
            since: Instant::now(),
            bytes: usize::MAX / 2,
        };
        file.written(written, next_lsn, Some(due_now));
        (file, state)
    }

    /// The saved snapshot and the LSN its replay starts at (`None`: none,
    /// or one of palletd before snapshots, or unreadable).
    fn load(&self) -> (State, Option<u64>) {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return (State::default(), None),
            Err(e) => {
                error!(path = %self.path.display(), error = %e, "Cannot read the Sparkplug B state; starting without aliases: DATA goes to the dead letter as unknown_alias until each node's next BIRTH.");
                return (State::default(), None);
            }
        };
        match sp::load(&bytes) {
            Ok(loaded) => loaded,
            Err(e) => {
                let aside = self.path.with_extension("json.unreadable");
                let _ = std::fs::rename(&self.path, &aside);
                error!(path = %self.path.display(), moved_to = %aside.display(), error = %e, "The Sparkplug B state is unreadable; starting without aliases: DATA goes to the dead letter as unknown_alias until each node's next BIRTH.");
                (State::default(), None)
            }
        }
    }

    /// Counts edge nodes evicted from a full state, said at most once a
    /// minute; `state` as it is now.
    pub(crate) fn evicted(&mut self, nodes: u32, state: &State, budget: usize) {
        metrics::counter!(telemetry::SPARKPLUG_EVICTED).increment(u64::from(nodes));
        self.evictions_unsaid += u64::from(nodes);
        if self
            .evictions_said
            .is_some_and(|t| t.elapsed() < Duration::from_secs(60))
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
        self.evictions_said = Some(Instant::now());
        self.evictions_unsaid = 0;
    }

    /// A change of `bytes` was spooled.
    pub(crate) fn changed(&mut self, bytes: usize) {
        let p = self.pending.get_or_insert(Pending {
            since: Instant::now(),
            bytes: 0,
        });
        p.bytes += bytes;
    }

    /// When the next snapshot is due, if one is and none is being written.
    pub(crate) fn due(&self, state: &State) -> Option<Instant> {
        if self.writing.is_some() {
            return None;
        }
        let p = self.pending?;
        let due = if p.bytes >= SNAPSHOT_CHANGE_BYTES.max(state.bytes()) {
            Instant::now()
        } else {
            p.since + SNAPSHOT_EVERY
        };
        Some(self.not_before.map_or(due, |t| t.max(due)))
    }

    /// Begins a snapshot of the state as it is at `lsn` (the next record's).
    pub(crate) fn begin(&mut self, lsn: u64) {
        let (tx, rx) = mpsc::channel(1);
        let (done_tx, done) = oneshot::channel();
        let path = self.path.clone();
        let spawned = std::thread::Builder::new()
            .name("palletd-sparkplug".into())
            .spawn(move || {
                let _ = done_tx.send(write_chunks(&path, rx));
            });
        if let Err(e) = spawned {
            self.written(Err(e), lsn, None);
            return;
        }
        self.writing = Some(Writing {
            lsn,
            started: false,
            after: None,
            tx: Some(tx),
            done,
            takes: self.pending.take(),
        });
    }

    /// A snapshot is being written.
    pub(crate) fn writing(&self) -> bool {
        self.writing.is_some()
    }

    /// Where the next chunk goes, while one is wanted.
    pub(crate) fn sender(&self) -> Option<mpsc::Sender<Chunk>> {
        self.writing.as_ref()?.tx.clone()
    }

    /// Makes the next chunk of the snapshot being written and sends it
    /// with `permit` (`None`: the writing thread stopped; its end says why).
    pub(crate) fn step(&mut self, state: &State, permit: Option<mpsc::OwnedPermit<Chunk>>) {
        let Some(w) = &mut self.writing else { return };
        let Some(permit) = permit else {
            w.tx = None;
            return;
        };
        let mut chunk = Vec::with_capacity(CHUNK_BYTES + (CHUNK_BYTES >> 2));
        if !w.started {
            w.started = true;
            chunk.extend_from_slice(&sp::snapshot_header(w.lsn));
        }
        let next = state.snapshot_lines(w.after.as_ref(), &mut chunk, CHUNK_BYTES);
        let last = next.is_none();
        w.after = next;
        if last {
            w.tx = None;
        }
        permit.send((chunk, last));
    }

    /// Waits until the snapshot being written is done (forever if none).
    pub(crate) async fn finished(&mut self) -> io::Result<()> {
        match &mut self.writing {
            Some(w) => (&mut w.done)
                .await
                .unwrap_or_else(|_| Err(io::Error::other("the writing thread stopped"))),
            None => std::future::pending().await,
        }
    }

    /// The snapshot being written is done (or failed).
    pub(crate) fn end(&mut self, result: io::Result<()>) {
        if let Some(w) = self.writing.take() {
            self.written(result, w.lsn, w.takes);
        }
    }

    /// A snapshot at `lsn` was written (or not): the spool keeps what a
    /// replay onto it needs; a failure is said, and tried again later.
    fn written(&mut self, result: io::Result<()>, lsn: u64, takes: Option<Pending>) {
        match result {
            Ok(()) => {
                metrics::counter!(telemetry::SPARKPLUG_STATE_SAVES).increment(1);
                self.not_before = None;
                self.retry.reset();
                self.spool.hold(crate::spool::Holder::Sparkplug, lsn);
            }
            Err(e) => {
                metrics::counter!(telemetry::SPARKPLUG_SAVE_ERRORS).increment(1);
                self.pending = Pending::merge(self.pending, takes);
                self.not_before = Some(Instant::now() + self.retry.next_delay());
                if self.spool.is_full() || self.spool.failing() {
                    // The records a replay needs must not keep the spool
                    // from freeing room: after a crash every node is asked
                    // for a rebirth instead.
                    let _ = std::fs::remove_file(&self.path);
                    self.spool.hold(crate::spool::Holder::Sparkplug, u64::MAX);
                    error!(path = %self.path.display(), error = %e, "Cannot write a snapshot of the Sparkplug B state and the spool is full or failing: the spool no longer keeps its changes since the last one and that snapshot is deleted. Acknowledgements go on; after a crash, every edge node is asked for a rebirth (its DATA dead-lettered as unknown_alias until then). Trying again shortly.");
                } else {
                    warn!(path = %self.path.display(), error = %e, "Cannot write a snapshot of the Sparkplug B state; the spool keeps its changes since the last one (acknowledgements go on). Trying again shortly.");
                }
            }
        }
    }
}

/// Applies the changes spooled from `from` up to `to`; how many.
fn replay(state: &mut State, spool: &Spool, from: u64, to: u64) -> io::Result<u64> {
    let mut reader = spool.reader(from);
    let mut applied = 0;
    while reader.next() < to {
        let read = reader.read(REPLAY_RECORDS, to)?;
        for r in crate::spool::parse(&read.bytes) {
            let EntryRef::Sparkplug { change } = r.entry else {
                continue;
            };
            match serde_json::from_slice::<Change>(change) {
                Ok(c) => {
                    state.apply(&c, 0);
                    applied += 1;
                }
                Err(e) => {
                    warn!(lsn = r.lsn, error = %e, "An unreadable Sparkplug B change in the spool; skipped.")
                }
            }
        }
        if read.records == 0 {
            break;
        }
    }
    Ok(applied)
}

/// Writes a snapshot's chunks as they come to a new file and puts it in
/// place after the last; a snapshot left unfinished (the sender gone
/// first) is thrown away.
fn write_chunks(path: &Path, mut rx: mpsc::Receiver<Chunk>) -> io::Result<()> {
    put_in_place(path, |f| loop {
        match rx.blocking_recv() {
            Some((chunk, last)) => {
                f.write_all(&chunk)?;
                if last {
                    return Ok(());
                }
            }
            None => return Err(io::Error::other("the snapshot was left unfinished")),
        }
    })
}

/// Writes the whole state as a snapshot at `lsn`, here.
fn write_whole(path: &Path, state: &State, lsn: u64) -> io::Result<()> {
    put_in_place(path, |f| {
        let mut chunk = sp::snapshot_header(lsn);
        let mut after: Option<sp::SnapshotAt> = None;
        loop {
            let next = state.snapshot_lines(after.as_ref(), &mut chunk, CHUNK_BYTES);
            f.write_all(&chunk)?;
            chunk.clear();
            match next {
                Some(last) => after = Some(last),
                None => return Ok(()),
            }
        }
    })
}

/// A new file written by `write`, synced and renamed to `path` (the
/// directory synced); thrown away if `write` fails.
fn put_in_place(
    path: &Path,
    write: impl FnOnce(&mut io::BufWriter<std::fs::File>) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut f = io::BufWriter::new(std::fs::File::create(&tmp)?);
    if let Err(e) = write(&mut f) {
        drop(f);
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let f = f.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
