//! Test harness: a real Mosquitto and a real SecantusDB server per test, on
//! free ports with their own temporary directories, palletd as a child
//! process configured with a typed [`Config`] builder, and helpers that
//! wait for what can be observed (`/readyz`, `/metrics`, stored documents,
//! the broker's `$SYS` counters) and read the stored buckets back.
//!
//! [`Stack::start`] brings broker, database and palletd up together.
//! A missing service binary fails the test with the command that installs it
//! (`scripts/install-test-services` does both).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use futures_util::TryStreamExt;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};

pub const INSTALL_HINT: &str = "run `scripts/install-test-services` (installs Mosquitto, libfiu's fiu-utils, Chromium, promtool and lintian from Debian and SecantusDB from crates.io)";

pub const HOUR_MS: i64 = 3_600_000;

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free local port")
}

pub fn find_binary(env: &str, names: &[&str], extra: &[PathBuf]) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(extra.iter().cloned());
    for d in &dirs {
        for n in names {
            let p = d.join(n);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!("{} not found (set {env} or {INSTALL_HINT})", names[0]);
}

fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start listening on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_and_wait(child: &mut Child, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status();
    let _ = child.wait();
}

// ------------------------------------------------------------- services

/// A Mosquitto broker on a free port.
pub struct Broker {
    pub port: u16,
    /// Also holds the spools of the palletd runs of a test, so that they
    /// survive a palletd restart within the test.
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    config: String,
}

impl Broker {
    /// A broker with persistence, a 1 s $SYS interval and room for many
    /// queued and in-flight messages per client.
    pub fn start() -> Broker {
        Self::start_with("max_inflight_messages 100\nmax_queued_messages 100000\n")
    }

    pub fn start_with(extra: &str) -> Broker {
        let dir = tempfile::tempdir().unwrap();
        // Started as root, Mosquitto drops to its own user: it must be able
        // to write its persistence file here, or it forgets every session.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let port = free_port();
        let config = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\nsys_interval 1\n{extra}",
            dir.path().display()
        );
        let mut b = Broker {
            port,
            dir,
            child: None,
            config,
        };
        b.spawn();
        b
    }

    fn spawn(&mut self) {
        let bin = find_binary(
            "PALLETD_MOSQUITTO",
            &["mosquitto"],
            &[PathBuf::from("/usr/sbin")],
        );
        let conf = self.dir.path().join("mosquitto.conf");
        std::fs::write(&conf, &self.config).unwrap();
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start mosquitto: {e}; {INSTALL_HINT}"));
        self.child = Some(child);
        wait_for_port(self.port, "mosquitto");
    }

    /// Stops the broker (SIGTERM: it saves its persistent state).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_wait(&mut c, "-TERM");
        }
    }

    /// Starts it again on the same port with the same state.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// Messages Mosquitto holds beyond its retained ones (the $SYS topics
    /// are retained), read from $SYS: in flight to or queued for a client.
    pub async fn held_messages(&self) -> i64 {
        let mut opts = MqttOptions::new("sys-reader", "127.0.0.1", self.port);
        opts.set_keep_alive(Duration::from_secs(5));
        let (client, mut eventloop) = AsyncClient::new(opts, 10);
        for topic in [
            "$SYS/broker/store/messages/count",
            "$SYS/broker/retained messages/count",
        ] {
            client.subscribe(topic, QoS::AtMostOnce).await.unwrap();
        }
        let read = async {
            let (mut stored, mut retained) = (None, None);
            loop {
                if let Ok(Event::Incoming(Packet::Publish(p))) = eventloop.poll().await {
                    let n = String::from_utf8_lossy(&p.payload)
                        .trim()
                        .parse::<i64>()
                        .unwrap();
                    if p.topic.contains("store") {
                        stored = Some(n);
                    } else {
                        retained = Some(n);
                    }
                    if let (Some(s), Some(r)) = (stored, retained) {
                        return s - r;
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("no $SYS store counts from the broker")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_wait(&mut c, "-KILL");
        }
    }
}

/// A SecantusDB server (MongoDB wire protocol) on a free port.
pub struct Database {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    args: Vec<String>,
}

impl Database {
    pub fn start() -> Database {
        Self::start_with_args(&[])
    }

    /// A server with extra command-line flags (e.g. `--auth`).
    pub fn start_with_args(args: &[&str]) -> Database {
        let mut d = Database {
            port: 0,
            dir: tempfile::tempdir().unwrap(),
            child: None,
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        d.spawn();
        d
    }

    fn spawn(&mut self) {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let bin = find_binary(
            "PALLETD_SECANTUSD",
            &["secantusd-rs", "secantusd-py"],
            &[home.join(".cache/palletd-test/secantus/bin")],
        );
        let mut child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--storage-path")
            .arg(self.dir.path().join("data"))
            .args(["--cache-size", "256M", "--log-level", "WARNING"])
            .args(&self.args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start secantusd-rs: {e}; {INSTALL_HINT}"));
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let port = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(addr) = line.split("listening on ").nth(1) {
                        break addr
                            .rsplit(':')
                            .next()
                            .unwrap()
                            .trim()
                            .parse::<u16>()
                            .unwrap();
                    }
                }
                _ => panic!("secantusd-rs exited before listening"),
            }
        };
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        self.port = port;
        self.child = Some(child);
        wait_for_port(port, "secantusd-rs");
    }

    /// Stops the server (SIGTERM, waits for it to exit).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_wait(&mut c, "-TERM");
        }
    }

    /// Starts it again on the same port with the same data.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none());
        self.spawn();
    }

    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }

    pub async fn client(&self) -> mongodb::Client {
        let mut opts = mongodb::options::ClientOptions::parse(self.uri())
            .await
            .unwrap();
        opts.server_selection_timeout = Some(Duration::from_secs(5));
        mongodb::Client::with_options(opts).unwrap()
    }

    /// Makes the TTL monitor run every second (MongoDB's
    /// `ttlMonitorSleepSecs`; 60 by default) and returns how many passes
    /// it has made so far.
    pub async fn fast_ttl_monitor(&self) -> i64 {
        let client = self.client().await;
        let admin = client.database("admin");
        admin
            .run_command(doc! { "setParameter": 1, "ttlMonitorSleepSecs": 1 })
            .await
            .expect("setParameter ttlMonitorSleepSecs");
        let passes = self.ttl_passes().await;
        admin
            .run_command(doc! { "setParameter": 1, "ttlMonitorEnabled": true })
            .await
            .expect("setParameter ttlMonitorEnabled");
        passes
    }

    /// Stops the TTL monitor until [`Database::fast_ttl_monitor`].
    pub async fn pause_ttl_monitor(&self) {
        self.client()
            .await
            .database("admin")
            .run_command(doc! { "setParameter": 1, "ttlMonitorEnabled": false })
            .await
            .expect("setParameter ttlMonitorEnabled");
    }

    /// A number of `serverStatus`, by its path (absent: `None`).
    async fn server_status(&self, path: &[&str]) -> Option<i64> {
        let status = self
            .client()
            .await
            .database("admin")
            .run_command(doc! { "serverStatus": 1 })
            .await
            .unwrap();
        let (last, parents) = path.split_last()?;
        let mut d = &status;
        for p in parents {
            d = d.get_document(p).ok()?;
        }
        let n = d.get(last)?;
        n.as_i64().or(n.as_i32().map(i64::from))
    }

    /// Queries the server has answered so far
    /// (`serverStatus.opcounters.query`: `find` commands, of every client).
    pub async fn queries(&self) -> i64 {
        self.server_status(&["opcounters", "query"])
            .await
            .expect("serverStatus.opcounters.query")
    }

    /// Passes of the TTL monitor so far (`serverStatus.metrics.ttl.passes`).
    pub async fn ttl_passes(&self) -> i64 {
        (self.server_status(&["metrics", "ttl", "passes"]).await).unwrap_or(0)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_wait(&mut c, "-KILL");
        }
    }
}

// --------------------------------------------------------------- config

/// A palletd configuration, built up typed and written out as TOML.
///
/// The defaults: the given broker and database, database `name`, client id
/// `palletd-<name>`, a 5 s keep-alive, 100 messages in flight, readings
/// written within 1 s (`flush.max_delay`, 10 s by default in palletd), the
/// HTTP endpoint on a free port, the spool in the broker's directory (so it
/// survives a palletd restart within a test), and two subscriptions:
/// `sensors/{sensor}/telemetry` (JSON) and `plant/{sensor}/{field}` (numbers).
#[derive(Clone)]
pub struct Config {
    table: toml::Table,
    pub http_port: u16,
    pub name: String,
}

impl Config {
    pub fn new(broker: &Broker, db: &Database, name: &str) -> Config {
        Self::new_with(&broker.url(), broker.dir.path(), db, name)
    }

    fn new_with(url: &str, dir: &Path, db: &Database, name: &str) -> Config {
        let client_id = format!("palletd-{name}");
        let http_port = free_port();
        let spool = dir.join(format!("spool-{client_id}"));
        let text = format!(
            r#"
[mqtt]
url = "{url}"
client_id = "{client_id}"
keep_alive = "5s"
max_inflight = 100

[mongodb]
uri = "{uri}"
database = "{name}"
# Short (the default is 10s): a restart after a kill waits this long plus
# 1 s before reading what the killed run's last write applied.
write_time_limit = "2s"

[flush]
max_delay = "1s"

[http]
listen = "127.0.0.1:{http_port}"

[spool]
dir = "{spool}"

[[subscription]]
topic = "sensors/{{sensor}}/telemetry"

[[subscription]]
topic = "plant/{{sensor}}/{{field}}"
format = "number"
"#,
            uri = db.uri(),
            spool = spool.display(),
        );
        Config {
            table: toml::from_str(&text).unwrap(),
            http_port,
            name: name.to_string(),
        }
    }

    /// A configuration for in-process use of the library against `db` (no
    /// broker; its URL points nowhere).
    pub fn offline(db: &Database, name: &str) -> Config {
        let mut c = Config::new_with("mqtt://127.0.0.1:1", &std::env::temp_dir(), db, name);
        c.http_port = 0;
        c
    }

    /// The validated settings, as palletd would load them.
    pub fn settings(&self) -> palletd::config::Settings {
        palletd::config::parse(&self.toml(), None).expect("a valid config")
    }

    /// Sets `section.key` (or `section.sub.key`) to `value`.
    /// No wire compression (a proxy that reads the commands needs them in
    /// clear).
    pub fn uncompressed(self) -> Config {
        self.set("mongodb.compressors", toml::Value::Array(Vec::new()))
    }

    pub fn set(mut self, path: &str, value: impl Into<toml::Value>) -> Config {
        let mut keys: Vec<&str> = path.split('.').collect();
        let last = keys.pop().expect("a key");
        let mut table = &mut self.table;
        for k in keys {
            table = table
                .entry(k)
                .or_insert_with(|| toml::Value::Table(Default::default()))
                .as_table_mut()
                .expect("a table");
        }
        table.insert(last.to_string(), value.into());
        self
    }

    /// Another instance of this configuration: its own client id, spool
    /// (in `dir`) and HTTP port; the same broker, database and share group.
    pub fn another(&self, name: &str, dir: &Path) -> Config {
        let mut c = self
            .clone()
            .set("mqtt.client_id", format!("palletd-{name}"))
            .set(
                "spool.dir",
                dir.join(format!("spool-{name}")).display().to_string(),
            );
        let port = free_port();
        c.http_port = port;
        c.set("http.listen", format!("127.0.0.1:{port}"))
    }

    /// Removes `section.key`.
    pub fn unset(mut self, path: &str) -> Config {
        let (section, key) = path.split_once('.').expect("section.key");
        if let Some(t) = self.table.get_mut(section).and_then(|t| t.as_table_mut()) {
            t.remove(key);
        }
        self
    }

    /// Adds a `[[subscription]]` for a JSON topic pattern.
    pub fn subscribe(mut self, topic: &str) -> Config {
        let mut sub = toml::Table::new();
        sub.insert("topic".into(), topic.into());
        if let Some(toml::Value::Array(subs)) = self.table.get_mut("subscription") {
            subs.push(toml::Value::Table(sub));
        }
        self
    }

    /// Adds a `[[subscription]]` of `format = "sparkplug_b"` on `spBv1.0/#`,
    /// with rebirth requests at most every `rebirth` if given.
    pub fn sparkplug(mut self, rebirth: Option<&str>) -> Config {
        let mut sub = toml::Table::new();
        sub.insert("topic".into(), "spBv1.0/#".into());
        sub.insert("format".into(), "sparkplug_b".into());
        if let Some(every) = rebirth {
            sub.insert("request_rebirth".into(), true.into());
            sub.insert("rebirth_min_interval".into(), every.into());
        }
        if let Some(toml::Value::Array(subs)) = self.table.get_mut("subscription") {
            subs.push(toml::Value::Table(sub));
        }
        self
    }

    /// Adds a `[[rollup]]` of `interval`.
    pub fn rollup(mut self, interval: &str, partial: bool, expire_after: Option<&str>) -> Config {
        let mut r = toml::Table::new();
        r.insert("interval".into(), interval.into());
        r.insert("partial".into(), partial.into());
        if let Some(e) = expire_after {
            r.insert("expire_after".into(), e.into());
        }
        let rollups = self
            .table
            .entry("rollup")
            .or_insert_with(|| toml::Value::Array(Vec::new()));
        if let toml::Value::Array(items) = rollups {
            items.push(toml::Value::Table(r));
        }
        self
    }

    pub fn window(self, window: &str) -> Config {
        self.set("bucket.window", window)
    }

    pub fn max_samples(self, n: i64) -> Config {
        self.set("bucket.max_samples", n)
    }

    pub fn max_delay(self, delay: &str) -> Config {
        self.set("flush.max_delay", delay)
    }

    pub fn closer(self, every: &str, grace: &str) -> Config {
        self.set("closer.interval", every)
            .set("closer.grace", grace)
    }

    pub fn timeseries(self) -> Config {
        self.set("storage.mode", "timeseries")
            .set("storage.granularity", "seconds")
    }

    pub fn mongodb_uri(self, uri: &str) -> Config {
        self.set("mongodb.uri", uri)
    }

    pub fn client_id(&self) -> String {
        self.table["mqtt"]["client_id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn database(&self) -> String {
        self.table["mongodb"]["database"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn toml(&self) -> String {
        toml::to_string(&self.table).unwrap()
    }

    /// The config written to `dir/<name>`, for a `palletd` command.
    pub fn write_to(&self, dir: &Path, name: &str) -> PathBuf {
        write_file(dir, name, &self.toml())
    }
}

// -------------------------------------------------------------- palletd

/// palletd running as a child process.
pub struct Palletd {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub http_port: u16,
    log: PathBuf,
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
        Palletd {
            child,
            dir,
            http_port: config.http_port,
            log,
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
    /// the broker, the database answering.
    pub async fn ready(&self) {
        self.wait_until(Duration::from_secs(30), "ready (/readyz)", |p| {
            p.readyz().0 == 200
        })
        .await;
    }

    /// Polls `/readyz` until the broker acknowledged the subscriptions,
    /// whatever the database does.
    pub async fn subscribed(&self) {
        self.wait_until(Duration::from_secs(30), "subscribed (/readyz)", |p| {
            let (status, why) = p.readyz();
            status == 200 || why.contains("database") || why.contains("flush")
        })
        .await;
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
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if f(self) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for palletd to be {what}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
    pub fn wait_for_log(&self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "palletd never logged {needle:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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

// ---------------------------------------------------------------- stack

/// A broker, a database and palletd, started together for one test.
pub struct Stack {
    pub broker: Broker,
    pub db: Database,
    pub config: Config,
    pub palletd: Palletd,
    pub client: mongodb::Client,
}

impl Stack {
    /// Broker, database and palletd with `configure`d settings, ready.
    pub async fn start(name: &str, configure: impl FnOnce(Config) -> Config) -> Stack {
        let broker = Broker::start();
        let db = Database::start();
        Self::on(broker, db, name, configure).await
    }

    /// palletd on these services, ready.
    pub async fn on(
        broker: Broker,
        db: Database,
        name: &str,
        configure: impl FnOnce(Config) -> Config,
    ) -> Stack {
        let stack = Self::assemble(broker, db, name, configure).await;
        stack.palletd.ready().await;
        stack
    }

    /// Broker and palletd up (subscribed), the database stopped: palletd
    /// spools and acknowledges what it receives. `stack.db.start_again()`
    /// brings the database back.
    pub async fn without_database(name: &str, configure: impl FnOnce(Config) -> Config) -> Stack {
        let mut db = Database::start();
        db.stop();
        let stack = Self::assemble(Broker::start(), db, name, configure).await;
        stack.palletd.subscribed().await;
        stack
    }

    async fn assemble(
        broker: Broker,
        db: Database,
        name: &str,
        configure: impl FnOnce(Config) -> Config,
    ) -> Stack {
        let config = configure(Config::new(&broker, &db, name));
        let palletd = Palletd::start(&config);
        let client = db.client().await;
        Stack {
            broker,
            db,
            config,
            palletd,
            client,
        }
    }

    /// SIGKILLs palletd `times` times at random moments 0.7-2 s apart (the
    /// same moments for the same `seed`), starting it again each time.
    pub async fn kill_repeatedly(&mut self, times: usize, seed: u64) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..times {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(700..2000))).await;
            self.palletd.kill();
            self.palletd = Palletd::start(&self.config);
        }
    }

    /// Waits until the broker holds no message for palletd: everything it
    /// sent was acknowledged (spooled).
    pub async fn all_acknowledged(&self) {
        eventually(
            Duration::from_secs(30),
            "the broker holds no message for palletd",
            || async { self.broker.held_messages().await == 0 },
        )
        .await;
    }

    pub async fn publisher(&self) -> Publisher {
        Publisher::connect(&self.broker, &format!("pub-{}", self.config.name)).await
    }

    /// Samples stored so far.
    pub async fn stored(&self) -> usize {
        stored_samples(&self.client, &self.config.database()).await
    }

    /// All documents of one of this test's collections.
    pub async fn docs(&self, coll: &str) -> Vec<Document> {
        all_docs(&self.client, &self.config.database(), coll).await
    }

    /// Waits until at least `n` samples are stored.
    pub async fn wait_stored(&self, n: usize) {
        eventually(
            Duration::from_secs(60),
            &format!("{n} samples stored"),
            || async { self.stored().await >= n },
        )
        .await;
    }

    /// Stops palletd with SIGTERM; it must exit 0.
    pub fn stop(&mut self) {
        assert_eq!(self.palletd.terminate(), Some(0), "{}", self.palletd.log());
    }
}

// ------------------------------------------------------------ publisher

/// An MQTT publisher whose QoS 1 publishes are all acknowledged by the broker
/// when `flush` returns.
pub struct Publisher {
    client: AsyncClient,
    acks: tokio::sync::mpsc::UnboundedReceiver<()>,
    sent: usize,
}

impl Publisher {
    pub async fn connect(broker: &Broker, id: &str) -> Publisher {
        Self::connect_with(broker, id, true).await
    }

    /// A publisher with a kept session: it resends unacknowledged
    /// publishes after the broker restarts.
    pub async fn connect_persistent(broker: &Broker, id: &str) -> Publisher {
        Self::connect_with(broker, id, false).await
    }

    async fn connect_with(broker: &Broker, id: &str, clean: bool) -> Publisher {
        let mut opts = MqttOptions::new(id, "127.0.0.1", broker.port);
        opts.set_clean_session(clean);
        opts.set_max_packet_size(4 << 20, 4 << 20);
        opts.set_inflight(200);
        let (client, mut eventloop) = AsyncClient::new(opts, 1000);
        let (tx, acks) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        let _ = tx.send(());
                    }
                    Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        Publisher {
            client,
            acks,
            sent: 0,
        }
    }

    pub async fn publish(&mut self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload.into())
            .await
            .unwrap();
        self.sent += 1;
    }

    /// Publishes a JSON reading of `sensor` on `sensors/<sensor>/telemetry`.
    pub async fn json(&mut self, sensor: &str, value: serde_json::Value) {
        self.publish(&format!("sensors/{sensor}/telemetry"), value.to_string())
            .await;
    }

    /// Waits until the broker acknowledged every publish so far.
    pub async fn flush(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.sent > 0 {
            match tokio::time::timeout_at(deadline, self.acks.recv()).await {
                Ok(Some(())) => self.sent -= 1,
                _ => panic!("broker did not acknowledge {} publishes", self.sent),
            }
        }
    }
}

// ---------------------------------------------------- reading it back

/// All documents of a collection.
pub async fn all_docs(client: &mongodb::Client, db: &str, coll: &str) -> Vec<Document> {
    client
        .database(db)
        .collection::<Document>(coll)
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// Polls until `f` returns true, or panics with `what` after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if f().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Samples stored: in bucket documents, or one per time series document.
pub async fn stored_samples(client: &mongodb::Client, db: &str) -> usize {
    all_docs(client, db, "readings")
        .await
        .iter()
        .map(|b| b.get_array("samples").map_or(1, |s| s.len()))
        .sum()
}

/// The `seq` field of every sample of a bucket, in stored order.
pub fn seqs(bucket: &Document) -> Vec<i64> {
    bucket
        .get_array("samples")
        .unwrap()
        .iter()
        .map(|s| s.as_document().unwrap().get_f64("seq").unwrap() as i64)
        .collect()
}

/// A sample's `ts` in ms.
pub fn ts_of(sample: &Bson) -> i64 {
    sample
        .as_document()
        .unwrap()
        .get_datetime("ts")
        .unwrap()
        .timestamp_millis()
}

/// Unwinds every bucket into (sensor, seq) -> [(ts, sample without ts)].
pub fn unwind(buckets: &[Document]) -> HashMap<(String, i64), Vec<(i64, Document)>> {
    let mut out: HashMap<(String, i64), Vec<(i64, Document)>> = HashMap::new();
    for b in buckets {
        let sensor = b.get_str("sensorId").unwrap().to_string();
        for s in b.get_array("samples").unwrap() {
            let mut s = s.as_document().unwrap().clone();
            let ts = s.get_datetime("ts").unwrap().timestamp_millis();
            s.remove("ts");
            let seq = s.get_f64("seq").unwrap() as i64;
            out.entry((sensor.clone(), seq)).or_default().push((ts, s));
        }
    }
    out
}

/// Checks every invariant of a bucket document; panics naming the broken one.
pub fn check_bucket(b: &Document, window_ms: i64, max_samples: usize, max_bytes: usize) {
    let samples = b.get_array("samples").expect("samples");
    let count = b.get_i32("count").expect("count") as usize;
    assert_eq!(count, samples.len(), "count == samples.length: {b}");
    assert!(count <= max_samples, "count <= max_samples: {b}");
    let size = b.get_i32("size").expect("size") as usize;
    assert!(size <= max_bytes, "size <= max_bytes: {b}");
    // What the bucket holds: its samples, and an entry per distinct numeric
    // name in each of sum, n, min, max and the seal's avg, and its {t, v}
    // in first and last.
    let bytes: usize = samples
        .iter()
        .map(|s| bson::to_vec(s.as_document().unwrap()).unwrap().len())
        .sum();
    let names: std::collections::HashSet<&str> = samples
        .iter()
        .flat_map(|s| s.as_document().unwrap().iter())
        .filter(|(_, v)| matches!(v, Bson::Double(_)))
        .map(|(k, _)| k.as_str())
        .collect();
    let summaries: usize = names.iter().map(|n| 7 * n.len() + 108).sum();
    assert!(
        bytes + summaries <= size,
        "size counts what the bucket holds: {bytes} bytes of samples and {summaries} of summaries, size {size}: {b}"
    );
    let start = b.get_datetime("startTs").unwrap().timestamp_millis();
    let end = b.get_datetime("endTs").unwrap().timestamp_millis();
    // Open, unless full (the closer seals a bucket palletd filled without
    // waiting for its window's end) or its window is over.
    if b.get_bool("closed").expect("closed") {
        assert!(
            count == max_samples || end <= now_ms(),
            "closed only when full or its window is over: {b}"
        );
        check_sealed(b);
    }
    assert_eq!(
        start.rem_euclid(window_ms),
        0,
        "startTs aligned to the window"
    );
    assert_eq!(end, start + window_ms, "endTs = startTs + window");
    let ts: Vec<i64> = samples.iter().map(ts_of).collect();
    assert!(
        ts.iter().all(|t| (start..end).contains(t)),
        "sample ts in [startTs, endTs)"
    );
    assert_eq!(
        b.get_datetime("minTs").unwrap().timestamp_millis(),
        *ts.iter().min().unwrap()
    );
    assert_eq!(
        b.get_datetime("maxTs").unwrap().timestamp_millis(),
        *ts.iter().max().unwrap()
    );
    // Rollups recomputed from the samples.
    let mut sums: std::collections::BTreeMap<String, (f64, i32, f64, f64)> = Default::default();
    for s in samples {
        for (k, v) in s.as_document().unwrap() {
            if let Bson::Double(x) = v {
                let e = sums
                    .entry(k.clone())
                    .or_insert((0.0, 0, f64::MAX, f64::MIN));
                e.0 += x;
                e.1 += 1;
                e.2 = e.2.min(*x);
                e.3 = e.3.max(*x);
            }
        }
    }
    let empty = Document::new();
    let (sum, n, min, max) = (
        b.get_document("sum").unwrap_or(&empty),
        b.get_document("n").unwrap_or(&empty),
        b.get_document("min").unwrap_or(&empty),
        b.get_document("max").unwrap_or(&empty),
    );
    assert_eq!(n.len(), sums.len(), "one n.<field> per numeric field: {b}");
    for (k, (s, c, lo, hi)) in sums {
        let stored = sum.get_f64(&k).unwrap();
        assert!(
            (stored - s).abs() <= 1e-9 * s.abs().max(1.0),
            "sum.{k}: {stored} vs {s}"
        );
        assert_eq!(n.get_i32(&k).unwrap(), c, "n.{k}");
        assert_eq!(min.get_f64(&k).unwrap(), lo, "min.{k}");
        assert_eq!(max.get_f64(&k).unwrap(), hi, "max.{k}");
    }
}

/// Checks a sealed bucket: closed, `closedAt`, samples sorted, `avg = sum / n`.
pub fn check_sealed(b: &Document) {
    assert!(b.get_bool("closed").unwrap(), "sealed: {b}");
    assert!(b.get_datetime("closedAt").is_ok(), "closedAt set: {b}");
    let ts: Vec<i64> = b.get_array("samples").unwrap().iter().map(ts_of).collect();
    assert!(
        ts.windows(2).all(|w| w[0] <= w[1]),
        "samples sorted by ts: {ts:?}"
    );
    let (sum, n, avg) = (
        b.get_document("sum").unwrap(),
        b.get_document("n").unwrap(),
        b.get_document("avg").unwrap(),
    );
    assert_eq!(avg.len(), sum.len(), "one avg per rolled-up field: {b}");
    for (field, s) in sum {
        let want = s.as_f64().unwrap() / n.get_i32(field).unwrap() as f64;
        let got = avg.get_f64(field).unwrap();
        assert!(
            (got - want).abs() < 1e-9,
            "avg.{field} = sum / n: {got} vs {want}"
        );
    }
}

/// A plain HTTP/1.0 GET on 127.0.0.1: (status, body); status 0 when
/// nothing listens.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut text = String::new();
    if stream.read_to_string(&mut text).is_err() {
        return (0, String::new());
    }
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// A TCP proxy in front of the database that can cut one connection right
/// after the server answered a write (a bucket write, `$push`, unless told
/// otherwise), dropping the reply:
/// the write is applied but the client never learns it (an ambiguous write).
pub struct CutProxy {
    pub port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub cuts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CutProxy {
    pub async fn start(upstream: u16) -> CutProxy {
        Self::start_cutting(upstream, b"$push").await
    }

    /// Cuts after the first write whose request contains `marker`.
    pub async fn start_cutting(upstream: u16, marker: &'static [u8]) -> CutProxy {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (a, c) = (armed.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (a, c) = (a.clone(), c.clone());
                tokio::spawn(async move {
                    if let Ok(server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    {
                        proxy_connection(client, server, a, c, marker).await;
                    }
                });
            }
        });
        CutProxy { port, armed, cuts }
    }

    pub fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }
}

async fn read_frame(r: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await.ok()?;
    let n = i32::from_le_bytes(len).max(4) as usize;
    let mut frame = len.to_vec();
    frame.resize(n, 0);
    r.read_exact(&mut frame[4..]).await.ok()?;
    Some(frame)
}

async fn proxy_connection(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cuts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    marker: &'static [u8],
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::AsyncWriteExt;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let cut_reply = std::sync::Arc::new(AtomicBool::new(false));
    let cut = cut_reply.clone();
    let upstream = tokio::spawn(async move {
        while let Some(frame) = read_frame(&mut cr).await {
            let is_write = frame.windows(marker.len()).any(|w| w == marker);
            if is_write && armed.swap(false, Ordering::SeqCst) {
                cut.store(true, Ordering::SeqCst);
            }
            if sw.write_all(&frame).await.is_err() {
                return;
            }
        }
    });
    while let Some(frame) = read_frame(&mut sr).await {
        if cut_reply.load(Ordering::SeqCst) {
            // The server applied the write; its reply never arrives.
            cuts.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if cw.write_all(&frame).await.is_err() {
            break;
        }
    }
    upstream.abort();
}

pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// (sensor, seq) -> how many times stored.
pub async fn stored_counts(client: &mongodb::Client, db: &str) -> HashMap<(String, i64), usize> {
    let mut out = HashMap::new();
    for b in all_docs(client, db, "readings").await {
        let sensor = b.get_str("sensorId").unwrap().to_string();
        match b.get_array("samples") {
            Ok(samples) => {
                for s in samples {
                    let seq = s.as_document().unwrap().get_f64("seq").unwrap() as i64;
                    *out.entry((sensor.clone(), seq)).or_default() += 1;
                }
            }
            // Time series mode: one document per reading.
            Err(_) => {
                let seq = b.get_f64("seq").unwrap() as i64;
                *out.entry((sensor, seq)).or_default() += 1;
            }
        }
    }
    out
}

/// Publishes `count` readings over `sensors` sensors at `rate` per second
/// and waits until the broker acknowledged them all. Returns what was sent.
pub async fn publish_steadily(
    publisher: Publisher,
    sensors: usize,
    rate: f64,
    count: i64,
) -> Vec<(String, i64)> {
    publish_steadily_from(publisher, sensors, rate, 0..count).await
}

/// [`publish_steadily`] with these sequence numbers.
pub async fn publish_steadily_from(
    mut publisher: Publisher,
    sensors: usize,
    rate: f64,
    seqs: std::ops::Range<i64>,
) -> Vec<(String, i64)> {
    let started = tokio::time::Instant::now();
    let mut sent = Vec::new();
    let first = seqs.start;
    for seq in seqs {
        let due = started + Duration::from_secs_f64((seq - first) as f64 / rate);
        tokio::time::sleep_until(due).await;
        let sensor = format!("f{:02}", seq as usize % sensors);
        let payload = serde_json::json!({ "seq": seq, "temp": (seq % 50) as f64 / 2.0, "hum": 40 });
        publisher
            .publish(&format!("sensors/{sensor}/telemetry"), payload.to_string())
            .await;
        sent.push((sensor, seq));
    }
    publisher.flush().await;
    sent
}

/// Waits until every sent reading is stored, then checks each is stored
/// exactly once and every bucket is consistent.
pub async fn assert_exactly_once(
    client: &mongodb::Client,
    db: &str,
    sent: &[(String, i64)],
    within: Duration,
) {
    // Every reading seen, not a count reached: a scan while buckets grow
    // may see one twice.
    eventually(within, "every published reading stored", || async {
        let stored = stored_counts(client, db).await;
        sent.iter().all(|k| stored.contains_key(k))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stored = stored_counts(client, db).await;
    let missing: Vec<_> = sent
        .iter()
        .filter(|k| !stored.contains_key(*k))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    let twice: Vec<_> = stored.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(twice.is_empty(), "stored more than once: {twice:?}");
    assert_eq!(stored.len(), sent.len(), "nothing extra");
    for b in all_docs(client, db, "readings").await {
        if b.contains_key("samples") {
            check_bucket(&b, HOUR_MS, 200, 256 * 1024);
        }
    }
}

// ----------------------------------------------------------- disk faults

/// A small tmpfs, mounted for one test (a disk to fill); unmounted when
/// dropped. Needs root, as `mount` does.
pub struct Tmpfs {
    pub dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=`, e.g. "3m").
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run mount: {e}"));
        assert!(
            out.status.success(),
            "cannot mount a tmpfs (this test needs root, as CI has): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// libfiu's remote control of a process started under `fiu-run -x -f
/// <fifo>`: runs `fiu-ctrl -c <command>...` on it.
pub fn fiu_ctrl(fifo: &Path, pid: u32, commands: &[&str]) {
    let mut c = Command::new("fiu-ctrl");
    c.arg("-f").arg(fifo);
    for command in commands {
        c.args(["-c", command]);
    }
    let out = c
        .arg(pid.to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run fiu-ctrl: {e}; {INSTALL_HINT}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !err.contains("Error"),
        "fiu-ctrl failed: {err}"
    );
}
