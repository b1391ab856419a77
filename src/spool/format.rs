//! The spool's format version: the file `format` in the spool's
//! directory, one line, `palletd spool format N`.
//!
//! A version is the set of record kinds and side files a palletd writes
//! ([`crate::record`], `message-ids`, `retained`, ...). A palletd reads
//! every spool of its version or older (a spool without the file was made
//! before versions were kept: version 1), and writes its own version into
//! the file before it appends anything, so an older palletd started on the
//! spool later finds it. A spool of a newer version is refused before
//! anything in it is read or changed: its records may be of kinds this
//! palletd would take for damage, and count as lost. The daemon exits 78
//! with the versions in the message; the spool is left as it was, for the
//! newer palletd (or a downgrade path it documents).
//!
//! Versions:
//! 1. everything before the file (samples, dead letters, message ids,
//!    Sparkplug B changes);
//! 2. adds the retained-value digests (record kind 5, a message identity
//!    record's topic key, the file `retained`) and what was learned of
//!    the broker (the file `mqtt-broker`).

use std::io;
use std::path::Path;

use super::fs::{read_all, replace, Storage};

/// The version this palletd writes (and the newest it reads).
pub(crate) const CURRENT: u32 = 2;

/// The file's name in the spool's directory.
pub(crate) const FILE_NAME: &str = "format";

const PREFIX: &str = "palletd spool format ";

/// A spool written by a newer palletd.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the spool in {dir} has format version {found}, newer than this palletd reads ({CURRENT}): it was written by a newer palletd. Run that version (or the newer one's documented downgrade) on it; this palletd leaves it untouched")]
pub struct Newer {
    pub dir: String,
    pub found: u32,
}

/// The version of the spool in `dir`: 1 when the file is missing (a spool
/// from before versions were kept, or a new one).
pub(crate) fn read(storage: &dyn Storage, dir: &Path) -> io::Result<u32> {
    let bytes = match read_all(storage, &dir.join(FILE_NAME)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(1),
        Err(e) => return Err(e),
    };
    let text = String::from_utf8_lossy(&bytes);
    text.trim()
        .strip_prefix(PREFIX)
        .and_then(|n| n.trim().parse::<u32>().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: not a spool format file (expected {PREFIX:?} and a number, found {:?})",
                    dir.join(FILE_NAME).display(),
                    text.chars().take(64).collect::<String>()
                ),
            )
        })
}

/// Refuses a spool of a newer version ([`Newer`], carried in the
/// `io::Error`), else makes its file say [`CURRENT`].
pub(crate) fn check_and_claim(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    let found = read(storage, dir)?;
    if found > CURRENT {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            Newer {
                dir: dir.display().to_string(),
                found,
            },
        ));
    }
    if found < CURRENT || !storage.list(dir)?.iter().any(|(n, _)| n == FILE_NAME) {
        replace(
            storage,
            dir,
            FILE_NAME,
            format!("{PREFIX}{CURRENT}\n").as_bytes(),
        )?;
    }
    Ok(())
}

/// The [`Newer`] an error of [`check_and_claim`] carries, if it is one.
pub fn newer(e: &io::Error) -> Option<&Newer> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<Newer>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spool_takes_this_version_and_a_newer_one_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let storage = super::super::fs::os();
        assert_eq!(read(storage.as_ref(), dir.path()).unwrap(), 1, "no file: 1");
        check_and_claim(storage.as_ref(), dir.path()).unwrap();
        assert_eq!(read(storage.as_ref(), dir.path()).unwrap(), CURRENT);
        let file = dir.path().join(FILE_NAME);
        std::fs::write(&file, format!("{PREFIX}{}\n", CURRENT + 1)).unwrap();
        let e = check_and_claim(storage.as_ref(), dir.path()).unwrap_err();
        assert_eq!(newer(&e).map(|n| n.found), Some(CURRENT + 1), "{e}");
        assert!(e.to_string().contains("newer than this palletd reads"));
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("{PREFIX}{}\n", CURRENT + 1),
            "left as it was"
        );
        std::fs::write(&file, "garbage").unwrap();
        let e = check_and_claim(storage.as_ref(), dir.path()).unwrap_err();
        assert!(newer(&e).is_none() && e.to_string().contains("not a spool format file"));
    }
}
