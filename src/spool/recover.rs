//! Recovery: what opening a spool finds, after a clean stop, a crash, a
//! power cut or damage.
//!
//! Every segment is scanned (compressed ones decompressed on the way) with
//! the [`Scanner`], which skips damage and keeps every intact record after
//! it. What recovery does with what is not a record:
//! - In the middle of a segment, or at the end of one that is not the
//!   newest: damage. The records in between are lost; those at or above
//!   the checkpoint are counted and logged at ERROR ([`damage::report`]).
//!   Nothing is cut.
//! - At the end of the newest segment: a torn write (power lost while it
//!   was appended) when it starts within the last [`MAX_UNSYNCED`] bytes
//!   of the file (no more are ever unsynced) and at or above the durable
//!   LSN last recorded (`durable`, see [`checkpoint`]): those records were
//!   never acknowledged, the broker redelivers them, and the tail is cut
//!   off from the end of the last whole message before it (WARN). Anywhere
//!   else the bytes were synced by a commit that completed, whatever
//!   `durable` says (written without a sync, after a power cut it may lag,
//!   be missing or be damaged): damage, counted, and the intact records
//!   after it kept; and a cut never goes back past those bytes.
//! - A compression cut short leaves a temporary file (removed) or both
//!   forms of a segment (the compressed one is complete: it is renamed into
//!   place only once synced, so the plain one goes).
//!
//! The MQTT sessions' redelivery windows ([`crate::front::window`]) are
//! read from the `message-ids` file, then from the identity records still
//! in segments; the topics' last values ([`crate::front::retained`]) from
//! the `retained` file, then from the last-value records.
//!
//! The next LSN is above every LSN the spool ever handed out (the last
//! record, the checkpoint, the durable LSN) and not below the clock in
//! microseconds, so LSNs keep growing across a spool that was deleted.

use std::io;
use std::path::{Path, PathBuf};

use tracing::warn;

use super::appender::MAX_UNSYNCED;
use super::checkpoint;
use super::damage::{self, Damage};
use super::fs::{read_all, remove_if_there, Storage};
use super::identity;
use super::scan::{Item, Scanner};
use super::segment::{dir_bytes, is_compressed, list_segments, segment_name};
use crate::front::retained::{self, LastValues};
use crate::front::window::{self, Redelivery, Replay, Seen, Windows};
use crate::record::{parse, EntryRef, SessionId};
use crate::spool_ids::Tags;

/// What opening found.
#[derive(Debug)]
pub struct Recovery {
    /// First LSN to hand out.
    pub next_lsn: u64,
    /// Everything below this is in MongoDB.
    pub checkpoint: u64,
    /// Records at or above the checkpoint (to replay).
    pub records: u64,
    /// Bytes of all the spool's files.
    pub bytes: u64,
    /// Bytes cut from a torn tail.
    pub torn_bytes: u64,
    /// Records lost to damage found now (counted and logged).
    pub damaged: u64,
    /// Each MQTT session's last messages, by session key, for
    /// recognising the broker's redeliveries.
    pub windows: Windows,
    /// The last value taken in from each topic, for recognising the
    /// broker's retained copies.
    pub last_values: LastValues,
    /// The ids the spool's records were written under.
    pub tags: Tags,
    /// Segments before the last that are not compressed yet: (first LSN,
    /// path).
    pub uncompressed: Vec<(u64, PathBuf)>,
}

/// Opens (or creates) the spool directory and recovers its state; the
/// spool belongs to the box with fingerprint `machine`
/// ([`identity::machine_fingerprint`]); the sessions' windows are kept
/// as `redelivery` says, the last values of at most `topics` topics.
pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    machine: &str,
    redelivery: &Redelivery,
    topics: usize,
) -> io::Result<Recovery> {
    storage.create_dir_all(dir)?;
    // A newer palletd's spool is refused before anything in it changes.
    super::format::check_and_claim(storage, dir)?;
    let checkpoint = checkpoint::read(storage, dir);
    let durable = checkpoint::read_durable(storage, dir);
    remove_half_made(storage, dir)?;
    let segments = list_segments(storage, dir)?;
    let mut rec = Recovery::empty(checkpoint, redelivery.window);
    let mut replay = read_windows(storage, dir, redelivery.window);
    rec.last_values = read_last_values(storage, dir, topics);
    let mut last_lsn = None;
    // Records below this were acknowledged.
    let acknowledged = durable.max(checkpoint);
    for (i, (first, path)) in segments.iter().enumerate() {
        let newest = i + 1 == segments.len();
        let upper = segments.get(i + 1).map_or(u64::MAX, |s| s.0);
        let compressed = is_compressed(path);
        if !compressed && !newest {
            rec.uncompressed.push((*first, path.clone()));
        }
        let mut scanner = Scanner::open(storage, path, *first, upper)?;
        let mut lost = None;
        // Where a torn write is cut: after the last record that is a
        // message's identity (it goes last, so that message is whole) or
        // below the acknowledged LSN. What lies between that and the tear
        // is part of a message the broker sends again: kept, it would be
        // stored twice. (offset, records and last LSN there.)
        let mut keep = (0, rec.records, last_lsn);
        // Records that end here or before were synced by a commit that
        // completed (no more than MAX_UNSYNCED bytes are ever unsynced, and
        // commits sync at append boundaries): whole messages, kept.
        let committed = if newest && !compressed {
            file_len(storage, path)?.saturating_sub(MAX_UNSYNCED)
        } else {
            u64::MAX
        };
        loop {
            let at = scanner.offset();
            match scanner.next()? {
                Item::Record(bytes, lsn) => {
                    last_lsn = Some(lsn);
                    if lsn >= checkpoint {
                        rec.records += 1;
                    }
                    let entry = parse(bytes).next().map(|r| r.entry);
                    note_identity(entry, lsn, redelivery, &mut replay);
                    match entry {
                        Some(EntryRef::LastValue { topic, digest })
                        | Some(EntryRef::MessageId {
                            topic: Some(topic),
                            digest,
                            ..
                        }) => {
                            rec.last_values.take(topic, digest);
                        }
                        _ => {}
                    }
                    let end = at + bytes.len() as u64;
                    // A message ends with its identity, or after it with
                    // the last value it changed: no mark lies past a cut.
                    if matches!(
                        entry,
                        Some(EntryRef::MessageId { .. } | EntryRef::LastValue { .. })
                    ) || lsn < acknowledged
                        || end <= committed
                    {
                        keep = (end, rec.records, last_lsn);
                    }
                }
                // In the newest segment, in the bytes a power cut may have
                // caught unsynced and at or above the durable LSN: never
                // acknowledged, the first bad byte there is where a write
                // was torn (blocks reach the disk in any order, so intact
                // records may follow it); everything from there on is cut,
                // and the broker sends it again.
                Item::Damage(region) | Item::Tail(region)
                    if newest
                        && !compressed
                        && region.after + 1 >= acknowledged
                        && region.offset >= committed =>
                {
                    let (offset, records, last) = keep;
                    let cut = file_len(storage, path)?.saturating_sub(offset);
                    warn!(
                        segment = %path.display(),
                        offset,
                        torn_at = region.offset,
                        cut,
                        "Spool ends in a torn record (a write cut short by a power loss, never acknowledged: the broker sends it again); cutting it off from the end of the last whole message."
                    );
                    storage.truncate(path, offset)?;
                    rec.torn_bytes = cut;
                    rec.records = records;
                    last_lsn = last;
                    break;
                }
                Item::Damage(region) => {
                    rec.damaged +=
                        count(storage, dir, Damage::of(path, &region, upper, checkpoint));
                }
                Item::End => break,
                Item::Tail(region) => {
                    // Damage to the end: in the newest segment what was
                    // acknowledged of it, else all up to the next segment.
                    let end = if newest { acknowledged } else { upper };
                    lost = Damage::of(path, &region, end, checkpoint);
                    break;
                }
            }
        }
        rec.damaged += count(storage, dir, lost);
    }
    rec.windows = replay.finish();
    let now_us = crate::clock::now_us();
    rec.next_lsn = last_lsn
        .map_or(0, |l| l + 1)
        .max(checkpoint)
        .max(durable)
        .max(now_us);
    rec.tags = identity::open(
        storage,
        dir,
        machine,
        rec.next_lsn,
        checkpoint,
        rec.records > 0,
    )?;
    rec.bytes = dir_bytes(storage, dir)?;
    Ok(rec)
}

/// Removes what a crash left half made: temporary files of every kind,
/// and a plain segment whose compressed form is in place.
fn remove_half_made(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    for (name, _) in storage.list(dir)? {
        if name.ends_with(".tmp") {
            remove_if_there(storage, &dir.join(&name))?;
        }
    }
    for (first, path) in list_segments(storage, dir)? {
        let plain = dir.join(segment_name(first));
        if is_compressed(&path) {
            remove_if_there(storage, &plain)?;
        }
    }
    Ok(())
}

impl Recovery {
    /// Nothing recovered yet, from `checkpoint` on.
    fn empty(checkpoint: u64, window: usize) -> Recovery {
        Recovery {
            next_lsn: 0,
            checkpoint,
            records: 0,
            bytes: 0,
            torn_bytes: 0,
            damaged: 0,
            windows: Windows::new(window),
            last_values: LastValues::new(1),
            tags: Tags::new(0),
            uncompressed: Vec::new(),
        }
    }
}

/// A message's identity read back: into its session's redelivery window.
fn note_identity(
    entry: Option<EntryRef<'_>>,
    lsn: u64,
    redelivery: &Redelivery,
    replay: &mut Replay,
) {
    if let Some(EntryRef::MessageId {
        session,
        pkid,
        digest,
        ..
    }) = entry
    {
        let key = match session {
            SessionId::Key(k) => Some(k),
            SessionId::Index(i) => redelivery.by_index.get(i as usize).copied(),
        };
        if let Some(key) = key {
            replay.record(key, lsn, Seen { pkid, digest });
        }
    }
}

/// The windows' replay, from what the `message-ids` file carries (none
/// when it is missing; a damaged one is said and left out: the broker's
/// redeliveries of the messages it held may then be stored twice, none is
/// lost).
fn read_windows(storage: &dyn Storage, dir: &Path, cap: usize) -> Replay {
    let said = |e: &dyn std::fmt::Display| warn!(error = %e, "Cannot read the MQTT sessions' last message ids; a message the broker resends from before this start may be stored twice.");
    match read_all(storage, &dir.join(window::FILE_NAME)) {
        Ok(bytes) => Replay::new(cap, &bytes).unwrap_or_else(|e| {
            said(&e);
            Replay::empty(cap)
        }),
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                said(&e);
            }
            Replay::empty(cap)
        }
    }
}

/// The topics' last values as the `retained` file carries them (none
/// when it is missing; a damaged one is said and left out: a retained
/// copy of a value taken in before may then be stored again, none is
/// lost).
fn read_last_values(storage: &dyn Storage, dir: &Path, cap: usize) -> LastValues {
    let said = |e: &dyn std::fmt::Display| warn!(error = %e, "Cannot read the topics' last values; a retained value the broker sends again may be stored a second time.");
    match read_all(storage, &dir.join(retained::FILE_NAME)) {
        Ok(bytes) => LastValues::decode(cap, &bytes).unwrap_or_else(|e| {
            said(&e);
            LastValues::new(cap)
        }),
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                said(&e);
            }
            LastValues::new(cap)
        }
    }
}

/// Reports damage found (once) and returns the records it cost.
fn count(storage: &dyn Storage, dir: &Path, d: Option<Damage>) -> u64 {
    match d {
        Some(d) if damage::report(storage, dir, &d) => d.records(),
        _ => 0,
    }
}

/// The length of the file at `path`.
fn file_len(storage: &dyn Storage, path: &Path) -> io::Result<u64> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    Ok(storage
        .list(dir)?
        .into_iter()
        .find(|f| f.0 == name)
        .map_or(0, |f| f.1))
}
