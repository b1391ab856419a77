//! Reading a segment record by record, past damage. Recovery, the reader,
//! the compressor and `drop_oldest`'s census all read segments through a
//! [`Scanner`], so they agree on what is a record and what is damage.
//!
//! A record whose length, checksum or body does not hold is not the end of
//! the segment: the scanner looks for the next intact record (a plausible
//! header, an LSN above the last one, a matching checksum) and reports the
//! bytes in between as one damaged [`Region`], with the LSNs on both sides
//! so the caller knows how many records it cost. Bytes at the end that are
//! not a whole record are a [`Item::Tail`]: a torn write, damage at the
//! very end, or (in the segment being appended to) a record still being
//! written; the tail is not consumed, so the next call sees it again with
//! whatever was appended meanwhile.

use std::io;
use std::path::Path;

use super::fs::Storage;
use super::segment::{Chunk, Source};
use crate::record::{describe, frame, plausible, Frame, Kinds};

/// The next intact record past damage is looked for among LSNs this close
/// to the last one.
const RESYNC_LSNS: u64 = 1 << 32;

/// While looking past damage, bytes already ruled out beyond this many are
/// let go (counted, not kept), so a long damaged stretch costs bounded
/// memory.
const KEEP_SCANNED: usize = 1 << 20;

/// Bytes that are not records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Region {
    /// Where they start in the segment's (decompressed) stream.
    pub offset: u64,
    /// How many bytes of the stream were skipped.
    pub bytes: u64,
    /// Compressed frames that did not decompress.
    pub lost_frames: u32,
    /// The LSN of the last intact record before them (the segment's first
    /// LSN minus one when none).
    pub after: u64,
    /// The LSN of the first intact record after them, when one was found.
    pub next: Option<u64>,
    /// What they held, when their record headers still chain.
    pub kinds: Option<Kinds>,
}

/// What the scanner found next.
#[derive(Debug)]
pub(super) enum Item<'a> {
    /// An intact record (as written) and its LSN.
    Record(&'a [u8], u64),
    /// Bytes that are not records; an intact record follows (the next item).
    Damage(Region),
    /// The end of what the stream holds now, on a record boundary.
    End,
    /// The stream ends (for now) in bytes that are not a whole record.
    Tail(Region),
}

pub(super) struct Scanner {
    source: Source,
    buf: Vec<u8>,
    pos: usize,
    /// Stream offset of `buf[pos]`.
    offset: u64,
    /// LSN of the last record returned.
    last: u64,
    /// Every LSN of the segment is below this (the next segment's first).
    upper: u64,
    /// Damage met since the last record, not yet reported.
    region: Option<Region>,
    /// The region so far is one stretch of bytes (its kinds can be read).
    one_stretch: bool,
}

impl Scanner {
    /// Scans the segment at `path`, whose first LSN is `first` and whose
    /// LSNs are all below `upper`.
    pub(super) fn open(
        storage: &dyn Storage,
        path: &Path,
        first: u64,
        upper: u64,
    ) -> io::Result<Scanner> {
        Ok(Scanner::new(Source::open(storage, path)?, first, upper))
    }

    pub(super) fn new(source: Source, first: u64, upper: u64) -> Scanner {
        Scanner {
            source,
            buf: Vec::new(),
            pos: 0,
            offset: 0,
            last: first.saturating_sub(1),
            upper,
            region: None,
            one_stretch: true,
        }
    }

    /// The stream offset of the next byte to scan (after a record: its end).
    pub(super) fn offset(&self) -> u64 {
        self.offset
    }

    pub(super) fn next(&mut self) -> io::Result<Item<'_>> {
        loop {
            match frame(&self.buf[self.pos..]) {
                Frame::Whole { len, lsn } if lsn > self.last && lsn < self.upper => {
                    if let Some(mut r) = self.region.take() {
                        r.next = Some(lsn);
                        self.one_stretch = true;
                        return Ok(Item::Damage(r));
                    }
                    let start = self.pos;
                    self.consume(len);
                    self.last = lsn;
                    return Ok(Item::Record(&self.buf[start..start + len], lsn));
                }
                Frame::Short => match self.more()?.0 {
                    Chunk::Data(_) => continue,
                    Chunk::Lost => {
                        self.lose_frame();
                        continue;
                    }
                    Chunk::End if self.pos == self.buf.len() => {
                        return Ok(match &self.region {
                            Some(r) => Item::Tail(r.clone()),
                            None => Item::End,
                        });
                    }
                    // Bytes that will not become a record (for now).
                    Chunk::End => {}
                },
                _ => {}
            }
            if !self.resync()? {
                let mut r = self.region.clone().unwrap_or_else(|| self.new_region());
                let rest = &self.buf[self.pos..];
                if self.one_stretch && r.bytes == 0 {
                    r.kinds = describe(rest);
                }
                r.bytes += rest.len() as u64;
                return Ok(Item::Tail(r));
            }
        }
    }

    fn new_region(&self) -> Region {
        Region {
            offset: self.offset,
            bytes: 0,
            lost_frames: 0,
            after: self.last,
            next: None,
            kinds: None,
        }
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
        self.offset += n as u64;
    }

    /// Counts the bytes from `pos` to `to` as damage and moves past them.
    fn skip_to(&mut self, to: usize) {
        let skipped = &self.buf[self.pos..to];
        let mut r = self.region.take().unwrap_or_else(|| self.new_region());
        r.kinds = match (self.one_stretch, r.bytes) {
            (true, 0) => describe(skipped),
            _ => None,
        };
        if r.bytes > 0 {
            self.one_stretch = false;
        }
        r.bytes += skipped.len() as u64;
        self.region = Some(r);
        self.consume(to - self.pos);
    }

    /// A compressed frame was lost: what is left of the one before it is
    /// damage too (frames hold whole records, so there is rarely any).
    fn lose_frame(&mut self) {
        let end = self.buf.len();
        if end > self.pos {
            self.skip_to(end);
        }
        let mut r = self.region.take().unwrap_or_else(|| self.new_region());
        r.lost_frames += 1;
        r.kinds = None;
        self.one_stretch = false;
        self.region = Some(r);
    }

    /// Reads more of the stream; returns what came and by how much the
    /// buffer's indexes moved down (consumed bytes are let go first).
    fn more(&mut self) -> io::Result<(Chunk, usize)> {
        let shift = self.pos;
        if shift > 0 {
            self.buf.drain(..shift);
            self.pos = 0;
        }
        Ok((self.source.read_into(&mut self.buf)?, shift))
    }

    /// Looks for the next intact record after `pos`. True: found, `pos` is
    /// on it and the bytes before it are in `region`. False: none follows
    /// in what the stream holds now (nothing more is consumed).
    fn resync(&mut self) -> io::Result<bool> {
        let lsns = self.last + 1..self.upper.min(self.last.saturating_add(RESYNC_LSNS));
        let mut q = self.pos + 1;
        loop {
            if q >= self.buf.len() {
                match self.more()? {
                    (Chunk::Data(_), shift) => q -= shift,
                    (Chunk::Lost, _) => {
                        // The next frame starts on a record.
                        self.lose_frame();
                        q = self.pos;
                    }
                    (Chunk::End, _) => return Ok(false),
                }
                continue;
            }
            if plausible(&self.buf[q..], &lsns) {
                match frame(&self.buf[q..]) {
                    Frame::Whole { lsn, .. } if lsns.contains(&lsn) => {
                        self.skip_to(q);
                        return Ok(true);
                    }
                    // A candidate that needs more bytes to tell.
                    Frame::Short => match self.more()? {
                        (Chunk::Data(_), shift) => {
                            q -= shift;
                            continue;
                        }
                        (Chunk::Lost, _) => {
                            self.lose_frame();
                            q = self.pos;
                            continue;
                        }
                        (Chunk::End, shift) => q -= shift,
                    },
                    _ => {}
                }
            }
            q += 1;
            if q - self.pos > KEEP_SCANNED {
                // Ruled out: count it, let it go.
                self.skip_to(q);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::sample;
    use crate::record::Record;

    fn plain(bytes: Vec<u8>) -> Source {
        Source::Plain(Box::new(io::Cursor::new(bytes)))
    }

    /// Everything a scan of `bytes` finds: records' LSNs, damage, the end.
    fn scan(bytes: Vec<u8>, first: u64) -> (Vec<u64>, Vec<Region>, Option<Region>) {
        let mut s = Scanner::new(plain(bytes), first, u64::MAX);
        let (mut lsns, mut damage) = (Vec::new(), Vec::new());
        loop {
            match s.next().unwrap() {
                Item::Record(_, lsn) => lsns.push(lsn),
                Item::Damage(r) => damage.push(r),
                Item::End => return (lsns, damage, None),
                Item::Tail(r) => return (lsns, damage, Some(r)),
            }
        }
    }

    fn encoded(records: &[Record]) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        for r in records {
            starts.push(bytes.len());
            r.encode_into(&mut bytes);
        }
        (bytes, starts)
    }

    #[test]
    fn a_flipped_bit_anywhere_costs_exactly_the_record_it_is_in() {
        let records: Vec<Record> = (100..110).map(sample).collect();
        let (bytes, starts) = encoded(&records);
        for at in 0..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x04;
            let hit = starts.iter().rposition(|s| *s <= at).unwrap() as u64;
            let (lsns, damage, tail) = scan(b, 100);
            let expect: Vec<u64> = (100..110).filter(|l| *l != 100 + hit).collect();
            assert_eq!(lsns, expect, "byte {at}");
            if hit == 9 {
                let t = tail.expect("the last record is a tail");
                assert_eq!((t.after, t.next), (108, None));
            } else {
                assert_eq!(damage.len(), 1, "byte {at}");
                let d = &damage[0];
                assert_eq!((d.after, d.next), (99 + hit, Some(101 + hit)));
                assert_eq!(d.offset, starts[hit as usize] as u64);
                // Its kind is still read, unless the flip hit its length
                // or its kind.
                let within = at - starts[hit as usize];
                if !(0..4).contains(&within) && within != 16 {
                    assert_eq!(d.kinds.as_ref().map(|k| k.samples), Some(1), "byte {at}");
                }
                assert!(tail.is_none());
            }
        }
    }

    #[test]
    fn garbage_between_records_is_one_region_and_a_torn_tail_is_not_consumed() {
        let records: Vec<Record> = (1..6).map(sample).collect();
        let (mut bytes, _) = encoded(&records[..2]);
        let garbage_at = bytes.len();
        bytes.extend(std::iter::repeat_n(0xAB, 5000));
        let (rest, _) = encoded(&records[2..]);
        bytes.extend_from_slice(&rest);
        // Half a record at the end.
        let torn = sample(6).encode();
        bytes.extend_from_slice(&torn[..torn.len() / 2]);
        let (lsns, damage, tail) = scan(bytes, 1);
        assert_eq!(lsns, vec![1, 2, 3, 4, 5]);
        assert_eq!(damage.len(), 1);
        assert_eq!(damage[0].offset, garbage_at as u64);
        assert_eq!(damage[0].bytes, 5000);
        assert_eq!((damage[0].after, damage[0].next), (2, Some(3)));
        let tail = tail.unwrap();
        assert_eq!(tail.bytes as usize, torn.len() / 2);
        assert_eq!(tail.after, 5);
    }

    /// A source that hands out its bytes in pieces, the way a file being
    /// appended to grows.
    struct Growing(std::sync::Arc<std::sync::Mutex<(Vec<u8>, usize)>>);

    impl io::Read for Growing {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let mut g = self.0.lock().unwrap();
            let (bytes, at) = &mut *g;
            let n = buf.len().min(bytes.len() - *at);
            buf[..n].copy_from_slice(&bytes[*at..*at + n]);
            *at += n;
            Ok(n)
        }
    }

    #[test]
    fn a_record_still_being_written_is_read_once_it_is_whole() {
        let shared = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), 0)));
        let mut s = Scanner::new(
            Source::Plain(Box::new(Growing(shared.clone()))),
            1,
            u64::MAX,
        );
        let (bytes, _) = encoded(&(1..4).map(sample).collect::<Vec<_>>());
        let mut got = Vec::new();
        for cut in [5, 30, 31, bytes.len() - 1, bytes.len()] {
            shared.lock().unwrap().0 = bytes[..cut].to_vec();
            loop {
                match s.next().unwrap() {
                    Item::Record(_, lsn) => got.push(lsn),
                    Item::End | Item::Tail(_) => break,
                    Item::Damage(d) => panic!("no damage: {d:?}"),
                }
            }
        }
        assert_eq!(got, vec![1, 2, 3]);
    }
}
