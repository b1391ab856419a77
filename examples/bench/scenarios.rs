//! The `run` command: each scenario stepped up to its highest sustained rate, and the table.

use crate::*;

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ScenarioResult {
    pub(crate) scenario: String,
    pub(crate) sensors: usize,
    pub(crate) probe_per_s: f64,
    pub(crate) steps: Vec<Step>,
    pub(crate) max_sustained_per_s: f64,
    /// Figures of the step at 80% of the highest sustained rate.
    pub(crate) at_80: Option<Figures>,
    /// Data directory bytes after a checkpoint / readings stored.
    pub(crate) data_bytes_per_reading: Option<f64>,
    /// Peak RSS over the stepped run (the last, overloaded, step included).
    pub(crate) rss_steps_mb: f64,
}

/// What one sustained step showed.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Figures {
    pub(crate) rate: f64,
    pub(crate) lag_p50_s: Option<f64>,
    pub(crate) lag_p99_s: Option<f64>,
    pub(crate) db_write_commands_per_reading: Option<f64>,
    pub(crate) db_write_ops_per_reading: Option<f64>,
    /// Documents inserted, updated or deleted per reading: the database's
    /// write work whatever the batching.
    pub(crate) db_documents_written_per_reading: Option<f64>,
    /// Bucket bytes the database rewrote per stored reading (palletd,
    /// bucket mode).
    pub(crate) bytes_rewritten_per_reading: Option<f64>,
    pub(crate) cpu_us_per_reading: f64,
    /// Peak RSS of the process so far (steps only go up to this one).
    pub(crate) peak_rss_mb: f64,
}

/// One measured step, with the database's write counters around it.
pub(crate) fn measure(
    args: &RunArgs,
    svc: &Services,
    sink: &Sink,
    kind: &str,
    sensors: usize,
    rate: f64,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<(Measured, Figures)> {
    let uri = svc.mongodb_uri();
    let db = kind != "ceiling";
    let before = if db {
        rt.block_on(db_writes(&uri))?
    } else {
        (0.0, 0.0, 0.0)
    };
    let m = step(args, svc, sink, sensors, rate, args.step_secs)?;
    let after = if db {
        rt.block_on(db_writes(&uri))?
    } else {
        (0.0, 0.0, 0.0)
    };
    let n = m.step.durable.max(1) as f64;
    let fig = Figures {
        rate,
        lag_p50_s: quantile(&m.before.age, &m.after.age, 0.50),
        lag_p99_s: quantile(&m.before.age, &m.after.age, 0.99),
        db_write_commands_per_reading: db.then(|| (after.0 - before.0) / n),
        db_write_ops_per_reading: db.then(|| (after.1 - before.1) / n),
        db_documents_written_per_reading: db.then(|| (after.2 - before.2) / n),
        bytes_rewritten_per_reading: (palletd_kind(kind).is_some_and(|k| k.0 == "buckets"))
            .then(|| (m.after.rewritten - m.before.rewritten) / n),
        cpu_us_per_reading: m.cpu.as_secs_f64() * 1e6 / n,
        peak_rss_mb: sink.peak_rss() as f64 / 1e6,
    };
    Ok((m, fig))
}

/// `--rates`: fixed steps on one set of services, CPU and RSS after each
/// (for profiling; no probe, no table).
pub(crate) fn fixed_rates(args: &RunArgs, kind: &str, sensors: usize) -> anyhow::Result<()> {
    eprintln!("== {kind}, {sensors} sensors");
    let svc = Services::start(args)?;
    let sink = start_sink(args, kind, &svc)?;
    eprintln!("  {kind} pids {:?}", sink.pids());
    for &rate in &args.rates {
        let m = step(args, &svc, &sink, sensors, rate, args.step_secs)?;
        let fsyncs = m.after.fsyncs - m.before.fsyncs;
        eprintln!(
            "    cpu {:.1} µs/reading, peak RSS {:.0} MB, {:.0} spool fsyncs/s, {:.1} readings per fsync",
            m.cpu.as_secs_f64() * 1e6 / m.step.durable.max(1) as f64,
            sink.peak_rss() as f64 / 1e6,
            fsyncs / m.step.seconds,
            m.step.durable as f64 / fsyncs.max(1.0)
        );
    }
    Ok(())
}

pub(crate) fn scenario(
    args: &RunArgs,
    kind: &str,
    sensors: usize,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<ScenarioResult> {
    eprintln!("== {kind}, {sensors} sensors");
    // Probe: overload for a short while; what comes through estimates the
    // capacity. Then fresh services for the steps.
    let probe = {
        let svc = Services::start(args)?;
        let sink = start_sink(args, kind, &svc)?;
        let m = step(args, &svc, &sink, sensors, 150_000.0, 15)?;
        (m.step.durable as f64 / m.step.seconds).max(50.0)
    };
    eprintln!("  probe: {probe:.0}/s");
    // Steps at 70% of the probe and up by 1.25 each, so the step below the
    // highest sustained one ran at 80% of it: its figures are the ones
    // reported. (If the first step is the highest, one more run at 80%.)
    let svc = Services::start(args)?;
    let sink = start_sink(args, kind, &svc)?;
    let mut factor = 0.7;
    step(args, &svc, &sink, sensors, probe * factor, args.warmup_secs)?;
    let mut steps = Vec::new();
    let mut sustained: Vec<Figures> = Vec::new();
    loop {
        let (m, fig) = measure(args, &svc, &sink, kind, sensors, probe * factor, rt)?;
        let ok = m.step.sustained;
        steps.push(m.step);
        if ok {
            sustained.push(fig);
            factor *= 1.25;
            if factor > 6.0 {
                break;
            }
        } else if !sustained.is_empty() || factor < 0.05 {
            break;
        } else {
            factor *= 0.5;
        }
    }
    let rss_steps = sink.peak_rss();
    let data_bytes_per_reading = if kind == "ceiling" {
        None
    } else {
        // Everything this database holds came through this sink.
        let total = sink.scrape()?.stored.max(1.0);
        let bytes = rt.block_on(data_bytes(&svc.mongodb_uri(), &svc.db.data_dir()))?;
        Some(bytes as f64 / total)
    };
    drop(sink);
    drop(svc);
    let best = sustained.last().map_or(0.0, |f| f.rate);
    let at_80 = match sustained.len() {
        0 => None,
        n if n >= 2 && (sustained[n - 2].rate / best - 0.8).abs() < 0.01 => {
            Some(sustained[n - 2].clone())
        }
        _ => {
            let rate = best * 0.8;
            eprintln!("  at 80%: {rate:.0}/s");
            let svc = Services::start(args)?;
            let sink = start_sink(args, kind, &svc)?;
            step(args, &svc, &sink, sensors, rate, args.warmup_secs)?;
            Some(measure(args, &svc, &sink, kind, sensors, rate, rt)?.1)
        }
    };
    let out = ScenarioResult {
        scenario: kind.to_string(),
        sensors,
        probe_per_s: probe,
        steps,
        max_sustained_per_s: best,
        at_80,
        data_bytes_per_reading,
        rss_steps_mb: rss_steps as f64 / 1e6,
    };
    Ok(out)
}

pub(crate) fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({ "cpu": model, "cores": cores, "memory": mem, "kernel": kernel.trim() })
}

pub(crate) fn fmt(x: Option<f64>, digits: usize) -> String {
    x.map_or("–".into(), |v| format!("{v:.digits$}"))
}

pub(crate) fn table(results: &[ScenarioResult]) -> String {
    let mut t = String::from(
        "| scenario | sensors | max sustained readings/s | lag p50 / p99 at 80% | DB write cmds / reading | DB write ops / reading | DB docs written / reading | bytes rewritten / reading | data bytes / reading | CPU µs / reading at 80% | peak RSS MB at 80% (whole run) |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        let f = r.at_80.as_ref();
        t += &format!(
            "| {} | {} | {:.0} | {} / {} s | {} | {} | {} | {} | {} | {} | {} ({:.0}) |\n",
            r.scenario,
            r.sensors,
            r.max_sustained_per_s,
            fmt(f.and_then(|f| f.lag_p50_s), 2),
            fmt(f.and_then(|f| f.lag_p99_s), 2),
            fmt(f.and_then(|f| f.db_write_commands_per_reading), 4),
            fmt(f.and_then(|f| f.db_write_ops_per_reading), 3),
            fmt(f.and_then(|f| f.db_documents_written_per_reading), 3),
            fmt(f.and_then(|f| f.bytes_rewritten_per_reading), 0),
            fmt(r.data_bytes_per_reading, 0),
            fmt(f.map(|f| f.cpu_us_per_reading), 1),
            fmt(f.map(|f| f.peak_rss_mb), 0),
            r.rss_steps_mb
        );
    }
    t
}

pub(crate) fn run(args: RunArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    if !args.rates.is_empty() {
        for &sensors in &args.sensors {
            for kind in &args.scenarios {
                fixed_rates(&args, kind, sensors)?;
            }
        }
        return Ok(());
    }
    let started = chrono::Utc::now();
    let mut results = Vec::new();
    for &sensors in &args.sensors {
        for kind in &args.scenarios {
            if args.skip.contains(&format!("{kind}/{sensors}")) {
                continue;
            }
            results.push(scenario(&args, kind, sensors, &rt)?);
            eprintln!("{}", table(&results));
        }
    }
    let mut summary = BTreeMap::new();
    for r in &results {
        summary.insert(
            format!("{}/{}", r.scenario, r.sensors),
            r.max_sustained_per_s,
        );
    }
    let doc = json!({
        "date": started.to_rfc3339(),
        "machine": machine(),
        "commit": Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()).map(|s| s.trim().to_string()),
        "step_secs": args.step_secs,
        "warmup_secs": args.warmup_secs,
        "broker": { "max_inflight_messages": args.inflight, "max_queued_messages": args.queued },
        "batch": args.batch.unwrap_or(args.inflight as usize),
        "results": results,
        "max_sustained": summary,
    });
    std::fs::create_dir_all(&args.out)?;
    let path = args
        .out
        .join(format!("{}.json", started.format("%Y-%m-%dT%H%M%SZ")));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("{}", table(&results));
    println!("machine: {}", doc["machine"]);
    println!("raw results: {}", path.display());
    Ok(())
}
