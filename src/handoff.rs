//! What the tasks hand each other (sans-IO): the records the admission
//! feeds the pipeline ([`Feed`]), and what one flush hands to the store and
//! what comes back, between the sans-IO pipeline core
//! ([`crate::pipeline::state`]) and a storage mode ([`crate::store`]).
//!
//! A flush is a [`Batch`]: per sensor a [`Run`] of its pending samples in
//! LSN order (with what palletd knows of that sensor's open buckets), plus
//! the dead letters waiting to be written. The store sets one [`Outcome`]
//! per sample. Before samples that may already be in MongoDB (replayed from
//! an earlier run, or part of a write whose reply was lost) are written, the
//! core asks the store to [`Resolve`] them.

use std::collections::HashSet;
use std::time::Instant;

pub use crate::bucket::Fills;
use crate::bucket::Samples;
use crate::deadletter::DeadLetter;

/// One sensor's samples in a flush.
#[derive(Debug, Default)]
pub struct Run {
    pub sensor: String,
    /// In LSN order, consecutive in the sensor's queue: every sample of
    /// the sensor read between the first and the last that is not in
    /// MongoDB yet is among them (what lets a statement name its samples
    /// by an LSN range).
    pub samples: Samples,
    /// What palletd knows of the sensor's open buckets; the buckets store
    /// learns what is unknown, plans with it and updates it.
    pub fills: Fills,
    /// One per sample, set by the store.
    pub outcomes: Vec<Outcome>,
}

/// What became of one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Durable in MongoDB with the configured write concern.
    Applied,
    /// Refused for good by the database, with its message: dead-letter it.
    Rejected(String),
    /// Sent in a write whose result is unknown (connection lost, timeout,
    /// write concern error): it may or may not be in MongoDB.
    Unknown,
    /// Not sent in this flush (certainly not applied by it).
    NotSent,
}

/// A flush: runs of samples and dead letters.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub runs: Vec<Run>,
    pub deadletters: Vec<DeadLetter>,
}

impl Batch {
    pub fn samples(&self) -> usize {
        self.runs.iter().map(|r| r.samples.len()).sum()
    }
}

/// What the store reports of a write besides the outcomes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    /// Statements (or documents) sent and applied.
    pub statements: usize,
    /// Buckets a statement created.
    pub buckets_created: u64,
    /// The database failed at least once during this write (the time went
    /// into retries: the write says nothing about the database's speed).
    pub met_errors: bool,
    /// Bytes of documents the database rewrote for the applied statements
    /// (a `$push` rewrites its whole bucket): the write amplification.
    pub bytes_rewritten: u64,
}

/// Samples of one sensor that may already be in MongoDB.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Resolve {
    pub sensor: String,
    /// (lsn, ts_ms) of each uncertain sample.
    pub samples: Vec<(u64, i64)>,
}

/// What the store learned about uncertain samples.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Resolution {
    /// The uncertain LSNs that are in MongoDB.
    pub applied: HashSet<u64>,
    /// Whether a database call failed on the way (an outage goes on).
    pub met_errors: bool,
}

/// What a batch of messages appended, offered to the pipeline: the very
/// records written to the spool (shared, not copied).
#[derive(Debug, Clone)]
pub(crate) struct Feed {
    /// LSN of the first record.
    pub first: u64,
    /// LSN after the last record.
    pub end: u64,
    /// Samples and dead letters among them (what memory must hold).
    pub records: usize,
    /// The records as written (see [`crate::record::parse`]).
    pub bytes: bytes::Bytes,
    /// When they were spooled: their wait counts from here, however late
    /// the pipeline takes them in (it takes nothing while a write waits out
    /// an outage).
    pub spooled: Instant,
    /// Its bytes in the feed's budget, given back once the pipeline took it
    /// in (`None`: no budget).
    pub held: Option<std::sync::Arc<crate::budget::Held>>,
}
