//! The status page at `/`: one plain HTML page a technician opens on site.
//! No script, no external asset, no build step; it refreshes itself every
//! five seconds and reads on a phone. Every figure on it is a value of
//! `/metrics` (read from the same Prometheus registry when the page is
//! rendered), or a difference of two such values in time ([`History`]:
//! readings stored per second, dead letters in the last hour), plus
//! readiness and the sensors quiet the longest (from
//! `<collection>_latest`, or the admission's bookkeeping when that is off).
//!
//! Charts of the last hour, drawn here as inline SVG from the snapshots
//! [`History`] keeps every [`SNAPSHOT_EVERY`] (a point per snapshot):
//! readings stored per second, the backlog, the live lag's p99 (from the
//! sample-age histogram's buckets), database errors and dead letters per
//! interval. Each chart's points are also in its `data-points` attribute
//! (`<ms>,<value>` pairs), what the browser test checks against
//! `/metrics`. A snapshot keeps only what the page shows (a few numbers
//! and the lag histogram's buckets): an hour of them is about 300 KB.
//!
//! Charts of a sensor (`/?sensor=ID&range=hour|day|week`): a form chooses
//! the sensor (a list of the first [`super::api::CHOOSER_SENSORS`] by id
//! from `<collection>_latest`, or any typed) and the span; each numeric
//! field is a chart of its mean per step over the band of its least and
//! greatest value, read by [`crate::query::series`] exactly as
//! `/api/series` answers it (each chart links to that answer): a point a
//! minute for the hour (from the samples, unless `bucket.window` is a
//! minute or less), a quarter of an hour for the day, an hour for the
//! week (from a rollup or the windows' summaries when the step allows).
//! A sensor too busy for its samples to be read within the API's bound
//! is shown in steps of whole windows instead. With a sensor chosen the
//! page refreshes once a minute, not every five seconds.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use super::sensor::*;
use crate::clock::{iso, now_ms};

/// How often [`History`] keeps a snapshot, and how long it keeps them.
pub(crate) const SNAPSHOT_EVERY: Duration = Duration::from_secs(10);
const KEEP: Duration = Duration::from_secs(3600);

/// A parsed `/metrics` page: series (name with labels, as printed) to value.
#[derive(Debug, Default, Clone)]
pub(crate) struct Figures(BTreeMap<String, f64>);

impl Figures {
    /// Parses Prometheus text format (comments and histogram series too).
    pub fn parse(text: &str) -> Figures {
        Figures(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (series, value) = l.trim().rsplit_once(' ')?;
                    Some((series.to_string(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    /// A series' value; 0 when the registry has not seen it yet.
    pub(crate) fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }

    /// `label value -> value` of every series of `name` with one label.
    pub(crate) fn by_label(&self, name: &str) -> BTreeMap<String, f64> {
        let prefix = format!("{name}{{");
        self.0
            .iter()
            .filter_map(|(series, v)| {
                let labels = series.strip_prefix(&prefix)?.strip_suffix('}')?;
                let (_, value) = labels.split_once('=')?;
                Some((value.trim_matches('"').to_string(), *v))
            })
            .collect()
    }
}

impl Figures {
    /// The series of `name` with their labels: (`{label: value}`, value).
    pub(crate) fn labelled(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let prefix = format!("{name}{{");
        self.0
            .iter()
            .filter_map(|(series, v)| {
                let labels = series.strip_prefix(&prefix)?.strip_suffix('}')?;
                let labels = labels
                    .split(',')
                    .filter_map(|l| {
                        let (k, v) = l.split_once('=')?;
                        Some((k.to_string(), v.trim_matches('"').to_string()))
                    })
                    .collect();
                Some((labels, *v))
            })
            .collect()
    }
}

/// The thinning rules' points since start, when a field is thinned: per
/// rule, received, stored and unordered, and the share stored.
fn thinning_section(now: &Figures) -> String {
    let mut rules: BTreeMap<String, [f64; 3]> = BTreeMap::new();
    for (labels, v) in now.labelled(crate::telemetry::THINNING_POINTS) {
        let (Some(rule), Some(outcome)) = (labels.get("rule"), labels.get("outcome")) else {
            continue;
        };
        let i = match outcome.as_str() {
            "received" => 0,
            "stored" => 1,
            "unordered" => 2,
            _ => continue,
        };
        rules.entry(rule.clone()).or_default()[i] += v;
    }
    rules.retain(|_, f| f[0] > 0.0);
    if rules.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<h2>Thinning since start</h2>\n<p class=\"note\">Points of thinned fields: the summaries and rollups take every one received; samples hold those stored.</p>\n<table id=\"thinning\"><tr><th>rule</th><th>received</th><th>stored</th><th>stored of received</th><th>taken as received (out of order)</th></tr>\n",
    );
    for (rule, [received, stored, unordered]) in rules {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{received:.0}</td><td class=\"n\">{stored:.0}</td><td class=\"n\" id=\"thinning-{}\">{:.1}%</td><td class=\"n\">{unordered:.0}</td></tr>",
            escape(&rule),
            escape(&rule),
            100.0 * stored / received,
        );
    }
    out.push_str("</table>\n");
    out
}

/// What the page needs of `/metrics` at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Snapshot {
    pub at_ms: i64,
    pub stored: f64,
    pub backlog: f64,
    /// Failed database commands, all kinds.
    pub db_errors: f64,
    /// Dead letters by cause (the causes seen so far).
    pub dead: BTreeMap<String, f64>,
    /// The live lane's sample-age histogram: (bucket bound, cumulative
    /// count), by bound.
    pub age: Vec<(f64, f64)>,
}

impl Snapshot {
    pub(crate) fn of(at_ms: i64, f: &Figures) -> Snapshot {
        let prefix = format!("{}_bucket{{", crate::telemetry::SAMPLE_AGE_SECONDS);
        let mut age: Vec<(f64, f64)> =
            f.0.iter()
                .filter_map(|(series, v)| {
                    let labels = series.strip_prefix(&prefix)?.strip_suffix('}')?;
                    let mut le = None;
                    let mut live = false;
                    for l in labels.split(',') {
                        match l.split_once('=') {
                            Some(("le", x)) => le = x.trim_matches('"').parse::<f64>().ok(),
                            Some(("lane", x)) => live = x.trim_matches('"') == "live",
                            _ => {}
                        }
                    }
                    Some((le.filter(|_| live)?, *v))
                })
                .collect();
        age.sort_by(|a, b| a.0.total_cmp(&b.0));
        Snapshot {
            at_ms,
            stored: f.get(crate::telemetry::SAMPLES_STORED),
            backlog: f.get(crate::telemetry::BACKLOG_READINGS),
            db_errors: f.by_label(crate::telemetry::DATABASE_ERRORS).values().sum(),
            dead: f
                .by_label(crate::telemetry::DEAD_LETTERS)
                .into_iter()
                .filter(|(_, n)| *n > 0.0)
                .collect(),
            age,
        }
    }

    fn dead_total(&self) -> f64 {
        self.dead.values().sum()
    }
}

/// The `q` quantile of the ages counted between two snapshots (linear
/// within a bucket; the last finite bound for ages beyond it); `None`
/// without any.
fn age_quantile(before: &Snapshot, after: &Snapshot, q: f64) -> Option<f64> {
    let count = |s: &Snapshot, le: f64| {
        s.age
            .iter()
            .find(|(b, _)| *b == le)
            .map_or(0.0, |(_, c)| *c)
    };
    let diff: Vec<(f64, f64)> = after
        .age
        .iter()
        .map(|&(le, c)| (le, c - count(before, le)))
        .collect();
    let total = diff.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let want = q * total;
    let (mut lo, mut below) = (0.0, 0.0);
    for &(le, c) in &diff {
        if c >= want {
            if !le.is_finite() {
                return Some(lo);
            }
            let share = if c > below {
                (want - below) / (c - below)
            } else {
                1.0
            };
            return Some(lo + (le - lo) * share);
        }
        (lo, below) = (le, c);
    }
    Some(lo)
}

/// Snapshots of what the page shows, one per [`SNAPSHOT_EVERY`], for the
/// last hour.
#[derive(Debug, Default)]
pub struct History(Mutex<VecDeque<Snapshot>>);

impl History {
    pub(crate) fn record(&self, snapshot: Snapshot) {
        let at_ms = snapshot.at_ms;
        let mut h = self.0.lock().unwrap_or_else(|e| e.into_inner());
        h.push_back(snapshot);
        while h
            .front()
            .is_some_and(|f| at_ms - f.at_ms > KEEP.as_millis() as i64 + 10_000)
        {
            h.pop_front();
        }
    }

    /// The oldest snapshot taken at least `ago` before `now_ms`, else the
    /// oldest kept (palletd is younger than `ago`).
    fn at_least(&self, now_ms: i64, ago: Duration) -> Option<Snapshot> {
        let h = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let cutoff = now_ms - ago.as_millis() as i64;
        h.iter()
            .rev()
            .find(|s| s.at_ms <= cutoff)
            .or_else(|| h.front())
            .cloned()
    }

    /// A point per pair of consecutive snapshots of the last hour before
    /// `now_ms`, at the later one's time: `f(earlier, later)`.
    fn series(
        &self,
        now_ms: i64,
        f: impl Fn(&Snapshot, &Snapshot) -> Option<f64>,
    ) -> Vec<(i64, Option<f64>)> {
        let h = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let from = now_ms - KEEP.as_millis() as i64;
        let mut out = Vec::new();
        let mut it = h.iter().filter(|s| s.at_ms >= from && s.at_ms <= now_ms);
        let Some(mut prev) = it.next() else {
            return out;
        };
        for s in it {
            out.push((s.at_ms, f(prev, s)));
            prev = s;
        }
        out
    }
}

/// One chart of the last hour before `now_ms` as inline SVG: a line
/// through `points` (broken where a point is `None`), the largest value
/// on the left, the hour along the bottom; the points in `data-points`.
fn chart(id: &str, title: &str, unit: &str, points: &[(i64, Option<f64>)], now_ms: i64) -> String {
    const W: f64 = 300.0;
    const H: f64 = 60.0;
    let hour = KEEP.as_millis() as f64;
    let max = points.iter().filter_map(|p| p.1).fold(0.0f64, f64::max);
    let top = if max > 0.0 { max * 1.1 } else { 1.0 };
    let x = |t: i64| W - (now_ms - t) as f64 / hour * W;
    let y = |v: f64| H - v / top * H;
    let mut lines = String::new();
    let mut run: Vec<String> = Vec::new();
    // A line through each run of points; a point alone, and the newest,
    // as a dot (a young palletd's hour is a few points at the right edge).
    let flush = |run: &mut Vec<String>, lines: &mut String| {
        match run.as_slice() {
            [] => {}
            [one] => {
                let (cx, cy) = one.split_once(',').unwrap_or(("0", "0"));
                let _ = write!(
                    lines,
                    "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"1.5\" fill=\"#1f5fa8\"/>"
                );
            }
            _ => {
                let _ = write!(
                    lines,
                    "<polyline points=\"{}\" fill=\"none\" stroke=\"#1f5fa8\" stroke-width=\"1.5\"/>",
                    run.join(" ")
                );
            }
        }
        run.clear();
    };
    for &(t, v) in points {
        match v {
            Some(v) => run.push(format!("{:.1},{:.1}", x(t), y(v))),
            None => flush(&mut run, &mut lines),
        }
    }
    flush(&mut run, &mut lines);
    if let Some((t, Some(v))) = points.last() {
        let _ = write!(
            lines,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"#1f5fa8\"/>",
            x(*t),
            y(*v)
        );
    }
    let data: Vec<String> = points
        .iter()
        .filter_map(|&(t, v)| Some(format!("{t},{}", v?)))
        .collect();
    let last = points
        .iter()
        .rev()
        .find_map(|p| p.1)
        .map_or("-".to_string(), |v| format!("{v:.1}"));
    format!(
        r##"<figure><figcaption>{title}: <span id="{id}-last">{last}</span> {unit}</figcaption>
<svg id="{id}" data-points="{}" viewBox="-2 -12 {} {}" width="100%" role="img" aria-label="{title}, last hour">
<rect x="0" y="0" width="{W}" height="{H}" fill="#f7f7f7" stroke="#ccc"/>
<text x="2" y="-2" font-size="9" fill="#666">{}</text><text x="0" y="{}" font-size="9" fill="#666">1 h ago</text><text x="{}" y="{}" font-size="9" fill="#666" text-anchor="end">now</text>
{lines}</svg></figure>
"##,
        data.join(" "),
        W + 4.0,
        H + 26.0,
        if max > 0.0 {
            format!("max {max:.1}")
        } else {
            "0".to_string()
        },
        H + 11.0,
        W,
        H + 11.0,
    )
}

/// A number in about four significant digits, for an axis.
pub(super) fn short(v: f64) -> String {
    let decimals = if v.abs() >= 1000.0 {
        0
    } else {
        3 - v.abs().log10().floor().clamp(0.0, 3.0) as usize
    };
    format!("{v:.decimals$}")
}

/// What the page shows besides `/metrics`.
pub(crate) struct Facts<'a> {
    pub version: &'a str,
    /// `Ok` when ready, else why not.
    pub ready: Result<Option<String>, &'static str>,
    pub broker_connected: bool,
    /// Whether the broker delivers through shared subscriptions (none:
    /// nothing is shared), and whether that is as it should be.
    pub shared: Option<(&'static str, bool)>,
    pub database_reachable: bool,
    /// (sensor, last reading ms), the longest quiet first.
    pub quiet: Vec<(String, i64)>,
}

pub(super) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(super) fn ago(ms: i64) -> String {
    let secs = (ms / 1000).max(0) as u64;
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// The last hour's charts, a point every [`SNAPSHOT_EVERY`].
fn last_hour_charts(history: &History, now_ms: i64) -> String {
    let per_second = |a: &Snapshot, b: &Snapshot, v: fn(&Snapshot) -> f64| {
        let secs = (b.at_ms - a.at_ms) as f64 / 1000.0;
        (secs > 0.0).then(|| (v(b) - v(a)).max(0.0) / secs)
    };
    [
        chart(
            "chart-stored",
            "Readings stored per second",
            "/s",
            &history.series(now_ms, |a, b| per_second(a, b, |s| s.stored)),
            now_ms,
        ),
        chart(
            "chart-backlog",
            "Backlog",
            "readings",
            &history.series(now_ms, |_, b| Some(b.backlog)),
            now_ms,
        ),
        chart(
            "chart-lag",
            "Live lag, p99",
            "s",
            &history.series(now_ms, |a, b| age_quantile(a, b, 0.99)),
            now_ms,
        ),
        chart(
            "chart-db-errors",
            "Database errors per interval",
            "",
            &history.series(now_ms, |a, b| Some((b.db_errors - a.db_errors).max(0.0))),
            now_ms,
        ),
        chart(
            "chart-dead-letters",
            "Dead letters per interval",
            "",
            &history.series(now_ms, |a, b| {
                Some((b.dead_total() - a.dead_total()).max(0.0))
            }),
            now_ms,
        ),
    ]
    .concat()
}

/// The dead letters of the last hour, by cause.
fn dead_letters_section(now: &Figures, history: &History, now_ms: i64) -> String {
    let dead_now = now.by_label(crate::telemetry::DEAD_LETTERS);
    let dead_then = history
        .at_least(now_ms, KEEP)
        .map(|s| s.dead)
        .unwrap_or_default();
    let mut page = String::new();
    page.push_str("<h2>Dead letters in the last hour, by cause</h2>\n");
    let recent: Vec<(&String, f64)> = dead_now
        .iter()
        .map(|(cause, n)| (cause, n - dead_then.get(cause).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    if recent.is_empty() {
        page.push_str("<p id=\"dead-letters\">None.</p>\n");
    } else {
        page.push_str("<table id=\"dead-letters\"><tr><th>cause</th><th>count</th></tr>\n");
        for (cause, n) in recent {
            let _ = writeln!(
                page,
                "<tr><td>{}</td><td class=\"n\" id=\"dead-{}\">{n:.0}</td></tr>",
                escape(cause),
                escape(cause)
            );
        }
        page.push_str("</table>\n");
    }
    page
}

/// The sensors quiet the longest; with `charts`, each links to its charts.
fn quiet_section(facts: &Facts, charts: bool, now_ms: i64) -> String {
    let mut page = String::new();
    page.push_str("<h2>Sensors quiet the longest</h2>\n");
    if facts.quiet.is_empty() {
        page.push_str("<p id=\"quiet\">No sensor heard from yet.</p>\n");
    } else {
        page.push_str(
            "<table id=\"quiet\"><tr><th>sensor</th><th>last reading</th><th>ago</th></tr>\n",
        );
        for (sensor, at) in &facts.quiet {
            let name = match charts {
                true => format!(
                    "<a href=\"/?{}#sensor-charts\">{}</a>",
                    escape(&serde_urlencoded::to_string([("sensor", sensor)]).unwrap_or_default()),
                    escape(sensor)
                ),
                false => escape(sensor),
            };
            let _ = writeln!(
                page,
                "<tr><td>{name}</td><td>{}</td><td class=\"n\">{}</td></tr>",
                iso(*at),
                ago(now_ms - at)
            );
        }
        page.push_str("</table>\n");
    }
    page
}

/// Renders the page at `now_ms`, with the sensor charts of `sensors`
/// when palletd reads the database for them.
pub(crate) fn render(
    facts: &Facts,
    now: &Figures,
    history: &History,
    now_ms: i64,
    sensors: Option<&SensorView>,
) -> String {
    let stored = now.get(crate::telemetry::SAMPLES_STORED);
    let rate = history
        .at_least(now_ms, Duration::from_secs(60))
        .filter(|then| now_ms - then.at_ms >= 1000)
        .map(|then| (stored - then.stored) * 1000.0 / (now_ms - then.at_ms) as f64);
    let (ready_class, ready_text) = match &facts.ready {
        Ok(None) => ("ok", "Ready".to_string()),
        Ok(Some(note)) => ("ok", format!("Ready; {note}")),
        Err(why) => ("bad", format!("Not ready: {why}")),
    };
    let yes_no = |up: bool| {
        if up {
            ("ok", "connected")
        } else {
            ("bad", "not connected")
        }
    };
    let (broker_class, broker_text) = yes_no(facts.broker_connected);
    let shared_row = facts.shared.map_or(String::new(), |(text, good)| {
        format!(
            "<tr><th>Shared subscriptions</th><td id=\"shared\" class=\"{}\">{}</td></tr>\n",
            if good { "ok" } else { "bad" },
            escape(text)
        )
    });
    let (db_class, db_text) = if facts.database_reachable {
        ("ok", "reachable")
    } else {
        ("bad", "unreachable")
    };
    // A sensor's charts read the database: once a minute is enough.
    let refresh = match sensors {
        Some(SensorView {
            chosen: Some(_), ..
        }) => 60,
        _ => 5,
    };
    let mut page = String::with_capacity(8192);
    let _ = write!(
        page,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{refresh}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>palletd status</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; max-width: 56em; color: #222; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.1em; margin-top: 1.5em; }}
table {{ border-collapse: collapse; }} td, th {{ padding: .25em .8em; border-bottom: 1px solid #ddd; text-align: left; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
.ok {{ color: #17692c; font-weight: bold; }} .bad {{ color: #b00020; font-weight: bold; }}
footer {{ margin-top: 2em; color: #666; font-size: .9em; }}
.charts {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(16em, 1fr)); gap: .5em 1.5em; }}
figure {{ margin: 0; }} figcaption {{ font-size: .9em; }} .note {{ color: #666; font-size: .9em; }}
.series {{ display: grid; grid-template-columns: 1fr; gap: .8em; }}
</style></head><body>
<h1>palletd on this box</h1>
<p id="ready" class="{ready_class}">{}</p>
<table>
<tr><th>MQTT broker</th><td id="broker" class="{broker_class}">{broker_text}</td></tr>
{shared_row}<tr><th>Database</th><td id="database" class="{db_class}">{db_text}</td></tr>
<tr><th>Readings stored per second (last minute)</th><td id="rate" class="n">{}</td></tr>
<tr><th>Readings stored since start</th><td id="stored" class="n">{stored:.0}</td></tr>
<tr><th>Backlog (readings behind)</th><td id="backlog" class="n">{:.0}</td></tr>
<tr><th>Oldest reading not yet in MongoDB</th><td id="backlog-age" class="n">{}</td></tr>
<tr><th>Backlog drains in about</th><td id="backlog-eta" class="n">{}</td></tr>
<tr><th>Spool on disk</th><td id="spool" class="n">{:.1} MB</td></tr>
<tr><th>Readings waiting in memory</th><td id="pending" class="n">{:.0}</td></tr>
<tr><th>Flush delay (stretched while the database cannot keep up)</th><td id="flush-delay" class="n">{}</td></tr>
</table>
"#,
        escape(&ready_text),
        rate.map_or("-".to_string(), |r| format!("{r:.1}")),
        now.get(crate::telemetry::BACKLOG_READINGS),
        match now.get(crate::telemetry::SPOOL_OLDEST_SECONDS) {
            0.0 => "none".to_string(),
            secs => ago((secs * 1000.0) as i64),
        },
        match now.get(crate::telemetry::BACKLOG_ETA_SECONDS) {
            0.0 => "-".to_string(),
            secs => ago((secs * 1000.0) as i64),
        },
        now.get(crate::telemetry::SPOOL_BYTES) / 1e6,
        now.get(crate::telemetry::PENDING_SAMPLES),
        humantime::format_duration(Duration::from_millis(
            (now.get(crate::telemetry::FLUSH_DELAY_SECONDS) * 1000.0).round() as u64
        )),
    );
    if let Some(view) = sensors {
        page.push_str(&sensor_section(view));
    }
    let _ = writeln!(
        page,
        "<h2>The last hour</h2>\n<p class=\"note\">A point every {} s.</p>\n<div class=\"charts\">\n{}</div>",
        SNAPSHOT_EVERY.as_secs(),
        last_hour_charts(history, now_ms)
    );
    page.push_str(&thinning_section(now));
    page.push_str(&dead_letters_section(now, history, now_ms));
    page.push_str(&quiet_section(facts, sensors.is_some(), now_ms));
    let _ = write!(
        page,
        "<footer>palletd <span id=\"version\">{}</span> &middot; {} &middot; refreshes every {refresh} s &middot; <a href=\"/metrics\">/metrics</a></footer>\n</body></html>\n",
        escape(facts.version),
        iso(now_ms)
    );
    page
}

/// Keeps a [`History`] snapshot every [`SNAPSHOT_EVERY`].
pub(crate) async fn keep_history(
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    history: std::sync::Arc<History>,
) {
    let mut tick = tokio::time::interval(SNAPSHOT_EVERY);
    loop {
        tick.tick().await;
        history.record(Snapshot::of(now_ms(), &Figures::parse(&metrics.render())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# HELP palletd_samples_stored_total x\n\
        # TYPE palletd_samples_stored_total counter\n\
        palletd_samples_stored_total 120\n\
        palletd_dead_letters_total{cause=\"bad_json\"} 3\n\
        palletd_dead_letters_total{cause=\"<script>\"} 1\n";

    /// Each chart's points come from consecutive snapshots: rates and
    /// increases per interval, the backlog as it was, the lag's p99 from
    /// the histogram's buckets counted in the interval.
    #[test]
    fn the_charts_points_are_differences_of_consecutive_snapshots() {
        let t0 = 1_000_000_000;
        let at = |i: i64, stored: f64, dead: f64, slow: f64| {
            Snapshot::of(
                t0 + i * 10_000,
                &Figures::parse(&format!(
                    "palletd_samples_stored_total {stored}\n\
                     palletd_backlog_readings 7\n\
                     palletd_database_errors_total{{kind=\"network\"}} {dead}\n\
                     palletd_dead_letters_total{{cause=\"bad_json\"}} {dead}\n\
                     palletd_sample_age_at_write_seconds_bucket{{lane=\"live\",le=\"1\"}} 0\n\
                     palletd_sample_age_at_write_seconds_bucket{{lane=\"live\",le=\"2\"}} {}\n\
                     palletd_sample_age_at_write_seconds_bucket{{lane=\"live\",le=\"5\"}} {stored}\n\
                     palletd_sample_age_at_write_seconds_bucket{{lane=\"live\",le=\"+Inf\"}} {stored}\n\
                     palletd_sample_age_at_write_seconds_bucket{{lane=\"backlog\",le=\"1\"}} 99\n",
                    stored - slow
                )),
            )
        };
        let history = History::default();
        history.record(at(0, 0.0, 0.0, 0.0));
        history.record(at(1, 100.0, 1.0, 100.0));
        history.record(at(2, 300.0, 1.0, 100.0));
        let now = t0 + 20_000;
        let rates = history.series(now, |a, b| Some((b.stored - a.stored) / 10.0));
        assert_eq!(
            rates,
            vec![(t0 + 10_000, Some(10.0)), (t0 + 20_000, Some(20.0))]
        );
        let p99: Vec<Option<f64>> = history
            .series(now, |a, b| age_quantile(a, b, 0.99))
            .into_iter()
            .map(|p| p.1)
            .collect();
        // All 100 between 2 and 5 s; then all 200 between 1 and 2 s.
        assert_eq!(p99, vec![Some(2.0 + 3.0 * 0.99), Some(1.0 + 0.99)]);
        assert_eq!(
            age_quantile(&at(0, 0.0, 0.0, 0.0), &at(0, 0.0, 0.0, 0.0), 0.99),
            None
        );
        let page = render(
            &Facts {
                version: "1",
                ready: Ok(None),
                broker_connected: true,
                shared: None,
                database_reachable: true,
                quiet: vec![],
            },
            &Figures::default(),
            &history,
            now,
            None,
        );
        let points = |id: &str| {
            let at = page
                .find(&format!("<svg id=\"{id}\" data-points=\""))
                .unwrap();
            let rest = &page[at..];
            let start = rest.find("data-points=\"").unwrap() + 13;
            rest[start..start + rest[start..].find('"').unwrap()].to_string()
        };
        let (t1, t2) = (t0 + 10_000, t0 + 20_000);
        assert_eq!(points("chart-stored"), format!("{t1},10 {t2},20"));
        assert_eq!(points("chart-backlog"), format!("{t1},7 {t2},7"));
        assert_eq!(points("chart-db-errors"), format!("{t1},1 {t2},0"));
        assert_eq!(points("chart-dead-letters"), format!("{t1},1 {t2},0"));
        assert!(points("chart-lag").starts_with(&format!("{t1},4.97")));
        assert!(page.contains("<polyline"));
    }

    /// A sensor's chart: a point per step with values (its mean in
    /// `data-points`), a band and a line per run of consecutive steps, a
    /// dot for a step alone; the link asks the API for the same series;
    /// names are escaped.
    #[test]
    fn a_sensors_chart_breaks_at_steps_without_values_and_links_its_series() {
        let hour = 3_600_000;
        let t0 = 1_000 * hour;
        let point = |i: i64, field: &str, v: f64| crate::query::SeriesPoint {
            start_ms: t0 + i * hour,
            field: field.into(),
            n: 2,
            sum: 2.0 * v,
            min: v - 1.0,
            max: v + 1.0,
        };
        let read = SeriesRead {
            from_ms: t0,
            to_ms: t0 + 168 * hour,
            step_ms: hour,
            source: "rollup:1h+windows:2".into(),
            // 0, 1, 2, then 5 alone, then 7, 8.
            points: [0, 1, 2, 5, 7, 8]
                .into_iter()
                .map(|i| point(i, "t<x>", i as f64))
                .collect(),
        };
        let view = SensorView {
            ids: vec!["s<1>".into(), "s2".into()],
            more: true,
            chosen: Some(("s<1>".into(), ChartRange::Week, Ok(read))),
        };
        let page = sensor_section(&view);
        let points = |page: &str| {
            let at = page.find("data-points=\"").unwrap() + 13;
            page[at..at + page[at..].find('"').unwrap()].to_string()
        };
        let want: Vec<String> = [0, 1, 2, 5, 7, 8]
            .iter()
            .map(|i| format!("{},{}", t0 + i * hour, *i as f64))
            .collect();
        assert_eq!(points(&page), want.join(" "));
        assert_eq!(page.matches("<polyline").count(), 2, "{page}");
        assert_eq!(page.matches("<polygon").count(), 2, "{page}");
        assert_eq!(page.matches("<circle").count(), 1, "{page}");
        assert!(!page.contains("s<1>") && !page.contains("t<x>"), "{page}");
        assert!(page.contains("id=\"sensor-t&lt;x&gt;\""), "{page}");
        assert!(
            page.contains("/api/series?sensor=s%3C1%3E&amp;field=t%3Cx%3E&amp;from="),
            "{page}"
        );
        assert!(page.contains("&amp;step=3600s&amp;format=json"), "{page}");
        assert!(page.contains("<option value=\"week\" selected>"), "{page}");
        assert!(page.contains("the first 2 sensors by id"), "{page}");
        assert!(
            page.contains("from the 1h rollup (2 of its intervals"),
            "{page}"
        );
        // A failed read says why; nothing chosen, only the chooser.
        let failed = SensorView {
            chosen: Some(("s2".into(), ChartRange::Hour, Err("down".into()))),
            ..SensorView::default()
        };
        assert!(sensor_section(&failed).contains("Cannot read its series: down"));
        let none = sensor_section(&SensorView::default());
        assert!(none.contains("<form") && !none.contains("<svg"));
    }

    #[test]
    fn figures_are_read_from_the_metrics_text() {
        let f = Figures::parse(PAGE);
        assert_eq!(f.get("palletd_samples_stored_total"), 120.0);
        assert_eq!(f.get("palletd_absent"), 0.0);
        let dead = f.by_label("palletd_dead_letters_total");
        assert_eq!(dead.get("bad_json"), Some(&3.0));
    }

    #[test]
    fn rates_and_the_last_hour_come_from_history_and_text_is_escaped() {
        let history = History::default();
        let t0 = 1_000_000_000;
        history.record(Snapshot::of(
            t0,
            &Figures::parse(
                "palletd_samples_stored_total 0\npalletd_dead_letters_total{cause=\"bad_json\"} 1\n",
            ),
        ));
        let facts = Facts {
            version: "1.0 (abc)",
            ready: Err("database unreachable"),
            broker_connected: true,
            shared: Some((
                "NOT delivered by the broker: one connection, unshared",
                false,
            )),
            database_reachable: false,
            quiet: vec![("s<1>".into(), t0)],
        };
        let page = render(&facts, &Figures::parse(PAGE), &history, t0 + 60_000, None);
        assert!(
            page.contains(r#"<td id="rate" class="n">2.0</td>"#),
            "{page}"
        );
        assert!(page.contains(r#"id="dead-bad_json">2<"#), "{page}");
        assert!(page.contains("&lt;script&gt;") && !page.contains("<script>"));
        assert!(page.contains("s&lt;1&gt;"));
        assert!(page.contains("Not ready: database unreachable"));
    }
}
