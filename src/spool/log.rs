//! The spool's files: the record format, segment files, the checkpoint file,
//! recovery of a spool after a crash, and reading records back in LSN order.
//!
//! # Format
//! The directory holds segment files `<first LSN, 20 digits>.seg`, a
//! `checkpoint` file and a `spool.id`. A segment the appender has moved on
//! from is compressed (with `spool.compress`) into `<first LSN>.seg.zst`,
//! one zstd frame of the same bytes. A segment is a sequence of records:
//!
//! ```text
//! len: u32 LE | crc32(body): u32 LE | body (len bytes)
//! body = lsn: u64 LE | kind: u8 | received_ms: i64 LE | payload
//!   kind 1 sample:     sensor_len: u16 LE | sensor | BSON sample document
//!   kind 2 dead letter: BSON dead-letter document
//!   kind 3 message id:  pkid: u16 LE | digest: u64 LE  (redelivery detection)
//! ```
//!
//! All integers are little-endian whatever the machine, so a spool moves
//! between an x86 and an ARM box unchanged.
//!
//! Every record has a log sequence number (LSN), strictly increasing. A new
//! spool starts at the current time in microseconds, so LSNs also increase
//! across a spool that was deleted and made anew (buckets remember the
//! highest LSN applied to them; see the README).
//!
//! # Recovery
//! On open every segment is scanned (compressed ones decompressed on the
//! way). A record whose length or checksum does not hold at the end of the
//! last segment is a torn write (power lost in the middle of it): the file
//! is cut there and the record is gone. It was never acknowledged, so the
//! broker redelivers it. Anywhere else a bad record (or a frame that does
//! not decompress) is damage: the rest of that segment is skipped with an
//! ERROR. A compression cut short leaves a `.tmp` file (removed) or both
//! forms of a segment (the compressed one is complete: it is renamed into
//! place only once synced, so the plain one goes).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use tracing::{error, warn};

const HEADER: usize = 8;
/// Records larger than this are damage, not data.
const MAX_RECORD: u32 = 32 * 1024 * 1024;
const KIND_SAMPLE: u8 = 1;
const KIND_DEADLETTER: u8 = 2;
const KIND_MESSAGE_ID: u8 = 3;

/// What one record holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Sample { sensor: String, doc: Vec<u8> },
    DeadLetter { doc: Vec<u8> },
    MessageId { pkid: u16, digest: u64 },
}

/// A record, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub lsn: u64,
    pub received_ms: i64,
    pub entry: Entry,
}

/// What one record holds, borrowed from where it lies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EntryRef<'a> {
    Sample { sensor: &'a str, doc: &'a [u8] },
    DeadLetter { doc: &'a [u8] },
    MessageId { pkid: u16, digest: u64 },
}

/// A record, borrowed: what is encoded and what is parsed back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecordRef<'a> {
    pub lsn: u64,
    pub received_ms: i64,
    pub entry: EntryRef<'a>,
}

impl RecordRef<'_> {
    /// Appends the record as written (header and body) to `out`, without
    /// an allocation of its own.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0u8; HEADER]);
        out.extend_from_slice(&self.lsn.to_le_bytes());
        match self.entry {
            EntryRef::Sample { sensor, doc } => {
                out.push(KIND_SAMPLE);
                out.extend_from_slice(&self.received_ms.to_le_bytes());
                out.extend_from_slice(&(sensor.len() as u16).to_le_bytes());
                out.extend_from_slice(sensor.as_bytes());
                out.extend_from_slice(doc);
            }
            EntryRef::DeadLetter { doc } => {
                out.push(KIND_DEADLETTER);
                out.extend_from_slice(&self.received_ms.to_le_bytes());
                out.extend_from_slice(doc);
            }
            EntryRef::MessageId { pkid, digest } => {
                out.push(KIND_MESSAGE_ID);
                out.extend_from_slice(&self.received_ms.to_le_bytes());
                out.extend_from_slice(&pkid.to_le_bytes());
                out.extend_from_slice(&digest.to_le_bytes());
            }
        }
        let body = start + HEADER;
        let len = (out.len() - body) as u32;
        let crc = crc32fast::hash(&out[body..]);
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4..body].copy_from_slice(&crc.to_le_bytes());
    }

    /// A record's body (after the header); `None` when it is not one.
    fn decode(body: &[u8]) -> Option<RecordRef<'_>> {
        let lsn = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
        let kind = *body.get(8)?;
        let received_ms = i64::from_le_bytes(body.get(9..17)?.try_into().ok()?);
        let rest = body.get(17..)?;
        let entry = match kind {
            KIND_SAMPLE => {
                let n = u16::from_le_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
                EntryRef::Sample {
                    sensor: std::str::from_utf8(rest.get(2..2 + n)?).ok()?,
                    doc: rest.get(2 + n..)?,
                }
            }
            KIND_DEADLETTER => EntryRef::DeadLetter { doc: rest },
            KIND_MESSAGE_ID => EntryRef::MessageId {
                pkid: u16::from_le_bytes(rest.get(0..2)?.try_into().ok()?),
                digest: u64::from_le_bytes(rest.get(2..10)?.try_into().ok()?),
            },
            _ => return None,
        };
        Some(RecordRef {
            lsn,
            received_ms,
            entry,
        })
    }

    pub fn to_owned(&self) -> Record {
        Record {
            lsn: self.lsn,
            received_ms: self.received_ms,
            entry: match self.entry {
                EntryRef::Sample { sensor, doc } => Entry::Sample {
                    sensor: sensor.to_string(),
                    doc: doc.to_vec(),
                },
                EntryRef::DeadLetter { doc } => Entry::DeadLetter { doc: doc.to_vec() },
                EntryRef::MessageId { pkid, digest } => Entry::MessageId { pkid, digest },
            },
        }
    }
}

impl Record {
    pub fn as_ref(&self) -> RecordRef<'_> {
        RecordRef {
            lsn: self.lsn,
            received_ms: self.received_ms,
            entry: match &self.entry {
                Entry::Sample { sensor, doc } => EntryRef::Sample { sensor, doc },
                Entry::DeadLetter { doc } => EntryRef::DeadLetter { doc },
                Entry::MessageId { pkid, digest } => EntryRef::MessageId {
                    pkid: *pkid,
                    digest: *digest,
                },
            },
        }
    }

    /// Appends the record as written (header and body) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        self.as_ref().encode_into(out);
    }

    /// The record as written: header and body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out);
        out
    }
}

/// The records encoded back to back in `bytes` (as appended, or as read
/// back), in order. Stops at the first that is not a whole record.
pub fn parse(bytes: &[u8]) -> impl Iterator<Item = RecordRef<'_>> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        let len = u32::from_le_bytes(rest.get(0..4)?.try_into().ok()?) as usize;
        let body = rest.get(HEADER..HEADER + len)?;
        let rec = RecordRef::decode(body)?;
        rest = &rest[HEADER + len..];
        Some(rec)
    })
}

/// Why reading a record stopped.
enum ReadOutcome {
    /// A record (its LSN and size) was appended to the buffer.
    Record(u64, u64),
    End,
    /// Bytes that are not a valid record, at this offset.
    Bad,
}

/// Reads the record at the reader's position and appends it (header and
/// body) to `out`; `Bad` leaves the position and `out` as they were.
fn read_record(r: &mut impl Read, out: &mut Vec<u8>) -> io::Result<ReadOutcome> {
    let start = out.len();
    out.resize(start + HEADER, 0);
    match read_full(r, &mut out[start..])? {
        0 => {
            out.truncate(start);
            return Ok(ReadOutcome::End);
        }
        n if n < HEADER => {
            out.truncate(start);
            return Ok(ReadOutcome::Bad);
        }
        _ => {}
    }
    let len = u32::from_le_bytes(out[start..start + 4].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(out[start + 4..start + 8].try_into().unwrap_or_default());
    if !(17..=MAX_RECORD).contains(&len) {
        out.truncate(start);
        return Ok(ReadOutcome::Bad);
    }
    let body = start + HEADER;
    out.resize(body + len as usize, 0);
    let got = read_full(r, &mut out[body..])?;
    let outcome = if got < len as usize || crc32fast::hash(&out[body..]) != crc {
        None
    } else {
        RecordRef::decode(&out[body..]).map(|rec| rec.lsn)
    };
    match outcome {
        Some(lsn) => Ok(ReadOutcome::Record(lsn, (HEADER + len as usize) as u64)),
        None => {
            out.truncate(start);
            Ok(ReadOutcome::Bad)
        }
    }
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

pub(super) fn segment_name(first_lsn: u64) -> String {
    format!("{first_lsn:020}.seg")
}

/// The name of a segment once compressed.
pub(super) fn compressed_name(first_lsn: u64) -> String {
    format!("{first_lsn:020}.seg.zst")
}

/// Whether a segment file is compressed.
pub(super) fn is_compressed(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "zst")
}

/// Segment files in LSN order: (first LSN, path), one per segment (the
/// compressed file when both forms exist: it is complete).
pub(super) fn list_segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, PathBuf)> = Vec::new();
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let first = name
            .strip_suffix(".seg")
            .or_else(|| name.strip_suffix(".seg.zst"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(lsn) = first {
            out.push((lsn, path));
        }
    }
    // Compressed after plain for the same LSN; keep the last of each.
    out.sort_by_key(|s| (s.0, is_compressed(&s.1)));
    let mut one: Vec<(u64, PathBuf)> = Vec::with_capacity(out.len());
    for seg in out {
        match one.last_mut() {
            Some(last) if last.0 == seg.0 => *last = seg,
            _ => one.push(seg),
        }
    }
    Ok(one)
}

/// Opens a segment for reading from its start.
fn open_segment_file(path: &Path) -> io::Result<Box<dyn Read + Send>> {
    let file = File::open(path)?;
    if is_compressed(path) {
        Ok(Box::new(zstd::stream::read::Decoder::new(file)?))
    } else {
        Ok(Box::new(io::BufReader::with_capacity(256 * 1024, file)))
    }
}

/// Compresses segment `path` into `<path>.zst.tmp` (synced); returns the
/// temporary file and its size. The caller renames it into place.
pub(super) fn compress_segment(path: &Path) -> io::Result<(PathBuf, u64)> {
    let tmp = path.with_extension("seg.zst.tmp");
    let mut src = File::open(path)?;
    let out = File::create(&tmp)?;
    let mut enc = zstd::stream::write::Encoder::new(out, 3)?;
    io::copy(&mut src, &mut enc)?;
    let out = enc.finish()?;
    out.sync_all()?;
    let len = out.metadata()?.len();
    Ok((tmp, len))
}

/// What a segment holds (before it is dropped to make room).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Census {
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

/// Counts what a segment holds from LSN `from` on (up to damage).
pub(super) fn census(path: &Path, from: u64) -> io::Result<Census> {
    let mut r = open_segment_file(path)?;
    let mut c = Census::default();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match read_record(&mut r, &mut buf) {
            Ok(ReadOutcome::Record(..)) => {}
            Ok(_) | Err(_) => return Ok(c),
        }
        if let Some(rec) = parse(&buf).next().filter(|r| r.lsn >= from) {
            c.records += 1;
            c.first_lsn.get_or_insert(rec.lsn);
            c.last_lsn = Some(rec.lsn);
            c.first_ms.get_or_insert(rec.received_ms);
            c.last_ms = Some(rec.received_ms);
            match rec.entry {
                EntryRef::Sample { .. } => {
                    c.samples += 1;
                    c.sample_lsns.insert(rec.lsn);
                }
                EntryRef::DeadLetter { .. } => c.dead_letters += 1,
                EntryRef::MessageId { .. } => c.messages += 1,
            }
        }
    }
}

pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
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

pub(super) fn write_checkpoint(dir: &Path, lsn: u64) -> io::Result<()> {
    let mut bytes = lsn.to_le_bytes().to_vec();
    bytes.extend_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
    let tmp = dir.join("checkpoint.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join("checkpoint"))?;
    sync_dir(dir)
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
    /// Segments before the last that are not compressed yet: (first LSN,
    /// path).
    pub uncompressed: Vec<(u64, PathBuf)>,
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
    super::tombstone::clean(dir)?;
    // A compression cut short: its temporary file goes, and a plain
    // segment whose compressed form is in place goes.
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        if path.to_str().is_some_and(|p| p.ends_with(".seg.zst.tmp")) {
            fs::remove_file(&path)?;
        }
    }
    for (first, path) in list_segments(dir)? {
        let plain = dir.join(segment_name(first));
        if is_compressed(&path) && plain.exists() {
            fs::remove_file(plain)?;
        }
    }
    let segments = list_segments(dir)?;
    let mut rec = Recovery {
        checkpoint,
        tag,
        ..Recovery::default()
    };
    let mut last_lsn = None;
    for (i, (first, path)) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let compressed = is_compressed(path);
        if !compressed && !last {
            rec.uncompressed.push((*first, path.clone()));
        }
        let mut f = OpenOptions::new()
            .read(true)
            .write(!compressed)
            .open(path)?;
        let len = f.metadata()?.len();
        let mut r: Box<dyn Read> = if compressed {
            Box::new(zstd::stream::read::Decoder::new(&mut f)?)
        } else {
            Box::new(io::BufReader::new(&mut f))
        };
        let mut offset = 0u64;
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let outcome = match read_record(&mut r, &mut buf) {
                Ok(o) => o,
                // A frame that does not decompress.
                Err(e) if compressed => {
                    error!(segment = %path.display(), error = %e, "Compressed spool segment is damaged; skipping the rest of it.");
                    break;
                }
                Err(e) => return Err(e),
            };
            match outcome {
                ReadOutcome::Record(lsn, size) => {
                    offset += size;
                    last_lsn = Some(lsn);
                    if lsn >= checkpoint {
                        rec.records += 1;
                    }
                    if let Some(RecordRef {
                        entry: EntryRef::MessageId { pkid, digest },
                        ..
                    }) = parse(&buf).next()
                    {
                        rec.message_ids.insert(pkid, digest);
                    }
                }
                ReadOutcome::End => break,
                ReadOutcome::Bad if last && !compressed => {
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
        rec.bytes += if compressed { len } else { offset.min(len) };
    }
    let now_us = crate::clock::now_us();
    rec.next_lsn = last_lsn.map_or(0, |l| l + 1).max(checkpoint).max(now_us);
    Ok(rec)
}

/// Reads records in LSN order from the segment files.
pub struct Reader {
    dir: PathBuf,
    /// The segment being read: its first LSN, whether it is compressed,
    /// and the stream.
    file: Option<(u64, bool, Box<dyn Read + Send>)>,
    /// A record read past the last read's limit, for the next read.
    stash: Vec<u8>,
    /// Next LSN wanted.
    next: u64,
    /// Sample LSNs the reads stepped over that `drop_oldest` deleted.
    missing: Vec<u64>,
}

impl Reader {
    pub fn new(dir: &Path, from_lsn: u64) -> Reader {
        Reader {
            dir: dir.to_path_buf(),
            file: None,
            stash: Vec::new(),
            next: from_lsn,
            missing: Vec::new(),
        }
    }

    /// The LSN the next read starts at.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// The sample LSNs the reads so far stepped over because
    /// `spool.when_full = "drop_oldest"` deleted them (see
    /// [`super::tombstone`]; reported again until [`super::Spool::forget_lost`]).
    pub fn take_missing(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.missing)
    }

    /// Up to `max` records with `next <= lsn < limit`, in order, as written
    /// (see [`parse`]), and how many. Blocking. Fewer than `max` means the
    /// whole range up to `limit` was read: the sample LSNs deleted from it
    /// are then in [`Reader::take_missing`] (else those up to the last
    /// record read).
    pub fn read(&mut self, max: usize, limit: u64) -> io::Result<(Vec<u8>, usize)> {
        let start = self.next;
        let (out, n) = self.read_records_in(max, limit)?;
        let end = if n < max { limit } else { self.next };
        let gone = super::tombstone::find(&self.dir, start, end)?;
        self.missing.extend(gone);
        Ok((out, n))
    }

    fn read_records_in(&mut self, max: usize, limit: u64) -> io::Result<(Vec<u8>, usize)> {
        let mut out = Vec::new();
        let mut n = 0;
        while n < max && self.next < limit {
            let before = out.len();
            let outcome = if !self.stash.is_empty() {
                // The record the last read stopped at.
                out.append(&mut self.stash);
                let lsn = parse(&out[before..]).next().map_or(0, |r| r.lsn);
                ReadOutcome::Record(lsn, (out.len() - before) as u64)
            } else {
                if self.file.is_none() && !self.open_segment()? {
                    break;
                }
                let Some((first, compressed, r)) = self.file.as_mut() else {
                    break;
                };
                match read_record(r, &mut out) {
                    Ok(o) => o,
                    Err(e) if *compressed => {
                        error!(segment = *first, error = %e, "Compressed spool segment is damaged; skipping the rest of it.");
                        out.truncate(before);
                        ReadOutcome::Bad
                    }
                    Err(e) => return Err(e),
                }
            };
            match outcome {
                ReadOutcome::Record(lsn, _) if lsn >= limit => {
                    // Past the limit (not yet durable, or beyond the range
                    // asked for): kept for a later read.
                    self.stash = out.split_off(before);
                    break;
                }
                ReadOutcome::Record(lsn, _) => {
                    if lsn >= self.next {
                        self.next = lsn + 1;
                        n += 1;
                    } else {
                        out.truncate(before);
                    }
                }
                // The end of this segment (records below `limit` are
                // complete), or damage already reported at recovery: on to
                // the next segment.
                ReadOutcome::End | ReadOutcome::Bad => {
                    let first = self.file.as_ref().map_or(0, |f| f.0);
                    if !self.advance_past(first)? {
                        // The open segment: keep the position, it grows.
                        break;
                    }
                }
            }
        }
        Ok((out, n))
    }

    /// [`Reader::read`], parsed into owned records (tests, tools).
    pub fn read_records(&mut self, max: usize, limit: u64) -> io::Result<Vec<Record>> {
        let (bytes, _) = self.read(max, limit)?;
        Ok(parse(&bytes).map(|r| r.to_owned()).collect())
    }

    /// Opens the segment holding `next`.
    fn open_segment(&mut self) -> io::Result<bool> {
        let next = self.next;
        self.open_first(|segments| {
            segments
                .iter()
                .rev()
                .find(|(f, _)| *f <= next)
                .or(segments.first())
                .cloned()
        })
    }

    /// Moves to the segment after the one starting at `first`, if any.
    fn advance_past(&mut self, first: u64) -> io::Result<bool> {
        let opened =
            self.open_first(|segments| segments.iter().find(|(f, _)| *f > first).cloned())?;
        if let Some((f, ..)) = &self.file {
            self.next = self.next.max(*f);
        }
        Ok(opened)
    }

    /// Opens the segment `pick` chooses from the listing. A segment being
    /// compressed changes its name at any moment: listed again then.
    fn open_first(
        &mut self,
        pick: impl Fn(&[(u64, PathBuf)]) -> Option<(u64, PathBuf)>,
    ) -> io::Result<bool> {
        for attempt in 0.. {
            let Some((first, path)) = pick(&list_segments(&self.dir)?) else {
                return Ok(false);
            };
            match open_segment_file(&path) {
                Ok(r) => {
                    self.file = Some((first, is_compressed(&path), r));
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < 3 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A sample record with a small made-up document.
    pub fn sample(lsn: u64) -> Record {
        Record {
            lsn,
            received_ms: 7,
            entry: Entry::Sample {
                sensor: format!("s{lsn}"),
                doc: vec![1, 2, 3, lsn as u8],
            },
        }
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
            let mut bytes = vec![9u8; 3];
            r.encode_into(&mut bytes);
            let bytes = &bytes[3..];
            assert_eq!(bytes, r.encode().as_slice());
            let mut out = Vec::new();
            match read_record(&mut &bytes[..], &mut out).unwrap() {
                ReadOutcome::Record(lsn, n) => {
                    assert_eq!(lsn, r.lsn);
                    assert_eq!(n as usize, bytes.len());
                    assert_eq!(out, bytes);
                    let back: Vec<Record> = parse(&out).map(|x| x.to_owned()).collect();
                    assert_eq!(back, vec![r.clone()]);
                }
                _ => panic!("did not read back"),
            }
        }
    }
}
