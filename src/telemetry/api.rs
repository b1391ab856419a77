//! The read-only series API on the HTTP endpoint (behind the same
//! credentials as `/` and `/metrics`), shaped for Grafana's Infinity data
//! source and for scripts:
//!
//! - `GET /api/sensors[?limit=N]`: each sensor's latest reading (from
//!   `<collection>_latest`), by id, at most `limit` (default and largest
//!   [`MAX_SENSORS`]; `X-Palletd-Truncated: true` when there are more).
//! - `GET /api/series?sensor=ID[&field=F][&from=T][&to=T][&step=D][&format=csv]`:
//!   per step and numeric field `{time, field, n, avg, min, max, sum}`
//!   ([`crate::query::series`]): from the windows' summaries when the
//!   step is a whole number of `bucket.window` (every reading, thinned or
//!   not), else from the samples. `from`/`to` are RFC 3339 or a duration
//!   ago (`24h`), by default the last 24 hours; `step` a duration, by
//!   default the range in about 500 steps (whole windows when that is a
//!   window or more). At most [`crate::query::MAX_POINTS`] steps and
//!   [`crate::query::MAX_READ`] documents read: beyond, 400 and what to
//!   change. `X-Palletd-Source: windows | samples` says where it came from.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::clock::iso;
use crate::query::{self, QueryError, SeriesSource};
use crate::store::Store;

/// Sensors one `/api/sensors` answer lists at most.
pub const MAX_SENSORS: usize = 10_000;

/// What the API reads from.
pub struct Api {
    pub store: Store,
    /// `bucket.window` in ms.
    pub window_ms: i64,
}

#[derive(Deserialize)]
pub struct SensorsParams {
    limit: Option<usize>,
}

/// `GET /api/sensors`.
pub async fn sensors(State(api): State<Arc<Api>>, Query(p): Query<SensorsParams>) -> Response {
    let limit = p.limit.unwrap_or(MAX_SENSORS).min(MAX_SENSORS);
    let mut out = Vec::new();
    let mut truncated = false;
    let read = api
        .store
        .latest(None, |id, ts, sample, _| {
            if out.len() == limit {
                truncated = true;
                return Err(std::io::Error::other(ENOUGH));
            }
            let fields: serde_json::Map<String, serde_json::Value> = sample
                .iter()
                .filter(|(k, _)| k.as_str() != "ts")
                .map(|(k, v)| (k.clone(), query::json_value(v)))
                .collect();
            out.push(serde_json::json!({ "sensorId": id, "time": iso(ts), "fields": fields }));
            Ok(())
        })
        .await;
    match read {
        Ok(_) => {}
        Err(QueryError::Io(e)) if e.to_string() == ENOUGH => {}
        Err(e) => return failed(e),
    }
    let mut response = json(&out);
    if truncated {
        response
            .headers_mut()
            .insert("x-palletd-truncated", HeaderValue::from_static("true"));
    }
    response
}

const ENOUGH: &str = "api: enough sensors";

#[derive(Deserialize)]
pub struct SeriesParams {
    sensor: Option<String>,
    field: Option<String>,
    from: Option<String>,
    to: Option<String>,
    step: Option<String>,
    format: Option<String>,
}

/// `GET /api/series`.
pub async fn series(State(api): State<Arc<Api>>, Query(p): Query<SeriesParams>) -> Response {
    let now = crate::clock::now_ms();
    let bad = |why: String| (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response();
    let Some(sensor) = p.sensor.as_deref().filter(|s| !s.is_empty()) else {
        return bad("sensor=ID is needed (GET /api/sensors lists them)".into());
    };
    let time = |text: Option<&str>, default: i64| match text {
        None => Ok(default),
        Some(t) => query::parse_time(t, now).map_err(|e| format!("from/to: {e}")),
    };
    let (from, to) = match (
        time(p.from.as_deref(), now - 86_400_000),
        time(p.to.as_deref(), now),
    ) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(e), _) | (_, Err(e)) => return bad(e),
    };
    let step_ms = match p.step.as_deref() {
        Some(s) => match humantime::parse_duration(s) {
            Ok(d) => d.as_millis() as i64,
            Err(_) => {
                return bad(format!(
                    "step: {s:?} is not a duration like \"1m\" or \"1h\""
                ))
            }
        },
        None => default_step(to - from, api.window_ms),
    };
    let csv = match p.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(other) => return bad(format!("format: {other:?} is not json or csv")),
    };
    let (source, points) = match query::series(
        &api.store,
        api.window_ms,
        sensor,
        p.field.as_deref(),
        (from, to),
        step_ms,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let source = match source {
        SeriesSource::Windows => "windows",
        SeriesSource::Samples => "samples",
    };
    let rows = points.iter().map(|p| {
        let avg = p.sum / p.n.max(1) as f64;
        (iso(p.start_ms), &p.field, p.n, avg, p.min, p.max, p.sum)
    });
    let mut response = if csv {
        let mut text = String::from("time,field,n,avg,min,max,sum\n");
        for (time, field, n, avg, min, max, sum) in rows {
            let field = query::csv_field(&field.as_str().into());
            text.push_str(&format!("{time},{field},{n},{avg},{min},{max},{sum}\n"));
        }
        ([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], text).into_response()
    } else {
        let rows: Vec<serde_json::Value> = rows
            .map(|(time, field, n, avg, min, max, sum)| {
                serde_json::json!({ "time": time, "field": field, "n": n, "avg": avg, "min": min, "max": max, "sum": sum })
            })
            .collect();
        json(&rows)
    };
    response
        .headers_mut()
        .insert("x-palletd-source", HeaderValue::from_static(source));
    response
}

fn json(rows: &[serde_json::Value]) -> Response {
    let body = serde_json::to_string(rows).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The range in about 500 steps: whole seconds, or whole windows when
/// that is a window or more (then read from the windows' summaries).
fn default_step(span_ms: i64, window_ms: i64) -> i64 {
    let step = (span_ms / 500).max(1000);
    if window_ms > 0 && step >= window_ms {
        step.div_euclid(window_ms) * window_ms
    } else {
        step.div_euclid(1000) * 1000
    }
}

/// A read that failed: 400 for a bound (with what to change), 503 for the
/// database.
fn failed(e: QueryError) -> Response {
    match e {
        QueryError::TooMuch(why) | QueryError::Unsupported(why) => {
            (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response()
        }
        e => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the database: {e}\n"),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_step_is_whole_windows_from_a_window_on() {
        let hour = 3_600_000;
        assert_eq!(default_step(86_400_000, hour), 172_000);
        assert_eq!(default_step(300 * 86_400_000, hour), 14 * hour);
        assert_eq!(default_step(60_000, hour), 1000);
    }
}
