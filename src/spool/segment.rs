//! Segment files: their names, the listing of a spool directory, and a
//! segment's bytes as a stream, decompressed on the way.
//!
//! A segment is `<first LSN, 20 digits>.seg`. A segment the appender moved
//! on from is compressed (with `spool.compress`) into `<first LSN>.seg.zst`:
//! a zstd skippable frame that says so (`palletd frames 1`), then
//! independent zstd frames with content checksums, each holding whole
//! records, about [`FRAME_BYTES`] of them. Damage to a compressed segment
//! thus costs the frame it lies in, not the rest of the segment (`zstd -d`
//! still reads the file). Compressed segments of earlier versions are one
//! zstd frame: damage there costs the rest of that segment.
//!
//! Beside the segments, the directory holds LSN-range files: tombstones of
//! segments `drop_oldest` deleted and markers of damage already counted,
//! `<first LSN>-<last LSN>.<suffix>` ([`list_ranges`]).

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::fs::{write_all, AppendFile, ReadFile, Storage};
use crate::record::MAX_RECORD;

/// About this many bytes of records go into one compressed frame (measured:
/// 82% of the ratio of one frame per segment, at most about 150 readings
/// of 110 bytes lost to one damaged byte).
pub(super) const FRAME_BYTES: usize = 16 * 1024;

/// A zstd frame starts with these bytes (0xFD2FB528, little-endian).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// The magic of the skippable frame that opens a framed segment.
const SKIPPABLE: [u8; 4] = [0x50, 0x2a, 0x4d, 0x18];
/// The skippable frame that opens a framed segment: its magic, its length
/// and what it holds.
const FRAMED_HEADER: &[u8; 16] = b"\x50\x2a\x4d\x18\x08\x00\x00\x00PLTFRM01";

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
/// compressed file when both forms exist: it is complete, it is renamed
/// into place only once synced).
pub(super) fn list_segments(storage: &dyn Storage, dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, PathBuf)> = Vec::new();
    for (name, _) in storage.list(dir)? {
        let first = name
            .strip_suffix(".seg")
            .or_else(|| name.strip_suffix(".seg.zst"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(lsn) = first {
            out.push((lsn, dir.join(&name)));
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

/// The LSN-range files `<first>-<last>.<suffix>` in `dir`, in LSN order:
/// (first, last, path).
pub(super) fn list_ranges(
    storage: &dyn Storage,
    dir: &Path,
    suffix: &str,
) -> io::Result<Vec<(u64, u64, PathBuf)>> {
    let mut out = Vec::new();
    for (name, _) in storage.list(dir)? {
        let parsed = name
            .strip_suffix(suffix)
            .and_then(|n| n.strip_suffix('.'))
            .and_then(|n| n.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
        if let Some((first, last)) = parsed {
            out.push((first, last, dir.join(&name)));
        }
    }
    out.sort();
    Ok(out)
}

/// The name of an LSN-range file.
pub(super) fn range_name(first: u64, last: u64, suffix: &str) -> String {
    format!("{first:020}-{last:020}.{suffix}")
}

/// Total bytes of every file in the spool directory: what counts against
/// `spool.max_size`.
pub(super) fn dir_bytes(storage: &dyn Storage, dir: &Path) -> io::Result<u64> {
    Ok(storage.list(dir)?.iter().map(|(_, len)| len).sum())
}

/// What reading a segment's stream gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Chunk {
    /// This many bytes were appended.
    Data(usize),
    /// A compressed frame that does not decompress (or fails its checksum)
    /// was skipped: the stream goes on with the next one.
    Lost,
    /// Nothing more for now (a plain segment may still grow).
    End,
}

/// A segment's bytes as written, decompressed on the way.
pub(super) enum Source {
    Plain(Box<dyn ReadFile>),
    Framed(Frames),
    /// A compressed segment of an earlier version (one frame); `None` once
    /// it failed to decompress.
    Legacy(Option<Box<zstd::stream::read::Decoder<'static, io::BufReader<Peeked>>>>),
}

/// A file with its first bytes read already.
pub(super) struct Peeked(io::Chain<io::Cursor<Vec<u8>>, Box<dyn ReadFile>>);

impl Read for Peeked {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

/// Reads up to 64 KiB at a time.
const READ_BYTES: usize = 64 * 1024;

impl Source {
    /// Opens the segment at `path`.
    pub(super) fn open(storage: &dyn Storage, path: &Path) -> io::Result<Source> {
        let mut file = storage.open_read(path)?;
        if !is_compressed(path) {
            return Ok(Source::Plain(file));
        }
        let mut head = vec![0u8; ZSTD_MAGIC.len()];
        let n = read_up_to(file.as_mut(), &mut head)?;
        head.truncate(n);
        let peeked = Peeked(io::Cursor::new(head.clone()).chain(file));
        // Earlier versions wrote one zstd frame; this one opens with a
        // skippable frame (or what damage left of it).
        if head != ZSTD_MAGIC {
            return Ok(Source::Framed(Frames::new(Box::new(peeked))));
        }
        let decoder = zstd::stream::read::Decoder::new(peeked)?;
        Ok(Source::Legacy(Some(Box::new(decoder))))
    }

    /// Appends the next bytes of the stream to `out`.
    pub(super) fn read_into(&mut self, out: &mut Vec<u8>) -> io::Result<Chunk> {
        match self {
            Source::Plain(f) => append_read(f.as_mut(), out),
            Source::Framed(frames) => frames.read_into(out),
            Source::Legacy(decoder) => {
                let Some(d) = decoder.as_mut() else {
                    return Ok(Chunk::End);
                };
                match append_read(d.as_mut(), out) {
                    Ok(c) => Ok(c),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Chunk::Data(0)),
                    // Not a readable zstd stream (any more).
                    Err(_) => {
                        *decoder = None;
                        Ok(Chunk::Lost)
                    }
                }
            }
        }
    }
}

fn read_up_to(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
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

fn append_read(r: &mut dyn Read, out: &mut Vec<u8>) -> io::Result<Chunk> {
    let start = out.len();
    out.resize(start + READ_BYTES, 0);
    let got = loop {
        match r.read(&mut out[start..]) {
            Ok(n) => break Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    out.truncate(start + *got.as_ref().unwrap_or(&0));
    match got? {
        0 => Ok(Chunk::End),
        n => Ok(Chunk::Data(n)),
    }
}

/// The largest compressed frame worth waiting for: one record of the
/// largest size and a frame's worth of others, incompressible.
fn max_frame() -> usize {
    zstd::zstd_safe::compress_bound(MAX_RECORD as usize + FRAME_BYTES)
}

/// The frames of a framed compressed segment, one at a time.
pub(super) struct Frames {
    file: Box<dyn ReadFile>,
    /// Compressed bytes read and not yet used, from `pos`.
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
    /// Nothing read yet (the header comes first).
    at_start: bool,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
}

impl Frames {
    fn new(file: Box<dyn ReadFile>) -> Frames {
        Frames {
            file,
            buf: Vec::new(),
            pos: 0,
            eof: false,
            at_start: true,
            decompressor: None,
        }
    }

    /// Reads more compressed bytes; false at the end of the file.
    fn fill(&mut self) -> io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        match append_read(self.file.as_mut(), &mut self.buf)? {
            Chunk::Data(_) => Ok(true),
            _ => {
                self.eof = true;
                Ok(false)
            }
        }
    }

    fn read_into(&mut self, out: &mut Vec<u8>) -> io::Result<Chunk> {
        loop {
            let rest = &self.buf[self.pos..];
            if rest.len() < 18 && self.fill()? {
                continue;
            }
            let rest = &self.buf[self.pos..];
            if rest.is_empty() {
                return Ok(Chunk::End);
            }
            if self.at_start && rest.len() >= FRAMED_HEADER.len() && rest[..4] == SKIPPABLE {
                // The header that says "framed": always ours, always this
                // long (its length field is not trusted: it may be what
                // rotted).
                self.pos += FRAMED_HEADER.len();
                self.at_start = false;
                continue;
            }
            self.at_start = false;
            if rest.starts_with(&ZSTD_MAGIC) {
                match zstd::zstd_safe::find_frame_compressed_size(rest) {
                    Ok(n) => {
                        let frame = &rest[..n];
                        let cap = zstd::zstd_safe::get_frame_content_size(frame)
                            .ok()
                            .flatten()
                            .filter(|c| *c <= max_frame() as u64);
                        let decoded = match cap {
                            Some(cap) => self.decompress(n, cap as usize),
                            None => None,
                        };
                        if let Some(data) = decoded {
                            self.pos += n;
                            out.extend_from_slice(&data);
                            return Ok(Chunk::Data(data.len()));
                        }
                    }
                    // Perhaps only cut short by what was read so far.
                    Err(_) if rest.len() < max_frame() && self.fill()? => continue,
                    Err(_) => {}
                }
            }
            // Not a frame that decompresses: go on at the next frame.
            self.skip_to_next_frame()?;
            return Ok(Chunk::Lost);
        }
    }

    fn decompress(&mut self, n: usize, cap: usize) -> Option<Vec<u8>> {
        if self.decompressor.is_none() {
            self.decompressor = zstd::bulk::Decompressor::new().ok();
        }
        let d = self.decompressor.as_mut()?;
        d.decompress(&self.buf[self.pos..self.pos + n], cap).ok()
    }

    /// Moves past the damaged frame at `pos` to the next zstd magic.
    fn skip_to_next_frame(&mut self) -> io::Result<()> {
        self.pos = (self.pos + 1).min(self.buf.len());
        loop {
            let rest = &self.buf[self.pos..];
            if let Some(at) = rest.windows(4).position(|w| w == ZSTD_MAGIC) {
                self.pos += at;
                return Ok(());
            }
            // Keep the last three bytes: a magic may straddle reads.
            self.pos = self.buf.len().saturating_sub(3).max(self.pos);
            if !self.fill()? {
                self.pos = self.buf.len();
                return Ok(());
            }
        }
    }
}

/// Writes whole records (as written) compressed in frames of about
/// [`FRAME_BYTES`], each cut at a record boundary, to a file.
pub(super) struct FrameWriter {
    compressor: zstd::bulk::Compressor<'static>,
    pending: Vec<u8>,
    file: Box<dyn AppendFile>,
    /// Bytes written to the file.
    pub(super) written: u64,
}

impl FrameWriter {
    pub(super) fn new(mut file: Box<dyn AppendFile>) -> io::Result<FrameWriter> {
        let mut compressor = zstd::bulk::Compressor::new(3)?;
        compressor.set_parameter(zstd::stream::raw::CParameter::ChecksumFlag(true))?;
        compressor.set_parameter(zstd::stream::raw::CParameter::ContentSizeFlag(true))?;
        write_all(file.as_mut(), FRAMED_HEADER)?;
        Ok(FrameWriter {
            compressor,
            pending: Vec::with_capacity(FRAME_BYTES * 2),
            file,
            written: FRAMED_HEADER.len() as u64,
        })
    }

    /// Adds one whole record.
    pub(super) fn record(&mut self, record: &[u8]) -> io::Result<()> {
        if !self.pending.is_empty() && self.pending.len() + record.len() > FRAME_BYTES {
            self.frame()?;
        }
        self.pending.extend_from_slice(record);
        Ok(())
    }

    /// Ends the frame being filled.
    fn frame(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            let c = self.compressor.compress(&self.pending)?;
            write_all(self.file.as_mut(), &c)?;
            self.written += c.len() as u64;
            self.pending.clear();
        }
        Ok(())
    }

    /// Writes the last frame and syncs the file.
    pub(super) fn finish(mut self) -> io::Result<u64> {
        self.frame()?;
        self.file.sync()?;
        Ok(self.written)
    }
}
