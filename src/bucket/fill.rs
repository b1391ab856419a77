//! What palletd remembers of a sensor's open buckets ([`Fills`]), so
//! the planner can cut a run to fill them exactly.

/// What the gateway last knew of a window's newest bucket: its sequence
/// number in the window ([`bucket_id`](super::bucket_id)) and its fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fill {
    pub count: u32,
    pub bytes: u32,
    pub seq: u32,
}

impl Fill {
    /// A sealed bucket: nothing more goes in; the next is `seq + 1`.
    pub(crate) fn sealed(seq: u32) -> Fill {
        Fill {
            count: u32::MAX / 2,
            bytes: u32::MAX / 2,
            seq,
        }
    }
}

/// What palletd knows of one sensor's open buckets: the fill per window
/// start (a window that is absent is unknown). Usually one or two windows,
/// so a small list rather than a map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fills(Vec<(i64, Fill)>, Quiet);

/// How many fill lookups of a sensor in a row found no bucket in any
/// window they asked for (saturating): from [`QUIET_LOOKUPS`] on, its new
/// windows are taken to be empty without asking, until a bucket palletd did
/// not know of turns up (a collision on its `_id`); and whether that
/// happened since the last lookup (`surprised`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Quiet {
    misses: u8,
    surprised: bool,
}

/// Lookups that find nothing before a sensor's new windows are no longer
/// looked up: a backfill (history arriving in time order, every window
/// new) then costs the database its upserts only, not a query per flush;
/// a wrong guess costs one collision and turns the lookups back on.
pub(crate) const QUIET_LOOKUPS: u8 = 2;

impl Fills {
    pub fn new() -> Fills {
        Fills::default()
    }

    /// Whether a lookup of this sensor's windows is likely to find nothing.
    pub(crate) fn quiet(&self) -> bool {
        self.1.misses >= QUIET_LOOKUPS
    }

    /// Whether window `start`, of which nothing is known, is taken to be
    /// empty without a lookup: the sensor is quiet, or the window is newer
    /// than every window palletd knows of it (a live sensor crossing into
    /// its next window: only another writer could have started it, and then
    /// the upsert extends that bucket while it has room; a wrong guess
    /// costs a collision, which turns the lookups back on). Without it,
    /// every sensor's first flush of each window waited for a lookup: at
    /// the hour, 10,000 sensors' lookups at once.
    pub(crate) fn assume_empty(&self, start: i64) -> bool {
        self.quiet()
            || (!self.1.surprised && !self.0.is_empty() && self.0.iter().all(|e| e.0 < start))
    }

    /// A lookup of its windows found a bucket (`true`) or none.
    pub(crate) fn looked_up(&mut self, found: bool) {
        self.1 = Quiet {
            misses: if found {
                0
            } else {
                self.1.misses.saturating_add(1)
            },
            surprised: false,
        };
    }

    /// A statement met a bucket palletd did not know of: look up again.
    pub(crate) fn surprised(&mut self) {
        self.1 = Quiet {
            misses: 0,
            surprised: true,
        };
    }

    pub(crate) fn get(&self, start: &i64) -> Option<&Fill> {
        self.0.iter().find(|e| e.0 == *start).map(|e| &e.1)
    }

    pub(crate) fn contains_key(&self, start: &i64) -> bool {
        self.get(start).is_some()
    }

    pub fn insert(&mut self, start: i64, fill: Fill) {
        match self.0.iter_mut().find(|e| e.0 == start) {
            Some(e) => e.1 = fill,
            None => self.0.push((start, fill)),
        }
    }

    pub(crate) fn remove(&mut self, start: &i64) {
        self.0.retain(|e| e.0 != *start);
    }

    /// Keeps the windows `keep` says yes to.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&i64, &Fill) -> bool) {
        self.0.retain(|e| keep(&e.0, &e.1));
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<const N: usize> From<[(i64, Fill); N]> for Fills {
    fn from(entries: [(i64, Fill); N]) -> Fills {
        let mut f = Fills::new();
        for (start, fill) in entries {
            f.insert(start, fill);
        }
        f
    }
}
