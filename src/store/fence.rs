//! The write fence across restarts: `<spool.dir>/write-fence` holds a
//! wall-clock time (ms since the epoch, as text) by which every write
//! command palletd has sent has been applied or cut off by the server
//! (each carries `maxTimeMS` = `mongodb.write_time_limit`). Before a write
//! is sent the file is made to cover its end (the limit plus a margin),
//! fsynced, at most once per [`SLACK`] of writing; a start reads it and
//! waits only until then (and never longer than the limit plus the margin)
//! before reading what an interrupted write applied
//! ([`super::mongo::Mongo::wait_for_fence`]). A missing, empty or
//! unreadable file (a first start, a crash while it was rewritten) means a
//! write of the run before may still be running: the whole wait.
//!
//! It trusts the wall clock across a restart: a clock stepped forward by
//! more than the wait could cut it short (NTP slews rather than steps).

use std::path::PathBuf;

/// How far beyond what the current write needs the file is moved, so a
/// busy pipeline rewrites it about once per this much time.
pub(crate) const SLACK_MS: i64 = 2_000;

/// The fence file of one spool.
#[derive(Debug)]
pub(crate) struct FenceFile {
    path: PathBuf,
    /// What the file holds (`i64::MIN` when it holds nothing valid).
    until_ms: i64,
}

impl FenceFile {
    /// Opens `path` (not created until the first write).
    pub(crate) fn open(path: PathBuf) -> FenceFile {
        // Only a whole line counts: a write torn by a crash leaves a prefix
        // of the number (or zeros), never its newline.
        let until_ms = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.strip_suffix('\n')?.parse().ok())
            .unwrap_or(i64::MIN);
        FenceFile { path, until_ms }
    }

    /// Until when (wall ms) a write of the run before may still run, if
    /// the file says.
    pub(crate) fn stored(&self) -> Option<i64> {
        (self.until_ms != i64::MIN).then_some(self.until_ms)
    }

    /// Whether a write that may run until `end_ms` needs the file moved.
    pub(crate) fn needs(&self, end_ms: i64) -> bool {
        self.until_ms < end_ms
    }

    /// Makes the file cover `end_ms` (plus [`SLACK_MS`]), durably. Blocking
    /// file I/O: call it off the async threads.
    pub(crate) fn cover(&mut self, end_ms: i64) -> std::io::Result<()> {
        use std::io::Write;
        let until = end_ms.saturating_add(SLACK_MS);
        let mut f = std::fs::File::create(&self.path)?;
        f.write_all(format!("{until}\n").as_bytes())?;
        f.sync_data()?;
        self.until_ms = until;
        Ok(())
    }
}

impl FenceFile {
    /// After a failed [`FenceFile::cover`]: removes the file (best effort;
    /// a file `cover` truncated reads as nothing anyway) so no start trusts
    /// an old time, and stops moving it for this run.
    pub(crate) fn forget(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        self.until_ms = i64::MAX;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What one run writes the next reads back; anything else in the file
    /// (a crash between truncating and writing it) reads as nothing, so the
    /// next start waits the whole limit.
    #[test]
    fn the_next_run_reads_what_this_one_covered_and_nothing_from_a_torn_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("write-fence");
        let mut f = FenceFile::open(path.clone());
        assert_eq!(f.stored(), None);
        assert!(f.needs(1_000));
        f.cover(1_000).unwrap();
        assert!(!f.needs(1_000 + SLACK_MS));
        assert!(f.needs(1_001 + SLACK_MS));
        assert_eq!(
            FenceFile::open(path.clone()).stored(),
            Some(1_000 + SLACK_MS)
        );
        for torn in ["", "17964", "\0\0\0\0", "x\n", "9999999999999999999999\n"] {
            std::fs::write(&path, torn).unwrap();
            assert_eq!(FenceFile::open(path.clone()).stored(), None, "{torn:?}");
        }
    }
}
