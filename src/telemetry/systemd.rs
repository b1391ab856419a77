//! The service manager: [`supervise`] probes the database once a second
//! (readiness), keeps the metrics upkeep going, and under systemd sends
//! `READY=1` once started, `STATUS=` with throughput or what palletd waits
//! for, and `WATCHDOG=1` while palletd is alive and making the progress it
//! can: the broker loop polled within the watchdog interval (messages are
//! taken and spooled) and the flush in progress, if any, is attempting a
//! database call or waiting for its next retry ([`Health::flush_alive`]).
//! A database that is down is reported (readiness, STATUS, metrics), not
//! treated as a hang: a day-long outage restarts nothing.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use super::Health;
use crate::clock::now_ms;

/// Probes the database every second (readiness), keeps the metrics
/// upkeep going, and talks to systemd. Runs until `stop`.
pub async fn supervise(
    db: mongodb::Database,
    health: Arc<Health>,
    metrics: Option<PrometheusHandle>,
    stop: CancellationToken,
) {
    let probe = async {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let ping = tokio::time::timeout(
                Duration::from_secs(2),
                db.run_command(bson::doc! { "ping": 1 }),
            )
            .await;
            health.set_database_reachable(matches!(ping, Ok(Ok(_))));
            if let Some(m) = &metrics {
                m.run_upkeep();
            }
        }
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = probe => {}
        _ = notify_systemd(&health) => {}
    }
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    }
}

/// `READY=1`, then `STATUS=` when it changes and `WATCHDOG=1` while the
/// pipeline makes progress. Does nothing outside systemd.
async fn notify_systemd(health: &Health) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return std::future::pending().await;
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    let watchdog = sd_notify::watchdog_enabled();
    // Pet at half the interval; check often enough for short intervals.
    let period = watchdog.map_or(Duration::from_secs(1), |w| {
        (w / 2).min(Duration::from_secs(1))
    });
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_stored = (health.stored(), std::time::Instant::now());
    let mut last_status = String::new();
    loop {
        tick.tick().await;
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
            format!("storing {rate:.0} samples/s")
        };
        if status != last_status {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&status)]);
            last_status = status;
        }
    }
}
