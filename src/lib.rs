//! palletd: an MQTT-to-MongoDB gateway that stores sensor readings as bucket
//! documents (one document per sensor and time window, with rollups).
//!
//! Data flows one way, each part a task that owns its state:
//!
//! ```text
//!  broker ──> ingest ──> spooler ──> spool (local log, fsync)
//!               ^          │ decode          │ durable LSN
//!               └─ PUBACK ─┘ <───────────────┘
//!                          │ feed (memory)   │ catch-up (disk)
//!                          v                 v
//!                          pipeline: buffer, plan ──> writer ──> MongoDB
//!                                    closer, checkpoint ──> spool
//! ```
//!
//! - [`config`]: the TOML file -> validated [`config::Settings`].
//! - [`ingest`]: owns the rumqttc event loop; subscribe, reconnect,
//!   recognise redeliveries; the ordered [`ingest::acks::AckQueue`].
//! - [`spooler`]: decodes, appends to the [`spool`], acknowledges once durable.
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
//! A PUBLISH is acknowledged once everything it carried is durable in the
//! local spool; the spool is confirmed into MongoDB exactly once.

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
pub mod spool;
pub mod spooler;
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
    /// The spool cannot be opened.
    #[error("cannot open the spool: {0}")]
    Spool(String),
    /// Shutdown did not finish within its deadline.
    #[error("shutdown timed out with {} sample(s) and {} dead letter(s) not yet in MongoDB (kept in the spool for the next start) and {} message(s) not acknowledged (the broker will redeliver them)", .0.samples, .0.dead_letters, .0.unacknowledged)]
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
    for w in &settings.warnings {
        tracing::warn!("{w}");
    }
    let metrics = telemetry::install();
    let health = Arc::new(telemetry::Health::default());
    let client = mongo_client(&settings).await?;
    let writer = writer::Writer::new(&client, &settings, shape);
    let decoder = Decoder::new(
        settings.subscriptions.clone(),
        Limits::from_settings(&settings),
    );
    let spool_dir = settings.spool.dir.clone();
    let spool_error =
        |e: std::io::Error| RunError::Spool(format!("{} (spool.dir): {e}", spool_dir.display()));
    let recovered = spool::recover(&settings.spool.dir).map_err(spool_error)?;
    let spool = spool::SpoolWriter::start(
        &settings.spool,
        recovered.next_lsn,
        recovered.bytes,
        recovered.checkpoint,
    )
    .map_err(spool_error)?;
    info!(
        dir = %settings.spool.dir.display(),
        bytes = recovered.bytes,
        records_to_replay = recovered.records,
        "Spool opened."
    );
    let connection = ingest::Connection::new(&settings.mqtt, &settings.subscriptions)
        .map_err(|e| RunError::Config(e.to_string()))?;
    // Batches of messages on their way to the pipeline's memory; room for
    // those that arrive during a long flush (memory is bounded by
    // flush.max_pending_samples; what does not fit is read back from disk).
    let (feed_tx, feed_rx) = mpsc::channel(16_384);
    let spooler = spooler::Spooler {
        decoder,
        acker: connection.acker(),
        spool: spool.tx.clone(),
        durable: spool.durable.clone(),
        stats: spool.stats.clone(),
        next_lsn: recovered.next_lsn,
        tag: recovered.tag,
        max_size: settings.spool.max_size,
        max_sample_bytes: shape.max_bytes,
        feed: feed_tx,
        sensors: spooler::SensorLimit::new(
            settings.limits.max_sensors,
            (settings.bucket.window + settings.closer.grace).as_millis() as i64,
        ),
    };
    let pipeline = Pipeline::new(
        &settings,
        writer,
        shape,
        health.clone(),
        pipeline::SpoolHandle {
            dir: settings.spool.dir.clone(),
            tx: spool.tx.clone(),
            durable: spool.durable.clone(),
            stats: spool.stats.clone(),
            tag: recovered.tag,
            from: recovered.checkpoint,
            replay: recovered.records,
            fresh_from: recovered.next_lsn,
        },
    );
    // Room for the broker's whole in-flight window, so ingest never waits.
    let (tx, rx) = mpsc::channel(settings.mqtt.max_inflight.max(1024));

    // `acked`: the spooler released every due acknowledgement (ingest may
    // disconnect); `done`: the pipeline finished (the endpoints stop).
    let acked = CancellationToken::new();
    let done = CancellationToken::new();
    let abort = CancellationToken::new();
    let tracker = TaskTracker::new();
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
        acked.clone(),
        abort.clone(),
        health.clone(),
        ingest::Redeliveries::new(recovered.message_ids),
    ));
    let spooler_task = {
        let (stop, acked, abort) = (stop.clone(), acked.clone(), abort.clone());
        tracker.spawn(async move {
            let result = spooler.run(rx, stop, abort).await;
            acked.cancel();
            result
        })
    };
    let pipeline_task = {
        let (stop, done, abort) = (stop.clone(), done.clone(), abort.clone());
        let intervals = pipeline::Intervals {
            flush: settings.flush.interval,
            closer: settings.closer.interval,
        };
        tracker.spawn(async move {
            let result = pipeline.run(feed_rx, intervals, stop, abort).await;
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
    // The writer thread syncs what was appended and exits.
    tokio::task::spawn_blocking(move || spool.finish())
        .await
        .ok();
    let mut left = Leftover::default();
    match pipeline_task.await {
        Ok(Ok(())) => {}
        Ok(Err(l)) => left = l,
        Err(e) => error!(error = %e, "Pipeline task failed."),
    }
    match spooler_task.await {
        Ok(Ok(())) => {}
        Ok(Err(n)) => left.unacknowledged = n,
        Err(e) => error!(error = %e, "Spooler task failed."),
    }
    let result = if finished.is_ok() && left == Leftover::default() {
        Ok(())
    } else {
        Err(RunError::ShutdownTimeout(left))
    };
    if result.is_ok() {
        info!("Stopped cleanly.");
    }
    result
}
