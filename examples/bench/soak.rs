//! The `soak` scenario: palletd watched over a long run.

use crate::*;

/// One look at palletd during a soak.
pub(crate) struct Mark {
    pub(crate) at: f64,
    pub(crate) scrape: Scrape,
    pub(crate) statements: f64,
    pub(crate) delay_s: f64,
    pub(crate) peak_rss_mb: f64,
    pub(crate) cpu: Duration,
    /// Windows looked up before a write, and the closer's time (seals).
    pub(crate) lookups: f64,
    pub(crate) sealing_s: f64,
}

pub(crate) fn soak(mut args: SoakArgs) -> anyhow::Result<()> {
    let ceiling = match args.of_ceiling {
        Some(fraction) => {
            let rt = tokio::runtime::Runtime::new()?;
            let c = scenario(&args.run, "ceiling", args.sensors, &rt)?.max_sustained_per_s;
            anyhow::ensure!(c > 0.0, "the ceiling subscriber sustained no step");
            args.rate = (c * fraction).round();
            eprintln!(
                "  ceiling {c:.0}/s; soaking at {fraction} of it: {:.0}/s",
                args.rate
            );
            Some(c)
        }
        None => None,
    };
    let limits = std::env::var("BENCH_PALLETD_LIMITS").unwrap_or_default();
    eprintln!(
        "== soak: {} sensors, {}/s ({} per sensor), {} s, palletd's defaults{}{}",
        args.sensors,
        args.rate,
        args.rate / args.sensors as f64,
        args.secs,
        if args.tail.is_empty() {
            ""
        } else {
            " and the tail given"
        },
        if limits.is_empty() {
            String::new()
        } else {
            format!(" but [limits] {limits}")
        }
    );
    let svc = Services::start(&args.run)?;
    let tail = args.tail.replace("\\n", "\n");
    let sink = buckets_sink(&args.run, &svc, &tail)?;
    let port = sink.procs[0].1;
    let started = Instant::now();
    let mark = |at: f64| -> anyhow::Result<Mark> {
        Ok(Mark {
            at,
            scrape: sink.scrape()?,
            statements: counter_sum(port, palletd::telemetry::STATEMENTS),
            delay_s: counter_sum(port, palletd::telemetry::FLUSH_DELAY_SECONDS),
            peak_rss_mb: sink.peak_rss() as f64 / 1e6,
            cpu: sink.cpu(),
            lookups: counter_sum(port, palletd::telemetry::FILL_LOOKUPS),
            sealing_s: histogram_sum(port, palletd::telemetry::CLOSER_SECONDS)?,
        })
    };
    let mut marks = vec![mark(0.0)?];
    let mut sim = simulator(&args.run, &svc, args.sensors, args.rate, args.secs)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let every = args.every.max(1) as f64;
    println!("| t (s) | durable/s | live lag p50 | p99 | flush delay | statements / reading | CPU µs / reading | peak RSS MB | fill lookups | sealing s |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let line = |a: &Mark, b: &Mark| {
        let stored = (b.scrape.stored - a.scrape.stored).max(0.0);
        let secs = (b.at - a.at).max(1e-3);
        json!({
            "from_s": a.at,
            "to_s": b.at,
            "durable_per_s": stored / secs,
            "lag_p50_s": quantile(&a.scrape.live_age, &b.scrape.live_age, 0.5),
            "lag_p99_s": quantile(&a.scrape.live_age, &b.scrape.live_age, 0.99),
            "flush_delay_s": b.delay_s,
            "statements_per_reading": (b.statements - a.statements) / stored.max(1.0),
            "cpu_us_per_reading": b.cpu.saturating_sub(a.cpu).as_secs_f64() * 1e6 / stored.max(1.0),
            "peak_rss_mb": b.peak_rss_mb,
            "fill_lookups": b.lookups - a.lookups,
            "sealing_s": b.sealing_s - a.sealing_s,
        })
    };
    let print = |r: &serde_json::Value| {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} s | {} s | {} s | {} | {} | {} | {} | {} |",
            f("to_s", 0),
            f("durable_per_s", 0),
            f("lag_p50_s", 2),
            f("lag_p99_s", 2),
            f("flush_delay_s", 1),
            f("statements_per_reading", 3),
            f("cpu_us_per_reading", 1),
            f("peak_rss_mb", 0),
            f("fill_lookups", 0),
            f("sealing_s", 1),
        );
    };
    let mut intervals = Vec::new();
    let status = loop {
        let next = marks.last().map_or(0.0, |m| m.at) + every;
        while started.elapsed().as_secs_f64() < next {
            if sim.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let m = mark(started.elapsed().as_secs_f64())?;
        let r = line(marks.last().expect("a first mark"), &m);
        print(&r);
        intervals.push(r);
        marks.push(m);
        if let Some(status) = sim.try_wait()? {
            break status;
        }
    };
    let mut report = String::new();
    if let Some(mut out) = sim.stdout.take() {
        let _ = out.read_to_string(&mut report);
    }
    let (published, sim_lag) = parse_report(&report).unwrap_or((0, f64::NAN));
    // Everything published stored: up to the longest delay and then some.
    let end = Instant::now();
    let mut drained = None;
    while end.elapsed() < Duration::from_secs(600) {
        let stored = sink.scrape()?.stored - marks[0].scrape.stored;
        if stored >= published as f64 {
            drained = Some(end.elapsed().as_secs_f64());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let last = mark(started.elapsed().as_secs_f64())?;
    let stored = last.scrape.stored - marks[0].scrape.stored;
    // The halves of the publishing time.
    let mid = marks
        .iter()
        .min_by(|a, b| {
            let h = args.secs as f64 / 2.0;
            (a.at - h).abs().total_cmp(&(b.at - h).abs())
        })
        .expect("marks");
    let end_mark = marks.last().expect("marks");
    let halves = [line(&marks[0], mid), line(mid, end_mark)];
    eprintln!(
        "  published {published} (simulator behind by at most {sim_lag:.1} s), stored {stored:.0}, drained {} s after the last publish",
        fmt(drained, 1)
    );
    for (name, h) in ["first half", "second half"].iter().zip(&halves) {
        eprintln!("  {name}: {h}");
    }
    let out = json!({
        "scenario": "soak",
        "sensors": args.sensors,
        "rate": args.rate,
        "ceiling_per_s": ceiling,
        "limits": limits,
        "of_ceiling": args.of_ceiling,
        "secs": args.secs,
        "tail": tail,
        "published": published,
        "stored": stored,
        "drained_after_s": drained,
        "simulator_behind_s": sim_lag,
        "intervals": intervals,
        "halves": halves,
        "peak_rss_mb": last.peak_rss_mb,
        "simulator_ok": status.success(),
        "machine": machine(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("soak-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}
