//! Metric names and their descriptions. Parts record through the `metrics`
//! facade (a no-op until an exporter is installed); the HTTP endpoint that
//! exports them in Prometheus text format lives here too once it exists.
//!
//! Labels are bounded: causes and kinds, never a sensor id.

/// Buckets sealed by the closer.
pub const BUCKETS_SEALED: &str = "palletd_buckets_sealed_total";
/// Samples written into a window the closer had already sealed (they start a
/// second bucket of that window).
pub const SAMPLES_LATE_INTO_SEALED: &str = "palletd_samples_late_into_sealed_window_total";
/// Samples dead-lettered, by `cause` (includes `time_out_of_range`).
pub const SAMPLES_DEAD_LETTERED: &str = "palletd_dead_letters_total";

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    metrics::describe_counter!(BUCKETS_SEALED, "Buckets sealed by the closer.");
    metrics::describe_counter!(
        SAMPLES_LATE_INTO_SEALED,
        "Samples that arrived for a window after it was sealed; they went into a new bucket of that window."
    );
    metrics::describe_counter!(
        SAMPLES_DEAD_LETTERED,
        "Readings or messages sent to the dead-letter collection, by cause."
    );
}
