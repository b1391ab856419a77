//! Metrics, health and the service manager.
//!
//! - Parts record metrics through the `metrics` facade under the names
//!   below; [`install`] puts the Prometheus recorder behind it. Labels are
//!   bounded: causes and kinds, never a sensor id.
//! - [`Health`] ([`health`]) holds the few facts readiness and the watchdog
//!   need, written by the parts as plain atomics.
//! - [`crate::web::serve`] answers `/` (the status page), `/metrics`,
//!   `/healthz` (the process is alive) and `/readyz` (broker connected and
//!   subscribed, database reachable, no flush failing for longer than the
//!   readiness bound) from what is here.
//! - [`supervise::supervise`] probes the database once a second and talks to
//!   systemd: `READY=1`, `STATUS=` and `WATCHDOG=1` (see that module).

pub(crate) mod deadletters;
pub(crate) mod health;
pub mod supervise;
pub(crate) mod systemd;

pub use deadletters::Reporter;
pub use health::Health;

use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing::warn;

pub const MESSAGES_RECEIVED: &str = "palletd_messages_received_total";
pub const SAMPLES_DECODED: &str = "palletd_samples_decoded_total";
/// Points of thinned fields, by rule (`deadband`, `swinging_door`) and
/// outcome: `received`, `stored` (in `samples`; the summaries take every
/// one received), and `unordered` (stored as received: it came too far
/// out of order for its rule to place it).
pub(crate) const THINNING_POINTS: &str = "palletd_thinning_points_total";
/// Sensors whose thinning runs were ended early to keep the runs within
/// thinning's share of `limits.max_memory`.
pub(crate) const THINNING_ENDED: &str = "palletd_thinning_sensors_ended_total";
/// Messages passed over, by reason: a `$` metadata topic, a retained
/// message on a subscription with `retained = "skip"`, a retained copy of
/// the last value palletd took in from its topic (`retained_seen`), or a
/// message with no field to store (`no_fields`).
pub(crate) const MESSAGES_SKIPPED: &str = "palletd_messages_skipped_total";
pub const SAMPLES_STORED: &str = "palletd_samples_stored_total";
/// Readings or messages dead-lettered, by `cause` (includes
/// `time_out_of_range`, the samples rejected for lateness or future time).
pub const DEAD_LETTERS: &str = "palletd_dead_letters_total";
/// Why a field is left out of a stored reading.
pub(crate) const FIELD_CAUSES: &[&str] = &["bad_field", "field_name_too_long", "string_too_long"];
/// Fields left out of readings that were stored (a value palletd cannot
/// take), by `cause`.
pub(crate) const FIELDS_DROPPED: &str = "palletd_fields_dropped_total";
pub const FLUSHES: &str = "palletd_flushes_total";
pub const STATEMENTS: &str = "palletd_statements_total";
/// The most statements one flush applied since start (bounded by
/// `MAX_STATEMENTS_PER_FLUSH`, about).
pub const FLUSH_STATEMENTS_MAX: &str = "palletd_flush_statements_max";
pub(crate) const BUCKETS_CREATED: &str = "palletd_buckets_created_total";
/// Upserts whose bucket (`_id`) was there but full or sealed beyond what
/// palletd knew: sent again to the next bucket of the window.
pub const BUCKET_COLLISIONS: &str = "palletd_bucket_id_collisions_total";
pub const BUCKETS_SEALED: &str = "palletd_buckets_sealed_total";
/// Windows whose open buckets a flush looked up (a sensor's first flush
/// after a start, or of an older window than it knows of).
pub const FILL_LOOKUPS: &str = "palletd_bucket_fill_lookups_total";
/// Bytes of bucket documents the database rewrote for applied statements
/// (a `$push` rewrites the whole bucket): the write amplification.
pub const BYTES_REWRITTEN: &str = "palletd_bucket_bytes_rewritten_total";
/// Samples written into a window the closer had already sealed (they start a
/// second bucket of that window).
pub(crate) const SAMPLES_LATE_INTO_SEALED: &str = "palletd_samples_late_into_sealed_window_total";
pub const FLUSH_SECONDS: &str = "palletd_flush_duration_seconds";
/// Age of each sample (now minus its own timestamp) when it became durable
/// in MongoDB.
pub const SAMPLE_AGE_SECONDS: &str = "palletd_sample_age_at_write_seconds";
pub(crate) const PENDING_SAMPLES: &str = "palletd_pending_samples";
/// The delay a sensor's oldest reading waits before it is written now:
/// `flush.max_delay`, or stretched up to `flush.max_delay_limit` while the
/// database cannot keep up.
pub const FLUSH_DELAY_SECONDS: &str = "palletd_flush_delay_seconds";
pub(crate) const OLDEST_UNACKED_SECONDS: &str = "palletd_oldest_unacked_age_seconds";
pub(crate) const BROKER_RECONNECTS: &str = "palletd_broker_reconnects_total";
pub(crate) const BROKER_CONNECTED: &str = "palletd_broker_connected";
pub(crate) const BROKER_CONNECTIONS_UP: &str = "palletd_broker_connections_up";
/// 1 for the state shared subscriptions are in: `unused`, `verifying`,
/// `delivered`, `not_delivered` (then one connection, unshared).
pub(crate) const BROKER_SHARED: &str = "palletd_broker_shared_subscriptions";
/// 1 while `/readyz` answers 200.
pub(crate) const READY: &str = "palletd_ready";
/// HTTP connections closed as accepted: the endpoint had its most open.
pub(crate) const HTTP_REFUSED: &str = "palletd_http_connections_refused_total";
/// Requests for `/` or `/metrics` refused for missing or wrong credentials.
pub(crate) const HTTP_UNAUTHORIZED: &str = "palletd_http_unauthorized_total";
/// `spool.max_size`, for an alert on the spool filling up.
pub(crate) const SPOOL_MAX_BYTES: &str = "palletd_spool_max_bytes";
pub(crate) const DATABASE_ERRORS: &str = "palletd_database_errors_total";
pub(crate) const SPOOL_BYTES: &str = "palletd_spool_bytes";
/// Spool LSNs between the checkpoint and the durable end (records not yet
/// confirmed in MongoDB, plus gaps).
pub(crate) const SPOOL_UNCONFIRMED: &str = "palletd_spool_unconfirmed_records";
pub(crate) const SPOOL_OLDEST_SECONDS: &str = "palletd_spool_oldest_record_age_seconds";
pub(crate) const SPOOL_REPLAYED: &str = "palletd_spool_replayed_records_total";
/// Readings behind: what the live lane gave up on (after an outage, or
/// when it fell behind) and what a restart left, not yet in MongoDB.
pub const BACKLOG_READINGS: &str = "palletd_backlog_readings";
pub const ROLLUPS_WRITTEN: &str = "palletd_rollups_written_total";
pub const ROLLUP_STATEMENTS: &str = "palletd_rollup_statements_total";
/// Dead letters not spooled: their share of the spool was full.
pub const DEAD_LETTERS_DROPPED: &str = "palletd_dead_letters_dropped_total";
/// Dead letters whose payload was cut to its first 256 bytes: they came
/// faster than `limits.max_deadletter_rate`.
pub(crate) const DEAD_LETTER_PAYLOADS_CUT: &str = "palletd_dead_letter_payloads_cut_total";
/// Bytes of the dead letters in the spool not yet confirmed in MongoDB
/// (at most a tenth of `spool.max_size`).
pub const SPOOL_DEADLETTER_BYTES: &str = "palletd_spool_deadletter_bytes";
/// Spooled batches not offered to the pipeline's memory (its feed's byte
/// budget spent): read back from the spool instead.
pub(crate) const FEED_SKIPPED: &str = "palletd_feed_skipped_batches_total";
/// Bytes held in a memory budget, by part (`limits.max_memory`).
pub const MEMORY_BYTES: &str = "palletd_memory_bytes";
/// The broker's in-flight window as palletd takes it: `mqtt.max_inflight`
/// (MQTT 5: `receive_maximum`), or more once a session held more
/// unacknowledged messages (see `crate::ingest::learned`).
pub(crate) const MQTT_BROKER_WINDOW: &str = "palletd_mqtt_broker_window";
/// How the broker numbers its resends, as palletd knows it: 1 for the
/// `numbering` it is (`unknown`, `kept`, `renumbered`), 0 for the others.
pub(crate) const MQTT_BROKER_RESENDS: &str = "palletd_mqtt_broker_resends";
/// Rollup keys set aside because their rollup could not be written.
pub(crate) const ROLLUP_KEYS_PARKED: &str = "palletd_rollup_keys_parked_total";
pub const CLOSER_SECONDS: &str = "palletd_closer_seconds";
pub const ROLLUP_PASS_SECONDS: &str = "palletd_rollup_pass_seconds";
pub(crate) const BACKLOG_STORED: &str = "palletd_backlog_samples_stored_total";
pub const BACKLOG_DRAIN_RATE: &str = "palletd_backlog_drain_readings_per_second";
pub(crate) const BACKLOG_ETA_SECONDS: &str = "palletd_backlog_drain_eta_seconds";
pub const SPOOL_FSYNCS: &str = "palletd_spool_fsyncs_total";
pub(crate) const SPOOL_DROPPED: &str = "palletd_spool_dropped_readings_total";
/// Spool records lost to damage (bit rot, a failing disk), by kind.
pub(crate) const SPOOL_DAMAGED: &str = "palletd_spool_damaged_records_total";
/// Failed spool writes and syncs, by kind (each retried).
pub(crate) const SPOOL_WRITE_ERRORS: &str = "palletd_spool_write_errors_total";
/// 1 while spool writes fail (nothing new is acknowledged).
pub(crate) const SPOOL_FAILING: &str = "palletd_spool_failing";
/// Bytes free on the spool's filesystem.
pub(crate) const SPOOL_FREE_BYTES: &str = "palletd_spool_disk_free_bytes";
pub(crate) const CLOCK_SYNCHRONIZED: &str = "palletd_clock_synchronized";
pub(crate) const REDELIVERIES_SKIPPED: &str = "palletd_redeliveries_skipped_total";
/// Sparkplug B messages decoded, by `type` (NBIRTH, DDATA, NCMD, STATE, ...).
pub const SPARKPLUG_MESSAGES: &str = "palletd_sparkplug_messages_total";
/// Sparkplug B sequence numbers that skipped ahead (messages lost or not
/// yet arrived), and that arrived behind the last one (late).
pub(crate) const SPARKPLUG_SEQ_GAPS: &str = "palletd_sparkplug_seq_gaps_total";
pub(crate) const SPARKPLUG_OUT_OF_ORDER: &str = "palletd_sparkplug_out_of_order_total";
/// Sparkplug B metrics of types palletd does not store, by `datatype`.
pub(crate) const SPARKPLUG_SKIPPED: &str = "palletd_sparkplug_metrics_skipped_total";
/// NDEATHs whose bdSeq is not the node's current one (a stale will).
pub(crate) const SPARKPLUG_STALE_DEATHS: &str = "palletd_sparkplug_stale_deaths_total";
/// Rebirth requests (NCMD) published, and not published for a full queue.
pub(crate) const SPARKPLUG_REBIRTHS: &str = "palletd_sparkplug_rebirth_requests_total";
/// Edge nodes forgotten to make room in the Sparkplug B state (the
/// longest-silent first).
pub const SPARKPLUG_EVICTED: &str = "palletd_sparkplug_nodes_evicted_total";
/// Snapshots of the Sparkplug B state (sparkplug.json) written.
pub const SPARKPLUG_STATE_SAVES: &str = "palletd_sparkplug_state_saves_total";
/// Snapshots of the Sparkplug B state (sparkplug.json) that failed.
pub(crate) const SPARKPLUG_SAVE_ERRORS: &str = "palletd_sparkplug_state_save_errors_total";

/// Every `kind` of `palletd_database_errors_total`: [`crate::store::mongo::error_kind`]'s,
/// the statements' ([`crate::store::mongo::Decision::statement_label`]) and a write concern error's; each
/// registered at 0 at start.
pub(crate) const DATABASE_ERROR_KINDS: &[&str] = &[
    "network",
    "server_selection",
    "pool_cleared",
    "authentication",
    "command",
    "write",
    "dns",
    "tls_config",
    "other",
    "statement_transient",
    "statement_rejected",
    "write_concern",
];

/// How a metric is kept.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric: its kind, unit and the description `/metrics` shows.
const DESCRIPTIONS: &[(&str, Kind, Option<Unit>, &str)] = &[
    (MESSAGES_RECEIVED, Kind::Counter, None, "MQTT messages received, by connection (its index: 0 to mqtt.connections - 1; 64 on, sessions being retired)."),
    (SAMPLES_DECODED, Kind::Counter, None, "Samples decoded from messages."),
    (THINNING_POINTS, Kind::Counter, None, "Points of thinned fields by rule and outcome: received, stored as samples (the summaries and rollups take every one received), and unordered (stored as received: too far out of order for the rule to place)."),
    (THINNING_ENDED, Kind::Counter, None, "Sensors whose thinning runs were ended early, the longest-silent first, to keep the runs within thinning's share of limits.max_memory (their held points are stored, so the bound holds; their next points start new runs)."),
    (SAMPLES_STORED, Kind::Counter, None, "Samples written to buckets with the configured write concern."),
    (DEAD_LETTERS, Kind::Counter, None, "Readings or messages sent to the dead-letter collection, by cause."),
    (FIELDS_DROPPED, Kind::Counter, None, "Fields left out of readings that were stored (the value could not be taken), by cause."),
    (MESSAGES_SKIPPED, Kind::Counter, None, "Messages passed over without storing or refusing anything, by reason: metadata (a topic with a `$` level no pattern names), retained (the RETAIN flag on a subscription with retained = \"skip\"), retained_seen (the RETAIN flag on a copy of the last value palletd took in from that topic: the broker sends it again on subscribe) or no_fields (a message that decodes to no field at all, such as a status report with none of the components a preset reads)."),
    (HTTP_REFUSED, Kind::Counter, None, "HTTP connections closed as soon as accepted: the endpoint had its most (64) open."),
    (HTTP_UNAUTHORIZED, Kind::Counter, None, "Requests for the status page or /metrics answered 401: credentials missing or wrong ([http] username/password or token)."),
    (FLUSHES, Kind::Counter, None, "Flushes that wrote something."),
    (STATEMENTS, Kind::Counter, None, "Bucket upsert statements applied."),
    (FLUSH_STATEMENTS_MAX, Kind::Gauge, None, "The most statements one flush applied since start."),
    (BUCKETS_CREATED, Kind::Counter, None, "Buckets created by an upsert."),
    (BUCKET_COLLISIONS, Kind::Counter, None, "Upserts that found their bucket full or sealed (E11000 on _id) and went to the next one."),
    (BUCKETS_SEALED, Kind::Counter, None, "Buckets sealed by the closer."),
    (FILL_LOOKUPS, Kind::Counter, None, "Windows (sensor and window) whose open buckets a flush looked up by _id before writing: a sensor's first flush after a start, or one of a window older than those it knows of."),
    (BYTES_REWRITTEN, Kind::Counter, Some(Unit::Bytes), "Bytes of bucket documents rewritten by applied statements (each $push rewrites its bucket): write amplification."),
    (SAMPLES_LATE_INTO_SEALED, Kind::Counter, None, "Samples that arrived for a window after it was sealed; they went into a new bucket of that window."),
    (SAMPLE_AGE_SECONDS, Kind::Histogram, Some(Unit::Seconds), "Age of each sample (now minus its timestamp) when it was written durably to MongoDB; lane=\"live\" or \"backlog\" (readings written while live ones went first)."),
    (FLUSH_SECONDS, Kind::Histogram, Some(Unit::Seconds), "Time a flush took, retries included."),
    (PENDING_SAMPLES, Kind::Gauge, None, "Samples in memory not yet written to MongoDB (the flush in flight included)."),
    (FLUSH_DELAY_SECONDS, Kind::Gauge, Some(Unit::Seconds), "How long a sensor's oldest reading waits before it is written: flush.max_delay, or stretched up to flush.max_delay_limit while the database cannot keep up (each statement then carries more readings)."),
    (OLDEST_UNACKED_SECONDS, Kind::Gauge, Some(Unit::Seconds), "Age of the oldest message not yet acknowledged to the broker."),
    (BROKER_RECONNECTS, Kind::Counter, None, "Reconnections to the MQTT broker after a loss."),
    (BROKER_CONNECTED, Kind::Gauge, None, "1 while connected to the MQTT broker on every connection (mqtt.connections)."),
    (BROKER_CONNECTIONS_UP, Kind::Gauge, None, "MQTT connections up, of mqtt.connections."),
    (BROKER_SHARED, Kind::Gauge, None, "1 for the state of shared subscriptions (label state): unused, verifying, delivered (a probe came back through the group), not_delivered (palletd went on with one connection, unshared; with mqtt.share_group nothing reaches it)."),
    (READY, Kind::Gauge, None, "1 while ready (/readyz answers 200), checked every second."),
    (SPOOL_MAX_BYTES, Kind::Gauge, Some(Unit::Bytes), "The spool's size limit (spool.max_size)."),
    (DATABASE_ERRORS, Kind::Counter, None, "Failed database commands, by kind."),
    (SPOOL_BYTES, Kind::Gauge, Some(Unit::Bytes), "Bytes in the spool's files (segments, tombstones, markers, state files): what counts against spool.max_size."),
    (SPOOL_UNCONFIRMED, Kind::Gauge, None, "Spool records not yet confirmed in MongoDB (approximate)."),
    (CLOCK_SYNCHRONIZED, Kind::Gauge, None, "1 when the kernel says the system clock is synchronised (NTP), 0 when not (absent: palletd cannot tell)."),
    (SPOOL_DROPPED, Kind::Counter, None, "Readings lost because a full spool deleted them before they reached MongoDB (spool.when_full = \"drop_oldest\"), counted when palletd finds them missing (readings of a deleted segment it still held in memory are written, not counted)."),
    (SPOOL_DAMAGED, Kind::Counter, None, "Spool records lost to damage (bit rot, a failing disk), counted once when found, by kind (sample, dead_letter, message_id, sparkplug_change, last_value, unknown: the headers were unreadable); the records around them are kept."),
    (SPOOL_WRITE_ERRORS, Kind::Counter, None, "Failed spool writes and syncs, by kind (disk_full, io, short_write, other); each is retried, and what it may have lost is written again."),
    (SPOOL_FAILING, Kind::Gauge, None, "1 while spool writes or syncs fail: nothing new becomes durable, so nothing new is acknowledged (the broker keeps the messages)."),
    (SPOOL_FREE_BYTES, Kind::Gauge, Some(Unit::Bytes), "Bytes free on the spool's filesystem."),
    (ROLLUPS_WRITTEN, Kind::Counter, None, "Rollup documents the closer wrote ([[rollup]]; final and partial)."),
    (ROLLUP_STATEMENTS, Kind::Counter, None, "Write statements rollups cost: key blocks recorded at flushes, rollup upserts and keys cleared by the closer."),
    (DEAD_LETTERS_DROPPED, Kind::Counter, None, "Dead letters (whole messages) dropped because dead letters filled their share of the spool (a tenth of spool.max_size) while MongoDB did not take them, by the first cause; good readings are not affected."),
    (DEAD_LETTER_PAYLOADS_CUT, Kind::Counter, None, "Dead letters that kept only the first 256 bytes of their payload because dead letters came faster than limits.max_deadletter_rate, by the first cause."),
    (SPOOL_DEADLETTER_BYTES, Kind::Gauge, Some(Unit::Bytes), "Bytes of dead letters in the spool not yet confirmed in MongoDB, as of the last dead letter spooled (at most a tenth of spool.max_size)."),
    (FEED_SKIPPED, Kind::Counter, None, "Spooled batches the pipeline's memory had no room for (limits.max_memory): read back from the spool later."),
    (MQTT_BROKER_WINDOW, Kind::Gauge, None, "The broker's in-flight window as palletd takes it (half the message ids it keeps per session to recognise resends): mqtt.max_inflight (MQTT 5: receive_maximum), raised when a session held more unacknowledged messages than that (kept in the spool's directory as broker-window)."),
    (MQTT_BROKER_RESENDS, Kind::Gauge, None, "How the broker numbers the messages it resends to a resumed session, as palletd knows it (asked once per spool, kept in mqtt-broker): 1 for the numbering label it is, unknown, kept (under the packet ids they had: Mosquitto, EMQX, aedes) or renumbered (under the new connection's: RabbitMQ), 0 for the others."),
    (MEMORY_BYTES, Kind::Gauge, Some(Unit::Bytes), "Bytes held in palletd's memory budget (limits.max_memory), by part: ingest (messages on their way to the spool), feed (spooled batches on their way to memory), pending (samples and dead letters waiting for MongoDB), sparkplug (the Sparkplug B state), thinning (thinning's runs), retained (the last value taken in from each topic, in the admission and the spool)."),
    (ROLLUP_KEYS_PARKED, Kind::Counter, None, "Rollup keys (sensor and interval) whose rollup the database refused (say a document over 16 MB): set aside for an hour so the others go on."),
    (CLOSER_SECONDS, Kind::Histogram, None, "How long one closer run took (sealing; the rollups are computed beside it)."),
    (ROLLUP_PASS_SECONDS, Kind::Histogram, None, "How long one rollup pass took (on its own task, woken by the closer)."),
    (BACKLOG_STORED, Kind::Counter, None, "Samples written from the backlog (of palletd_samples_stored_total)."),
    (BACKLOG_READINGS, Kind::Gauge, None, "Readings behind (draining in the background while live readings go first): in memory, plus an estimate of those still on disk."),
    (BACKLOG_DRAIN_RATE, Kind::Gauge, None, "Backlog readings written per second, smoothed over the last few seconds."),
    (BACKLOG_ETA_SECONDS, Kind::Gauge, Some(Unit::Seconds), "Estimated time until the backlog is written at the current drain rate (0: none, or not draining)."),
    (SPOOL_OLDEST_SECONDS, Kind::Gauge, Some(Unit::Seconds), "Age of the oldest spool record not yet confirmed in MongoDB (to the second)."),
    (SPOOL_REPLAYED, Kind::Counter, None, "Records read back from the spool (replay and catch-up)."),
    (SPOOL_FSYNCS, Kind::Counter, None, "fsync calls of the spool (group commits)."),
    (REDELIVERIES_SKIPPED, Kind::Counter, None, "Messages the broker redelivered that were already spooled: acknowledged, not stored again."),
    (SPARKPLUG_MESSAGES, Kind::Counter, None, "Sparkplug B messages received, by type (NCMD, DCMD and STATE are counted and not stored)."),
    (SPARKPLUG_SEQ_GAPS, Kind::Counter, None, "Sparkplug B sequence numbers that skipped ahead of the edge node's last one."),
    (SPARKPLUG_OUT_OF_ORDER, Kind::Counter, None, "Sparkplug B messages whose sequence number is behind the edge node's last one (stored anyway)."),
    (SPARKPLUG_SKIPPED, Kind::Counter, None, "Sparkplug B metrics not stored for their datatype (datasets, templates, bytes, files, arrays), by datatype."),
    (SPARKPLUG_STALE_DEATHS, Kind::Counter, None, "Sparkplug B NDEATHs whose bdSeq is not the one of the node's last NBIRTH: not recorded."),
    (SPARKPLUG_REBIRTHS, Kind::Counter, None, "Sparkplug B rebirth requests (NCMD Node Control/Rebirth), by outcome (sent, or dropped for a full client queue)."),
    (SPARKPLUG_STATE_SAVES, Kind::Counter, None, "Snapshots of the Sparkplug B alias maps written (sparkplug.json), in the background once changes waited 30 s or their bytes reach the state's; BIRTHs and DEATHs are acknowledged like any message (their changes are spool records, replayed onto the last snapshot at start)."),
    (SPARKPLUG_SAVE_ERRORS, Kind::Counter, None, "Snapshots of the Sparkplug B alias maps (sparkplug.json in the spool directory) that could not be written; tried again 5 s later, the spool keeping the changes since the last one meanwhile (unless it is full or failing)."),
    (SPARKPLUG_EVICTED, Kind::Counter, None, "Edge nodes forgotten, the longest-silent first, to take a BIRTH within limits.max_sparkplug_nodes, max_sparkplug_aliases and the Sparkplug B share of limits.max_memory; each is asked for a rebirth when heard again."),
];

/// Registers the descriptions shown in `/metrics`.
pub(crate) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    for &(name, kind, unit, text) in DESCRIPTIONS {
        match (kind, unit) {
            (Kind::Counter, Some(unit)) => describe_counter!(name, unit, text),
            (Kind::Counter, None) => describe_counter!(name, text),
            (Kind::Gauge, Some(unit)) => describe_gauge!(name, unit, text),
            (Kind::Gauge, None) => describe_gauge!(name, text),
            (Kind::Histogram, Some(unit)) => describe_histogram!(name, unit, text),
            (Kind::Histogram, None) => describe_histogram!(name, text),
        }
    }
}

/// Every counter, each labelled series whose labels are known in advance,
/// and every histogram, present at 0 from the start (the Prometheus
/// client guidelines): a dashboard panel of a healthy box shows 0, not "No
/// data", and an alert on `increase(...)` tells "none" from "not scraped"
/// and sees a first increment right at start (damage found by recovery)
/// as the step it is. Not registered ahead: Sparkplug B's skipped metrics
/// by `datatype` (a label per datatype a device sends).
fn register_at_zero() {
    for name in [
        SAMPLES_DECODED,
        SAMPLES_STORED,
        FLUSHES,
        STATEMENTS,
        BUCKETS_CREATED,
        BUCKET_COLLISIONS,
        BUCKETS_SEALED,
        FILL_LOOKUPS,
        BYTES_REWRITTEN,
        SAMPLES_LATE_INTO_SEALED,
        BROKER_RECONNECTS,
        SPOOL_REPLAYED,
        ROLLUPS_WRITTEN,
        ROLLUP_STATEMENTS,
        ROLLUP_KEYS_PARKED,
        FEED_SKIPPED,
        BACKLOG_STORED,
        SPOOL_FSYNCS,
        SPOOL_DROPPED,
        REDELIVERIES_SKIPPED,
        HTTP_REFUSED,
        HTTP_UNAUTHORIZED,
        SPARKPLUG_SEQ_GAPS,
        SPARKPLUG_OUT_OF_ORDER,
        SPARKPLUG_STALE_DEATHS,
        SPARKPLUG_STATE_SAVES,
        SPARKPLUG_SAVE_ERRORS,
        SPARKPLUG_EVICTED,
    ] {
        metrics::counter!(name).increment(0);
    }
    for cause in crate::deadletter::CAUSES {
        for name in [DEAD_LETTERS, DEAD_LETTERS_DROPPED, DEAD_LETTER_PAYLOADS_CUT] {
            metrics::counter!(name, "cause" => *cause).increment(0);
        }
    }
    for cause in FIELD_CAUSES {
        metrics::counter!(FIELDS_DROPPED, "cause" => *cause).increment(0);
    }
    for reason in [
        crate::decode::SKIPPED_METADATA,
        crate::decode::SKIPPED_RETAINED,
        crate::decode::SKIPPED_RETAINED_SEEN,
        crate::decode::SKIPPED_NO_FIELDS,
    ] {
        metrics::counter!(MESSAGES_SKIPPED, "reason" => reason).increment(0);
    }
    for kind in DATABASE_ERROR_KINDS {
        metrics::counter!(DATABASE_ERRORS, "kind" => *kind).increment(0);
    }
    for kind in [
        "sample",
        "dead_letter",
        "message_id",
        "sparkplug_change",
        "last_value",
        "unknown",
    ] {
        metrics::counter!(SPOOL_DAMAGED, "kind" => kind).increment(0);
    }
    for kind in ["disk_full", "io", "short_write", "other"] {
        metrics::counter!(SPOOL_WRITE_ERRORS, "kind" => kind).increment(0);
    }
    for kind in crate::decode::sparkplug::KINDS.iter().chain(&["STATE"]) {
        metrics::counter!(SPARKPLUG_MESSAGES, "type" => *kind).increment(0);
    }
    for outcome in ["sent", "dropped"] {
        metrics::counter!(SPARKPLUG_REBIRTHS, "outcome" => outcome).increment(0);
    }
    for name in [FLUSH_SECONDS, CLOSER_SECONDS, ROLLUP_PASS_SECONDS] {
        let _ = metrics::histogram!(name);
    }
    for lane in ["live", "backlog"] {
        let _ = metrics::histogram!(SAMPLE_AGE_SECONDS, "lane" => lane);
    }
}

/// Buckets of the durations of flushes and closer runs (seconds).
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Installs the Prometheus recorder behind the `metrics` facade.
pub fn install() -> Option<PrometheusHandle> {
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(FLUSH_SECONDS.to_string()), SECONDS_BUCKETS)
        .ok()?
        .set_buckets_for_metric(Matcher::Full(CLOSER_SECONDS.to_string()), SECONDS_BUCKETS)
        .ok()?
        .set_buckets_for_metric(
            Matcher::Full(ROLLUP_PASS_SECONDS.to_string()),
            SECONDS_BUCKETS,
        )
        .ok()?
        .set_buckets_for_metric(
            Matcher::Full(SAMPLE_AGE_SECONDS.to_string()),
            &[
                0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1,
                1.2, 1.3, 1.4, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 11.0, 12.0, 13.0,
                14.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 240.0, 300.0, 450.0, 600.0,
                3600.0,
            ],
        )
        .ok()?;
    match builder.install_recorder() {
        Ok(handle) => {
            describe();
            register_at_zero();
            Some(handle)
        }
        Err(e) => {
            warn!(error = %e, "Metrics recorder not installed.");
            None
        }
    }
}
