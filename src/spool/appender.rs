//! The appender: the one thread that owns the open segment. It writes what
//! the admission appends, group-commits (one fsync for everything appended
//! during the previous one), publishes the durable LSN, stores checkpoints
//! and deletes the segments they confirm. It is the only one to rename or
//! delete segment files: the compressor thread ([`compressor`]) writes a
//! compressed copy of a closed segment and hands it back, and the appender
//! puts it in place (or throws it away if the checkpoint deleted the
//! segment meanwhile). With `spool.when_full = "drop_oldest"` it deletes the
//! oldest segment when the spool is over its size, and says exactly what
//! was lost. It keeps the MQTT sessions' redelivery windows from the
//! identities it appends and the topics' last values from the records
//! that change them, and writes them to `message-ids` and `retained`
//! before it deletes a segment ([`crate::front::window`],
//! [`crate::front::retained`]).
//!
//! # When the disk fails
//! The durable LSN moves only past records that a successful sync covered,
//! and nothing is acknowledged past it. The open segment's bytes since its
//! last successful sync are kept in memory. Any failed write or sync (EIO,
//! ENOSPC, a short write, a failed fsync) puts the file back to its last
//! synced length and writes those bytes again on the next attempt, in
//! order, after a backoff; appends wait behind them (the admission stops
//! taking messages, the broker keeps them). A failed fsync is never
//! followed by trusting a later one: on Linux a failed writeback may drop
//! the dirty pages and mark them clean, so the next fsync "succeeds"
//! without the data (the PostgreSQL fsync finding); cutting the file back
//! and writing the bytes again makes them dirty again. Checkpoints are
//! taken meanwhile: deleting confirmed segments is what frees a full disk.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use super::checkpoint::{self, DurableFile};
use super::damage::{self, Damage};
use super::fs::{remove_if_there, replace, AppendFile, Storage};
use super::scan::{Item, Scanner};
use super::segment::{compressed_name, dir_bytes, list_segments, segment_name, FrameWriter};
use super::{tombstone, Fsync, Shared, WhenFull};
use crate::front::retained::{self, LastValues};
use crate::front::window::{self, Seen, Windows};
use crate::record::{Mark, SessionId};
use crate::retry::Backoff;
use crate::telemetry;

/// Under load, group commits are at least this far apart.
const COMMIT_GAP: Duration = Duration::from_millis(5);

/// At most this many bytes of the open segment are ever written and not
/// yet synced, unless one append (one admission batch, whole messages, at
/// most [`crate::admission::MAX_BATCH_BYTES`] but for one message larger
/// than that) is larger: a group commit syncs (and moves the durable LSN)
/// before an append would take it past this. So a power cut can tear only
/// the last this many bytes of the newest segment, and every record
/// before them belongs to a commit that completed ([`super::recover`]).
pub(super) const MAX_UNSYNCED: u64 = 1 << 20;

/// A group commit of at least this many bytes counts as load.
const COMMIT_GAP_BYTES: usize = 4096;

/// Backoff after a failed write: from this, doubling (with jitter), up to
/// [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Failing writes are said at ERROR at most this often.
const COMPLAIN_EVERY: Duration = Duration::from_secs(60);

/// A request to the appender.
pub(super) enum Command {
    /// Encoded records, in LSN order; `end` is the LSN after the last.
    Append { bytes: bytes::Bytes, end: u64 },
    /// A checkpoint was requested (its LSN is in [`Shared::requested`]).
    Checkpoint,
    /// Sync and stop.
    Close,
    /// The compressor wrote segment `first` compressed into `tmp` (synced).
    Compressed { first: u64, tmp: PathBuf },
    /// The broker can resend nothing more of the MQTT session with this
    /// key (it was retired, or is no longer palletd's).
    Forget(u64),
}

/// The segment being appended to.
struct Segment {
    first: u64,
    file: Box<dyn AppendFile>,
    /// Bytes of the file that a successful sync covered.
    synced: u64,
    /// Bytes appended since, kept until a sync covers them.
    unsynced: Vec<u8>,
    /// How many of `unsynced` are in the file (after `synced`).
    written: usize,
    /// The LSN after the last record in it.
    end: u64,
    /// A write or sync failed: the file may hold anything after `synced`;
    /// it is cut back before the next write.
    broken: bool,
    /// Its directory entry is not yet synced.
    new: bool,
}

impl Segment {
    fn len(&self) -> u64 {
        self.synced + self.unsynced.len() as u64
    }

    /// Writes what is not yet in the file and syncs it (with `sync`);
    /// returns whether it synced.
    fn commit(&mut self, storage: &dyn Storage, dir: &Path, sync: bool) -> io::Result<bool> {
        if self.broken {
            self.file.set_len(self.synced)?;
            self.written = 0;
            self.broken = false;
        }
        while self.written < self.unsynced.len() {
            match self.file.write(&self.unsynced[self.written..]) {
                Ok(0) => {
                    self.broken = true;
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.broken = true;
                    return Err(e);
                }
            }
        }
        if self.new {
            storage.sync_dir(dir)?;
            self.new = false;
        }
        let synced = sync && !self.unsynced.is_empty();
        if synced {
            if let Err(e) = self.file.sync() {
                // What was written since the last sync may be gone though
                // the next sync succeeds: it is written again.
                self.broken = true;
                return Err(e);
            }
        }
        self.synced += self.unsynced.len() as u64;
        self.unsynced.clear();
        self.written = 0;
        Ok(synced)
    }
}

pub(super) struct Appender {
    pub storage: Arc<dyn Storage>,
    pub dir: PathBuf,
    pub fsync: Fsync,
    pub segment_size: u64,
    open: Option<Segment>,
    /// Appends not yet in a segment (they wait for a rotation).
    staged: VecDeque<(bytes::Bytes, u64)>,
    /// The LSN after the last record appended (staged or in a segment).
    pub next_lsn: u64,
    /// Everything below this is durable.
    durable: u64,
    pub checkpoint: u64,
    /// Segments wholly below this are deleted: the checkpoint, or the
    /// spool's hold ([`super::Spool::hold`]) when that is lower. Starts at
    /// the recovered checkpoint: a start deletes nothing before the
    /// checkpoint (or the hold) moves past it, as before there was a hold.
    deleted_below: u64,
    pub shared: Arc<Shared>,
    pub max_size: u64,
    pub when_full: WhenFull,
    /// Closed segments to compress (`None`: `spool.compress` is off).
    pub compressor: Option<std::sync::mpsc::Sender<(u64, PathBuf)>>,
    durable_file: DurableFile,
    /// The MQTT sessions' windows of durable message identities.
    pub(super) windows: Windows,
    /// The topics' last values of durable records.
    pub(super) last_values: LastValues,
    /// Marks appended and not yet durable, in LSN order.
    appended: VecDeque<Mark>,
}

/// Compresses the segments it is sent, one after another, and hands each
/// result to the appender. Damage it finds on the way is reported and left
/// out (the frames hold the intact records).
pub(super) fn compressor(
    storage: Arc<dyn Storage>,
    shared: Arc<Shared>,
    rx: std::sync::mpsc::Receiver<(u64, PathBuf)>,
    appender: mpsc::Sender<Command>,
) {
    for (first, path) in rx {
        let checkpoint = shared.checkpoint.load(Ordering::Relaxed);
        match compress_segment(storage.as_ref(), &path, first, checkpoint) {
            Ok(tmp) => {
                if appender
                    .blocking_send(Command::Compressed { first, tmp })
                    .is_err()
                {
                    return;
                }
            }
            // Confirmed and deleted meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(segment = %path.display(), error = %e, "Cannot compress a spool segment; it stays as it is.")
            }
        }
    }
}

/// Compresses closed segment `path` into `<path>.zst.tmp` (synced) and
/// returns that file; the caller renames it into place. On an error the
/// temporary file is gone.
pub(super) fn compress_segment(
    storage: &dyn Storage,
    path: &Path,
    first: u64,
    checkpoint: u64,
) -> io::Result<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("seg.zst.tmp");
    let written = (|| {
        remove_if_there(storage, &tmp)?;
        let mut frames = FrameWriter::new(storage.open_append(&tmp)?)?;
        // Closed segments end where the next begins; the scanner needs no
        // bound beyond the record's own LSNs.
        let mut scanner = Scanner::open(storage, path, first, u64::MAX)?;
        loop {
            match scanner.next()? {
                Item::Record(bytes, _) => frames.record(bytes)?,
                Item::Damage(r) => {
                    if let Some(d) = Damage::of(path, &r, u64::MAX, checkpoint) {
                        damage::report(storage, dir, &d);
                    }
                }
                Item::End => break,
                Item::Tail(r) => {
                    // The end of a closed segment that is not a record: the
                    // next segment's first LSN bounds what it cost.
                    let end = list_segments(storage, dir)?
                        .into_iter()
                        .find(|(f, _)| *f > first)
                        .map_or(r.after + 1, |s| s.0);
                    if let Some(d) = Damage::of(path, &r, end, checkpoint) {
                        damage::report(storage, dir, &d);
                    }
                    break;
                }
            }
        }
        frames.finish()
    })();
    match written {
        Ok(_) => Ok(tmp),
        Err(e) => {
            let _ = remove_if_there(storage, &tmp);
            Err(e)
        }
    }
}

/// What the appender needs to start.
pub(super) struct Start {
    pub storage: Arc<dyn Storage>,
    pub dir: PathBuf,
    pub fsync: Fsync,
    pub segment_size: u64,
    pub next_lsn: u64,
    pub checkpoint: u64,
    pub shared: Arc<Shared>,
    pub max_size: u64,
    pub when_full: WhenFull,
    pub compressor: Option<std::sync::mpsc::Sender<(u64, PathBuf)>>,
    pub windows: Windows,
    pub last_values: LastValues,
}

impl Appender {
    pub(super) fn new(s: Start) -> Appender {
        Appender {
            storage: s.storage,
            dir: s.dir,
            fsync: s.fsync,
            segment_size: s.segment_size,
            open: None,
            staged: VecDeque::new(),
            next_lsn: s.next_lsn,
            durable: s.next_lsn,
            checkpoint: s.checkpoint,
            deleted_below: s.checkpoint,
            shared: s.shared,
            max_size: s.max_size,
            when_full: s.when_full,
            compressor: s.compressor,
            durable_file: DurableFile::new(),
            windows: s.windows,
            last_values: s.last_values,
            appended: VecDeque::new(),
        }
    }

    /// Everything below this is durable.
    #[cfg(test)]
    pub(super) fn durable(&self) -> u64 {
        self.durable
    }

    /// Whether appends wait to be made durable.
    fn pending(&self) -> bool {
        !self.staged.is_empty() || self.open.as_ref().is_some_and(|s| !s.unsynced.is_empty())
    }

    pub fn run(&mut self, mut rx: mpsc::Receiver<Command>, durable: watch::Sender<u64>) {
        let mut failing_since: Option<Instant> = None;
        // Failures are said at ERROR at most once a minute, with how many.
        let mut complained: Option<Instant> = None;
        let mut unsaid = 0u64;
        // This failure was said at ERROR: its end is said too.
        let mut said = false;
        let mut backoff = Backoff::new(MIN_BACKOFF, MAX_BACKOFF);
        let mut closing = false;
        // (start, bytes) of the previous group commit.
        let mut last = (Instant::now(), 0usize);
        loop {
            if failing_since.is_none() {
                // Wait for work when there is none; under load, one group
                // commit at most every COMMIT_GAP: fewer, larger fsyncs. A
                // small group means few messages wait for it (a small
                // broker in-flight window): then no wait at all.
                if !self.pending() {
                    match rx.blocking_recv() {
                        Some(cmd) => self.take(cmd, &mut closing),
                        None => break,
                    }
                }
                if last.1 >= COMMIT_GAP_BYTES {
                    let since = last.0.elapsed();
                    if since < COMMIT_GAP {
                        std::thread::sleep(COMMIT_GAP - since);
                    }
                }
                while !closing {
                    match rx.try_recv() {
                        Ok(cmd) => self.take(cmd, &mut closing),
                        Err(_) => break,
                    }
                }
            } else if self.shared.closing.load(Ordering::Relaxed) {
                // Stopping while the disk fails: what is not durable was
                // not acknowledged; the broker sends it again.
                break;
            }
            let bytes = self.staged.iter().map(|s| s.0.len()).sum();
            last = (Instant::now(), bytes);
            let committed = self.commit();
            // Before the acknowledgements go: room made, checkpoint stored.
            self.housekeeping();
            match committed {
                Ok(()) => {
                    if let Some(since) = failing_since.take() {
                        if std::mem::take(&mut said) {
                            info!(
                                after = ?Duration::from_secs(since.elapsed().as_secs()),
                                "Spool writes work again."
                            );
                        }
                        self.shared.failing.store(false, Ordering::Relaxed);
                        backoff.reset();
                    }
                    if *durable.borrow() != self.durable {
                        self.shared.durable_moved(self.durable);
                        let _ = durable.send(self.durable);
                    }
                    self.committed();
                }
                Err(e) => {
                    metrics::counter!(telemetry::SPOOL_WRITE_ERRORS, "kind" => error_kind(&e))
                        .increment(1);
                    unsaid += 1;
                    if complained.is_none_or(|t| t.elapsed() >= COMPLAIN_EVERY) {
                        error!(error = %e, failures = unsaid, dir = %self.dir.display(), "Cannot write the spool (disk full or failing?); new messages are not acknowledged until it works again. What was not yet durable is written again.");
                        complained = Some(Instant::now());
                        unsaid = 0;
                        said = true;
                    }
                    if failing_since.is_none() {
                        failing_since = Some(Instant::now());
                        self.shared.failing.store(true, Ordering::Relaxed);
                    }
                    std::thread::sleep(backoff.next_delay());
                }
            }
            if closing && failing_since.is_none() {
                break;
            }
        }
        self.close();
        if *durable.borrow() != self.durable {
            let _ = durable.send(self.durable);
        }
    }

    /// A last commit, and the durable LSN recorded with a sync.
    pub(super) fn close(&mut self) {
        let _ = self.commit();
        let _ = self
            .durable_file
            .record(self.storage.as_ref(), &self.dir, self.durable, true);
    }

    /// After a successful commit: the durable LSN is recorded (no sync).
    pub(super) fn committed(&mut self) {
        let _ = self
            .durable_file
            .record(self.storage.as_ref(), &self.dir, self.durable, false);
    }

    /// Takes in one command (appends wait for [`Appender::commit`]).
    pub(super) fn take(&mut self, cmd: Command, closing: &mut bool) {
        match cmd {
            Command::Append { bytes, end } => {
                // The admission writes every identity by its key.
                self.appended
                    .extend(crate::record::marks(&bytes).filter(|m| {
                        !matches!(
                            m,
                            Mark::Identity {
                                session: SessionId::Index(_),
                                ..
                            }
                        )
                    }));
                self.next_lsn = end;
                self.staged.push_back((bytes, end));
                if self.fsync == Fsync::Always {
                    // One sync per append: commit each on its own.
                    let _ = self.commit();
                }
            }
            Command::Compressed { first, tmp } => {
                if let Err(e) = self.compressed(first, &tmp) {
                    warn!(error = %e, "Cannot put a compressed spool segment in place; the plain one stays.");
                    let _ = remove_if_there(self.storage.as_ref(), &tmp);
                }
            }
            Command::Checkpoint => {}
            Command::Forget(key) => self.windows.forget(key),
            Command::Close => *closing = true,
        }
    }

    /// What is not tied to a commit: the checkpoint asked for, and room
    /// for `drop_oldest`. Each is tried again after the next batch when it
    /// fails.
    pub(super) fn housekeeping(&mut self) {
        let requested = self.shared.requested.load(Ordering::Relaxed);
        if let Err(e) = self.checkpoint(requested) {
            warn!(error = %e, "Cannot store the spool checkpoint; trying again.");
        }
        if self.when_full == WhenFull::DropOldest {
            if let Err(e) = self.make_room() {
                warn!(error = %e, "Cannot make room in the full spool; trying again.");
            }
        }
    }

    /// Writes every staged append into segments (rotating when one is
    /// full) and syncs (every [`MAX_UNSYNCED`] bytes): on success
    /// everything appended is durable.
    pub(super) fn commit(&mut self) -> io::Result<()> {
        while let Some((bytes, end)) = self.staged.pop_front() {
            let full = self
                .open
                .as_ref()
                .is_none_or(|s| s.len() >= self.segment_size);
            if full {
                if let Err(e) = self.seal_and_rotate() {
                    self.staged.push_front((bytes, end));
                    return Err(e);
                }
            }
            let over = self.open.as_ref().is_some_and(|s| {
                !s.unsynced.is_empty() && s.unsynced.len() + bytes.len() > MAX_UNSYNCED as usize
            });
            if over {
                if let Err(e) = self.sync_open() {
                    self.staged.push_front((bytes, end));
                    return Err(e);
                }
            }
            let s = self.open.as_mut().expect("rotated above");
            s.unsynced.extend_from_slice(&bytes);
            s.end = end;
            self.shared
                .bytes
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            self.shared.queued.sub(bytes.len());
        }
        self.sync_open()
    }

    /// Makes the open segment durable.
    fn sync_open(&mut self) -> io::Result<()> {
        let sync = self.fsync != Fsync::Off;
        if let Some(s) = self.open.as_mut() {
            if s.commit(self.storage.as_ref(), &self.dir, sync)? {
                self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
            }
            self.durable = s.end;
        }
        let cap = self.shared.window_cap.load(Ordering::Relaxed);
        if cap > 0 {
            self.windows.widen(cap);
        }
        while let Some(&mark) = self.appended.front() {
            match mark {
                Mark::Identity { lsn, .. } | Mark::LastValue { lsn, .. } if lsn >= self.durable => {
                    break
                }
                Mark::Identity {
                    lsn,
                    session: SessionId::Key(key),
                    pkid,
                    digest,
                    topic,
                } => {
                    self.windows.record(key, lsn, Seen { pkid, digest });
                    if let Some(topic) = topic {
                        self.last_values.take(topic, digest);
                    }
                }
                Mark::Identity { .. } => {}
                Mark::LastValue { topic, digest, .. } => {
                    self.last_values.take(topic, digest);
                }
            }
            self.appended.pop_front();
        }
        Ok(())
    }

    /// Syncs the full segment and starts the next.
    fn seal_and_rotate(&mut self) -> io::Result<()> {
        self.sync_open()?;
        self.rotate()
    }

    /// Starts a new segment at the next record (the full one, synced, goes
    /// to the compressor).
    fn rotate(&mut self) -> io::Result<()> {
        let first = self.open.as_ref().map_or(self.durable, |s| s.end);
        let path = self.dir.join(segment_name(first));
        let file = self.storage.open_append(&path)?;
        let new = Segment {
            first,
            file,
            synced: 0,
            unsynced: Vec::new(),
            written: 0,
            end: first,
            // Whatever an earlier attempt left in it goes.
            broken: true,
            new: true,
        };
        if let (Some(old), Some(c)) = (self.open.replace(new), &self.compressor) {
            let _ = c.send((old.first, self.dir.join(segment_name(old.first))));
        }
        self.recount()
    }

    /// Sets the spool's size to what its files hold.
    fn recount(&mut self) -> io::Result<()> {
        let on_disk = dir_bytes(self.storage.as_ref(), &self.dir)?;
        let unwritten = self
            .open
            .as_ref()
            .map_or(0, |s| (s.unsynced.len() - s.written) as u64);
        self.shared
            .bytes
            .store(on_disk + unwritten, Ordering::Relaxed);
        Ok(())
    }

    /// Everything below `lsn` is in MongoDB: deletes the segments it
    /// confirms, then stores it. Deleting first is safe (what they hold is
    /// in MongoDB; a crash before the checkpoint is stored replays from the
    /// old one and finds those records gone, which is right) and is what
    /// lets a full disk free space before a new file is needed.
    pub(super) fn checkpoint(&mut self, lsn: u64) -> io::Result<()> {
        let lsn = lsn.max(self.checkpoint);
        // Records the spool is asked to keep stay, confirmed or not.
        let bound = lsn.min(self.shared.hold());
        if lsn == self.checkpoint && bound <= self.deleted_below {
            return Ok(());
        }
        let storage = self.storage.clone();
        let storage = storage.as_ref();
        // A segment can go once the next one starts at or below the
        // bound: all its records are in MongoDB (and not held).
        let segments = list_segments(storage, &self.dir)?;
        let open = self.open.as_ref().map(|s| s.first);
        let closed: Vec<&PathBuf> = segments
            .windows(2)
            .filter(|pair| pair[1].0 <= bound && Some(pair[0].0) != open)
            .map(|pair| &pair[0].1)
            .collect();
        // The open segment too, once everything in it is confirmed: else a
        // segment that grew past `spool.max_size` by itself would keep the
        // spool full for ever (no new append would ever rotate it away).
        let all = bound >= self.next_lsn && !self.pending() && self.open.is_some();
        if !closed.is_empty() || all {
            self.save_tables();
        }
        for path in closed {
            remove_if_there(storage, path)?;
        }
        if all {
            if let Some(s) = self.open.take() {
                remove_if_there(storage, &self.dir.join(segment_name(s.first)))?;
            }
        }
        self.deleted_below = bound;
        if lsn > self.checkpoint {
            tombstone::prune(storage, &self.dir, lsn)?;
            damage::prune(storage, &self.dir, lsn)?;
            self.recount()?;
            checkpoint::write(storage, &self.dir, lsn)?;
            self.checkpoint = lsn;
            self.shared.checkpoint.store(lsn, Ordering::Relaxed);
        }
        self.recount()
    }

    /// Before segments are deleted: the durable identities the broker may
    /// still resend go to `message-ids`, and the topics' last values to
    /// `retained`. When a file cannot be written (a full disk), the old
    /// one goes too, and the deletion that frees the disk goes on: a stale
    /// `message-ids` could hold a message the broker since numbered anew
    /// (its redelivery skipped, lost), a stale `retained` a value since
    /// replaced (a retained copy of the older one skipped); without them, a
    /// redelivery or a retained copy from before may be stored twice,
    /// nothing is lost.
    fn save_tables(&mut self) {
        let storage = self.storage.clone();
        let save = |name: &str, bytes: Vec<u8>, what: &str| -> bool {
            match replace(storage.as_ref(), &self.dir, name, &bytes) {
                Ok(()) => true,
                Err(e) => {
                    let _ = remove_if_there(storage.as_ref(), &self.dir.join(name));
                    warn!(error = %e, file = name, "Cannot save {what} before deleting confirmed spool segments; should palletd stop before it can, a message the broker resends may be stored twice.");
                    false
                }
            }
        };
        if self.windows.dirty()
            && save(
                window::FILE_NAME,
                self.windows.encode(),
                "the MQTT sessions' last message ids",
            )
        {
            self.windows.saved();
        }
        if self.last_values.dirty()
            && save(
                retained::FILE_NAME,
                self.last_values.encode(),
                "the topics' last values",
            )
        {
            self.last_values.saved();
        }
    }

    /// Puts a compressed segment in place of the plain one, unless the
    /// checkpoint deleted the segment meanwhile.
    fn compressed(&mut self, first: u64, tmp: &Path) -> io::Result<()> {
        let storage = self.storage.clone();
        let storage = storage.as_ref();
        let plain = self.dir.join(segment_name(first));
        let listed = storage.list(&self.dir)?;
        if !listed.iter().any(|(n, _)| *n == segment_name(first)) {
            return remove_if_there(storage, tmp);
        }
        storage.rename(tmp, &self.dir.join(compressed_name(first)))?;
        storage.sync_dir(&self.dir)?;
        storage.remove(&plain)?;
        storage.sync_dir(&self.dir)?;
        self.recount()
    }

    /// `when_full = "drop_oldest"`: deletes the oldest segments until the
    /// spool fits in `max_size` again (the open one stays), logging what
    /// each held that was not yet in MongoDB.
    fn make_room(&mut self) -> io::Result<()> {
        let open = self.open.as_ref().map(|s| s.first);
        let hold = self.shared.hold();
        while self.shared.bytes.load(Ordering::Relaxed) > self.max_size {
            let segments = list_segments(self.storage.as_ref(), &self.dir)?;
            let Some(at) = segments.iter().position(|(f, _)| Some(*f) != open) else {
                break;
            };
            let (first, path) = segments[at].clone();
            let upper = segments.get(at + 1).map_or(u64::MAX, |s| s.0);
            if upper > hold {
                // It holds records the spool is asked to keep.
                break;
            }
            // What lies below the checkpoint is in MongoDB already. What
            // lies above it and the pipeline does not hold in memory is
            // lost: its tombstone says which, for the reader that finds
            // them missing (the pipeline counts them then).
            let c = census(self.storage.as_ref(), &path, first, upper, self.checkpoint)?;
            tombstone::write(self.storage.as_ref(), &self.dir, &c.sample_lsns)?;
            self.save_tables();
            remove_if_there(self.storage.as_ref(), &path)?;
            self.recount()?;
            error!(
                segment = first,
                readings = c.samples,
                dead_letters = c.dead_letters,
                messages = c.messages,
                first_lsn = c.first_lsn,
                last_lsn = c.last_lsn,
                received_from = %c.first_ms.map(crate::clock::iso).unwrap_or_default(),
                received_to = %c.last_ms.map(crate::clock::iso).unwrap_or_default(),
                confirmed_below = self.checkpoint,
                "Spool is full (spool.when_full = \"drop_oldest\"): deleted its oldest segment. Of these readings, not yet confirmed in MongoDB, those palletd does not hold in memory are lost; each is counted in palletd_spool_dropped_readings_total and logged when palletd finds it missing."
            );
        }
        self.shared.stuck.store(
            self.shared.bytes.load(Ordering::Relaxed) > self.max_size,
            Ordering::Relaxed,
        );
        Ok(())
    }
}

/// A bounded label for a spool write error.
fn error_kind(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => "disk_full",
        Some(libc::EIO) => "io",
        _ if e.kind() == io::ErrorKind::WriteZero => "short_write",
        _ => "other",
    }
}

/// What a segment holds (before it is dropped to make room).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Census {
    pub records: u64,
    pub samples: u64,
    pub dead_letters: u64,
    pub messages: u64,
    pub first_lsn: Option<u64>,
    pub last_lsn: Option<u64>,
    /// When the first and last record were received (ms).
    pub first_ms: Option<i64>,
    pub last_ms: Option<i64>,
    /// The LSNs of its sample records (its tombstone).
    pub sample_lsns: roaring::RoaringTreemap,
}

/// Counts what a segment holds from LSN `from` on (damage is reported).
fn census(
    storage: &dyn Storage,
    path: &Path,
    first: u64,
    upper: u64,
    from: u64,
) -> io::Result<Census> {
    use crate::record::{parse, EntryRef};
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut scanner = Scanner::open(storage, path, first, upper)?;
    let mut c = Census::default();
    loop {
        let rec = match scanner.next()? {
            Item::Record(bytes, _) => parse(bytes).next().map(|r| (r.lsn, r.received_ms, r.entry)),
            Item::Damage(r) => {
                if let Some(d) = Damage::of(path, &r, upper, from) {
                    damage::report(storage, dir, &d);
                }
                continue;
            }
            Item::End | Item::Tail(_) => return Ok(c),
        };
        let Some((lsn, received_ms, entry)) = rec.filter(|r| r.0 >= from) else {
            continue;
        };
        c.records += 1;
        c.first_lsn.get_or_insert(lsn);
        c.last_lsn = Some(lsn);
        c.first_ms.get_or_insert(received_ms);
        c.last_ms = Some(received_ms);
        match entry {
            EntryRef::Sample { .. } => {
                c.samples += 1;
                c.sample_lsns.insert(lsn);
            }
            EntryRef::DeadLetter { .. } => c.dead_letters += 1,
            EntryRef::MessageId { .. } => c.messages += 1,
            EntryRef::Sparkplug { .. } | EntryRef::LastValue { .. } => {}
        }
    }
}
