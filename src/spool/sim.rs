//! A simulated disk for the spool's property tests, behind the same
//! [`Storage`] seam as the real one (in the spirit of SQLite's test VFS and
//! TigerBeetle's simulated storage).
//!
//! Each file has the bytes the running system sees (its page cache) and
//! the bytes that survive a power cut (the disk). A write changes the
//! cache and marks its blocks dirty; a successful sync copies the dirty
//! blocks to the disk; a crash keeps the disk plus any subset of the dirty
//! blocks (a torn write at any offset). Directory entries (create, rename,
//! remove) survive a crash once the directory was synced. Faults come from
//! a seeded plan: EIO on any call, short writes, ENOSPC at a capacity, and
//! a failed sync that drops the dirty blocks and marks them clean, as
//! Linux does after a failed writeback, so the next sync "succeeds"
//! without the data. [`Sim::flip`] rots a bit on the disk.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::fs::{AppendFile, ReadFile, Storage};

/// Blocks are small, so torn writes land anywhere in a record.
const BLOCK: usize = 16;

/// How often each fault strikes (0 to 1), per call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Faults {
    /// A write, sync, truncate or directory call fails with EIO.
    pub eio: f64,
    /// A write writes only part of its buffer.
    pub short_write: f64,
    /// A sync fails and drops the data it should have written.
    pub lost_sync: f64,
}

#[derive(Debug, Default)]
struct File {
    cache: Vec<u8>,
    disk: Vec<u8>,
    dirty: BTreeSet<usize>,
}

#[derive(Debug)]
struct State {
    files: HashMap<u64, File>,
    names: BTreeMap<PathBuf, u64>,
    /// The names as of the last directory sync.
    durable_names: BTreeMap<PathBuf, u64>,
    next_inode: u64,
    faults: Faults,
    /// Bytes the files may hold in all (ENOSPC beyond).
    capacity: Option<u64>,
    rng: StdRng,
    /// Bumped at a crash: handles of the process that died stop working.
    generation: u64,
}

/// The simulated disk; clones share it.
#[derive(Debug, Clone)]
pub(crate) struct Sim(Arc<Mutex<State>>);

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

impl State {
    fn strike(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.gen_bool(p.min(1.0))
    }

    /// Bytes of the files that have a name (an unlinked file's space is
    /// let go at once here; it stays readable through open handles).
    fn used(&self) -> u64 {
        let named: BTreeSet<u64> = self.names.values().copied().collect();
        named
            .iter()
            .filter_map(|i| self.files.get(i))
            .map(|f| f.cache.len() as u64)
            .sum()
    }

    fn inode(&self, path: &Path) -> io::Result<u64> {
        self.names
            .get(path)
            .copied()
            .ok_or_else(|| io::ErrorKind::NotFound.into())
    }

    fn mark(file: &mut File, from: usize, to: usize) {
        if to > from {
            file.dirty.extend(from / BLOCK..=(to - 1) / BLOCK);
        }
    }
}

impl Sim {
    pub fn new(seed: u64) -> Sim {
        Sim(Arc::new(Mutex::new(State {
            files: HashMap::new(),
            names: BTreeMap::new(),
            durable_names: BTreeMap::new(),
            next_inode: 1,
            faults: Faults::default(),
            capacity: None,
            rng: StdRng::seed_from_u64(seed),
            generation: 0,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_faults(&self, faults: Faults) {
        self.state().faults = faults;
    }

    pub(crate) fn set_capacity(&self, bytes: Option<u64>) {
        self.state().capacity = bytes;
    }

    /// A power cut: every file keeps its disk bytes plus a random subset of
    /// its dirty blocks (and, at random, the length it had); directory
    /// changes since the last directory sync are kept or lost together.
    pub(crate) fn crash(&self) {
        let mut s = self.state();
        let s = &mut *s;
        s.generation += 1;
        s.faults = Faults::default();
        let keep_names = s.rng.gen_bool(0.5);
        if !keep_names {
            s.names = s.durable_names.clone();
        }
        s.durable_names = s.names.clone();
        for f in s.files.values_mut() {
            let keep_len = s.rng.gen_bool(0.5);
            let len = if keep_len {
                f.cache.len()
            } else {
                f.disk.len()
            };
            let mut disk = f.disk.clone();
            disk.resize(len.max(disk.len()), 0);
            for b in std::mem::take(&mut f.dirty) {
                if s.rng.gen_bool(0.5) {
                    let (from, to) = (b * BLOCK, ((b + 1) * BLOCK).min(f.cache.len()));
                    if from < to {
                        if disk.len() < to {
                            disk.resize(to, 0);
                        }
                        disk[from..to].copy_from_slice(&f.cache[from..to]);
                    }
                }
            }
            disk.truncate(len);
            f.disk = disk.clone();
            f.cache = disk;
        }
        s.files
            .retain(|inode, _| s.names.values().any(|i| i == inode));
    }

    /// Flips one bit of `path` on the disk (and in the cache: the page was
    /// read back from a rotting card).
    pub(crate) fn flip(&self, path: &Path, offset: usize, bit: u8) {
        let mut s = self.state();
        let inode = s.inode(path).expect("a file to rot");
        let f = s.files.get_mut(&inode).expect("its inode");
        f.disk[offset] ^= 1 << bit;
        f.cache[offset] ^= 1 << bit;
    }

    /// The bytes of `path` as the system sees them.
    pub(crate) fn contents(&self, path: &Path) -> Vec<u8> {
        let s = self.state();
        s.inode(path)
            .ok()
            .and_then(|i| s.files.get(&i))
            .map(|f| f.cache.clone())
            .unwrap_or_default()
    }

    /// Every file's name and length.
    pub(crate) fn files(&self) -> Vec<(PathBuf, usize)> {
        let s = self.state();
        s.names
            .iter()
            .map(|(p, i)| (p.clone(), s.files.get(i).map_or(0, |f| f.cache.len())))
            .collect()
    }
}

struct SimAppend {
    sim: Sim,
    inode: u64,
    generation: u64,
}

impl SimAppend {
    fn check(&self, s: &State) -> io::Result<()> {
        if s.generation != self.generation || !s.files.contains_key(&self.inode) {
            return Err(io::Error::other("a handle of a process that is gone"));
        }
        Ok(())
    }
}

impl AppendFile for SimAppend {
    fn overwrite(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut s = self.sim.state();
        self.check(&s)?;
        let faults = s.faults;
        if s.strike(faults.eio) {
            return Err(eio());
        }
        let f = s.files.get_mut(&self.inode).expect("checked");
        if f.cache.len() < buf.len() {
            f.cache.resize(buf.len(), 0);
        }
        f.cache[..buf.len()].copy_from_slice(buf);
        State::mark(f, 0, buf.len());
        Ok(())
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut s = self.sim.state();
        self.check(&s)?;
        let faults = s.faults;
        if s.strike(faults.eio) {
            return Err(eio());
        }
        let mut n = buf.len();
        if n > 1 && s.strike(faults.short_write) {
            n = s.rng.gen_range(1..n);
        }
        if let Some(cap) = s.capacity {
            let room = cap.saturating_sub(s.used()) as usize;
            if room == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            n = n.min(room);
        }
        let f = s.files.get_mut(&self.inode).expect("checked");
        let at = f.cache.len();
        f.cache.extend_from_slice(&buf[..n]);
        State::mark(f, at, at + n);
        Ok(n)
    }

    fn sync(&mut self) -> io::Result<()> {
        let mut s = self.sim.state();
        self.check(&s)?;
        let faults = s.faults;
        if s.strike(faults.lost_sync) {
            // The writeback failed: the pages are marked clean unwritten.
            s.files.get_mut(&self.inode).expect("checked").dirty.clear();
            return Err(eio());
        }
        if s.strike(faults.eio) {
            return Err(eio());
        }
        let f = s.files.get_mut(&self.inode).expect("checked");
        let len = f.cache.len();
        f.disk.resize(len, 0);
        for b in std::mem::take(&mut f.dirty) {
            let (from, to) = (b * BLOCK, ((b + 1) * BLOCK).min(len));
            if from < to {
                f.disk[from..to].copy_from_slice(&f.cache[from..to]);
            }
        }
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let mut s = self.sim.state();
        self.check(&s)?;
        let faults = s.faults;
        if s.strike(faults.eio) {
            return Err(eio());
        }
        let f = s.files.get_mut(&self.inode).expect("checked");
        let len = len as usize;
        let old = f.cache.len();
        f.cache.resize(len, 0);
        f.dirty.retain(|b| b * BLOCK < len);
        State::mark(f, len.min(old).saturating_sub(1), len.max(old).min(len + 1));
        Ok(())
    }
}

struct SimRead {
    sim: Sim,
    inode: u64,
    pos: usize,
}

impl io::Read for SimRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let s = self.sim.state();
        let Some(f) = s.files.get(&self.inode) else {
            return Ok(0);
        };
        let n = buf.len().min(f.cache.len().saturating_sub(self.pos));
        buf[..n].copy_from_slice(&f.cache[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Storage for Sim {
    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<(String, u64)>> {
        let s = self.state();
        Ok(s.names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, i)| {
                let name = p.file_name()?.to_str()?.to_string();
                Some((name, s.files.get(i).map_or(0, |f| f.cache.len() as u64)))
            })
            .collect())
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn AppendFile>> {
        let mut s = self.state();
        let inode = match s.names.get(path) {
            Some(i) => *i,
            None => {
                let i = s.next_inode;
                s.next_inode += 1;
                s.files.insert(i, File::default());
                s.names.insert(path.to_path_buf(), i);
                i
            }
        };
        Ok(Box::new(SimAppend {
            sim: self.clone(),
            inode,
            generation: s.generation,
        }))
    }

    fn open_read(&self, path: &Path) -> io::Result<Box<dyn ReadFile>> {
        let inode = self.state().inode(path)?;
        Ok(Box::new(SimRead {
            sim: self.clone(),
            inode,
            pos: 0,
        }))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut s = self.state();
        let inode = s.inode(path)?;
        let f = s.files.get_mut(&inode).expect("named");
        f.cache.truncate(len as usize);
        f.disk.truncate(len as usize);
        f.dirty.retain(|b| b * BLOCK < len as usize);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.state();
        let inode = s.inode(from)?;
        s.names.remove(from);
        s.names.insert(to.to_path_buf(), inode);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.inode(path)?;
        s.names.remove(path);
        Ok(())
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        let mut s = self.state();
        let faults = s.faults;
        if s.strike(faults.eio) {
            return Err(eio());
        }
        s.durable_names = s.names.clone();
        Ok(())
    }

    fn free_space(&self, _dir: &Path) -> Option<u64> {
        let s = self.state();
        s.capacity.map(|c| c.saturating_sub(s.used()))
    }
}
