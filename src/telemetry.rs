//! Metrics, health and the service manager.
//!
//! - Parts record metrics through the `metrics` facade; [`install`] puts the
//!   Prometheus recorder behind it. Labels are bounded: causes and kinds,
//!   never a sensor id.
//! - [`Health`] holds the few facts readiness and the watchdog need, written
//!   by the parts as plain atomics (no lock on the data path).
//! - [`serve`] answers `/metrics`, `/healthz` (the process is alive) and
//!   `/readyz` (broker connected, database reachable, no flush failing for
//!   longer than the readiness bound).
//! - [`supervise`] probes the database once a second, and talks to systemd:
//!   `READY=1` once start-up is done, `STATUS=` with throughput or what it
//!   waits for, and `WATCHDOG=1` only while the pipeline makes progress
//!   (the broker loop polled recently and no flush has been in progress for
//!   longer than the watchdog interval).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub const MESSAGES_RECEIVED: &str = "palletd_messages_received_total";
pub const SAMPLES_DECODED: &str = "palletd_samples_decoded_total";
pub const SAMPLES_STORED: &str = "palletd_samples_stored_total";
/// Readings or messages dead-lettered, by `cause` (includes
/// `time_out_of_range`, the samples rejected for lateness or future time).
pub const DEAD_LETTERS: &str = "palletd_dead_letters_total";
pub const FLUSHES: &str = "palletd_flushes_total";
pub const STATEMENTS: &str = "palletd_statements_total";
pub const BUCKETS_CREATED: &str = "palletd_buckets_created_total";
pub const BUCKETS_SEALED: &str = "palletd_buckets_sealed_total";
/// Samples written into a window the closer had already sealed (they start a
/// second bucket of that window).
pub const SAMPLES_LATE_INTO_SEALED: &str = "palletd_samples_late_into_sealed_window_total";
pub const FLUSH_SECONDS: &str = "palletd_flush_duration_seconds";
/// Age of each sample (now minus its own timestamp) when it became durable
/// in MongoDB.
pub const SAMPLE_AGE_SECONDS: &str = "palletd_sample_age_at_write_seconds";
pub const PENDING_SAMPLES: &str = "palletd_pending_samples";
pub const OLDEST_UNACKED_SECONDS: &str = "palletd_oldest_unacked_age_seconds";
pub const BROKER_RECONNECTS: &str = "palletd_broker_reconnects_total";
pub const BROKER_CONNECTED: &str = "palletd_broker_connected";
pub const DATABASE_ERRORS: &str = "palletd_database_errors_total";
pub const SPOOL_BYTES: &str = "palletd_spool_bytes";
/// Spool LSNs between the checkpoint and the durable end (records not yet
/// confirmed in MongoDB, plus gaps).
pub const SPOOL_UNCONFIRMED: &str = "palletd_spool_unconfirmed_records";
pub const SPOOL_OLDEST_SECONDS: &str = "palletd_spool_oldest_record_age_seconds";
pub const SPOOL_REPLAYED: &str = "palletd_spool_replayed_records_total";
pub const SPOOL_FSYNCS: &str = "palletd_spool_fsyncs_total";
pub const REDELIVERIES_SKIPPED: &str = "palletd_redeliveries_skipped_total";

/// Registers the descriptions shown in `/metrics`.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(MESSAGES_RECEIVED, "MQTT messages received.");
    describe_counter!(SAMPLES_DECODED, "Samples decoded from messages.");
    describe_counter!(
        SAMPLES_STORED,
        "Samples written to buckets with the configured write concern."
    );
    describe_counter!(
        DEAD_LETTERS,
        "Readings or messages sent to the dead-letter collection, by cause."
    );
    describe_counter!(FLUSHES, "Flushes that wrote something.");
    describe_counter!(STATEMENTS, "Bucket upsert statements applied.");
    describe_counter!(BUCKETS_CREATED, "Buckets created by an upsert.");
    describe_counter!(BUCKETS_SEALED, "Buckets sealed by the closer.");
    describe_counter!(
        SAMPLES_LATE_INTO_SEALED,
        "Samples that arrived for a window after it was sealed; they went into a new bucket of that window."
    );
    describe_histogram!(
        SAMPLE_AGE_SECONDS,
        Unit::Seconds,
        "Age of each sample (now minus its timestamp) when it was written durably to MongoDB."
    );
    describe_histogram!(
        FLUSH_SECONDS,
        Unit::Seconds,
        "Time a flush took, retries included."
    );
    describe_gauge!(
        PENDING_SAMPLES,
        "Samples buffered in memory, not yet written."
    );
    describe_gauge!(
        OLDEST_UNACKED_SECONDS,
        Unit::Seconds,
        "Age of the oldest message not yet acknowledged to the broker."
    );
    describe_counter!(
        BROKER_RECONNECTS,
        "Reconnections to the MQTT broker after a loss."
    );
    describe_gauge!(BROKER_CONNECTED, "1 while connected to the MQTT broker.");
    describe_counter!(DATABASE_ERRORS, "Failed database commands, by kind.");
    describe_gauge!(
        SPOOL_BYTES,
        Unit::Bytes,
        "Bytes in the spool's segment files."
    );
    describe_gauge!(
        SPOOL_UNCONFIRMED,
        "Spool records not yet confirmed in MongoDB (approximate)."
    );
    describe_gauge!(
        SPOOL_OLDEST_SECONDS,
        Unit::Seconds,
        "Age of the oldest spool record not yet confirmed in MongoDB (to the second)."
    );
    describe_counter!(
        SPOOL_REPLAYED,
        "Records read back from the spool (replay and catch-up)."
    );
    describe_counter!(SPOOL_FSYNCS, "fsync calls of the spool (group commits).");
    describe_counter!(
        REDELIVERIES_SKIPPED,
        "Messages the broker redelivered that were already spooled: acknowledged, not stored again."
    );
}

/// Installs the Prometheus recorder behind the `metrics` facade.
pub fn install() -> Option<PrometheusHandle> {
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(FLUSH_SECONDS.to_string()),
            &[
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ],
        )
        .ok()?
        .set_buckets_for_metric(
            Matcher::Full(SAMPLE_AGE_SECONDS.to_string()),
            &[
                0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1,
                1.2, 1.3, 1.4, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0,
                300.0, 3600.0,
            ],
        )
        .ok()?;
    match builder.install_recorder() {
        Ok(handle) => {
            describe();
            Some(handle)
        }
        Err(e) => {
            warn!(error = %e, "Metrics recorder not installed.");
            None
        }
    }
}

/// Facts about the pipeline's progress, shared as atomics.
#[derive(Debug, Default)]
pub struct Health {
    broker_connected: AtomicBool,
    database_reachable: AtomicBool,
    /// When the broker loop last returned from a poll (ms since epoch).
    ingest_beat_ms: AtomicI64,
    /// When the flush in progress started; 0 when none is.
    flush_started_ms: AtomicI64,
    /// Samples stored, for the STATUS line.
    stored: AtomicU64,
}

impl Health {
    pub fn set_broker_connected(&self, up: bool) {
        self.broker_connected.store(up, Ordering::Relaxed);
        metrics::gauge!(BROKER_CONNECTED).set(if up { 1.0 } else { 0.0 });
    }

    pub fn broker_connected(&self) -> bool {
        self.broker_connected.load(Ordering::Relaxed)
    }

    pub fn set_database_reachable(&self, up: bool) {
        self.database_reachable.store(up, Ordering::Relaxed);
    }

    pub fn database_reachable(&self) -> bool {
        self.database_reachable.load(Ordering::Relaxed)
    }

    pub fn ingest_beat(&self) {
        self.ingest_beat_ms
            .store(crate::now_ms(), Ordering::Relaxed);
    }

    pub fn flush_started(&self) {
        self.flush_started_ms
            .store(crate::now_ms(), Ordering::Relaxed);
    }

    pub fn flush_finished(&self, stored: u64) {
        self.flush_started_ms.store(0, Ordering::Relaxed);
        self.stored.fetch_add(stored, Ordering::Relaxed);
    }

    /// How long the flush in progress has been running.
    pub fn flush_running_for(&self, now_ms: i64) -> Duration {
        let started = self.flush_started_ms.load(Ordering::Relaxed);
        if started == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis((now_ms - started).max(0) as u64)
    }

    pub fn ingest_silent_for(&self, now_ms: i64) -> Duration {
        let beat = self.ingest_beat_ms.load(Ordering::Relaxed);
        Duration::from_millis((now_ms - beat).max(0) as u64)
    }

    /// Ready: connected to the broker, the database answers, and no flush
    /// has been stuck for longer than `flush_bound`.
    pub fn ready(&self, flush_bound: Duration) -> Result<(), &'static str> {
        if !self.broker_connected() {
            return Err("not connected to the MQTT broker");
        }
        if !self.database_reachable() {
            return Err("database unreachable");
        }
        if self.flush_running_for(crate::now_ms()) > flush_bound {
            return Err("a flush has not succeeded within the bound");
        }
        Ok(())
    }
}

#[derive(Clone)]
struct HttpState {
    metrics: Option<PrometheusHandle>,
    health: Arc<Health>,
    flush_bound: Duration,
}

/// Binds the HTTP endpoint; the returned future serves until `stop`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Option<PrometheusHandle>,
    health: Arc<Health>,
    flush_bound: Duration,
    stop: CancellationToken,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(address = %listener.local_addr()?, "Serving /metrics, /healthz and /readyz.");
    let state = HttpState {
        metrics,
        health,
        flush_bound,
    };
    let app = axum::Router::new()
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    Ok(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            warn!(error = %e, "HTTP endpoint stopped.");
        }
    })
}

async fn metrics_page(
    State(s): State<HttpState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let body = s.metrics.as_ref().map(|m| m.render()).unwrap_or_default();
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
}

async fn readyz(State(s): State<HttpState>) -> (StatusCode, String) {
    match s.health.ready(s.flush_bound) {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

/// Probes the database every second (readiness), keeps the metrics
/// upkeep going, and talks to systemd. Runs until `stop`.
pub async fn supervise(
    db: mongodb::Database,
    health: Arc<Health>,
    metrics: Option<PrometheusHandle>,
    stop: CancellationToken,
) {
    let probe = async {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let ping = tokio::time::timeout(
                Duration::from_secs(2),
                db.run_command(bson::doc! { "ping": 1 }),
            )
            .await;
            health.set_database_reachable(matches!(ping, Ok(Ok(_))));
            if let Some(m) = &metrics {
                m.run_upkeep();
            }
        }
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = probe => {}
        _ = notify_systemd(&health) => {}
    }
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    }
}

/// `READY=1`, then `STATUS=` when it changes and `WATCHDOG=1` while the
/// pipeline makes progress. Does nothing outside systemd.
async fn notify_systemd(health: &Health) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return std::future::pending().await;
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    let watchdog = sd_notify::watchdog_enabled();
    // Pet at half the interval; check often enough for short intervals.
    let period = watchdog.map_or(Duration::from_secs(1), |w| {
        (w / 2).min(Duration::from_secs(1))
    });
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_stored = (
        health.stored.load(Ordering::Relaxed),
        std::time::Instant::now(),
    );
    let mut last_status = String::new();
    loop {
        tick.tick().await;
        let now = crate::now_ms();
        if let Some(interval) = watchdog {
            if health.ingest_silent_for(now) < interval && health.flush_running_for(now) < interval
            {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
            }
        }
        if last_stored.1.elapsed() < Duration::from_secs(5) && !last_status.is_empty() {
            continue;
        }
        let stored = health.stored.load(Ordering::Relaxed);
        let rate =
            (stored - last_stored.0) as f64 / last_stored.1.elapsed().as_secs_f64().max(0.001);
        last_stored = (stored, std::time::Instant::now());
        let status = if !health.broker_connected() {
            "waiting for the MQTT broker".to_string()
        } else if !health.database_reachable() {
            "waiting for the database".to_string()
        } else {
            format!("storing {rate:.0} samples/s")
        };
        if status != last_status {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&status)]);
            last_status = status;
        }
    }
}
