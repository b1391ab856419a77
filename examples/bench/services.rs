//! The services of a benchmark: Mosquitto, SecantusDB and a sink (palletd or another), on free ports.

use crate::*;
use palletd::testkit::{free_port, Broker, Database};

/// A child process killed when dropped.
pub(crate) struct Proc(pub(crate) Child);

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
pub(crate) fn wait_for_line(child: &mut Child, needle: &str, log: PathBuf) -> anyhow::Result<()> {
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

/// The broker and the database of a run (the test kit's, as the tests
/// run them), and a directory for the sinks' spools and logs.
pub(crate) struct Services {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) broker_port: u16,
    pub(crate) db_port: u16,
    pub(crate) _broker: Broker,
    pub(crate) db: Database,
}

impl Services {
    pub(crate) fn start(args: &RunArgs) -> anyhow::Result<Services> {
        // BENCH_KEEP: keep the sinks' directory (logs, spool).
        let keep = std::env::var_os("BENCH_KEEP").is_some();
        let dir = tempfile::Builder::new().disable_cleanup(keep).tempdir()?;
        if keep {
            eprintln!("keeping {}", dir.path().display());
        }
        // Same broker settings for every scenario (every sink's in-flight
        // window matches the broker's).
        let broker = Broker::start_with(&format!(
            "max_inflight_messages {}\nmax_queued_messages {}\n",
            args.inflight, args.queued
        ));
        let db = Database::start();
        Ok(Services {
            dir,
            broker_port: broker.port,
            db_port: db.port,
            _broker: broker,
            db,
        })
    }

    pub(crate) fn mongodb_uri(&self) -> String {
        self.db.uri()
    }

    /// The database server's process id.
    pub(crate) fn db_pid(&self) -> String {
        self.db.pid().expect("the database runs").to_string()
    }
}

/// The process under test, with its metrics endpoint.
/// A sink: one process, or several palletd instances sharing the load
/// (`buckets-x2`: two, on one `$share/bench/...` subscription); its
/// figures are their sums.
pub(crate) struct Sink {
    /// Each process and its metrics port.
    pub(crate) procs: Vec<(Proc, u16)>,
    /// Fed Sparkplug B edge nodes instead of JSON sensors.
    pub(crate) sparkplug: bool,
}

pub(crate) fn start_sink(args: &RunArgs, kind: &str, svc: &Services) -> anyhow::Result<Sink> {
    start_sink_with(args, kind, svc, &svc.mongodb_uri(), "", "", "")
}

/// One palletd in buckets mode with `tail` (more TOML) at the end of its
/// configuration.
pub(crate) fn buckets_sink(args: &RunArgs, svc: &Services, tail: &str) -> anyhow::Result<Sink> {
    start_sink_with(args, "buckets", svc, &svc.mongodb_uri(), "", "", tail)
}

/// `buckets-thinned`'s subscription: the simulator's three fields
/// thinned (about 1% of a day's span of its walk; `bench thinning`).
pub(crate) const THINNED_SUBSCRIPTION: &str = r#"[[subscription]]
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
pub(crate) fn palletd_kind(kind: &str) -> Option<(&str, usize)> {
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
pub(crate) fn connections_of(kind: &str) -> Option<usize> {
    kind.rsplit_once("-c")?.1.parse().ok()
}

/// [`start_sink`] with palletd's database at `uri` and more settings in
/// its `[mongodb]` and `[spool]` tables (TOML lines).
pub(crate) fn start_sink_with(
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
