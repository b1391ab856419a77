//! The HTTP endpoint: `/` (the status page), `/metrics` (Prometheus text),
//! `/healthz` (the process runs) and `/readyz` (200 when ready, else 503
//! with the reason).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::status::{self, Figures, History};
use super::Health;

#[derive(Clone)]
struct HttpState {
    metrics: Option<PrometheusHandle>,
    health: Arc<Health>,
    history: Arc<History>,
    flush_bound: Duration,
}

/// Binds the HTTP endpoint; the returned future serves until `stop`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Option<PrometheusHandle>,
    health: Arc<Health>,
    history: Arc<History>,
    flush_bound: Duration,
    stop: CancellationToken,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(address = %listener.local_addr()?, "Serving the status page at /, /metrics, /healthz and /readyz.");
    let state = HttpState {
        metrics,
        health,
        history,
        flush_bound,
    };
    let app = axum::Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics_page))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    Ok(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            warn!(error = %e, "HTTP endpoint stopped.");
        }
    })
}

async fn metrics_page(
    State(s): State<HttpState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let body = s.metrics.as_ref().map(|m| m.render()).unwrap_or_default();
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
}

async fn status_page(
    State(s): State<HttpState>,
) -> (StatusCode, [(&'static str, &'static str); 2], String) {
    let figures = Figures::parse(&s.metrics.as_ref().map(|m| m.render()).unwrap_or_default());
    let facts = status::Facts {
        version: crate::VERSION,
        ready: s
            .health
            .ready(s.flush_bound)
            .map(|()| s.health.backlog_note()),
        broker_connected: s.health.broker_connected(),
        shared: s.health.shared_note(),
        database_reachable: s.health.database_reachable(),
        quiet: s.health.quiet(),
    };
    let page = status::render(&facts, &figures, &s.history, crate::clock::now_ms());
    (
        StatusCode::OK,
        [
            ("content-type", "text/html; charset=utf-8"),
            ("cache-control", "no-store"),
        ],
        page,
    )
}

async fn readyz(State(s): State<HttpState>) -> (StatusCode, String) {
    match s.health.ready(s.flush_bound) {
        Ok(()) => match s.health.backlog_note() {
            Some(note) => (StatusCode::OK, format!("ready; {note}\n")),
            None => (StatusCode::OK, "ready\n".into()),
        },
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}
