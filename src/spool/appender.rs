//! The appender: the one thread that owns the open segment. It writes what
//! the spooler appends, group-commits (one fsync for everything appended
//! during the previous one), publishes the durable LSN, stores checkpoints
//! and deletes the segments they confirm. It is the only one to rename or
//! delete segment files: the compressor thread ([`compressor`]) writes a
//! compressed copy of a closed segment and hands it back, and the appender
//! puts it in place (or throws it away if the checkpoint deleted the
//! segment meanwhile). With `spool.when_full = "drop_oldest"` it deletes the
//! oldest segment when the spool is over its size, and says exactly what
//! was lost.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tracing::{error, info};

use super::log::{
    census, compress_segment, compressed_name, list_segments, segment_name, sync_dir,
    write_checkpoint,
};
use super::{tombstone, Fsync, Shared, WhenFull};

/// Under load, group commits are at least this far apart.
const COMMIT_GAP: Duration = Duration::from_millis(5);

/// A group commit of at least this many bytes counts as load.
const COMMIT_GAP_BYTES: usize = 4096;

/// A request to the appender.
pub(super) enum Command {
    /// Encoded records, in LSN order; `end` is the LSN after the last.
    Append { bytes: bytes::Bytes, end: u64 },
    /// A checkpoint was requested (its LSN is in [`Shared::requested`]).
    Checkpoint,
    /// Sync and stop.
    Close,
    /// The compressor wrote segment `first` compressed into `tmp` (`len`
    /// bytes, synced).
    Compressed { first: u64, tmp: PathBuf, len: u64 },
}

pub(super) struct Appender {
    pub dir: PathBuf,
    pub fsync: Fsync,
    pub segment_size: u64,
    /// (first LSN, file, bytes written) of the open segment.
    pub current: Option<(u64, BufWriter<File>, u64)>,
    pub next_lsn: u64,
    pub checkpoint: u64,
    pub shared: Arc<Shared>,
    pub max_size: u64,
    pub when_full: WhenFull,
    /// Closed segments to compress (`None`: `spool.compress` is off).
    pub compressor: Option<std::sync::mpsc::Sender<(u64, PathBuf)>>,
}

/// Compresses the segments it is sent, one after another, and hands each
/// result to the appender.
pub(super) fn compressor(
    rx: std::sync::mpsc::Receiver<(u64, PathBuf)>,
    appender: mpsc::Sender<Command>,
) {
    for (first, path) in rx {
        match compress_segment(&path) {
            Ok((tmp, len)) => {
                if appender
                    .blocking_send(Command::Compressed { first, tmp, len })
                    .is_err()
                {
                    return;
                }
            }
            // Confirmed and deleted meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(segment = %path.display(), error = %e, "Cannot compress a spool segment; it stays as it is.")
            }
        }
    }
}

impl Appender {
    pub fn run(&mut self, mut rx: mpsc::Receiver<Command>, durable: watch::Sender<u64>) {
        let mut failing = false;
        let mut closing = false;
        // (start, bytes) of the previous group commit.
        let mut last = (Instant::now(), 0usize);
        while let Some(cmd) = rx.blocking_recv() {
            // Under load, one group commit at most every COMMIT_GAP: fewer,
            // larger fsyncs (each costs the kernel about as much as a large
            // one). A small group means few messages wait for it (a small
            // broker in-flight window): then no wait at all.
            if last.1 >= COMMIT_GAP_BYTES {
                let since = last.0.elapsed();
                if since < COMMIT_GAP {
                    std::thread::sleep(COMMIT_GAP - since);
                }
            }
            let mut batch = vec![cmd];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            if let Some(at) = batch.iter().position(|c| matches!(c, Command::Close)) {
                batch.truncate(at);
                closing = true;
            }
            let bytes = batch
                .iter()
                .map(|c| match c {
                    Command::Append { bytes, .. } => bytes.len(),
                    _ => 0,
                })
                .sum();
            last = (Instant::now(), bytes);
            match self.apply(batch) {
                Ok(Some(end)) => {
                    if failing {
                        info!("Spool writes work again.");
                        failing = false;
                    }
                    let _ = durable.send(end);
                }
                Ok(None) => {}
                Err(e) => {
                    // Nothing is acknowledged past the last durable LSN; the
                    // broker keeps those messages. Retry shortly.
                    if !failing {
                        error!(error = %e, dir = %self.dir.display(), "Cannot write the spool (disk full or failing?); new messages are not acknowledged.");
                        failing = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
            if closing {
                break;
            }
        }
        let _ = self.sync();
    }

    /// Applies a batch of commands; returns the new durable LSN if appends
    /// became durable. A requested checkpoint is taken up after every batch,
    /// so one whose wake-up did not fit into the channel is not lost.
    fn apply(&mut self, batch: Vec<Command>) -> io::Result<Option<u64>> {
        let mut end = None;
        for cmd in batch {
            match cmd {
                Command::Append { bytes, end: e } => {
                    self.append(&bytes, e)?;
                    end = Some(e);
                    if self.fsync == Fsync::Always {
                        self.sync()?;
                    }
                }
                Command::Compressed { first, tmp, len } => self.compressed(first, &tmp, len)?,
                Command::Checkpoint | Command::Close => {}
            }
        }
        if end.is_some() {
            self.sync()?;
            if self.when_full == WhenFull::DropOldest {
                self.make_room()?;
            }
        }
        let requested = self.shared.requested.load(Ordering::Relaxed);
        self.checkpoint(requested)?;
        Ok(end)
    }

    fn append(&mut self, bytes: &[u8], end: u64) -> io::Result<()> {
        let rotate = self
            .current
            .as_ref()
            .is_none_or(|c| c.2 >= self.segment_size);
        if rotate {
            self.sync()?;
            if let (Some((closed, ..)), Some(c)) = (&self.current, &self.compressor) {
                let _ = c.send((*closed, self.dir.join(segment_name(*closed))));
            }
            let first = self.next_lsn;
            let path = self.dir.join(segment_name(first));
            let file = OpenOptions::new().create(true).append(true).open(&path)?;
            sync_dir(&self.dir)?;
            let len = file.metadata()?.len();
            self.current = Some((first, BufWriter::with_capacity(256 * 1024, file), len));
        }
        if let Some((_, w, n)) = self.current.as_mut() {
            w.write_all(bytes)?;
            *n += bytes.len() as u64;
        }
        self.next_lsn = end;
        self.shared
            .bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        if let Some((_, w, _)) = self.current.as_mut() {
            w.flush()?;
            if self.fsync != Fsync::Off {
                w.get_ref().sync_data()?;
                self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn checkpoint(&mut self, lsn: u64) -> io::Result<()> {
        if lsn <= self.checkpoint {
            return Ok(());
        }
        write_checkpoint(&self.dir, lsn)?;
        self.checkpoint = lsn;
        self.shared.checkpoint.store(lsn, Ordering::Relaxed);
        // A segment can go once the next one starts at or below the
        // checkpoint: all its records are in MongoDB.
        let segments = list_segments(&self.dir)?;
        let open = self.current.as_ref().map(|c| c.0);
        for pair in segments.windows(2) {
            let ((first, path), (next_first, _)) = (&pair[0], &pair[1]);
            if *next_first <= lsn && Some(*first) != open {
                self.remove(path)?;
            }
        }
        tombstone::prune(&self.dir, lsn)?;
        // The open segment too, once everything in it is confirmed: else a
        // segment that grew past `spool.max_size` by itself would keep the
        // spool full for ever (no new append would ever rotate it away).
        if lsn >= self.next_lsn {
            if let Some((first, mut w, _)) = self.current.take() {
                w.flush()?;
                drop(w);
                self.remove(&self.dir.join(segment_name(first)))?;
            }
        }
        Ok(())
    }

    /// Puts a compressed segment in place of the plain one, unless the
    /// checkpoint deleted the segment meanwhile.
    fn compressed(&mut self, first: u64, tmp: &std::path::Path, len: u64) -> io::Result<()> {
        let plain = self.dir.join(segment_name(first));
        let Ok(meta) = fs::metadata(&plain) else {
            let _ = fs::remove_file(tmp);
            return Ok(());
        };
        fs::rename(tmp, self.dir.join(compressed_name(first)))?;
        sync_dir(&self.dir)?;
        fs::remove_file(&plain)?;
        sync_dir(&self.dir)?;
        let bytes = &self.shared.bytes;
        bytes.fetch_add(len, Ordering::Relaxed);
        bytes.fetch_sub(
            meta.len().min(bytes.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// `when_full = "drop_oldest"`: deletes the oldest segments until the
    /// spool fits in `max_size` again (the open one stays), logging what
    /// each held that was not yet in MongoDB.
    fn make_room(&mut self) -> io::Result<()> {
        let open = self.current.as_ref().map(|c| c.0);
        while self.shared.bytes.load(Ordering::Relaxed) > self.max_size {
            let segments = list_segments(&self.dir)?;
            let Some((first, path)) = segments.into_iter().find(|(f, _)| Some(*f) != open) else {
                break;
            };
            // What lies below the checkpoint is in MongoDB already. What
            // lies above it and the pipeline does not hold in memory is
            // lost: its tombstone says which, for the reader that finds
            // them missing (the pipeline counts them then).
            let c = census(&path, self.checkpoint)?;
            tombstone::write(&self.dir, &c.sample_lsns)?;
            self.remove(&path)?;
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

    fn remove(&self, path: &std::path::Path) -> io::Result<()> {
        let len = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        fs::remove_file(path)?;
        let bytes = &self.shared.bytes;
        bytes.fetch_sub(len.min(bytes.load(Ordering::Relaxed)), Ordering::Relaxed);
        Ok(())
    }
}
