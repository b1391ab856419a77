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

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use roaring::RoaringTreemap;

use super::log::sync_dir;

const SUFFIX: &str = ".dropped";

fn name(first: u64, last: u64) -> String {
    format!("{first:020}-{last:020}{SUFFIX}")
}

/// The tombstones in `dir`: (first LSN, last LSN, path), in LSN order.
fn list(dir: &Path) -> io::Result<Vec<(u64, u64, PathBuf)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        let parsed = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(SUFFIX))
            .and_then(|n| n.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
        if let Some((first, last)) = parsed {
            out.push((first, last, path));
        }
    }
    out.sort();
    Ok(out)
}

/// Writes the tombstone of `lsns` crash-safely (temporary file, fsync,
/// rename, fsync the directory) and returns its path; nothing when `lsns`
/// is empty.
pub(super) fn write(dir: &Path, lsns: &RoaringTreemap) -> io::Result<Option<PathBuf>> {
    let (Some(first), Some(last)) = (lsns.min(), lsns.max()) else {
        return Ok(None);
    };
    let path = dir.join(name(first, last));
    let tmp = path.with_extension("dropped.tmp");
    let mut w = BufWriter::new(File::create(&tmp)?);
    lsns.serialize_into(&mut w)?;
    w.flush()?;
    w.get_ref().sync_all()?;
    fs::rename(&tmp, &path)?;
    sync_dir(dir)?;
    Ok(Some(path))
}

fn read(path: &Path) -> io::Result<RoaringTreemap> {
    RoaringTreemap::deserialize_from(BufReader::new(File::open(path)?))
}

/// The tombstones' LSNs in `[from, to)`, in order.
pub(super) fn find(dir: &Path, from: u64, to: u64) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    if from >= to {
        return Ok(found);
    }
    for (first, last, path) in list(dir)? {
        if last < from || first >= to {
            continue;
        }
        match read(&path) {
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
pub(super) fn forget(dir: &Path, gone: &[u64]) -> io::Result<()> {
    let (Some(&lo), Some(&hi)) = (gone.first(), gone.last()) else {
        return Ok(());
    };
    for (first, last, path) in list(dir)? {
        if last < lo || first > hi {
            continue;
        }
        let mut lsns = match read(&path) {
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
        if write(dir, &lsns)?.as_ref() != Some(&path) {
            fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Deletes the tombstones wholly below `checkpoint` (and temporary files a
/// crash left), returning how many there are left.
pub(super) fn prune(dir: &Path, checkpoint: u64) -> io::Result<usize> {
    let mut left = 0;
    for (_, last, path) in list(dir)? {
        if last < checkpoint {
            fs::remove_file(&path)?;
        } else {
            left += 1;
        }
    }
    Ok(left)
}

/// Removes temporary tombstone files a crash left behind (at start).
pub(super) fn clean(dir: &Path) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        if path.to_str().is_some_and(|p| p.ends_with(".dropped.tmp")) {
            fs::remove_file(&path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_lsns_stay_until_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &(100..200).step_by(2).collect()).unwrap();
        write(dir.path(), &(300..310).collect()).unwrap();
        assert!(find(dir.path(), 0, 100).unwrap().is_empty());
        let found = find(dir.path(), 150, 305).unwrap();
        let expected: Vec<u64> = (150..200).step_by(2).chain(300..305).collect();
        assert_eq!(found, expected);
        assert_eq!(find(dir.path(), 150, 305).unwrap(), expected);
        forget(dir.path(), &found).unwrap();
        assert!(find(dir.path(), 150, 305).unwrap().is_empty());
        let rest: Vec<u64> = (100..150).step_by(2).chain(305..310).collect();
        assert_eq!(find(dir.path(), 0, u64::MAX).unwrap(), rest);
        forget(dir.path(), &rest).unwrap();
        assert!(
            list(dir.path()).unwrap().is_empty(),
            "emptied ones are gone"
        );
    }

    #[test]
    fn the_checkpoint_prunes_whole_tombstones_only() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &(100..200).collect()).unwrap();
        write(dir.path(), &(300..400).collect()).unwrap();
        assert_eq!(prune(dir.path(), 350).unwrap(), 1);
        assert_eq!(find(dir.path(), 0, u64::MAX).unwrap().len(), 100);
    }
}
