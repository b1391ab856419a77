//! The end-to-end benchmark behind `scripts/bench`: palletd against the
//! broker's ceiling and against naive one-insert-per-message bridges, all
//! on this machine, one scenario after another, each on a fresh broker and
//! a fresh database, with the same simulator workload.
//!
//! Scenarios (each a separate process, so CPU and memory are its own):
//! - `ceiling`: a subscriber that decodes and acknowledges, no database.
//! - `buckets`, `timeseries`: palletd (release build) in each storage mode.
//! - `sparkplug` (not in the default list): palletd in bucket mode with a
//!   `format = "sparkplug_b"` subscription, fed by `palletd simulate
//!   --format sparkplug_b` (the sensors are devices, 10 to an edge node,
//!   each node its own connection; DATA by alias, three metrics per
//!   reading like the JSON workload's three fields). Run beside `buckets`
//!   to compare Sparkplug with JSON in the same run.
//! - `buckets-thinned` (not in the default list): `buckets` with the
//!   simulator's three fields thinned (two swinging doors and a
//!   deadband, about 1% of a day's span of the walk each), beside
//!   `buckets` to measure what thinning costs and saves.
//! - `buckets-nolatest` (not in the default list): `buckets` with
//!   `[latest] enabled = false`, beside `buckets` to measure what the
//!   latest-value statements cost.
//! - `buckets-v5` (not in the default list): `buckets` over MQTT 5 with a
//!   Receive Maximum of 1,000, beside `buckets` (3.1.1) at `--inflight 20`
//!   to see whether the broker's window for 3.1.1 clients still caps a v5
//!   client.
//! - `buckets-x2` (not in the default list): two palletd instances on one
//!   shared subscription (`[mqtt] share_group`), each with its own spool,
//!   into the same collection; their figures are summed (CPU, peak RSS).
//! - `batched`: what a careful Telegraf user runs (`mqtt_consumer` with
//!   acknowledgement after delivery and `outputs.mongodb`): one document per
//!   reading, one unordered `insert_many` of a batch as large as the
//!   broker's in-flight window (Telegraf's `max_undelivered_messages` and
//!   `metric_batch_size`) or whatever came within a second
//!   (`flush_interval = "1s"`), one write at a time, the PUBACKs after the
//!   write, into a time series collection (`timeField: "ts"`,
//!   `metaField: "sensorId"`).
//! - `batched-plain`: the same into a plain collection with an index on
//!   `{sensorId: 1, ts: 1}`.
//! - `naive`: one `insert_one` per message, awaited, then the PUBACK.
//! - `naive16`: the same with 16 inserts in flight.
//!
//! The broker allows `--inflight` messages in flight per client (1,000 by
//! default, and every sink's window matches it) and queues without limit,
//! so a backlog shows as a backlog; `--inflight 20 --queued 1000` are
//! Mosquitto's own defaults.
//!
//! Every sink exports the same two metrics as palletd (readings durable,
//! and a histogram of reading age at durable write), so all are measured by
//! one reader. A step offers an open-loop rate from `palletd simulate` for
//! `--step-secs`; it is *sustained* when the simulator kept its schedule,
//! the backlog (published minus durable) stayed flat (its low point in the
//! second half of the step at most half a second of readings above its low
//! point in the first half), and everything was durable within 30 s of the last
//! publish (palletd's flush cycle grows with the number of sensors when
//! the database is slow per statement, so lag is reported, not bounded).
//! The rate is stepped up from 70% of a short overload probe's throughput,
//! by 1.25 each step, until a step is not sustained. The lag, CPU, database
//! and peak-RSS figures are those of the step at 80% of the highest
//! sustained rate (the one before it); the data directory is measured after
//! the stepped run, and a second peak RSS covers the whole stepped run
//! (the last, overloaded, step included).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::doc;
use clap::Parser;
use futures_util::TryStreamExt;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::json;

const TOPIC: &str = "bench/{sensor}/data";
const FILTER: &str = "bench/+/data";
/// How long after the last publish everything must be durable.
const DRAIN_SECS: u64 = 30;

#[derive(Parser)]
enum Cli {
    /// Run the scenarios and print the table.
    Run(RunArgs),
    /// (Used by `run`.) A baseline sink: ceiling, batched, batched-plain,
    /// naive or naive16.
    Sink(SinkArgs),
    /// Peak RSS of `palletd query` exporting one long-lived sensor (a year
    /// at 1 Hz is 31 million readings) as CSV and as JSON lines.
    QueryRss(QueryRssArgs),
    /// palletd writing to MongoDB through a slow link (a proxy with a
    /// round trip and a bandwidth): the lag of live readings without a
    /// backlog, a cut of the link, then the lag of live readings while the
    /// backlog drains, the drain rate, bytes on the wire and spool bytes
    /// per reading.
    Wan(WanArgs),
    /// Throughput against the broker's in-flight window: a burst drained
    /// at windows 20 and 100 by the ceiling subscriber, the batched bridge
    /// and palletd with 1, 2, 4 and 8 connections, then palletd with one
    /// connection at a window of 1,000 (the yardstick), each on fresh
    /// services; readings/s and CPU per reading.
    Windows(WindowsArgs),
    /// The closer's cost per sealed bucket with rollups off and on: palletd
    /// (buckets) with short windows, so windows close during the run.
    Closer(CloserArgs),
    /// Hostile devices beside good sensors: the good sensors' throughput,
    /// lag and CPU without and with 1% hostile messages (wrong-clock
    /// batches, 15,000-key objects, oversized Sparkplug BIRTHs), then the
    /// database stopped for a while with both flowing: palletd's RSS and
    /// the dead letters' bytes in the spool against their budgets.
    Hostile(HostileArgs),
    /// A flood of Sparkplug B BIRTHs under ever new edge nodes and devices
    /// (1,000 x 1,000 by default): palletd's peak RSS against its RSS
    /// before the flood (the yardstick) and the state's budget, the nodes
    /// forgotten, and whether a node born after the flood is stored.
    SparkplugFlood(SparkplugFloodArgs),
    /// The Sparkplug B state alone, in this process (what
    /// `sparkplug-flood` runs as a child of its own): the flood's messages
    /// through palletd's decoder, with a snapshot made a chunk at a time
    /// after every 1,000, and the process's RSS growth against the
    /// state's estimate and budget. JSON on stdout.
    #[command(hide = true)]
    SparkplugState(SparkplugFloodArgs),
    /// History arriving late: years of hourly readings of a few weather
    /// stations published as fast as the broker takes them, window 1h
    /// (every reading its own bucket), rollups off and then 1h + 1d + 7d,
    /// beside a probe of the server's own single-sample upsert rate by
    /// `_id` (the ceiling here).
    Backfill(BackfillArgs),
    /// Reading a week back through `/api/series`: sensors with a week of
    /// a reading a minute stored through palletd with an hourly rollup,
    /// then one sensor's week at an hour a point (168 points) from each
    /// source (`source=rollup`, `windows`, `samples`), many times: the time
    /// per answer and what the server did for it (serverStatus: queries,
    /// documents returned, bytes sent and received), and palletd's CPU.
    Series(SeriesArgs),
    /// What a reading costs on disk: the same readings (the simulator's
    /// three fields at 1/s, and hourly weather readings) stored as
    /// palletd's buckets (sealed), as a time series collection (palletd's
    /// `timeseries` mode) and as one document per reading, each on fresh
    /// services: bytes per reading from collStats and from the server's
    /// data directory, and where a sealed bucket spends its bytes.
    Density(DensityArgs),
    /// What a flush command carries per reading on the wire, without a
    /// server: the simulator's readings of 1,000 sensors planned and built
    /// into statements by palletd's own code, k readings per statement (the
    /// samples a sensor collects within `flush.max_delay`), compressed
    /// with zstd as the driver does; then the same without each part
    /// (the string `_id`, first/last, `lsns`, the caps, `$setOnInsert`)
    /// to say what each costs, and the latest-value command beside it.
    Wire(WireArgs),
    /// Live sensors with rollups off and on: ingest rate, lag and CPU of
    /// 1,000 sensors at one reading a second each, without rollups and with
    /// hourly and daily ones kept `partial` (so every closer run computes
    /// the open intervals of every sensor: the most rollup work a live
    /// hour brings, every minute).
    LiveRollups(LiveRollupsArgs),
    /// A backlog of uncertain readings: the database stopped while many
    /// sensors' readings over many windows are spooled, then palletd killed
    /// (SIGKILL) and started again as the database comes back, so every
    /// spooled reading must be resolved before it is written; beside the
    /// same backlog drained without a crash.
    Replay(ReplayArgs),
    /// The database's statement rate with a long history stored: palletd
    /// (buckets, `flush.max_delay = "200ms"`, so the database is what
    /// limits) on an empty collection, then on one holding a month of
    /// hourly buckets of every sensor.
    History(HistoryArgs),
    /// A long run at one rate with palletd's defaults (many slow sensors
    /// by default: 100,000 at one reading in 20 s each): every interval's
    /// durable rate, live lag, flush delay in force, statements per
    /// reading and RSS, and the two halves' lag side by side (flat, or
    /// growing?).
    Soak(SoakArgs),
    /// What each thinning rule stores of real series (statsmodels' CO2,
    /// El Nino, sunspots and Nile data), the hourly weather of `backfill`
    /// and the simulator's walk: points stored and the largest error of a
    /// reader interpolating linearly, and of one holding each stored
    /// value, against the source. No services; the table of
    /// docs/storage.md.
    Thinning(ThinningArgs),
}

#[derive(clap::Args)]
struct ThinningArgs {
    /// Where `scripts/install-test-services` put the datasets.
    #[arg(long)]
    data: Option<PathBuf>,
}

#[derive(clap::Args)]
struct SoakArgs {
    #[arg(long, default_value_t = 100_000)]
    sensors: usize,
    /// Readings per second, all sensors together.
    #[arg(long, default_value_t = 5000.0)]
    rate: f64,
    /// Seconds of the run.
    #[arg(long, default_value_t = 600)]
    secs: u64,
    /// Seconds per reported interval.
    #[arg(long, default_value_t = 30)]
    every: u64,
    /// More palletd settings (TOML appended to its configuration).
    #[arg(long, default_value = "")]
    tail: String,
    /// Measure the ceiling subscriber at these sensors first (its probe
    /// and steps, fresh services) and soak at this fraction of it instead
    /// of `--rate`: "the highest rate sustained against the same run's
    /// ceiling", judged by the lag over the halves, which a step cannot
    /// judge while palletd stretches its delay.
    #[arg(long)]
    of_ceiling: Option<f64>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct HistoryArgs {
    /// Sensor counts, comma-separated.
    #[arg(long, default_value = "1000,10000", value_delimiter = ',')]
    sensors: Vec<usize>,
    /// Days of hourly buckets per sensor stored before the run.
    #[arg(long, default_value_t = 30)]
    days: usize,
    /// Readings per second offered, all sensors together.
    #[arg(long, default_value_t = 5000.0)]
    rate: f64,
    /// Seconds of each measured step.
    #[arg(long, default_value_t = 60)]
    secs: u64,
    /// Seconds of quiet after the prefill (after an `fsync`), so the
    /// server's checkpoint of what was just inserted is not measured.
    #[arg(long, default_value_t = 60)]
    settle: u64,
    /// Seconds of the warm-up step before the measured one (palletd's
    /// first flushes, the server's cache filling with the current windows).
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct ReplayArgs {
    #[arg(long, default_value_t = 100)]
    sensors: usize,
    /// Windows (of one minute) per sensor.
    #[arg(long, default_value_t = 50)]
    windows: usize,
    /// Readings per sensor and window.
    #[arg(long, default_value_t = 100)]
    per_window: usize,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct LiveRollupsArgs {
    #[arg(long, default_value_t = 1000)]
    sensors: usize,
    /// Readings per second, all sensors together.
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Seconds of each measured run.
    #[arg(long, default_value_t = 600)]
    secs: u64,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct BackfillArgs {
    /// Weather stations.
    #[arg(long, default_value_t = 3)]
    sensors: usize,
    /// Hours of history per station, one reading an hour (a year: 8,760).
    #[arg(long, default_value_t = 8760)]
    hours: usize,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct SeriesArgs {
    /// Sensors, each with `days` of a reading a minute.
    #[arg(long, default_value_t = 10)]
    sensors: usize,
    #[arg(long, default_value_t = 7)]
    days: usize,
    /// Answers asked of each source.
    #[arg(long, default_value_t = 50)]
    repeat: usize,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct WireArgs {
    /// Sensors in one flush.
    #[arg(long, default_value_t = 1000)]
    sensors: usize,
    /// Readings per sensor per statement, comma-separated.
    #[arg(long, default_value = "1,3,10", value_delimiter = ',')]
    per_statement: Vec<usize>,
}

#[derive(clap::Args)]
struct DensityArgs {
    /// Sensors of the simulator's data, one reading a second each.
    #[arg(long, default_value_t = 100)]
    sensors: usize,
    /// Hours of the simulator's data per sensor.
    #[arg(long, default_value_t = 1)]
    sim_hours: usize,
    /// Weather stations of the hourly data.
    #[arg(long, default_value_t = 20)]
    stations: usize,
    /// Hours of hourly data per station (a year: 8,760).
    #[arg(long, default_value_t = 8760)]
    hours: usize,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct SparkplugFloodArgs {
    /// Edge nodes, each with an NBIRTH.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Devices per node, each with a DBIRTH of three metrics.
    #[arg(long, default_value_t = 1000)]
    devices: usize,
    /// palletd's limits.max_memory (the state may take an eighth).
    #[arg(long, default_value = "256MiB")]
    max_memory: String,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct HostileArgs {
    /// Good sensors.
    #[arg(long, default_value_t = 1000)]
    sensors: usize,
    /// Good readings per second, all sensors together (one per message).
    /// Half of what this 2-core box sustains: at its ceiling any added CPU
    /// lengthens the queues, and the comparison says nothing of the
    /// hostile input.
    #[arg(long, default_value_t = 5000.0)]
    rate: f64,
    /// Hostile messages' share of all messages.
    #[arg(long, default_value_t = 0.01)]
    share: f64,
    /// Seconds of each measured phase.
    #[arg(long, default_value_t = 60)]
    secs: u64,
    /// Seconds the database is stopped (SIGSTOP) in the last phase.
    #[arg(long, default_value_t = 60)]
    outage_secs: u64,
    /// palletd's spool.max_size (dead letters may take a tenth).
    #[arg(long, default_value = "256MiB")]
    spool_max_size: String,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct CloserArgs {
    #[arg(long, default_value_t = 1000)]
    sensors: usize,
    /// Readings per second, all sensors together.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    /// Seconds of load per variant.
    #[arg(long, default_value_t = 120)]
    secs: u64,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct WanArgs {
    /// Round trip of the link, ms.
    #[arg(long, default_value_t = 200)]
    rtt_ms: u64,
    /// Bandwidth each way, Mbit/s.
    #[arg(long, default_value_t = 2.0)]
    mbit: f64,
    #[arg(long, default_value_t = 1000)]
    sensors: usize,
    /// Readings per second, all sensors together.
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Seconds measured before the cut (after a 30 s warm-up): the lag
    /// without a backlog, bytes on the wire.
    #[arg(long, default_value_t = 120)]
    before_secs: u64,
    /// Seconds the link is cut (0: no cut).
    #[arg(long, default_value_t = 600)]
    cut_secs: u64,
    /// The longest wait for the backlog to drain, seconds.
    #[arg(long, default_value_t = 1800)]
    drain_limit_secs: u64,
    /// Seconds after the link returns before live lag is counted: the write
    /// that waited out the cut (readings from before it) and the first
    /// flushes of readings that waited for the link land in this time.
    #[arg(long, default_value_t = 30)]
    settle_secs: u64,
    /// Storage mode: buckets or timeseries.
    #[arg(long, default_value = "buckets")]
    mode: String,
    /// Wire compressors palletd offers ("zstd", "none").
    #[arg(long, default_value = "zstd")]
    compressors: String,
    /// `[mongodb] compression_level` (palletd's default when absent).
    #[arg(long)]
    compression_level: Option<i32>,
    /// `[flush] max_delay`.
    #[arg(long, default_value = "10s")]
    max_delay: String,
    /// Readings per second of the probe sensor (0: none): the bench
    /// publishes them itself and watches the database directly (not through
    /// the link) for each, so its publish-to-durable lag is measured from
    /// outside palletd.
    #[arg(long, default_value_t = 2.0)]
    probe_rate: f64,
    /// Seconds after the link returns whose probe readings count as "after
    /// the cut".
    #[arg(long, default_value_t = 30)]
    after_secs: u64,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct WindowsArgs {
    /// The broker's in-flight windows compared (`max_inflight_messages`).
    #[arg(long, default_value = "20,100", value_delimiter = ',')]
    windows: Vec<u16>,
    /// palletd's `mqtt.connections` compared at each window.
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',')]
    connections: Vec<usize>,
    /// The window palletd with one connection runs at last, the yardstick.
    #[arg(long, default_value_t = 1000)]
    yardstick_window: u16,
    /// Seconds of overload each sink drains (the first of `--sensors`
    /// sensors, as fast as the simulator publishes).
    #[arg(long, default_value_t = 20)]
    secs: u64,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args)]
struct QueryRssArgs {
    /// Readings of the one sensor (1 Hz, 900-sample buckets, 4 per hour).
    #[arg(long, default_value_t = 10_000_000)]
    rows: u64,
    /// Other palletd builds to measure on the same data (an older commit).
    #[arg(long)]
    also: Vec<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// Seconds per step (after the warm-up).
    #[arg(long, default_value_t = 60)]
    step_secs: u64,
    /// Seconds of warm-up before the first measured step.
    #[arg(long, default_value_t = 10)]
    warmup_secs: u64,
    /// Sensor counts, comma-separated.
    #[arg(long, default_value = "1000,10000,100000", value_delimiter = ',')]
    sensors: Vec<usize>,
    /// Scenarios, comma-separated.
    #[arg(
        long,
        default_value = "ceiling,buckets,timeseries,batched,batched-plain,naive,naive16",
        value_delimiter = ','
    )]
    scenarios: Vec<String>,
    /// Messages the broker lets be in flight per client (Mosquitto's
    /// `max_inflight_messages`; its default is 20); every sink's window
    /// matches it.
    #[arg(long, default_value_t = 1000)]
    inflight: u16,
    /// Messages the broker queues per client (`max_queued_messages`; 0 is
    /// no limit, Mosquitto's default is 1000).
    #[arg(long, default_value_t = 0)]
    queued: u32,
    /// The batched bridges' batch (Telegraf's `metric_batch_size` and
    /// `max_undelivered_messages`); the broker's in-flight window unless
    /// set. Larger than the window, the bridge stalls: it waits its flush
    /// interval for a batch the broker never sends.
    #[arg(long)]
    batch: Option<usize>,
    /// Skip sensor counts for scenarios that cannot keep up with them at
    /// all (the naive bridges at 100,000 sensors), as "scenario/sensors".
    #[arg(
        long,
        default_value = "naive/100000,naive16/100000",
        value_delimiter = ','
    )]
    skip: Vec<String>,
    /// Offer exactly these total rates (readings/s) one step each, instead
    /// of probing and stepping (for profiling; no lag step).
    #[arg(long, value_delimiter = ',')]
    rates: Vec<f64>,
    /// Where the JSON results go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// The palletd binary (release build).
    #[arg(long, default_value = "target/release/palletd")]
    palletd: PathBuf,
    #[arg(long, default_value = "/usr/sbin/mosquitto")]
    mosquitto: PathBuf,
    /// The SecantusDB server (scripts/bench passes the installed one).
    #[arg(long, default_value = "secantusd-rs")]
    secantusd: PathBuf,
}

#[derive(clap::Args)]
struct SinkArgs {
    #[arg(long)]
    kind: String,
    #[arg(long)]
    broker_port: u16,
    #[arg(long)]
    mongodb: String,
    #[arg(long)]
    metrics_port: u16,
    /// The broker's in-flight window.
    #[arg(long, default_value_t = 1000)]
    inflight: u16,
    /// The batched bridge's batch size.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::Run(args) => run(args),
        Cli::Sink(args) => tokio::runtime::Runtime::new()?.block_on(sink(args)),
        Cli::QueryRss(args) => query_rss(args),
        Cli::Wan(args) => wan(args),
        Cli::Windows(args) => windows(args),
        Cli::Closer(args) => closer(args),
        Cli::Hostile(args) => hostile(args),
        Cli::SparkplugFlood(args) => sparkplug_flood(args),
        Cli::SparkplugState(args) => sparkplug_state(args),
        Cli::LiveRollups(args) => live_rollups(args),
        Cli::Soak(args) => soak(args),
        Cli::Thinning(args) => thinning_table(args),
        Cli::Replay(args) => replay(args),
        Cli::History(args) => history(args),
        Cli::Backfill(args) => backfill(args),
        Cli::Series(args) => series(args),
        Cli::Density(args) => density(args),
        Cli::Wire(args) => wire(args),
    }
}

// ------------------------------------------------------------------ WAN

fn wan(args: WanArgs) -> anyhow::Result<()> {
    use palletd::netem::{Link, Proxy};
    let svc = Services::start(&args.run)?;
    let rt = tokio::runtime::Runtime::new()?;
    let link = Link {
        one_way: Duration::from_millis(args.rtt_ms / 2),
        bytes_per_sec: (args.mbit * 1e6 / 8.0) as u64,
    };
    let proxy = rt.block_on(Proxy::link(svc.db_port, link))?;
    let mut compressors = match args.compressors.as_str() {
        "none" => "compressors = []".to_string(),
        c => format!("compressors = [\"{c}\"]"),
    };
    if let Some(level) = args.compression_level {
        compressors += &format!("\ncompression_level = {level}");
    }
    let sink = start_sink_with(
        &args.run,
        &args.mode,
        &svc,
        &proxy.mongodb_uri(""),
        &compressors,
        "max_size = \"8GiB\"",
        &format!("[flush]\nmax_delay = \"{}\"", args.max_delay),
    )?;
    let probe = (args.probe_rate > 0.0).then(|| {
        Probe::start(
            &rt,
            svc.broker_port,
            svc.mongodb_uri(),
            args.probe_rate,
            &args.mode,
        )
    });
    let total_secs = 30 + args.before_secs + args.cut_secs + args.drain_limit_secs + 60;
    let mut sim = simulator(&args.run, &svc, args.sensors, args.rate, total_secs)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let decoded = |s: &Sink| -> f64 {
        http_get(s.procs[0].1, "/metrics")
            .ok()
            .and_then(|b| {
                b.lines()
                    .find(|l| l.starts_with(palletd::telemetry::SAMPLES_DECODED))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            })
            .unwrap_or(0.0)
    };
    eprintln!("warm-up 30 s");
    std::thread::sleep(Duration::from_secs(30));
    // Without a backlog.
    let (s0, b0) = (sink.scrape()?, proxy.bytes());
    let cpu0 = sink.cpu();
    let before_from = palletd::clock::now_ms();
    eprintln!("measuring {} s without a backlog", args.before_secs);
    std::thread::sleep(Duration::from_secs(args.before_secs));
    let (s1, b1) = (sink.scrape()?, proxy.bytes());
    let cpu = sink.cpu().saturating_sub(cpu0);
    let stored = (s1.stored - s0.stored).max(1.0);
    let mut out = json!({
        "scenario": "wan",
        "mode": args.mode,
        "compressors": args.compressors,
        "rtt_ms": args.rtt_ms,
        "mbit": args.mbit,
        "sensors": args.sensors,
        "rate": args.rate,
        "stored_per_s": stored / args.before_secs as f64,
        "wire_bytes_up_per_reading": (b1.0 - b0.0) as f64 / stored,
        "wire_bytes_down_per_reading": (b1.1 - b0.1) as f64 / stored,
        "cpu_us_per_reading": cpu.as_secs_f64() * 1e6 / stored,
        "lag_p50_s": quantile(&s0.live_age, &s1.live_age, 0.5),
        "lag_p99_s": quantile(&s0.live_age, &s1.live_age, 0.99),
    });
    let before_to = palletd::clock::now_ms();
    eprintln!("{out}");
    if args.cut_secs > 0 {
        let spool_dir = svc.dir.path().join("spool-0");
        let spool_before = spool_sizes(&spool_dir)?;
        let decoded_before = decoded(&sink);
        eprintln!("link cut for {} s", args.cut_secs);
        proxy.cut();
        std::thread::sleep(Duration::from_secs(args.cut_secs));
        let spool_after = spool_sizes(&spool_dir)?;
        let spooled = (decoded(&sink) - decoded_before).max(1.0);
        out["spool_bytes_per_reading"] =
            json!((spool_after.0 as f64 - spool_before.0 as f64) / spooled);
        out["spool_plain_bytes_per_reading"] =
            json!((spool_after.1 as f64 - spool_before.1 as f64) / spooled);
        proxy.restore();
        let restored = Instant::now();
        let restored_ms = palletd::clock::now_ms();
        let s2 = sink.scrape()?;
        eprintln!("link restored; draining");
        let mut peak_backlog: f64 = 0.0;
        let mut drained = None;
        let mut s3 = s2.clone();
        let mut settled = None;
        while restored.elapsed() < Duration::from_secs(args.drain_limit_secs) {
            std::thread::sleep(Duration::from_secs(1));
            s3 = sink.scrape()?;
            if settled.is_none() && restored.elapsed() >= Duration::from_secs(args.settle_secs) {
                settled = Some(s3.clone());
            }
            peak_backlog = peak_backlog.max(s3.backlog_readings);
            let caught_up = s3.stored >= decoded(&sink) - args.rate * 15.0;
            if restored.elapsed() > Duration::from_secs(5)
                && s3.backlog_readings == 0.0
                && caught_up
            {
                drained = Some(restored.elapsed().as_secs_f64());
                break;
            }
        }
        out["backlog_readings_peak"] = json!(peak_backlog);
        out["drained_after_s"] = json!(drained);
        out["drain_per_s"] = json!(drained.map(|d| peak_backlog / d));
        out["live_lag_p50_from_restore_s"] = json!(quantile(&s2.live_age, &s3.live_age, 0.5));
        out["live_lag_p99_from_restore_s"] = json!(quantile(&s2.live_age, &s3.live_age, 0.99));
        out["settle_s"] = json!(args.settle_secs);
        if let Some(s) = &settled {
            out["live_lag_p50_while_draining_s"] = json!(quantile(&s.live_age, &s3.live_age, 0.5));
            out["live_lag_p99_while_draining_s"] = json!(quantile(&s.live_age, &s3.live_age, 0.99));
        }
        if let Some(probe) = &probe {
            // Every probe reading of the window after the cut stored, or a
            // minute more at most.
            let after_to = restored_ms + args.after_secs as i64 * 1000;
            let deadline = Instant::now() + Duration::from_secs(60);
            while (palletd::clock::now_ms() < after_to + 1000
                || probe.unseen(restored_ms, after_to) > 0)
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            // (The last 15 s before the cut are left out: their flushes
            // meet the cut.)
            let mut before = probe.lags(before_from, before_to - 15_000);
            let mut after = probe.lags(restored_ms, after_to);
            out["probe_rate"] = json!(args.probe_rate);
            out["probe_lag_p50_before_s"] = json!(quantile_of(&mut before, 0.5));
            out["probe_lag_p99_before_s"] = json!(quantile_of(&mut before, 0.99));
            out["probe_lag_p50_after_s"] = json!(quantile_of(&mut after, 0.5));
            out["probe_lag_p99_after_s"] = json!(quantile_of(&mut after, 0.99));
            out["probe_lag_max_after_s"] = json!(after.last());
            out["probe_after_secs"] = json!(args.after_secs);
            out["probe_restored_ms"] = json!(restored_ms);
        }
    }
    if let Some(probe) = &probe {
        // Everything the probe published stored, or a minute more at most.
        probe.quiet.cancel();
        let deadline = Instant::now() + Duration::from_secs(60);
        while probe.unseen(0, i64::MAX) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
        }
        let (published, once, more) = probe.tally();
        let restored = out["probe_restored_ms"].as_i64().unwrap_or(0);
        out["probe_unseen_s_after_restore"] = json!(probe
            .unseen_ts()
            .iter()
            .map(|ts| (ts - restored) as f64 / 1000.0)
            .collect::<Vec<_>>());
        out["probe_published"] = json!(published);
        out["probe_stored_once"] = json!(once);
        out["probe_stored_more_than_once"] = json!(more);
    }
    let _ = sim.kill();
    let _ = sim.wait();
    drop(sink);
    println!("{}", serde_json::to_string_pretty(&out)?);
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!(
        "wan-{}-{}-{}.json",
        args.mode,
        args.compressors,
        chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ")
    );
    std::fs::write(args.run.out.join(name), serde_json::to_string_pretty(&out)?)?;
    Ok(())
}

/// Publish time (ms) of each probe reading -> when first seen stored (ms;
/// absent while not seen), and how many copies were seen.
type ProbeSeen = Arc<std::sync::Mutex<BTreeMap<i64, (Option<i64>, u32)>>>;

/// The WAN scenario's probe: one sensor the bench publishes itself (QoS 1,
/// stamped with the time of publishing) and watches for in the database
/// directly, every 100 ms, so each reading's publish-to-durable lag is
/// measured from outside palletd.
struct Probe {
    seen: ProbeSeen,
    stop: tokio_util::sync::CancellationToken,
    /// Stops the publishing alone.
    quiet: tokio_util::sync::CancellationToken,
}

impl Probe {
    const SENSOR: &'static str = "probe";

    fn start(
        rt: &tokio::runtime::Runtime,
        broker: u16,
        uri: String,
        rate: f64,
        mode: &str,
    ) -> Probe {
        let seen: ProbeSeen = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let mut opts = MqttOptions::new("bench-probe", "127.0.0.1", broker);
        opts.set_clean_session(false);
        let (client, mut eventloop) = AsyncClient::new(opts, 100);
        let halt = stop.clone();
        rt.spawn(async move {
            loop {
                tokio::select! {
                    _ = halt.cancelled() => return,
                    e = eventloop.poll() => if e.is_err() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    },
                }
            }
        });
        let quiet = stop.child_token();
        let (published, halt) = (seen.clone(), quiet.clone());
        let every = Duration::from_secs_f64(1.0 / rate);
        rt.spawn(async move {
            let topic = TOPIC.replace("{sensor}", Probe::SENSOR);
            let mut tick = tokio::time::interval(every);
            let mut last = 0;
            while !halt.is_cancelled() {
                tick.tick().await;
                // Distinct milliseconds, so each reading is its own key.
                let ts = palletd::clock::now_ms().max(last + 1);
                last = ts;
                published.lock().unwrap().insert(ts, (None, 0));
                let payload = json!({ "ts": ts, "v": ts % 1000 }).to_string();
                let _ = client
                    .publish(&topic, QoS::AtLeastOnce, false, payload)
                    .await;
            }
        });
        let (watched, halt, buckets) = (seen.clone(), stop.clone(), mode == "buckets");
        rt.spawn(async move {
            let client = match mongodb::Client::with_uri_str(&uri).await {
                Ok(c) => c,
                Err(e) => return eprintln!("probe watcher: {e}"),
            };
            let coll = client
                .database("bench")
                .collection::<bson::Document>("readings");
            while !halt.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let found = match probe_stored(&coll, buckets).await {
                    Ok(f) => f,
                    Err(_) => continue,
                };
                let now = palletd::clock::now_ms();
                let mut seen = watched.lock().unwrap();
                let mut copies: HashMap<i64, u32> = HashMap::new();
                for ts in found {
                    *copies.entry(ts).or_default() += 1;
                }
                for (ts, n) in copies {
                    let e = seen.entry(ts).or_insert((None, 0));
                    e.0.get_or_insert(now);
                    e.1 = e.1.max(n);
                }
            }
        });
        Probe { seen, stop, quiet }
    }

    /// Readings published in `[from, to)` (ms) not seen stored yet.
    fn unseen(&self, from: i64, to: i64) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.range(from..to)
            .filter(|(_, (at, _))| at.is_none())
            .count()
    }

    /// Lags (s) of the readings published in `[from, to)` (ms), those not
    /// stored yet counted as now.
    fn lags(&self, from: i64, to: i64) -> Vec<f64> {
        let now = palletd::clock::now_ms();
        let seen = self.seen.lock().unwrap();
        seen.range(from..to)
            .map(|(ts, (at, _))| (at.unwrap_or(now) - ts) as f64 / 1000.0)
            .collect()
    }

    /// The readings not seen stored (their publish times, ms).
    fn unseen_ts(&self) -> Vec<i64> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(_, (at, _))| at.is_none())
            .map(|(ts, _)| *ts)
            .collect()
    }

    /// Readings published, those stored once, those stored more than once.
    fn tally(&self) -> (usize, usize, usize) {
        let seen = self.seen.lock().unwrap();
        let once = seen
            .values()
            .filter(|(at, n)| at.is_some() && *n == 1)
            .count();
        let more = seen.values().filter(|(_, n)| *n > 1).count();
        (seen.len(), once, more)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The probe's readings stored (their timestamps, a copy each).
async fn probe_stored(
    coll: &mongodb::Collection<bson::Document>,
    buckets: bool,
) -> anyhow::Result<Vec<i64>> {
    let mut out = Vec::new();
    let filter = doc! { "sensorId": Probe::SENSOR };
    if buckets {
        let mut cur = coll
            .find(filter)
            .projection(doc! { "samples.ts": 1 })
            .await?;
        while let Some(d) = cur.try_next().await? {
            for s in d.get_array("samples")? {
                if let Some(t) = s.as_document().and_then(|s| s.get_datetime("ts").ok()) {
                    out.push(t.timestamp_millis());
                }
            }
        }
    } else {
        let mut cur = coll.find(filter).projection(doc! { "ts": 1 }).await?;
        while let Some(d) = cur.try_next().await? {
            out.push(d.get_datetime("ts")?.timestamp_millis());
        }
    }
    Ok(out)
}

/// The `q` quantile of `xs` (sorted in place); `None` when empty.
fn quantile_of(xs: &mut [f64], q: f64) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    let i = ((xs.len() as f64 * q).ceil() as usize).checked_sub(1)?;
    xs.get(i.min(xs.len() - 1)).copied()
}

/// The spool's bytes on disk, and as they would be uncompressed.
fn spool_sizes(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let (mut disk, mut plain) = (0, 0);
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        let name = path.to_string_lossy().to_string();
        let len = std::fs::metadata(&path)?.len();
        if name.ends_with(".seg.zst") {
            disk += len;
            let mut d = zstd::stream::read::Decoder::new(std::fs::File::open(&path)?)?;
            plain += std::io::copy(&mut d, &mut std::io::sink())?;
        } else if name.ends_with(".seg") {
            disk += len;
            plain += len;
        }
    }
    Ok((disk, plain))
}

// --------------------------------------------------------------- closer

/// What the closer did, from palletd's metrics (`seconds` from the
/// histogram's `_sum`, read separately).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
struct CloserFigures {
    runs: f64,
    seconds: f64,
    /// Rollup passes (on their own task) and their time.
    passes: f64,
    pass_seconds: f64,
    sealed: f64,
    rollup_statements: f64,
    rollups_written: f64,
    stored: f64,
}

fn closer_figures(sink: &Sink) -> anyhow::Result<CloserFigures> {
    let body = http_get(sink.procs[0].1, "/metrics")?;
    let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))?;
    let mut f = CloserFigures::default();
    for s in parsed.samples {
        let counter = match &s.value {
            prometheus_parse::Value::Counter(v) => Some(*v),
            _ => None,
        };
        match s.metric.as_str() {
            m if m == palletd::telemetry::CLOSER_SECONDS => {
                if let prometheus_parse::Value::Histogram(h) = &s.value {
                    f.runs = h.iter().map(|b| b.count).fold(0.0, f64::max);
                }
            }
            m if m == palletd::telemetry::ROLLUP_PASS_SECONDS => {
                if let prometheus_parse::Value::Histogram(h) = &s.value {
                    f.passes = h.iter().map(|b| b.count).fold(0.0, f64::max);
                }
            }
            m if m == palletd::telemetry::BUCKETS_SEALED => f.sealed = counter.unwrap_or(0.0),
            m if m == palletd::telemetry::ROLLUP_STATEMENTS => {
                f.rollup_statements = counter.unwrap_or(0.0)
            }
            m if m == palletd::telemetry::ROLLUPS_WRITTEN => {
                f.rollups_written = counter.unwrap_or(0.0)
            }
            m if m == palletd::telemetry::SAMPLES_STORED => f.stored = counter.unwrap_or(0.0),
            _ => {}
        }
    }
    Ok(f)
}

/// The histogram's sum is not in prometheus_parse's histogram value:
/// read it from the text.
fn histogram_sum(port: u16, name: &str) -> anyhow::Result<f64> {
    let body = http_get(port, "/metrics")?;
    let line = body
        .lines()
        .find(|l| l.starts_with(&format!("{name}_sum")))
        .unwrap_or_default();
    Ok(line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0))
}

fn closer(args: CloserArgs) -> anyhow::Result<()> {
    // Windows of 10 s sealed 2 s after they end, the closer every 5 s;
    // rollups of 30 s and 1 min, so both fall due during the run.
    let common = "[bucket]\nwindow = \"10s\"\n[closer]\ninterval = \"5s\"\ngrace = \"2s\"\n[flush]\nmax_delay = \"2s\"\n";
    let rollups = "[[rollup]]\ninterval = \"30s\"\n[[rollup]]\ninterval = \"1m\"\n";
    let mut rows = Vec::new();
    for (label, tail) in [
        ("rollups off", common.to_string()),
        ("rollups 30s + 1m", format!("{common}{rollups}")),
    ] {
        eprintln!("== closer, {label}");
        let svc = Services::start(&args.run)?;
        let sink = buckets_sink(&args.run, &svc, &tail)?;
        let port = sink.procs[0].1;
        let mut before = closer_figures(&sink)?;
        before.seconds = histogram_sum(port, palletd::telemetry::CLOSER_SECONDS)?;
        before.pass_seconds = histogram_sum(port, palletd::telemetry::ROLLUP_PASS_SECONDS)?;
        let m = step(&args.run, &svc, &sink, args.sensors, args.rate, args.secs)?;
        // The windows of the last readings close too.
        std::thread::sleep(Duration::from_secs(20));
        let mut after = closer_figures(&sink)?;
        after.seconds = histogram_sum(port, palletd::telemetry::CLOSER_SECONDS)?;
        after.pass_seconds = histogram_sum(port, palletd::telemetry::ROLLUP_PASS_SECONDS)?;
        let d = CloserFigures {
            runs: after.runs - before.runs,
            seconds: after.seconds - before.seconds,
            passes: after.passes - before.passes,
            pass_seconds: after.pass_seconds - before.pass_seconds,
            sealed: after.sealed - before.sealed,
            rollup_statements: after.rollup_statements - before.rollup_statements,
            rollups_written: after.rollups_written - before.rollups_written,
            stored: after.stored - before.stored,
        };
        eprintln!("  {d:?} ({:.0}/s durable)", m.step.achieved_per_s);
        let bytes = tokio::runtime::Runtime::new()?.block_on(sealed_bytes(&svc.mongodb_uri()))?;
        eprintln!(
            "  sealed buckets: {} readings in {} buckets, {:.1} bytes per reading, of which lsns {:.2}; {} of {} still carry lsns",
            bytes.readings, bytes.buckets, bytes.bytes as f64 / bytes.readings.max(1) as f64,
            bytes.lsns_bytes as f64 / bytes.readings.max(1) as f64, bytes.with_lsns, bytes.buckets,
        );
        rows.push((label, d, m.step));
    }
    println!("| closer | runs | sealed buckets | seal ms / sealed bucket | rollup pass ms / sealed bucket | statements / sealed bucket | rollups written | offered / durable readings/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (label, d, step) in &rows {
        let sealed = d.sealed.max(1.0);
        // The seal is one update statement per run; rollups add theirs.
        let statements = d.runs + d.rollup_statements;
        println!(
            "| {label} | {:.0} | {:.0} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} / {:.0}{} |",
            d.runs,
            d.sealed,
            d.seconds * 1000.0 / sealed,
            d.pass_seconds * 1000.0 / sealed,
            statements / sealed,
            d.rollups_written,
            step.target_per_s,
            step.achieved_per_s,
            if step.sustained {
                ""
            } else {
                " (not sustained)"
            }
        );
    }
    Ok(())
}

// -------------------------------------------------------------- density

/// Readings in arrival order: (sensor, payload with `ts` in ms).
type Readings = Box<dyn Iterator<Item = (String, serde_json::Value)>>;

/// A data set of the density scenario: its name, how many readings, the
/// bucket window palletd stores it under, and its readings in arrival
/// order (sensor, payload with `ts` in ms).
struct DensitySet {
    name: &'static str,
    readings: usize,
    window: &'static str,
    granularity: &'static str,
    messages: Box<dyn Fn() -> Readings>,
}

/// The simulator's readings (`palletd simulate`: temperature, humidity
/// and pressure walking randomly, rounded to 0.01) of `sensors` sensors at
/// one a second for `hours`, ending two hours ago; and hourly weather
/// readings (the backfill's) of `stations` for `hours`, window 7d (168 a
/// bucket: an hourly sensor's readings in buckets of a day would be 24).
fn density_sets(
    sensors: usize,
    sim_hours: usize,
    stations: usize,
    hours: usize,
) -> Vec<DensitySet> {
    use rand::{Rng, SeedableRng};
    let hour = 3_600_000i64;
    let now = chrono::Utc::now().timestamp_millis() / hour * hour;
    let secs = sim_hours * 3600;
    let sim_first = now - 2 * hour - secs as i64 * 1000;
    // Ending where a window of 7 days ends (windows start at the epoch),
    // so the closer seals every bucket.
    let week = 7 * 24 * hour;
    let hourly_first = now / week * week - hours as i64 * hour;
    vec![
        DensitySet {
            name: "simulator, 3 fields at 1/s",
            readings: sensors * secs,
            window: "1h",
            granularity: "seconds",
            messages: Box::new(move || {
                let mut walks: Vec<(f64, f64, f64, rand::rngs::StdRng)> = (0..sensors)
                    .map(|s| {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(s as u64);
                        let start = (
                            rng.gen_range(15.0..25.0),
                            rng.gen_range(35.0..65.0),
                            rng.gen_range(990.0..1030.0),
                        );
                        (start.0, start.1, start.2, rng)
                    })
                    .collect();
                let mut i = 0;
                Box::new(std::iter::from_fn(move || {
                    if i >= sensors * secs {
                        return None;
                    }
                    let (t, s) = (i / sensors, i % sensors);
                    i += 1;
                    let w = &mut walks[s];
                    w.0 = (w.0 + w.3.gen_range(-0.1..0.1)).clamp(-40.0, 85.0);
                    w.1 = (w.1 + w.3.gen_range(-0.3..0.3)).clamp(0.0, 100.0);
                    w.2 = (w.2 + w.3.gen_range(-0.2..0.2)).clamp(900.0, 1100.0);
                    let round = |x: f64| (x * 100.0).round() / 100.0;
                    let v = json!({
                        "ts": sim_first + t as i64 * 1000,
                        "temp": round(w.0), "humidity": round(w.1), "pressure": round(w.2),
                    });
                    Some((format!("s{s:05}"), v))
                }))
            }),
        },
        DensitySet {
            name: "hourly weather, 3 fields",
            readings: stations * hours,
            window: "7d",
            granularity: "hours",
            messages: Box::new(move || {
                Box::new((0..hours).flat_map(move |h| {
                    (0..stations).map(move |s| {
                        let mut v = weather(s, h);
                        v["ts"] = json!(hourly_first + h as i64 * hour);
                        (format!("station-{s}"), v)
                    })
                }))
            }),
        },
    ]
}

/// Where a layout's bytes are, for one data set.
#[derive(Debug, Default, serde::Serialize)]
struct Density {
    set: String,
    layout: String,
    readings: usize,
    documents: u64,
    /// collStats: `size` (the documents' BSON), `storageSize`,
    /// `totalIndexSize`; `None` where the server does not answer it.
    coll_size: Option<f64>,
    storage_size: Option<f64>,
    index_size: Option<f64>,
    /// The server's table files after a checkpoint, less their size
    /// before ([`table_bytes`]): documents, indexes.
    doc_file_bytes: u64,
    index_file_bytes: u64,
}

/// SecantusDB's table files in its data directory (WiredTiger): the
/// documents' (`secantus_documents_*`) and the indexes' (index entries,
/// natural order, unique keys); the journal (`WiredTigerLog.*`, written
/// ahead in 128 MiB files) and the oplog tables are left out, as MongoDB's
/// collStats leaves them out.
fn table_bytes(dir: &Path) -> (u64, u64) {
    let (mut docs, mut indexes) = (0, 0);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let len = e.metadata().map_or(0, |m| m.len());
        if name.starts_with("secantus_documents") {
            docs += len;
        } else if [
            "secantus_index_entries",
            "secantus_natural_seq",
            "secantus_unique_keys",
        ]
        .iter()
        .any(|p| name.starts_with(p))
        {
            indexes += len;
        }
    }
    (docs, indexes)
}

fn density(args: DensityArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    let mut breakdowns = Vec::new();
    for set in density_sets(args.sensors, args.sim_hours, args.stations, args.hours) {
        for layout in [
            "palletd buckets (sealed)",
            "time series collection",
            "one document per reading",
        ] {
            eprintln!(
                "== density: {}, {layout}: {} readings",
                set.name, set.readings
            );
            let svc = Services::start(&args.run)?;
            let uri = svc.mongodb_uri();
            let db_dir = svc.dir.path().join("db");
            rt.block_on(data_bytes(&uri, &db_dir))?;
            let before = table_bytes(&db_dir);
            let started = Instant::now();
            if layout == "one document per reading" {
                rt.block_on(insert_per_reading(&uri, (set.messages)()))?;
            } else {
                let lateness = format!("{}d", args.hours / 24 + 30);
                let kind = match layout.starts_with("palletd") {
                    true => "buckets-nolatest",
                    false => "timeseries-nolatest",
                };
                let tail = format!(
                    "[bucket]\nwindow = \"{}\"\nmax_lateness = \"{lateness}\"\n[closer]\ninterval = \"1s\"\ngrace = \"1s\"\n[flush]\nmax_delay = \"2s\"\n",
                    set.window
                );
                let tail = match kind {
                    "timeseries-nolatest" => {
                        format!("storage.granularity = \"{}\"\n{tail}", set.granularity)
                    }
                    _ => tail,
                };
                let sink = start_sink_with(&args.run, kind, &svc, &uri, "", "", &tail)?;
                let port = sink.procs[0].1;
                rt.block_on(publish_acknowledged(
                    svc.broker_port,
                    "bench-density",
                    set.readings,
                    (set.messages)(),
                ))?;
                while counter_sum(port, palletd::telemetry::SAMPLES_STORED) < set.readings as f64 {
                    anyhow::ensure!(
                        started.elapsed() < Duration::from_secs(1800),
                        "not every reading was stored within 30 minutes"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
                if kind == "buckets-nolatest" {
                    rt.block_on(wait_all_sealed(&uri))?;
                }
                drop(sink);
            }
            eprintln!("  stored in {:.1} s", started.elapsed().as_secs_f64());
            rt.block_on(data_bytes(&uri, &db_dir))?;
            let after = table_bytes(&db_dir);
            let mut row = rt.block_on(coll_stats(&uri))?;
            row.set = set.name.to_string();
            row.layout = layout.to_string();
            row.readings = set.readings;
            row.doc_file_bytes = after.0.saturating_sub(before.0);
            row.index_file_bytes = after.1.saturating_sub(before.1);
            eprintln!("  {row:?}");
            rows.push(row);
            if layout.starts_with("palletd") {
                breakdowns.push((set.name, rt.block_on(bucket_breakdown(&uri))?));
                // The proposal: the same sealed buckets with a column per
                // field instead of a document per sample.
                let mut row = rt.block_on(store_columnar(&uri))?;
                rt.block_on(data_bytes(&uri, &db_dir))?;
                let (before, after) = (after, table_bytes(&db_dir));
                row.set = set.name.to_string();
                row.layout = "sealed buckets as columns (proposal)".to_string();
                row.readings = set.readings;
                row.doc_file_bytes = after.0.saturating_sub(before.0);
                row.index_file_bytes = after.1.saturating_sub(before.1);
                eprintln!("  {row:?}");
                rows.push(row);
            }
        }
    }
    println!("| data | layout | documents | collStats size / reading | storageSize / reading | totalIndexSize / reading | document files / reading | index files / reading |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let per = |x: Option<f64>| fmt(x.map(|x| x / r.readings as f64), 1);
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} |",
            r.set,
            r.layout,
            r.documents,
            per(r.coll_size),
            per(r.storage_size),
            per(r.index_size),
            r.doc_file_bytes as f64 / r.readings as f64,
            r.index_file_bytes as f64 / r.readings as f64,
        );
    }
    println!();
    println!("Where a sealed bucket's BSON goes, bytes per reading:");
    println!();
    let parts: Vec<&str> = BUCKET_PARTS.to_vec();
    println!("| data | {} | total |", parts.join(" | "));
    println!("|---|{}---:|", "---:|".repeat(parts.len()));
    for (name, b) in &breakdowns {
        let per = |x: u64| x as f64 / b.readings.max(1) as f64;
        let cells: Vec<String> = parts
            .iter()
            .map(|p| format!("{:.1}", per(b.parts.get(*p).copied().unwrap_or(0))))
            .collect();
        println!("| {name} | {} | {:.1} |", cells.join(" | "), per(b.total));
    }
    Ok(())
}

/// Copies every sealed bucket of `bench.readings` into
/// `bench.columnar` in the denser shape proposed for sealed buckets: the
/// same document with `samples` replaced by `columns: {ts: [...], <field>:
/// [...]}` (a field a sample lacks is null there), so each field name is
/// stored once per bucket instead of once per sample. Returns its
/// collStats.
async fn store_columnar(uri: &str) -> anyhow::Result<Density> {
    let db = mongodb::Client::with_uri_str(uri).await?.database("bench");
    let from = db.collection::<bson::Document>("readings");
    let to = db.collection::<bson::Document>("columnar");
    let mut cursor = from.find(doc! { "closed": true }).await?;
    let mut docs = Vec::new();
    while let Some(mut b) = cursor.try_next().await? {
        let samples = match b.remove("samples") {
            Some(bson::Bson::Array(a)) => a,
            _ => continue,
        };
        let mut names: Vec<String> = Vec::new();
        for s in samples.iter().filter_map(|s| s.as_document()) {
            for k in s.keys() {
                if !names.contains(k) {
                    names.push(k.clone());
                }
            }
        }
        let mut columns = bson::Document::new();
        for n in &names {
            let column: Vec<bson::Bson> = (samples.iter())
                .map(|s| (s.as_document()).and_then(|d| d.get(n)).cloned())
                .map(|v| v.unwrap_or(bson::Bson::Null))
                .collect();
            columns.insert(n, column);
        }
        b.insert("columns", columns);
        docs.push(b);
        if docs.len() == 500 {
            to.insert_many(std::mem::take(&mut docs)).await?;
        }
    }
    if !docs.is_empty() {
        to.insert_many(docs).await?;
    }
    let mut row = coll_stats_of(&db, "columnar").await?;
    row.documents = to.estimated_document_count().await?;
    Ok(row)
}

/// Inserts one document per reading (`{sensorId, ts, <fields>}`, indexed
/// on `{sensorId: 1, ts: 1}`) in unordered batches of 1,000.
async fn insert_per_reading(uri: &str, messages: Readings) -> anyhow::Result<()> {
    let coll = indexed_readings(uri, doc! { "sensorId": 1, "ts": 1 }).await?;
    let mut docs = Vec::with_capacity(1000);
    for (sensor, v) in messages {
        let mut d = doc! { "sensorId": sensor };
        for (k, x) in v.as_object().into_iter().flatten() {
            match k.as_str() {
                "ts" => d.insert("ts", bson::DateTime::from_millis(x.as_i64().unwrap_or(0))),
                _ => d.insert(k, x.as_f64().unwrap_or(0.0)),
            };
        }
        docs.push(d);
        if docs.len() == 1000 {
            coll.insert_many(std::mem::take(&mut docs))
                .ordered(false)
                .await?;
        }
    }
    if !docs.is_empty() {
        coll.insert_many(docs).ordered(false).await?;
    }
    Ok(())
}

/// `bench.readings`, with an index of `keys`.
async fn indexed_readings(
    uri: &str,
    keys: bson::Document,
) -> anyhow::Result<mongodb::Collection<bson::Document>> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::Document>("readings");
    coll.create_index(mongodb::IndexModel::builder().keys(keys).build())
        .await?;
    Ok(coll)
}

/// Waits until the closer sealed every bucket.
async fn wait_all_sealed(uri: &str) -> anyhow::Result<()> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::Document>("readings");
    let started = Instant::now();
    while coll.count_documents(doc! { "closed": false }).await? > 0 {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "buckets still open after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// collStats of `bench.readings` (what the server answers of it).
async fn coll_stats(uri: &str) -> anyhow::Result<Density> {
    let db = mongodb::Client::with_uri_str(uri).await?.database("bench");
    let mut row = coll_stats_of(&db, "readings").await?;
    row.documents = db
        .collection::<bson::Document>("readings")
        .estimated_document_count()
        .await?;
    Ok(row)
}

/// What collStats says of `coll`: size, storageSize, totalIndexSize.
async fn coll_stats_of(db: &mongodb::Database, coll: &str) -> anyhow::Result<Density> {
    let stats = db.run_command(doc! { "collStats": coll }).await;
    if let Err(e) = &stats {
        eprintln!("  collStats: {e}");
    }
    let num = |k: &str| {
        let s = stats.as_ref().ok()?;
        match s.get(k)? {
            bson::Bson::Int32(i) => Some(*i as f64),
            bson::Bson::Int64(i) => Some(*i as f64),
            bson::Bson::Double(x) => Some(*x),
            _ => None,
        }
    };
    Ok(Density {
        coll_size: num("size"),
        storage_size: num("storageSize"),
        index_size: num("totalIndexSize"),
        ..Density::default()
    })
}

/// The parts of a sealed bucket's BSON, as [`bucket_breakdown`] counts them.
const BUCKET_PARTS: &[&str] = &[
    "sample values",
    "sample field names",
    "sample array keys and framing",
    "_id",
    "summaries (sum n min max avg)",
    "first/last",
    "lsns",
    "other",
];

#[derive(Debug, Default)]
struct Breakdown {
    readings: u64,
    total: u64,
    parts: HashMap<&'static str, u64>,
}

/// Where sealed buckets spend their bytes: every bucket's top-level
/// fields, and within `samples` the values, the field names (each with
/// its type byte and NUL) and the array's own keys and framing.
async fn bucket_breakdown(uri: &str) -> anyhow::Result<Breakdown> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::RawDocumentBuf>("readings");
    let mut cursor = coll.find(doc! { "closed": true }).await?;
    let mut out = Breakdown::default();
    while let Some(d) = cursor.try_next().await? {
        out.total += d.as_bytes().len() as u64;
        out.readings += d.get_i32("count").unwrap_or(0).max(0) as u64;
        // The document's own length and final NUL.
        *out.parts.entry("other").or_default() += 5;
        for el in d.iter_elements() {
            let el = el?;
            let (key, value) = (el.key(), el.value()?);
            let len = 2 + key.len() as u64 + raw_value_len(value);
            let part = match key {
                "_id" => "_id",
                "sum" | "n" | "min" | "max" | "avg" => "summaries (sum n min max avg)",
                "first" | "last" => "first/last",
                "lsns" => "lsns",
                "samples" => {
                    let mut inner = 0;
                    for s in value.as_array().into_iter().flat_map(|a| a.into_iter()) {
                        let Some(doc) = s?.as_document() else {
                            continue;
                        };
                        for f in doc.iter_elements() {
                            let f = f?;
                            let v = raw_value_len(f.value()?);
                            *out.parts.entry("sample values").or_default() += v;
                            *out.parts.entry("sample field names").or_default() +=
                                2 + f.key().len() as u64;
                            inner += v + 2 + f.key().len() as u64;
                        }
                    }
                    *out.parts
                        .entry("sample array keys and framing")
                        .or_default() += len - inner;
                    continue;
                }
                _ => "other",
            };
            *out.parts.entry(part).or_default() += len;
        }
    }
    Ok(out)
}

/// Bytes of a BSON value as stored (without its type byte and key).
fn raw_value_len(v: bson::RawBsonRef<'_>) -> u64 {
    use bson::RawBsonRef as B;
    (match v {
        B::Double(_) | B::Int64(_) | B::DateTime(_) | B::Timestamp(_) => 8,
        B::Int32(_) => 4,
        B::Boolean(_) => 1,
        B::Null | B::Undefined | B::MinKey | B::MaxKey => 0,
        B::ObjectId(_) => 12,
        B::Decimal128(_) => 16,
        B::String(s) | B::Symbol(s) | B::JavaScriptCode(s) => 4 + s.len() + 1,
        B::Document(d) => d.as_bytes().len(),
        B::Array(a) => a.as_bytes().len(),
        B::Binary(b) => 4 + 1 + b.bytes.len(),
        B::RegularExpression(r) => r.pattern.len() + 1 + r.options.len() + 1,
        B::JavaScriptCodeWithScope(c) => 4 + 4 + c.code.len() + 1 + c.scope.as_bytes().len(),
        B::DbPointer(_) => 4 + 12,
    }) as u64
}

// ----------------------------------------------------------------- wire

/// Where a part of a bucket statement is: `q`, `u` or `u.<operator>`, and
/// its keys there (one ending in `.` names every key it starts).
type WirePlace = (&'static str, &'static [&'static str]);

/// Parts of a bucket statement the wire account takes out one at a time.
const WIRE_PARTS: &[(&str, &[WirePlace])] = &[
    (
        "the string _id (as a 12-byte ObjectId instead)",
        &[("q", &["_id"])],
    ),
    (
        "first/last",
        &[("u.$min", &["first."]), ("u.$max", &["last."])],
    ),
    ("lsns", &[("u.$push", &["lsns."])]),
    (
        "the caps (closed, count, size)",
        &[("q", &["closed", "count", "size"])],
    ),
    ("$setOnInsert", &[("u", &["$setOnInsert"])]),
    ("sum and n", &[("u.$inc", &["sum.", "n."])]),
    (
        "min and max",
        &[("u.$min", &["min."]), ("u.$max", &["max."])],
    ),
];

fn wire(args: WireArgs) -> anyhow::Result<()> {
    use palletd::bucket::{self, Fills, Sample, Samples, Shape};
    use palletd::decode::{FieldValue, Reading};
    let shape = Shape {
        window_ms: 3_600_000,
        max_samples: 200,
        max_bytes: 256 << 10,
    };
    let tags = palletd::tags::Tags::new(0x5eed);
    let set = density_sets(args.sensors, 1, 1, 1).remove(0);
    println!(
        "| readings per statement | part | zstd 1 | zstd 3 | zstd 9 | zstd 19 | uncompressed |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for &k in &args.per_statement {
        // The first k seconds of every sensor, each sensor's in one run.
        let mut runs: Vec<Samples> = (0..args.sensors).map(|_| Samples::new()).collect();
        for (lsn, (sensor, v)) in (1..).zip((set.messages)().take(k * args.sensors)) {
            let s: usize = sensor[1..].parse()?;
            let mut reading = Reading {
                sensor: sensor.clone(),
                ts_ms: v["ts"].as_i64().unwrap_or(0),
                ..Reading::default()
            };
            for (name, x) in v.as_object().into_iter().flatten() {
                if name != "ts" {
                    reading
                        .fields
                        .push((name.clone(), FieldValue::Num(x.as_f64().unwrap_or(0.0))));
                }
            }
            let sample = Sample::encode(&reading, lsn);
            runs[s].push(sample.as_ref());
        }
        let mut statements = Vec::new();
        let mut latest = Vec::new();
        for (s, samples) in runs.iter().enumerate() {
            let sensor = format!("s{s:05}");
            // A bucket the sensor is extending (what live flushes do).
            let mut fills = Fills::new();
            let start = shape.window_start(samples.first().map_or(0, |x| x.ts_ms));
            fills.insert(
                start,
                bucket::Fill {
                    count: 10,
                    bytes: 800,
                    seq: 0,
                },
            );
            for st in bucket::plan(samples, &mut fills, &shape, &tags) {
                statements.push(bson::Document::try_from(
                    st.to_bson(&sensor, samples, &shape, false).as_ref(),
                )?);
            }
            if let Some(newest) = samples.last() {
                latest.push(bson::Document::try_from(
                    palletd::store::latest::statement(&sensor, newest).as_ref(),
                )?);
            }
        }
        let readings = (k * args.sensors) as f64;
        let row = |label: &str, docs: &[bson::Document]| -> anyhow::Result<()> {
            let cmd = doc! {
                "update": "readings", "updates": docs, "ordered": true,
                "writeConcern": { "w": "majority", "j": true }, "maxTimeMS": 10_000i64,
            };
            let bytes = bson::to_vec(&cmd)?;
            let z = |level| zstd::bulk::compress(&bytes, level).map(|c| c.len());
            println!(
                "| {k} | {label} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                z(1)? as f64 / readings,
                z(3)? as f64 / readings,
                z(9)? as f64 / readings,
                z(19)? as f64 / readings,
                bytes.len() as f64 / readings
            );
            Ok(())
        };
        row("bucket statements as sent", &statements)?;
        for (label, places) in WIRE_PARTS {
            let cut: Vec<bson::Document> = statements
                .iter()
                .map(|st| without_part(st, places))
                .collect();
            row(&format!("without {label}"), &cut)?;
        }
        let samples_only: Vec<bson::Document> = statements
            .iter()
            .map(|st| {
                let each = st
                    .get_document("u")
                    .and_then(|u| u.get_document("$push"))
                    .and_then(|p| p.get_document("samples"))
                    .cloned()
                    .unwrap_or_default();
                doc! { "samples": each }
            })
            .collect();
        row("the samples alone (the floor)", &samples_only)?;
        row("the latest-value command", &latest)?;
    }
    Ok(())
}

/// A bucket statement without one of [`WIRE_PARTS`] (an `_id` is replaced
/// by an ObjectId-sized value rather than removed).
fn without_part(st: &bson::Document, places: &[WirePlace]) -> bson::Document {
    let mut st = st.clone();
    for &(place, names) in places {
        let mut path = place.split('.');
        let Ok(doc) = st.get_document_mut(path.next().unwrap_or("")) else {
            continue;
        };
        let doc = match path.next() {
            Some(op) => match doc.get_document_mut(op) {
                Ok(d) => d,
                Err(_) => continue,
            },
            None => doc,
        };
        let keys: Vec<String> = (doc.keys())
            .filter(|k| (names.iter()).any(|n| *k == n || (n.ends_with('.') && k.starts_with(n))))
            .cloned()
            .collect();
        for k in keys {
            match k.as_str() {
                "_id" => doc.insert(k, bson::oid::ObjectId::new()),
                _ => doc.remove(&k),
            };
        }
    }
    st
}

// ------------------------------------------------------------ query RSS

fn query_rss(args: QueryRssArgs) -> anyhow::Result<()> {
    let svc = Services::start(&args.run)?;
    let rt = tokio::runtime::Runtime::new()?;
    let start = std::time::Instant::now();
    rt.block_on(store_one_sensor(&svc.mongodb_uri(), args.rows))?;
    eprintln!(
        "stored {} readings in {:.0} s",
        args.rows,
        start.elapsed().as_secs_f64()
    );
    let cfg = svc.dir.path().join("query.toml");
    std::fs::write(
        &cfg,
        format!(
            "[mqtt]\nurl = \"mqtt://127.0.0.1:{}\"\nclient_id = \"bench-query\"\n[mongodb]\nuri = \"{}\"\ndatabase = \"bench\"\n\
             collection = \"readings\"\n[spool]\ndir = \"{}\"\n[[subscription]]\ntopic = \"q/{{sensor}}\"\n",
            svc.broker_port,
            svc.mongodb_uri(),
            svc.dir.path().join("spool").display()
        ),
    )?;
    println!("| palletd | format | rows | seconds | peak RSS |");
    println!("|---|---|---|---|---|");
    for palletd in std::iter::once(&args.run.palletd).chain(&args.also) {
        for format in ["csv", "jsonl"] {
            let mut child = Command::new(palletd)
                .args(["query", "--sensor", "s", "--format", format, "--config"])
                .arg(&cfg)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()?;
            let pid = child.id();
            let out = child.stdout.take().expect("piped");
            let counter = std::thread::spawn(move || {
                BufReader::with_capacity(1 << 20, out).lines().count() as u64
            });
            let started = Instant::now();
            // VmHWM only grows: the last reading before exit is the peak.
            let mut peak = 0;
            while child.try_wait()?.is_none() {
                peak = peak_rss_of(pid).max(peak);
                std::thread::sleep(Duration::from_millis(50));
            }
            let lines = counter.join().expect("counter");
            let expected = args.rows + u64::from(format == "csv");
            anyhow::ensure!(
                lines == expected,
                "{} --format {format} printed {lines} lines, not {expected}",
                palletd.display()
            );
            println!(
                "| {} | {format} | {} | {:.0} | {:.0} MB |",
                palletd.display(),
                args.rows,
                started.elapsed().as_secs_f64(),
                peak as f64 / 1e6
            );
        }
    }
    Ok(())
}

/// One sensor, `rows` readings a second apart from 2025-01-01, as bucket
/// documents the way palletd writes them (sealed, 900 samples each).
async fn store_one_sensor(uri: &str, rows: u64) -> anyhow::Result<()> {
    let coll = indexed_readings(uri, doc! { "sensorId": 1, "startTs": 1 }).await?;
    const PER_BUCKET: u64 = 900;
    let t0 = 1_735_689_600_000i64; // 2025-01-01T00:00:00Z
    let mut batch = Vec::new();
    let mut i = 0u64;
    while i < rows {
        let n = PER_BUCKET.min(rows - i);
        let first = t0 + i as i64 * 1000;
        let start = first - first.rem_euclid(3_600_000);
        let samples: Vec<bson::Document> = (i..i + n)
            .map(|k| {
                let temp = 20.0 + (k % 100) as f64 / 10.0;
                doc! {
                    "ts": bson::DateTime::from_millis(t0 + k as i64 * 1000),
                    "temp": temp,
                    "humidity": 40.0 + (k % 37) as f64,
                }
            })
            .collect();
        batch.push(doc! {
            "sensorId": "s",
            "startTs": bson::DateTime::from_millis(start),
            "endTs": bson::DateTime::from_millis(start + 3_600_000),
            "closed": true,
            "count": n as i64,
            "lsn": (i + n) as i64,
            "samples": samples,
        });
        i += n;
        if batch.len() == 100 || i == rows {
            coll.insert_many(std::mem::take(&mut batch)).await?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- sinks

/// A baseline gateway: subscribes with manual acks and makes each reading
/// durable its own way before acknowledging it.
async fn sink(args: SinkArgs) -> anyhow::Result<()> {
    let handle = palletd::telemetry::install();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = palletd::telemetry::http::serve(
        ([127, 0, 0, 1], args.metrics_port).into(),
        &Default::default(),
        palletd::telemetry::http::Pages {
            metrics: handle,
            health: Arc::new(palletd::telemetry::Health::default()),
            history: Arc::default(),
            flush_bound: Duration::from_secs(10),
            api: None,
        },
        stop.clone(),
    )
    .await?;
    tokio::spawn(server);
    let mut opts = MqttOptions::new(
        format!("bench-{}", args.kind),
        "127.0.0.1",
        args.broker_port,
    );
    opts.set_manual_acks(true);
    opts.set_keep_alive(Duration::from_secs(30));
    opts.set_max_packet_size(1 << 20, 1 << 20);
    opts.set_inflight(args.inflight);
    let (client, mut eventloop) = AsyncClient::new(opts, 65_536);
    client.subscribe(FILTER, QoS::AtLeastOnce).await?;
    let db = mongodb::Client::with_uri_str(&args.mongodb)
        .await?
        .database("bench");
    let collection = db.collection::<bson::Document>("readings");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<rumqttc::Publish>();
    let worker = match args.kind.as_str() {
        "ceiling" => tokio::spawn(ceiling(client.clone(), rx)),
        "naive" => tokio::spawn(naive(client.clone(), rx, collection, 1)),
        "naive16" => tokio::spawn(naive(client.clone(), rx, collection, 16)),
        "batched" | "batched-plain" => {
            if args.kind == "batched" {
                db.run_command(doc! {
                    "create": "readings",
                    "timeseries": { "timeField": "ts", "metaField": "sensorId", "granularity": "seconds" },
                })
                .await?;
            } else {
                collection
                    .create_index(
                        mongodb::IndexModel::builder()
                            .keys(doc! { "sensorId": 1, "ts": 1 })
                            .build(),
                    )
                    .await?;
            }
            tokio::spawn(batched(client.clone(), rx, collection, args.batch))
        }
        other => anyhow::bail!("unknown sink {other}"),
    };
    println!("sink ready");
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if tx.send(p).is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("sink: broker: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    worker.abort();
    Ok(())
}

type Publishes = tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish>;

/// Decodes and acknowledges: the most any gateway can do on this box.
async fn ceiling(client: AsyncClient, mut rx: Publishes) {
    while let Some(p) = rx.recv().await {
        if let Some((_, ts_ms, _)) = decode(&p) {
            durable(ts_ms, 1);
        }
        let _ = client.try_ack(&p);
    }
}

/// One `insert_one` per message, `in_flight` at a time, each acknowledged
/// after its insert.
async fn naive(
    client: AsyncClient,
    mut rx: Publishes,
    collection: mongodb::Collection<bson::Document>,
    in_flight: usize,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    while let Some(p) = rx.recv().await {
        let Some((sensor, ts_ms, mut doc)) = decode(&p) else {
            let _ = client.ack(&p).await;
            continue;
        };
        doc.insert("sensorId", sensor);
        let permit = permits.clone().acquire_owned().await.expect("open");
        let (collection, client) = (collection.clone(), client.clone());
        let insert = async move {
            // Retried until it succeeds, as a bridge must.
            while collection.insert_one(&doc).await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            durable(ts_ms, 1);
            let _ = client.ack(&p).await;
            drop(permit);
        };
        if in_flight == 1 {
            insert.await;
        } else {
            tokio::spawn(insert);
        }
    }
}

/// Telegraf's shape: a batch of up to `batch` messages or whatever came
/// within a second of the first, written with one unordered `insert_many`,
/// one write at a time, then every message of it acknowledged.
async fn batched(
    client: AsyncClient,
    mut rx: Publishes,
    collection: mongodb::Collection<bson::Document>,
    batch: usize,
) {
    let opts = mongodb::options::InsertManyOptions::builder()
        .ordered(false)
        .build();
    loop {
        let Some(first) = rx.recv().await else { return };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let mut msgs = vec![first];
        while msgs.len() < batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(p)) => msgs.push(p),
                Ok(None) => return,
                Err(_) => break,
            }
        }
        let mut docs = Vec::with_capacity(msgs.len());
        let mut stamps = Vec::with_capacity(msgs.len());
        for p in &msgs {
            if let Some((sensor, ts_ms, mut doc)) = decode(p) {
                doc.insert("sensorId", sensor);
                docs.push(doc);
                stamps.push(ts_ms);
            }
        }
        // Retried until it succeeds, as Telegraf does.
        while !docs.is_empty()
            && collection
                .insert_many(&docs)
                .with_options(opts.clone())
                .await
                .is_err()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for ts in stamps {
            durable(ts, 1);
        }
        for p in &msgs {
            let _ = client.ack(p).await;
        }
    }
}

/// The sensor (from the topic), timestamp and document of a reading.
fn decode(p: &rumqttc::Publish) -> Option<(String, i64, bson::Document)> {
    let sensor = p.topic.split('/').nth(1)?.to_string();
    let value: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&p.payload).ok()?;
    let ts_ms = value.get("ts")?.as_i64()?;
    let mut doc = bson::Document::new();
    doc.insert("ts", bson::DateTime::from_millis(ts_ms));
    for (k, v) in value {
        if k != "ts" {
            doc.insert(k, v.as_f64()?);
        }
    }
    Some((sensor, ts_ms, doc))
}

fn durable(ts_ms: i64, n: u64) {
    metrics::counter!(palletd::telemetry::SAMPLES_STORED).increment(n);
    let age = (palletd::clock::now_ms() - ts_ms).max(0) as f64 / 1000.0;
    metrics::histogram!(palletd::telemetry::SAMPLE_AGE_SECONDS).record(age);
}

// ------------------------------------------------------------- services

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first, so palletd and the database stop cleanly.
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `stdout` of the child prints a line containing `needle`, then
/// keeps draining its output into `log`.
fn wait_for_line(child: &mut Child, needle: &str, log: PathBuf) -> anyhow::Result<()> {
    let out: Box<dyn Read + Send> = match child.stdout.take() {
        Some(o) => Box::new(o),
        None => Box::new(child.stderr.take().expect("piped stdout or stderr")),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let wanted = needle.to_string();
    std::thread::spawn(move || {
        let mut file = std::fs::File::create(log).ok();
        let mut sent = false;
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(f) = file.as_mut() {
                let _ = writeln!(f, "{line}");
            }
            if !sent && line.contains(&wanted) {
                let _ = tx.send(());
                sent = true;
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .map_err(|_| anyhow::anyhow!("process never printed {needle:?}"))
}

struct Services {
    dir: tempfile::TempDir,
    broker_port: u16,
    db_port: u16,
    _broker: Proc,
    _db: Proc,
}

impl Services {
    fn start(args: &RunArgs) -> anyhow::Result<Services> {
        // BENCH_KEEP: keep the services' directory (logs, spool, data).
        let keep = std::env::var_os("BENCH_KEEP").is_some();
        let dir = tempfile::Builder::new().disable_cleanup(keep).tempdir()?;
        if keep {
            eprintln!("keeping {}", dir.path().display());
        }
        let broker_port = free_port();
        let conf = dir.path().join("mosquitto.conf");
        // Same broker settings for every scenario (every sink's in-flight
        // window matches the broker's).
        std::fs::write(
            &conf,
            format!(
                "listener {broker_port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
                 max_inflight_messages {}\nmax_queued_messages {}\nlog_dest stdout\n",
                args.inflight, args.queued
            ),
        )?;
        let broker = Proc(
            Command::new(&args.mosquitto)
                .arg("-c")
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| {
                    anyhow::anyhow!(
                        "{}: {e} (run scripts/install-test-services)",
                        args.mosquitto.display()
                    )
                })?,
        );
        // Its output is block-buffered in a pipe: wait for the port instead.
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", broker_port)).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "mosquitto did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        let db_port = free_port();
        let data = dir.path().join("db");
        std::fs::create_dir_all(&data)?;
        let mut db = Command::new(&args.secantusd)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &db_port.to_string(),
                "--storage-path",
            ])
            .arg(&data)
            .args(["--cache-size", "256M", "--log-level", "WARNING"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                anyhow::anyhow!(
                    "{}: {e} (run scripts/install-test-services)",
                    args.secantusd.display()
                )
            })?;
        wait_for_line(&mut db, "listening on", dir.path().join("secantusd.log"))?;
        Ok(Services {
            dir,
            broker_port,
            db_port,
            _broker: broker,
            _db: Proc(db),
        })
    }

    fn mongodb_uri(&self) -> String {
        format!(
            "mongodb://127.0.0.1:{}/?directConnection=true",
            self.db_port
        )
    }
}

/// The process under test, with its metrics endpoint.
/// A sink: one process, or several palletd instances sharing the load
/// (`buckets-x2`: two, on one `$share/bench/...` subscription); its
/// figures are their sums.
struct Sink {
    /// Each process and its metrics port.
    procs: Vec<(Proc, u16)>,
    /// Fed Sparkplug B edge nodes instead of JSON sensors.
    sparkplug: bool,
}

fn start_sink(args: &RunArgs, kind: &str, svc: &Services) -> anyhow::Result<Sink> {
    start_sink_with(args, kind, svc, &svc.mongodb_uri(), "", "", "")
}

/// One palletd in buckets mode with `tail` (more TOML) at the end of its
/// configuration.
fn buckets_sink(args: &RunArgs, svc: &Services, tail: &str) -> anyhow::Result<Sink> {
    start_sink_with(args, "buckets", svc, &svc.mongodb_uri(), "", "", tail)
}

/// `buckets-thinned`'s subscription: the simulator's three fields
/// thinned (about 1% of a day's span of its walk; `bench thinning`).
const THINNED_SUBSCRIPTION: &str = r#"[[subscription]]
topic = "bench/{sensor}/data"
[subscription.thinning.temp]
kind = "swinging_door"
deviation = 0.25
[subscription.thinning.humidity]
kind = "deadband"
deviation = 0.65
[subscription.thinning.pressure]
kind = "swinging_door"
deviation = 0.5"#;

/// A palletd scenario's storage mode and number of instances:
/// `buckets` is one instance, `buckets-x2` two; `sparkplug` is one in
/// bucket mode; `-nolatest` turns `[latest]` off (`buckets-nolatest`),
/// `-v5` speaks MQTT 5 (`buckets-v5`).
fn palletd_kind(kind: &str) -> Option<(&str, usize)> {
    if kind == "sparkplug" {
        return Some(("buckets", 1));
    }
    let kind = kind.strip_suffix("-nolatest").unwrap_or(kind);
    let kind = kind.strip_suffix("-thinned").unwrap_or(kind);
    let kind = kind.strip_suffix("-v5").unwrap_or(kind);
    let kind = match connections_of(kind) {
        Some(_) => kind.rsplit_once("-c").map_or(kind, |k| k.0),
        None => kind,
    };
    let (mode, n) = match kind.split_once("-x") {
        Some((mode, n)) => (mode, n.parse().ok()?),
        None => (kind, 1),
    };
    matches!(mode, "buckets" | "timeseries").then_some((mode, n))
}

/// `-c<N>` at a palletd scenario's end: `[mqtt] connections = N`
/// (`buckets-c4`); without it palletd's default.
fn connections_of(kind: &str) -> Option<usize> {
    kind.rsplit_once("-c")?.1.parse().ok()
}

/// [`start_sink`] with palletd's database at `uri` and more settings in
/// its `[mongodb]` and `[spool]` tables (TOML lines).
fn start_sink_with(
    args: &RunArgs,
    kind: &str,
    svc: &Services,
    uri: &str,
    mongodb_extra: &str,
    spool_extra: &str,
    tail: &str,
) -> anyhow::Result<Sink> {
    let mut procs = Vec::new();
    let instances = palletd_kind(kind).map_or(1, |k| k.1);
    for i in 0..instances {
        let metrics_port = free_port();
        let mut child = match palletd_kind(kind) {
            Some((mode, n)) => {
                let share = if n > 1 { "share_group = \"bench\"" } else { "" };
                // `-v5`: MQTT 5 with a Receive Maximum of 1,000, whatever
                // the broker's window for 3.1.1 clients (`--inflight`).
                let share = match kind.contains("-v5") {
                    true => format!("{share}\nprotocol = \"5\"\nreceive_maximum = 1000"),
                    false => share.to_string(),
                };
                let share = match connections_of(kind) {
                    Some(c) => format!("{share}\nconnections = {c}"),
                    None => share,
                };
                // Lines `storage.<key> = ...` of `tail` go into `[storage]`.
                let (storage, tail): (Vec<&str>, Vec<&str>) =
                    tail.lines().partition(|l| l.starts_with("storage."));
                let storage: Vec<&str> = storage.iter().map(|l| &l[8..]).collect();
                let (storage, tail) = (storage.join("\n"), tail.join("\n"));
                let cfg = format!(
                    r#"[mqtt]
url = "mqtt://127.0.0.1:{broker}"
client_id = "bench-palletd-{i}"
max_inflight = {inflight}
{share}
[mongodb]
uri = "{uri}"
database = "bench"
collection = "readings"
{mongodb_extra}
[storage]
mode = "{mode}"
{storage}
[spool]
dir = "{spool}"
{spool_extra}
[http]
listen = "127.0.0.1:{metrics_port}"
[limits]
max_sensors = 200000
{limits_extra}
[latest]
enabled = {latest}
{subscription}
{tail}
"#,
                    latest = !kind.ends_with("-nolatest"),
                    // BENCH_PALLETD_LIMITS: more `[limits]` keys for
                    // experiments (e.g. `max_memory = "256MiB"`).
                    limits_extra = std::env::var("BENCH_PALLETD_LIMITS").unwrap_or_default(),
                    subscription = if kind == "sparkplug" {
                        "[[subscription]]\ntopic = \"spBv1.0/#\"\nformat = \"sparkplug_b\""
                    } else if kind.ends_with("-thinned") {
                        THINNED_SUBSCRIPTION
                    } else {
                        "[[subscription]]\ntopic = \"bench/{sensor}/data\""
                    },
                    broker = svc.broker_port,
                    inflight = args.inflight,
                    spool = svc.dir.path().join(format!("spool-{i}")).display(),
                );
                // BENCH_PALLETD_EXTRA: more TOML for experiments (not used by
                // scripts/bench's published runs).
                let cfg = cfg + &std::env::var("BENCH_PALLETD_EXTRA").unwrap_or_default();
                let path = svc.dir.path().join(format!("palletd-{i}.toml"));
                std::fs::write(&path, cfg)?;
                Command::new(&args.palletd)
                    .arg("run")
                    .arg("--config")
                    .arg(&path)
                    // BENCH_RUST_LOG: palletd's log filter for experiments.
                    .env(
                        "RUST_LOG",
                        std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| "info".into()),
                    )
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()?
            }
            None => Command::new(std::env::current_exe()?)
                .args(["sink", "--kind", kind, "--broker-port"])
                .arg(svc.broker_port.to_string())
                .args(["--mongodb", uri, "--metrics-port"])
                .arg(metrics_port.to_string())
                .arg("--inflight")
                .arg(args.inflight.to_string())
                .arg("--batch")
                .arg(args.batch.unwrap_or(args.inflight as usize).to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()?,
        };
        let ready = match palletd_kind(kind) {
            Some(_) => "Subscribed.",
            None => "sink ready",
        };
        wait_for_line(
            &mut child,
            ready,
            svc.dir.path().join(format!("{kind}-{i}.log")),
        )?;
        procs.push((Proc(child), metrics_port));
    }
    let sink = Sink {
        procs,
        sparkplug: kind == "sparkplug",
    };
    // Subscribed and its metrics endpoints answer.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.scrape().is_err() {
        anyhow::ensure!(Instant::now() < deadline, "{kind}: no /metrics");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    Ok(sink)
}

// ------------------------------------------------------------- readings

/// What a sink reported at one moment.
#[derive(Debug, Clone, Default)]
struct Scrape {
    stored: f64,
    /// Bucket bytes the database rewrote (palletd in bucket mode only).
    rewritten: f64,
    /// Histogram of reading age: upper bound -> cumulative count (all
    /// lanes), and of the readings palletd wrote as live ones.
    age: Vec<(f64, f64)>,
    live_age: Vec<(f64, f64)>,
    /// palletd's backlog gauges.
    backlog_readings: f64,
    drain_rate: f64,
    /// palletd's spool fsyncs (group commits).
    fsyncs: f64,
}

/// Adds histogram `h` (cumulative buckets) into `into`.
fn add_histogram(into: &mut Vec<(f64, f64)>, h: &[(f64, f64)]) {
    if into.is_empty() {
        *into = h.to_vec();
    } else {
        for (i, (_, n)) in into.iter_mut().enumerate() {
            *n += h.get(i).map_or(0.0, |b| b.1);
        }
    }
}

impl Sink {
    /// The sum of what every process reports.
    fn scrape(&self) -> anyhow::Result<Scrape> {
        let mut out = Scrape::default();
        for (_, port) in &self.procs {
            let one = scrape_one(*port)?;
            out.stored += one.stored;
            out.rewritten += one.rewritten;
            add_histogram(&mut out.age, &one.age);
            add_histogram(&mut out.live_age, &one.live_age);
            out.backlog_readings += one.backlog_readings;
            out.drain_rate += one.drain_rate;
            out.fsyncs += one.fsyncs;
        }
        Ok(out)
    }

    fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(|p| p.0 .0.id()).collect()
    }

    /// User + system CPU time so far, of all processes.
    fn cpu(&self) -> Duration {
        self.pids().into_iter().map(cpu_of).sum()
    }

    /// The processes' peak RSS, summed (each process's own peak).
    fn peak_rss(&self) -> u64 {
        self.pids().into_iter().map(peak_rss_of).sum()
    }
}

fn scrape_one(port: u16) -> anyhow::Result<Scrape> {
    let body = http_get(port, "/metrics")?;
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let parsed = prometheus_parse::Scrape::parse(lines)?;
    let mut out = Scrape::default();
    for s in parsed.samples {
        if s.metric == palletd::telemetry::SAMPLES_STORED {
            if let prometheus_parse::Value::Counter(v) = s.value {
                out.stored = v;
            }
        } else if s.metric == palletd::telemetry::BYTES_REWRITTEN {
            if let prometheus_parse::Value::Counter(v) = s.value {
                out.rewritten = v;
            }
        } else if s.metric == palletd::telemetry::SAMPLE_AGE_SECONDS {
            if let prometheus_parse::Value::Histogram(h) = &s.value {
                let h: Vec<(f64, f64)> = h.iter().map(|b| (b.less_than, b.count)).collect();
                add_histogram(&mut out.age, &h);
                if s.labels.get("lane") == Some("live") {
                    out.live_age = h;
                }
            }
        } else if s.metric == palletd::telemetry::BACKLOG_READINGS {
            if let prometheus_parse::Value::Gauge(v) = s.value {
                out.backlog_readings = v;
            }
        } else if s.metric == palletd::telemetry::BACKLOG_DRAIN_RATE {
            if let prometheus_parse::Value::Gauge(v) = s.value {
                out.drain_rate = v;
            }
        } else if s.metric == palletd::telemetry::SPOOL_FSYNCS {
            if let prometheus_parse::Value::Counter(v) = s.value {
                out.fsyncs = v;
            }
        }
    }
    Ok(out)
}

/// User + system CPU time of a process so far.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime and stime are fields 14 and 15 (proc(5)).
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| {
        f.get(n - 3)
            .and_then(|x| x.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let ticks = field(14) + field(15);
    Duration::from_secs_f64(ticks as f64 / clock_ticks())
}

/// Peak resident set size (VmHWM) of a process, in bytes.
fn peak_rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn clock_ticks() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output();
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let (_, body) = body.split_once("\r\n\r\n").unwrap_or(("", ""));
    Ok(body.to_string())
}

/// The q-quantile (0..1) of the readings counted between two histograms.
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let diff: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let b = before.iter().find(|x| x.0 == *le).map_or(0.0, |x| x.1);
            (*le, n - b)
        })
        .collect();
    let total = diff.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let want = total * q;
    let mut prev = (0.0, 0.0);
    for (le, n) in diff {
        if n >= want {
            if !le.is_finite() {
                return Some(prev.0);
            }
            // Linear inside the bucket.
            let share = if n > prev.1 {
                (want - prev.1) / (n - prev.1)
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * share);
        }
        prev = (le, n);
    }
    None
}

/// Database write commands and write operations so far, from serverStatus.
/// The database's write counters: (write commands, write operations as
/// `opcounters` counts them (an `insert_many` is one, each update
/// statement one), documents written (`metrics.document`: inserted,
/// updated, deleted)).
async fn db_writes(uri: &str) -> anyhow::Result<(f64, f64, f64)> {
    let client = mongodb::Client::with_uri_str(uri).await?;
    let s = client
        .database("admin")
        .run_command(doc! { "serverStatus": 1 })
        .await?;
    let num = |d: Option<&bson::Bson>| match d {
        Some(bson::Bson::Int32(x)) => *x as f64,
        Some(bson::Bson::Int64(x)) => *x as f64,
        Some(bson::Bson::Double(x)) => *x,
        _ => 0.0,
    };
    let cmds = s
        .get_document("metrics")
        .and_then(|m| m.get_document("commands"))
        .ok();
    let commands: f64 = ["insert", "update", "delete"]
        .iter()
        .map(|c| {
            cmds.and_then(|m| m.get_document(c).ok())
                .map_or(0.0, |d| num(d.get("total")))
        })
        .sum();
    let ops = s.get_document("opcounters").ok();
    let operations: f64 = ["insert", "update", "delete"]
        .iter()
        .map(|c| ops.map_or(0.0, |o| num(o.get(*c))))
        .sum();
    let docs = s
        .get_document("metrics")
        .and_then(|m| m.get_document("document"))
        .ok();
    let documents: f64 = ["inserted", "updated", "deleted"]
        .iter()
        .map(|c| docs.map_or(0.0, |d| num(d.get(*c))))
        .sum();
    Ok((commands, operations, documents))
}

/// Asks the database for a checkpoint, then sums its data directory.
async fn data_bytes(uri: &str, dir: &Path) -> anyhow::Result<u64> {
    let client = mongodb::Client::with_uri_str(uri).await?;
    client
        .database("admin")
        .run_command(doc! { "fsync": 1 })
        .await?;
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.flatten()
                    .map(|e| match e.metadata() {
                        Ok(m) if m.is_dir() => walk(&e.path()),
                        Ok(m) => m.len(),
                        Err(_) => 0,
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    Ok(walk(dir))
}

// ---------------------------------------------------------------- steps

#[derive(Debug, Clone, serde::Serialize)]
struct Step {
    target_per_s: f64,
    seconds: f64,
    published: u64,
    durable: u64,
    achieved_per_s: f64,
    simulator_max_lag_s: f64,
    /// Largest backlog (published minus durable) seen, in readings.
    max_backlog: f64,
    drained_after_s: Option<f64>,
    sustained: bool,
    note: String,
}

struct Measured {
    step: Step,
    before: Scrape,
    after: Scrape,
    cpu: Duration,
}

/// `palletd simulate` offering `total` readings/s from `sensors` JSON
/// sensors for `secs` seconds (QoS 1, one reading per message).
fn simulator(args: &RunArgs, svc: &Services, sensors: usize, total: f64, secs: u64) -> Command {
    let mut sim = Command::new(&args.palletd);
    sim.arg("simulate")
        .arg("--url")
        .arg(format!("mqtt://127.0.0.1:{}", svc.broker_port))
        .args(["--sensors", &sensors.to_string(), "--rate"])
        .arg(format!("{}", total / sensors as f64))
        .arg("--duration")
        .arg(format!("{secs}s"))
        .args(["--topic", TOPIC, "--batch-share", "0", "--qos", "1"])
        .args(["--sensor-prefix", "s"]);
    sim
}

/// Offers `total` readings/s for `secs` seconds and watches the sink.
fn step(
    args: &RunArgs,
    svc: &Services,
    sink: &Sink,
    sensors: usize,
    total: f64,
    secs: u64,
) -> anyhow::Result<Measured> {
    let before = sink.scrape()?;
    let cpu_before = sink.cpu();
    let started = Instant::now();
    let mut sim = simulator(args, svc, sensors, total, secs)
        .args(if sink.sparkplug {
            &["--format", "sparkplug_b", "--devices-per-node", "10"][..]
        } else {
            &[]
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut max_backlog: f64 = 0.0;
    // (seconds into the step, backlog) once a second.
    let mut backlog_at: Vec<(f64, f64)> = Vec::new();
    let mut note = String::new();
    // A runaway backlog ends the step early (it cannot be sustained).
    let limit = (total * 30.0).max(50_000.0);
    let status = loop {
        if let Some(status) = sim.try_wait()? {
            break Some(status);
        }
        std::thread::sleep(Duration::from_millis(1000));
        let elapsed = started.elapsed().as_secs_f64().min(secs as f64);
        let durable = sink
            .scrape()
            .map(|s| s.stored - before.stored)
            .unwrap_or(0.0);
        let backlog = (total * elapsed - durable).max(0.0);
        max_backlog = max_backlog.max(backlog);
        backlog_at.push((elapsed / secs as f64, backlog));
        if backlog > limit {
            note = format!("stopped early: backlog {backlog:.0} readings");
            let _ = sim.kill();
            let _ = sim.wait();
            break None;
        }
    };
    // Flat: the backlog's low point in the last third of the step is not
    // above its low point in the middle third by more than half a second of
    // readings. The first third is left to settle: a gateway that holds
    // readings for a while (palletd's flush.max_delay) holds more of them
    // at a higher rate. Low points, not peaks: a flush cycle can be long,
    // and a peak depends on where the window cuts it.
    let low_in = |from: f64, to: f64| {
        backlog_at
            .iter()
            .filter(|(at, _)| (from..=to).contains(at))
            .map(|(_, b)| *b)
            .fold(f64::INFINITY, f64::min)
    };
    let (early, late) = (low_in(0.33, 0.66), low_in(0.66, 1.0));
    let flat = late.is_finite() && late <= early + total * 0.5 + 1000.0;
    let mut report = String::new();
    if let Some(mut out) = sim.stdout.take() {
        let _ = out.read_to_string(&mut report);
    }
    let seconds = started.elapsed().as_secs_f64();
    let (published, sim_lag) =
        parse_report(&report).unwrap_or(((total * seconds) as u64, f64::NAN));
    // Drain: how long until everything published is durable.
    let end = Instant::now();
    let mut drained = None;
    let mut after = sink.scrape()?;
    while end.elapsed() < Duration::from_secs(DRAIN_SECS) {
        after = sink.scrape()?;
        if after.stored - before.stored >= published as f64 {
            drained = Some(end.elapsed().as_secs_f64());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cpu = sink.cpu().saturating_sub(cpu_before);
    let durable = (after.stored - before.stored) as u64;
    let on_schedule = status.is_some_and(|s| s.success()) && sim_lag <= 1.0;
    if status.is_some() && !on_schedule && note.is_empty() {
        note = format!("simulator fell behind its schedule by {sim_lag:.1}s");
    }
    let sustained = on_schedule && flat && drained.is_some();
    if status.is_some() && on_schedule && !sustained && note.is_empty() {
        note = if flat {
            format!("not durable within {DRAIN_SECS} s of the last publish")
        } else {
            format!("backlog low point grew from {early:.0} to {late:.0} readings")
        };
    }
    let step = Step {
        target_per_s: total,
        seconds,
        published,
        durable,
        achieved_per_s: durable as f64 / seconds,
        simulator_max_lag_s: sim_lag,
        max_backlog,
        drained_after_s: drained,
        sustained,
        note,
    };
    eprintln!(
        "    {:>9.0}/s offered: {:>9.0}/s durable, backlog max {:>8.0}, {}",
        total,
        step.achieved_per_s,
        max_backlog,
        if sustained {
            "sustained".to_string()
        } else {
            format!("NOT sustained ({})", step.note)
        }
    );
    Ok(Measured {
        step,
        before,
        after,
        cpu,
    })
}

/// (readings published, max lag behind schedule) from `palletd simulate`.
fn parse_report(text: &str) -> Option<(u64, f64)> {
    let line = text.lines().find(|l| l.starts_with("published "))?;
    let published = line.split_whitespace().nth(1)?.parse().ok()?;
    let lag = line
        .split("max lag behind schedule ")
        .nth(1)?
        .split('s')
        .next()?
        .parse()
        .ok()?;
    Some((published, lag))
}

// ------------------------------------------------------------- scenarios

#[derive(Debug, Clone, serde::Serialize)]
struct ScenarioResult {
    scenario: String,
    sensors: usize,
    probe_per_s: f64,
    steps: Vec<Step>,
    max_sustained_per_s: f64,
    /// Figures of the step at 80% of the highest sustained rate.
    at_80: Option<Figures>,
    /// Data directory bytes after a checkpoint / readings stored.
    data_bytes_per_reading: Option<f64>,
    /// Peak RSS over the stepped run (the last, overloaded, step included).
    rss_steps_mb: f64,
}

/// What one sustained step showed.
#[derive(Debug, Clone, serde::Serialize)]
struct Figures {
    rate: f64,
    lag_p50_s: Option<f64>,
    lag_p99_s: Option<f64>,
    db_write_commands_per_reading: Option<f64>,
    db_write_ops_per_reading: Option<f64>,
    /// Documents inserted, updated or deleted per reading: the database's
    /// write work whatever the batching.
    db_documents_written_per_reading: Option<f64>,
    /// Bucket bytes the database rewrote per stored reading (palletd,
    /// bucket mode).
    bytes_rewritten_per_reading: Option<f64>,
    cpu_us_per_reading: f64,
    /// Peak RSS of the process so far (steps only go up to this one).
    peak_rss_mb: f64,
}

/// One measured step, with the database's write counters around it.
fn measure(
    args: &RunArgs,
    svc: &Services,
    sink: &Sink,
    kind: &str,
    sensors: usize,
    rate: f64,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<(Measured, Figures)> {
    let uri = svc.mongodb_uri();
    let db = kind != "ceiling";
    let before = if db {
        rt.block_on(db_writes(&uri))?
    } else {
        (0.0, 0.0, 0.0)
    };
    let m = step(args, svc, sink, sensors, rate, args.step_secs)?;
    let after = if db {
        rt.block_on(db_writes(&uri))?
    } else {
        (0.0, 0.0, 0.0)
    };
    let n = m.step.durable.max(1) as f64;
    let fig = Figures {
        rate,
        lag_p50_s: quantile(&m.before.age, &m.after.age, 0.50),
        lag_p99_s: quantile(&m.before.age, &m.after.age, 0.99),
        db_write_commands_per_reading: db.then(|| (after.0 - before.0) / n),
        db_write_ops_per_reading: db.then(|| (after.1 - before.1) / n),
        db_documents_written_per_reading: db.then(|| (after.2 - before.2) / n),
        bytes_rewritten_per_reading: (palletd_kind(kind).is_some_and(|k| k.0 == "buckets"))
            .then(|| (m.after.rewritten - m.before.rewritten) / n),
        cpu_us_per_reading: m.cpu.as_secs_f64() * 1e6 / n,
        peak_rss_mb: sink.peak_rss() as f64 / 1e6,
    };
    Ok((m, fig))
}

/// `--rates`: fixed steps on one set of services, CPU and RSS after each
/// (for profiling; no probe, no table).
fn fixed_rates(args: &RunArgs, kind: &str, sensors: usize) -> anyhow::Result<()> {
    eprintln!("== {kind}, {sensors} sensors");
    let svc = Services::start(args)?;
    let sink = start_sink(args, kind, &svc)?;
    eprintln!("  {kind} pids {:?}", sink.pids());
    for &rate in &args.rates {
        let m = step(args, &svc, &sink, sensors, rate, args.step_secs)?;
        let fsyncs = m.after.fsyncs - m.before.fsyncs;
        eprintln!(
            "    cpu {:.1} µs/reading, peak RSS {:.0} MB, {:.0} spool fsyncs/s, {:.1} readings per fsync",
            m.cpu.as_secs_f64() * 1e6 / m.step.durable.max(1) as f64,
            sink.peak_rss() as f64 / 1e6,
            fsyncs / m.step.seconds,
            m.step.durable as f64 / fsyncs.max(1.0)
        );
    }
    Ok(())
}

fn scenario(
    args: &RunArgs,
    kind: &str,
    sensors: usize,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<ScenarioResult> {
    eprintln!("== {kind}, {sensors} sensors");
    // Probe: overload for a short while; what comes through estimates the
    // capacity. Then fresh services for the steps.
    let probe = {
        let svc = Services::start(args)?;
        let sink = start_sink(args, kind, &svc)?;
        let m = step(args, &svc, &sink, sensors, 150_000.0, 15)?;
        (m.step.durable as f64 / m.step.seconds).max(50.0)
    };
    eprintln!("  probe: {probe:.0}/s");
    // Steps at 70% of the probe and up by 1.25 each, so the step below the
    // highest sustained one ran at 80% of it: its figures are the ones
    // reported. (If the first step is the highest, one more run at 80%.)
    let svc = Services::start(args)?;
    let sink = start_sink(args, kind, &svc)?;
    let mut factor = 0.7;
    step(args, &svc, &sink, sensors, probe * factor, args.warmup_secs)?;
    let mut steps = Vec::new();
    let mut sustained: Vec<Figures> = Vec::new();
    loop {
        let (m, fig) = measure(args, &svc, &sink, kind, sensors, probe * factor, rt)?;
        let ok = m.step.sustained;
        steps.push(m.step);
        if ok {
            sustained.push(fig);
            factor *= 1.25;
            if factor > 6.0 {
                break;
            }
        } else if !sustained.is_empty() || factor < 0.05 {
            break;
        } else {
            factor *= 0.5;
        }
    }
    let rss_steps = sink.peak_rss();
    let data_bytes_per_reading = if kind == "ceiling" {
        None
    } else {
        // Everything this database holds came through this sink.
        let total = sink.scrape()?.stored.max(1.0);
        let bytes = rt.block_on(data_bytes(&svc.mongodb_uri(), &svc.dir.path().join("db")))?;
        Some(bytes as f64 / total)
    };
    drop(sink);
    drop(svc);
    let best = sustained.last().map_or(0.0, |f| f.rate);
    let at_80 = match sustained.len() {
        0 => None,
        n if n >= 2 && (sustained[n - 2].rate / best - 0.8).abs() < 0.01 => {
            Some(sustained[n - 2].clone())
        }
        _ => {
            let rate = best * 0.8;
            eprintln!("  at 80%: {rate:.0}/s");
            let svc = Services::start(args)?;
            let sink = start_sink(args, kind, &svc)?;
            step(args, &svc, &sink, sensors, rate, args.warmup_secs)?;
            Some(measure(args, &svc, &sink, kind, sensors, rate, rt)?.1)
        }
    };
    let out = ScenarioResult {
        scenario: kind.to_string(),
        sensors,
        probe_per_s: probe,
        steps,
        max_sustained_per_s: best,
        at_80,
        data_bytes_per_reading,
        rss_steps_mb: rss_steps as f64 / 1e6,
    };
    Ok(out)
}

fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({ "cpu": model, "cores": cores, "memory": mem, "kernel": kernel.trim() })
}

fn fmt(x: Option<f64>, digits: usize) -> String {
    x.map_or("–".into(), |v| format!("{v:.digits$}"))
}

fn table(results: &[ScenarioResult]) -> String {
    let mut t = String::from(
        "| scenario | sensors | max sustained readings/s | lag p50 / p99 at 80% | DB write cmds / reading | DB write ops / reading | DB docs written / reading | bytes rewritten / reading | data bytes / reading | CPU µs / reading at 80% | peak RSS MB at 80% (whole run) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        let f = r.at_80.as_ref();
        t += &format!(
            "| {} | {} | {:.0} | {} / {} s | {} | {} | {} | {} | {} | {} | {} ({:.0}) |\n",
            r.scenario,
            r.sensors,
            r.max_sustained_per_s,
            fmt(f.and_then(|f| f.lag_p50_s), 2),
            fmt(f.and_then(|f| f.lag_p99_s), 2),
            fmt(f.and_then(|f| f.db_write_commands_per_reading), 4),
            fmt(f.and_then(|f| f.db_write_ops_per_reading), 3),
            fmt(f.and_then(|f| f.db_documents_written_per_reading), 3),
            fmt(f.and_then(|f| f.bytes_rewritten_per_reading), 0),
            fmt(r.data_bytes_per_reading, 0),
            fmt(f.map(|f| f.cpu_us_per_reading), 1),
            fmt(f.map(|f| f.peak_rss_mb), 0),
            r.rss_steps_mb
        );
    }
    t
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    if !args.rates.is_empty() {
        for &sensors in &args.sensors {
            for kind in &args.scenarios {
                fixed_rates(&args, kind, sensors)?;
            }
        }
        return Ok(());
    }
    let started = chrono::Utc::now();
    let mut results = Vec::new();
    for &sensors in &args.sensors {
        for kind in &args.scenarios {
            if args.skip.contains(&format!("{kind}/{sensors}")) {
                continue;
            }
            results.push(scenario(&args, kind, sensors, &rt)?);
            eprintln!("{}", table(&results));
        }
    }
    let mut summary = BTreeMap::new();
    for r in &results {
        summary.insert(
            format!("{}/{}", r.scenario, r.sensors),
            r.max_sustained_per_s,
        );
    }
    let doc = json!({
        "date": started.to_rfc3339(),
        "machine": machine(),
        "commit": Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()).map(|s| s.trim().to_string()),
        "step_secs": args.step_secs,
        "warmup_secs": args.warmup_secs,
        "broker": { "max_inflight_messages": args.inflight, "max_queued_messages": args.queued },
        "batch": args.batch.unwrap_or(args.inflight as usize),
        "results": results,
        "max_sustained": summary,
    });
    std::fs::create_dir_all(&args.out)?;
    let path = args
        .out
        .join(format!("{}.json", started.format("%Y-%m-%dT%H%M%SZ")));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("{}", table(&results));
    println!("machine: {}", doc["machine"]);
    println!("raw results: {}", path.display());
    Ok(())
}

// -------------------------------------------------------------- windows

fn windows(args: WindowsArgs) -> anyhow::Result<()> {
    let started = chrono::Utc::now();
    let sensors = args.run.sensors[0];
    let mut runs: Vec<(u16, String)> = Vec::new();
    for &w in &args.windows {
        runs.push((w, "ceiling".into()));
        runs.push((w, "batched".into()));
        for &c in &args.connections {
            runs.push((w, format!("buckets-c{c}")));
        }
    }
    runs.push((args.yardstick_window, "buckets-c1".into()));
    let mut rows = Vec::new();
    let mut text = String::from(
        "| window | sink | readings/s | of the ceiling | of the batched bridge | of 1 connection at the yardstick window | CPU µs / reading |\n|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for (w, kind) in &runs {
        let mut run = args.run.clone();
        run.inflight = *w;
        eprintln!("== window {w}: {kind}, {sensors} sensors");
        let svc = Services::start(&run)?;
        let sink = start_sink(&run, kind, &svc)?;
        let m = step(&run, &svc, &sink, sensors, 150_000.0, args.secs)?;
        let rate = m.step.durable as f64 / m.step.seconds;
        let cpu = m.cpu.as_secs_f64() * 1e6 / m.step.durable.max(1) as f64;
        eprintln!("   {rate:.0} readings/s, {cpu:.1} µs CPU per reading");
        rows.push((*w, kind.clone(), rate, cpu));
    }
    let rate_of = |w: u16, k: &str| {
        rows.iter()
            .find(|r| r.0 == w && r.1 == k)
            .map_or(f64::NAN, |r| r.2)
    };
    let yardstick = rate_of(args.yardstick_window, "buckets-c1");
    for (w, kind, rate, cpu) in &rows {
        use std::fmt::Write as _;
        let _ = writeln!(
            text,
            "| {w} | {kind} | {rate:.0} | {:.2} | {:.2} | {:.2} | {cpu:.1} |",
            rate / rate_of(*w, "ceiling"),
            rate / rate_of(*w, "batched"),
            rate / yardstick,
        );
    }
    let doc = json!({
        "date": started.to_rfc3339(),
        "machine": machine(),
        "commit": Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()).map(|s| s.trim().to_string()),
        "sensors": sensors,
        "secs": args.secs,
        "yardstick_window": args.yardstick_window,
        "rows": rows.iter().map(|(w, k, r, c)| json!({
            "window": w, "sink": k, "readings_per_s": r, "cpu_us_per_reading": c,
        })).collect::<Vec<_>>(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let stem = format!("windows-{}", started.format("%Y-%m-%dT%H%M%SZ"));
    let path = args.run.out.join(format!("{stem}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    std::fs::write(args.run.out.join(format!("{stem}-table.md")), &text)?;
    println!("{text}");
    println!("raw results: {}", path.display());
    Ok(())
}

// -------------------------------------------------------------- hostile

/// The hostile messages, sent in turn: a batch of 1,000 samples from a
/// device whose clock is ten years ahead (JSON, 53 KB), an object of
/// 15,000 distinct keys (195 KB), and a Sparkplug DBIRTH of a new device
/// with 2,000 metrics, half of them named over `max_field_name_length`
/// (140 KB), after 50 such BIRTHs under one node (see [`publish_hostile`]).
struct Hostile {
    clock: Vec<u8>,
    wide: Vec<u8>,
}

impl Hostile {
    fn new() -> Hostile {
        let future = chrono::Utc::now().timestamp_millis() + 10 * 365 * 86_400_000;
        let clock: Vec<serde_json::Value> = (0..1000)
            .map(|i| json!({"ts": future + i * 1000, "temp": 21.5, "humidity": 40.25}))
            .collect();
        let mut wide = serde_json::Map::new();
        for i in 0..15_000 {
            wide.insert(format!("k{i:05}"), json!(i));
        }
        Hostile {
            clock: serde_json::to_vec(&clock).expect("json"),
            wide: serde_json::to_vec(&wide).expect("json"),
        }
    }

    fn birth(seq: u64, metrics: usize) -> Vec<u8> {
        use palletd::decode::sparkplug::{proto, DataType};
        use prost::Message as _;
        let long = "x".repeat(95);
        let metrics = (0..metrics)
            .map(|i| proto::Metric {
                name: Some(if i % 2 == 0 {
                    format!("metric-{i:04}")
                } else {
                    format!("{long}-{i:04}")
                }),
                alias: Some(i as u64),
                datatype: Some(DataType::Double as u32),
                value: Some(proto::metric::Value::DoubleValue(1.0)),
                ..Default::default()
            })
            .collect();
        proto::Payload {
            timestamp: Some(chrono::Utc::now().timestamp_millis() as u64),
            seq: Some(seq % 256),
            metrics,
            ..Default::default()
        }
        .encode_to_vec()
    }
}

/// Publishes hostile messages at `per_s` until `stop`, in turn; before
/// that, an NBIRTH and 50 DBIRTHs of 2,000 metrics under it. Only the
/// names short enough for a field are learnt (1,000 a device), so the
/// node holds 50,000 aliases: the next 50 hostile DBIRTHs are taken, and
/// every one after is refused, the node alone passing
/// `limits.max_sparkplug_aliases` (100,000). (Before the state's budget,
/// every metric with an alias counted and all of them were refused.)
/// Counts what it sent by kind.
async fn publish_hostile(
    port: u16,
    per_s: f64,
    stop: Arc<std::sync::atomic::AtomicBool>,
    sent: Arc<[std::sync::atomic::AtomicU64; 3]>,
) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let mut opts = MqttOptions::new("bench-hostile", "127.0.0.1", port);
    opts.set_max_packet_size(1 << 20, 1 << 20);
    opts.set_inflight(100);
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut eventloop) = AsyncClient::new(opts, 1000);
    tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
    let hostile = Hostile::new();
    let mut seq = 0;
    client
        .publish(
            "spBv1.0/evil/NBIRTH/n0",
            QoS::AtLeastOnce,
            false,
            Hostile::birth(seq, 1),
        )
        .await?;
    // 50 devices of 2,000 aliases: limits.max_sparkplug_aliases (100,000).
    for d in 0..50 {
        seq += 1;
        let topic = format!("spBv1.0/evil/DBIRTH/n0/d{d}");
        client
            .publish(topic, QoS::AtLeastOnce, false, Hostile::birth(seq, 2000))
            .await?;
    }
    let birth = Hostile::birth(seq, 2000);
    let started = Instant::now();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = (started.elapsed().as_secs_f64() * per_s) as u64;
        while n < due {
            let kind = (n % 3) as usize;
            let (topic, payload) = match kind {
                0 => (format!("bench/clock{}/data", n % 10), hostile.clock.clone()),
                1 => (format!("bench/wide{}/data", n % 10), hostile.wide.clone()),
                _ => (format!("spBv1.0/evil/DBIRTH/n0/d{}", 50 + n), birth.clone()),
            };
            client
                .publish(topic, QoS::AtLeastOnce, false, payload)
                .await?;
            sent[kind].fetch_add(1, Ordering::Relaxed);
            n += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = client.disconnect().await;
    Ok(())
}

/// What one palletd showed while a phase ran: peaks of its RSS, of its
/// memory budgets' bytes and of the dead letters' bytes in its spool.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
struct Peaks {
    rss: u64,
    memory: f64,
    deadletter_spool: f64,
}

/// Samples a palletd twice a second into `peaks` until `stop`.
fn sample_peaks(
    pid: u32,
    port: u16,
    peaks: Arc<std::sync::Mutex<Peaks>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let (mut memory, mut deadletter) = (0.0, 0.0);
        if let Ok(body) = http_get(port, "/metrics") {
            for l in body.lines() {
                let value = || l.split_whitespace().last()?.parse::<f64>().ok();
                if l.starts_with(palletd::telemetry::MEMORY_BYTES) {
                    memory += value().unwrap_or(0.0);
                } else if l.starts_with(palletd::telemetry::SPOOL_DEADLETTER_BYTES) {
                    deadletter = value().unwrap_or(0.0);
                }
            }
        }
        {
            let mut p = peaks.lock().unwrap_or_else(|e| e.into_inner());
            p.rss = p.rss.max(rss);
            p.memory = p.memory.max(memory);
            p.deadletter_spool = p.deadletter_spool.max(deadletter);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// See [`Cli::SparkplugFlood`]. Every DBIRTH is also a reading of a new
/// sensor (its `_state`), which costs palletd what any new sensor costs;
/// the yardstick, in the same run on fresh services, is the same number of
/// one-reading JSON messages under the same sensor ids, so the difference
/// in peak RSS is what the Sparkplug B state costs.
fn sparkplug_flood(args: SparkplugFloodArgs) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    // The `[limits]` keys of this scenario, through the sinks' hook for them.
    std::env::set_var(
        "BENCH_PALLETD_LIMITS",
        format!(
            "max_memory = \"{}\"\nmax_sparkplug_nodes = 1000000\n",
            args.max_memory
        ),
    );
    let budget = flood_settings(&args.max_memory)?.limits.split().sparkplug;
    let births = (args.nodes * (args.devices + 1)) as u64;
    let mut rows = Vec::new();
    for kind in ["sparkplug", "json"] {
        let svc = Services::start(&args.run)?;
        let sink = start_sink(
            &args.run,
            if kind == "json" { "buckets" } else { kind },
            &svc,
        )?;
        let (pid, port) = (sink.pids()[0], sink.procs[0].1);
        let rt = tokio::runtime::Runtime::new()?;
        let client = rt.block_on(async {
            let mut opts = MqttOptions::new("bench-flood", "127.0.0.1", svc.broker_port);
            opts.set_inflight(100);
            opts.set_keep_alive(Duration::from_secs(30));
            let (client, mut eventloop) = AsyncClient::new(opts, 1000);
            tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
            client
        });
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // The buffers' bytes (limits.max_memory's parts but the state's).
        let buffers = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (peak, buffers, stop) = (peak.clone(), buffers.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_of(pid), Ordering::Relaxed);
                    let held: f64 = http_get(port, "/metrics")
                        .unwrap_or_default()
                        .lines()
                        .filter(|l| l.starts_with(palletd::telemetry::MEMORY_BYTES))
                        .filter(|l| !l.contains("sparkplug"))
                        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                        .sum();
                    buffers.fetch_max(held as u64, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        let taken = || match kind {
            "json" => counter_sum(port, palletd::telemetry::MESSAGES_RECEIVED),
            _ => counter_sum(port, palletd::telemetry::SPARKPLUG_MESSAGES),
        };
        let wait_for = |n: f64| -> anyhow::Result<f64> {
            let started = Instant::now();
            while taken() < n {
                anyhow::ensure!(
                    started.elapsed() < Duration::from_secs(3600),
                    "the flood was not taken in an hour"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(started.elapsed().as_secs_f64())
        };
        let flood = |prefix: String, nodes: usize| {
            let client = client.clone();
            let devices = args.devices;
            rt.block_on(async move {
                for n in 0..nodes {
                    let node = format!("{prefix}{n:05}");
                    for (topic, payload) in flood_node(kind, &node, devices) {
                        client
                            .publish(topic, QoS::AtLeastOnce, false, payload)
                            .await?;
                    }
                }
                anyhow::Ok(())
            })
        };
        // One node of the shape, then the RSS at rest.
        flood("first".into(), 1)?;
        wait_for((args.devices + 1) as f64)?;
        std::thread::sleep(Duration::from_secs(5));
        let rest = rss_of(pid);
        peak.store(0, Ordering::Relaxed);
        buffers.store(0, Ordering::Relaxed);
        let cpu_before = cpu_of(pid);
        eprintln!("== {kind}: {} nodes x {} devices", args.nodes, args.devices);
        let started = Instant::now();
        flood("n".into(), args.nodes)?;
        wait_for((births + args.devices as u64 + 1) as f64)?;
        let secs = started.elapsed().as_secs_f64();
        // What was received is being written: the peak may come after.
        std::thread::sleep(Duration::from_secs(5));
        let cpu = cpu_of(pid) - cpu_before;
        let mut row = json!({
            "kind": kind,
            "rss_at_rest_mb": rest as f64 / 1e6,
            "peak_rss_mb": peak.load(Ordering::Relaxed) as f64 / 1e6,
            "peak_buffers_mb": buffers.load(Ordering::Relaxed) as f64 / 1e6,
            "messages_per_s": births as f64 / secs,
            "cpu_us_per_message": cpu.as_secs_f64() * 1e6 / births as f64,
        });
        if kind == "sparkplug" {
            let state = http_get(port, "/metrics")
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("palletd_memory_bytes{part=\"sparkplug\"}"))
                .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .unwrap_or(0.0);
            // A node born after the flood: its DATA decodes by alias (its
            // new sensor may still be refused by limits.max_sensors, which
            // the flood's sensors filled: that is not the state's doing).
            let unknown = || {
                http_get(port, "/metrics")
                    .unwrap_or_default()
                    .lines()
                    .find(|l| l.starts_with("palletd_dead_letters_total{cause=\"unknown_alias\"}"))
                    .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            let before = (unknown(), taken());
            for (topic, payload) in flood_node(kind, "line1", 1) {
                rt.block_on(client.publish(
                    topic.replace("/flood/", "/site/"),
                    QoS::AtLeastOnce,
                    false,
                    payload,
                ))?;
            }
            let data = flood_data(7.5);
            rt.block_on(client.publish(
                "spBv1.0/site/DDATA/line1/d0000",
                QoS::AtLeastOnce,
                false,
                data,
            ))?;
            wait_for(before.1 + 3.0)?;
            row["state_budget_mb"] = json!(budget as f64 / 1e6);
            row["state_estimated_mb"] = json!(state / 1e6);
            row["nodes_evicted"] = json!(counter_sum(port, palletd::telemetry::SPARKPLUG_EVICTED));
            row["snapshots_written"] =
                json!(counter_sum(port, palletd::telemetry::SPARKPLUG_STATE_SAVES));
            row["new_node_decoded"] = json!(unknown() == before.0);
        }
        stop.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        eprintln!("  {row}");
        rows.push(row);
    }
    let growth = |r: &serde_json::Value| {
        r["peak_rss_mb"].as_f64().unwrap_or(0.0) - r["rss_at_rest_mb"].as_f64().unwrap_or(0.0)
    };
    let state_mb = growth(&rows[0]) - growth(&rows[1]);
    // The state alone, without the million new sensors' noise around it.
    let alone = std::process::Command::new(std::env::current_exe()?)
        .args([
            "sparkplug-state",
            "--nodes",
            &args.nodes.to_string(),
            "--devices",
            &args.devices.to_string(),
            "--max-memory",
            &args.max_memory,
        ])
        .output()?;
    anyhow::ensure!(
        alone.status.success(),
        "sparkplug-state: {}",
        String::from_utf8_lossy(&alone.stderr)
    );
    let alone: serde_json::Value = serde_json::from_slice(&alone.stdout)?;
    eprintln!("  the state alone: {alone}");
    let result = json!({
        "nodes": args.nodes,
        "devices_per_node": args.devices,
        "max_memory": args.max_memory,
        "runs": rows,
        "state_alone": alone,
        "state_rss_mb": state_mb,
        "state_rss_over_budget": state_mb * 1e6 / budget as f64,
    });
    println!("{}", serde_json::to_string_pretty(&result)?);
    let path = args.run.out.join(format!(
        "sparkplug-flood-{}.json",
        chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ")
    ));
    std::fs::create_dir_all(&args.run.out)?;
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&json!({"machine": machine(), "result": result}))?,
    )?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// The settings of palletd in the flood: a Sparkplug B subscription and
/// `[limits]` as the sinks get them (`max_memory`, nodes unbounded).
fn flood_settings(max_memory: &str) -> anyhow::Result<palletd::config::Settings> {
    palletd::config::parse(
        &format!(
            "[mqtt]\nurl = \"mqtt://x\"\nclient_id = \"x\"\n[mongodb]\nuri = \"mongodb://x\"\ndatabase = \"x\"\n\
             [[subscription]]\ntopic = \"spBv1.0/#\"\nformat = \"sparkplug_b\"\n[limits]\nmax_memory = \"{max_memory}\"\nmax_sparkplug_nodes = 1000000\n"
        ),
        None,
    )
    .map_err(|e| anyhow::anyhow!("{e:?}"))
}

/// See [`Cli::SparkplugState`].
fn sparkplug_state(args: SparkplugFloodArgs) -> anyhow::Result<()> {
    let settings = flood_settings(&args.max_memory)?;
    let limits = settings.decode_limits();
    let budget = limits.max_sparkplug_bytes;
    let mut decoder = palletd::decode::Decoder::new(settings.subscriptions.clone(), limits);
    let before = rss_of(std::process::id());
    let (mut peak, mut messages, mut snapshot_bytes) = (before, 0u64, 0usize);
    let mut chunk = Vec::new();
    let now = palletd::clock::now_ms();
    for n in 0..args.nodes {
        for (topic, payload) in flood_node("sparkplug", &format!("n{n}"), args.devices) {
            let _ = decoder.decode_with(&topic, &payload, None, now);
            messages += 1;
            if messages % 1000 == 0 {
                // A snapshot as palletd makes it: a chunk at a time.
                let state = decoder.sparkplug_state();
                let mut after = None;
                loop {
                    chunk.clear();
                    after = state.snapshot_lines(
                        after.as_ref(),
                        &mut chunk,
                        palletd::admission::sparkplug::CHUNK_BYTES,
                    );
                    snapshot_bytes = snapshot_bytes.max(chunk.capacity());
                    if after.is_none() {
                        break;
                    }
                }
                peak = peak.max(rss_of(std::process::id()));
            }
        }
    }
    let end = rss_of(std::process::id());
    peak = peak.max(end);
    let estimate = decoder.sparkplug_state().bytes();
    let result = json!({
        "messages": messages,
        "rss_growth_mb": (end - before) as f64 / 1e6,
        "peak_rss_growth_mb": (peak - before) as f64 / 1e6,
        "state_estimated_mb": estimate as f64 / 1e6,
        "state_budget_mb": budget as f64 / 1e6,
        "peak_over_budget": (peak - before) as f64 / budget as f64,
        "snapshot_chunk_mb": snapshot_bytes as f64 / 1e6,
    });
    println!("{result}");
    Ok(())
}

/// One node's messages of the flood: for `sparkplug` an NBIRTH and a
/// DBIRTH of three metrics per device; for `json` one message per device
/// sensor with the same three fields, and one for the node.
fn flood_node(kind: &str, node: &str, devices: usize) -> Vec<(String, Vec<u8>)> {
    use palletd::decode::sparkplug::{proto, DataType};
    use prost::Message as _;
    let now = chrono::Utc::now().timestamp_millis();
    if kind == "json" {
        let one = |sensor: String| {
            let body = json!({"ts": now, "temperature": 1.0, "humidity": 1.0, "pressure": 1.0});
            (
                format!("bench/{sensor}/data"),
                body.to_string().into_bytes(),
            )
        };
        return std::iter::once(one(format!("flood:{node}")))
            .chain((0..devices).map(|d| one(format!("flood:{node}:d{d:04}"))))
            .collect();
    }
    let metric = |name: &str, alias: u64, t: DataType, v: proto::metric::Value| proto::Metric {
        name: Some(name.into()),
        alias: Some(alias),
        datatype: Some(t as u32),
        value: Some(v),
        ..Default::default()
    };
    let payload = |seq: u64, metrics: Vec<proto::Metric>| {
        proto::Payload {
            timestamp: Some(now as u64),
            seq: Some(seq % 256),
            metrics,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let bd_seq = metric(
        "bdSeq",
        0,
        DataType::Int64,
        proto::metric::Value::LongValue(0),
    );
    let mut out = vec![(
        format!("spBv1.0/flood/NBIRTH/{node}"),
        payload(0, vec![bd_seq]),
    )];
    for d in 0..devices {
        let metrics = ["temperature", "humidity", "pressure"]
            .iter()
            .enumerate()
            .map(|(k, n)| {
                metric(
                    n,
                    1 + k as u64,
                    DataType::Double,
                    proto::metric::Value::DoubleValue(1.0),
                )
            })
            .collect();
        out.push((
            format!("spBv1.0/flood/DBIRTH/{node}/d{d:04}"),
            payload(1 + d as u64, metrics),
        ));
    }
    out
}

/// A DDATA of the flood's first metric (alias 1) by alias.
fn flood_data(x: f64) -> Vec<u8> {
    use palletd::decode::sparkplug::proto;
    use prost::Message as _;
    let ts = chrono::Utc::now().timestamp_millis() as u64;
    proto::Payload {
        timestamp: Some(ts),
        seq: Some(2),
        metrics: vec![proto::Metric {
            alias: Some(1),
            timestamp: Some(ts),
            value: Some(proto::metric::Value::DoubleValue(x)),
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec()
}

/// The resident set size of a process now, in bytes.
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A counter's value summed over its labels.
fn counter_sum(port: u16, name: &str) -> f64 {
    http_get(port, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

fn hostile(args: HostileArgs) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let svc = Services::start(&args.run)?;
    let sink = start_sink_with(
        &args.run,
        "buckets",
        &svc,
        &svc.mongodb_uri(),
        "",
        &format!("max_size = \"{}\"", args.spool_max_size),
        "[[subscription]]\ntopic = \"spBv1.0/#\"\nformat = \"sparkplug_b\"\n",
    )?;
    let (pid, port) = (sink.pids()[0], sink.procs[0].1);
    let rt = tokio::runtime::Runtime::new()?;
    let peaks = Arc::new(std::sync::Mutex::new(Peaks::default()));
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peaks, stop) = (peaks.clone(), sampler_stop.clone());
        std::thread::spawn(move || sample_peaks(pid, port, peaks, stop))
    };
    let take_peaks = || std::mem::take(&mut *peaks.lock().unwrap_or_else(|e| e.into_inner()));
    eprintln!("== hostile: warm-up 15 s");
    step(&args.run, &svc, &sink, args.sensors, args.rate, 15)?;
    take_peaks();

    let mut rows = Vec::new();
    let mut measure = |label: &str, m: &Measured, peaks: Peaks| {
        let good = m.step.durable.max(1) as f64;
        let row = json!({
            "phase": label,
            "offered_per_s": m.step.target_per_s,
            "durable_per_s": m.step.achieved_per_s,
            "published": m.step.published,
            "durable": m.step.durable,
            "sustained": m.step.sustained,
            "drained_after_s": m.step.drained_after_s,
            "lag_p50_s": quantile(&m.before.live_age, &m.after.live_age, 0.5),
            "lag_p99_s": quantile(&m.before.live_age, &m.after.live_age, 0.99),
            "cpu_us_per_good_reading": m.cpu.as_secs_f64() * 1e6 / good,
            "peak_rss_mb": peaks.rss as f64 / 1e6,
            "peak_memory_budget_mb": peaks.memory / 1e6,
            "peak_deadletter_spool_mb": peaks.deadletter_spool / 1e6,
            "dead_letters_dropped": counter_sum(port, palletd::telemetry::DEAD_LETTERS_DROPPED),
        });
        eprintln!("  {row}");
        rows.push(row);
    };

    eprintln!("== good sensors only, {} s", args.secs);
    let m = step(&args.run, &svc, &sink, args.sensors, args.rate, args.secs)?;
    measure("good only", &m, take_peaks());

    // Hostile messages are `share` of all messages.
    let hostile_per_s = args.rate * args.share / (1.0 - args.share);
    let stop = Arc::new(AtomicBool::new(false));
    let sent: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let publisher = rt.spawn(publish_hostile(
        svc.broker_port,
        hostile_per_s,
        stop.clone(),
        sent.clone(),
    ));
    std::thread::sleep(Duration::from_secs(5));
    take_peaks();
    eprintln!(
        "== with {hostile_per_s:.0} hostile messages/s beside them, {} s",
        args.secs
    );
    let m = step(&args.run, &svc, &sink, args.sensors, args.rate, args.secs)?;
    measure("with 1% hostile", &m, take_peaks());

    eprintln!(
        "== database stopped for {} s with both flowing",
        args.outage_secs
    );
    // Not `step`: a backlog that grows is the point here. The simulator
    // runs through the outage and 60 s past it; then everything published
    // must become durable.
    let db_pid = svc._db.0.id().to_string();
    let signal = |sig: &str| Command::new("kill").args([sig, &db_pid]).status();
    let before = sink.scrape()?;
    let cpu_before = sink.cpu();
    let started = Instant::now();
    let secs = args.outage_secs + 65;
    let mut sim = simulator(&args.run, &svc, args.sensors, args.rate, secs)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_secs(5));
    signal("-STOP")?;
    std::thread::sleep(Duration::from_secs(args.outage_secs));
    signal("-CONT")?;
    let mut report = String::new();
    if let Some(mut out) = sim.stdout.take() {
        let _ = out.read_to_string(&mut report);
    }
    let _ = sim.wait();
    let seconds = started.elapsed().as_secs_f64();
    let (published, sim_lag) = parse_report(&report).unwrap_or((0, f64::NAN));
    let end = Instant::now();
    let mut drained = None;
    let mut after = sink.scrape()?;
    while end.elapsed() < Duration::from_secs(300) {
        after = sink.scrape()?;
        if after.stored - before.stored >= published as f64 {
            drained = Some(end.elapsed().as_secs_f64());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let durable = (after.stored - before.stored) as u64;
    let m = Measured {
        step: Step {
            target_per_s: args.rate,
            seconds,
            published,
            durable,
            achieved_per_s: durable as f64 / seconds,
            simulator_max_lag_s: sim_lag,
            max_backlog: 0.0,
            drained_after_s: drained,
            sustained: drained.is_some(),
            note: String::new(),
        },
        before,
        after,
        cpu: sink.cpu().saturating_sub(cpu_before),
    };
    eprintln!(
        "    {published} published, {durable} durable, {}",
        drained.map_or("not all durable within 300 s".to_string(), |d| format!(
            "all durable {d:.0} s after the last publish"
        ))
    );
    stop.store(true, Ordering::Relaxed);
    let _ = rt.block_on(publisher);
    measure("database stopped, then back", &m, take_peaks());
    sampler_stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();

    let sent: Vec<u64> = sent.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    let out = json!({
        "scenario": "hostile",
        "sensors": args.sensors,
        "good_rate": args.rate,
        "hostile_share": args.share,
        "hostile_per_s": hostile_per_s,
        "hostile_sent": {"wrong_clock": sent[0], "wide_object": sent[1], "oversized_birth": sent[2]},
        "spool_max_size": args.spool_max_size,
        // limits.max_memory = "auto" on this box (BENCH_PALLETD_LIMITS aside).
        "max_memory_mb": palletd::config::memory::auto().0 as f64 / 1e6,
        "dead_letters_total": counter_sum(port, palletd::telemetry::DEAD_LETTERS),
        "phases": rows,
        "machine": machine(),
    });
    println!("| phase | good readings/s offered / durable | lag p50 / p99 s | CPU µs / good reading | peak RSS MB | memory budgets peak MB (of {:.0}) | dead letters in spool peak MB | dead letters dropped |", out["max_memory_mb"].as_f64().unwrap_or(0.0));
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in out["phases"].as_array().into_iter().flatten() {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} / {}{} | {} / {} | {} | {} | {} | {} | {} |",
            r["phase"].as_str().unwrap_or(""),
            f("offered_per_s", 0),
            f("durable_per_s", 0),
            if r["sustained"].as_bool() == Some(true) {
                ""
            } else {
                " (not sustained)"
            },
            f("lag_p50_s", 2),
            f("lag_p99_s", 2),
            f("cpu_us_per_good_reading", 1),
            f("peak_rss_mb", 0),
            f("peak_memory_budget_mb", 1),
            f("peak_deadletter_spool_mb", 1),
            f("dead_letters_dropped", 0),
        );
    }
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("hostile-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    // palletd's log beside it (what it said of the limits and the outage).
    let _ = std::fs::copy(
        svc.dir.path().join("buckets-0.log"),
        args.run.out.join(format!("{name}-palletd.log")),
    );
    eprintln!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

// ------------------------------------------------------------ backfill

/// The server's single-sample upsert rate by `_id`: `n` upserts of the
/// shape palletd sends (its `_id`, `sensorId`, `startTs`, `closed` and the
/// caps), each a new bucket of one sample, in commands of 1,000.
async fn probe_upserts(uri: &str, n: usize) -> anyhow::Result<f64> {
    let client = mongodb::Client::with_uri_str(uri).await?;
    let db = client.database("probe");
    db.collection::<bson::Document>("buckets").drop().await?;
    db.collection::<bson::Document>("buckets")
        .create_indexes(palletd::store::buckets::indexes())
        .await?;
    let statements: Vec<bson::Document> = (0..n)
        .map(|i| {
            let (sensor, start) = (format!("p{}", i % 3), (i / 3) as i64 * 3_600_000);
            let ts = bson::DateTime::from_millis(start);
            doc! {
                "q": {
                    "_id": palletd::bucket::bucket_id(&sensor, start, 0),
                    "sensorId": &sensor, "startTs": ts, "closed": false,
                    "count": { "$lte": 199 }, "size": { "$lte": 262_000 },
                },
                "u": {
                    "$push": { "samples": { "$each": [ { "ts": ts, "temp": 1.5 } ] } },
                    "$inc": { "count": 1, "size": 40, "sum.temp": 1.5, "n.temp": 1 },
                    "$min": { "min.temp": 1.5 }, "$max": { "max.temp": 1.5 },
                    "$setOnInsert": { "endTs": ts },
                },
                "upsert": true,
            }
        })
        .collect();
    let started = Instant::now();
    for chunk in statements.chunks(1000) {
        db.run_command(doc! { "update": "buckets", "updates": chunk, "ordered": true })
            .await?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The smallest bucket bound of histogram `name` that holds every
/// observation (`inf` if none does).
fn longest_of(port: u16, name: &str) -> f64 {
    let buckets = http_get(port, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket")))
        .filter_map(|l| {
            let le = l
                .split("le=\"")
                .nth(1)?
                .split('"')
                .next()?
                .parse::<f64>()
                .ok()?;
            let n = l.split_whitespace().last()?.parse::<f64>().ok()?;
            Some((le, n))
        })
        .collect::<Vec<_>>();
    let total = buckets.iter().map(|b| b.1).fold(0.0, f64::max);
    buckets
        .iter()
        .filter(|b| b.1 >= total)
        .map(|b| b.0)
        .fold(f64::INFINITY, f64::min)
}

/// Observations of histogram `name`.
fn histogram_count(port: u16, name: &str) -> f64 {
    http_get(port, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_count")))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// Reads every rollup of the backfill (1h, 1d, 7d) and compares its count
/// and its temperature's sum, first and last with a summary of the
/// readings computed here. Returns (documents checked, wrong ones).
async fn check_backfill_rollups(
    uri: &str,
    args: &BackfillArgs,
    first: i64,
) -> anyhow::Result<(usize, usize)> {
    let db = mongodb::Client::with_uri_str(uri).await?.database("bench");
    let (mut checked, mut wrong) = (0, 0);
    for (name, ms) in [
        ("1h", 3_600_000_i64),
        ("1d", 86_400_000),
        ("7d", 7 * 86_400_000),
    ] {
        // (station, start) -> (count, sum, first, last)
        let mut want: HashMap<(String, i64), (i64, f64, f64, f64)> = HashMap::new();
        for s in 0..args.sensors {
            for h in 0..args.hours {
                let ts = first + h as i64 * 3_600_000 + 1_000;
                let t = weather(s, h)["temp"].as_f64().unwrap_or(0.0);
                let e = want
                    .entry((format!("station-{s}"), ts.div_euclid(ms) * ms))
                    .or_insert((0, 0.0, t, t));
                e.0 += 1;
                e.1 += t;
                e.3 = t;
            }
        }
        let mut cursor = db
            .collection::<bson::Document>(&format!("readings_{name}"))
            .find(doc! {})
            .await?;
        while let Some(d) = cursor.try_next().await? {
            checked += 1;
            let key = (
                d.get_str("sensorId").unwrap_or_default().to_string(),
                d.get_datetime("start")
                    .map(|t| t.timestamp_millis())
                    .unwrap_or(0),
            );
            let got = |part: &str| {
                d.get_document(part)
                    .ok()
                    .and_then(|p| p.get_f64("temp").ok())
                    .unwrap_or(f64::NAN)
            };
            let count = d.get_i64("count").unwrap_or(-1);
            let ok = want.get(&key).is_some_and(|w| {
                w.0 == count
                    && (w.1 - got("sum")).abs() <= 1e-9 * w.1.abs().max(1.0)
                    && w.2 == got("first")
                    && w.3 == got("last")
            });
            if !ok {
                wrong += 1;
                if wrong <= 3 {
                    eprintln!("  wrong rollup {name} {key:?}: {d}");
                }
            }
        }
    }
    Ok((checked, wrong))
}

/// Publishes `count` readings (sensor, JSON) at QoS 1 as fast as the
/// broker takes them, and returns once the broker acknowledged them all.
async fn publish_acknowledged(
    broker_port: u16,
    client_id: &str,
    count: usize,
    messages: impl Iterator<Item = (String, serde_json::Value)>,
) -> anyhow::Result<()> {
    let mut opts = MqttOptions::new(client_id, "127.0.0.1", broker_port);
    opts.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut eventloop) = AsyncClient::new(opts, 1000);
    let acks = tokio::spawn(async move {
        let mut acked = 0usize;
        while acked < count {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    for (sensor, v) in messages {
        let topic = TOPIC.replace("{sensor}", &sensor);
        client
            .publish(topic, QoS::AtLeastOnce, false, v.to_string())
            .await?;
    }
    acks.await?;
    Ok(())
}

fn series(args: SeriesArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let minutes = args.days * 24 * 60;
    let readings = args.sensors * minutes;
    let svc = Services::start(&args.run)?;
    let tail = format!(
        "[bucket]\nwindow = \"1h\"\nmax_lateness = \"{}d\"\n[flush]\nmax_delay = \"2s\"\n\
         [closer]\ninterval = \"1s\"\ngrace = \"1s\"\n[[rollup]]\ninterval = \"1h\"\n",
        args.days + 2
    );
    let sink = buckets_sink(&args.run, &svc, &tail)?;
    let port = sink.procs[0].1;
    let minute = 60_000i64;
    let end = chrono::Utc::now().timestamp_millis() / minute * minute;
    let first = end - (minutes as i64 - 1) * minute;
    eprintln!(
        "== series: {} sensors x {} days of a reading a minute",
        args.sensors, args.days
    );
    let started = Instant::now();
    let messages = (0..minutes).flat_map(|m| {
        (0..args.sensors).map(move |s| {
            let mut v = weather(s, m);
            v["ts"] = json!(first + m as i64 * minute);
            (format!("station-{s}"), v)
        })
    });
    rt.block_on(publish_acknowledged(
        svc.broker_port,
        "bench-series",
        readings,
        messages,
    ))?;
    while counter_sum(port, palletd::telemetry::SAMPLES_STORED) < readings as f64 {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "not all stored"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every hour over rolled up (the last one or two are read from the
    // windows in any case).
    let hours_over = (end - first) / 3_600_000;
    while counter_sum(port, palletd::telemetry::ROLLUPS_WRITTEN)
        < (args.sensors as i64 * hours_over) as f64
    {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "not all rolled up"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "stored and rolled up in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let iso = |ms: i64| palletd::clock::iso(ms);
    let to = (end / 3_600_000 + 1) * 3_600_000;
    let from = to - args.days as i64 * 86_400_000;
    let path = |source: &str| {
        format!(
            "/api/series?sensor=station-0&from={}&to={}&step=1h&source={source}",
            iso(from),
            iso(to)
        )
    };
    let server = |uri: String| -> anyhow::Result<[f64; 5]> {
        rt.block_on(async {
            let client = mongodb::Client::with_uri_str(&uri).await?;
            let s = client
                .database("admin")
                .run_command(doc! { "serverStatus": 1 })
                .await?;
            let at = |path: &[&str]| -> f64 {
                let mut d = &s;
                for p in &path[..path.len() - 1] {
                    match d.get_document(p) {
                        Ok(next) => d = next,
                        Err(_) => return f64::NAN,
                    }
                }
                match d.get(path[path.len() - 1]) {
                    Some(bson::Bson::Int32(x)) => *x as f64,
                    Some(bson::Bson::Int64(x)) => *x as f64,
                    Some(bson::Bson::Double(x)) => *x,
                    _ => f64::NAN,
                }
            };
            Ok::<_, anyhow::Error>([
                at(&["opcounters", "query"]) + at(&["opcounters", "getmore"]),
                at(&["metrics", "document", "returned"]),
                at(&["network", "bytesOut"]),
                at(&["network", "bytesIn"]),
                at(&["opcounters", "command"]),
            ])
        })
    };
    let mut text = format!(
        "{} sensors x {} days of a reading a minute (3 fields), one sensor's week at an hour a point, {} answers per source ({})\n\n\
         | source | ms per answer (median) | p90 | points | readings counted | finds+getMores per answer | documents returned per answer | bytes the server sent per answer | bytes it received | palletd CPU ms per answer |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        args.sensors,
        args.days,
        args.repeat,
        machine()
    );
    let mut answers = Vec::new();
    for source in ["rollup", "windows", "samples"] {
        // One to warm the caches, then the measured ones.
        let body = http_get(port, &path(source))?;
        let rows: Vec<serde_json::Value> =
            serde_json::from_str(&body).map_err(|e| anyhow::anyhow!("{source}: {e}: {body}"))?;
        let before = server(svc.mongodb_uri())?;
        let cpu0 = sink.cpu();
        let mut times = Vec::new();
        for _ in 0..args.repeat {
            let t = Instant::now();
            let body = http_get(port, &path(source))?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(body.starts_with('['), "{source}: {body}");
        }
        let cpu = sink.cpu().saturating_sub(cpu0).as_secs_f64() * 1000.0;
        let after = server(svc.mongodb_uri())?;
        times.sort_by(f64::total_cmp);
        let per = |i: usize| (after[i] - before[i]) / args.repeat as f64;
        let counted: i64 = rows.iter().filter_map(|r| r["n"].as_i64()).sum();
        text += &format!(
            "| {source} | {:.2} | {:.2} | {} | {counted} | {:.1} | {:.1} | {:.0} | {:.0} | {:.2} |\n",
            times[times.len() / 2],
            times[times.len() * 9 / 10],
            rows.len(),
            per(0),
            per(1),
            per(2),
            per(3),
            cpu / args.repeat as f64,
        );
        answers.push((source, rows));
    }
    // The same figures from every source (no thinning here).
    let key = |rows: &Vec<serde_json::Value>| -> Vec<(String, String, i64, String)> {
        rows.iter()
            .map(|r| {
                (
                    r["time"].to_string(),
                    r["field"].to_string(),
                    r["n"].as_i64().unwrap_or(-1),
                    format!("{:.6}", r["sum"].as_f64().unwrap_or(f64::NAN)),
                )
            })
            .collect()
    };
    for (source, rows) in &answers[1..] {
        anyhow::ensure!(
            key(rows) == key(&answers[0].1),
            "{source} answers differently from the rollup"
        );
    }
    eprintln!("the three sources give the same points");
    std::fs::create_dir_all(&args.run.out)?;
    let stamp = chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ");
    std::fs::write(args.run.out.join(format!("series-{stamp}-table.md")), &text)?;
    println!("{text}");
    Ok(())
}

/// One station's reading at hour `h`: a day's swing and a year's, and
/// noise of a fixed seed (the same in every run).
fn weather(station: usize, h: usize) -> serde_json::Value {
    let day = (h % 24) as f64 / 24.0 * std::f64::consts::TAU;
    let year = (h % 8760) as f64 / 8760.0 * std::f64::consts::TAU;
    let noise = ((h * 7919 + station * 104_729) % 1000) as f64 / 1000.0 - 0.5;
    json!({
        "temp": 10.0 + station as f64 - 6.0 * day.cos() - 9.0 * year.cos() + noise,
        "hum": 70.0 + 15.0 * day.cos() + 5.0 * noise,
        "pres": 1013.0 + 8.0 * (year * 3.0).sin() + noise,
    })
}

fn backfill(args: BackfillArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let readings = args.sensors * args.hours;
    let lateness = format!("{}d", args.hours / 24 + 30);
    let common = format!(
        "[bucket]\nwindow = \"1h\"\nmax_lateness = \"{lateness}\"\n[flush]\nmax_delay = \"2s\"\n"
    );
    let rollups = "[[rollup]]\ninterval = \"1h\"\n[[rollup]]\ninterval = \"1d\"\n[[rollup]]\ninterval = \"7d\"\n";
    let mut rows = Vec::new();
    for (label, tail) in [
        ("rollups off", common.clone()),
        ("rollups 1h + 1d + 7d", format!("{common}{rollups}")),
    ] {
        eprintln!(
            "== backfill, {label}: {} stations x {} hours",
            args.sensors, args.hours
        );
        let svc = Services::start(&args.run)?;
        let probe = rt.block_on(probe_upserts(&svc.mongodb_uri(), 9000))?;
        eprintln!("  probe: {probe:.0} single-sample upserts/s by _id");
        let sink = buckets_sink(&args.run, &svc, &tail)?;
        let port = sink.procs[0].1;
        let now = chrono::Utc::now().timestamp_millis() / 3_600_000 * 3_600_000;
        let first = now - args.hours as i64 * 3_600_000;
        let started = Instant::now();
        let messages = (0..args.hours).flat_map(|h| {
            (0..args.sensors).map(move |s| {
                let mut v = weather(s, h);
                v["ts"] = json!(first + h as i64 * 3_600_000 + 1_000);
                (format!("station-{s}"), v)
            })
        });
        rt.block_on(publish_acknowledged(
            svc.broker_port,
            "bench-backfill",
            readings,
            messages,
        ))?;
        let published_s = started.elapsed().as_secs_f64();
        let mut stored = 0.0;
        while started.elapsed() < Duration::from_secs(1800) {
            stored = counter_sum(port, palletd::telemetry::SAMPLES_STORED);
            if stored >= readings as f64 {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let stored_s = started.elapsed().as_secs_f64();
        let rate = stored / stored_s;
        // Every rollup document there: one per station and interval that
        // is over (and past closer.grace, 5 min, when the pass takes it).
        let intervals = |ms: i64| {
            let (lo, hi) = (first, first + (args.hours as i64 - 1) * 3_600_000 + 1_000);
            let due_by = chrono::Utc::now().timestamp_millis() - 300_000;
            (lo.div_euclid(ms)..=hi.div_euclid(ms))
                .filter(|i| (i + 1) * ms <= due_by)
                .count()
        };
        let want_rollups = if label == "rollups off" {
            0
        } else {
            args.sensors
                * (intervals(3_600_000) + intervals(86_400_000) + intervals(7 * 86_400_000))
        };
        let mut rollups_s = None;
        while want_rollups > 0 && started.elapsed() < Duration::from_secs(1800) {
            if counter_sum(port, palletd::telemetry::ROLLUPS_WRITTEN) >= want_rollups as f64 {
                rollups_s = Some(started.elapsed().as_secs_f64());
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let statements_max = counter_sum(port, palletd::telemetry::FLUSH_STATEMENTS_MAX);
        let longest = longest_of(port, palletd::telemetry::FLUSH_SECONDS);
        // Every rollup document against the same summary computed here.
        let (checked, wrong) = if want_rollups > 0 {
            rt.block_on(check_backfill_rollups(&svc.mongodb_uri(), &args, first))?
        } else {
            (0, 0)
        };
        let row = json!({
            "variant": label,
            "readings": readings,
            "stored": stored,
            "published_s": published_s,
            "stored_s": stored_s,
            "stored_per_s": rate,
            "probe_upserts_per_s": probe,
            "of_probe": rate / probe,
            "flush_statements_max": statements_max,
            "longest_flush_at_most_s": longest,
            "statements": counter_sum(port, palletd::telemetry::STATEMENTS),
            "flushes": counter_sum(port, palletd::telemetry::FLUSHES),
            "collisions": counter_sum(port, palletd::telemetry::BUCKET_COLLISIONS),
            "rollups_written": counter_sum(port, palletd::telemetry::ROLLUPS_WRITTEN),
            "rollups_wanted": want_rollups,
            "rollups_done_s": rollups_s,
            "rollups_after_stored_s": rollups_s.map(|r| r - stored_s),
            "rollups_checked": checked,
            "rollups_wrong": wrong,
            "rollup_pass_longest_at_most_s": longest_of(port, palletd::telemetry::ROLLUP_PASS_SECONDS),
            "rollup_passes": histogram_count(port, palletd::telemetry::ROLLUP_PASS_SECONDS),
        });
        eprintln!("  {row}");
        rows.push(row);
        drop(sink);
    }
    println!("| variant | readings | stored in | readings/s | probe upserts/s by _id | of the probe | statements / flush, max | longest flush | rollups written (all after) | rollups wrong | passes (longest) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} s | {} | {} | {:.0}% | {} | <= {} s | {} ({} s) | {} of {} | {} (<= {} s) |",
            r["variant"].as_str().unwrap_or(""),
            f("readings", 0),
            f("stored_s", 1),
            f("stored_per_s", 0),
            f("probe_upserts_per_s", 0),
            r["of_probe"].as_f64().unwrap_or(0.0) * 100.0,
            f("flush_statements_max", 0),
            f("longest_flush_at_most_s", 3),
            f("rollups_written", 0),
            f("rollups_done_s", 0),
            f("rollups_wrong", 0),
            f("rollups_checked", 0),
            f("rollup_passes", 0),
            f("rollup_pass_longest_at_most_s", 1),
        );
    }
    let out = json!({
        "scenario": "backfill",
        "sensors": args.sensors,
        "hours": args.hours,
        "variants": rows,
        "machine": machine(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("backfill-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}

fn live_rollups(args: LiveRollupsArgs) -> anyhow::Result<()> {
    let rollups = "[[rollup]]\ninterval = \"1h\"\npartial = true\n[[rollup]]\ninterval = \"1d\"\npartial = true\n";
    let mut rows = Vec::new();
    for (label, tail) in [("rollups off", ""), ("rollups 1h + 1d, partial", rollups)] {
        eprintln!(
            "== live rollups, {label}: {} sensors, {}/s, {} s",
            args.sensors, args.rate, args.secs
        );
        let svc = Services::start(&args.run)?;
        let sink = buckets_sink(&args.run, &svc, tail)?;
        let port = sink.procs[0].1;
        step(&args.run, &svc, &sink, args.sensors, args.rate, 15)?;
        let m = step(&args.run, &svc, &sink, args.sensors, args.rate, args.secs)?;
        let good = m.step.durable.max(1) as f64;
        let row = json!({
            "variant": label,
            "offered_per_s": m.step.target_per_s,
            "durable_per_s": m.step.achieved_per_s,
            "sustained": m.step.sustained,
            "lag_p50_s": quantile(&m.before.live_age, &m.after.live_age, 0.5),
            "lag_p99_s": quantile(&m.before.live_age, &m.after.live_age, 0.99),
            "cpu_us_per_reading": m.cpu.as_secs_f64() * 1e6 / good,
            "statements": counter_sum(port, palletd::telemetry::STATEMENTS),
            "rollup_statements": counter_sum(port, palletd::telemetry::ROLLUP_STATEMENTS),
            "rollups_written": counter_sum(port, palletd::telemetry::ROLLUPS_WRITTEN),
            "rollup_passes": histogram_count(port, palletd::telemetry::ROLLUP_PASS_SECONDS),
            "rollup_pass_longest_at_most_s": longest_of(port, palletd::telemetry::ROLLUP_PASS_SECONDS),
        });
        eprintln!("  {row}");
        rows.push(row);
        drop(sink);
    }
    println!("| variant | offered/s | durable/s | lag p50 | lag p99 | CPU µs / reading | rollups written | passes (longest) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} | {} s | {} s | {} | {} | {} (<= {} s) |",
            r["variant"].as_str().unwrap_or(""),
            f("offered_per_s", 0),
            f("durable_per_s", 0),
            f("lag_p50_s", 2),
            f("lag_p99_s", 2),
            f("cpu_us_per_reading", 1),
            f("rollups_written", 0),
            f("rollup_passes", 0),
            f("rollup_pass_longest_at_most_s", 2),
        );
    }
    let out = json!({
        "scenario": "live-rollups",
        "sensors": args.sensors,
        "rate": args.rate,
        "secs": args.secs,
        "variants": rows,
        "machine": machine(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!(
        "live-rollups-{}",
        chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ")
    );
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}

/// Readings stored in bench.readings (the sum of the buckets' counts).
async fn stored_in_db(db: &mongodb::Database) -> anyhow::Result<i64> {
    let mut cursor = db
        .collection::<bson::Document>("readings")
        .aggregate([doc! { "$group": { "_id": null, "n": { "$sum": "$count" } } }])
        .await?;
    Ok(match cursor.try_next().await? {
        Some(d) => d
            .get_i32("n")
            .map(i64::from)
            .or_else(|_| d.get_i64("n"))
            .unwrap_or(0),
        None => 0,
    })
}

fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let readings = args.sensors * args.windows * args.per_window;
    let windows = args.sensors * args.windows;
    let tail = format!(
        "[bucket]\nwindow = \"1m\"\nmax_lateness = \"{}m\"\n[flush]\nmax_delay = \"2s\"\n",
        args.windows + 60
    );
    let mut rows = Vec::new();
    // (label, killed, [mongodb] settings)
    let variants = [
        ("no crash", false, ""),
        ("SIGKILL, then replay", true, ""),
        (
            "SIGKILL, write_time_limit = 2s",
            true,
            "write_time_limit = \"2s\"",
        ),
    ];
    for (label, crash, mongodb) in variants {
        eprintln!("== replay, {label}: {readings} readings over {windows} windows");
        let svc = Services::start(&args.run)?;
        let db = rt
            .block_on(mongodb::Client::with_uri_str(svc.mongodb_uri()))?
            .database("bench");
        let start = |svc: &Services| {
            start_sink_with(
                &args.run,
                "buckets",
                svc,
                &svc.mongodb_uri(),
                mongodb,
                "",
                &tail,
            )
        };
        let mut sink = start(&svc)?;
        let db_pid = svc._db.0.id().to_string();
        let signal = |sig: &str, pid: &str| Command::new("kill").args([sig, pid]).status();
        signal("-STOP", &db_pid)?;
        // Every reading published and acknowledged (so spooled).
        let now = chrono::Utc::now().timestamp_millis() / 60_000 * 60_000;
        let first = now - args.windows as i64 * 60_000;
        let step_ms = 60_000 / args.per_window as i64;
        let published = Instant::now();
        let messages = (0..args.windows * args.per_window).flat_map(|i| {
            (0..args.sensors).map(move |s| {
                let v = json!({ "ts": first + i as i64 * step_ms, "temp": (i % 97) as f64 / 4.0 });
                (format!("r{s}"), v)
            })
        });
        rt.block_on(publish_acknowledged(
            svc.broker_port,
            "bench-replay",
            readings,
            messages,
        ))?;
        let published_s = published.elapsed().as_secs_f64();
        eprintln!("  {readings} acknowledged in {published_s:.1} s");
        if crash {
            signal("-KILL", &sink.pids()[0].to_string())?;
        }
        let started = Instant::now();
        signal("-CONT", &db_pid)?;
        if crash {
            // The same configuration and spool (a new metrics port).
            sink = start(&svc)?;
        }
        let port = sink.procs[0].1;
        let mut stored = 0;
        let mut first_stored_s = None;
        while started.elapsed() < Duration::from_secs(1200) {
            stored = rt.block_on(stored_in_db(&db))?;
            if stored > 0 && first_stored_s.is_none() {
                first_stored_s = Some(started.elapsed().as_secs_f64());
            }
            if stored >= readings as i64 {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let drained_s = started.elapsed().as_secs_f64();
        // Nothing stored twice, after a little more time to show it.
        std::thread::sleep(Duration::from_secs(3));
        let finally = rt.block_on(stored_in_db(&db))?;
        let row = json!({
            "variant": label,
            "readings": readings,
            "windows": windows,
            "published_s": published_s,
            "drained_s": drained_s,
            "drained_per_s": stored as f64 / drained_s,
            "first_stored_s": first_stored_s,
            "stored": finally,
            "duplicates": finally - readings as i64,
            "statements": counter_sum(port, palletd::telemetry::STATEMENTS),
            "flushes": counter_sum(port, palletd::telemetry::FLUSHES),
        });
        eprintln!("  {row}");
        rows.push(row);
        drop(sink);
    }
    let base = rows[0]["drained_per_s"].as_f64().unwrap_or(0.0);
    println!(
        "| variant | readings | windows | first stored after | drained in | readings/s | of no crash | stored twice |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} | {} s | {} s | {} | {:.0}% | {} |",
            r["variant"].as_str().unwrap_or(""),
            f("readings", 0),
            f("windows", 0),
            f("first_stored_s", 1),
            f("drained_s", 1),
            f("drained_per_s", 0),
            r["drained_per_s"].as_f64().unwrap_or(0.0) / base.max(1e-9) * 100.0,
            f("duplicates", 0),
        );
    }
    let out = json!({
        "scenario": "replay",
        "sensors": args.sensors,
        "windows_per_sensor": args.windows,
        "per_window": args.per_window,
        "variants": rows,
        "machine": machine(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("replay-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}

/// What the sealed buckets of bench.readings weigh.
#[derive(Debug, Default)]
struct SealedBytes {
    buckets: u64,
    readings: u64,
    /// BSON bytes of the whole documents.
    bytes: u64,
    /// Bytes of their `lsns` elements.
    lsns_bytes: u64,
    with_lsns: u64,
}

async fn sealed_bytes(uri: &str) -> anyhow::Result<SealedBytes> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::RawDocumentBuf>("readings");
    let mut cursor = coll.find(doc! { "closed": true }).await?;
    let mut out = SealedBytes::default();
    while let Some(d) = cursor.try_next().await? {
        out.buckets += 1;
        out.bytes += d.as_bytes().len() as u64;
        if let Ok(c) = d.get_i32("count") {
            out.readings += c.max(0) as u64;
        }
        if let Ok(l) = d.get_document("lsns") {
            out.with_lsns += 1;
            // The element: type, "lsns", NUL, the document.
            out.lsns_bytes += 1 + 5 + l.as_bytes().len() as u64;
        }
    }
    Ok(out)
}

/// Inserts `hours` sealed hourly buckets (one sample each) of each of the
/// simulator's first `sensors` sensors, before the current hour; returns
/// the seconds it took.
async fn prefill(uri: &str, sensors: usize, hours: usize) -> anyhow::Result<f64> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::Document>("readings");
    coll.create_indexes(palletd::store::buckets::indexes())
        .await?;
    let now = chrono::Utc::now().timestamp_millis() / 3_600_000 * 3_600_000;
    let started = Instant::now();
    let mut docs = Vec::with_capacity(10_000);
    for h in 1..=hours as i64 {
        let start = now - h * 3_600_000;
        let (t, end) = (
            bson::DateTime::from_millis(start),
            bson::DateTime::from_millis(start + 3_600_000),
        );
        for s in 0..sensors {
            let sensor = format!("s{s:05}");
            let edge = doc! { "t": t, "v": 21.5 };
            docs.push(doc! {
                "_id": palletd::bucket::bucket_id(&sensor, start, 0),
                "sensorId": &sensor, "startTs": t, "endTs": end, "closed": true, "closedAt": end,
                "count": 1, "size": 200, "minTs": t, "maxTs": t,
                "sum": { "temp": 21.5 }, "n": { "temp": 1 }, "min": { "temp": 21.5 }, "max": { "temp": 21.5 },
                "avg": { "temp": 21.5 }, "first": { "temp": edge.clone() }, "last": { "temp": edge },
                "samples": [ { "ts": t, "temp": 21.5 } ],
            });
            if docs.len() == 10_000 {
                coll.insert_many(std::mem::take(&mut docs))
                    .ordered(false)
                    .await?;
            }
        }
    }
    if !docs.is_empty() {
        coll.insert_many(docs).ordered(false).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

fn history(args: HistoryArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let tail = "[flush]\nmax_delay = \"200ms\"\n";
    let mut rows = Vec::new();
    for &sensors in &args.sensors {
        for stored_days in [0, args.days] {
            let label = if stored_days == 0 {
                "empty collection".to_string()
            } else {
                format!("{stored_days} days of hourly buckets stored")
            };
            eprintln!("== history, {sensors} sensors, {label}");
            let svc = Services::start(&args.run)?;
            let prefill_s = if stored_days > 0 {
                let s = rt.block_on(prefill(&svc.mongodb_uri(), sensors, stored_days * 24))?;
                eprintln!(
                    "  {} buckets stored in {s:.0} s",
                    sensors * stored_days * 24
                );
                rt.block_on(async {
                    mongodb::Client::with_uri_str(svc.mongodb_uri())
                        .await?
                        .database("admin")
                        .run_command(doc! { "fsync": 1 })
                        .await
                })?;
                std::thread::sleep(Duration::from_secs(args.settle));
                Some(s)
            } else {
                None
            };
            let sink = buckets_sink(&args.run, &svc, tail)?;
            let port = sink.procs[0].1;
            step(&args.run, &svc, &sink, sensors, args.rate, args.warmup)?;
            let before = counter_sum(port, palletd::telemetry::STATEMENTS);
            let m = step(&args.run, &svc, &sink, sensors, args.rate, args.secs)?;
            let statements = counter_sum(port, palletd::telemetry::STATEMENTS) - before;
            let row = json!({
                "sensors": sensors,
                "variant": label,
                "stored_buckets": sensors * stored_days * 24,
                "prefill_s": prefill_s,
                "offered_per_s": m.step.target_per_s,
                "durable_per_s": m.step.achieved_per_s,
                "statements_per_s": statements / m.step.seconds,
                "lag_p50_s": quantile(&m.before.live_age, &m.after.live_age, 0.5),
                "lag_p99_s": quantile(&m.before.live_age, &m.after.live_age, 0.99),
            });
            eprintln!("  {row}");
            rows.push(row);
            drop(sink);
        }
    }
    println!("| sensors | collection | offered/s | durable/s | statements/s | lag p50 | lag p99 |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} | {} | {} | {} s | {} s |",
            f("sensors", 0),
            r["variant"].as_str().unwrap_or(""),
            f("offered_per_s", 0),
            f("durable_per_s", 0),
            f("statements_per_s", 0),
            f("lag_p50_s", 2),
            f("lag_p99_s", 2),
        );
    }
    let out =
        json!({ "scenario": "history", "days": args.days, "rows": rows, "machine": machine() });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("history-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}

/// One look at palletd during a soak.
struct Mark {
    at: f64,
    scrape: Scrape,
    statements: f64,
    delay_s: f64,
    peak_rss_mb: f64,
    cpu: Duration,
    /// Windows looked up before a write, and the closer's time (seals).
    lookups: f64,
    sealing_s: f64,
}

fn soak(mut args: SoakArgs) -> anyhow::Result<()> {
    let ceiling = match args.of_ceiling {
        Some(fraction) => {
            let rt = tokio::runtime::Runtime::new()?;
            let c = scenario(&args.run, "ceiling", args.sensors, &rt)?.max_sustained_per_s;
            anyhow::ensure!(c > 0.0, "the ceiling subscriber sustained no step");
            args.rate = (c * fraction).round();
            eprintln!(
                "  ceiling {c:.0}/s; soaking at {fraction} of it: {:.0}/s",
                args.rate
            );
            Some(c)
        }
        None => None,
    };
    let limits = std::env::var("BENCH_PALLETD_LIMITS").unwrap_or_default();
    eprintln!(
        "== soak: {} sensors, {}/s ({} per sensor), {} s, palletd's defaults{}{}",
        args.sensors,
        args.rate,
        args.rate / args.sensors as f64,
        args.secs,
        if args.tail.is_empty() {
            ""
        } else {
            " and the tail given"
        },
        if limits.is_empty() {
            String::new()
        } else {
            format!(" but [limits] {limits}")
        }
    );
    let svc = Services::start(&args.run)?;
    let tail = args.tail.replace("\\n", "\n");
    let sink = buckets_sink(&args.run, &svc, &tail)?;
    let port = sink.procs[0].1;
    let started = Instant::now();
    let mark = |at: f64| -> anyhow::Result<Mark> {
        Ok(Mark {
            at,
            scrape: sink.scrape()?,
            statements: counter_sum(port, palletd::telemetry::STATEMENTS),
            delay_s: counter_sum(port, palletd::telemetry::FLUSH_DELAY_SECONDS),
            peak_rss_mb: sink.peak_rss() as f64 / 1e6,
            cpu: sink.cpu(),
            lookups: counter_sum(port, palletd::telemetry::FILL_LOOKUPS),
            sealing_s: histogram_sum(port, palletd::telemetry::CLOSER_SECONDS)?,
        })
    };
    let mut marks = vec![mark(0.0)?];
    let mut sim = simulator(&args.run, &svc, args.sensors, args.rate, args.secs)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let every = args.every.max(1) as f64;
    println!("| t (s) | durable/s | live lag p50 | p99 | flush delay | statements / reading | CPU µs / reading | peak RSS MB | fill lookups | sealing s |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let line = |a: &Mark, b: &Mark| {
        let stored = (b.scrape.stored - a.scrape.stored).max(0.0);
        let secs = (b.at - a.at).max(1e-3);
        json!({
            "from_s": a.at,
            "to_s": b.at,
            "durable_per_s": stored / secs,
            "lag_p50_s": quantile(&a.scrape.live_age, &b.scrape.live_age, 0.5),
            "lag_p99_s": quantile(&a.scrape.live_age, &b.scrape.live_age, 0.99),
            "flush_delay_s": b.delay_s,
            "statements_per_reading": (b.statements - a.statements) / stored.max(1.0),
            "cpu_us_per_reading": b.cpu.saturating_sub(a.cpu).as_secs_f64() * 1e6 / stored.max(1.0),
            "peak_rss_mb": b.peak_rss_mb,
            "fill_lookups": b.lookups - a.lookups,
            "sealing_s": b.sealing_s - a.sealing_s,
        })
    };
    let print = |r: &serde_json::Value| {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} s | {} s | {} s | {} | {} | {} | {} | {} |",
            f("to_s", 0),
            f("durable_per_s", 0),
            f("lag_p50_s", 2),
            f("lag_p99_s", 2),
            f("flush_delay_s", 1),
            f("statements_per_reading", 3),
            f("cpu_us_per_reading", 1),
            f("peak_rss_mb", 0),
            f("fill_lookups", 0),
            f("sealing_s", 1),
        );
    };
    let mut intervals = Vec::new();
    let status = loop {
        let next = marks.last().map_or(0.0, |m| m.at) + every;
        while started.elapsed().as_secs_f64() < next {
            if sim.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let m = mark(started.elapsed().as_secs_f64())?;
        let r = line(marks.last().expect("a first mark"), &m);
        print(&r);
        intervals.push(r);
        marks.push(m);
        if let Some(status) = sim.try_wait()? {
            break status;
        }
    };
    let mut report = String::new();
    if let Some(mut out) = sim.stdout.take() {
        let _ = out.read_to_string(&mut report);
    }
    let (published, sim_lag) = parse_report(&report).unwrap_or((0, f64::NAN));
    // Everything published stored: up to the longest delay and then some.
    let end = Instant::now();
    let mut drained = None;
    while end.elapsed() < Duration::from_secs(600) {
        let stored = sink.scrape()?.stored - marks[0].scrape.stored;
        if stored >= published as f64 {
            drained = Some(end.elapsed().as_secs_f64());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let last = mark(started.elapsed().as_secs_f64())?;
    let stored = last.scrape.stored - marks[0].scrape.stored;
    // The halves of the publishing time.
    let mid = marks
        .iter()
        .min_by(|a, b| {
            let h = args.secs as f64 / 2.0;
            (a.at - h).abs().total_cmp(&(b.at - h).abs())
        })
        .expect("marks");
    let end_mark = marks.last().expect("marks");
    let halves = [line(&marks[0], mid), line(mid, end_mark)];
    eprintln!(
        "  published {published} (simulator behind by at most {sim_lag:.1} s), stored {stored:.0}, drained {} s after the last publish",
        fmt(drained, 1)
    );
    for (name, h) in ["first half", "second half"].iter().zip(&halves) {
        eprintln!("  {name}: {h}");
    }
    let out = json!({
        "scenario": "soak",
        "sensors": args.sensors,
        "rate": args.rate,
        "ceiling_per_s": ceiling,
        "limits": limits,
        "of_ceiling": args.of_ceiling,
        "secs": args.secs,
        "tail": tail,
        "published": published,
        "stored": stored,
        "drained_after_s": drained,
        "simulator_behind_s": sim_lag,
        "intervals": intervals,
        "halves": halves,
        "peak_rss_mb": last.peak_rss_mb,
        "simulator_ok": status.success(),
        "machine": machine(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("soak-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}

/// See [`Cli::Thinning`].
fn thinning_table(args: ThinningArgs) -> anyhow::Result<()> {
    use palletd::thin::{errors, thin_series, Point, Rule};
    let dir = args.data.unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/palletd-test/data")
    });
    let csv = |name: &str| -> anyhow::Result<Vec<Vec<f64>>> {
        let text = std::fs::read_to_string(dir.join(name))
            .map_err(|e| anyhow::anyhow!("{name}: {e} (run scripts/install-test-services)"))?;
        Ok(text
            .lines()
            .skip(1)
            .map(|l| {
                l.split(',')
                    .filter_map(|c| c.trim_matches('"').parse().ok())
                    .collect()
            })
            .collect())
    };
    let at = |step_ms: i64, values: Vec<f64>| -> Vec<Point> {
        let t = |i: usize| 1_700_000_000_000 + i as i64 * step_ms;
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| Point { t: t(i), v })
            .collect()
    };
    let week = 7 * 86_400_000;
    let mut series: Vec<(String, Vec<Point>)> = vec![
        (
            "CO2 at Mauna Loa, weekly (ppm)".into(),
            at(
                week,
                csv("co2.csv")?
                    .iter()
                    .filter_map(|r| r.get(1).copied())
                    .collect(),
            ),
        ),
        (
            "El Nino sea temperature, monthly (C)".into(),
            at(
                week * 4,
                csv("elnino.csv")?
                    .iter()
                    .flat_map(|r| r.iter().skip(1).copied().collect::<Vec<_>>())
                    .collect(),
            ),
        ),
        (
            "Sunspots, yearly".into(),
            at(
                week * 52,
                csv("sunspots.csv")?
                    .iter()
                    .filter_map(|r| r.get(1).copied())
                    .collect(),
            ),
        ),
        (
            "Nile flow, yearly".into(),
            at(
                week * 52,
                csv("nile.csv")?
                    .iter()
                    .filter_map(|r| r.get(1).copied())
                    .collect(),
            ),
        ),
    ];
    for (i, field) in ["temp", "hum", "pres"].iter().enumerate() {
        let values = (0..8760)
            .map(|h| weather(0, h)[field].as_f64().unwrap_or(0.0))
            .collect();
        series.push((
            format!("bench hourly weather, a year ({field})"),
            at(3_600_000, values),
        ));
        let walk = palletd::simulate::walk_series(7, 86_400, 1_700_000_000_000, 1000);
        let values = walk.iter().map(|w| w.1[i]).collect();
        series.push((
            format!("simulator walk, a day at 1/s ({field})"),
            at(1000, values),
        ));
    }
    println!("| series | points | rule | bound (% of span) | stored | stored % | largest error, linear | largest error, held |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for (name, points) in &series {
        let lo = points.iter().map(|p| p.v).fold(f64::INFINITY, f64::min);
        let hi = points.iter().map(|p| p.v).fold(f64::NEG_INFINITY, f64::max);
        for pct in [0.5, 1.0, 2.0] {
            let bound = (hi - lo) * pct / 100.0;
            let rules = [
                Rule::SwingingDoor {
                    deviation: bound,
                    max_interval_ms: i64::MAX,
                },
                Rule::Deadband {
                    band: bound,
                    max_interval_ms: i64::MAX,
                    min_interval_ms: 0,
                },
            ];
            for rule in rules {
                let keep = thin_series(rule, points);
                let stored = keep.iter().filter(|k| **k).count();
                let (linear, held) = errors(points, &keep);
                println!(
                    "| {name} | {} | {} | {bound:.3} ({pct}%) | {stored} | {:.1}% | {linear:.3} | {held:.3} |",
                    points.len(),
                    rule.kind(),
                    100.0 * stored as f64 / points.len() as f64,
                );
            }
        }
    }
    thinning_state();
    Ok(())
}

/// What the admission's thinning state costs with many sensors: each of
/// 1,000 and 100,000 sensors sends 40 readings of the simulator's walk
/// 15 s apart (10 minutes: no run ends for silence) under
/// `buckets-thinned`'s rules, in each storage mode; per reading the time
/// of the decision, the verdicts' sample and what is spooled later, and
/// per sensor the state's bytes (as `palletd_memory_bytes{part="thinning"}`
/// counts them).
fn thinning_state() {
    use palletd::admission::thinning::Thinning;
    use palletd::bucket::Sample;
    use palletd::decode::{FieldValue, Reading};
    use palletd::thin::Rule;
    let door = |deviation| Rule::SwingingDoor {
        deviation,
        max_interval_ms: 600_000,
    };
    let rules = vec![
        ("temp".to_string(), door(0.25)),
        (
            "humidity".to_string(),
            Rule::Deadband {
                band: 0.65,
                max_interval_ms: 600_000,
                min_interval_ms: 0,
            },
        ),
        ("pressure".to_string(), door(0.5)),
    ];
    const PER_SENSOR: usize = 40;
    println!();
    println!("| sensors | mode | ns / reading | records spooled later / reading | state bytes / sensor |");
    println!("|---:|---|---:|---:|---:|");
    for sensors in [1_000usize, 100_000] {
        for (mode, window) in [("buckets", None), ("timeseries", Some(3_600_000))] {
            let walks: Vec<Vec<(i64, [f64; 3])>> = (0..sensors)
                .map(|i| {
                    palletd::simulate::walk_series(i as u64, PER_SENSOR, 1_700_000_000_000, 15_000)
                })
                .collect();
            let mut th = Thinning::new(window, usize::MAX);
            let mut later = 0usize;
            let mut lsn = 0u64;
            let mut reading = Reading::default();
            let started = Instant::now();
            for k in 0..PER_SENSOR {
                for (i, walk) in walks.iter().enumerate() {
                    let (ts, v) = walk[k];
                    reading.sensor.clear();
                    reading.sensor.push_str(&format!("s{i}"));
                    reading.ts_ms = ts;
                    reading.fields = ["temp", "humidity", "pressure"]
                        .iter()
                        .zip(v)
                        .map(|(n, x)| (n.to_string(), FieldValue::Num(x)))
                        .collect();
                    let (thinned, l) = th.thin(&rules, &reading, ts, lsn);
                    for s in l.samples(lsn) {
                        std::hint::black_box(s);
                    }
                    later += l.len();
                    lsn += l.len() as u64;
                    std::hint::black_box(Sample::encode_thinned(&reading, lsn, &thinned));
                    lsn += 1;
                }
            }
            let ns = started.elapsed().as_nanos() as f64 / (sensors * PER_SENSOR) as f64;
            println!(
                "| {sensors} | {mode} | {ns:.0} | {:.3} | {} |",
                later as f64 / (sensors * PER_SENSOR) as f64,
                th.bytes() / sensors,
            );
        }
    }
}
