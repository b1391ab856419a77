//! The read-only series API on the HTTP endpoint (behind the same
//! credentials as `/` and `/metrics`), shaped for Grafana's Infinity data
//! source and for scripts:
//!
//! - `GET /api/sensors[?limit=N]`: each sensor's latest reading (from
//!   `<collection>_latest`), by id, at most `limit` (default and largest
//!   [`MAX_SENSORS`]; `X-Palletd-Truncated: true` when there are more).
//! - `GET /api/fields?sensor=ID`: the numeric fields of its latest
//!   reading, `[{field, value, time}]`.
//! - `GET /api/series?sensor=ID[&field=F][&from=T][&to=T][&step=D][&format=csv]`:
//!   per step and numeric field `{time, field, n, avg, min, max, sum}`
//!   ([`crate::query::series`]): from a `[[rollup]]` when the step is a
//!   whole number of its interval (the intervals not rolled up yet from
//!   the windows), from the windows' summaries when it is a whole number
//!   of `bucket.window` (both: every reading, thinned or not), else from
//!   the samples. `from`/`to` are RFC 3339 or a duration ago (`24h`), by
//!   default the last 24 hours; `step` a duration, by default the range
//!   in about 500 steps ([`default_step`]). At most
//!   [`crate::query::MAX_POINTS`] steps and [`crate::query::MAX_READ`]
//!   documents read: beyond, 400 and what to
//!   change. `source=rollup|windows|samples` asks for one (400 when the
//!   step does not allow it). `X-Palletd-Source` says where it came from:
//!   `rollup:1h` (or `rollup:1h+windows:N`, N intervals not settled read
//!   from the windows), `windows` or `samples`.
//!
//! While the database is unreachable (as `/readyz` tells), every answer is
//! 503 at once; a read that fails is 503 with the driver's error.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::sensor::{ChartRange, SensorView, SeriesRead};
use crate::clock::iso;
use crate::query::{self, QueryError, SeriesSource};
use crate::store::Store;

/// Sensors one `/api/sensors` answer lists at most.
pub(crate) const MAX_SENSORS: usize = 10_000;

/// What the API reads from.
pub struct Api {
    pub store: Store,
    /// `bucket.window` in ms.
    pub window_ms: i64,
    /// Whether the database is reachable (no read is sent while not: an
    /// answer would wait for the driver's server selection).
    pub health: Arc<crate::telemetry::Health>,
}

impl Api {
    /// 503 at once while the database is unreachable.
    fn unreachable(&self) -> Option<Response> {
        (!self.health.database_reachable()).then(|| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unreachable (see /readyz)\n",
            )
                .into_response()
        })
    }
}

#[derive(Deserialize)]
pub(crate) struct SensorsParams {
    limit: Option<usize>,
}

/// Sensors the status page's chooser lists (the first by id).
pub(crate) const CHOOSER_SENSORS: usize = 1000;

/// How long the status page waits for the database for a sensor's charts.
const CHARTS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// And for the chooser's sensor ids.
const IDS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The status page's sensor charts at `now`: the sensors to choose from
/// and, when one is chosen, its series over `range` (the API's answer to
/// the same parameters; in steps of whole windows when the samples are
/// more than the API reads). While the database is unreachable nothing is
/// read (the page must not wait on it): the charts say so.
pub(crate) async fn sensor_view(
    api: &Api,
    sensor: Option<String>,
    range: ChartRange,
    now: i64,
) -> SensorView {
    let mut view = SensorView::default();
    let sensor = sensor.filter(|s| !s.is_empty());
    if !api.health.database_reachable() {
        view.chosen = sensor.map(|s| {
            let why = "the database is unreachable; the charts come back with it".to_string();
            (s, range, Err(why))
        });
        return view;
    }
    let ids = api.store.sensor_ids(CHOOSER_SENSORS as u64 + 1);
    if let Ok(Ok(mut ids)) = tokio::time::timeout(IDS_TIMEOUT, ids).await {
        view.more = ids.len() > CHOOSER_SENSORS;
        ids.truncate(CHOOSER_SENSORS);
        view.ids = ids;
    }
    let Some(sensor) = sensor else {
        return view;
    };
    let mut step = range.step_ms();
    let read = loop {
        let to = (now.div_euclid(step) + 1) * step;
        let from = to - range.span_ms();
        let read = query::series(
            &api.store,
            api.window_ms,
            &sensor,
            None,
            (from, to),
            step,
            query::Prefer::Cheapest,
        );
        match tokio::time::timeout(CHARTS_TIMEOUT, read).await {
            Ok(Ok((source, points))) => {
                break Ok(SeriesRead {
                    from_ms: from,
                    to_ms: to,
                    step_ms: step,
                    source: source_name(&source),
                    points,
                })
            }
            Ok(Err(QueryError::TooMuch(_))) if api.window_ms > 0 && step % api.window_ms != 0 => {
                step = step.div_euclid(api.window_ms).max(1) * api.window_ms;
                if step < range.step_ms() {
                    step += api.window_ms;
                }
            }
            Ok(Err(e)) => break Err(e.to_string()),
            Err(_) => {
                break Err(format!(
                    "the database did not answer within {} s",
                    CHARTS_TIMEOUT.as_secs()
                ))
            }
        }
    };
    view.chosen = Some((sensor, range, read));
    view
}

/// `X-Palletd-Source`'s value.
fn source_name(source: &SeriesSource) -> String {
    match source {
        SeriesSource::Rollup { name, from_windows } if *from_windows > 0 => {
            format!("rollup:{name}+windows:{from_windows}")
        }
        SeriesSource::Rollup { name, .. } => format!("rollup:{name}"),
        SeriesSource::Windows => "windows".into(),
        SeriesSource::Samples => "samples".into(),
    }
}

/// `GET /api/sensors`.
pub(crate) async fn sensors(
    State(api): State<Arc<Api>>,
    Query(p): Query<SensorsParams>,
) -> Response {
    if let Some(down) = api.unreachable() {
        return down;
    }
    let limit = p.limit.unwrap_or(MAX_SENSORS).min(MAX_SENSORS);
    let (sensors, truncated) = match latest(&api.store, limit).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let out: Vec<serde_json::Value> = sensors
        .into_iter()
        .map(|(id, ts, fields)| serde_json::json!({ "sensorId": id, "time": iso(ts), "fields": fields }))
        .collect();
    let mut response = json(&out);
    if truncated {
        response
            .headers_mut()
            .insert("x-palletd-truncated", HeaderValue::from_static("true"));
    }
    response
}

#[derive(Deserialize)]
pub(crate) struct FieldsParams {
    sensor: Option<String>,
}

/// `GET /api/fields?sensor=ID`: the numeric fields of the sensor's latest
/// reading, `[{field, value, time}]` (what a dashboard repeats a panel
/// by); 404 for a sensor without one.
pub(crate) async fn fields(State(api): State<Arc<Api>>, Query(p): Query<FieldsParams>) -> Response {
    if let Some(down) = api.unreachable() {
        return down;
    }
    let Some(sensor) = p.sensor.as_deref().filter(|s| !s.is_empty()) else {
        return (
            StatusCode::BAD_REQUEST,
            "sensor=ID is needed (GET /api/sensors lists them)\n",
        )
            .into_response();
    };
    let mut out = Vec::new();
    let read = api
        .store
        .latest(Some(sensor), Some(1), |_, ts, sample, _| {
            for (k, v) in sample.iter().filter(|(k, _)| k.as_str() != "ts") {
                if let Some(value) = crate::store::read::number(Some(v)) {
                    out.push(serde_json::json!({ "field": k, "value": value, "time": iso(ts) }));
                }
            }
            Ok(())
        })
        .await;
    match read {
        Ok(0) => (StatusCode::NOT_FOUND, format!("no reading of {sensor:?}\n")).into_response(),
        Ok(_) => json(&out),
        Err(e) => failed(e),
    }
}

/// The first `limit` sensors by id with their latest reading (time and
/// fields), and whether there are more.
async fn latest(
    store: &Store,
    limit: usize,
) -> Result<
    (
        Vec<(String, i64, serde_json::Map<String, serde_json::Value>)>,
        bool,
    ),
    QueryError,
> {
    let mut out = Vec::new();
    store
        .latest(None, Some(limit as u64 + 1), |id, ts, sample, _| {
            let fields = sample
                .iter()
                .filter(|(k, _)| k.as_str() != "ts")
                .map(|(k, v)| (k.clone(), query::json_value(v)))
                .collect();
            out.push((id.to_string(), ts, fields));
            Ok(())
        })
        .await?;
    let more = out.len() > limit;
    out.truncate(limit);
    Ok((out, more))
}

#[derive(Deserialize)]
pub(crate) struct SeriesParams {
    sensor: Option<String>,
    field: Option<String>,
    from: Option<String>,
    to: Option<String>,
    step: Option<String>,
    format: Option<String>,
    source: Option<String>,
}

/// `GET /api/series`.
pub(crate) async fn series(State(api): State<Arc<Api>>, Query(p): Query<SeriesParams>) -> Response {
    if let Some(down) = api.unreachable() {
        return down;
    }
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
    let prefer = match p.source.as_deref().map(query::Prefer::parse) {
        None => query::Prefer::Cheapest,
        Some(Some(prefer)) => prefer,
        Some(None) => return bad("source: auto, rollup, windows or samples".into()),
    };
    let (source, points) = match query::series(
        &api.store,
        api.window_ms,
        sensor,
        p.field.as_deref(),
        (from, to),
        step_ms,
        prefer,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let source = source_name(&source);
    let rows = points
        .iter()
        .map(|p| (iso(p.start_ms), &p.field, p.n, p.avg(), p.min, p.max, p.sum));
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
    if let Ok(source) = HeaderValue::from_str(&source) {
        response.headers_mut().insert("x-palletd-source", source);
    }
    response
}

fn json(rows: &[serde_json::Value]) -> Response {
    let body = serde_json::to_string(rows).unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The range in about 500 steps of whole seconds, or, when the range
/// holds [`WINDOWS_FOR_SUMMARIES`] windows or more, in steps of whole
/// windows (read from the rollups or the windows' summaries, whatever the
/// rate of the sensor; then fewer steps when that is under 500).
pub(crate) fn default_step(span_ms: i64, window_ms: i64) -> i64 {
    let step = (span_ms / 500).max(1000);
    if window_ms > 0 && span_ms >= WINDOWS_FOR_SUMMARIES * window_ms {
        step.div_euclid(window_ms).max(1) * window_ms
    } else {
        step.div_euclid(1000) * 1000
    }
}

/// From this many windows in the range on, the default step is whole
/// windows.
pub(crate) const WINDOWS_FOR_SUMMARIES: i64 = 100;

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
        assert_eq!(default_step(7 * 86_400_000, hour), hour);
        assert_eq!(default_step(300 * 86_400_000, hour), 14 * hour);
        assert_eq!(default_step(60_000, hour), 1000);
        assert_eq!(default_step(7 * 86_400_000, 60_000), 1_200_000);
    }
}
