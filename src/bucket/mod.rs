//! The bucket document: how a reading becomes a sample, how a sensor's
//! pending samples are cut into upsert statements, and the BSON of those
//! statements. Sans-IO.
//!
//! A statement carries its caps in the filter (`count <= cap - k`,
//! `size <= max_bytes - bytes`), so no statement can overfill a bucket no
//! matter what the gateway believes about the bucket's fill. The planner uses
//! the remembered fill only to cut a run exactly: fill the open bucket, then
//! start full-sized new ones.
//!
//! Each statement also records which spool records it carries: `$push`
//! of its first and last LSN onto `lsns.<spool>` (see [`lsns_field`]). A
//! statement's samples are consecutive in their sensor's queue, which
//! holds every sample of the sensor read between them that is not yet in
//! MongoDB, so the pair names exactly the statement's samples of that
//! sensor and window; a replay asks whether a bucket of its sample's
//! sensor and window holds a pair around the sample's LSN.
//!
//! Besides `sum`, `n`, `min` and `max`, each numeric field's first and
//! last reading go in as `first.<f>` and `last.<f>`, `{t, v}` documents
//! kept by `$min` and `$max` (MongoDB compares documents field by field:
//! by time, then by value), so a bucket carries every summary a rollup
//! needs and rollups never read samples ([`crate::store::rollup`]). They
//! are written with every statement rather than computed by the seal: on
//! SecantusDB a seal computing them from the samples took 8-10 times as
//! long (200 buckets of 200 samples and 9 fields: 9.5-11.8 s against
//! 1.2 s), while the two more paths per field cost a statement of one
//! sample and 3 fields 8-30% and one of many samples proportionally less.
//!
//! With thinning ([`crate::thin`]) a sample carries what the admission
//! decided ([`THIN`], [`ARCHIVE`]): a statement pushes the fields kept and
//! the points stored late, counts those against the caps (`count`), and
//! summarises every reading; `thinned` counts the readings left out.

mod fill;
mod plan;
mod sample;
mod statement;

pub use fill::*;
pub use plan::*;
pub use sample::*;
pub use statement::*;

/// Bucket caps and window, in the units the planner works in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub window_ms: i64,
    pub max_samples: u32,
    pub max_bytes: u32,
}

impl Shape {
    /// Start of the window holding `ts_ms` (floor, also before 1970).
    pub fn window_start(&self, ts_ms: i64) -> i64 {
        ts_ms.div_euclid(self.window_ms) * self.window_ms
    }

    /// Whether a bucket of `count` samples has so little room left (a
    /// sixteenth of `max_samples` or less) that a run overflowing it goes
    /// whole to the next bucket ([`plan`]) and filling it makes no sensor
    /// ready to flush early.
    pub(crate) fn little_room(&self, count: u32) -> bool {
        count >= self.nearly_full()
    }

    /// The fewest samples of a bucket with little room left.
    pub(crate) fn nearly_full(&self) -> u32 {
        self.max_samples - self.max_samples / 16
    }
}

/// A sample larger than a whole bucket may hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sample of {bytes} bytes does not fit in a bucket (bucket.max_bytes = {max_bytes})")]
pub(crate) struct TooBig {
    pub bytes: u32,
    pub max_bytes: u32,
}

impl Shape {
    /// Refuses a sample that could never fit in a bucket.
    pub(crate) fn check(&self, sample: SampleRef<'_>) -> Result<(), TooBig> {
        let bytes = sample.cost();
        if bytes > self.max_bytes {
            return Err(TooBig {
                bytes,
                max_bytes: self.max_bytes,
            });
        }
        Ok(())
    }
}

/// A bucket's `_id`: `<sensorId>|<window start, ms>|<sequence number>`, the
/// n-th bucket of the sensor's window. Every upsert names its bucket by it,
/// a point lookup on the one index every collection has (on SecantusDB
/// about 5,000 statements/s however many buckets a sensor has, against 400/s
/// for a filter on `{sensorId, startTs}` and the caps at 1,000 windows per
/// sensor). Unambiguous: the last two fields hold no `|`.
pub fn bucket_id(sensor: &str, start_ms: i64, seq: u32) -> String {
    format!("{sensor}|{start_ms}|{seq}")
}

/// The sequence number of a [`bucket_id`] (`None` for another `_id`, as
/// the ObjectIds of buckets written before palletd addressed them).
pub(crate) fn seq_of(id: &str) -> Option<u32> {
    let (rest, seq) = id.rsplit_once('|')?;
    let (_, start) = rest.rsplit_once('|')?;
    start.parse::<i64>().ok()?;
    seq.parse().ok()
}

/// The field a spool's statements record their LSN ranges in:
/// `lsns.s<spool id>` (the id in hex, as in `spool.id`), an array of first
/// and last LSN pairs. Each spool has its own, so several palletd
/// instances can write one sensor.
pub(crate) fn lsns_field(spool_tag: u32) -> String {
    format!("lsns.s{spool_tag:08x}")
}

/// Whether the LSN ranges recorded in a bucket (`[first, last, ...]`, as
/// [`Statement::to_bson`] pushes them) hold `lsn`.
pub(crate) fn ranges_hold(pairs: &[u64], lsn: u64) -> bool {
    pairs.chunks_exact(2).any(|p| p[0] <= lsn && lsn <= p[1])
}

#[cfg(test)]
mod tests;
