//! A sensor's charts on the status page (`/?sensor=ID&range=hour|day|week`):
//! the chooser, and per numeric field an inline SVG chart of its mean per step
//! over the band of its least and greatest value, read as `/api/series`
//! answers it ([`super::status`] says more).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use super::status::*;
use crate::clock::iso;

/// The spans a sensor's charts show, each in steps of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ChartRange {
    Hour,
    #[default]
    Day,
    Week,
}

impl ChartRange {
    pub const ALL: [ChartRange; 3] = [ChartRange::Hour, ChartRange::Day, ChartRange::Week];

    pub fn parse(text: &str) -> Option<ChartRange> {
        ChartRange::ALL.into_iter().find(|r| r.name() == text)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            ChartRange::Hour => "hour",
            ChartRange::Day => "day",
            ChartRange::Week => "week",
        }
    }

    pub(crate) fn span_ms(self) -> i64 {
        match self {
            ChartRange::Hour => 3_600_000,
            ChartRange::Day => 86_400_000,
            ChartRange::Week => 7 * 86_400_000,
        }
    }

    /// A point a minute, a quarter of an hour, an hour: 60, 96 and 168
    /// points.
    pub(crate) fn step_ms(self) -> i64 {
        match self {
            ChartRange::Hour => 60_000,
            ChartRange::Day => 900_000,
            ChartRange::Week => 3_600_000,
        }
    }
}

/// A sensor's series as the charts draw it: what `/api/series` answers
/// for `sensor`, `from`, `to` and `step` (each chart links to that).
#[derive(Debug, Clone)]
pub(crate) struct SeriesRead {
    pub from_ms: i64,
    pub to_ms: i64,
    pub step_ms: i64,
    /// `X-Palletd-Source`'s value.
    pub source: String,
    pub points: Vec<crate::query::SeriesPoint>,
}

/// The page's sensor charts: the sensors to choose from (the first by id
/// of `<collection>_latest`; more may be typed), and the chosen one's
/// series, or why it could not be read.
#[derive(Debug, Clone, Default)]
pub(crate) struct SensorView {
    pub ids: Vec<String>,
    pub more: bool,
    pub chosen: Option<(String, ChartRange, Result<SeriesRead, String>)>,
}

/// The query string of `/api/series` for `sensor`'s `field` as `read`.
pub(super) fn series_query(sensor: &str, field: &str, read: &SeriesRead, format: &str) -> String {
    let step = format!("{}s", read.step_ms / 1000);
    serde_urlencoded::to_string([
        ("sensor", sensor),
        ("field", field),
        ("from", &iso(read.from_ms)),
        ("to", &iso(read.to_ms)),
        ("step", &step),
        ("format", format),
    ])
    .unwrap_or_default()
}

/// The chooser, and the chosen sensor's charts: one per numeric field,
/// its mean per step as a line over the band of its least and greatest
/// values (broken where a step has none), the means in `data-points`
/// (`<step start ms>,<mean>`), a link to the same series from the API.
pub(super) fn sensor_section(view: &SensorView) -> String {
    let mut out = String::from("<h2 id=\"sensor-charts\">Charts of a sensor</h2>\n");
    let (chosen, range) = view
        .chosen
        .as_ref()
        .map_or(("", ChartRange::default()), |c| (c.0.as_str(), c.1));
    let _ = write!(
        out,
        "<form method=\"get\" action=\"/\"><input name=\"sensor\" list=\"sensor-ids\" value=\"{}\" placeholder=\"sensor id\" aria-label=\"sensor\"> <select name=\"range\" aria-label=\"range\">",
        escape(chosen)
    );
    for r in ChartRange::ALL {
        let selected = if r == range { " selected" } else { "" };
        let _ = write!(
            out,
            "<option value=\"{0}\"{selected}>last {0}</option>",
            r.name()
        );
    }
    out.push_str("</select> <button>Show</button><datalist id=\"sensor-ids\">");
    for id in &view.ids {
        let _ = write!(out, "<option value=\"{}\">", escape(id));
    }
    out.push_str("</datalist></form>\n");
    if view.more {
        let _ = writeln!(
            out,
            "<p class=\"note\">The list holds the first {} sensors by id; type any other.</p>",
            view.ids.len()
        );
    }
    let Some((sensor, range, read)) = &view.chosen else {
        return out;
    };
    let links: Vec<String> = ChartRange::ALL
        .iter()
        .map(|r| {
            let q = serde_urlencoded::to_string([("sensor", sensor.as_str()), ("range", r.name())])
                .unwrap_or_default();
            format!(
                "<a href=\"/?{}#sensor-charts\">last {}</a>",
                escape(&q),
                r.name()
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "<p>{}: {}</p>",
        escape(sensor),
        links.join(" &middot; ")
    );
    let read = match read {
        Ok(read) => read,
        Err(why) => {
            let _ = writeln!(
                out,
                "<p id=\"sensor-error\" class=\"bad\">Cannot read its series: {}</p>",
                escape(why)
            );
            return out;
        }
    };
    let mut fields: BTreeMap<&str, Vec<&crate::query::SeriesPoint>> = BTreeMap::new();
    for p in &read.points {
        fields.entry(p.field.as_str()).or_default().push(p);
    }
    if fields.is_empty() {
        let _ = writeln!(
            out,
            "<p id=\"sensor-empty\">No numeric reading of {} in the last {}.</p>",
            escape(sensor),
            range.name()
        );
        return out;
    }
    let _ = writeln!(
        out,
        "<p class=\"note\">A point per {} from {}; the line is the mean, the band the least and greatest value.</p>\n<div class=\"series\">",
        humantime::format_duration(Duration::from_millis(read.step_ms as u64)),
        escape(&source_text(&read.source))
    );
    for (field, points) in fields {
        out.push_str(&series_chart(sensor, field, &points, read, *range));
    }
    out.push_str("</div>\n");
    out
}

/// `X-Palletd-Source`'s value in words.
pub(super) fn source_text(source: &str) -> String {
    let Some(rollup) = source.strip_prefix("rollup:") else {
        return match source {
            "samples" => "the samples".into(),
            _ => "the windows' summaries".into(),
        };
    };
    match rollup.split_once("+windows:") {
        Some((name, n)) => format!(
            "the {name} rollup ({n} of its intervals not rolled up yet: from the windows' summaries)"
        ),
        None => format!("the {rollup} rollup"),
    }
}

/// One field's chart of a sensor's series (see [`sensor_section`]).
pub(super) fn series_chart(
    sensor: &str,
    field: &str,
    points: &[&crate::query::SeriesPoint],
    read: &SeriesRead,
    range: ChartRange,
) -> String {
    const W: f64 = 600.0;
    const H: f64 = 120.0;
    let lo = points.iter().map(|p| p.min).fold(f64::INFINITY, f64::min);
    let hi = points
        .iter()
        .map(|p| p.max)
        .fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if hi > lo {
        (lo, hi)
    } else {
        (lo - 1.0, hi + 1.0)
    };
    let span = (read.to_ms - read.from_ms).max(1) as f64;
    let x = |t: i64| (t + read.step_ms / 2 - read.from_ms) as f64 / span * W;
    let y = |v: f64| H - (v - lo) / (hi - lo) * H;
    // Runs of consecutive steps: a band and a line each, a dot alone.
    let mut shapes = String::new();
    let mut runs: Vec<&[&crate::query::SeriesPoint]> = Vec::new();
    let mut start = 0;
    for i in 1..=points.len() {
        if i == points.len() || points[i].start_ms - points[i - 1].start_ms != read.step_ms {
            runs.push(&points[start..i]);
            start = i;
        }
    }
    for run in runs {
        let line: Vec<String> = run
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.start_ms), y(p.avg())))
            .collect();
        if let [one] = run {
            let _ = write!(
                shapes,
                "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{1:.1}\" y2=\"{2:.1}\" stroke=\"#a9c4e6\" stroke-width=\"3\"/><circle cx=\"{0:.1}\" cy=\"{3:.1}\" r=\"1.5\" fill=\"#1f5fa8\"/>",
                x(one.start_ms),
                y(one.min),
                y(one.max),
                y(one.avg())
            );
            continue;
        }
        let band: Vec<String> = run
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.start_ms), y(p.max)))
            .chain(
                run.iter()
                    .rev()
                    .map(|p| format!("{:.1},{:.1}", x(p.start_ms), y(p.min))),
            )
            .collect();
        let _ = write!(
            shapes,
            "<polygon points=\"{}\" fill=\"#a9c4e6\" stroke=\"none\"/><polyline points=\"{}\" fill=\"none\" stroke=\"#1f5fa8\" stroke-width=\"1.5\"/>",
            band.join(" "),
            line.join(" ")
        );
    }
    let data: Vec<String> = points
        .iter()
        .map(|p| format!("{},{}", p.start_ms, p.avg()))
        .collect();
    let last = points.last().map_or(f64::NAN, |p| p.avg());
    let id = format!("sensor-{}", escape(field));
    format!(
        r##"<figure><figcaption>{field}: <span id="{id}-last">{last:.2}</span> (the last mean) &middot; <a id="{id}-json" href="/api/series?{json}">JSON</a> &middot; <a href="/api/series?{csv}">CSV</a></figcaption>
<svg id="{id}" data-points="{data}" viewBox="-2 -12 {vw} {vh}" width="100%" role="img" aria-label="{field} of {sensor}, last {range}">
<rect x="0" y="0" width="{W}" height="{H}" fill="#f7f7f7" stroke="#ccc"/>
<text x="2" y="-2" font-size="9" fill="#666">max {hi}</text><text x="2" y="{below}" font-size="9" fill="#666">min {lo} &middot; 1 {range} ago</text><text x="{W}" y="{below}" font-size="9" fill="#666" text-anchor="end">now</text>
{shapes}</svg></figure>
"##,
        field = escape(field),
        sensor = escape(sensor),
        json = escape(&series_query(sensor, field, read, "json")),
        csv = escape(&series_query(sensor, field, read, "csv")),
        data = data.join(" "),
        vw = W + 4.0,
        vh = H + 26.0,
        hi = short(hi),
        lo = short(lo),
        below = H + 11.0,
        range = range.name(),
    )
}
