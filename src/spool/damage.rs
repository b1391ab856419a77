//! Damage to the spool (bit rot on an SD card, a failing disk): what it
//! cost, counted and said once.
//!
//! A [`super::scan::Scanner`] skips bytes that are not records and reports
//! the stretch with the LSNs on both sides; within a segment LSNs are
//! consecutive, so the gap is exactly the records lost (an upper bound if
//! they were not). Records below the checkpoint are in MongoDB already:
//! damage there costs nothing. For the rest, [`report`] logs an ERROR
//! (segment, offset, LSN range, what the records were and their sensors
//! when their headers can still be read), counts them in
//! `palletd_spool_damaged_records_total{kind}`, and leaves a marker
//! `<first>-<last>.damaged` so that a later read or restart meeting the
//! same damage does not count it again. Markers go when the checkpoint
//! passes them, like tombstones.

use std::io;
use std::path::{Path, PathBuf};

use tracing::{error, warn};

use super::fs::{replace, Storage};
use super::scan::Region;
use super::segment::{list_ranges, range_name};
use crate::record::Kinds;
use crate::telemetry;

const SUFFIX: &str = "damaged";

/// Records lost to damage in one stretch of one segment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Damage {
    pub segment: PathBuf,
    /// Where the damage starts in the segment's (decompressed) bytes.
    pub offset: u64,
    pub bytes: u64,
    pub lost_frames: u32,
    /// The LSNs of the records lost, inclusive.
    pub first: u64,
    pub last: u64,
    /// What they were, when their headers still chain.
    pub kinds: Option<Kinds>,
}

impl Damage {
    pub(crate) fn records(&self) -> u64 {
        self.last - self.first + 1
    }

    /// The damage of `region`, whose records end below `end` when no intact
    /// record follows it; only LSNs at or above `from` count (those below
    /// are in MongoDB). `None` when it cost nothing.
    pub(super) fn of(segment: &Path, r: &Region, end: u64, from: u64) -> Option<Damage> {
        let first = (r.after + 1).max(from);
        let last = r.next.unwrap_or(end).checked_sub(1)?;
        if first > last {
            if r.bytes > 0 || r.lost_frames > 0 {
                warn!(
                    segment = %segment.display(),
                    offset = r.offset,
                    bytes = r.bytes,
                    "Spool segment damaged where its records are in MongoDB already; nothing lost."
                );
            }
            return None;
        }
        Some(Damage {
            segment: segment.to_path_buf(),
            offset: r.offset,
            bytes: r.bytes,
            lost_frames: r.lost_frames,
            first,
            last,
            kinds: r.kinds.clone(),
        })
    }
}

/// Whether damage starting at `first` was counted already.
pub(super) fn known(storage: &dyn Storage, dir: &Path, first: u64) -> io::Result<bool> {
    Ok(list_ranges(storage, dir, SUFFIX)?
        .iter()
        .any(|(a, b, _)| (*a..=*b).contains(&first)))
}

/// Says what `d` cost (ERROR, metric) and leaves its marker, unless it was
/// counted before. Returns whether it was new.
pub(super) fn report(storage: &dyn Storage, dir: &Path, d: &Damage) -> bool {
    match known(storage, dir, d.first) {
        Ok(true) => return false,
        Ok(false) => {}
        Err(e) => warn!(error = %e, "Cannot list the spool's damage markers."),
    }
    if let Err(e) = replace(storage, dir, &range_name(d.first, d.last, SUFFIX), b"") {
        warn!(error = %e, "Cannot record the spool damage as counted; a restart may count it again.");
    }
    let records = d.records();
    let none = |sensors| (None, [0; 4], sensors);
    let (samples, others, sensors) = match &d.kinds {
        Some(k) => {
            let others = [
                k.dead_letters,
                k.message_ids,
                k.sparkplug_changes,
                k.last_values,
            ];
            match k.samples + others.iter().sum::<u64>() == records {
                true => (Some(k.samples), others, k.sensors.clone()),
                false => none(k.sensors.clone()),
            }
        }
        None => none(Vec::new()),
    };
    let known_kinds = samples.unwrap_or(0) + others.iter().sum::<u64>();
    let [dead_letters, message_ids, sparkplug, last_values] = others;
    for (kind, n) in [
        ("sample", samples.unwrap_or(0)),
        ("dead_letter", dead_letters),
        ("message_id", message_ids),
        ("sparkplug_change", sparkplug),
        ("last_value", last_values),
        ("unknown", records - known_kinds),
    ] {
        if n > 0 {
            metrics::counter!(telemetry::SPOOL_DAMAGED, "kind" => kind).increment(n);
        }
    }
    let readings = match samples {
        Some(n) => n.to_string(),
        None => format!("at most {records}"),
    };
    error!(
        segment = %d.segment.display(),
        offset = d.offset,
        bytes = d.bytes,
        lost_frames = d.lost_frames,
        first_lsn = d.first,
        last_lsn = d.last,
        records,
        readings = %readings,
        sensors = ?sensors,
        "Spool records damaged (bit rot or a failing disk): they are lost; the records around them are kept and written."
    );
    true
}

/// Deletes the markers wholly below `checkpoint`.
pub(super) fn prune(storage: &dyn Storage, dir: &Path, checkpoint: u64) -> io::Result<()> {
    for (_, last, path) in list_ranges(storage, dir, SUFFIX)? {
        if last < checkpoint {
            super::fs::remove_if_there(storage, &path)?;
        }
    }
    Ok(())
}
