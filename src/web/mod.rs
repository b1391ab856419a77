//! The HTTP endpoint: `/` (the status page), `/metrics` (Prometheus text),
//! `/api/sensors` and `/api/series` (what is stored, [`api`]),
//! `/healthz` (the process runs) and `/readyz` (200 when ready, else 503
//! with the reason).
//!
//! Bounded, so that no client can take what palletd needs to acknowledge
//! readings (a file descriptor for the next spool segment, the broker's
//! connection): at most [`MAX_CONNECTIONS`] at once (one more is closed as
//! soon as it is accepted, counted in
//! `palletd_http_connections_refused_total`), a request's headers within
//! [`HEADER_TIMEOUT`] of the connection or of the previous response (an
//! idle connection is closed then), and a connection for at most
//! [`CONNECTION_LIFETIME`] in all.
//!
//! With `[http]` credentials (a username and password for HTTP Basic, a
//! token for `Authorization: Bearer`, or both, either passing), `/`,
//! `/metrics` and `/api/` answer 401 without them; `/healthz` and `/readyz` stay open
//! for probes (they tell only whether palletd runs and is ready, and why
//! not). Refusals are counted in `palletd_http_unauthorized_total`. The
//! comparison is of SHA-256 digests, so its time does not tell how much of
//! a guess was right. Credentials cross the link in clear text: put a TLS
//! proxy in front when the endpoint is reachable beyond the box.

pub(crate) mod api;
mod sensor;
pub(crate) mod status;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::status::{Figures, History};
use crate::config::HttpAuth;
use crate::telemetry::Health;

/// Connections served at once; a scraper and a few browsers need a handful.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// How long a connection may take to send a request's headers, from when
/// it opened or the previous response went out.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may stay open in all (a client that does not
/// read the page it asked for).
pub(crate) const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// What the endpoint serves from.
#[derive(Clone)]
pub struct Pages {
    pub metrics: Option<PrometheusHandle>,
    pub health: Arc<Health>,
    pub history: Arc<History>,
    /// How long a flush may take before `/readyz` says so.
    pub flush_bound: Duration,
    /// The series API's reader (`None`: no `/api/`).
    pub api: Option<Arc<api::Api>>,
}

/// Binds the HTTP endpoint; the returned future serves until `stop`.
pub async fn serve(
    addr: SocketAddr,
    auth: &HttpAuth,
    state: Pages,
    stop: CancellationToken,
) -> std::io::Result<impl std::future::Future<Output = ()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(address = %listener.local_addr()?, "Serving the status page at /, /metrics, /api/, /healthz and /readyz.");
    let mut private = axum::Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(metrics_page));
    if let Some(api) = state.api.clone() {
        private = private.merge(
            axum::Router::new()
                .route("/api/sensors", get(api::sensors))
                .route("/api/fields", get(api::fields))
                .route("/api/series", get(api::series))
                .with_state(api),
        );
    }
    if auth.required() {
        let check = Arc::new(Credentials::new(auth));
        private = private.route_layer(axum::middleware::from_fn_with_state(check, authorize));
    }
    let app = private
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    Ok(accept(listener, app, stop))
}

/// Accepts connections until `stop`, each served in a task of its own
/// within the bounds above.
async fn accept(listener: tokio::net::TcpListener, app: axum::Router, stop: CancellationToken) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut warned: Option<std::time::Instant> = None;
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, most likely: let some go first
                // (logged at most once a minute, as refusals are).
                if warned.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                    warn!(error = %e, "The HTTP endpoint cannot accept a connection; trying again every 100 ms (logged at most once a minute).");
                    warned = Some(std::time::Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::counter!(crate::telemetry::HTTP_REFUSED).increment(1);
            if warned.is_none_or(|at| at.elapsed() > Duration::from_secs(60)) {
                warn!(
                    max = MAX_CONNECTIONS,
                    "The HTTP endpoint has its most connections open: closing a new one (counted in palletd_http_connections_refused_total; logged at most once a minute)."
                );
                warned = Some(std::time::Instant::now());
            }
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop(permit);
        });
    }
}

/// The `Authorization` values that pass, as SHA-256 digests.
struct Credentials {
    accepted: Vec<ring::digest::Digest>,
    challenge: &'static str,
}

impl Credentials {
    fn new(auth: &HttpAuth) -> Credentials {
        let digest = |text: &str| ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        let mut accepted = Vec::new();
        if let Some((user, password)) = &auth.basic {
            let pair = format!("{user}:{}", password.expose());
            let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
            accepted.push(digest(&format!("Basic {encoded}")));
        }
        if let Some(token) = &auth.token {
            accepted.push(digest(&format!("Bearer {}", token.expose())));
        }
        let challenge = if auth.basic.is_some() {
            "Basic realm=\"palletd\", charset=\"UTF-8\""
        } else {
            "Bearer realm=\"palletd\""
        };
        Credentials {
            accepted,
            challenge,
        }
    }

    fn pass(&self, headers: &HeaderMap) -> bool {
        let Some(given) = headers.get(header::AUTHORIZATION) else {
            return false;
        };
        // The scheme is case-insensitive (RFC 9110 11.1); one space after it.
        let given = given.as_bytes();
        let Some(space) = given.iter().position(|b| *b == b' ') else {
            return false;
        };
        let scheme = String::from_utf8_lossy(&given[..space]).to_ascii_lowercase();
        let scheme = match scheme.as_str() {
            "basic" => "Basic",
            "bearer" => "Bearer",
            _ => return false,
        };
        let mut canonical = scheme.as_bytes().to_vec();
        canonical.extend_from_slice(&given[space..]);
        let digest = ring::digest::digest(&ring::digest::SHA256, &canonical);
        self.accepted.iter().any(|a| a.as_ref() == digest.as_ref())
    }
}

async fn authorize(
    State(check): State<Arc<Credentials>>,
    request: Request,
    next: Next,
) -> Response {
    if check.pass(request.headers()) {
        return next.run(request).await;
    }
    metrics::counter!(crate::telemetry::HTTP_UNAUTHORIZED).increment(1);
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, check.challenge)],
        "credentials required (see [http] in the configuration)\n",
    )
        .into_response()
}

async fn metrics_page(
    State(s): State<Pages>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let body = s.metrics.as_ref().map(|m| m.render()).unwrap_or_default();
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
}

/// The status page's parameters: a sensor to chart, over a range.
#[derive(serde::Deserialize)]
struct PageParams {
    sensor: Option<String>,
    range: Option<String>,
}

async fn status_page(
    State(s): State<Pages>,
    axum::extract::Query(p): axum::extract::Query<PageParams>,
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
    let now = crate::clock::now_ms();
    let range = p.range.as_deref().and_then(sensor::ChartRange::parse);
    let sensors = match &s.api {
        Some(api) => {
            let range = range.unwrap_or_default();
            Some(api::sensor_view(api, p.sensor, range, now).await)
        }
        None => None,
    };
    let page = status::render(&facts, &figures, &s.history, now, sensors.as_ref());
    (
        StatusCode::OK,
        [
            ("content-type", "text/html; charset=utf-8"),
            ("cache-control", "no-store"),
        ],
        page,
    )
}

async fn readyz(State(s): State<Pages>) -> (StatusCode, String) {
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
