//! The `closer` scenario: what sealing costs beside live writes.

use crate::*;

/// What the closer did, from palletd's metrics (`seconds` from the
/// histogram's `_sum`, read separately).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub(crate) struct CloserFigures {
    pub(crate) runs: f64,
    pub(crate) seconds: f64,
    /// Rollup passes (on their own task) and their time.
    pub(crate) passes: f64,
    pub(crate) pass_seconds: f64,
    pub(crate) sealed: f64,
    pub(crate) rollup_statements: f64,
    pub(crate) rollups_written: f64,
    pub(crate) stored: f64,
}

pub(crate) fn closer_figures(sink: &Sink) -> anyhow::Result<CloserFigures> {
    let body = http_get(sink.procs[0].1, "/metrics")?;
    let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))?;
    let mut f = CloserFigures::default();
    for s in parsed.samples {
        let counter = match &s.value {
            prometheus_parse::Value::Counter(v) => Some(*v),
            _ => None,
        };
        match s.metric.as_str() {
            m if m == palletd::telemetry::CLOSER_SECONDS => {
                if let prometheus_parse::Value::Histogram(h) = &s.value {
                    f.runs = h.iter().map(|b| b.count).fold(0.0, f64::max);
                }
            }
            m if m == palletd::telemetry::ROLLUP_PASS_SECONDS => {
                if let prometheus_parse::Value::Histogram(h) = &s.value {
                    f.passes = h.iter().map(|b| b.count).fold(0.0, f64::max);
                }
            }
            m if m == palletd::telemetry::BUCKETS_SEALED => f.sealed = counter.unwrap_or(0.0),
            m if m == palletd::telemetry::ROLLUP_STATEMENTS => {
                f.rollup_statements = counter.unwrap_or(0.0)
            }
            m if m == palletd::telemetry::ROLLUPS_WRITTEN => {
                f.rollups_written = counter.unwrap_or(0.0)
            }
            m if m == palletd::telemetry::SAMPLES_STORED => f.stored = counter.unwrap_or(0.0),
            _ => {}
        }
    }
    Ok(f)
}

/// The histogram's sum is not in prometheus_parse's histogram value:
/// read it from the text.
pub(crate) fn histogram_sum(port: u16, name: &str) -> anyhow::Result<f64> {
    let body = http_get(port, "/metrics")?;
    let line = body
        .lines()
        .find(|l| l.starts_with(&format!("{name}_sum")))
        .unwrap_or_default();
    Ok(line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0))
}

pub(crate) fn closer(args: CloserArgs) -> anyhow::Result<()> {
    // Windows of 10 s sealed 2 s after they end, the closer every 5 s;
    // rollups of 30 s and 1 min, so both fall due during the run.
    let common = "[bucket]\nwindow = \"10s\"\n[closer]\ninterval = \"5s\"\ngrace = \"2s\"\n[flush]\nmax_delay = \"2s\"\n";
    let rollups = "[[rollup]]\ninterval = \"30s\"\n[[rollup]]\ninterval = \"1m\"\n";
    let mut rows = Vec::new();
    for (label, tail) in [
        ("rollups off", common.to_string()),
        ("rollups 30s + 1m", format!("{common}{rollups}")),
    ] {
        eprintln!("== closer, {label}");
        let svc = Services::start(&args.run)?;
        let sink = buckets_sink(&args.run, &svc, &tail)?;
        let port = sink.procs[0].1;
        let mut before = closer_figures(&sink)?;
        before.seconds = histogram_sum(port, palletd::telemetry::CLOSER_SECONDS)?;
        before.pass_seconds = histogram_sum(port, palletd::telemetry::ROLLUP_PASS_SECONDS)?;
        let m = step(&args.run, &svc, &sink, args.sensors, args.rate, args.secs)?;
        // The windows of the last readings close too.
        std::thread::sleep(Duration::from_secs(20));
        let mut after = closer_figures(&sink)?;
        after.seconds = histogram_sum(port, palletd::telemetry::CLOSER_SECONDS)?;
        after.pass_seconds = histogram_sum(port, palletd::telemetry::ROLLUP_PASS_SECONDS)?;
        let d = CloserFigures {
            runs: after.runs - before.runs,
            seconds: after.seconds - before.seconds,
            passes: after.passes - before.passes,
            pass_seconds: after.pass_seconds - before.pass_seconds,
            sealed: after.sealed - before.sealed,
            rollup_statements: after.rollup_statements - before.rollup_statements,
            rollups_written: after.rollups_written - before.rollups_written,
            stored: after.stored - before.stored,
        };
        eprintln!("  {d:?} ({:.0}/s durable)", m.step.achieved_per_s);
        let bytes = tokio::runtime::Runtime::new()?.block_on(sealed_bytes(&svc.mongodb_uri()))?;
        eprintln!(
            "  sealed buckets: {} readings in {} buckets, {:.1} bytes per reading, of which lsns {:.2}; {} of {} still carry lsns",
            bytes.readings, bytes.buckets, bytes.bytes as f64 / bytes.readings.max(1) as f64,
            bytes.lsns_bytes as f64 / bytes.readings.max(1) as f64, bytes.with_lsns, bytes.buckets,
        );
        rows.push((label, d, m.step));
    }
    println!("| closer | runs | sealed buckets | seal ms / sealed bucket | rollup pass ms / sealed bucket | statements / sealed bucket | rollups written | offered / durable readings/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (label, d, step) in &rows {
        let sealed = d.sealed.max(1.0);
        // The seal is one update statement per run; rollups add theirs.
        let statements = d.runs + d.rollup_statements;
        println!(
            "| {label} | {:.0} | {:.0} | {:.3} | {:.3} | {:.3} | {:.0} | {:.0} / {:.0}{} |",
            d.runs,
            d.sealed,
            d.seconds * 1000.0 / sealed,
            d.pass_seconds * 1000.0 / sealed,
            statements / sealed,
            d.rollups_written,
            step.target_per_s,
            step.achieved_per_s,
            if step.sustained {
                ""
            } else {
                " (not sustained)"
            }
        );
    }
    Ok(())
}
