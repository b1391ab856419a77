//! The `palletd` command line: parses flags, sets up logging, calls the
//! library and maps the result to an exit code (0 clean stop, 78 bad
//! configuration, 1 anything else).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

/// Exit code for a configuration error (sysexits EX_CONFIG).
const EXIT_CONFIG: u8 = 78;

#[derive(Parser, Debug)]
#[command(
    name = "palletd",
    version = palletd::VERSION,
    about = "MQTT-to-MongoDB gateway: sensor readings stored as bucket documents"
)]
struct Cli {
    /// Configuration file (TOML).
    #[arg(long, short = 'c', global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// How long shutdown may take to flush and acknowledge before giving up.
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "30s")]
    shutdown_timeout: Duration,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the gateway (the default).
    Run,
    /// Validate the configuration, print every problem, exit 78 if any.
    CheckConfig,
    /// Print the annotated example configuration (with a preset's
    /// subscriptions in place of its own: --preset tasmota).
    PrintConfig {
        /// tasmota, zigbee2mqtt, shelly, esphome, homie, homeassistant, senml,
        /// opcua or telegraf.
        #[arg(long, value_name = "NAME")]
        preset: Option<String>,
    },
    /// Decode one payload as the configuration (or a preset) would and
    /// print the samples it would store, the fields it would leave out and
    /// the dead letter it would write; exit 2 if anything of it would be
    /// refused. Nothing is stored.
    Try(TryArgs),
    /// Publish simulated sensor readings (a load generator).
    Simulate(SimulateArgs),
    /// Print stored readings or rollups of one sensor, or what is stored.
    Query(QueryArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), palletd.1.
    Manpage,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SimFormatArg {
    Json,
    #[value(name = "sparkplug_b")]
    SparkplugB,
}

#[derive(clap::Args, Debug)]
struct SimulateArgs {
    /// Broker URL; defaults to [mqtt] url of --config, else mqtt://127.0.0.1:1883.
    #[arg(long)]
    url: Option<String>,
    /// Number of sensors.
    #[arg(long, default_value_t = 20)]
    sensors: usize,
    /// Readings per second per sensor.
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// How long to publish.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    duration: Duration,
    /// Topic template with a {sensor} placeholder (format json).
    #[arg(long, default_value = "sensors/{sensor}/telemetry")]
    topic: String,
    /// What the sensors publish: JSON readings, or Sparkplug B edge nodes
    /// whose devices are the sensors (BIRTH, DATA by alias, DEATH as the
    /// last will, rebirth on request and after a reconnect).
    #[arg(long, value_enum, default_value_t = SimFormatArg::Json)]
    format: SimFormatArg,
    /// Sparkplug B: devices per edge node (one MQTT connection each).
    #[arg(long, default_value_t = 10)]
    devices_per_node: usize,
    /// Sparkplug B: the group id.
    #[arg(long, default_value = "plant")]
    group: String,
    /// QoS of the publishes (0 or 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    qos: u8,
    /// Share of sensors that send JSON arrays of several readings.
    #[arg(long, default_value_t = 0.1)]
    batch_share: f64,
    /// Readings per array for batching sensors.
    #[arg(long, default_value_t = 5)]
    batch_size: usize,
    /// Sensor ids are this prefix and a number.
    #[arg(long, default_value = "sim-")]
    sensor_prefix: String,
    /// Seed of the random walks.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(clap::Args, Debug)]
struct TryArgs {
    /// The topic the payload arrives on.
    #[arg(long)]
    topic: String,
    /// Use a preset's subscriptions (and the example's limits) instead of
    /// --config.
    #[arg(long, value_name = "NAME", conflicts_with = "config")]
    preset: Option<String>,
    /// As the broker sends a topic's retained value when palletd
    /// subscribes (the RETAIN flag set): skipped where the subscription
    /// says retained = "skip" (with "changed", the default, it is decoded
    /// as the first value of its topic: `try` keeps no history).
    #[arg(long)]
    retained: bool,
    /// The payload's file; standard input when absent or "-".
    file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct QueryArgs {
    /// The sensor whose readings (or --stats) to print.
    #[arg(long)]
    sensor: Option<String>,
    /// Start of the range: RFC 3339, or a duration meaning that long ago ("2h").
    #[arg(long)]
    from: Option<String>,
    /// End of the range (exclusive), same forms as --from.
    #[arg(long)]
    to: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = QueryFormat::Jsonl)]
    format: QueryFormat,
    /// Per-window rollups from the bucket fields, without reading samples.
    #[arg(long, conflicts_with_all = ["summary", "buckets"])]
    stats: bool,
    /// With --stats: the closer's rollups of this interval (a [[rollup]]
    /// interval, e.g. "1h" or "1d") instead of per-window ones.
    #[arg(long, value_name = "INTERVAL", requires = "stats")]
    rollup: Option<String>,
    /// Print how many buckets, samples, sensors and dead letters are stored.
    #[arg(long, conflicts_with = "buckets")]
    summary: bool,
    /// Print this many bucket documents (newest first, 3 samples each).
    #[arg(long, value_name = "N")]
    buckets: Option<i64>,
    /// Print each sensor's latest value (or --sensor's) from
    /// <collection>_latest, as JSON lines.
    #[arg(long, conflicts_with_all = ["summary", "buckets", "stats", "from", "to"])]
    latest: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum QueryFormat {
    Jsonl,
    Csv,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.as_ref().unwrap_or(&Command::Run) {
        Command::PrintConfig { preset: None } => {
            print!("{}", palletd::config::EXAMPLE);
            ExitCode::SUCCESS
        }
        Command::PrintConfig { preset: Some(name) } => {
            match palletd::config::presets::example_with(name) {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("palletd: --preset {e}");
                    ExitCode::from(EXIT_CONFIG)
                }
            }
        }
        Command::Try(args) => {
            let settings = match try_settings(&cli, args) {
                Ok(s) => s,
                Err(code) => return code,
            };
            try_payload(args, &settings)
        }
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut cmd, "palletd", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Manpage => {
            let cmd = <Cli as clap::CommandFactory>::command();
            match clap_mangen::Man::new(cmd).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::CheckConfig => match load(&cli) {
            Ok(settings) => {
                check_config(&settings);
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
        Command::Simulate(args) => {
            init_logging(cli.log_format);
            let settings = match &cli.config {
                Some(_) => match load(&cli) {
                    Ok(s) => Some(s),
                    Err(code) => return code,
                },
                None => None,
            };
            exit(simulate(args, settings.as_ref()))
        }
        Command::Query(args) => {
            init_logging(cli.log_format);
            let settings = match load(&cli) {
                Ok(s) => s,
                Err(code) => return code,
            };
            exit(query(args, &settings))
        }
        Command::Run => {
            init_logging(cli.log_format);
            let settings = match load(&cli) {
                Ok(s) => s,
                Err(code) => return code,
            };
            match run(settings, cli.shutdown_timeout) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("palletd: {e:#}");
                    match e.downcast_ref::<palletd::RunError>() {
                        Some(palletd::RunError::Config(_) | palletd::RunError::SpoolFormat(_)) => {
                            ExitCode::from(EXIT_CONFIG)
                        }
                        _ => ExitCode::FAILURE,
                    }
                }
            }
        }
    }
}

/// The settings `palletd try` decodes with: a preset's, or the
/// configuration file's.
fn try_settings(cli: &Cli, args: &TryArgs) -> Result<palletd::config::Settings, ExitCode> {
    match &args.preset {
        Some(name) => {
            let text = match palletd::config::presets::example_with(name) {
                Ok(text) => text,
                Err(e) => {
                    eprintln!("palletd: --preset {e}");
                    return Err(ExitCode::from(EXIT_CONFIG));
                }
            };
            match palletd::config::parse(&text, None) {
                Ok(s) => Ok(s),
                Err(errors) => {
                    eprintln!("palletd: the preset {name} does not parse: {errors:?}");
                    Err(ExitCode::FAILURE)
                }
            }
        }
        None => load(cli),
    }
}

/// `palletd check-config`: what the configuration amounts to.
fn check_config(settings: &palletd::config::Settings) {
    for w in &settings.warnings {
        println!("warning: {w}");
    }
    println!(
        "configuration is valid: {} subscription(s), bucket window {}, up to {} samples / {} bytes",
        settings.subscriptions.len(),
        humantime::format_duration(settings.bucket.window),
        settings.bucket.max_samples,
        settings.bucket.max_bytes
    );
    println!(
        "memory budget (limits.max_memory): {}{}",
        bytesize::ByteSize(settings.limits.max_memory).to_string_as(true),
        match settings.limits.max_memory_from {
            palletd::config::MemoryBudgetFrom::Set => "",
            palletd::config::MemoryBudgetFrom::Auto { .. } =>
                " (auto: an eighth of the memory palletd may use, 64-256 MiB)",
        }
    );
    // What each MQTT session subscribes (a Sparkplug B
    // subscription stays on the first).
    let sessions =
        palletd::plan_sessions(&settings.mqtt, &settings.subscriptions, &Default::default());
    println!(
        "MQTT: {} connection(s) (mqtt.connections = {})",
        sessions.len(),
        settings.mqtt.connections
    );
    for s in &sessions {
        let filters: Vec<&str> = s.subscribe.iter().map(|f| f.0.as_str()).collect();
        println!("  {}: {}", s.client_id, filters.join(", "));
    }
}

/// `palletd try`: what one payload decodes to, one line per sample (JSON),
/// field left out and refusal.
fn try_payload(args: &TryArgs, settings: &palletd::config::Settings) -> ExitCode {
    use std::io::Read;
    let mut payload = Vec::new();
    let read = match args.file.as_deref() {
        None => std::io::stdin().read_to_end(&mut payload),
        Some(p) if p.as_os_str() == "-" => std::io::stdin().read_to_end(&mut payload),
        Some(p) => std::fs::File::open(p).and_then(|mut f| f.read_to_end(&mut payload)),
    };
    if let Err(e) = read {
        eprintln!("palletd: cannot read the payload: {e}");
        return ExitCode::FAILURE;
    }
    let mut decoder =
        palletd::decode::Decoder::new(settings.subscriptions.clone(), settings.decode_limits());
    let now = palletd::clock::now_ms();
    let skip = decoder.retained_rule(&args.topic) == palletd::decode::Retained::Skip;
    let out = if args.retained && skip {
        palletd::decode::Decoded::skipped(palletd::decode::SKIPPED_RETAINED)
    } else {
        decoder.decode(&args.topic, &payload, now)
    };
    if let Some(reason) = out.skipped {
        println!("skipped ({reason}): nothing stored, nothing refused");
    }
    for r in &out.readings {
        println!("{}", palletd::decode::reading_json(r));
    }
    for d in &out.dropped {
        println!("left out ({}): sample {}: {}", d.cause, d.index, d.message);
    }
    for e in &out.errors {
        println!("dead letter ({}): {e}", e.cause());
    }
    if out.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("palletd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(
    args: &SimulateArgs,
    settings: Option<&palletd::config::Settings>,
) -> anyhow::Result<()> {
    anyhow::ensure!(args.sensors > 0, "--sensors must be at least 1");
    anyhow::ensure!(args.rate > 0.0, "--rate must be positive");
    let format = match args.format {
        SimFormatArg::Json => palletd::simulate::SimFormat::Json,
        SimFormatArg::SparkplugB => palletd::simulate::SimFormat::SparkplugB,
    };
    anyhow::ensure!(
        format != palletd::simulate::SimFormat::Json || args.topic.contains("{sensor}"),
        "--topic needs a {{sensor}} placeholder"
    );
    anyhow::ensure!(
        args.devices_per_node > 0,
        "--devices-per-node must be at least 1"
    );
    // The daemon's broker, credentials and TLS, under a client id of its own.
    let (mut mqtt, client_id) = match settings {
        Some(s) => (
            s.mqtt.clone(),
            format!("{}-sim-{}", s.mqtt.client_id, std::process::id()),
        ),
        None => {
            let example = palletd::config::parse(palletd::config::EXAMPLE, None)
                .map_err(|_| anyhow::anyhow!("the built-in example config is invalid"))?;
            (example.mqtt, format!("palletd-sim-{}", std::process::id()))
        }
    };
    if let Some(url) = &args.url {
        let (host, port, tls) = palletd::config::parse_mqtt_url(url).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            !tls || mqtt.tls.is_some(),
            "an mqtts:// --url needs --config with [mqtt.tls]"
        );
        mqtt.host = host;
        mqtt.port = port;
    }
    let opts = palletd::simulate::SimOptions {
        format,
        devices_per_node: args.devices_per_node,
        group: args.group.clone(),
        mqtt,
        client_id,
        sensors: args.sensors,
        rate: args.rate,
        duration: args.duration,
        topic: args.topic.clone(),
        qos: if args.qos == 0 {
            rumqttc::QoS::AtMostOnce
        } else {
            rumqttc::QoS::AtLeastOnce
        },
        batch_share: args.batch_share,
        batch_size: args.batch_size,
        sensor_prefix: args.sensor_prefix.clone(),
        seed: args.seed,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let target = args.sensors as f64 * args.rate;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let report = runtime.block_on(async {
        let stop = CancellationToken::new();
        palletd::shutdown::stop_on_signal(stop.clone()).await?;
        anyhow::Ok(palletd::simulate::run(opts, stop).await?)
    })?;
    println!(
        "published {} readings in {} messages over {:.1}s: {:.1} readings/s (target {:.1}); max lag behind schedule {:.3}s; {} not acknowledged by the broker",
        report.readings,
        report.messages,
        report.elapsed.as_secs_f64(),
        report.rate(),
        target,
        report.max_lag.as_secs_f64(),
        report.unacknowledged
    );
    if report.skipped > 0 {
        println!(
            "{} readings skipped while their Sparkplug edge node was not connected and born",
            report.skipped
        );
    }
    Ok(())
}

fn query(args: &QueryArgs, settings: &palletd::config::Settings) -> anyhow::Result<()> {
    use palletd::query::{self, Format, Range};
    let now = palletd::clock::now_ms();
    let time = |t: &Option<String>| {
        t.as_deref()
            .map(|t| query::parse_time(t, now))
            .transpose()
            .map_err(anyhow::Error::msg)
    };
    let range = Range {
        from: time(&args.from)?,
        to: time(&args.to)?,
    };
    let format = match args.format {
        QueryFormat::Jsonl => Format::Jsonl,
        QueryFormat::Csv => Format::Csv,
    };
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let client = palletd::mongo_client(settings).await?;
        let store = palletd::Store::new(settings, client.database(&settings.mongodb.database));
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        if args.summary {
            query::print_summary(&store.summary().await?, &mut out)?;
        } else if args.latest {
            if matches!(args.format, QueryFormat::Csv) {
                anyhow::bail!("--latest prints JSON lines only");
            }
            query::print_latest(&store, args.sensor.as_deref(), &mut out).await?;
        } else if let Some(n) = args.buckets {
            store.print_raw(args.sensor.as_deref(), n, &mut out).await?;
        } else {
            let sensor = args
                .sensor
                .as_deref()
                .context("--sensor ID is needed (or --summary, or --buckets N)")?;
            if let Some(interval) = &args.rollup {
                let spec = (settings.rollups.iter())
                    .find(|r| {
                        r.name == *interval
                            || humantime::parse_duration(interval).ok() == Some(r.interval)
                    })
                    .with_context(|| {
                        let names: Vec<&str> =
                            settings.rollups.iter().map(|r| r.name.as_str()).collect();
                        format!("no [[rollup]] of {interval} is configured (configured: {names:?})")
                    })?;
                let rows = store.rollups(&spec.name, sensor, range).await?;
                query::print_rollups(sensor, &rows, format, &mut out)?;
            } else if args.stats {
                let stats = store.window_stats(sensor, range).await?;
                query::print_stats(sensor, &stats, format, &mut out)?;
            } else {
                query::print_readings(&store, sensor, range, format, &mut out).await?;
            }
        }
        std::io::Write::flush(&mut out)?;
        drop(store);
        // (See palletd::run: a client dropped with the runtime can panic.)
        client.shutdown().immediate(true).await;
        anyhow::Ok(())
    })
}

fn load(cli: &Cli) -> Result<palletd::config::Settings, ExitCode> {
    let Some(path) = &cli.config else {
        eprintln!("palletd: --config FILE is required (see `palletd print-config` for an example)");
        return Err(ExitCode::from(EXIT_CONFIG));
    };
    palletd::config::load(path).map_err(|e| {
        eprint!("{e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

fn run(settings: palletd::config::Settings, shutdown_timeout: Duration) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let stop = CancellationToken::new();
        palletd::shutdown::stop_on_signal(stop.clone())
            .await
            .context("cannot install signal handlers")?;
        palletd::run(settings, stop, shutdown_timeout).await?;
        Ok(())
    })
}

/// Text logs to stderr; under systemd (journald sets JOURNAL_STREAM) without
/// colours or timestamps, which the journal adds itself.
fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text if std::env::var_os("JOURNAL_STREAM").is_some() => {
            builder.with_ansi(false).without_time().init()
        }
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}
