//! The spool's identity: `spool.id` (and its copy `spool.id.copy`), which
//! names this spool's records in MongoDB ([`crate::spool_ids`]).
//!
//! ```text
//! palletd spool id 2
//! id 1a2b3c4d
//! machine 5e6f7a8b9c0d1e2f5e6f7a8b9c0d1e2f
//! previous 0badf00d 1765432100000000
//! crc 89abcdef
//! ```
//!
//! - `id`: a random 32-bit id, chosen when the spool is made.
//! - `machine`: a fingerprint of the box the spool belongs to (a digest of
//!   `/etc/machine-id`, the device tree's serial number and the MAC
//!   addresses of the physical network interfaces, whichever exist). Only
//!   files the systemd unit leaves visible count, so palletd run by hand
//!   (`palletd spool ...`, a migration) and as the service read the same
//!   fingerprint: `/proc/cpuinfo`, which the unit's `ProcSubset=pid`
//!   hides, is not read (on a Raspberry Pi its `Serial` is the device
//!   tree's serial number anyway). Spools made outside the unit by an
//!   earlier version on a box whose `/proc/cpuinfo` has a `Serial` line
//!   take one renewal on the first start after the upgrade. A spool opened on a box with another fingerprint was copied
//!   there (edge boxes flashed from one image made after a first start,
//!   a directory restored on a new box): it takes a new id for what it
//!   spools from then on, so two boxes never write under one id, and keeps
//!   the old one for the records it already held (`previous`: the id and
//!   the LSN below which it applies), so those are still written exactly
//!   once. A fingerprint that changes for another reason (a network card
//!   added) costs only such a renewal.
//! - `previous` lines go once the checkpoint passed them.
//! - `crc`: CRC32 of the lines above. Both files are written crash-safely
//!   (temporary file, fsync, rename, fsync of the directory); an unreadable
//!   one is replaced by the other.
//!
//! The first version was one line, the id in hex; it is read, taken as
//! belonging to this box, and rewritten in this form.

use std::io;
use std::path::Path;

use tracing::{error, info, warn};

use super::fs::{read_all, replace, Storage};
use crate::spool_ids::Tags;

const FILES: [&str; 2] = ["spool.id", "spool.id.copy"];
const HEADER: &str = "palletd spool id 2";

/// What `spool.id` says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    id: u32,
    /// `None`: written by a version that did not record it.
    machine: Option<String>,
    previous: Vec<(u32, u64)>,
}

impl Identity {
    fn encode(&self) -> String {
        let mut text = format!("{HEADER}\nid {:08x}\n", self.id);
        if let Some(m) = &self.machine {
            text.push_str(&format!("machine {m}\n"));
        }
        for (id, below) in &self.previous {
            text.push_str(&format!("previous {id:08x} {below}\n"));
        }
        let crc = crc32fast::hash(text.as_bytes());
        text.push_str(&format!("crc {crc:08x}\n"));
        text
    }

    fn decode(text: &str) -> Option<Identity> {
        let legacy = text.trim();
        if legacy.len() == 8 {
            return Some(Identity {
                id: u32::from_str_radix(legacy, 16).ok()?,
                machine: None,
                previous: Vec::new(),
            });
        }
        let (body, crc) = text.trim_end().rsplit_once('\n')?;
        let crc = u32::from_str_radix(crc.strip_prefix("crc ")?, 16).ok()?;
        let body = format!("{body}\n");
        if crc32fast::hash(body.as_bytes()) != crc {
            return None;
        }
        let mut lines = body.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let mut out = Identity {
            id: 0,
            machine: None,
            previous: Vec::new(),
        };
        let mut has_id = false;
        for line in lines {
            let (key, value) = line.split_once(' ')?;
            match key {
                "id" => {
                    out.id = u32::from_str_radix(value, 16).ok()?;
                    has_id = true;
                }
                "machine" => out.machine = Some(value.to_string()),
                "previous" => {
                    let (id, below) = value.split_once(' ')?;
                    out.previous
                        .push((u32::from_str_radix(id, 16).ok()?, below.parse().ok()?));
                }
                _ => return None,
            }
        }
        has_id.then_some(out)
    }
}

/// A random id other than `taken` (and never 0, which older versions used
/// for an unreadable id).
fn fresh_id(taken: &[u32]) -> u32 {
    loop {
        let id: u32 = rand::random();
        if id != 0 && !taken.contains(&id) {
            return id;
        }
    }
}

/// The fingerprint of this box (see the module docs); stable across
/// restarts, users and the systemd unit's sandbox.
pub fn machine_fingerprint() -> String {
    fingerprint_under(Path::new("/"))
}

/// [`machine_fingerprint`] of the file tree under `root`.
fn fingerprint_under(root: &Path) -> String {
    let read = |p: &Path| {
        std::fs::read_to_string(root.join(p.strip_prefix("/").unwrap_or(p)))
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut parts = Vec::new();
    if let Some(id) =
        read(Path::new("/etc/machine-id")).or_else(|| read(Path::new("/var/lib/dbus/machine-id")))
    {
        parts.push(format!("machine-id {id}"));
    }
    if let Some(serial) = read(Path::new("/sys/firmware/devicetree/base/serial-number")) {
        parts.push(format!("serial {}", serial.trim_end_matches('\0')));
    }
    let mut macs: Vec<String> = std::fs::read_dir(root.join("sys/class/net"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("device").exists())
        .filter_map(|e| {
            std::fs::read_to_string(e.path().join("address"))
                .ok()
                .map(|s| s.trim().to_string())
        })
        .collect();
    macs.sort();
    parts.extend(macs.into_iter().map(|m| format!("mac {m}")));
    if parts.is_empty() {
        // A container without any of them: its hostname, at least.
        if let Some(host) = read(Path::new("/etc/hostname")) {
            parts.push(format!("host {host}"));
        }
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, parts.join("\n").as_bytes());
    digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Reads the spool's identity (making one for a new spool), renews it when
/// the spool was copied from another box, drops epochs the checkpoint
/// passed, and returns the ids of its records. `next_lsn`: every record in
/// the spool is below it; `holds_records`: the spool holds records at or
/// above the checkpoint.
pub(super) fn open(
    storage: &dyn Storage,
    dir: &Path,
    machine: &str,
    next_lsn: u64,
    checkpoint: u64,
    holds_records: bool,
) -> io::Result<Tags> {
    let mut found = None;
    let mut present = 0;
    let mut readable = 0;
    for name in FILES {
        match read_all(storage, &dir.join(name)) {
            Ok(bytes) => {
                present += 1;
                let parsed = std::str::from_utf8(&bytes).ok().and_then(Identity::decode);
                if let Some(p) = parsed {
                    readable += 1;
                    found.get_or_insert(p);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                present += 1;
                warn!(file = name, error = %e, "Cannot read the spool's id.");
            }
        }
    }
    let (mut identity, must_save) = match found {
        Some(mut identity) => {
            let mut must_save = false;
            match identity.machine.as_deref() {
                None => {
                    info!(
                        id = %format!("{:08x}", identity.id),
                        "The spool's id now records the box it belongs to."
                    );
                    identity.machine = Some(machine.to_string());
                }
                Some(m) if m == machine => {}
                Some(_) => {
                    let taken: Vec<u32> = std::iter::once(identity.id)
                        .chain(identity.previous.iter().map(|p| p.0))
                        .collect();
                    let old = identity.id;
                    if holds_records {
                        identity.previous.push((old, next_lsn));
                    }
                    identity.id = fresh_id(&taken);
                    identity.machine = Some(machine.to_string());
                    must_save = true;
                    warn!(
                        old_id = %format!("{old:08x}"),
                        new_id = %format!("{:08x}", identity.id),
                        kept_below_lsn = holds_records.then_some(next_lsn),
                        "This spool was made on another box (copied, or flashed from one image): it takes a new id for what it spools from now on, so no two boxes write under one id; its records so far keep the old one, so they are still written exactly once."
                    );
                }
            }
            (identity, must_save)
        }
        None => {
            if present > 0 || holds_records {
                error!(
                    dir = %dir.display(),
                    "The spool's id is missing or unreadable: palletd gives the spool a new one. Records of the spool that MongoDB already had (written before the last checkpoint moved) may be stored a second time."
                );
            }
            let identity = Identity {
                id: fresh_id(&[]),
                machine: Some(machine.to_string()),
                previous: Vec::new(),
            };
            (identity, true)
        }
    };
    let before = identity.previous.len();
    identity.previous.retain(|(_, below)| *below > checkpoint);
    let changed = must_save || identity.previous.len() != before || readable < FILES.len();
    if changed {
        let text = identity.encode();
        for name in FILES {
            let saved = replace(storage, dir, name, text.as_bytes());
            match saved {
                Ok(()) => {}
                // A new id must be on disk before anything is spooled under it.
                Err(e) if must_save => return Err(e),
                Err(e) => warn!(file = name, error = %e, "Cannot rewrite the spool's id."),
            }
        }
    }
    Ok(Tags::with_previous(identity.id, identity.previous))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_a_changed_byte_is_refused() {
        let id = Identity {
            id: 0x1a2b3c4d,
            machine: Some("abc".into()),
            previous: vec![(0x0badf00d, 1765432100000000)],
        };
        let text = id.encode();
        assert_eq!(Identity::decode(&text), Some(id));
        let bad = text.replace("1a2b", "1a2c");
        assert_eq!(Identity::decode(&bad), None);
        assert_eq!(
            Identity::decode("0badf00d\n").map(|i| (i.id, i.machine)),
            Some((0x0badf00d, None)),
            "the first version's file"
        );
    }

    #[test]
    fn the_fingerprint_is_stable() {
        assert_eq!(machine_fingerprint(), machine_fingerprint());
        assert_eq!(machine_fingerprint().len(), 32);
    }

    /// The systemd unit's `ProcSubset=pid` hides `/proc/cpuinfo`: a box's
    /// fingerprint must not depend on it, or a spool used both by hand and
    /// by the service renews its id at every switch.
    #[test]
    fn the_fingerprint_is_the_same_with_proc_hidden() {
        let root = tempfile::tempdir().unwrap();
        let write = |path: &str, text: &str| {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("etc/machine-id", "5e6f7a8b9c0d1e2f5e6f7a8b9c0d1e2f\n");
        write(
            "sys/firmware/devicetree/base/serial-number",
            "10000000abcdef01\0",
        );
        write("sys/class/net/eth0/address", "dc:a6:32:01:02:03\n");
        write("sys/class/net/eth0/device/vendor", "0x14e4\n");
        write("sys/class/net/lo/address", "00:00:00:00:00:00\n");
        write(
            "proc/cpuinfo",
            "processor\t: 0\nHardware\t: BCM2835\nSerial\t\t: 10000000abcdef01\nModel\t\t: Raspberry Pi 4\n",
        );
        let outside = fingerprint_under(root.path());
        std::fs::remove_dir_all(root.path().join("proc")).unwrap();
        let inside = fingerprint_under(root.path());
        assert_eq!(outside, inside, "the unit hides /proc/cpuinfo");
        // The parts that are read do count.
        write("sys/class/net/eth1/address", "dc:a6:32:01:02:04\n");
        write("sys/class/net/eth1/device/vendor", "0x14e4\n");
        assert_ne!(
            fingerprint_under(root.path()),
            inside,
            "a MAC address counts"
        );
        std::fs::remove_dir_all(root.path().join("sys/class/net/eth1")).unwrap();
        write(
            "sys/firmware/devicetree/base/serial-number",
            "10000000abcdef02\0",
        );
        assert_ne!(fingerprint_under(root.path()), inside, "the serial counts");
    }
}
