//! Mosquitto, aedes and SecantusDB, each on a free port with its own
//! directory, killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bson::doc;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

/// What a missing service binary's panic says to run.
pub const INSTALL_HINT: &str = "run `scripts/install-test-services` (installs Mosquitto, RabbitMQ, libfiu's fiu-utils, Chromium, promtool, lintian and Node.js from Debian, aedes, @grafana/schema and TypeScript from npm, statsmodels' datasets from PyPI and SecantusDB from crates.io)";

/// A free local TCP port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free local port")
}

/// `env` if set, else the first of `names` on the PATH or in `extra`.
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

/// Waits (up to 20 s) until something listens on `port`; `what` names it.
pub fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start listening on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` (`-TERM`, `-KILL`) to `child` and waits for it to exit.
pub fn kill_and_wait(child: &mut Child, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status();
    let _ = child.wait();
}

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
        let n = self
            .sys(&[
                "$SYS/broker/store/messages/count",
                "$SYS/broker/retained messages/count",
            ])
            .await;
        n[0] - n[1]
    }

    /// The numbers of these `$SYS` topics, read together.
    async fn sys(&self, topics: &[&str]) -> Vec<i64> {
        let id = format!("sys-reader-{}", rand::random::<u32>());
        let mut opts = MqttOptions::new(id, "127.0.0.1", self.port);
        opts.set_keep_alive(Duration::from_secs(5));
        let (client, mut eventloop) = AsyncClient::new(opts, 10);
        for topic in topics {
            client.subscribe(*topic, QoS::AtMostOnce).await.unwrap();
        }
        let read = async {
            let mut got: Vec<Option<i64>> = vec![None; topics.len()];
            loop {
                if let Ok(Event::Incoming(Packet::Publish(p))) = eventloop.poll().await {
                    let n = String::from_utf8_lossy(&p.payload)
                        .trim()
                        .parse::<i64>()
                        .unwrap();
                    if let Some(i) = topics.iter().position(|t| *t == p.topic) {
                        got[i] = Some(n);
                    }
                    if got.iter().all(Option::is_some) {
                        return got.into_iter().flatten().collect();
                    }
                }
            }
        };
        let n = tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("no $SYS counts from the broker");
        let _ = client.try_disconnect();
        n
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_wait(&mut c, "-KILL");
        }
    }
}

/// An aedes broker (Node.js, from npm): an MQTT 3.1.1 broker of another
/// make, which grants `$share/<group>/<filter>` subscriptions without
/// delivering anything through them.
pub struct Aedes {
    pub port: u16,
    /// Holds palletd's spool for a test, as [`Broker::dir`] does.
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Aedes {
    pub fn start() -> Aedes {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let modules = std::env::var_os("PALLETD_AEDES")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".cache/palletd-test/aedes/node_modules"));
        assert!(
            modules.join("aedes").is_dir(),
            "aedes not found in {} (set PALLETD_AEDES or {INSTALL_HINT})",
            modules.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("broker.js");
        std::fs::write(
            &script,
            "const aedes = require('aedes')();\nconst server = require('net').createServer(aedes.handle);\nserver.listen(Number(process.argv[2]), '127.0.0.1');\n",
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(find_binary("PALLETD_NODE", &["node", "nodejs"], &[]))
            .arg(&script)
            .arg(port.to_string())
            .env("NODE_PATH", &modules)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start node: {e}; {INSTALL_HINT}"));
        wait_for_port(port, "aedes");
        Aedes {
            port,
            dir,
            child: Some(child),
        }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for Aedes {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_wait(&mut c, "-KILL");
        }
    }
}

/// A RabbitMQ node with its MQTT plugin (Debian's `rabbitmq-server`): a
/// third broker, which resends a resumed session's messages under new
/// packet ids and accepts `$share/` without delivering through it. A
/// private node on free ports, its own epmd, everything under its own
/// directory (the system's service is never used). A node starts in 10 to
/// 12 s.
pub struct Rabbit {
    /// Its MQTT port.
    pub port: u16,
    /// Holds palletd's spool for a test, as [`Broker::dir`] does, and the
    /// node's files.
    pub dir: tempfile::TempDir,
    epmd_port: u16,
    node_port: u16,
    dist_port: u16,
    epmd: Option<Child>,
    child: Option<Child>,
}

impl Rabbit {
    /// A node whose MQTT sessions may have `prefetch` messages in flight.
    pub fn start(prefetch: usize) -> Rabbit {
        let server = PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server");
        assert!(
            server.is_file(),
            "{} not found; {INSTALL_HINT}",
            server.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let (port, node_port, dist_port, epmd_port) =
            (free_port(), free_port(), free_port(), free_port());
        std::fs::write(
            dir.path().join("rabbitmq.conf"),
            format!(
                "listeners.tcp.default = 127.0.0.1:{node_port}\nmqtt.listeners.tcp.default = 127.0.0.1:{port}\nmqtt.allow_anonymous = true\nloopback_users = none\nmqtt.prefetch = {prefetch}\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("enabled_plugins"), "[rabbitmq_mqtt].\n").unwrap();
        let epmd = Command::new(find_binary("PALLETD_EPMD", &["epmd"], &[]))
            .args(["-port", &epmd_port.to_string(), "-address", "127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start epmd: {e}; {INSTALL_HINT}"));
        wait_for_port(epmd_port, "epmd");
        let mut r = Rabbit {
            port,
            dir,
            epmd_port,
            node_port,
            dist_port,
            epmd: Some(epmd),
            child: None,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        use std::os::unix::process::CommandExt;
        let d = self.dir.path();
        // Its own process group: the script starts the Erlang VM as its
        // child, and a kill of the group leaves nothing behind.
        let child = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server")
            .process_group(0)
            .env("HOME", d)
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env(
                "RABBITMQ_NODENAME",
                format!("palletd-{}@localhost", self.port),
            )
            .env("RABBITMQ_NODE_PORT", self.node_port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start rabbitmq-server: {e}; {INSTALL_HINT}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "RabbitMQ's MQTT listener did not start on port {} (its log: {})",
                self.port,
                d.join("log").display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the node (SIGTERM: the script stops it cleanly, and its
    /// durable queues, the MQTT sessions' messages, are kept).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_wait(&mut c, "-TERM");
            // Whatever of the group is left.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", c.id())])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Starts it again on the same ports with the same state.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", c.id())])
                .status();
            let _ = c.wait();
        }
        if let Some(mut e) = self.epmd.take() {
            kill_and_wait(&mut e, "-KILL");
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
            .arg(self.data_dir())
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

    /// Where it keeps its data.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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
