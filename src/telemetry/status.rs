//! The status page at `/`: one plain HTML page a technician opens on site.
//! No script, no external asset, no build step; it refreshes itself every
//! five seconds. Every figure on it is a value of `/metrics` (read from the
//! same Prometheus registry when the page is rendered), or a difference of
//! two such values in time ([`History`]: readings stored per second, dead
//! letters in the last hour), plus readiness and the sensors that have been
//! quiet longest (the spooler's bookkeeping of when each sensor was last
//! heard from).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::{iso, now_ms};

/// How often [`History`] keeps a snapshot, and how long it keeps them.
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(10);
const KEEP: Duration = Duration::from_secs(3600);

/// A parsed `/metrics` page: series (name with labels, as printed) to value.
#[derive(Debug, Default, Clone)]
pub struct Figures(BTreeMap<String, f64>);

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
    pub fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }

    /// `label value -> value` of every series of `name` with one label.
    pub fn by_label(&self, name: &str) -> BTreeMap<String, f64> {
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

/// Snapshots of the counters the page shows as rates, one per
/// [`SNAPSHOT_EVERY`], for the last hour.
#[derive(Debug, Default)]
pub struct History(Mutex<VecDeque<(i64, Figures)>>);

impl History {
    pub fn record(&self, at_ms: i64, figures: Figures) {
        let mut h = self.0.lock().unwrap_or_else(|e| e.into_inner());
        h.push_back((at_ms, figures));
        while h
            .front()
            .is_some_and(|f| at_ms - f.0 > KEEP.as_millis() as i64 + 10_000)
        {
            h.pop_front();
        }
    }

    /// The oldest snapshot taken at least `ago` before `now_ms`, else the
    /// oldest kept (palletd is younger than `ago`).
    fn at_least(&self, now_ms: i64, ago: Duration) -> Option<(i64, Figures)> {
        let h = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let cutoff = now_ms - ago.as_millis() as i64;
        h.iter()
            .rev()
            .find(|s| s.0 <= cutoff)
            .or_else(|| h.front())
            .cloned()
    }
}

/// What the page shows besides `/metrics`.
pub struct Facts<'a> {
    pub version: &'a str,
    /// `Ok` when ready, else why not.
    pub ready: Result<Option<String>, &'static str>,
    pub broker_connected: bool,
    pub database_reachable: bool,
    /// (sensor, last reading ms), the longest quiet first.
    pub quiet: Vec<(String, i64)>,
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ago(ms: i64) -> String {
    let secs = (ms / 1000).max(0) as u64;
    humantime::format_duration(Duration::from_secs(secs)).to_string()
}

/// Renders the page at `now_ms`.
pub fn render(facts: &Facts, now: &Figures, history: &History, now_ms: i64) -> String {
    let stored = now.get(super::SAMPLES_STORED);
    let rate = history
        .at_least(now_ms, Duration::from_secs(60))
        .filter(|(at, _)| now_ms - at >= 1000)
        .map(|(at, then)| {
            (stored - then.get(super::SAMPLES_STORED)) * 1000.0 / (now_ms - at) as f64
        });
    let dead_now = now.by_label(super::DEAD_LETTERS);
    let dead_then = history
        .at_least(now_ms, KEEP)
        .map(|(_, f)| f.by_label(super::DEAD_LETTERS))
        .unwrap_or_default();
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
    let (db_class, db_text) = if facts.database_reachable {
        ("ok", "reachable")
    } else {
        ("bad", "unreachable")
    };
    let mut page = String::with_capacity(8192);
    let _ = write!(
        page,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="5">
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
</style></head><body>
<h1>palletd on this box</h1>
<p id="ready" class="{ready_class}">{}</p>
<table>
<tr><th>MQTT broker</th><td id="broker" class="{broker_class}">{broker_text}</td></tr>
<tr><th>Database</th><td id="database" class="{db_class}">{db_text}</td></tr>
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
        now.get(super::BACKLOG_READINGS),
        match now.get(super::SPOOL_OLDEST_SECONDS) {
            0.0 => "none".to_string(),
            secs => ago((secs * 1000.0) as i64),
        },
        match now.get(super::BACKLOG_ETA_SECONDS) {
            0.0 => "-".to_string(),
            secs => ago((secs * 1000.0) as i64),
        },
        now.get(super::SPOOL_BYTES) / 1e6,
        now.get(super::PENDING_SAMPLES),
        humantime::format_duration(Duration::from_millis(
            (now.get(super::FLUSH_DELAY_SECONDS) * 1000.0).round() as u64
        )),
    );
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
    page.push_str("<h2>Sensors quiet the longest</h2>\n");
    if facts.quiet.is_empty() {
        page.push_str("<p id=\"quiet\">No sensor heard from yet.</p>\n");
    } else {
        page.push_str(
            "<table id=\"quiet\"><tr><th>sensor</th><th>last reading</th><th>ago</th></tr>\n",
        );
        for (sensor, at) in &facts.quiet {
            let _ = writeln!(
                page,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
                escape(sensor),
                iso(*at),
                ago(now_ms - at)
            );
        }
        page.push_str("</table>\n");
    }
    let _ = write!(
        page,
        "<footer>palletd <span id=\"version\">{}</span> &middot; {} &middot; refreshes every 5 s &middot; <a href=\"/metrics\">/metrics</a></footer>\n</body></html>\n",
        escape(facts.version),
        iso(now_ms)
    );
    page
}

/// Keeps a [`History`] snapshot every [`SNAPSHOT_EVERY`].
pub async fn keep_history(
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    history: std::sync::Arc<History>,
) {
    let mut tick = tokio::time::interval(SNAPSHOT_EVERY);
    loop {
        tick.tick().await;
        history.record(now_ms(), Figures::parse(&metrics.render()));
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
        history.record(
            t0,
            Figures::parse(
                "palletd_samples_stored_total 0\npalletd_dead_letters_total{cause=\"bad_json\"} 1\n",
            ),
        );
        let facts = Facts {
            version: "1.0 (abc)",
            ready: Err("database unreachable"),
            broker_connected: true,
            database_reachable: false,
            quiet: vec![("s<1>".into(), t0)],
        };
        let page = render(&facts, &Figures::parse(PAGE), &history, t0 + 60_000);
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
