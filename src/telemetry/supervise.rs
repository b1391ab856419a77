//! The watchers beside the tasks: [`supervise`] probes the database once a
//! second (readiness), keeps the metrics upkeep going, watches the clock's
//! synchronisation and starts the systemd notifier ([`super::systemd`]).

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use super::Health;

/// Whether the kernel says the system clock is synchronised (NTP): the
/// `adjtimex` status, read only. Under the unit's `ProtectClock=` that call
/// is refused; then the flag file systemd-timesyncd keeps tells. `None`:
/// palletd cannot tell.
pub fn clock_synchronized() -> Option<bool> {
    // SAFETY: a zeroed timex with modes = 0 only reads the kernel's state.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state >= 0 {
        return Some(state != libc::TIME_ERROR && tx.status & libc::STA_UNSYNC == 0);
    }
    if std::path::Path::new("/run/systemd/timesync/synchronized").exists() {
        return Some(true);
    }
    None
}

/// Logs whether the clock is synchronised and keeps its gauge (every
/// minute): readings without a timestamp of their own are stamped with it.
async fn watch_clock() {
    let mut was = None;
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        let now = clock_synchronized();
        if let Some(synced) = now {
            metrics::gauge!(super::CLOCK_SYNCHRONIZED).set(if synced { 1.0 } else { 0.0 });
        }
        if now != was {
            match now {
                Some(true) => tracing::info!("The system clock is synchronised."),
                Some(false) => tracing::warn!(
                    "The system clock is not synchronised (NTP): readings without a timestamp of their own are stamped with it and may carry the wrong time until it is."
                ),
                None => tracing::info!("Cannot tell whether the system clock is synchronised."),
            }
            was = now;
        }
    }
}

/// Probes the database every second (readiness), keeps the metrics
/// upkeep going, watches the clock and talks to systemd. Runs until
/// `stop`.
pub(crate) async fn supervise(
    db: mongodb::Database,
    health: Arc<Health>,
    metrics: Option<PrometheusHandle>,
    flush_bound: Duration,
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
            let ready = health.ready(flush_bound).is_ok();
            metrics::gauge!(super::READY).set(if ready { 1.0 } else { 0.0 });
            if let Some(m) = &metrics {
                m.run_upkeep();
            }
        }
    };
    // systemd's notify socket is written with a blocking send: on its own
    // thread, so a slow reader never stalls the runtime.
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let (health, stop) = (health.clone(), stop.clone());
        let spawned = std::thread::Builder::new()
            .name("palletd-systemd".into())
            .spawn(move || super::systemd::notify_systemd(&health, &stop));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "Cannot start the systemd notifier; no watchdog pets.");
        }
    }
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = probe => {}
        _ = watch_clock() => {}
    }
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    }
}
