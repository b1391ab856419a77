//! palletd: an MQTT-to-MongoDB gateway that stores sensor readings as bucket
//! documents (one document per sensor and time window, with rollups).
//!
//! Data flows one way, each part a task that owns its state:
//!
//! ```text
//!  broker ──> ingest ──> admission ──> spool (local log, fsync)
//!               ^            │ decode          │ durable LSN
//!               └── PUBACK ──┘ <───────────────┘
//!                            │ feed (live)     │ read back (backlog)
//!                            v                 v
//!              pipeline: state (sans-IO) + task ──> store ──> MongoDB
//!                            └──── checkpoint ───> spool
//! ```
//!
//! The edges (tasks, I/O):
//! - [`ingest`]: owns the rumqttc event loop; subscribe, reconnect,
//!   recognise redeliveries, hand messages on to admission.
//! - [`admission`]: decodes each message, appends it to the [`spool`],
//!   releases PUBACKs in arrival order once durable ([`front::acks`]);
//!   saves the Sparkplug B alias maps first ([`admission::sparkplug`]);
//!   thins the fields a subscription names ([`admission::thinning`]).
//! - [`spool`]: the crash-safe local log behind one [`spool::Spool`] handle
//!   (its appender thread, segments, checkpoint, reading back, tombstones
//!   of segments a full spool deleted); every file operation goes through
//!   [`spool::fs`], the seam the property tests put a failing disk behind;
//!   it survives write and fsync errors, a full disk, torn writes and
//!   damage, and notices when it was copied to another box.
//! - [`pipeline`]: a sans-IO core ([`pipeline::state`]) with its flush
//!   policy ([`pipeline::policy`]), and the task that carries out what it
//!   decides ([`pipeline::task`]).
//! - [`store`]: one module per storage mode (schema, resolving what a replay
//!   already applied, write, seal, read) and their MongoDB plumbing.
//! - [`telemetry`]: metrics (their names), health (what readiness and the
//!   watchdog need), the database probe and systemd; it imports no edge.
//! - [`web`]: the HTTP endpoint: the status page (and a sensor's charts),
//!   the read-only series API (`/api/`), `/metrics` `/healthz` `/readyz`;
//!   it reads the store and the telemetry.
//! - [`simulate`] and [`query`]: the `palletd simulate` load generator (JSON
//!   sensors, or Sparkplug B edge nodes) and `palletd query` to read back
//!   what was stored.
//! - [`shutdown`]: signals and the shutdown order.
//! - `testkit`: the services the tests and the benchmark run palletd
//!   against (Mosquitto, aedes, SecantusDB on free ports) and `netem`, a
//!   TCP proxy that behaves like a slow, flaky link or injects a replica
//!   set's failures into commands (built with the `testkit` feature, which
//!   the tests, benches and examples turn on, never into the daemon).
//!
//! The core (sans-IO, no tokio):
//! - [`config`]: the TOML file -> validated [`config::Settings`].
//! - [`decode`]: topic patterns and payload formats (one file each) ->
//!   readings; Sparkplug B's alias maps are state the decoder holds.
//! - [`front`]: the front door's decisions: which MQTT sessions open and
//!   what each subscribes, what a received PUBLISH is (new, a redelivery,
//!   the shared-subscription probe), when shared subscriptions are
//!   trusted, and the redelivery windows the spool keeps.
//! - [`bucket`]: the bucket document: a reading as a sample, a sensor's
//!   samples cut into upsert statements (`plan`), their BSON
//!   (`statement`), the remembered fills of open buckets (`fill`).
//! - [`thin`]: thinning rules (deadband, swinging door) with a stated
//!   error bound; the admission applies them as it spools
//!   ([`admission::thinning`]).
//! - [`handoff`]: what the tasks hand each other: the records the
//!   admission feeds the pipeline, and what a flush hands the store and
//!   gets back.
//! - [`deadletter`]: dead-letter documents, ids, counting and logging.
//! - [`record`]: the spool's record format (what a record holds, how it is
//!   framed and parsed back), shared by the spool and the pipeline.
//! - [`spool_ids`]: which spool id a record was written under.
//! - [`clock`] (time stamps).
//!
//! Beside the tasks: [`retry`] (the backoff they wait out) and [`budget`]
//! (byte budgets they wait on). `daemon.rs` wires them together
//! ([`start`], [`Running::shutdown`]); `main.rs` is the command line.
//!
//! Imports run from the edges to the core; the core never imports an edge,
//! nor tokio or the metrics facade (it returns counts and ages for the
//! tasks to record): `tests/suite/layout.rs` checks it.
//! A PUBLISH is acknowledged once everything it carried is durable in the
//! local spool; the spool is written to MongoDB exactly once.

// The map above names private modules on purpose: it is for whoever
// works on palletd (`cargo doc --no-deps --document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

/// The version and the git commit it was built from: "0.1.0 (commit 1a2b3c4d5e6f)".
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PALLETD_COMMIT"),
    ")"
);

// The interface: the modules the command line (`main.rs`) is built on,
// and the test kit.
pub mod bucket;
pub mod clock;
pub mod config;
pub mod decode;
pub mod query;
pub mod shutdown;
pub mod simulate;
pub mod telemetry;
#[doc(hidden)]
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod thin;

// The crate's own: the tasks and what they share. What the command line
// uses of them is re-exported below, and what the tests and benchmarks
// reach inside for is in [`internals`].
mod admission;
mod budget;
mod daemon;
mod deadletter;
mod front;
mod handoff;
mod ingest;
mod pipeline;
mod record;
mod retry;
mod spool;
mod spool_ids;
mod store;
mod web;

pub use daemon::{mongo_client, run, start, RunError, Running, READY_FLUSH_BOUND};
/// The MQTT sessions a configuration opens (`palletd config check` prints
/// them).
pub use front::plan::plan as plan_sessions;
/// Where readings go in MongoDB (`palletd query` reads through it).
pub use store::Store;

/// What the tests and the benchmarks reach inside the crate for (a thing
/// each measures or checks against), named as inside; not palletd's
/// interface.
#[doc(hidden)]
pub mod internals {
    pub use crate::admission::sparkplug::CHUNK_BYTES as SPARKPLUG_SNAPSHOT_CHUNK_BYTES;
    pub use crate::admission::thinning::Thinning;
    pub use crate::deadletter::CAUSES as DEAD_LETTER_CAUSES;
    pub use crate::ingest::tls::client_config as mqtt_tls_client_config;
    pub use crate::pipeline::pending::Pending;
    pub use crate::spool::{bench_append, bench_read, Fsync};
    pub use crate::spool_ids::Tags;
    pub use crate::store::buckets::{indexes as bucket_indexes, Buckets};
    pub use crate::store::latest::statement as latest_statement;
    pub use crate::web::{serve, Pages};
}
