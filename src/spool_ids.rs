//! Which spool id ("tag") a spool's record was written under. Sans-IO.
//!
//! A spool's id names its records in MongoDB: the LSN pairs a statement
//! pushes onto `lsns.s<tag>` and the `_id` of its dead letters. When a spool
//! turns out to have been copied to another box (an SD card cloned from one
//! image, a directory restored elsewhere), the copy takes a new id for what
//! it spools from then on, and keeps the old one for the records it already
//! held: those may be in MongoDB under the old id, and exactly once needs
//! to look there. So the records of a spool fall into epochs of LSNs, each
//! with its id; an epoch is dropped once the checkpoint passed it.

/// The ids of a spool's LSN epochs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tags {
    current: u32,
    /// (id, below): records with an LSN below `below` (and at or above the
    /// previous entry's) were written under `id`. Sorted by `below`.
    previous: Vec<(u32, u64)>,
}

impl Tags {
    /// A spool with one id for all its records.
    pub const fn new(current: u32) -> Tags {
        Tags {
            current,
            previous: Vec::new(),
        }
    }

    /// A spool whose records below each `below` were written under its id.
    pub(crate) fn with_previous(current: u32, mut previous: Vec<(u32, u64)>) -> Tags {
        previous.sort_by_key(|p| p.1);
        Tags { current, previous }
    }

    /// The id of what is spooled from now on.
    pub(crate) fn current(&self) -> u32 {
        self.current
    }

    /// The earlier epochs: (id, below).
    #[cfg(test)]
    pub(crate) fn previous(&self) -> &[(u32, u64)] {
        &self.previous
    }

    /// The id the record with this LSN was written under.
    pub(crate) fn of(&self, lsn: u64) -> u32 {
        self.previous
            .iter()
            .find(|(_, below)| lsn < *below)
            .map_or(self.current, |(tag, _)| *tag)
    }

    /// Whether two LSNs were written under the same id (a statement never
    /// carries records of two epochs).
    #[cfg(test)]
    pub(crate) fn same(&self, a: u64, b: u64) -> bool {
        self.of(a) == self.of(b)
    }

    /// The LSN range `[lo, hi]` cut by epoch: (id, lo, hi) each.
    pub fn split(&self, lo: u64, hi: u64) -> Vec<(u32, u64, u64)> {
        let mut out = Vec::new();
        let mut from = lo;
        for (tag, below) in &self.previous {
            if from > hi {
                break;
            }
            if from < *below {
                out.push((*tag, from, hi.min(below - 1)));
                from = *below;
            }
        }
        if from <= hi {
            out.push((self.current, from, hi));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_lsn_has_the_id_of_its_epoch() {
        let t = Tags::with_previous(3, vec![(2, 200), (1, 100)]);
        assert_eq!(
            (t.of(0), t.of(99), t.of(100), t.of(199), t.of(200)),
            (1, 1, 2, 2, 3)
        );
        assert!(t.same(100, 199) && !t.same(99, 100));
        assert_eq!(
            t.split(50, 250),
            vec![(1, 50, 99), (2, 100, 199), (3, 200, 250)]
        );
        assert_eq!(t.split(150, 160), vec![(2, 150, 160)]);
        assert_eq!(t.split(300, 400), vec![(3, 300, 400)]);
        assert_eq!(Tags::new(7).split(1, 2), vec![(7, 1, 2)]);
    }
}
