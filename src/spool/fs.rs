//! The file layer under the spool. Every file operation the spool makes
//! (appender, recovery, reader, checkpoint, tombstones, damage markers, the
//! spool id) goes through [`Storage`], so the property tests can run the
//! real code over a simulated disk that fails on purpose and loses what was
//! not synced (the tests' `sim`, in the style of SQLite's test VFS), while
//! palletd runs it over the operating system's files ([`Os`]).
//!
//! The seam is deliberately small: append-only files (written, synced,
//! cut back), files read from the start, and the directory operations.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;

/// A directory of files, as the spool uses it.
pub trait Storage: Send + Sync + std::fmt::Debug {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The files in `dir`: (file name, length), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<(String, u64)>>;
    /// Opens `path` for appending, creating it when missing.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>>;
    /// Opens `path` for reading from its start.
    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>>;
    /// Cuts `path` to `len` bytes and syncs it.
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the directory's entries (files created, renamed, removed)
    /// durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Bytes free for an unprivileged writer on the filesystem of `dir`
    /// (`None`: unknown).
    fn free_space(&self, dir: &Path) -> Option<u64>;
}

/// A file opened for appending.
pub trait AppendFile: Send {
    /// Appends some of `buf` (a short write is allowed, as `write(2)`).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize>;
    /// Makes what was written durable (`fdatasync`).
    fn sync(&mut self) -> io::Result<()>;
    /// Cuts the file (or extends it with zeros) to `len`; appends go on
    /// from there.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Writes `buf` over the start of the file, in place (a small file
    /// rewritten often: no block freed and allocated again); appends go on
    /// after it.
    fn overwrite(&mut self, buf: &[u8]) -> io::Result<()>;
}

/// A file opened for reading.
pub trait ReadFile: Read + Send {}

impl<T: Read + Send> ReadFile for T {}

/// The operating system's files.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Os;

/// The operating system's files, as a shared [`Storage`].
pub(crate) fn os() -> Arc<dyn Storage> {
    Arc::new(Os)
}

/// A file appended to with positioned writes (`pwrite`) at the end the
/// spool keeps track of: only the spool writes that way, so a fault
/// injected into `pwrite` (libfiu's `posix/io/rw/pwrite`, in the
/// end-to-end tests) hits the spool's files and nothing else of palletd
/// (sockets and the runtime's wake-ups use `write`).
struct OsFile {
    file: File,
    end: u64,
}

impl AppendFile for OsFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.write_at(buf, self.end)?;
        self.end += n as u64;
        Ok(n)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        self.end = len;
        Ok(())
    }

    fn overwrite(&mut self, buf: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(buf, 0)?;
        self.end = self.end.max(buf.len() as u64);
        Ok(())
    }
}

impl Storage for Os {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        for e in fs::read_dir(dir)? {
            let e = e?;
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            match e.metadata() {
                Ok(m) if m.is_file() => out.push((name, m.len())),
                Ok(_) => {}
                // Removed between the listing and the look at it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        let end = file.metadata()?.len();
        Ok(Box::new(OsFile { file, end }))
    }

    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        Ok(Box::new(File::open(path)?))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(len)?;
        f.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn free_space(&self, dir: &Path) -> Option<u64> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is a valid C string and `st` a writable statvfs.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return None;
        }
        Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }
}

/// Writes all of `buf`, going on after short writes and interruptions.
pub(crate) fn write_all(f: &mut dyn AppendFile, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match f.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The whole content of a (small) file.
pub(crate) fn read_all(storage: &dyn Storage, path: &Path) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    storage.open_read(path)?.read_to_end(&mut out)?;
    Ok(out)
}

/// Puts `bytes` in place as `dir/name` crash-safely: a temporary file,
/// written and synced, renamed over the old one, the directory synced. A
/// crash leaves the old content or the new, never a mix.
pub(crate) fn replace(
    storage: &dyn Storage,
    dir: &Path,
    name: &str,
    bytes: &[u8],
) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let written = (|| {
        // A leftover of an earlier attempt would be appended to.
        match storage.remove(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut f = storage.open_append(&tmp)?;
        write_all(f.as_mut(), bytes)?;
        f.sync()?;
        storage.rename(&tmp, &dir.join(name))?;
        storage.sync_dir(dir)
    })();
    if written.is_err() {
        let _ = storage.remove(&tmp);
    }
    written
}

/// Removes `path`; one that is already gone counts as removed.
pub(crate) fn remove_if_there(storage: &dyn Storage, path: &Path) -> io::Result<()> {
    match storage.remove(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
