//! palletd: an MQTT-to-MongoDB gateway that stores sensor readings as bucket
//! documents (one document per sensor and time window, with rollups).
//!
//! Data flows one way, each part a task that owns its state:
//!
//! ```text
//!  broker ──> ingest ──(bounded channel)──> pipeline ──> writer ──> MongoDB
//!               ^                            │ decode, buffer, plan
//!               └──────── PUBACKs ───────────┘ (ordered ack queue)
//! ```
//!
//! - [`config`]: the TOML file -> validated [`config::Settings`].
//! - [`ingest`]: owns the rumqttc event loop; subscribe, reconnect; the
//!   ordered [`ingest::acks::AckQueue`].
//! - [`decode`]: topic patterns and payload formats -> readings. Pure.
//! - [`buffer`]: per-sensor pending samples and open-bucket memory. Sans-IO.
//! - [`bucket`]: the bucket document and the upsert statements. Sans-IO.
//! - [`writer`]: sends statements and dead letters; decides what is retried.
//! - [`closer`]: seals buckets whose window is over.
//! - [`schema`]: indexes and retention (TTL) set up at start-up.
//! - [`pipeline`]: the task tying decode, buffer, writer, closer and acks
//!   together.
//! - [`telemetry`]: metrics, `/metrics` `/healthz` `/readyz`, systemd notify.
//! - [`simulate`] and [`query`]: the `palletd simulate` load generator and
//!   `palletd query` to read back what was stored.
//! - [`shutdown`]: signals and the shutdown order.
//!
//! A PUBLISH is acknowledged only when every sample it carried is stored
//! with the configured write concern or it went to the dead letter.

pub mod bucket;
pub mod buffer;
pub mod closer;
pub mod config;
pub mod decode;
pub mod ingest;
pub mod pipeline;
pub mod query;
pub mod schema;
pub mod shutdown;
pub mod simulate;
pub mod telemetry;
pub mod writer;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info};

use crate::bucket::Shape;
use crate::config::Settings;
use crate::decode::{Decoder, Limits};
use crate::pipeline::{Leftover, Pipeline};

/// Why `run` ended badly.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The settings cannot work (e.g. an unparsable MongoDB URI).
    #[error("configuration error: {0}")]
    Config(String),
    /// The HTTP endpoint could not start.
    #[error("{0}")]
    Http(String),
    /// Shutdown did not finish within its deadline.
    #[error("shutdown timed out with {} sample(s) not stored, {} dead letter(s) not written and {} message(s) not acknowledged (the broker will redeliver them)", .0.samples, .0.dead_letters, .0.unacknowledged)]
    ShutdownTimeout(Leftover),
}

/// `/readyz` fails while a flush has been running (retrying) longer than this.
pub const READY_FLUSH_BOUND: Duration = Duration::from_secs(10);

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The bucket shape the settings describe.
pub fn shape(settings: &Settings) -> Shape {
    Shape {
        window_ms: settings.bucket.window.as_millis() as i64,
        max_samples: settings.bucket.max_samples,
        max_bytes: settings.bucket.max_bytes,
    }
}

/// Connects to MongoDB lazily: the driver connects on first use, so an
/// unreachable database is retried by the writer, never fatal here.
pub async fn mongo_client(settings: &Settings) -> Result<mongodb::Client, RunError> {
    let mut opts = mongodb::options::ClientOptions::parse(settings.mongodb.uri.expose())
        .await
        .map_err(|e| {
            RunError::Config(format!("mongodb.uri: {}", redact(&e.to_string(), settings)))
        })?;
    // Fail a write attempt within seconds so retries and logs stay timely.
    opts.server_selection_timeout
        .get_or_insert(Duration::from_secs(5));
    opts.connect_timeout.get_or_insert(Duration::from_secs(5));
    opts.app_name.get_or_insert_with(|| "palletd".to_string());
    mongodb::Client::with_options(opts).map_err(|e| RunError::Config(format!("mongodb.uri: {e}")))
}

fn redact(text: &str, settings: &Settings) -> String {
    text.replace(settings.mongodb.uri.expose(), "***")
}

/// Runs the gateway until `stop` is cancelled, then shuts down in order
/// within `shutdown_timeout`.
pub async fn run(
    settings: Settings,
    stop: CancellationToken,
    shutdown_timeout: Duration,
) -> Result<(), RunError> {
    let shape = shape(&settings);
    let metrics = telemetry::install();
    let health = Arc::new(telemetry::Health::default());
    let client = mongo_client(&settings).await?;
    let writer = writer::Writer::new(&client, &settings, shape);
    let decoder = Decoder::new(
        settings.subscriptions.clone(),
        Limits {
            max_payload_size: settings.mqtt.max_payload_size,
            max_lateness_ms: settings.bucket.max_lateness.as_millis() as i64,
            max_future_ms: settings.bucket.max_future.as_millis() as i64,
        },
    );
    let connection = ingest::Connection::new(&settings.mqtt, &settings.subscriptions);
    let pipeline = Pipeline::new(
        &settings,
        decoder,
        connection.acker(),
        writer,
        shape,
        health.clone(),
    );
    // Room for the broker's whole in-flight window, so ingest never waits.
    let (tx, rx) = mpsc::channel(settings.mqtt.max_inflight.max(1024));

    let done = CancellationToken::new();
    let abort = CancellationToken::new();
    let tracker = TaskTracker::new();
    // The HTTP endpoint and the supervisor stop when the pipeline is done.
    if let Some(addr) = settings.http.listen {
        let server = telemetry::serve(
            addr,
            metrics.clone(),
            health.clone(),
            READY_FLUSH_BOUND,
            done.clone(),
        )
        .await
        .map_err(|e| RunError::Http(format!("cannot listen on {addr} (http.listen): {e}")))?;
        tracker.spawn(server);
    }
    tracker.spawn(telemetry::supervise(
        client.database(&settings.mongodb.database),
        health.clone(),
        metrics,
        done.clone(),
    ));
    tracker.spawn(connection.run(
        tx,
        stop.clone(),
        done.clone(),
        abort.clone(),
        health.clone(),
    ));
    let pipeline_task = {
        let (stop, done, abort) = (stop.clone(), done.clone(), abort.clone());
        let intervals = pipeline::Intervals {
            flush: settings.flush.interval,
            closer: settings.closer.interval,
        };
        tracker.spawn(async move {
            let result = pipeline.run(rx, intervals, stop, abort).await;
            done.cancel();
            result
        })
    };
    tracker.close();
    info!(
        broker = %format!("{}:{}", settings.mqtt.host, settings.mqtt.port),
        database = %settings.mongodb.database,
        collection = %settings.mongodb.collection,
        "palletd started."
    );

    stop.cancelled().await;
    let finished = tokio::time::timeout(shutdown_timeout, tracker.wait()).await;
    if finished.is_err() {
        abort.cancel();
        // Every task returns promptly once aborted.
        let _ = tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await;
    }
    let result = match pipeline_task.await {
        Ok(Ok(())) if finished.is_ok() => Ok(()),
        Ok(Ok(())) => Err(RunError::ShutdownTimeout(Leftover::default())),
        Ok(Err(left)) => Err(RunError::ShutdownTimeout(left)),
        Err(e) => {
            error!(error = %e, "Pipeline task failed.");
            Err(RunError::ShutdownTimeout(Leftover::default()))
        }
    };
    if result.is_ok() {
        info!("Stopped cleanly.");
    }
    result
}
