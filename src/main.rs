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
    version,
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
    /// Print the annotated example configuration.
    PrintConfig,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.as_ref().unwrap_or(&Command::Run) {
        Command::PrintConfig => {
            print!("{}", palletd::config::EXAMPLE);
            ExitCode::SUCCESS
        }
        Command::CheckConfig => match load(&cli) {
            Ok(settings) => {
                println!(
                    "configuration is valid: {} subscription(s), bucket window {}, up to {} samples / {} bytes",
                    settings.subscriptions.len(),
                    humantime::format_duration(settings.bucket.window),
                    settings.bucket.max_samples,
                    settings.bucket.max_bytes
                );
                ExitCode::SUCCESS
            }
            Err(code) => code,
        },
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
                        Some(palletd::RunError::Config(_)) => ExitCode::from(EXIT_CONFIG),
                        _ => ExitCode::FAILURE,
                    }
                }
            }
        }
    }
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
