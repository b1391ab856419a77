//! Running palletd as a service: metrics and health, the systemd notify
//! protocol, `palletd query`, JSON logs, the unit file and the Compose file.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use bson::Document;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_what_was_stored_and_readyz_follows_the_database() {
    let mut stack = Stack::start("metrics", |c| c).await;
    let port = stack.palletd.http_port;
    assert_eq!(http_get(port, "/healthz").0, 200);

    let mut publisher = stack.publisher().await;
    for seq in 0..30 {
        publisher
            .publish(
                "sensors/m1/telemetry",
                serde_json::json!({ "seq": seq, "v": 1.5 }).to_string(),
            )
            .await;
    }
    let batch = serde_json::json!([{ "seq": 30 }, { "seq": 31 }, { "seq": 32 }]);
    publisher
        .publish("sensors/m2/telemetry", batch.to_string())
        .await;
    publisher.publish("sensors/m2/telemetry", "{broken").await;
    publisher.flush().await;
    stack.wait_stored(33).await;
    eventually(Duration::from_secs(10), "metrics caught up", || async {
        let s = stack.palletd.scrape();
        metric(&s, "palletd_samples_stored_total", None) >= 33.0
            && metric(&s, "palletd_dead_letters_total", None) >= 1.0
    })
    .await;
    let s = stack.palletd.scrape();
    assert_eq!(metric(&s, "palletd_messages_received_total", None), 32.0);
    assert_eq!(metric(&s, "palletd_samples_decoded_total", None), 33.0);
    assert_eq!(metric(&s, "palletd_samples_stored_total", None), 33.0);
    assert_eq!(
        metric(
            &s,
            "palletd_dead_letters_total",
            Some(("cause", "bad_payload"))
        ),
        1.0
    );
    assert_eq!(metric(&s, "palletd_buckets_created_total", None), 2.0);
    assert_eq!(metric(&s, "palletd_pending_samples", None), 0.0);
    assert_eq!(metric(&s, "palletd_broker_connected", None), 1.0);
    assert!(metric(&s, "palletd_flush_duration_seconds_count", None) >= 1.0);
    // The clock's state as the kernel tells it to this process too.
    let clock = s
        .samples
        .iter()
        .find(|x| x.metric == "palletd_clock_synchronized")
        .map(|_| metric(&s, "palletd_clock_synchronized", None) == 1.0);
    assert_eq!(
        clock,
        palletd::telemetry::supervise::clock_synchronized(),
        "palletd_clock_synchronized"
    );
    assert!(
        s.samples
            .iter()
            .all(|x| !x.labels.values().any(|v| v == "m1" || v == "m2")),
        "no sensor id in a label"
    );

    eventually(Duration::from_secs(10), "ready", || async {
        http_get(port, "/readyz").0 == 200
    })
    .await;
    stack.db.stop();
    let stopped = Instant::now();
    eventually(
        Duration::from_secs(15),
        "unready without the database",
        || async { http_get(port, "/readyz").0 == 503 },
    )
    .await;
    let (_, why) = http_get(port, "/readyz");
    assert!(why.contains("database"), "{why}");
    eprintln!("unready {:?} after the database stopped", stopped.elapsed());
    stack.db.start_again();
    eventually(Duration::from_secs(30), "ready again", || async {
        http_get(port, "/readyz").0 == 200
    })
    .await;
    stack.stop();
}

/// A systemd notify socket: a thread reads every datagram as it arrives
/// (as systemd does), so the sender never finds it full.
struct NotifySocket {
    received: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl NotifySocket {
    fn bind(path: &std::path::Path) -> NotifySocket {
        let sock = UnixDatagram::bind(path).unwrap();
        let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = received.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = sock.recv(&mut buf) {
                sink.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).to_string());
            }
        });
        NotifySocket { received }
    }

    /// How many datagrams arrived so far.
    fn mark(&self) -> usize {
        self.received.lock().unwrap().len()
    }

    /// The datagrams that arrived after `mark`.
    fn since(&self, mark: usize) -> Vec<String> {
        self.received.lock().unwrap()[mark..].to_vec()
    }

    /// The datagrams that arrive within the next `dur`.
    fn collect(&self, dur: Duration) -> Vec<String> {
        let mark = self.mark();
        std::thread::sleep(dur);
        self.since(mark)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_is_petted_through_a_database_outage_longer_than_its_interval() {
    let broker = Broker::start();
    let mut db = Database::start();
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let sock = NotifySocket::bind(&sock_path);
    let cfg = Config::new(&broker, &db, "notify");
    let mut palletd = Palletd::start_with(
        &cfg,
        Run {
            log: Some("info"),
            env: &[
                ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
                ("WATCHDOG_USEC", "2000000"),
            ],
            ..Run::default()
        },
    );
    let first = sock.collect(Duration::from_secs(5));
    assert!(first.iter().any(|m| m.contains("READY=1")), "{first:?}");
    assert!(first.iter().any(|m| m.contains("STATUS=")), "{first:?}");
    assert!(first.iter().any(|m| m.contains("WATCHDOG=1")), "{first:?}");

    // The database goes away while a reading waits: its flush retries.
    let before_outage = sock.mark();
    db.stop();
    let mut publisher = Publisher::connect(&broker, "pub-notify").await;
    publisher
        .publish("sensors/n1/telemetry", r#"{"v": 1}"#)
        .await;
    publisher.flush().await;
    palletd
        .wait_metric("palletd_database_errors_total", 1.0)
        .await;
    // Three watchdog intervals into the outage palletd is still alive and
    // retrying: the pets go on, and STATUS says what it waits for.
    let outage = sock.collect(Duration::from_secs(6));
    let pets = outage.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert!(
        pets >= 4,
        "the watchdog is petted during the outage: {outage:?}"
    );
    let during = sock.since(before_outage);
    assert!(
        during
            .iter()
            .any(|m| m.contains("STATUS=waiting for the database")),
        "STATUS names the outage: {during:?}"
    );
    assert_eq!(http_get(palletd.http_port, "/readyz").0, 503);
    assert!(palletd.running(), "not restarted, not crashed");

    db.start_again();
    let client = db.client().await;
    eventually(Duration::from_secs(30), "the reading is stored", || async {
        stored_samples(&client, "notify").await == 1
    })
    .await;
    let after = sock.collect(Duration::from_secs(4));
    assert!(
        after.iter().any(|m| m.contains("WATCHDOG=1")),
        "watchdog after the outage: {after:?}"
    );
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_prints_exactly_the_published_readings_in_order_across_buckets() {
    let mut stack = Stack::start("query", |c| {
        c.window("1s")
            .max_samples(4)
            .closer("1s", "1s")
            .max_delay("200ms")
    })
    .await;
    let mut publisher = stack.publisher().await;
    // Three one-second windows, 10 readings each, out of order: several
    // full buckets per window.
    let w0 = now_ms().div_euclid(1000) * 1000 + 1000;
    let mut published: Vec<(i64, i64)> = Vec::new();
    for seq in 0..30i64 {
        let ts = w0 + (seq % 3) * 1000 + (29 - seq) * 10;
        publisher
            .publish(
                "sensors/q1/telemetry",
                serde_json::json!({ "ts": ts, "seq": seq, "v": seq as f64 / 2.0 }).to_string(),
            )
            .await;
        published.push((ts, seq));
    }
    // Another sensor must not show up.
    publisher
        .publish(
            "sensors/q2/telemetry",
            serde_json::json!({ "ts": w0, "seq": 99 }).to_string(),
        )
        .await;
    publisher.flush().await;
    eventually(Duration::from_secs(30), "buckets sealed", || async {
        let b = stack.docs("readings").await;
        b.iter().map(|b| b.get_i32("count").unwrap()).sum::<i32>() == 31
            && b.iter().all(|b| b.get_bool("closed") == Ok(true))
    })
    .await;
    // A late reading into the sealed first window: a second kind of bucket.
    publisher
        .publish(
            "sensors/q1/telemetry",
            serde_json::json!({ "ts": w0 + 5, "seq": 30, "v": 0.0 }).to_string(),
        )
        .await;
    publisher.flush().await;
    published.push((w0 + 5, 30));
    eventually(Duration::from_secs(30), "late reading stored", || async {
        stack.stored().await == 32
    })
    .await;

    let cfg_path = stack
        .config
        .write_to(stack.palletd.dir.path(), "query.toml");
    let from = chrono::DateTime::from_timestamp_millis(w0)
        .unwrap()
        .to_rfc3339();
    let to = chrono::DateTime::from_timestamp_millis(w0 + 2500)
        .unwrap()
        .to_rfc3339();
    let out = query_ok(&cfg_path, &["--sensor", "q1", "--from", &from, "--to", &to]);
    let got: Vec<(i64, i64)> = out
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["sensorId"], "q1");
            let ts = chrono::DateTime::parse_from_rfc3339(v["ts"].as_str().unwrap())
                .unwrap()
                .timestamp_millis();
            (ts, v["seq"].as_f64().unwrap() as i64)
        })
        .collect();
    let mut want: Vec<(i64, i64)> = published
        .iter()
        .copied()
        .filter(|(ts, _)| (w0..w0 + 2500).contains(ts))
        .collect();
    want.sort();
    assert_eq!(got, want, "exactly the readings in range, in time order");

    let csv = query_ok(&cfg_path, &["--sensor", "q1", "--format", "csv"]);
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("sensorId,ts,seq,v"));
    assert_eq!(lines.count(), 31);

    // --stats matches the buckets' rollups, merged per window.
    let stats = query_ok(&cfg_path, &["--sensor", "q1", "--stats"]);
    let buckets: Vec<Document> = stack
        .docs("readings")
        .await
        .into_iter()
        .filter(|b| b.get_str("sensorId") == Ok("q1"))
        .collect();
    let mut want: BTreeMap<i64, (i64, f64, i64, f64, f64)> = BTreeMap::new();
    for b in &buckets {
        let e = want
            .entry(b.get_datetime("startTs").unwrap().timestamp_millis())
            .or_insert((0, 0.0, 0, f64::MAX, f64::MIN));
        e.0 += b.get_i32("count").unwrap() as i64;
        e.1 += b.get_document("sum").unwrap().get_f64("v").unwrap();
        e.2 += b.get_document("n").unwrap().get_i32("v").unwrap() as i64;
        e.3 =
            e.3.min(b.get_document("min").unwrap().get_f64("v").unwrap());
        e.4 =
            e.4.max(b.get_document("max").unwrap().get_f64("v").unwrap());
    }
    let lines: Vec<serde_json::Value> = stats
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), want.len());
    for (line, (start, (count, sum, n, min, max))) in lines.iter().zip(&want) {
        let ts = chrono::DateTime::parse_from_rfc3339(line["startTs"].as_str().unwrap())
            .unwrap()
            .timestamp_millis();
        assert_eq!(ts, *start);
        assert_eq!(line["count"].as_i64(), Some(*count));
        let v = &line["fields"]["v"];
        assert!((v["sum"].as_f64().unwrap() - sum).abs() < 1e-9);
        assert_eq!(v["n"].as_i64(), Some(*n));
        assert_eq!(v["min"].as_f64(), Some(*min));
        assert_eq!(v["max"].as_f64(), Some(*max));
        assert!((v["avg"].as_f64().unwrap() - sum / *n as f64).abs() < 1e-9);
    }
    assert!(
        lines[0]["buckets"].as_i64().unwrap() >= 3,
        "the first window merged full and late buckets"
    );
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_publishes_what_palletd_stores() {
    let mut stack = Stack::start("sim", |c| c).await;
    let cfg_path = stack.config.write_to(stack.palletd.dir.path(), "sim.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_palletd"))
        .args(["simulate", "--config"])
        .arg(&cfg_path)
        .args([
            "--sensors",
            "5",
            "--rate",
            "20",
            "--duration",
            "2s",
            "--batch-share",
            "0.4",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("published 200 readings"), "{report}");
    assert!(report.contains("0 not acknowledged"), "{report}");
    eventually(Duration::from_secs(30), "200 readings stored", || async {
        stack.stored().await == 200
    })
    .await;
    let sensors: std::collections::BTreeSet<String> = stack
        .docs("readings")
        .await
        .iter()
        .map(|b| b.get_str("sensorId").unwrap().to_string())
        .collect();
    assert_eq!(sensors.len(), 5);
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    let broker = Broker::start();
    let db = Database::start();
    let cfg = Config::new(&broker, &db, "logs");
    let mut palletd = Palletd::start_with(
        &cfg,
        Run {
            args: &["--log-format", "json"],
            ..Run::default()
        },
    );
    palletd.ready().await;
    assert_eq!(palletd.terminate(), Some(0));
    let log = palletd.log();
    assert!(log.lines().count() >= 3);
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{e}: {line:?} in the whole log:\n{log:?}"));
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
    }
}

fn systemd_analyze() -> &'static str {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("systemd-analyze not found; {INSTALL_HINT} (it installs Debian's systemd package)");
    }
    "systemd-analyze"
}

#[test]
fn systemd_unit_verifies_and_is_hardened() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/palletd.service"
    ))
    .unwrap();
    for line in [
        "Type=notify",
        "WatchdogSec=",
        "ExecStartPre=/usr/local/bin/palletd check-config --config /etc/palletd/config.toml",
        "Restart=on-failure",
        "RestartPreventExitStatus=78",
        "StateDirectory=palletd",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "SystemCallFilter=@system-service",
        "MemoryDenyWriteExecute=yes",
    ] {
        assert!(unit.contains(line), "unit has {line}");
    }
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.trim_end_matches('s').parse().ok())
        .unwrap();
    assert!(
        stop > 30,
        "TimeoutStopSec is longer than the 30s shutdown timeout"
    );

    // verify checks that the executables exist: point them at the build.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palletd.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/palletd", env!("CARGO_BIN_EXE_palletd")),
    )
    .unwrap();
    let out = Command::new(systemd_analyze())
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(systemd_analyze())
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let score: f64 = text
        .lines()
        .find_map(|l| l.split("exposure level for palletd.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    assert!(score <= 2.0, "exposure {score} > 2.0");
}

#[test]
fn compose_file_has_the_services_health_checks_and_config_mount() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker-compose.yml"))
        .unwrap();
    let doc: serde_norway::Value =
        serde_norway::from_str(&text).expect("docker-compose.yml is YAML");
    let services = &doc["services"];
    assert!(services["mosquitto"]["image"]
        .as_str()
        .unwrap()
        .starts_with("eclipse-mosquitto"));
    assert!(services["mongo"]["image"]
        .as_str()
        .unwrap()
        .starts_with("mongo:"));
    for s in ["mosquitto", "mongo"] {
        assert!(
            services[s]["healthcheck"]["test"].is_sequence(),
            "{s} has a health check"
        );
    }
    let palletd = &services["palletd"];
    assert_eq!(palletd["build"].as_str(), Some("."));
    for dep in ["mosquitto", "mongo"] {
        assert_eq!(
            palletd["depends_on"][dep]["condition"].as_str(),
            Some("service_healthy"),
            "{dep}"
        );
    }
    let mounts: Vec<&str> = palletd["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        mounts
            .iter()
            .any(|m| m.ends_with(":/etc/palletd/config.toml:ro")),
        "{mounts:?}"
    );
    let sim = &services["simulator"];
    assert_eq!(sim["profiles"][0].as_str(), Some("simulator"));
    assert_eq!(sim["command"][0].as_str(), Some("simulate"));
    // The mounted config is a valid palletd config.
    let cfg = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker/palletd.toml"))
        .unwrap();
    palletd::config::parse(&cfg, None).expect("docker/palletd.toml is valid");
    let dockerfile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile")).unwrap();
    assert_eq!(
        dockerfile.matches("\nFROM ").count() + dockerfile.starts_with("FROM ") as usize,
        2,
        "multi-stage"
    );
    assert!(
        dockerfile.contains("\nUSER palletd"),
        "non-root runtime user"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_export_names_every_field_even_one_that_appears_late() {
    let mut stack = Stack::start("csvlate", |c| c).await;
    let mut publisher = stack.publisher().await;
    let t0 = now_ms() - 10_000;
    for seq in 0..5i64 {
        let mut v = serde_json::json!({ "ts": t0 + seq * 1000, "seq": seq, "v": seq as f64 });
        if seq == 4 {
            v["door"] = "open".into();
        }
        publisher.json("c1", v).await;
    }
    publisher.flush().await;
    stack.wait_stored(5).await;
    let cfg_path = stack.config.write_to(stack.palletd.dir.path(), "csv.toml");
    let csv = query_ok(&cfg_path, &["--sensor", "c1", "--format", "csv"]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "sensorId,ts,door,seq,v", "{csv}");
    assert_eq!(lines.len(), 6, "{csv}");
    assert!(
        lines[1].starts_with("c1,") && lines[1].ends_with(",,0,0"),
        "{csv}"
    );
    assert!(lines[5].ends_with(",open,4,4"), "{csv}");
    stack.stop();
}

/// The series API (`/api/series`, `/api/sensors`) against the real
/// database: a step of whole rollup intervals is read from the rollup's
/// settled intervals (equal to `palletd query --stats --rollup`), an
/// interval due again (a late reading, its pass not run) from the windows;
/// a step of whole windows from the windows' summaries (equal to `palletd
/// query --stats`); both take every reading, thinned or not; a shorter
/// step from the samples (the points kept); a request beyond the bounds is
/// refused with what to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_api_answers_from_the_rollups_the_windows_or_the_samples_within_its_bounds() {
    series_api("api", false).await;
}

/// The same in time series mode: the windows are the documents and the
/// summaries of the values thinning left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_api_answers_the_same_in_time_series_mode() {
    series_api("api-ts", true).await;
}

async fn series_api(name: &str, timeseries: bool) {
    let rules: toml::Table =
        toml::from_str(r#"t = { kind = "deadband", deviation = 5.0 }"#).unwrap();
    let mut stack = Stack::start(name, |c| {
        let c = c
            .window("30m")
            .rollup("1h", false, None)
            .closer("200ms", "1s")
            .subscription(&[
                ("topic", "api/{sensor}/telemetry".into()),
                ("thinning", toml::Value::Table(rules)),
            ]);
        match timeseries {
            true => c.timeseries(),
            false => c,
        }
    })
    .await;
    let port = stack.palletd.http_port;
    let mut publisher = stack.publisher().await;
    // Three hours of a reading a minute, ending an hour ago.
    let hour = 3_600_000;
    let start = (now_ms() / hour - 4) * hour;
    let value = |k: i64| (k % 37) as f64 + 0.5;
    for k in 0..180 {
        let v = serde_json::json!({ "ts": start + k * 60_000, "v": value(k), "t": value(k) });
        publisher.publish("api/a/telemetry", v.to_string()).await;
    }
    publisher.flush().await;
    stack.all_acknowledged().await;
    stack.stop();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    stack.palletd.settled().await;
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = (stack.config).write_to(cfg_dir.path(), "api.toml");
    let lines = |out: String| -> Vec<serde_json::Value> {
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let rolled_up = || {
        lines(query_ok(
            &cfg,
            &["--sensor", "a", "--stats", "--rollup", "1h"],
        ))
    };
    eventually(
        Duration::from_secs(60),
        "the three hours rolled up",
        || async { rolled_up().iter().filter(|r| r["partial"] == false).count() == 3 },
    )
    .await;

    let iso = |ms: i64| {
        let t = chrono::DateTime::from_timestamp_millis(ms).unwrap();
        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let get = |path: String| {
        let (status, head, body) = http_get_with(port, &path, &[]);
        let source = (head.lines()).find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("x-palletd-source: ")
                .map(str::to_string)
        });
        (status, source, body)
    };
    let rows = |body: &str| -> Vec<serde_json::Value> { serde_json::from_str(body).unwrap() };
    let range = format!("from={}&to={}", iso(start), iso(start + 3 * hour));
    // Each point against a summary of its step (a window's or a rollup's).
    let same =
        |got: &[serde_json::Value], want: &[serde_json::Value], time: &str, n: i64, field: &str| {
            assert_eq!(got.len(), want.len(), "{got:?}");
            for (p, w) in got.iter().zip(want) {
                assert_eq!(
                    p["time"].as_str().map(|t| &t[..19]),
                    w[time].as_str().map(|t| &t[..19])
                );
                assert_eq!(p["field"], field);
                assert_eq!(
                    p["n"].as_i64(),
                    Some(n),
                    "every reading, thinned or not: {p}"
                );
                for k in ["n", "min", "max", "sum"] {
                    assert_eq!(
                        p[k].as_f64(),
                        w["fields"][field][k].as_f64(),
                        "{k} of {field}: {p} {w}"
                    );
                }
            }
        };

    // Whole windows: every reading of each field, as palletd query --stats.
    let stats = lines(query_ok(&cfg, &["--sensor", "a", "--stats"]));
    assert_eq!(stats.len(), 6);
    // Whole hours: the rollup, as palletd query --stats --rollup 1h.
    let rollups = rolled_up();
    for field in ["v", "t"] {
        let (status, source, body) = get(format!(
            "/api/series?sensor=a&field={field}&step=30m&{range}"
        ));
        assert_eq!(
            (status, source.as_deref()),
            (200, Some("windows")),
            "{body}"
        );
        same(&rows(&body), &stats, "startTs", 30, field);
        let (status, source, body) = get(format!(
            "/api/series?sensor=a&field={field}&step=1h&{range}"
        ));
        assert_eq!(
            (status, source.as_deref()),
            (200, Some("rollup:1h")),
            "{body}"
        );
        same(&rows(&body), &rollups, "start", 60, field);
    }
    // Asked for, the samples give the same hours of the unthinned field;
    // a source the step does not allow is refused.
    let (status, source, body) = get(format!(
        "/api/series?sensor=a&field=v&step=1h&source=samples&{range}"
    ));
    assert_eq!(
        (status, source.as_deref()),
        (200, Some("samples")),
        "{body}"
    );
    same(&rows(&body), &rollups, "start", 60, "v");
    let (status, _, body) = get(format!(
        "/api/series?sensor=a&step=30m&source=rollup&{range}"
    ));
    assert_eq!(status, 400);
    assert!(body.contains("no [[rollup]] interval divides"), "{body}");
    // Ten minutes: from the samples; `t` has the points its deadband kept.
    let (status, source, body) = get(format!("/api/series?sensor=a&step=10m&{range}"));
    assert_eq!(
        (status, source.as_deref()),
        (200, Some("samples")),
        "{body}"
    );
    let got = rows(&body);
    let of = |f: &str| got.iter().filter(|p| p["field"] == f).collect::<Vec<_>>();
    assert_eq!(of("v").len(), 18);
    for (i, p) in of("v").iter().enumerate() {
        let ks = (i as i64 * 10)..(i as i64 * 10 + 10);
        assert_eq!(p["n"].as_i64(), Some(10));
        assert_eq!(
            p["sum"].as_f64(),
            Some(ks.clone().map(value).sum::<f64>()),
            "{p}"
        );
        assert_eq!(
            p["min"].as_f64(),
            ks.clone().map(value).reduce(f64::min),
            "{p}"
        );
    }
    let kept: i64 = of("t").iter().map(|p| p["n"].as_i64().unwrap()).sum();
    assert!(kept > 0 && kept < 180, "{kept} points of t kept");
    // CSV.
    let (status, _, csv) = get(format!(
        "/api/series?sensor=a&field=v&step=1h&{range}&format=csv"
    ));
    assert_eq!(status, 200);
    assert_eq!(csv.lines().next(), Some("time,field,n,avg,min,max,sum"));
    assert_eq!(csv.lines().count(), 4);

    // Bounds and mistakes: 400 with what to change.
    let (status, _, body) = get("/api/series?sensor=a&step=1s&from=30d".into());
    assert_eq!(status, 400);
    assert!(
        body.contains("at most 10000") && body.contains("larger step"),
        "{body}"
    );
    let (status, _, body) = get("/api/series?field=v".into());
    assert_eq!(status, 400);
    assert!(body.contains("sensor=ID is needed"), "{body}");
    let (status, _, body) = get("/api/series?sensor=a&step=often".into());
    assert_eq!(status, 400);
    assert!(body.contains("step"), "{body}");

    // The sensors and their latest readings.
    let (status, _, body) = get("/api/sensors".into());
    assert_eq!(status, 200, "{body}");
    let sensors = rows(&body);
    assert_eq!(sensors.len(), 1, "{body}");
    assert_eq!(sensors[0]["sensorId"], "a");
    assert_eq!(sensors[0]["fields"]["v"].as_f64(), Some(value(179)));
    assert_eq!(
        sensors[0]["fields"]["t"].as_f64(),
        Some(value(179)),
        "the reading whole"
    );
    // More sensors than asked for: the answer says it is cut.
    let (status, head, body) = http_get_with(port, "/api/sensors?limit=0", &[]);
    assert_eq!((status, body.trim()), (200, "[]"));
    assert!(
        head.to_ascii_lowercase()
            .contains("x-palletd-truncated: true"),
        "{head}"
    );

    // A late reading in the second hour, with no pass to compute its
    // rollup again (the closer runs once an hour): that hour is read from
    // the windows, the others from the rollup, and every reading counts.
    stack.stop();
    stack.config = stack.config.clone().closer("1h", "1s");
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    let mut publisher = stack.publisher().await;
    let late = serde_json::json!({ "ts": start + 90 * 60_000 + 30_000, "v": 100.0, "t": 100.0 });
    publisher.publish("api/a/telemetry", late.to_string()).await;
    publisher.flush().await;
    stack.all_acknowledged().await;
    stack.palletd.settled().await;
    assert_eq!(rolled_up(), rollups, "no pass ran");
    let (status, source, body) = get(format!("/api/series?sensor=a&field=v&step=1h&{range}"));
    assert_eq!(
        (status, source.as_deref()),
        (200, Some("rollup:1h+windows:1")),
        "{body}"
    );
    let got = rows(&body);
    let n: Vec<i64> = got.iter().map(|p| p["n"].as_i64().unwrap()).collect();
    assert_eq!(n, vec![60, 61, 60], "{body}");
    assert_eq!(got[1]["max"].as_f64(), Some(100.0));
    assert_eq!(
        got[1]["sum"].as_f64(),
        Some(rollups[1]["fields"]["v"]["sum"].as_f64().unwrap() + 100.0)
    );
    same(&got[..1], &rollups[..1], "start", 60, "v");
    same(&got[2..], &rollups[2..], "start", 60, "v");
    stack.stop();
}
