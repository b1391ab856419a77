//! The spool: a local, crash-safe, append-only log of everything palletd
//! received, so a PUBLISH can be acknowledged once it is on local disk and
//! the database may be slow or gone for hours.
//!
//! # Format
//! The directory holds segment files `<first LSN, 20 digits>.seg`, a
//! `checkpoint` file and a `spool.id`. A segment is a sequence of records:
//!
//! ```text
//! len: u32 LE | crc32(body): u32 LE | body (len bytes)
//! body = lsn: u64 LE | kind: u8 | received_ms: i64 LE | payload
//!   kind 1 sample:     sensor_len: u16 LE | sensor | BSON sample document
//!   kind 2 dead letter: BSON dead-letter document
//!   kind 3 message id:  pkid: u16 LE | digest: u64 LE  (redelivery detection)
//! ```
//!
//! Every record has a log sequence number (LSN), strictly increasing. A new
//! spool starts at the current time in microseconds, so LSNs also increase
//! across a spool that was deleted and made anew (buckets remember the
//! highest LSN applied to them; see the README).
//!
//! # Durability
//! One writer thread owns the open segment. It writes what the pipeline
//! appends and then, with `fsync = "batch"`, syncs once for everything that
//! arrived meanwhile (group commit: one fsync covers all appends made during
//! the previous one); `"always"` syncs after every append, `"off"` never
//! (tests only). It publishes the LSN below which everything is durable.
//!
//! # Recovery
//! On open every segment is scanned. A record whose length or checksum does
//! not hold at the end of the last segment is a torn write (power lost in the
//! middle of it): the file is cut there and the record is gone. It was never
//! acknowledged, so the broker redelivers it. Anywhere else a bad record is
//! damage: the rest of that segment is skipped with an ERROR.
//!
//! # Checkpoint
//! The pipeline reports the lowest LSN it still needs (everything below is
//! in MongoDB). The writer stores it crash-safely (write, fsync, rename,
//! fsync the directory) and deletes the segments that lie wholly below it.
//!
//! Why not a crate: the embedded stores on crates.io are B-trees or LSM trees
//! (redb, sled, fjall) where a cut file is a corrupt database rather than a
//! torn tail, and the log crates (okaywal, commitlog) are unmaintained. A
//! segmented file with CRC32 (crc32fast) is a few hundred lines, and its
//! crash behaviour is tested here.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

const HEADER: usize = 8;
/// Records larger than this are damage, not data.
const MAX_RECORD: u32 = 32 * 1024 * 1024;
const KIND_SAMPLE: u8 = 1;
const KIND_DEADLETTER: u8 = 2;
const KIND_MESSAGE_ID: u8 = 3;

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

/// Spool settings.
#[derive(Debug, Clone)]
pub struct SpoolSettings {
    pub dir: PathBuf,
    pub max_size: u64,
    pub fsync: Fsync,
}

/// What one record holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Sample { sensor: String, doc: Vec<u8> },
    DeadLetter { doc: Vec<u8> },
    MessageId { pkid: u16, digest: u64 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub lsn: u64,
    pub received_ms: i64,
    pub entry: Entry,
}

impl Record {
    /// The record as written: header and body.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(64);
        body.extend_from_slice(&self.lsn.to_le_bytes());
        match &self.entry {
            Entry::Sample { sensor, doc } => {
                body.push(KIND_SAMPLE);
                body.extend_from_slice(&self.received_ms.to_le_bytes());
                body.extend_from_slice(&(sensor.len() as u16).to_le_bytes());
                body.extend_from_slice(sensor.as_bytes());
                body.extend_from_slice(doc);
            }
            Entry::DeadLetter { doc } => {
                body.push(KIND_DEADLETTER);
                body.extend_from_slice(&self.received_ms.to_le_bytes());
                body.extend_from_slice(doc);
            }
            Entry::MessageId { pkid, digest } => {
                body.push(KIND_MESSAGE_ID);
                body.extend_from_slice(&self.received_ms.to_le_bytes());
                body.extend_from_slice(&pkid.to_le_bytes());
                body.extend_from_slice(&digest.to_le_bytes());
            }
        }
        let mut out = Vec::with_capacity(HEADER + body.len());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn decode(body: &[u8]) -> Option<Record> {
        let lsn = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
        let kind = *body.get(8)?;
        let received_ms = i64::from_le_bytes(body.get(9..17)?.try_into().ok()?);
        let rest = body.get(17..)?;
        let entry = match kind {
            KIND_SAMPLE => {
                let n = u16::from_le_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
                let sensor = std::str::from_utf8(rest.get(2..2 + n)?).ok()?.to_string();
                Entry::Sample {
                    sensor,
                    doc: rest.get(2 + n..)?.to_vec(),
                }
            }
            KIND_DEADLETTER => Entry::DeadLetter { doc: rest.to_vec() },
            KIND_MESSAGE_ID => Entry::MessageId {
                pkid: u16::from_le_bytes(rest.get(0..2)?.try_into().ok()?),
                digest: u64::from_le_bytes(rest.get(2..10)?.try_into().ok()?),
            },
            _ => return None,
        };
        Some(Record {
            lsn,
            received_ms,
            entry,
        })
    }
}

/// Why reading a record stopped.
enum ReadOutcome {
    Record(Record, u64),
    End,
    /// Bytes that are not a valid record, at this offset.
    Bad,
}

/// Reads the record at the reader's position; `Bad` leaves the position.
fn read_record(r: &mut impl Read) -> io::Result<ReadOutcome> {
    let mut header = [0u8; HEADER];
    match read_full(r, &mut header)? {
        0 => return Ok(ReadOutcome::End),
        n if n < HEADER => return Ok(ReadOutcome::Bad),
        _ => {}
    }
    let len = u32::from_le_bytes(header[0..4].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(header[4..8].try_into().unwrap_or_default());
    if !(17..=MAX_RECORD).contains(&len) {
        return Ok(ReadOutcome::Bad);
    }
    let mut body = vec![0u8; len as usize];
    if read_full(r, &mut body)? < body.len() || crc32fast::hash(&body) != crc {
        return Ok(ReadOutcome::Bad);
    }
    Ok(match Record::decode(&body) {
        Some(rec) => ReadOutcome::Record(rec, (HEADER + body.len()) as u64),
        None => ReadOutcome::Bad,
    })
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn segment_name(first_lsn: u64) -> String {
    format!("{first_lsn:020}.seg")
}

/// Segment files in LSN order: (first LSN, path).
fn list_segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if let Some(lsn) = name
            .strip_suffix(".seg")
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push((lsn, path));
        }
    }
    out.sort();
    Ok(out)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn read_checkpoint(dir: &Path) -> u64 {
    let Ok(bytes) = fs::read(dir.join("checkpoint")) else {
        return 0;
    };
    if bytes.len() != 12 {
        warn!("Spool checkpoint file is damaged; replaying the whole spool.");
        return 0;
    }
    let lsn = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
    if crc32fast::hash(&bytes[0..8]) != crc {
        warn!("Spool checkpoint file is damaged; replaying the whole spool.");
        return 0;
    }
    lsn
}

fn write_checkpoint(dir: &Path, lsn: u64) -> io::Result<()> {
    let mut bytes = lsn.to_le_bytes().to_vec();
    bytes.extend_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
    let tmp = dir.join("checkpoint.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join("checkpoint"))?;
    sync_dir(dir)
}

/// Shared numbers for metrics and the full check.
#[derive(Debug, Default)]
pub struct SpoolStats {
    /// Bytes in all segment files.
    pub bytes: AtomicU64,
    /// LSN of the checkpoint (everything below is in MongoDB).
    pub checkpoint: AtomicU64,
    pub fsyncs: AtomicU64,
}

/// What opening found.
#[derive(Debug, Default)]
pub struct Recovery {
    /// First LSN to hand out.
    pub next_lsn: u64,
    /// Everything below this is in MongoDB.
    pub checkpoint: u64,
    /// Records at or above the checkpoint (to replay).
    pub records: u64,
    pub bytes: u64,
    /// Bytes cut from a torn tail.
    pub torn_bytes: u64,
    /// Latest message id per packet id, for redelivery detection.
    pub message_ids: HashMap<u16, u64>,
    /// A 4-byte tag of this spool, for idempotent dead-letter ids.
    pub tag: u32,
}

/// Opens (or creates) the spool directory and recovers its state.
pub fn recover(dir: &Path) -> io::Result<Recovery> {
    fs::create_dir_all(dir)?;
    let tag = match fs::read_to_string(dir.join("spool.id")) {
        Ok(t) => u32::from_str_radix(t.trim(), 16).unwrap_or(0),
        Err(_) => {
            let tag: u32 = rand::random();
            fs::write(dir.join("spool.id"), format!("{tag:08x}\n"))?;
            sync_dir(dir)?;
            tag
        }
    };
    let checkpoint = read_checkpoint(dir);
    let segments = list_segments(dir)?;
    let mut rec = Recovery {
        checkpoint,
        tag,
        ..Recovery::default()
    };
    let mut last_lsn = None;
    for (i, (_, path)) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let mut f = OpenOptions::new().read(true).write(true).open(path)?;
        let len = f.metadata()?.len();
        let mut r = io::BufReader::new(&mut f);
        let mut offset = 0u64;
        loop {
            match read_record(&mut r)? {
                ReadOutcome::Record(record, size) => {
                    offset += size;
                    last_lsn = Some(record.lsn);
                    if record.lsn >= checkpoint {
                        rec.records += 1;
                    }
                    if let Entry::MessageId { pkid, digest } = record.entry {
                        rec.message_ids.insert(pkid, digest);
                    }
                }
                ReadOutcome::End => break,
                ReadOutcome::Bad if last => {
                    drop(r);
                    warn!(
                        segment = %path.display(),
                        offset,
                        cut = len - offset,
                        "Spool ends in a torn record (an interrupted write); cutting it off."
                    );
                    f.set_len(offset)?;
                    f.sync_all()?;
                    rec.torn_bytes = len - offset;
                    break;
                }
                ReadOutcome::Bad => {
                    error!(
                        segment = %path.display(),
                        offset,
                        skipped = len - offset,
                        "Spool segment is damaged; skipping the rest of it."
                    );
                    break;
                }
            }
        }
        rec.bytes += offset.min(len);
    }
    let now_us = chrono::Utc::now().timestamp_micros().max(0) as u64;
    rec.next_lsn = last_lsn.map_or(0, |l| l + 1).max(checkpoint).max(now_us);
    Ok(rec)
}

/// Reads records in LSN order from the segment files.
pub struct Reader {
    dir: PathBuf,
    file: Option<(u64, io::BufReader<File>)>,
    /// Next LSN wanted.
    next: u64,
}

impl Reader {
    pub fn new(dir: &Path, from_lsn: u64) -> Reader {
        Reader {
            dir: dir.to_path_buf(),
            file: None,
            next: from_lsn,
        }
    }

    /// Up to `max` records with `next <= lsn < limit`, in order. Blocking.
    pub fn read(&mut self, max: usize, limit: u64) -> io::Result<Vec<Record>> {
        let mut out = Vec::new();
        while out.len() < max && self.next < limit {
            if self.file.is_none() && !self.open_segment()? {
                break;
            }
            let Some((_, r)) = self.file.as_mut() else {
                break;
            };
            match read_record(r)? {
                ReadOutcome::Record(rec, _) => {
                    if rec.lsn >= self.next {
                        self.next = rec.lsn + 1;
                        if rec.lsn < limit {
                            out.push(rec);
                        }
                    }
                }
                // The end of this segment (records below `limit` are
                // complete), or damage already reported at recovery: on to
                // the next segment.
                ReadOutcome::End | ReadOutcome::Bad => {
                    let first = self.file.as_ref().map_or(0, |(f, _)| *f);
                    if !self.advance_past(first)? {
                        // The open segment: keep the position, it grows.
                        break;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Opens the segment holding `next`.
    fn open_segment(&mut self) -> io::Result<bool> {
        let segments = list_segments(&self.dir)?;
        let Some((first, path)) = segments
            .iter()
            .rev()
            .find(|(f, _)| *f <= self.next)
            .or(segments.first())
        else {
            return Ok(false);
        };
        self.file = Some((*first, io::BufReader::new(File::open(path)?)));
        Ok(true)
    }

    /// Moves to the segment after the one starting at `first`, if any.
    fn advance_past(&mut self, first: u64) -> io::Result<bool> {
        let segments = list_segments(&self.dir)?;
        match segments.into_iter().find(|(f, _)| *f > first) {
            Some((f, path)) => {
                self.next = self.next.max(f);
                self.file = Some((f, io::BufReader::new(File::open(path)?)));
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// A request to the writer thread.
pub enum Command {
    /// Encoded records, in LSN order; `end` is the LSN after the last.
    Append { bytes: Vec<u8>, end: u64 },
    /// Everything below this LSN is in MongoDB.
    Checkpoint(u64),
}

/// The pipeline's side of the writer thread.
pub struct SpoolWriter {
    pub tx: mpsc::Sender<Command>,
    /// Everything below this LSN is durable on local disk.
    pub durable: watch::Receiver<u64>,
    pub stats: Arc<SpoolStats>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SpoolWriter {
    /// Starts the writer thread; appends continue at `next_lsn`.
    pub fn start(
        settings: &SpoolSettings,
        next_lsn: u64,
        bytes: u64,
        checkpoint: u64,
    ) -> io::Result<SpoolWriter> {
        // At least four segments fit, so a full spool can always free some.
        let segment_size = (settings.max_size / 4).clamp(16 * 1024, 64 * 1024 * 1024);
        let (tx, rx) = mpsc::channel(1024);
        let (durable_tx, durable) = watch::channel(next_lsn);
        let stats = Arc::new(SpoolStats::default());
        stats.bytes.store(bytes, Ordering::Relaxed);
        stats.checkpoint.store(checkpoint, Ordering::Relaxed);
        let mut state = WriterState {
            dir: settings.dir.clone(),
            fsync: settings.fsync,
            segment_size,
            current: None,
            next_lsn,
            checkpoint,
            stats: stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("palletd-spool".into())
            .spawn(move || state.run(rx, durable_tx))?;
        Ok(SpoolWriter {
            tx,
            durable,
            stats,
            thread: Some(thread),
        })
    }

    /// Closes the channel and waits for the thread to sync and exit.
    pub fn finish(mut self) {
        drop(self.tx);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct WriterState {
    dir: PathBuf,
    fsync: Fsync,
    segment_size: u64,
    /// (first LSN, file, bytes written)
    current: Option<(u64, BufWriter<File>, u64)>,
    next_lsn: u64,
    checkpoint: u64,
    stats: Arc<SpoolStats>,
}

impl WriterState {
    fn run(&mut self, mut rx: mpsc::Receiver<Command>, durable: watch::Sender<u64>) {
        let mut failing = false;
        while let Some(cmd) = rx.blocking_recv() {
            let mut batch = vec![cmd];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
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
        }
        let _ = self.sync();
    }

    /// Applies a batch of commands; returns the new durable LSN if appends
    /// became durable.
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
                Command::Checkpoint(lsn) => self.checkpoint(lsn)?,
            }
        }
        if end.is_some() {
            self.sync()?;
        }
        Ok(end)
    }

    fn append(&mut self, bytes: &[u8], end: u64) -> io::Result<()> {
        let rotate = self
            .current
            .as_ref()
            .is_none_or(|c| c.2 >= self.segment_size);
        if rotate {
            self.sync()?;
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
        self.stats
            .bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        if let Some((_, w, _)) = self.current.as_mut() {
            w.flush()?;
            if self.fsync != Fsync::Off {
                w.get_ref().sync_data()?;
                self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
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
        self.stats.checkpoint.store(lsn, Ordering::Relaxed);
        // A segment can go once the next one starts at or below the
        // checkpoint: all its records are in MongoDB. Never the open one.
        let segments = list_segments(&self.dir)?;
        let open = self.current.as_ref().map(|c| c.0);
        for pair in segments.windows(2) {
            let ((first, path), (next_first, _)) = (&pair[0], &pair[1]);
            if *next_first <= lsn && Some(*first) != open {
                let len = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                fs::remove_file(path)?;
                self.stats.bytes.fetch_sub(
                    len.min(self.stats.bytes.load(Ordering::Relaxed)),
                    Ordering::Relaxed,
                );
            }
        }
        Ok(())
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
    };
    let rec = recover(dir)?;
    let writer = SpoolWriter::start(&settings, rec.next_lsn, rec.bytes, rec.checkpoint)?;
    let started = Instant::now();
    let doc = vec![0u8; record_bytes];
    let mut lsn = rec.next_lsn;
    for _ in 0..records {
        let r = Record {
            lsn,
            received_ms: 0,
            entry: Entry::DeadLetter { doc: doc.clone() },
        };
        lsn += 1;
        if writer
            .tx
            .blocking_send(Command::Append {
                bytes: r.encode(),
                end: lsn,
            })
            .is_err()
        {
            break;
        }
    }
    let stats = writer.stats.clone();
    let durable = writer.durable.clone();
    while *durable.borrow() < lsn {
        if durable.has_changed().is_err() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let elapsed = started.elapsed();
    writer.finish();
    Ok((elapsed, stats.fsyncs.load(Ordering::Relaxed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(lsn: u64) -> Record {
        Record {
            lsn,
            received_ms: 7,
            entry: Entry::Sample {
                sensor: format!("s{lsn}"),
                doc: vec![1, 2, 3, lsn as u8],
            },
        }
    }

    fn write_all(dir: &Path, records: &[Record], max_size: u64) {
        let rec = recover(dir).unwrap();
        let settings = SpoolSettings {
            dir: dir.to_path_buf(),
            max_size,
            fsync: Fsync::Batch,
        };
        let first = records.first().map_or(rec.next_lsn, |r| r.lsn);
        let w = SpoolWriter::start(&settings, first, rec.bytes, rec.checkpoint).unwrap();
        for r in records {
            w.tx.blocking_send(Command::Append {
                bytes: r.encode(),
                end: r.lsn + 1,
            })
            .unwrap();
        }
        w.finish();
    }

    #[test]
    fn records_round_trip() {
        for r in [
            sample(5),
            Record {
                lsn: 9,
                received_ms: -1,
                entry: Entry::DeadLetter { doc: vec![9; 40] },
            },
            Record {
                lsn: 10,
                received_ms: 3,
                entry: Entry::MessageId {
                    pkid: 77,
                    digest: 123,
                },
            },
        ] {
            let bytes = r.encode();
            match read_record(&mut &bytes[..]).unwrap() {
                ReadOutcome::Record(back, n) => {
                    assert_eq!(back, r);
                    assert_eq!(n as usize, bytes.len());
                }
                _ => panic!("did not read back"),
            }
        }
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
            let batch = reader.read(700, base + 5000).unwrap();
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
        let got = Reader::new(dir.path(), 0).read(100, u64::MAX).unwrap();
        assert_eq!(got, records[..9].to_vec());
        // Appending after the cut works and reads back in order.
        write_all(dir.path(), &[sample(base + 9)], 1 << 30);
        let got = Reader::new(dir.path(), 0).read(100, u64::MAX).unwrap();
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
        let got = Reader::new(dir.path(), 0).read(100, u64::MAX).unwrap();
        assert_eq!(got, records[..2].to_vec());
    }

    #[test]
    fn checkpoint_deletes_whole_segments_below_it_and_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let base = recover(dir.path()).unwrap().next_lsn;
        let records: Vec<Record> = (base..base + 5000).map(sample).collect();
        let settings = SpoolSettings {
            dir: dir.path().to_path_buf(),
            max_size: 256 * 1024,
            fsync: Fsync::Batch,
        };
        let w = SpoolWriter::start(&settings, base, 0, 0).unwrap();
        for r in &records {
            w.tx.blocking_send(Command::Append {
                bytes: r.encode(),
                end: r.lsn + 1,
            })
            .unwrap();
        }
        let before = list_segments(dir.path()).unwrap().len();
        w.tx.blocking_send(Command::Checkpoint(base + 4000))
            .unwrap();
        w.finish();
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
            .read(10_000, u64::MAX)
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
}
