//! The daemon's wiring: the spool and the database opened, every task
//! started in the order the map in `lib.rs` draws, and the shutdown that
//! waits for them within its deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info};

use crate::config::Settings;
use crate::pipeline::Leftover;
use crate::{
    admission, budget, config, decode, ingest, pipeline, spool, store, telemetry, web, VERSION,
};

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
    /// The spool was written by a newer palletd (its format version): it
    /// is left untouched, and palletd exits 78 as for a configuration it
    /// cannot run (the unit does not restart it in a loop).
    #[error("cannot open the spool: {0}")]
    SpoolFormat(String),
    /// Shutdown did not finish within its deadline.
    #[error("shutdown timed out with {} sample(s) and {} dead letter(s) not yet in MongoDB (kept in the spool for the next start) and {} message(s) not acknowledged (the broker will redeliver them)", .0.samples, .0.dead_letters, .0.unacknowledged)]
    ShutdownTimeout(Leftover),
}

/// `/readyz` fails while a flush has been running (retrying) longer than this.
pub const READY_FLUSH_BOUND: Duration = Duration::from_secs(10);

/// Connects to MongoDB lazily: the driver connects on first use, so an
/// unreachable database is retried by the store, never fatal here.
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
    // Wire compression, unless the URI chose: readings compress well, and
    // the link to the database may be a slow one; the level by where the
    // server is (`MongoSettings::compression_level_for`).
    if opts.compressors.is_none() && !settings.mongodb.compressors.is_empty() {
        use mongodb::options::Compressor;
        let chosen = settings
            .mongodb
            .compressors
            .iter()
            .map(|c| -> mongodb::error::Result<Compressor> {
                let level = settings.mongodb.compression_level_for(c, &opts.hosts);
                match c.parse::<Compressor>()? {
                    Compressor::Zstd { .. } => Ok(Compressor::Zstd { level }),
                    Compressor::Zlib { .. } => Ok(Compressor::Zlib {
                        level: level.map(|l| l as u32),
                    }),
                    other => Ok(other),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| RunError::Config(format!("mongodb.compressors: {e}")))?;
        opts.compressors = Some(chosen);
    }
    mongodb::Client::with_options(opts).map_err(|e| RunError::Config(format!("mongodb.uri: {e}")))
}

/// Every second, whether the spool's disk takes writes and how much room it
/// has, for readiness and the gauges (apart from the admission, which waits
/// while the disk fails).
async fn watch_spool(spool: spool::Spool, health: Arc<telemetry::Health>, done: CancellationToken) {
    loop {
        let failing = spool.failing();
        health.set_spool_failing(failing);
        metrics::gauge!(telemetry::SPOOL_FAILING).set(if failing { 1.0 } else { 0.0 });
        if let Some(free) = spool.free_space() {
            metrics::gauge!(telemetry::SPOOL_FREE_BYTES).set(free as f64);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = done.cancelled() => return,
        }
    }
}

/// Every second, the bytes held by the ingest queue, the spool's write
/// queue and the feed.
async fn watch_memory(
    queue: Arc<budget::Budget>,
    spool: spool::Spool,
    feed: Arc<budget::Budget>,
    done: CancellationToken,
) {
    loop {
        for (part, b) in [("ingest", &queue), ("feed", &feed)] {
            metrics::gauge!(telemetry::MEMORY_BYTES, "part" => part).set(b.used() as f64);
        }
        metrics::gauge!(telemetry::MEMORY_BYTES, "part" => "spool").set(spool.queued() as f64);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = done.cancelled() => return,
        }
    }
}

/// Says how much memory palletd's buffers may hold, and why.
fn log_memory_budget(limits: &config::LimitSettings) {
    let budget = bytesize::ByteSize(limits.max_memory).to_string_as(true);
    match limits.max_memory_from {
        config::MemoryBudgetFrom::Set => {
            info!(max_memory = %budget, "Memory budget (limits.max_memory).")
        }
        config::MemoryBudgetFrom::Auto { available } => info!(
            max_memory = %budget,
            available = %available.map_or("unknown".into(), |b| bytesize::ByteSize(b).to_string_as(true)),
            "Memory budget (limits.max_memory = \"auto\"): an eighth of the memory palletd may use (the box's or its cgroup's limit), between 64 MiB and 256 MiB."
        ),
    }
}

fn redact(text: &str, settings: &Settings) -> String {
    text.replace(settings.mongodb.uri.expose(), "***")
}

/// Runs palletd until `stop`, then shuts it down within `shutdown_timeout`
/// ([`Running::shutdown`]).
pub async fn run(
    settings: Settings,
    stop: CancellationToken,
    shutdown_timeout: Duration,
) -> Result<(), RunError> {
    let running = start(&settings, stop.clone()).await?;
    stop.cancelled().await;
    running.shutdown(shutdown_timeout).await
}

/// palletd started: its tasks, and what shutting them down needs.
pub struct Running {
    tracker: TaskTracker,
    /// Cut a shutdown short (its deadline passed).
    abort: CancellationToken,
    appender: spool::AppenderThread,
    pipeline: tokio::task::JoinHandle<Result<(), Leftover>>,
    admission: tokio::task::JoinHandle<Result<(), usize>>,
    client: mongodb::Client,
}

/// Opens the spool (recovering it), holding back deletions for the
/// parts that read their state from it at start.
fn open_spool(
    settings: &Settings,
) -> Result<(spool::Spool, spool::Recovery, spool::AppenderThread), RunError> {
    // With Sparkplug B, nothing is deleted before the admission has read
    // the state's snapshot and says what its replay needs; with thinning,
    // before it has read back the points held at the last stop.
    let subs = &settings.subscriptions;
    let holders = [
        (
            spool::Holder::Sparkplug,
            subs.iter()
                .any(|s| s.format == decode::PayloadFormat::SparkplugB),
        ),
        (
            spool::Holder::Thinning,
            subs.iter().any(|s| !s.thinning.is_empty())
                || admission::thinning::lsn_path(&settings.spool.dir).exists(),
        ),
    ];
    let mut spool_settings = spool::SpoolSettings {
        held: holders.iter().filter(|h| h.1).map(|h| h.0).collect(),
        ..settings.spool.clone()
    };
    // As many message identities per session as a broker window learned
    // before needs.
    spool_settings.redelivery.window =
        ingest::redelivery_window(&settings.mqtt, &settings.spool.dir);
    let (spool, recovered, appender) = spool::open(&spool_settings).map_err(|e| {
        let what = format!("{} (spool.dir): {e}", settings.spool.dir.display());
        match spool::format::newer(&e) {
            Some(_) => RunError::SpoolFormat(what),
            None => RunError::Spool(what),
        }
    })?;
    metrics::gauge!(telemetry::SPOOL_MAX_BYTES).set(settings.spool.max_size as f64);
    info!(
        dir = %settings.spool.dir.display(),
        bytes = recovered.bytes,
        records_to_replay = recovered.records,
        torn_bytes_cut = recovered.torn_bytes,
        damaged_records = recovered.damaged,
        "Spool opened."
    );
    Ok((spool, recovered, appender))
}

/// What the endpoints and watchers look at.
struct Watched {
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    health: Arc<telemetry::Health>,
    db: mongodb::Database,
    spool: spool::Spool,
    queue: Arc<budget::Budget>,
    feed: Arc<budget::Budget>,
}

/// Starts the HTTP endpoint (status page, `/metrics`, the API), the
/// status page's history, the spool and memory watchers and the systemd
/// supervisor; they run until `done`.
async fn spawn_watchers(
    settings: &Settings,
    tracker: &TaskTracker,
    w: Watched,
    done: CancellationToken,
) -> Result<(), RunError> {
    let Watched {
        metrics,
        health,
        db,
        spool,
        queue,
        feed,
    } = w;
    let history = Arc::new(web::status::History::default());
    if let Some(m) = &metrics {
        let keep = web::status::keep_history(m.clone(), history.clone());
        let stop = done.clone();
        tracker.spawn(async move {
            tokio::select! {
                _ = keep => {}
                _ = stop.cancelled() => {}
            }
        });
    }
    if let Some(addr) = settings.http.listen {
        let server = web::serve(
            addr,
            &settings.http.auth,
            web::Pages {
                metrics: metrics.clone(),
                health: health.clone(),
                history,
                flush_bound: READY_FLUSH_BOUND,
                api: Some(Arc::new(web::api::Api {
                    store: store::Store::new(settings, db.clone()),
                    window_ms: settings.bucket.window.as_millis() as i64,
                    health: health.clone(),
                })),
            },
            done.clone(),
        )
        .await
        .map_err(|e| RunError::Http(format!("cannot listen on {addr} (http.listen): {e}")))?;
        tracker.spawn(server);
    }
    tracker.spawn(watch_spool(spool.clone(), health.clone(), done.clone()));
    tracker.spawn(watch_memory(
        queue.clone(),
        spool.clone(),
        feed,
        done.clone(),
    ));
    // The status page's quietest sensors, from `<collection>_latest` when
    // it is kept (else the admission tells them).
    let latest = settings
        .latest
        .enabled
        .then(|| db.collection(&settings.mongodb.latest_collection()));
    {
        let (health, stop) = (health.clone(), done.clone());
        tracker.spawn(async move {
            tokio::select! {
                _ = store::latest::watch_quietest(latest, &health) => {}
                _ = stop.cancelled() => {}
            }
        });
    }
    tracker.spawn(telemetry::supervise::supervise(
        db,
        health.clone(),
        metrics,
        READY_FLUSH_BOUND,
        done.clone(),
    ));
    Ok(())
}

/// Opens the spool and the database, and starts every part: the endpoints
/// and watchers, ingest, the admission and the pipeline. They run until
/// `stop`.
pub async fn start(settings: &Settings, stop: CancellationToken) -> Result<Running, RunError> {
    for w in &settings.warnings {
        tracing::warn!("{w}");
    }
    let metrics = telemetry::install();
    let health = Arc::new(telemetry::Health::default());
    let client = mongo_client(settings).await?;
    let db = client.database(&settings.mongodb.database);
    let mut store = store::Store::new(settings, db.clone());
    store.observe(health.clone());
    let (spool, recovered, appender) = open_spool(settings)?;
    store.set_spool(recovered.tags.clone());
    let connections =
        ingest::Connections::new(&settings.mqtt, &settings.subscriptions, &settings.spool.dir)
            .map_err(RunError::Config)?;
    // limits.max_memory, in byte budgets: the messages on their way to the
    // spool (beyond, ingest stops reading from the broker), the batches on
    // their way to the pipeline's memory (beyond, they are read back from
    // disk), and what waits for MongoDB (beyond, it waits on disk).
    let memory = settings.limits.split();
    log_memory_budget(&settings.limits);
    let queue = Arc::new(budget::Budget::new(memory.ingest));
    let feed_budget = Arc::new(budget::Budget::new(memory.feed));
    let (feed_tx, feed_rx) = mpsc::channel(16_384);
    let admission = admission::Admission::new(
        settings,
        connections.acker(),
        spool.clone(),
        &recovered,
        feed_tx,
        health.clone(),
        admission::Budgets {
            queue: queue.clone(),
            feed: feed_budget.clone(),
        },
    );
    let core = pipeline::Core::new(
        pipeline::Config::from_settings(
            settings,
            recovered.tags.clone(),
            recovered.checkpoint,
            recovered.next_lsn,
            recovered.records,
            store.seal_grace().map(|g| g.as_millis() as i64),
        ),
        Instant::now(),
    );
    // Room for the broker's whole in-flight window of every connection, so
    // ingest never waits.
    let (tx, rx) = mpsc::channel((settings.mqtt.max_inflight * connections.count()).max(1024));

    // `acked`: the admission released every due acknowledgement (ingest may
    // disconnect); `done`: the pipeline finished (the endpoints stop).
    let acked = CancellationToken::new();
    let done = CancellationToken::new();
    let abort = CancellationToken::new();
    let tracker = TaskTracker::new();
    store.start_rollups(&tracker, [done.clone(), abort.clone()]);
    spawn_watchers(
        settings,
        &tracker,
        Watched {
            metrics,
            health: health.clone(),
            db,
            spool: spool.clone(),
            queue: queue.clone(),
            feed: feed_budget,
        },
        done.clone(),
    )
    .await?;
    connections.spawn(
        &tracker,
        tx,
        queue.clone(),
        [stop.clone(), acked.clone(), abort.clone()],
        health.clone(),
        &recovered.windows,
        spool.clone(),
    );
    let admission = {
        let (stop, acked, abort) = (stop.clone(), acked.clone(), abort.clone());
        tracker.spawn(async move {
            let result = admission.run(rx, stop, abort).await;
            acked.cancel();
            result
        })
    };
    let pipeline = {
        let (stop, done, abort) = (stop.clone(), done.clone(), abort.clone());
        tracker.spawn(async move {
            let result =
                pipeline::task::run(core, store, spool, feed_rx, health, stop, abort).await;
            done.cancel();
            result
        })
    };
    tracker.close();
    info!(
        version = VERSION,
        broker = %format!("{}:{}", settings.mqtt.host, settings.mqtt.port),
        database = %settings.mongodb.database,
        collection = %settings.mongodb.collection,
        "palletd started."
    );
    Ok(Running {
        tracker,
        abort,
        appender,
        pipeline,
        admission,
        client,
    })
}

impl Running {
    /// Once `stop` was cancelled: waits for every task to finish what it
    /// holds (spool and acknowledge what arrived, write memory), within
    /// `timeout`; then aborts them, lets the spool sync, and says what was
    /// left (it stays in the spool; the broker redelivers the rest).
    pub(crate) async fn shutdown(self, timeout: Duration) -> Result<(), RunError> {
        let finished = tokio::time::timeout(timeout, self.tracker.wait()).await;
        if finished.is_err() {
            self.abort.cancel();
            // Every task returns promptly once aborted.
            let _ = tokio::time::timeout(Duration::from_secs(5), self.tracker.wait()).await;
        }
        // The appender syncs what was appended and exits.
        let appender = self.appender;
        tokio::task::spawn_blocking(move || appender.finish())
            .await
            .ok();
        let mut left = Leftover::default();
        match self.pipeline.await {
            Ok(Ok(())) => {}
            Ok(Err(l)) => left = l,
            Err(e) => error!(error = %e, "Pipeline task failed."),
        }
        match self.admission.await {
            Ok(Ok(())) => {}
            Ok(Err(n)) => left.unacknowledged = n,
            Err(e) => error!(error = %e, "Admission task failed."),
        }
        // Shut the driver down here: a client dropped while the runtime
        // stops spawns a task that ends its sessions, and that task can
        // panic inside the driver (mongodb 3.9's connection requester)
        // after the last log line, on stderr.
        self.client.shutdown().immediate(true).await;
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
}
