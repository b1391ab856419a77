//! Reading records back in LSN order, across segments, while the appender
//! writes the newest one and the compressor swaps closed ones.
//!
//! A read returns the records of a range as written and says how far the
//! range is complete ([`Read::complete_to`]): every LSN below that was
//! returned, or is known to be absent (confirmed and deleted, dropped by
//! `drop_oldest` and reported missing, or lost to damage and counted). A
//! record still being written at the end of the newest segment is never
//! half consumed: the scanner leaves it for the next read.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use super::damage::{self, Damage};
use super::fs::Storage;
use super::scan::{Item, Region, Scanner};
use super::segment::list_segments;
use super::tombstone;

/// What one read gave.
#[derive(Debug, Default)]
pub struct Read {
    /// The records, as written (see [`super::parse`]).
    pub bytes: Vec<u8>,
    /// How many.
    pub records: usize,
    /// Every LSN below this has been returned (now or by an earlier read)
    /// or is absent for good.
    pub complete_to: u64,
}

/// Why a read stopped at a place of its segment.
enum Stop {
    /// Damage, then more records.
    Damage(Region),
    /// The end of the segment, in a tail that is not a record or not.
    End(Option<Region>),
}

/// The segment being read.
struct Open {
    first: u64,
    path: PathBuf,
    scanner: Scanner,
}

/// Reads records in LSN order from the segment files.
pub struct Reader {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    open: Option<Open>,
    /// A record read at or past the last read's limit, for the next read.
    stash: Option<(u64, Vec<u8>)>,
    /// Next LSN wanted.
    next: u64,
    /// Sample LSNs the reads stepped over that `drop_oldest` deleted.
    missing: Vec<u64>,
}

impl Reader {
    pub fn new(storage: Arc<dyn Storage>, dir: PathBuf, from_lsn: u64) -> Reader {
        Reader {
            storage,
            dir,
            open: None,
            stash: None,
            next: from_lsn,
            missing: Vec::new(),
        }
    }

    /// The LSN the next read starts at.
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// The sample LSNs the reads so far stepped over because
    /// `spool.when_full = "drop_oldest"` deleted them (see
    /// [`super::tombstone`]; reported again until
    /// [`super::Spool::forget_lost`]).
    pub(crate) fn take_missing(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.missing)
    }

    /// Up to `max` records with `next <= lsn < limit`, in order. Blocking.
    pub(crate) fn read(&mut self, max: usize, limit: u64) -> io::Result<Read> {
        let start = self.next;
        let mut out = Read::default();
        let mut reached_limit = false;
        while out.records < max && self.next < limit {
            if let Some((lsn, bytes)) = self.stash.take() {
                if lsn >= limit {
                    self.stash = Some((lsn, bytes));
                    reached_limit = true;
                    break;
                }
                out.bytes.extend_from_slice(&bytes);
                out.records += 1;
                self.next = lsn + 1;
                continue;
            }
            if self.open.is_none() && !self.open_segment()? {
                // No segment holds anything from `next` on.
                reached_limit = true;
                break;
            }
            let Some(open) = self.open.as_mut() else {
                break;
            };
            let step = match open.scanner.next()? {
                Item::Record(bytes, lsn) if lsn >= limit => {
                    // Past the limit (not yet durable, or beyond the range
                    // asked for): kept for a later read.
                    self.stash = Some((lsn, bytes.to_vec()));
                    reached_limit = true;
                    break;
                }
                Item::Record(_, lsn) if lsn < self.next => continue,
                Item::Record(bytes, lsn) => {
                    out.bytes.extend_from_slice(bytes);
                    out.records += 1;
                    self.next = lsn + 1;
                    continue;
                }
                Item::Damage(region) => Stop::Damage(region),
                Item::End => Stop::End(None),
                Item::Tail(region) => Stop::End(Some(region)),
            };
            match step {
                Stop::Damage(region) => {
                    if let Some(d) = Damage::of(&open.path, &region, u64::MAX, self.next) {
                        damage::report(self.storage.as_ref(), &self.dir, &d);
                    }
                }
                Stop::End(tail) => {
                    let later = list_segments(self.storage.as_ref(), &self.dir)?
                        .into_iter()
                        .find(|(f, _)| *f > open.first);
                    let Some((later, _)) = later else {
                        // The newest segment: everything below the limit
                        // is durable, so it is before this end; a tail here
                        // is a record still being written.
                        reached_limit = true;
                        break;
                    };
                    if let Some(region) = tail {
                        // Damage to the end of a closed segment (what
                        // recovery cut or counted is not reported again).
                        if let Some(d) = Damage::of(&open.path, &region, later, self.next) {
                            damage::report(self.storage.as_ref(), &self.dir, &d);
                        }
                    }
                    self.open = None;
                    self.next = self.next.max(later);
                }
            }
        }
        out.complete_to = if reached_limit || self.next >= limit {
            limit
        } else {
            self.next
        };
        let gone = tombstone::find(self.storage.as_ref(), &self.dir, start, out.complete_to)?;
        self.missing.extend(gone);
        Ok(out)
    }

    /// [`Reader::read`], parsed into owned records (tests, tools).
    #[cfg(test)]
    pub(crate) fn read_records(
        &mut self,
        max: usize,
        limit: u64,
    ) -> io::Result<Vec<super::Record>> {
        let read = self.read(max, limit)?;
        Ok(super::parse(&read.bytes).map(|r| r.into_record()).collect())
    }

    /// Opens the segment holding `next` (or the first after it). A segment
    /// being compressed changes its name at any moment: listed again then.
    fn open_segment(&mut self) -> io::Result<bool> {
        let next = self.next;
        for attempt in 0.. {
            let segments = list_segments(self.storage.as_ref(), &self.dir)?;
            let at = segments.iter().rposition(|(f, _)| *f <= next).unwrap_or(0);
            let Some((first, path)) = segments.get(at).cloned() else {
                return Ok(false);
            };
            let upper = segments.get(at + 1).map_or(u64::MAX, |s| s.0);
            match Scanner::open(self.storage.as_ref(), &path, first, upper) {
                Ok(scanner) => {
                    self.next = self.next.max(first);
                    self.open = Some(Open {
                        first,
                        path,
                        scanner,
                    });
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < 3 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}
