//! The two small files that tell recovery where things stand, each an LSN
//! and its CRC32 (12 bytes):
//!
//! - `checkpoint`: everything below it is in MongoDB. Written crash-safely
//!   (temporary file, fsync, rename, fsync of the directory) after the
//!   segments it confirms were deleted, so a full disk never keeps palletd
//!   from freeing space.
//! - `durable`: the durable LSN the appender last published, so everything
//!   below it was acknowledged to the broker. Rewritten in place after each
//!   group commit without a sync (12 bytes in the page cache: it costs
//!   nothing on an SD card), and with one at a clean stop; after a power
//!   cut it may lag by the kernel's writeback delay (seconds). Recovery
//!   tells a torn tail (at or above it: never acknowledged, redelivered by
//!   the broker) from damage to acknowledged records (below it).

use std::io;
use std::path::Path;

use tracing::warn;

use super::fs::{read_all, replace, AppendFile, Storage};

const CHECKPOINT: &str = "checkpoint";
const DURABLE: &str = "durable";

fn encode(lsn: u64) -> [u8; 12] {
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&lsn.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..8]);
    bytes[8..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// The LSN in a 12-byte file; `None` when missing, `Some(Err)` when damaged.
fn decode(storage: &dyn Storage, path: &Path) -> Option<Result<u64, ()>> {
    let bytes = match read_all(storage, path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(_) => return Some(Err(())),
    };
    if bytes.len() != 12 {
        return Some(Err(()));
    }
    let lsn = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
    Some(if crc32fast::hash(&bytes[0..8]) == crc {
        Ok(lsn)
    } else {
        Err(())
    })
}

/// The stored checkpoint (0: none, or damaged: the whole spool is replayed
/// and resolved with the database).
pub(super) fn read(storage: &dyn Storage, dir: &Path) -> u64 {
    match decode(storage, &dir.join(CHECKPOINT)) {
        None => 0,
        Some(Ok(lsn)) => lsn,
        Some(Err(())) => {
            warn!("Spool checkpoint file is damaged; replaying the whole spool.");
            0
        }
    }
}

pub(super) fn write(storage: &dyn Storage, dir: &Path, lsn: u64) -> io::Result<()> {
    replace(storage, dir, CHECKPOINT, &encode(lsn))
}

/// The durable LSN last recorded (0: none, or damaged).
pub(super) fn read_durable(storage: &dyn Storage, dir: &Path) -> u64 {
    match decode(storage, &dir.join(DURABLE)) {
        Some(Ok(lsn)) => lsn,
        _ => 0,
    }
}

/// Keeps the `durable` file up to date.
pub(super) struct DurableFile {
    file: Option<Box<dyn AppendFile>>,
    written: u64,
}

impl DurableFile {
    pub(super) fn new() -> DurableFile {
        DurableFile {
            file: None,
            written: 0,
        }
    }

    /// Records `lsn` (synced when `sync`); on an error the next call tries
    /// again with a fresh handle.
    pub(super) fn record(
        &mut self,
        storage: &dyn Storage,
        dir: &Path,
        lsn: u64,
        sync: bool,
    ) -> io::Result<()> {
        if lsn == self.written && !sync {
            return Ok(());
        }
        let result = (|| {
            if self.file.is_none() {
                self.file = Some(storage.open_append(&dir.join(DURABLE))?);
            }
            let f = self.file.as_mut().expect("opened above");
            f.overwrite(&encode(lsn))?;
            if sync {
                f.sync()?;
                storage.sync_dir(dir)?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => self.written = lsn,
            Err(_) => self.file = None,
        }
        result
    }
}
