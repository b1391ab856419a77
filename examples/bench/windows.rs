//! The `windows` scenario: one sensor with many windows.

use crate::*;

pub(crate) fn windows(args: WindowsArgs) -> anyhow::Result<()> {
    let started = chrono::Utc::now();
    let sensors = args.run.sensors[0];
    let mut runs: Vec<(u16, String)> = Vec::new();
    for &w in &args.windows {
        runs.push((w, "ceiling".into()));
        runs.push((w, "batched".into()));
        for &c in &args.connections {
            runs.push((w, format!("buckets-c{c}")));
        }
    }
    runs.push((args.yardstick_window, "buckets-c1".into()));
    let mut rows = Vec::new();
    let mut text = String::from(
        "| window | sink | readings/s | of the ceiling | of the batched bridge | of 1 connection at the yardstick window | CPU µs / reading |\n|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for (w, kind) in &runs {
        let mut run = args.run.clone();
        run.inflight = *w;
        eprintln!("== window {w}: {kind}, {sensors} sensors");
        let svc = Services::start(&run)?;
        let sink = start_sink(&run, kind, &svc)?;
        let m = step(&run, &svc, &sink, sensors, 150_000.0, args.secs)?;
        let rate = m.step.durable as f64 / m.step.seconds;
        let cpu = m.cpu.as_secs_f64() * 1e6 / m.step.durable.max(1) as f64;
        eprintln!("   {rate:.0} readings/s, {cpu:.1} µs CPU per reading");
        rows.push((*w, kind.clone(), rate, cpu));
    }
    let rate_of = |w: u16, k: &str| {
        rows.iter()
            .find(|r| r.0 == w && r.1 == k)
            .map_or(f64::NAN, |r| r.2)
    };
    let yardstick = rate_of(args.yardstick_window, "buckets-c1");
    for (w, kind, rate, cpu) in &rows {
        use std::fmt::Write as _;
        let _ = writeln!(
            text,
            "| {w} | {kind} | {rate:.0} | {:.2} | {:.2} | {:.2} | {cpu:.1} |",
            rate / rate_of(*w, "ceiling"),
            rate / rate_of(*w, "batched"),
            rate / yardstick,
        );
    }
    let doc = json!({
        "date": started.to_rfc3339(),
        "machine": machine(),
        "commit": Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()).map(|s| s.trim().to_string()),
        "sensors": sensors,
        "secs": args.secs,
        "yardstick_window": args.yardstick_window,
        "rows": rows.iter().map(|(w, k, r, c)| json!({
            "window": w, "sink": k, "readings_per_s": r, "cpu_us_per_reading": c,
        })).collect::<Vec<_>>(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let stem = format!("windows-{}", started.format("%Y-%m-%dT%H%M%SZ"));
    let path = args.run.out.join(format!("{stem}.json"));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    std::fs::write(args.run.out.join(format!("{stem}-table.md")), &text)?;
    println!("{text}");
    println!("raw results: {}", path.display());
    Ok(())
}
