//! Test harness: a real Mosquitto and a real SecantusDB server per test, on
//! free ports with their own temporary directories, palletd as a child
//! process configured with a typed [`Config`] builder, and helpers that
//! wait for what can be observed (`/readyz`, `/metrics`, stored documents,
//! the broker's `$SYS` counters) and read the stored buckets back.
//!
//! [`Stack::start`] brings broker, database and palletd up together.
//! A missing service binary fails the test with the command that installs it
//! (`scripts/install-test-services` does both).

mod checks;
mod config;
mod data;
mod disk;
mod process;
mod proxy;
mod publisher;
mod services;
mod stack;

pub use checks::*;
pub use config::*;
pub use data::*;
pub use disk::*;
pub use process::*;
pub use proxy::*;
pub use publisher::*;
pub use services::*;
pub use stack::*;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use futures_util::TryStreamExt;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};

pub const INSTALL_HINT: &str = "run `scripts/install-test-services` (installs Mosquitto, libfiu's fiu-utils, Chromium, promtool, lintian and Node.js from Debian, aedes, @grafana/schema and TypeScript from npm, statsmodels' datasets from PyPI and SecantusDB from crates.io)";

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

/// Polls until `f` returns true, or panics with `what` after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    poll_until(within, f, || what.to_string()).await;
}

/// The one poller every wait goes through: `f` every 50 ms until it is
/// true, or a panic naming what was waited for (`what`, made only then)
/// after `within`.
pub async fn poll_until<F, Fut>(within: Duration, mut f: F, what: impl FnOnce() -> String)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if f().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting for {}", what());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A plain HTTP/1.0 GET on 127.0.0.1: (status, body); status 0 when
/// nothing listens.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    let (status, _, body) = http_get_with(port, path, &[]);
    (status, body)
}

/// [`http_get`] with extra header lines (`"Authorization: ..."`):
/// (status, the response's header lines, body).
pub fn http_get_with(port: u16, path: &str, headers: &[&str]) -> (u16, String, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new(), String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    for h in headers {
        request.push_str(&format!("{h}\r\n"));
    }
    write!(stream, "{request}\r\n").unwrap();
    let mut text = String::new();
    if stream.read_to_string(&mut text).is_err() {
        return (0, String::new(), String::new());
    }
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_string(), body.to_string())
}

pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}
