//! The service manager: under systemd, `READY=1` once started, `STATUS=`
//! with throughput or what palletd waits for, and `WATCHDOG=1` while
//! palletd is alive and making the progress it can: the broker loop polled
//! within the watchdog interval (messages are taken and spooled) and the
//! flush in progress, if any, is attempting a database call or waiting for
//! its next retry ([`Health::flush_alive`]). A database that is down is
//! reported (readiness, STATUS, metrics), not treated as a hang: a
//! day-long outage restarts nothing. Started by
//! [`super::supervise::supervise`].

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Health;
use crate::clock::now_ms;

/// `READY=1`, then `STATUS=` when it changes and `WATCHDOG=1` while the
/// pipeline makes progress, until `stop` is cancelled. Runs on its own
/// thread.
pub(super) fn notify_systemd(health: &Health, stop: &CancellationToken) {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    let watchdog = sd_notify::watchdog_enabled();
    // Pet at half the interval; check often enough for short intervals.
    let period = watchdog.map_or(Duration::from_secs(1), |w| {
        (w / 2).min(Duration::from_secs(1))
    });
    let mut last_stored = (health.stored(), std::time::Instant::now());
    let mut last_status = String::new();
    loop {
        std::thread::sleep(period);
        if stop.is_cancelled() {
            return;
        }
        let now = now_ms();
        if let Some(interval) = watchdog {
            if health.ingest_silent_for(now) < interval && health.flush_alive(now) {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
            }
        }
        if last_stored.1.elapsed() < Duration::from_secs(5) && !last_status.is_empty() {
            continue;
        }
        let stored = health.stored();
        let rate =
            (stored - last_stored.0) as f64 / last_stored.1.elapsed().as_secs_f64().max(0.001);
        last_stored = (stored, std::time::Instant::now());
        let status = if !health.broker_connected() {
            "waiting for the MQTT broker".to_string()
        } else if !health.database_reachable() {
            "waiting for the database (readings are spooled and acknowledged)".to_string()
        } else {
            let notes: Vec<String> = [health.delay_note(), health.backlog_note()]
                .into_iter()
                .flatten()
                .collect();
            match notes.is_empty() {
                true => format!("storing {rate:.0} samples/s"),
                false => format!("storing {rate:.0} samples/s; {}", notes.join("; ")),
            }
        };
        if status != last_status {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&status)]);
            last_status = status;
        }
    }
}
