//! Tombstones of the segments `spool.when_full = "drop_oldest"` deleted.
//!
//! When the appender deletes a segment to make room, the readings in it
//! that were not confirmed yet are not all lost: the pipeline may still
//! hold some in memory and write them. Which ones are really lost is only
//! known when the pipeline needs one and finds it gone. So before deleting
//! the segment the appender writes its tombstone, `<first>-<last>.dropped`:
//! the LSNs of the sample records at or above the checkpoint, as a
//! compressed bitmap (the roaring crate; about one bit per LSN, a few
//! kilobytes per megabyte of segment). A [`super::Reader`] that reads
//! across the hole finds the LSNs of its range in the tombstones and hands
//! them to the pipeline, which counts those it still needed and then has
//! them [`forget`]: each is counted once, when it is found missing, and
//! none that was written is. (One the pipeline did not need, say a refused
//! sample waiting in memory as a dead letter, stays until the checkpoint
//! passes it: after a crash it may be needed after all.) A tombstone goes
//! when the checkpoint passes its last LSN or its last LSN is forgotten.

use std::io;
use std::path::{Path, PathBuf};

use roaring::RoaringTreemap;

use super::fs::{read_all, remove_if_there, replace, Storage};
use super::segment::{list_ranges, range_name};

const SUFFIX: &str = "dropped";

/// The tombstones in `dir`: (first LSN, last LSN, path), in LSN order.
fn list(storage: &dyn Storage, dir: &Path) -> io::Result<Vec<(u64, u64, PathBuf)>> {
    list_ranges(storage, dir, SUFFIX)
}

/// Writes the tombstone of `lsns` crash-safely (see [`replace`]) and
/// returns its path; nothing when `lsns` is empty.
pub(super) fn write(
    storage: &dyn Storage,
    dir: &Path,
    lsns: &RoaringTreemap,
) -> io::Result<Option<PathBuf>> {
    let (Some(first), Some(last)) = (lsns.min(), lsns.max()) else {
        return Ok(None);
    };
    let name = range_name(first, last, SUFFIX);
    let mut bytes = Vec::with_capacity(lsns.serialized_size());
    lsns.serialize_into(&mut bytes)?;
    replace(storage, dir, &name, &bytes)?;
    Ok(Some(dir.join(name)))
}

fn read(storage: &dyn Storage, path: &Path) -> io::Result<RoaringTreemap> {
    RoaringTreemap::deserialize_from(&read_all(storage, path)?[..])
}

/// The tombstones' LSNs in `[from, to)`, in order.
pub(super) fn find(storage: &dyn Storage, dir: &Path, from: u64, to: u64) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    if from >= to {
        return Ok(found);
    }
    for (first, last, path) in list(storage, dir)? {
        if last < from || first >= to {
            continue;
        }
        match read(storage, &path) {
            Ok(lsns) => found.extend(
                lsns.iter()
                    .skip_while(|l| *l < from)
                    .take_while(|l| *l < to),
            ),
            // Deleted by the checkpoint meanwhile: nothing in it is needed.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(found)
}

/// Takes `gone` (in order) out of the tombstones; one emptied is deleted.
pub(super) fn forget(storage: &dyn Storage, dir: &Path, gone: &[u64]) -> io::Result<()> {
    let (Some(&lo), Some(&hi)) = (gone.first(), gone.last()) else {
        return Ok(());
    };
    for (first, last, path) in list(storage, dir)? {
        if last < lo || first > hi {
            continue;
        }
        let mut lsns = match read(storage, &path) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let before = lsns.len();
        for l in gone {
            lsns.remove(*l);
        }
        if lsns.len() == before {
            continue;
        }
        // The rest is written before the old one goes: a crash between the
        // two counts the forgotten ones again rather than losing the rest.
        if write(storage, dir, &lsns)?.as_ref() != Some(&path) {
            remove_if_there(storage, &path)?;
        }
    }
    Ok(())
}

/// Deletes the tombstones wholly below `checkpoint`, returning how many
/// there are left.
pub(super) fn prune(storage: &dyn Storage, dir: &Path, checkpoint: u64) -> io::Result<usize> {
    let mut left = 0;
    for (_, last, path) in list(storage, dir)? {
        if last < checkpoint {
            remove_if_there(storage, &path)?;
        } else {
            left += 1;
        }
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_lsns_stay_until_forgotten() {
        let os = super::super::fs::Os;
        let storage: &dyn Storage = &os;
        let dir = tempfile::tempdir().unwrap();
        write(storage, dir.path(), &(100..200).step_by(2).collect()).unwrap();
        write(storage, dir.path(), &(300..310).collect()).unwrap();
        assert!(find(storage, dir.path(), 0, 100).unwrap().is_empty());
        let found = find(storage, dir.path(), 150, 305).unwrap();
        let expected: Vec<u64> = (150..200).step_by(2).chain(300..305).collect();
        assert_eq!(found, expected);
        assert_eq!(find(storage, dir.path(), 150, 305).unwrap(), expected);
        forget(storage, dir.path(), &found).unwrap();
        assert!(find(storage, dir.path(), 150, 305).unwrap().is_empty());
        let rest: Vec<u64> = (100..150).step_by(2).chain(305..310).collect();
        assert_eq!(find(storage, dir.path(), 0, u64::MAX).unwrap(), rest);
        forget(storage, dir.path(), &rest).unwrap();
        assert!(
            list(storage, dir.path()).unwrap().is_empty(),
            "emptied ones are gone"
        );
    }

    #[test]
    fn the_checkpoint_prunes_whole_tombstones_only() {
        let os = super::super::fs::Os;
        let storage: &dyn Storage = &os;
        let dir = tempfile::tempdir().unwrap();
        write(storage, dir.path(), &(100..200).collect()).unwrap();
        write(storage, dir.path(), &(300..400).collect()).unwrap();
        assert_eq!(prune(storage, dir.path(), 350).unwrap(), 1);
        assert_eq!(find(storage, dir.path(), 0, u64::MAX).unwrap().len(), 100);
    }
}
