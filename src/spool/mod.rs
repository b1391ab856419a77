//! The spool: a local, crash-safe, append-only log of everything palletd
//! received, so a PUBLISH can be acknowledged once it is on local disk and
//! the database may be slow or gone for hours.
//!
//! - [`log`]: the record format, segment files, recovery and reading back.
//! - [`appender`]: the one thread that writes, group-commits and deletes
//!   confirmed segments.
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
//! spooler stops taking messages, so the broker keeps them (up to its own
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
//! Why not a crate: the embedded stores on crates.io are B-trees or LSM trees
//! (redb, sled, fjall) where a cut file is a corrupt database rather than a
//! torn tail, and the log crates (okaywal, commitlog) are unmaintained. A
//! segmented file with CRC32 (crc32fast) is a few hundred lines, and its
//! crash behaviour is tested here.

mod appender;
pub mod log;
mod tombstone;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use appender::{Appender, Command};
pub use log::{parse, Entry, EntryRef, Reader, Record, RecordRef, Recovery};

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
}

/// Numbers the appender keeps and the tasks read.
#[derive(Debug, Default)]
struct Shared {
    /// Bytes in all segment files.
    bytes: AtomicU64,
    /// LSN of the stored checkpoint (everything below is in MongoDB).
    checkpoint: AtomicU64,
    fsyncs: AtomicU64,
    /// The highest checkpoint asked for; the appender stores it.
    requested: AtomicU64,
    /// `drop_oldest` could not get the spool under its size (only the open
    /// segment is left).
    stuck: std::sync::atomic::AtomicBool,
}

/// The appender has stopped: nothing more can be spooled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the spool's appender thread has stopped")]
pub struct Stopped;

/// A handle on the spool; clones share the same log.
#[derive(Clone)]
pub struct Spool {
    dir: PathBuf,
    max_size: u64,
    when_full: WhenFull,
    tx: mpsc::Sender<Command>,
    durable: watch::Receiver<u64>,
    shared: Arc<Shared>,
}

/// The appender thread; [`AppenderThread::finish`] syncs and stops it.
pub struct AppenderThread {
    tx: mpsc::Sender<Command>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// Opens (or creates) the spool in `settings.dir`, recovers what is there,
/// and starts the appender.
pub fn open(settings: &SpoolSettings) -> io::Result<(Spool, Recovery, AppenderThread)> {
    let recovery = log::recover(&settings.dir)?;
    let (spool, thread) = start(settings, &recovery)?;
    Ok((spool, recovery, thread))
}

fn start(settings: &SpoolSettings, recovery: &Recovery) -> io::Result<(Spool, AppenderThread)> {
    // At least four segments fit, so a full spool can always free some.
    let segment_size = (settings.max_size / 4).clamp(16 * 1024, 64 * 1024 * 1024);
    let (tx, rx) = mpsc::channel(1024);
    let (durable_tx, durable) = watch::channel(recovery.next_lsn);
    let shared = Arc::new(Shared::default());
    shared.bytes.store(recovery.bytes, Ordering::Relaxed);
    shared
        .checkpoint
        .store(recovery.checkpoint, Ordering::Relaxed);
    shared
        .requested
        .store(recovery.checkpoint, Ordering::Relaxed);
    let compressor = match settings.compress {
        true => {
            let (ctx, crx) = std::sync::mpsc::channel();
            let back = tx.clone();
            std::thread::Builder::new()
                .name("palletd-spool-zstd".into())
                .spawn(move || appender::compressor(crx, back))?;
            for seg in &recovery.uncompressed {
                let _ = ctx.send(seg.clone());
            }
            Some(ctx)
        }
        false => None,
    };
    let mut appender = Appender {
        dir: settings.dir.clone(),
        fsync: settings.fsync,
        segment_size,
        current: None,
        next_lsn: recovery.next_lsn,
        checkpoint: recovery.checkpoint,
        shared: shared.clone(),
        max_size: settings.max_size,
        when_full: settings.when_full,
        compressor,
    };
    let handle = std::thread::Builder::new()
        .name("palletd-spool".into())
        .spawn(move || appender.run(rx, durable_tx))?;
    Ok((
        Spool {
            dir: settings.dir.clone(),
            max_size: settings.max_size,
            when_full: settings.when_full,
            tx: tx.clone(),
            durable,
            shared,
        },
        AppenderThread {
            tx,
            handle: Some(handle),
        },
    ))
}

impl AppenderThread {
    /// Syncs what was appended and stops the thread (appends after this
    /// fail with [`Stopped`]). Blocking.
    pub fn finish(mut self) {
        let _ = self.tx.blocking_send(Command::Close);
        if let Some(t) = self.handle.take() {
            let _ = t.join();
        }
    }
}

impl Spool {
    /// Appends encoded records (in LSN order, `end` the LSN after the last);
    /// they become durable later, see [`Spool::durable`].
    pub async fn append(&self, bytes: bytes::Bytes, end: u64) -> Result<(), Stopped> {
        self.tx
            .send(Command::Append { bytes, end })
            .await
            .map_err(|_| Stopped)
    }

    /// Everything below this LSN is durable on local disk.
    pub fn durable(&self) -> u64 {
        *self.durable.borrow()
    }

    /// Waits until the durable LSN moves; `Err` once the appender stopped.
    pub async fn durable_changed(&mut self) -> Result<u64, Stopped> {
        self.durable.changed().await.map_err(|_| Stopped)?;
        Ok(*self.durable.borrow_and_update())
    }

    /// Waits until everything below `lsn` is durable.
    pub async fn wait_durable(&mut self, lsn: u64) -> Result<(), Stopped> {
        while *self.durable.borrow_and_update() < lsn {
            self.durable.changed().await.map_err(|_| Stopped)?;
        }
        Ok(())
    }

    /// Everything below `lsn` is in MongoDB: the appender stores the
    /// checkpoint and deletes what it confirms. Never blocks; a later call
    /// with a higher LSN supersedes this one.
    pub fn checkpoint(&self, lsn: u64) {
        if self.shared.requested.fetch_max(lsn, Ordering::Relaxed) < lsn {
            // When the channel is full the appender is busy and takes the
            // request up after its current batch anyway.
            let _ = self.tx.try_send(Command::Checkpoint);
        }
    }

    /// The stored checkpoint.
    pub fn checkpointed(&self) -> u64 {
        self.shared.checkpoint.load(Ordering::Relaxed)
    }

    /// Bytes in the segment files.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    pub fn max_size(&self) -> u64 {
        self.max_size
    }

    pub fn when_full(&self) -> WhenFull {
        self.when_full
    }

    /// At `spool.max_size` (and, with `drop_oldest`, nothing left to
    /// drop): new messages must not be taken.
    pub fn is_full(&self) -> bool {
        match self.when_full {
            WhenFull::Stop => self.bytes() >= self.max_size,
            WhenFull::DropOldest => self.shared.stuck.load(Ordering::Relaxed),
        }
    }

    /// fsync calls so far.
    pub fn fsyncs(&self) -> u64 {
        self.shared.fsyncs.load(Ordering::Relaxed)
    }

    /// The pipeline counted these sample LSNs (in order) as lost: readers
    /// no longer report them missing.
    pub fn forget_lost(&self, lsns: &[u64]) -> io::Result<()> {
        tombstone::forget(&self.dir, lsns)
    }

    /// A reader of the records from `lsn` on.
    pub fn reader(&self, lsn: u64) -> Reader {
        Reader::new(&self.dir, lsn)
    }
}

/// Reads up to `max` records below `limit` on a blocking thread (as
/// written, see [`parse`], and how many); hands the reader back to keep its
/// position.
pub async fn read(
    mut reader: Reader,
    max: usize,
    limit: u64,
) -> (Reader, io::Result<(Vec<u8>, usize)>) {
    let task = tokio::task::spawn_blocking(move || {
        let records = reader.read(max, limit);
        (reader, records)
    });
    match task.await {
        Ok(done) => done,
        Err(e) => (
            Reader::new(Path::new(""), 0),
            Err(io::Error::other(format!("spool reader failed: {e}"))),
        ),
    }
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
    };
    let (spool, recovery, thread) = open(&settings)?;
    let started = Instant::now();
    let doc = vec![0u8; record_bytes];
    let mut lsn = recovery.next_lsn;
    for _ in 0..records {
        let r = Record {
            lsn,
            received_ms: 0,
            entry: Entry::DeadLetter { doc: doc.clone() },
        };
        lsn += 1;
        if spool
            .tx
            .blocking_send(Command::Append {
                bytes: r.encode().into(),
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::fs::{self, OpenOptions};

    use super::log::tests::sample;
    use super::log::{list_segments, recover};
    use super::*;

    /// A spool whose appends continue at `first` (the records' own LSNs).
    fn start_at(dir: &Path, first: Option<u64>, max_size: u64) -> (Spool, AppenderThread) {
        start_with(dir, first, max_size, false, WhenFull::Stop)
    }

    fn start_with(
        dir: &Path,
        first: Option<u64>,
        max_size: u64,
        compress: bool,
        when_full: WhenFull,
    ) -> (Spool, AppenderThread) {
        let mut rec = recover(dir).unwrap();
        if let Some(first) = first {
            rec.next_lsn = first;
        }
        let settings = SpoolSettings {
            dir: dir.to_path_buf(),
            max_size,
            fsync: Fsync::Batch,
            compress,
            when_full,
        };
        start(&settings, &rec).unwrap()
    }

    /// A sample record the size of a real reading.
    fn reading(lsn: u64) -> Record {
        let doc = bson::to_vec(&bson::doc! {
            "ts": bson::DateTime::from_millis(1_700_000_000_000 + lsn as i64 % 100_000),
            "temperature": 20.0 + (lsn % 50) as f64 / 10.0,
            "humidity": 40.0 + (lsn % 7) as f64,
        })
        .unwrap();
        Record {
            lsn,
            received_ms: 1_700_000_000_000 + lsn as i64,
            entry: Entry::Sample {
                sensor: format!("sensor-{:04}", lsn % 1000),
                doc,
            },
        }
    }

    fn compressed_files(dir: &Path) -> usize {
        fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .to_str()
                    .is_some_and(|p| p.ends_with(".seg.zst"))
            })
            .count()
    }

    #[test]
    fn segments_moved_on_from_are_compressed_and_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 20_000).map(reading).collect();
        let plain: u64 = records.iter().map(|r| r.encode().len() as u64).sum();
        let (spool, thread) = start_with(dir.path(), Some(base), 1 << 20, true, WhenFull::Stop);
        for r in &records {
            append(&spool, r);
        }
        while spool.durable() < base + 20_000 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let segments = loop {
            let segments = list_segments(dir.path()).unwrap();
            // Every segment but the open one, once the compressor is done
            // (counted in the same listing: the compressor renames files
            // meanwhile).
            let compressed = segments.iter().filter(|s| log::is_compressed(&s.1)).count();
            if segments.len() > 2 && compressed == segments.len() - 1 {
                break segments;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            segments[..segments.len() - 1]
                .iter()
                .all(|(_, p)| log::is_compressed(p)),
            "{segments:?}"
        );
        thread.finish();
        let on_disk = spool.bytes();
        assert!(on_disk * 3 < plain, "{on_disk} bytes on disk for {plain}");
        let rec = recover(dir.path()).unwrap();
        assert_eq!(rec.records, 20_000);
        assert_eq!(rec.bytes, on_disk);
        assert!(rec.uncompressed.is_empty());
        // From the middle of a compressed segment, in small reads.
        let mut reader = Reader::new(dir.path(), base + 777);
        let mut got = Vec::new();
        loop {
            let batch = reader.read_records(999, base + 20_000).unwrap();
            if batch.is_empty() {
                break;
            }
            got.extend(batch);
        }
        assert_eq!(got, records[777..].to_vec());
    }

    #[test]
    fn a_read_stopped_at_its_limit_goes_on_from_there() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 100).map(reading).collect();
        write_all(dir.path(), &records, 1 << 30);
        let mut reader = Reader::new(dir.path(), base);
        assert_eq!(reader.read_records(1000, base + 40).unwrap(), records[..40]);
        assert_eq!(
            reader.read_records(1000, base + 100).unwrap(),
            records[40..]
        );
    }

    #[test]
    fn a_compression_cut_short_is_cleaned_up_at_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 20_000).map(reading).collect();
        write_all(dir.path(), &records, 1 << 20);
        let segments = list_segments(dir.path()).unwrap();
        assert!(segments.len() > 2);
        // The first one compressed but not yet swapped, the second one
        // half way through compressing.
        let (tmp, _) = log::compress_segment(&segments[0].1).unwrap();
        fs::rename(&tmp, dir.path().join(log::compressed_name(segments[0].0))).unwrap();
        let _ = log::compress_segment(&segments[1].1).unwrap();
        let rec = recover(dir.path()).unwrap();
        assert_eq!(rec.records, 20_000);
        assert_eq!(compressed_files(dir.path()), 1);
        assert!(!segments[0].1.exists(), "the plain copy went");
        assert_eq!(
            rec.uncompressed.len(),
            list_segments(dir.path()).unwrap().len() - 2,
            "the rest is queued for compression"
        );
        let got = Reader::new(dir.path(), 0)
            .read_records(100_000, u64::MAX)
            .unwrap();
        assert_eq!(got, records);
    }

    #[test]
    fn drop_oldest_deletes_the_oldest_segments_and_a_reader_finds_exactly_what_was_lost() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 20_000).map(reading).collect();
        let max_size = 256 * 1024;
        let (spool, thread) = start_with(
            dir.path(),
            Some(base),
            max_size,
            false,
            WhenFull::DropOldest,
        );
        // The first 100 are in MongoDB.
        spool.checkpoint(base + 100);
        for r in &records {
            append(&spool, r);
        }
        while spool.durable() < base + 20_000 {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!spool.is_full(), "it made room");
        let bytes = spool.bytes();
        assert!(bytes <= max_size, "{bytes}");
        let mut reader = Reader::new(dir.path(), base);
        let kept = reader.read_records(100_000, u64::MAX).unwrap();
        assert_eq!(kept, records[20_000 - kept.len()..], "the newest are kept");
        let missing = reader.take_missing();
        assert_eq!(
            missing,
            (base + 100..base + 20_000 - kept.len() as u64).collect::<Vec<u64>>(),
            "a reader finds every deleted reading missing, the confirmed ones not"
        );
        spool.forget_lost(&missing).unwrap();
        let mut again = Reader::new(dir.path(), base);
        again.read_records(100_000, u64::MAX).unwrap();
        assert!(
            again.take_missing().is_empty(),
            "counted ones are forgotten"
        );
        thread.finish();
    }

    fn append(spool: &Spool, r: &Record) {
        spool
            .tx
            .blocking_send(Command::Append {
                bytes: r.encode().into(),
                end: r.lsn + 1,
            })
            .unwrap();
    }

    fn write_all(dir: &Path, records: &[Record], max_size: u64) {
        let (spool, thread) = start_at(dir, records.first().map(|r| r.lsn), max_size);
        for r in records {
            append(&spool, r);
        }
        thread.finish();
    }

    #[test]
    fn written_records_are_read_back_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 5000).map(sample).collect();
        write_all(dir.path(), &records, 256 * 1024);
        assert!(list_segments(dir.path()).unwrap().len() > 1, "rotated");
        let rec = recover(dir.path()).unwrap();
        assert_eq!(rec.records, 5000);
        assert!(rec.next_lsn >= base + 5000);
        let mut reader = Reader::new(dir.path(), base + 10);
        let mut got = Vec::new();
        loop {
            let batch = reader.read_records(700, base + 5000).unwrap();
            if batch.is_empty() {
                break;
            }
            got.extend(batch);
        }
        assert_eq!(got, records[10..].to_vec());
    }

    #[test]
    fn a_torn_tail_is_cut_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 10).map(sample).collect();
        write_all(dir.path(), &records, 1 << 30);
        let (_, path) = list_segments(dir.path()).unwrap().pop().unwrap();
        let len = fs::metadata(&path).unwrap().len();
        // Half of the last record is missing.
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let rec = recover(dir.path()).unwrap();
        assert_eq!(rec.records, 9);
        assert!(rec.torn_bytes > 0);
        assert!(rec.next_lsn >= base + 9);
        let got = Reader::new(dir.path(), 0)
            .read_records(100, u64::MAX)
            .unwrap();
        assert_eq!(got, records[..9].to_vec());
        // Appending after the cut works and reads back in order.
        write_all(dir.path(), &[sample(base + 9)], 1 << 30);
        let got = Reader::new(dir.path(), 0)
            .read_records(100, u64::MAX)
            .unwrap();
        assert_eq!(got.len(), 10);
    }

    #[test]
    fn a_corrupted_last_record_is_cut_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 3).map(sample).collect();
        write_all(dir.path(), &records, 1 << 30);
        let (_, path) = list_segments(dir.path()).unwrap().pop().unwrap();
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        let rec = recover(dir.path()).unwrap();
        assert_eq!(rec.records, 2);
        let got = Reader::new(dir.path(), 0)
            .read_records(100, u64::MAX)
            .unwrap();
        assert_eq!(got, records[..2].to_vec());
    }

    #[test]
    fn checkpoint_deletes_whole_segments_below_it_and_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 5000).map(sample).collect();
        let (spool, thread) = start_at(dir.path(), Some(base), 256 * 1024);
        for r in &records {
            append(&spool, r);
        }
        let before = list_segments(dir.path()).unwrap().len();
        spool.checkpoint(base + 4000);
        thread.finish();
        let after = list_segments(dir.path()).unwrap();
        assert!(after.len() < before, "{} -> {}", before, after.len());
        assert!(
            after[0].0 <= base + 4000,
            "the segment holding the checkpoint stays"
        );
        let rec = recover(dir.path()).unwrap();
        assert_eq!(rec.checkpoint, base + 4000);
        assert_eq!(rec.records, 1000);
        let got = Reader::new(dir.path(), rec.checkpoint)
            .read_records(10_000, u64::MAX)
            .unwrap();
        assert_eq!(got, records[4000..].to_vec());
    }

    #[test]
    fn message_ids_are_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let ids = [
            Record {
                lsn: base,
                received_ms: 0,
                entry: Entry::MessageId {
                    pkid: 1,
                    digest: 10,
                },
            },
            Record {
                lsn: base + 1,
                received_ms: 0,
                entry: Entry::MessageId {
                    pkid: 1,
                    digest: 11,
                },
            },
            Record {
                lsn: base + 2,
                received_ms: 0,
                entry: Entry::MessageId {
                    pkid: 2,
                    digest: 20,
                },
            },
        ];
        write_all(dir.path(), &ids, 1 << 30);
        let rec = recover(dir.path()).unwrap();
        assert_eq!(rec.message_ids, HashMap::from([(1, 11), (2, 20)]));
    }

    #[test]
    fn a_checkpoint_past_everything_frees_even_the_open_segment() {
        // One append larger than the whole spool: the open segment alone
        // makes it full. Once the checkpoint confirms all of it, the spool
        // must have room again, or it would stay full for ever (no append
        // comes to rotate the segment away).
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let (spool, thread) = start_at(dir.path(), Some(base), 64 * 1024);
        let mut bytes = Vec::new();
        let n = 2000;
        for lsn in base..base + n {
            sample(lsn).encode_into(&mut bytes);
        }
        assert!(bytes.len() as u64 > spool.max_size());
        spool
            .tx
            .blocking_send(Command::Append {
                bytes: bytes.into(),
                end: base + n,
            })
            .unwrap();
        while spool.durable() < base + n {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(spool.is_full());
        spool.checkpoint(base + n - 1);
        std::thread::sleep(Duration::from_millis(50));
        assert!(spool.is_full(), "the last record is not confirmed yet");
        spool.checkpoint(base + n);
        let deadline = Instant::now() + Duration::from_secs(5);
        while spool.is_full() {
            assert!(Instant::now() < deadline, "the spool stays full");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(spool.bytes(), 0);
        // Appends go on in a new segment, and recovery sees them.
        append(&spool, &sample(base + n));
        thread.finish();
        let rec = recover(dir.path()).unwrap();
        assert_eq!(rec.checkpoint, base + n);
        assert_eq!(rec.records, 1);
        assert!(rec.next_lsn > base + n);
    }

    #[test]
    fn a_record_not_yet_durable_is_left_for_the_next_read() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 10).map(sample).collect();
        write_all(dir.path(), &records, 1 << 30);
        let mut reader = Reader::new(dir.path(), base);
        // Only the first five are durable yet, though all ten are written.
        let first = reader.read_records(100, base + 5).unwrap();
        assert_eq!(first, records[..5].to_vec());
        let rest = reader.read_records(100, base + 10).unwrap();
        assert_eq!(rest, records[5..].to_vec(), "none skipped");
    }
}
