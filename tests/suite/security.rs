//! The secure paths against the real services: Mosquitto with TLS (a test
//! CA made here with rcgen) and a password file, SecantusDB with SCRAM
//! authentication, secrets kept out of every output, a flood of
//! sensor ids against `limits.max_sensors`, and 2,000 idle connections to
//! the HTTP endpoint of a palletd with 256 file descriptors, and the
//! endpoint's credentials.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

struct Pki {
    ca: PathBuf,
    other_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A CA, a server certificate for "localhost" signed by it, and an
/// unrelated CA.
fn make_pki(dir: &Path) -> Pki {
    let ca = |name: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        (params, key, cert)
    };
    let (ca_params, ca_key, ca_cert) = ca("palletd test CA");
    let (_, _, other_cert) = ca("some other CA");
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server_params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();
    let pki = Pki {
        ca: write_file(dir, "ca.pem", &ca_cert.pem()),
        other_ca: write_file(dir, "other-ca.pem", &other_cert.pem()),
        cert: write_file(dir, "server.pem", &server_cert.pem()),
        key: write_file(dir, "server.key", &server_key.serialize_pem()),
    };
    // Mosquitto runs as whoever starts it; keep its key readable.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pki.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    pki
}

const MQTT_PASSWORD: &str = "Mq77-s3cret-Pa55";
const DB_PASSWORD: &str = "Db-s3cret-Pa55-word";

/// A broker requiring TLS and a password (user "palletd").
fn secure_broker(dir: &Path) -> (Broker, Pki) {
    let pki = make_pki(dir);
    let passwd = dir.join("passwd");
    std::fs::write(&passwd, "").unwrap();
    let status = Command::new("mosquitto_passwd")
        .args(["-b"])
        .arg(&passwd)
        .args(["palletd", MQTT_PASSWORD])
        .status()
        .unwrap_or_else(|e| panic!("mosquitto_passwd: {e}; {INSTALL_HINT}"));
    assert!(status.success());
    let extra = format!(
        "allow_anonymous false\npassword_file {}\ncafile {}\ncertfile {}\nkeyfile {}\n",
        passwd.display(),
        pki.ca.display(),
        pki.cert.display(),
        pki.key.display()
    );
    (Broker::start_with(&extra), pki)
}

fn tls_config(
    broker: &Broker,
    db: &Database,
    database: &str,
    ca: &Path,
    password_file: &Path,
) -> Config {
    Config::new(broker, db, database)
        .set("mqtt.url", format!("mqtts://127.0.0.1:{}", broker.port))
        .set("mqtt.username", "palletd")
        .set("mqtt.password_file", password_file.display().to_string())
        .set("mqtt.tls.ca_file", ca.display().to_string())
        .set("mqtt.tls.server_name", "localhost")
}

/// A TLS publisher that trusts `ca`.
async fn tls_publisher(broker: &Broker, ca: &Path) -> rumqttc::AsyncClient {
    let mut opts = rumqttc::MqttOptions::new("pub-tls", "localhost", broker.port);
    opts.set_credentials("palletd", MQTT_PASSWORD);
    let settings = palletd::config::MqttTls {
        ca_file: Some(ca.to_path_buf()),
        ..Default::default()
    };
    let config = palletd::internals::mqtt_tls_client_config(&settings).unwrap();
    opts.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
        std::sync::Arc::new(config),
    )));
    let (client, mut eventloop) = rumqttc::AsyncClient::new(opts, 100);
    tokio::spawn(async move {
        loop {
            if eventloop.poll().await.is_err() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_password_store_readings_and_wrong_ca_or_password_keep_retrying() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, pki) = secure_broker(dir.path());
    let db = Database::start();
    let pw = write_file(dir.path(), "mqtt-password", MQTT_PASSWORD);

    // Right CA, right password: readings arrive.
    let cfg = tls_config(&broker, &db, "tls", &pki.ca, &pw);
    twenty_readings_over_tls(&cfg, &broker, &db, &pki.ca).await;

    // The wrong CA: a clear TLS error, retried, no crash.
    let cfg = tls_config(&broker, &db, "tls", &pki.other_ca, &pw);
    let mut palletd = Palletd::start(&cfg);
    palletd
        .wait_for_log("MQTT connection lost or refused", Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = palletd.log();
    assert!(log.contains("TLS") || log.contains("certificate"), "{log}");
    assert!(palletd.running(), "still running, retrying");
    assert!(!log.contains("Subscribed."), "{log}");
    assert_eq!(palletd.terminate(), Some(0));

    // The wrong password: refused, retried, no crash.
    let wrong = write_file(dir.path(), "wrong-password", "not-it");
    let cfg = tls_config(&broker, &db, "tls", &pki.ca, &wrong);
    let mut palletd = Palletd::start(&cfg);
    palletd
        .wait_for_log("broker refused the connection", Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(palletd.running(), "still running, retrying");
    assert_eq!(palletd.terminate(), Some(0));
}

/// palletd started with `cfg` (TLS, a password) stores 20 readings a TLS
/// publisher sends, then stops.
async fn twenty_readings_over_tls(cfg: &Config, broker: &Broker, db: &Database, ca: &Path) {
    let mut palletd = Palletd::start(cfg);
    palletd.ready().await;
    let publisher = tls_publisher(broker, ca).await;
    for seq in 0..20 {
        publisher
            .publish(
                "sensors/t1/telemetry",
                rumqttc::QoS::AtLeastOnce,
                false,
                format!("{{\"seq\": {seq}}}"),
            )
            .await
            .unwrap();
    }
    let client = db.client().await;
    let database = cfg.database();
    eventually(Duration::from_secs(30), "20 readings over TLS", || async {
        stored_samples(&client, &database).await == 20
    })
    .await;
    assert_eq!(palletd.terminate(), Some(0));
}

/// MQTT 5 over TLS with a password: readings arrive; a wrong password is
/// refused with the v5 reason code in the log, and retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_over_tls_with_a_password_stores_readings_and_names_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, pki) = secure_broker(dir.path());
    let db = Database::start();
    let pw = write_file(dir.path(), "mqtt-password", MQTT_PASSWORD);
    let cfg = tls_config(&broker, &db, "tls5", &pki.ca, &pw).set("mqtt.protocol", "5");
    twenty_readings_over_tls(&cfg, &broker, &db, &pki.ca).await;

    let wrong = write_file(dir.path(), "wrong-password", "not-it");
    let cfg = tls_config(&broker, &db, "tls5", &pki.ca, &wrong).set("mqtt.protocol", "5");
    let mut palletd = Palletd::start(&cfg);
    palletd
        .wait_for_log("broker refused the connection", Duration::from_secs(30))
        .await;
    let log = palletd.log();
    assert!(
        log.contains("NotAuthorized") || log.contains("BadUserNamePassword"),
        "the v5 reason code is named: {log}"
    );
    assert!(palletd.running(), "still running, retrying");
    assert_eq!(palletd.terminate(), Some(0));
}

/// A SecantusDB server with SCRAM authentication and one user.
async fn auth_database() -> (Database, String) {
    let db = Database::start_with_args(&["--auth"]);
    // The localhost exception lets the first user be created.
    let client = db.client().await;
    client
        .database("admin")
        .run_command(bson::doc! { "createUser": "palletd", "pwd": DB_PASSWORD, "roles": ["root"] })
        .await
        .expect("createUser");
    let uri = format!(
        "mongodb://palletd:{DB_PASSWORD}@127.0.0.1:{}/?directConnection=true&authSource=admin",
        db.port
    );
    (db, uri)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_credentials_from_uri_file_work_and_no_secret_is_ever_printed() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, pki) = secure_broker(dir.path());
    let (db, uri) = auth_database().await;
    let uri_file = write_file(dir.path(), "mongodb-uri", &uri);
    let pw = write_file(dir.path(), "mqtt-password", MQTT_PASSWORD);
    let cfg = tls_config(&broker, &db, "authdb", &pki.ca, &pw)
        .unset("mongodb.uri")
        .set("mongodb.uri_file", uri_file.display().to_string());
    let text = cfg.toml();
    assert!(!text.contains(DB_PASSWORD) && !text.contains(MQTT_PASSWORD));

    let trace = Run {
        log: Some("trace"),
        ..Run::default()
    };
    let mut palletd = Palletd::start_with(&cfg, trace);
    palletd.ready().await;
    let publisher = tls_publisher(&broker, &pki.ca).await;
    for seq in 0..10 {
        publisher
            .publish(
                "sensors/a1/telemetry",
                rumqttc::QoS::AtLeastOnce,
                false,
                format!("{{\"seq\": {seq}}}"),
            )
            .await
            .unwrap();
    }
    let authed = mongodb::Client::with_uri_str(&uri).await.unwrap();
    eventually(
        Duration::from_secs(30),
        "10 readings with SCRAM auth",
        || async { stored_samples(&authed, "authdb").await == 10 },
    )
    .await;
    assert_eq!(palletd.terminate(), Some(0));

    // Wrong database password: a clear error, retrying, the password never shown.
    let bad_uri = uri.replace(DB_PASSWORD, "Wr0ng-db-pa55");
    std::fs::write(&uri_file, &bad_uri).unwrap();
    let mut bad = Palletd::start_with(
        &cfg,
        Run {
            log: Some("trace"),
            ..Run::default()
        },
    );
    bad.wait_metric("palletd_database_errors_total", 1.0).await;
    bad.wait_for_log("holding the data and retrying", Duration::from_secs(30))
        .await;
    assert!(bad.log().contains("uthentication"), "{}", bad.log());
    assert_eq!(bad.terminate(), Some(0));

    // check-config output and errors.
    let cfg_path = write_file(dir.path(), "palletd.toml", &text);
    let check = Command::new(env!("CARGO_BIN_EXE_palletd"))
        .args(["check-config", "--config"])
        .arg(&cfg_path)
        .output()
        .unwrap();
    let broken = write_file(
        dir.path(),
        "broken.toml",
        &cfg.clone().set("mongodb.password", DB_PASSWORD).toml(),
    );
    let broken_check = Command::new(env!("CARGO_BIN_EXE_palletd"))
        .args(["check-config", "--config"])
        .arg(&broken)
        .output()
        .unwrap();
    assert_eq!(broken_check.status.code(), Some(78));
    let outputs = [
        palletd.log(),
        bad.log(),
        String::from_utf8_lossy(&check.stdout).to_string(),
        String::from_utf8_lossy(&check.stderr).to_string(),
        String::from_utf8_lossy(&broken_check.stdout).to_string(),
        String::from_utf8_lossy(&broken_check.stderr).to_string(),
    ];
    for out in &outputs {
        for secret in [MQTT_PASSWORD, DB_PASSWORD, "Wr0ng-db-pa55"] {
            assert!(!out.contains(secret), "a secret leaked into:\n{out}");
        }
    }
    // The world-readable secrets were pointed out.
    let check_out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check_out.contains("mqtt.password_file") && check_out.contains("readable by every user"),
        "{check_out}"
    );
}

/// Peak resident memory of a process, in kB.
fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_sensor_ids_is_dead_lettered_beyond_the_limit() {
    let broker = Broker::start_with("max_inflight_messages 1000\nmax_queued_messages 200000\n");
    let db = Database::start();
    let cfg = Config::new(&broker, &db, "flood").set("limits.max_sensors", 10000);
    let mut palletd = Palletd::start_with(
        &cfg,
        Run {
            log: Some("info"),
            ..Run::default()
        },
    );
    palletd.ready().await;
    let mut publisher = Publisher::connect(&broker, "pub-flood").await;
    let client = db.client().await;
    let handled = |client: mongodb::Client| async move {
        let stored = stored_samples(&client, "flood").await;
        let dead = client
            .database("flood")
            .collection::<bson::Document>("readings_deadletter")
            .count_documents(bson::doc! {})
            .await
            .unwrap() as usize;
        stored + dead
    };
    // In chunks of 10,000, each handled before the next: a flood of new ids
    // at the rate palletd takes them.
    for chunk in 0..10 {
        for i in chunk * 10_000..(chunk + 1) * 10_000 {
            publisher
                .publish(
                    &format!("sensors/s{i:06}/telemetry"),
                    format!("{{\"v\": {i}}}"),
                )
                .await;
        }
        publisher.flush().await;
        let want = (chunk + 1) * 10_000;
        eventually(
            Duration::from_secs(120),
            "the chunk is stored or dead-lettered",
            || {
                let client = client.clone();
                async move { handled(client).await >= want }
            },
        )
        .await;
    }
    palletd.settled().await;
    let stored = stored_samples(&client, "flood").await;
    let dead = client
        .database("flood")
        .collection::<bson::Document>("readings_deadletter")
        .count_documents(bson::doc! { "cause": "too_many_sensors" })
        .await
        .unwrap();
    let sensors: std::collections::BTreeSet<String> = all_docs(&client, "flood", "readings")
        .await
        .iter()
        .map(|b| b.get_str("sensorId").unwrap().to_string())
        .collect();
    assert_eq!(
        (stored, sensors.len()),
        (10_000, 10_000),
        "the first 10,000 sensors are stored, once each:\n{}",
        palletd
            .log()
            .lines()
            .filter(|l| !l.contains("dead letter") && !l.contains("Could not queue"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        dead,
        90_000,
        "the excess is dead-lettered:\n{}",
        palletd
            .log()
            .lines()
            .filter(|l| !l.contains("dead letter"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let rss_mb = peak_rss_kb(palletd.child.id()) / 1024;
    eprintln!("palletd peak RSS with 100,000 sensor ids: {rss_mb} MB");
    assert!(rss_mb < 400, "memory stays bounded: {rss_mb} MB");
    assert_eq!(palletd.terminate(), Some(0));
}

/// Raises this process's soft limit of open files to `n` (within the hard
/// limit), for a test that holds many connections.
fn raise_own_fd_limit(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert!(
        lim.rlim_max >= n,
        "the hard limit of open files is {}: this test holds {n}",
        lim.rlim_max
    );
    lim.rlim_cur = lim.rlim_cur.max(n);
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
}

/// palletd's open file descriptors.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// 2,000 connections to the status page's port, opened and held without
/// a request while readings flow, against a palletd allowed 256 file
/// descriptors (`prlimit`) whose small spool opens segment after segment:
/// every reading is stored once and acknowledged, palletd never holds more
/// than its 64 HTTP connections, and it closes even those once they sent
/// no request for the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http_connections_do_not_stop_acknowledgements() {
    raise_own_fd_limit(4096);
    let mut stack = Stack::start("http-idle", |c| c.set("spool.max_size", "256KiB")).await;
    stack.palletd.kill();
    let run = Run {
        under: &["prlimit", "--nofile=256:256", "--"],
        ..Run::default()
    };
    stack.palletd = Palletd::start_with(&stack.config, run);
    stack.palletd.ready().await;
    let pid = stack.palletd.child.id();
    let at_rest = open_fds(pid);

    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], stack.palletd.http_port));
    let mut held = Vec::new();
    let mut failed = 0;
    for _ in 0..2000 {
        // Without the bound, palletd stops accepting at its limit and the
        // kernel's queue fills: then connects time out (ten in a row end
        // the loop).
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(s) => {
                s.set_nonblocking(true).unwrap();
                held.push(s);
                failed = 0;
            }
            Err(_) if failed == 10 => break,
            Err(_) => failed += 1,
        }
    }
    let held_at_most = held.len();
    let stream = tokio::spawn(publish_steadily(stack.publisher().await, 20, 200.0, 3000));
    let mut most = 0;
    while !stream.is_finished() {
        most = most.max(open_fds(pid));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = stream.await.unwrap();
    assert_exactly_once(&stack.client, "http-idle", &sent, Duration::from_secs(60)).await;
    stack.all_acknowledged().await;
    assert!(
        most <= at_rest + 64 + 8,
        "palletd held {most} file descriptors ({at_rest} at rest) with 2,000 connections waiting"
    );
    // Every held connection ends: closed at once, or after the header
    // timeout.
    eventually(
        Duration::from_secs(30),
        "palletd closed every idle HTTP connection",
        || {
            use std::io::Read;
            // Open: nothing to read yet; ended: end of file or reset.
            held.retain_mut(|s| {
                matches!(s.read(&mut [0u8; 1]), Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock)
            });
            let open = held.len();
            async move { open == 0 }
        },
    )
    .await;
    let refused = stack
        .palletd
        .metric("palletd_http_connections_refused_total", None);
    // Most were closed as accepted (64 at a time were served, more than
    // once while the header timeout freed their places).
    assert!(
        refused >= 1000.0 && refused <= held_at_most as f64,
        "refused {refused} of {held_at_most}"
    );
    stack.palletd.ready().await;
    stack.stop();
}

/// `[http]` credentials: the status page and `/metrics` answer 401 without
/// them or with wrong ones, 200 with the Basic pair or the bearer token
/// (each from a file of its own); `/healthz` and `/readyz` stay open, and
/// readings flow as before.
#[tokio::test]
async fn http_credentials_guard_the_page_and_metrics_but_not_the_probes() {
    use std::os::unix::fs::PermissionsExt;
    let secrets = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let p = write_file(secrets.path(), name, text);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p.to_str().unwrap().to_string()
    };
    let password = file("http.password", "correct horse\n");
    let token = file("http.token", "t0ken-8f3a\n");
    let mut stack = Stack::start("http-auth", |c| {
        c.set("http.username", "ops")
            .set("http.password_file", password.as_str())
            .set("http.token_file", token.as_str())
    })
    .await;
    let port = stack.palletd.http_port;
    let basic = |pair: &str| {
        use base64::Engine;
        format!(
            "Authorization: Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    };
    let refused = [
        vec![],
        vec![basic("ops:wrong")],
        vec![basic("ops:correct horse\n")],
        vec![basic("ops2:correct horse")],
        vec!["Authorization: Bearer t0ken".to_string()],
        vec!["Authorization: Bearer t0ken-8f3ax".to_string()],
        vec!["Authorization: Token t0ken-8f3a".to_string()],
        vec!["Authorization: Basic t0ken-8f3a".to_string()],
    ];
    let paths = [
        "/",
        "/?sensor=a&range=week",
        "/metrics",
        "/api/sensors",
        "/api/fields?sensor=a",
        "/api/series?sensor=a",
    ];
    for path in paths {
        for headers in &refused {
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            let (status, head, body) = http_get_with(port, path, &headers);
            assert_eq!(status, 401, "{path} with {headers:?}: {head}\n{body}");
            assert!(
                head.to_ascii_lowercase()
                    .contains("www-authenticate: basic realm=\"palletd\""),
                "{head}"
            );
            assert!(!body.contains("palletd_"), "{body}");
        }
    }
    let good_basic = basic("ops:correct horse");
    let (status, _, page) = http_get_with(port, "/", &[&good_basic]);
    assert_eq!(status, 200);
    let (status, _, sensors) = http_get_with(port, "/api/sensors", &[&good_basic]);
    assert_eq!((status, sensors.starts_with('[')), (200, true), "{sensors}");
    assert!(page.contains("<html"), "{page}");
    // The scheme's case does not matter (RFC 9110).
    let (status, _, metrics) =
        http_get_with(port, "/metrics", &["Authorization: bearer t0ken-8f3a"]);
    assert_eq!(status, 200);
    let lines = metrics.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    assert_eq!(
        common::metric(&scrape, "palletd_http_unauthorized_total", None),
        (paths.len() * refused.len()) as f64
    );
    for probe in ["/healthz", "/readyz"] {
        assert_eq!(http_get(port, probe).0, 200, "{probe}");
    }
    let sent = publish_steadily(stack.publisher().await, 5, 50.0, 100).await;
    assert_exactly_once(&stack.client, "http-auth", &sent, Duration::from_secs(60)).await;
    stack.stop();
}
