//! The spool: a local, crash-safe, append-only log of everything palletd
//! received, so a PUBLISH can be acknowledged once it is on local disk and
//! the database may be slow or gone for hours.
//!
//! - [`crate::record`]: the record format (sans-IO).
//! - [`fs`]: the file layer every file operation goes through (the seam the
//!   property tests put a failing disk behind).
//! - [`segment`] (names, listing, compressed frames) and [`scan`] (reading a
//!   segment record by record, past damage).
//! - [`recover`]: what opening a spool finds; [`checkpoint`]: the
//!   `checkpoint` and `durable` files; [`identity`]: `spool.id`.
//! - [`appender`]: the one thread that writes, group-commits and deletes
//!   confirmed segments, and how it survives a failing disk.
//! - [`reader`]: reading records back in LSN order.
//! - [`damage`] and [`tombstone`]: what damage and `drop_oldest` cost,
//!   counted once.
//! - [`Spool`]: the cheaply cloned handle the tasks use; it hides the
//!   appender's channel, the durable LSN and the shared counters.
//!
//! # Durability
//! With `fsync = "batch"` the appender syncs once for everything that
//! arrived during the previous sync (group commit); under load (a group of
//! 4 KiB or more) it lets 5 ms pass between groups, so it syncs less often
//! and each sync covers more; `"always"` syncs after every append, `"off"`
//! never (tests only). [`Spool::durable`] is the LSN below which everything
//! is on disk.
//!
//! # Compression
//! With `spool.compress` (the default) a segment the appender moved on from
//! is compressed with zstd on a thread of its own and put in place of the
//! plain one; readings of a long outage then take several times less
//! disk. Reading back decompresses on the way.
//!
//! # When full
//! `spool.when_full = "stop"` (the default): at `spool.max_size` the
//! admission stops taking messages, so the broker keeps them (up to its own
//! limit per client). `"drop_oldest"`: the appender deletes the oldest
//! segment instead (the newest readings are kept) and leaves a tombstone
//! of it ([`tombstone`]), so the pipeline counts and logs exactly the
//! readings it needed and found gone.
//!
//! # Checkpoint
//! The pipeline reports the lowest LSN it still needs (everything below is
//! in MongoDB) with [`Spool::checkpoint`]. The appender stores it
//! crash-safely (write, fsync, rename, fsync the directory) and deletes the
//! segments that lie wholly below it, the open one too once all of it is
//! confirmed.
//!
//! # Faults
//! What each fault of the disk costs, and what palletd does about it, is in
//! docs/how-it-writes.md: write and sync errors are retried in order
//! and what a failed fsync may have lost is written again ([`appender`]);
//! damage costs the damaged records alone, counted ([`damage`]); a torn
//! tail is cut; a full disk frees what MongoDB confirmed first; a spool
//! copied to another box takes a new id ([`identity`]).
//!
//! Why not a crate: the embedded stores on crates.io are B-trees or LSM trees
//! (redb, sled, fjall) where a cut file is a corrupt database rather than a
//! torn tail, and the log crates (okaywal, commitlog) are unmaintained. A
//! segmented file with CRC32 (crc32fast) is a few hundred lines, and its
//! crash behaviour is tested here, over a simulated disk that fails.

mod appender;
mod checkpoint;
mod damage;
pub(crate) mod format;
pub(crate) mod fs;
mod identity;
mod reader;
mod recover;
mod scan;
mod segment;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
mod tombstone;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use appender::{Appender, Command};
pub use fs::Storage;
pub use identity::machine_fingerprint;
pub use reader::{Read, Reader};
pub use recover::Recovery;

pub use crate::config::spool::{Fsync, Holder, SpoolSettings, WhenFull, DEFAULT_MAX_QUEUED};
pub use crate::record::{parse, EntryRef, RecordRef, SessionId};
#[cfg(test)]
pub use crate::record::{Entry, Record};

/// Numbers the appender keeps and the tasks read.
#[derive(Debug)]
struct Shared {
    /// Bytes in all the spool's files.
    bytes: AtomicU64,
    /// Bytes appended and not yet in a segment.
    queued: crate::budget::Budget,
    /// LSN of the stored checkpoint (everything below is in MongoDB).
    checkpoint: AtomicU64,
    fsyncs: AtomicU64,
    /// The highest checkpoint asked for; the appender stores it.
    requested: AtomicU64,
    /// Segments holding records at or above these LSNs stay, confirmed or
    /// not ([`Spool::hold`]), one per [`Holder`]; `u64::MAX`: no hold.
    holds: [AtomicU64; 2],
    /// `drop_oldest` could not get the spool under its size (only the open
    /// segment is left).
    stuck: AtomicBool,
    /// Writes or syncs are failing: nothing new becomes durable.
    failing: AtomicBool,
    /// The appender is asked to stop (also while writes fail).
    closing: AtomicBool,
    /// When the durable end moved, and to where ([`Spool::durable_as_of`]).
    history: std::sync::Mutex<std::collections::VecDeque<(Instant, u64)>>,
    /// Message identities to keep per MQTT session, when raised since the
    /// start ([`Spool::widen_windows`]; 0: as started).
    window_cap: std::sync::atomic::AtomicUsize,
}

/// Entries of the durable end's history, at least [`HISTORY_STEP`] apart:
/// under a steady flow about 100 s of it (an idle spool's reaches further).
const HISTORY_LEN: usize = 1024;
const HISTORY_STEP: Duration = Duration::from_millis(100);

impl Shared {
    /// The lowest LSN a holder keeps ([`Spool::hold`]).
    pub(super) fn hold(&self) -> u64 {
        (self.holds.iter())
            .map(|h| h.load(Ordering::Relaxed))
            .min()
            .unwrap_or(u64::MAX)
    }

    fn new(max_queued: usize) -> Shared {
        Shared {
            bytes: AtomicU64::new(0),
            queued: crate::budget::Budget::new(max_queued),
            checkpoint: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            requested: AtomicU64::new(0),
            holds: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
            stuck: AtomicBool::new(false),
            failing: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            history: Default::default(),
            window_cap: Default::default(),
        }
    }

    /// The durable end moved to `lsn` (the appender, at each sync).
    fn durable_moved(&self, lsn: u64) {
        let now = Instant::now();
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        if h.back()
            .is_some_and(|(t, _)| now.duration_since(*t) < HISTORY_STEP)
        {
            return;
        }
        if h.len() == HISTORY_LEN {
            h.pop_front();
        }
        h.push_back((now, lsn));
    }
}

/// The appender has stopped: nothing more can be spooled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the spool's appender thread has stopped")]
pub(crate) struct Stopped;

/// A handle on the spool; clones share the same log.
#[derive(Clone)]
pub(crate) struct Spool {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    max_size: u64,
    when_full: WhenFull,
    tx: mpsc::Sender<Command>,
    durable: watch::Receiver<u64>,
    shared: Arc<Shared>,
}

/// The appender thread; [`AppenderThread::finish`] syncs and stops it.
pub(crate) struct AppenderThread {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// Opens (or creates) the spool in `settings.dir` on the operating
/// system's files, recovers what is there, and starts the appender.
pub(crate) fn open(settings: &SpoolSettings) -> io::Result<(Spool, Recovery, AppenderThread)> {
    open_on(fs::os(), settings, &machine_fingerprint())
}

/// [`open`] on `storage`, for the box with fingerprint `machine`.
pub(crate) fn open_on(
    storage: Arc<dyn Storage>,
    settings: &SpoolSettings,
    machine: &str,
) -> io::Result<(Spool, Recovery, AppenderThread)> {
    let recovery = recover::recover(
        storage.as_ref(),
        &settings.dir,
        machine,
        &settings.redelivery,
        settings.last_values,
    )?;
    if let Some(free) = storage.free_space(&settings.dir) {
        if free + recovery.bytes < settings.max_size {
            tracing::warn!(
                dir = %settings.dir.display(),
                free_bytes = free,
                max_size = settings.max_size,
                "The spool's filesystem has less room than spool.max_size: the disk fills first, and palletd then stops acknowledging until MongoDB confirms what it holds (spool.when_full = \"drop_oldest\" needs the room it is given)."
            );
        }
    }
    let (spool, thread) = start(storage, settings, &recovery)?;
    Ok((spool, recovery, thread))
}

fn start(
    storage: Arc<dyn Storage>,
    settings: &SpoolSettings,
    recovery: &Recovery,
) -> io::Result<(Spool, AppenderThread)> {
    // At least four segments fit, so a full spool can always free some.
    let segment_size = (settings.max_size / 4).clamp(16 * 1024, 64 * 1024 * 1024);
    let (tx, rx) = mpsc::channel(1024);
    let (durable_tx, durable) = watch::channel(recovery.next_lsn);
    let shared = Arc::new(Shared::new(settings.max_queued));
    shared.durable_moved(recovery.next_lsn);
    shared.bytes.store(recovery.bytes, Ordering::Relaxed);
    shared
        .checkpoint
        .store(recovery.checkpoint, Ordering::Relaxed);
    shared
        .requested
        .store(recovery.checkpoint, Ordering::Relaxed);
    for holder in &settings.held {
        shared.holds[*holder as usize].store(0, Ordering::Relaxed);
    }
    let compressor = match settings.compress {
        true => {
            let (ctx, crx) = std::sync::mpsc::channel();
            let back = tx.clone();
            let (storage, shared) = (storage.clone(), shared.clone());
            std::thread::Builder::new()
                .name("palletd-spool-zstd".into())
                .spawn(move || appender::compressor(storage, shared, crx, back))?;
            for seg in &recovery.uncompressed {
                let _ = ctx.send(seg.clone());
            }
            Some(ctx)
        }
        false => None,
    };
    let mut appender = Appender::new(appender::Start {
        storage: storage.clone(),
        dir: settings.dir.clone(),
        fsync: settings.fsync,
        segment_size,
        next_lsn: recovery.next_lsn,
        checkpoint: recovery.checkpoint,
        shared: shared.clone(),
        max_size: settings.max_size,
        when_full: settings.when_full,
        compressor,
        windows: recovery.windows.clone(),
        last_values: recovery.last_values.clone(),
    });
    let handle = std::thread::Builder::new()
        .name("palletd-spool".into())
        .spawn(move || appender.run(rx, durable_tx))?;
    Ok((
        Spool {
            storage,
            dir: settings.dir.clone(),
            max_size: settings.max_size,
            when_full: settings.when_full,
            tx: tx.clone(),
            durable,
            shared: shared.clone(),
        },
        AppenderThread {
            tx,
            shared,
            handle: Some(handle),
        },
    ))
}

impl AppenderThread {
    /// Syncs what was appended and stops the thread (appends after this
    /// fail with [`Stopped`]). Blocking. While writes fail it stops without
    /// waiting: what is not durable was not acknowledged.
    pub(crate) fn finish(mut self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        let _ = self.tx.blocking_send(Command::Close);
        if let Some(t) = self.handle.take() {
            let _ = t.join();
        }
    }
}

impl Spool {
    /// Appends encoded records (in LSN order, `end` the LSN after the last);
    /// they become durable later, see [`Spool::durable`].
    /// Waits while the appender's queue holds `max_queued` bytes.
    pub(crate) async fn append(&self, bytes: bytes::Bytes, end: u64) -> Result<(), Stopped> {
        self.shared.queued.room().await;
        self.shared.queued.add(bytes.len());
        self.tx
            .send(Command::Append { bytes, end })
            .await
            .map_err(|_| Stopped)
    }

    /// Bytes appended and not yet written (the appender's queue).
    pub(crate) fn queued(&self) -> usize {
        self.shared.queued.used()
    }

    /// Everything below this LSN is durable on local disk.
    pub(crate) fn durable(&self) -> u64 {
        *self.durable.borrow()
    }

    /// The durable end as it was at `at` (to within [`HISTORY_STEP`], never
    /// beyond it): records from it on became durable after `at`. `None`
    /// when the history does not reach back that far (it keeps the last
    /// [`HISTORY_LEN`] moves).
    pub(crate) fn durable_as_of(&self, at: Instant) -> Option<u64> {
        let h = self
            .shared
            .history
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let i = h.partition_point(|(t, _)| *t <= at);
        i.checked_sub(1).map(|i| h[i].1)
    }

    /// Waits until the durable LSN moves; `Err` once the appender stopped.
    pub(crate) async fn durable_changed(&mut self) -> Result<u64, Stopped> {
        self.durable.changed().await.map_err(|_| Stopped)?;
        Ok(*self.durable.borrow_and_update())
    }

    /// Waits until everything below `lsn` is durable.
    pub(crate) async fn wait_durable(&mut self, lsn: u64) -> Result<(), Stopped> {
        while *self.durable.borrow_and_update() < lsn {
            self.durable.changed().await.map_err(|_| Stopped)?;
        }
        Ok(())
    }

    /// Everything below `lsn` is in MongoDB: the appender stores the
    /// checkpoint and deletes what it confirms. Never blocks; a later call
    /// with a higher LSN supersedes this one.
    pub(crate) fn checkpoint(&self, lsn: u64) {
        if self.shared.requested.fetch_max(lsn, Ordering::Relaxed) < lsn {
            // When the channel is full the appender is busy and takes the
            // request up after its current batch anyway.
            let _ = self.tx.try_send(Command::Checkpoint);
        }
    }

    /// Keeps the records from `lsn` on (`u64::MAX`: none) although MongoDB
    /// confirms them: neither the checkpoint nor `drop_oldest` deletes a
    /// segment holding any of them. The Sparkplug B state's changes are
    /// replayed from its last snapshot's LSN
    /// ([`crate::admission::sparkplug`]), and thinning's held points are
    /// read back ([`crate::admission::thinning`]). Never blocks.
    pub(crate) fn hold(&self, holder: Holder, lsn: u64) {
        if self.shared.holds[holder as usize].swap(lsn, Ordering::Relaxed) != lsn {
            let _ = self.tx.try_send(Command::Checkpoint);
        }
    }

    /// The stored checkpoint.
    pub(crate) fn checkpointed(&self) -> u64 {
        self.shared.checkpoint.load(Ordering::Relaxed)
    }

    /// Bytes in the spool's files.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn max_size(&self) -> u64 {
        self.max_size
    }

    /// At `spool.max_size` (and, with `drop_oldest`, nothing left to
    /// drop): new messages must not be taken.
    pub(crate) fn is_full(&self) -> bool {
        match self.when_full {
            WhenFull::Stop => self.bytes() + self.queued() as u64 >= self.max_size,
            WhenFull::DropOldest => self.shared.stuck.load(Ordering::Relaxed),
        }
    }

    /// Writes or syncs of the spool are failing (a full or failing disk):
    /// nothing new becomes durable, so nothing new is acknowledged.
    pub(crate) fn failing(&self) -> bool {
        self.shared.failing.load(Ordering::Relaxed)
    }

    /// Bytes free on the spool's filesystem, when known.
    pub(crate) fn free_space(&self) -> Option<u64> {
        self.storage.free_space(&self.dir)
    }

    /// fsync calls so far.
    pub(crate) fn fsyncs(&self) -> u64 {
        self.shared.fsyncs.load(Ordering::Relaxed)
    }

    /// The broker's window is larger than was thought: keep the last `cap`
    /// message identities of each session from now on. Never blocks.
    pub(crate) fn widen_windows(&self, cap: usize) {
        self.shared.window_cap.fetch_max(cap, Ordering::Relaxed);
    }

    /// The broker can resend nothing more of the MQTT session with this
    /// key: its message identities are no longer kept. Never blocks.
    pub(crate) fn forget_session(&self, key: u64) {
        let _ = self.tx.try_send(Command::Forget(key));
    }

    /// The pipeline counted these sample LSNs (in order) as lost: readers
    /// no longer report them missing.
    pub(crate) fn forget_lost(&self, lsns: &[u64]) -> io::Result<()> {
        tombstone::forget(self.storage.as_ref(), &self.dir, lsns)
    }

    /// A reader of the records from `lsn` on.
    pub(crate) fn reader(&self, lsn: u64) -> Reader {
        Reader::new(self.storage.clone(), self.dir.clone(), lsn)
    }
}

/// Reads up to `max` records below `limit` on a blocking thread; hands the
/// reader back to keep its position.
pub(crate) async fn read(mut reader: Reader, max: usize, limit: u64) -> io::Result<(Reader, Read)> {
    let task = tokio::task::spawn_blocking(move || {
        let records = reader.read(max, limit);
        records.map(|r| (reader, r))
    });
    match task.await {
        Ok(done) => done,
        Err(e) => Err(io::Error::other(format!("spool reader failed: {e}"))),
    }
}

/// Measures recovery (the scan of every segment) and reading the whole
/// spool back, in records of 50,000 (for the benchmark): (recovery, read,
/// records read).
pub fn bench_read(dir: &Path) -> io::Result<(Duration, Duration, u64)> {
    let settings = SpoolSettings {
        dir: dir.to_path_buf(),
        max_size: 1 << 40,
        fsync: Fsync::Off,
        compress: false,
        when_full: WhenFull::Stop,
        max_queued: DEFAULT_MAX_QUEUED,
        redelivery: Default::default(),
        last_values: 1000,
        held: Vec::new(),
    };
    let started = Instant::now();
    let (spool, _, thread) = open(&settings)?;
    let recovered = started.elapsed();
    let started = Instant::now();
    let mut reader = spool.reader(0);
    let mut records = 0;
    loop {
        let read = reader.read(50_000, u64::MAX)?;
        if read.records == 0 {
            break;
        }
        records += read.records as u64;
    }
    let read = started.elapsed();
    thread.finish();
    Ok((recovered, read, records))
}

/// Measures append throughput and fsync batching (for the benchmark).
pub fn bench_append(
    dir: &Path,
    fsync: Fsync,
    records: u64,
    record_bytes: usize,
) -> io::Result<(Duration, u64)> {
    let settings = SpoolSettings {
        dir: dir.to_path_buf(),
        max_size: 1 << 40,
        fsync,
        compress: false,
        when_full: WhenFull::Stop,
        max_queued: DEFAULT_MAX_QUEUED,
        redelivery: Default::default(),
        last_values: 1000,
        held: Vec::new(),
    };
    let (spool, recovery, thread) = open(&settings)?;
    let started = Instant::now();
    let doc = vec![0u8; record_bytes];
    let mut lsn = recovery.next_lsn;
    for _ in 0..records {
        let mut bytes = Vec::with_capacity(record_bytes + 64);
        RecordRef {
            lsn,
            received_ms: 0,
            entry: EntryRef::DeadLetter { doc: &doc },
        }
        .encode_into(&mut bytes);
        lsn += 1;
        if spool
            .tx
            .blocking_send(Command::Append {
                bytes: bytes.into(),
                end: lsn,
            })
            .is_err()
        {
            break;
        }
    }
    while spool.durable() < lsn {
        if spool.durable.has_changed().is_err() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let elapsed = started.elapsed();
    let fsyncs = spool.fsyncs();
    thread.finish();
    Ok((elapsed, fsyncs))
}
