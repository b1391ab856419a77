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
mod stack;

pub use checks::*;
pub use config::*;
pub use data::*;
pub use disk::*;
pub use palletd::testkit::*;
pub use process::*;
pub use proxy::*;
pub use publisher::*;
pub use stack::*;

use std::collections::HashMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use futures_util::TryStreamExt;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};

pub const HOUR_MS: i64 = 3_600_000;

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
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
