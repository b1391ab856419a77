//! palletd as a child process: start, kill, stop, and what it serves
//! (`/readyz`, `/metrics`, its log); `palletd query` beside it.

use super::*;

/// palletd running as a child process.
pub struct Palletd {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub http_port: u16,
    log: PathBuf,
    /// `/metrics` asks for credentials (what palletd knows of the broker
    /// cannot be read there; the refusals would be counted).
    guarded: bool,
}

/// How to start palletd besides its config.
#[derive(Default)]
pub struct Run<'a> {
    pub args: &'a [&'a str],
    /// `RUST_LOG` (default `palletd=debug,info`).
    pub log: Option<&'a str>,
    pub env: &'a [(&'a str, &'a str)],
    /// A command palletd runs under (e.g. `fiu-run -x -f FIFO`).
    pub under: &'a [&'a str],
}

impl Palletd {
    pub fn start(config: &Config) -> Palletd {
        Self::start_with(config, Run::default())
    }

    pub fn start_with(config: &Config, run: Run) -> Palletd {
        let dir = tempfile::tempdir().unwrap();
        let conf = config.write_to(dir.path(), "palletd.toml");
        let log = dir.path().join("palletd.log");
        let mut command = match run.under.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(env!("CARGO_BIN_EXE_palletd"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_palletd")),
        };
        let child = command
            .arg("run")
            .arg("--config")
            .arg(&conf)
            .args(run.args)
            .env("RUST_LOG", run.log.unwrap_or("palletd=debug,info"))
            .envs(run.env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start palletd under {:?}: {e}; {INSTALL_HINT}",
                    run.under
                )
            });
        let http = config.toml();
        Palletd {
            child,
            dir,
            http_port: config.http_port,
            log,
            guarded: ["username", "token", "token_file"].iter().any(|k| {
                http.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{k} ")))
            }),
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        kill_and_wait(&mut self.child, "-KILL");
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "palletd did not exit after SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Still running?
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `/readyz`: (status, body).
    pub fn readyz(&self) -> (u16, String) {
        http_get(self.http_port, "/readyz")
    }

    /// Polls `/readyz` until palletd is ready: connected and subscribed to
    /// the broker, the database answering; and it knows how the broker
    /// numbers its resends (asked once per spool, beside the sessions: a
    /// test that cuts the link at once would cut the asking).
    /// On a timeout it says what `/readyz` and the broker connections said
    /// last.
    pub async fn ready(&self) {
        poll_until(
            Duration::from_secs(30),
            || async { self.readyz().0 == 200 && self.numbering_known() },
            || {
                format!(
                    "palletd to be ready; /readyz: {:?}, connections up: {}, subscribed filters logged: {}\n{}",
                    self.readyz(),
                    self.metric("palletd_broker_connections_up", None),
                    self.log().matches("Subscribed.").count(),
                    self.log()
                )
            },
        )
        .await;
    }

    /// Polls `/readyz` until the broker acknowledged the subscriptions,
    /// whatever the database does.
    pub async fn subscribed(&self) {
        self.wait_until(Duration::from_secs(30), "subscribed (/readyz)", |p| {
            let (status, why) = p.readyz();
            (status == 200 || why.contains("database") || why.contains("flush"))
                && p.numbering_known()
        })
        .await;
    }

    /// palletd knows how the broker numbers its resends (asked it, or read
    /// it in its spool's `mqtt-broker`). Metrics behind credentials
    /// cannot tell: taken as known.
    pub fn numbering_known(&self) -> bool {
        if self.guarded {
            return true;
        }
        self.metric(
            "palletd_mqtt_broker_resends",
            Some(("numbering", "unknown")),
        ) == 0.0
            && (self.metric("palletd_mqtt_broker_resends", Some(("numbering", "kept")))
                + self.metric(
                    "palletd_mqtt_broker_resends",
                    Some(("numbering", "renumbered")),
                ))
                == 1.0
    }

    /// The metrics palletd serves (none while the endpoint is not up).
    pub fn scrape(&self) -> prometheus_parse::Scrape {
        let (status, body) = http_get(self.http_port, "/metrics");
        let lines = body.lines().map(|l| Ok(l.to_string()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("/metrics is Prometheus text");
        assert!(status == 200 || scrape.samples.is_empty());
        scrape
    }

    /// The sum of a metric's samples (those with `label`, if given).
    pub fn metric(&self, name: &str, label: Option<(&str, &str)>) -> f64 {
        metric(&self.scrape(), name, label)
    }

    /// Polls until `f(self)` holds, or panics with `what` and the log.
    pub async fn wait_until(&self, within: Duration, what: &str, f: impl Fn(&Palletd) -> bool) {
        poll_until(
            within,
            || async { f(self) },
            || format!("palletd to be {what}:\n{}", self.log()),
        )
        .await;
    }

    /// Polls until exactly `n` MQTT connections are up.
    pub async fn connections_up(&self, n: f64) {
        self.wait_until(Duration::from_secs(30), "every connection up", |p| {
            p.metric("palletd_broker_connections_up", None) == n
        })
        .await;
    }

    /// Polls until nothing is left to write: no sample pending in memory,
    /// no reading in the backlog on disk.
    pub async fn nothing_left_to_write(&self) {
        self.wait_until(Duration::from_secs(30), "nothing left to write", |p| {
            p.metric("palletd_pending_samples", None) == 0.0
                && p.metric("palletd_backlog_readings", None) == 0.0
        })
        .await;
    }

    /// Polls until a metric reaches `at_least`.
    pub async fn wait_metric(&self, name: &str, at_least: f64) {
        self.wait_until(
            Duration::from_secs(60),
            &format!("at {name} >= {at_least}"),
            |p| p.metric(name, None) >= at_least,
        )
        .await;
    }

    /// Polls until the log contains `needle` (for tests of what palletd
    /// says; wait for observable state with the other waits).
    pub async fn wait_for_log(&self, needle: &str, within: Duration) {
        poll_until(
            within,
            || async { self.log().contains(needle) },
            || format!("palletd to log {needle:?}:\n{}", self.log()),
        )
        .await;
    }

    /// Polls until palletd holds nothing it has not written: no sample in
    /// memory and every spooled record confirmed in MongoDB (no write is
    /// left that could still store a reading, or store it twice).
    pub async fn settled(&self) {
        self.wait_until(
            Duration::from_secs(60),
            "settled (nothing pending, nothing unconfirmed)",
            |p| {
                let scrape = p.scrape();
                metric(&scrape, "palletd_pending_samples", None) == 0.0
                    && metric(&scrape, "palletd_spool_unconfirmed_records", None) == 0.0
            },
        )
        .await;
    }
}

impl Drop for Palletd {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill_and_wait(&mut self.child, "-KILL");
        }
    }
}

/// The sum of a metric's samples in a scrape (those with `label`, if given).
pub fn metric(scrape: &prometheus_parse::Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// Runs `palletd query --config FILE ARGS`.
pub fn run_query(cfg_path: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_palletd"))
        .arg("query")
        .arg("--config")
        .arg(cfg_path)
        .args(args)
        .output()
        .unwrap()
}

/// `palletd query` that must succeed: its standard output.
pub fn query_ok(cfg_path: &Path, args: &[&str]) -> String {
    let out = run_query(cfg_path, args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
