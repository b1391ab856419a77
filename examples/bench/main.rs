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
//!
//! One module per scenario (`wan.rs`, `replay.rs`, ...), and the parts
//! the `run` scenarios share (`services`, `sinks`, `readings`, `steps`,
//! `scenarios`); each takes this file's imports and the others' items
//! through `use crate::*`.

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

mod backfill;
mod closer;
mod density;
mod history;
mod hostile;
mod live_rollups;
mod query_rss;
mod readings;
mod replay;
mod scenarios;
mod series;
mod services;
mod sinks;
mod soak;
mod sparkplug;
mod steps;
mod thinning;
mod wan;
mod windows;
mod wire;

use backfill::*;
use closer::*;
use density::*;
use history::*;
use hostile::*;
use live_rollups::*;
use query_rss::*;
use readings::*;
use replay::*;
use scenarios::*;
use series::*;
use services::*;
use sinks::*;
use soak::*;
use sparkplug::*;
use steps::*;
use thinning::*;
use wan::*;
use windows::*;
use wire::*;

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
