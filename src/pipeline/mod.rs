//! The pipeline between the spool and the database.
//!
//! - [`state`]: the core, its state and decisions, sans-IO: what memory
//!   holds, the catch-up cursor, which samples may already be in MongoDB,
//!   what a flush takes, where the checkpoint may move. Events in, actions
//!   out. (`state`, not `core`: that name is Rust's own crate.)
//! - [`backlog`]: the backlog's range of the spool and the rules that
//!   spare it second reads; when the live lane falls behind.
//! - [`policy`]: the flush policy object: which sensors to flush when, when
//!   to seal, the delay, the backlog's share and flush size.
//! - [`pending`]: each sensor's pending samples and open-bucket memory.
//! - [`task`]: the async shell that waits and forwards: it hands the core
//!   what arrives and carries out its actions against the spool and the
//!   [`crate::store::Store`].

pub(crate) mod backlog;
pub mod pending;
pub(crate) mod policy;
pub(crate) mod state;
pub(crate) mod task;

#[cfg(test)]
mod tests;

#[cfg(test)]
pub use self::state::MAX_STATEMENTS_PER_FLUSH;
pub use self::state::{Config, Core, Leftover};
