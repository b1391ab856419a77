//! The pipeline between the spool and the database.
//!
//! - [`core`]: its state and decisions, sans-IO: what memory holds, the
//!   catch-up cursor, which samples may already be in MongoDB, what a flush
//!   takes, where the checkpoint may move. Events in, actions out.
//! - [`policy`]: the flush policy object: which sensors to flush when, and
//!   when to seal (intervals, readiness, memory pressure, pacing).
//! - [`pending`]: each sensor's pending samples and open-bucket memory.
//! - [`task`]: the async shell that waits and forwards: it hands the core
//!   what arrives and carries out its actions against the spool and the
//!   [`crate::store::Store`].

pub mod core;
pub mod pending;
pub mod policy;
pub mod task;

#[cfg(test)]
mod tests;

pub use self::core::{Config, Core, Leftover, MAX_STATEMENTS_PER_FLUSH};
