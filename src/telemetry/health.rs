//! [`Health`]: the few facts readiness, the watchdog and the STATUS line
//! need, written by the parts as plain atomics (no lock on the data path).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::now_ms;

/// Facts about the pipeline's progress, shared as atomics.
#[derive(Debug, Default)]
pub struct Health {
    broker_connected: AtomicBool,
    /// The broker acknowledged every subscription on this connection.
    subscribed: AtomicBool,
    database_reachable: AtomicBool,
    /// When the broker loop last returned from a poll (ms since epoch).
    ingest_beat_ms: AtomicI64,
    /// When the flush in progress started; 0 when none is.
    flush_started_ms: AtomicI64,
    /// Samples stored, for the STATUS line.
    stored: AtomicU64,
}

impl Health {
    pub fn set_broker_connected(&self, up: bool) {
        self.broker_connected.store(up, Ordering::Relaxed);
        if !up {
            self.subscribed.store(false, Ordering::Relaxed);
        }
        metrics::gauge!(super::BROKER_CONNECTED).set(if up { 1.0 } else { 0.0 });
    }

    pub fn broker_connected(&self) -> bool {
        self.broker_connected.load(Ordering::Relaxed)
    }

    /// The broker acknowledged the subscriptions (a persistent session that
    /// the broker kept counts as subscribed).
    pub fn set_subscribed(&self, yes: bool) {
        self.subscribed.store(yes, Ordering::Relaxed);
    }

    pub fn subscribed(&self) -> bool {
        self.subscribed.load(Ordering::Relaxed)
    }

    pub fn set_database_reachable(&self, up: bool) {
        self.database_reachable.store(up, Ordering::Relaxed);
    }

    pub fn database_reachable(&self) -> bool {
        self.database_reachable.load(Ordering::Relaxed)
    }

    pub fn ingest_beat(&self) {
        self.ingest_beat_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn flush_started(&self) {
        self.flush_started_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn flush_finished(&self, stored: u64) {
        self.flush_started_ms.store(0, Ordering::Relaxed);
        self.stored.fetch_add(stored, Ordering::Relaxed);
    }

    /// Samples stored since start.
    pub fn stored(&self) -> u64 {
        self.stored.load(Ordering::Relaxed)
    }

    /// How long the flush in progress has been running.
    pub fn flush_running_for(&self, now_ms: i64) -> Duration {
        let started = self.flush_started_ms.load(Ordering::Relaxed);
        if started == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis((now_ms - started).max(0) as u64)
    }

    pub fn ingest_silent_for(&self, now_ms: i64) -> Duration {
        let beat = self.ingest_beat_ms.load(Ordering::Relaxed);
        Duration::from_millis((now_ms - beat).max(0) as u64)
    }

    /// Ready: connected and subscribed to the broker, the database answers,
    /// and no flush has been stuck for longer than `flush_bound`.
    pub fn ready(&self, flush_bound: Duration) -> Result<(), &'static str> {
        if !self.broker_connected() {
            return Err("not connected to the MQTT broker");
        }
        if !self.subscribed() {
            return Err("waiting for the broker to acknowledge the subscriptions");
        }
        if !self.database_reachable() {
            return Err("database unreachable");
        }
        if self.flush_running_for(now_ms()) > flush_bound {
            return Err("a flush has not succeeded within the bound");
        }
        Ok(())
    }
}
