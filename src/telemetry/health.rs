//! [`Health`]: the few facts readiness, the watchdog and the STATUS line
//! need, written by the parts as plain atomics (no lock on the data path).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use crate::clock::now_ms;
use crate::front::session::Verdict;

const VERDICTS: [Verdict; 4] = [
    Verdict::Unneeded,
    Verdict::Pending,
    Verdict::Delivered,
    Verdict::NotDelivered,
];

/// Facts about the pipeline's progress, shared as atomics.
#[derive(Debug, Default)]
pub struct Health {
    /// One bit per MQTT connection palletd keeps open (`mqtt.connections`).
    connections: AtomicU64,
    /// The connections up, one bit each.
    broker_connected: AtomicU64,
    /// The connections whose subscriptions the broker acknowledged.
    subscribed: AtomicU64,
    /// Whether the broker delivers through shared subscriptions
    /// ([`Verdict`] as a number), and whether the group is palletd's own.
    shared: AtomicU8,
    shared_own: AtomicBool,
    database_reachable: AtomicBool,
    /// When the broker loop last returned from a poll (ms since epoch).
    ingest_beat_ms: AtomicI64,
    /// When the flush in progress started; 0 when none is.
    flush_started_ms: AtomicI64,
    /// Samples stored, for the STATUS line.
    stored: AtomicU64,
    /// When the database call in progress began; 0 when none is.
    db_attempt_ms: AtomicI64,
    /// When the next database attempt is due while a retry waits; 0 when
    /// none waits.
    db_retry_at_ms: AtomicI64,
    /// Readings of the backlog draining in the background, and the
    /// estimated seconds to drain it (`u64::MAX`: unknown).
    backlog_readings: AtomicU64,
    backlog_eta_secs: AtomicU64,
    /// The flush delay while the policy stretched it (ms; 0: not).
    stretched_delay_ms: AtomicU64,
    /// Spool writes or syncs are failing (nothing new is acknowledged).
    spool_failing: AtomicBool,
    /// Bytes of spooled dead letters written to MongoDB so far (by the
    /// pipeline; the admission's dead-letter share frees by them).
    deadletter_bytes_written: AtomicU64,
    /// Woken when the database answers again after it did not.
    database_back: tokio::sync::Notify,
    /// The sensors quiet the longest: (sensor, last reading ms), for the
    /// status page (kept by the admission every few seconds).
    quiet: std::sync::Mutex<Vec<(String, i64)>>,
}

fn bit(k: usize) -> u64 {
    if k < 64 {
        1 << k
    } else {
        0
    }
}

fn set_bit(bits: &AtomicU64, k: usize, on: bool) {
    if on {
        bits.fetch_or(bit(k), Ordering::Relaxed);
    } else {
        bits.fetch_and(!bit(k), Ordering::Relaxed);
    }
}

/// A database call running longer than this counts as stuck (the driver
/// gives up selecting a server within seconds; a large command over a slow
/// link may take a minute or two).
pub(crate) const ATTEMPT_BOUND: Duration = Duration::from_secs(300);

impl Health {
    pub(crate) fn set_deadletter_bytes_written(&self, bytes: u64) {
        self.deadletter_bytes_written
            .store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn deadletter_bytes_written(&self) -> u64 {
        self.deadletter_bytes_written.load(Ordering::Relaxed)
    }

    /// palletd keeps `n` MQTT connections open (indexes 0..n).
    pub(crate) fn set_connections(&self, n: usize) {
        let all = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
        self.connections.store(all, Ordering::Relaxed);
        self.gauge_connected();
    }

    /// Connection `k` is no longer kept (the broker has no shared
    /// subscriptions: the first connection alone goes on).
    pub(crate) fn drop_connection(&self, k: usize) {
        self.connections.fetch_and(!bit(k), Ordering::Relaxed);
        self.gauge_connected();
    }

    /// Connection `k` went up or down (down: not subscribed either).
    pub(crate) fn set_broker_connected(&self, k: usize, up: bool) {
        set_bit(&self.broker_connected, k, up);
        if !up {
            set_bit(&self.subscribed, k, false);
        }
        self.gauge_connected();
    }

    fn gauge_connected(&self) {
        metrics::gauge!(super::BROKER_CONNECTED).set(if self.broker_connected() {
            1.0
        } else {
            0.0
        });
        metrics::gauge!(super::BROKER_CONNECTIONS_UP).set(
            (self.broker_connected.load(Ordering::Relaxed)
                & self.connections.load(Ordering::Relaxed))
            .count_ones() as f64,
        );
    }

    /// Every connection kept is up.
    pub(crate) fn broker_connected(&self) -> bool {
        let all = self.connections.load(Ordering::Relaxed);
        all != 0 && self.broker_connected.load(Ordering::Relaxed) & all == all
    }

    /// The broker acknowledged connection `k`'s subscriptions (a
    /// persistent session that the broker kept counts as subscribed).
    pub(crate) fn set_subscribed(&self, k: usize, yes: bool) {
        set_bit(&self.subscribed, k, yes);
    }

    /// Whether the broker delivers through shared subscriptions, as seen
    /// so far; `own_group`: the group is palletd's own (without one it
    /// goes on unshared), else `mqtt.share_group`.
    pub(crate) fn set_shared(&self, verdict: Verdict, own_group: bool) {
        let at = VERDICTS.iter().position(|v| *v == verdict).unwrap_or(0);
        self.shared.store(at as u8, Ordering::Relaxed);
        self.shared_own.store(own_group, Ordering::Relaxed);
        for v in VERDICTS {
            metrics::gauge!(super::BROKER_SHARED, "state" => v.label()).set(if v == verdict {
                1.0
            } else {
                0.0
            });
        }
    }

    /// (Verdict, own group).
    pub(crate) fn shared(&self) -> (Verdict, bool) {
        let at = self.shared.load(Ordering::Relaxed) as usize;
        (
            VERDICTS.get(at).copied().unwrap_or(Verdict::Unneeded),
            self.shared_own.load(Ordering::Relaxed),
        )
    }

    /// What the status page says of shared subscriptions, if anything,
    /// and whether that is well.
    pub(crate) fn shared_note(&self) -> Option<(&'static str, bool)> {
        match self.shared() {
            (Verdict::Unneeded, _) => None,
            (Verdict::Pending, _) => {
                Some(("verifying that the broker delivers through $share", true))
            }
            (Verdict::Delivered, _) => Some(("delivered by the broker (verified)", true)),
            (Verdict::NotDelivered, true) => Some((
                "NOT delivered by the broker: one connection, unshared",
                false,
            )),
            (Verdict::NotDelivered, false) => Some((
                "NOT delivered by the broker: mqtt.share_group receives nothing",
                false,
            )),
        }
    }

    /// Every connection kept is subscribed.
    pub(crate) fn subscribed(&self) -> bool {
        let all = self.connections.load(Ordering::Relaxed);
        all != 0 && self.subscribed.load(Ordering::Relaxed) & all == all
    }

    pub(crate) fn set_database_reachable(&self, up: bool) {
        let was = self.database_reachable.swap(up, Ordering::Relaxed);
        if up && !was {
            self.database_back.notify_waiters();
        }
    }

    /// Resolves when the database answers again (a retry waiting out an
    /// outage goes at once, instead of at the end of its backoff).
    pub(crate) async fn database_back(&self) {
        self.database_back.notified().await;
    }

    pub(crate) fn database_reachable(&self) -> bool {
        self.database_reachable.load(Ordering::Relaxed)
    }

    pub(crate) fn ingest_beat(&self) {
        self.ingest_beat_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub(crate) fn flush_started(&self) {
        self.flush_started_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub(crate) fn flush_finished(&self, stored: u64) {
        self.flush_started_ms.store(0, Ordering::Relaxed);
        self.stored.fetch_add(stored, Ordering::Relaxed);
    }

    /// Samples stored since start.
    pub(crate) fn stored(&self) -> u64 {
        self.stored.load(Ordering::Relaxed)
    }

    /// A database call began (`true`) or ended.
    pub(crate) fn db_attempt(&self, running: bool) {
        let v = if running { now_ms() } else { 0 };
        self.db_attempt_ms.store(v, Ordering::Relaxed);
    }

    /// A failed call is retried after `delay`.
    pub(crate) fn db_retry_in(&self, delay: Duration) {
        self.db_retry_at_ms
            .store(now_ms() + delay.as_millis() as i64, Ordering::Relaxed);
    }

    /// The retry's wait is over.
    pub(crate) fn db_retried(&self) {
        self.db_retry_at_ms.store(0, Ordering::Relaxed);
    }

    /// Whether the pipeline makes the progress it can: no flush running, or
    /// the flush in progress is attempting a database call (for less than
    /// [`ATTEMPT_BOUND`]), waiting for its next retry (not overdue), or
    /// between the two. A database that is down is not a hang.
    pub(crate) fn flush_alive(&self, now_ms: i64) -> bool {
        if self.flush_running_for(now_ms).is_zero() {
            return true;
        }
        let attempt = self.db_attempt_ms.load(Ordering::Relaxed);
        if attempt > 0 {
            return now_ms - attempt < ATTEMPT_BOUND.as_millis() as i64;
        }
        let retry_at = self.db_retry_at_ms.load(Ordering::Relaxed);
        if retry_at > 0 {
            return now_ms <= retry_at + 5_000;
        }
        self.flush_running_for(now_ms) < ATTEMPT_BOUND
    }

    /// How long the flush in progress has been running.
    pub(crate) fn flush_running_for(&self, now_ms: i64) -> Duration {
        let started = self.flush_started_ms.load(Ordering::Relaxed);
        if started == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis((now_ms - started).max(0) as u64)
    }

    pub(crate) fn ingest_silent_for(&self, now_ms: i64) -> Duration {
        let beat = self.ingest_beat_ms.load(Ordering::Relaxed);
        Duration::from_millis((now_ms - beat).max(0) as u64)
    }

    pub(crate) fn set_backlog(&self, readings: u64, eta_secs: Option<u64>) {
        self.backlog_readings.store(readings, Ordering::Relaxed);
        self.backlog_eta_secs
            .store(eta_secs.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub(crate) fn set_spool_failing(&self, failing: bool) {
        self.spool_failing.store(failing, Ordering::Relaxed);
    }

    pub(crate) fn spool_failing(&self) -> bool {
        self.spool_failing.load(Ordering::Relaxed)
    }

    pub(crate) fn set_quiet(&self, quiet: Vec<(String, i64)>) {
        *self.quiet.lock().unwrap_or_else(|e| e.into_inner()) = quiet;
    }

    pub(crate) fn quiet(&self) -> Vec<(String, i64)> {
        self.quiet.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// "draining a backlog of N readings, about T left", while one drains.
    /// The flush delay in force, if the policy stretched it beyond
    /// `flush.max_delay`.
    pub(crate) fn set_stretched_delay(&self, delay: Option<Duration>) {
        let ms = delay.map_or(0, |d| d.as_millis() as u64);
        self.stretched_delay_ms.store(ms, Ordering::Relaxed);
    }

    /// For the STATUS line: the delay, while stretched.
    pub(crate) fn delay_note(&self) -> Option<String> {
        match self.stretched_delay_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(format!(
                "flush delay stretched to {} (the database is the bottleneck)",
                humantime::format_duration(Duration::from_secs(ms.div_ceil(1000)))
            )),
        }
    }

    pub(crate) fn backlog_note(&self) -> Option<String> {
        let readings = self.backlog_readings.load(Ordering::Relaxed);
        if readings == 0 {
            return None;
        }
        let left = match self.backlog_eta_secs.load(Ordering::Relaxed) {
            u64::MAX => "time left unknown".to_string(),
            secs => format!(
                "about {} left",
                humantime::format_duration(Duration::from_secs(secs))
            ),
        };
        Some(format!("draining a backlog of {readings} readings, {left}"))
    }

    /// Ready: the spool takes writes, connected and subscribed to the
    /// broker, the database answers, and no flush has been stuck for longer
    /// than `flush_bound`.
    pub(crate) fn ready(&self, flush_bound: Duration) -> Result<(), &'static str> {
        if self.spool_failing() {
            return Err("spool writes failing (disk full or failing): nothing new is acknowledged");
        }
        if !self.broker_connected() {
            return Err("not connected to the MQTT broker (on every connection)");
        }
        if self.shared() == (Verdict::NotDelivered, false) {
            return Err("the broker does not deliver through shared subscriptions (mqtt.share_group): nothing reaches palletd");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retrying_flush_is_alive_and_a_stuck_one_is_not() {
        let h = Health::default();
        let now = now_ms();
        assert!(h.flush_alive(now), "no flush running");
        h.flush_started();
        h.db_attempt(true);
        assert!(h.flush_alive(now + 60_000), "an attempt of a minute");
        assert!(
            !h.flush_alive(now + ATTEMPT_BOUND.as_millis() as i64 + 1000),
            "an attempt that never returns"
        );
        h.db_attempt(false);
        h.db_retry_in(Duration::from_secs(30));
        assert!(h.flush_alive(now + 30_000), "waiting for its next retry");
        assert!(!h.flush_alive(now + 60_000), "a retry long overdue");
        h.db_retried();
        h.flush_finished(1);
        assert!(h.flush_alive(now + 3_600_000));
    }
}
