//! The `hostile` scenario: hostile devices beside good ones.

use crate::*;

/// The hostile messages, sent in turn: a batch of 1,000 samples from a
/// device whose clock is ten years ahead (JSON, 53 KB), an object of
/// 15,000 distinct keys (195 KB), and a Sparkplug DBIRTH of a new device
/// with 2,000 metrics, half of them named over `max_field_name_length`
/// (140 KB), after 50 such BIRTHs under one node (see [`publish_hostile`]).
pub(crate) struct Hostile {
    pub(crate) clock: Vec<u8>,
    pub(crate) wide: Vec<u8>,
}

impl Hostile {
    pub(crate) fn new() -> Hostile {
        let future = chrono::Utc::now().timestamp_millis() + 10 * 365 * 86_400_000;
        let clock: Vec<serde_json::Value> = (0..1000)
            .map(|i| json!({"ts": future + i * 1000, "temp": 21.5, "humidity": 40.25}))
            .collect();
        let mut wide = serde_json::Map::new();
        for i in 0..15_000 {
            wide.insert(format!("k{i:05}"), json!(i));
        }
        Hostile {
            clock: serde_json::to_vec(&clock).expect("json"),
            wide: serde_json::to_vec(&wide).expect("json"),
        }
    }

    pub(crate) fn birth(seq: u64, metrics: usize) -> Vec<u8> {
        use palletd::decode::sparkplug::{proto, DataType};
        use prost::Message as _;
        let long = "x".repeat(95);
        let metrics = (0..metrics)
            .map(|i| proto::Metric {
                name: Some(if i % 2 == 0 {
                    format!("metric-{i:04}")
                } else {
                    format!("{long}-{i:04}")
                }),
                alias: Some(i as u64),
                datatype: Some(DataType::Double as u32),
                value: Some(proto::metric::Value::DoubleValue(1.0)),
                ..Default::default()
            })
            .collect();
        proto::Payload {
            timestamp: Some(chrono::Utc::now().timestamp_millis() as u64),
            seq: Some(seq % 256),
            metrics,
            ..Default::default()
        }
        .encode_to_vec()
    }
}

/// Publishes hostile messages at `per_s` until `stop`, in turn; before
/// that, an NBIRTH and 50 DBIRTHs of 2,000 metrics under it. Only the
/// names short enough for a field are learnt (1,000 a device), so the
/// node holds 50,000 aliases: the next 50 hostile DBIRTHs are taken, and
/// every one after is refused, the node alone passing
/// `limits.max_sparkplug_aliases` (100,000). (Before the state's budget,
/// every metric with an alias counted and all of them were refused.)
/// Counts what it sent by kind.
pub(crate) async fn publish_hostile(
    port: u16,
    per_s: f64,
    stop: Arc<std::sync::atomic::AtomicBool>,
    sent: Arc<[std::sync::atomic::AtomicU64; 3]>,
) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let mut opts = MqttOptions::new("bench-hostile", "127.0.0.1", port);
    opts.set_max_packet_size(1 << 20, 1 << 20);
    opts.set_inflight(100);
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut eventloop) = AsyncClient::new(opts, 1000);
    tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
    let hostile = Hostile::new();
    let mut seq = 0;
    client
        .publish(
            "spBv1.0/evil/NBIRTH/n0",
            QoS::AtLeastOnce,
            false,
            Hostile::birth(seq, 1),
        )
        .await?;
    // 50 devices of 2,000 aliases: limits.max_sparkplug_aliases (100,000).
    for d in 0..50 {
        seq += 1;
        let topic = format!("spBv1.0/evil/DBIRTH/n0/d{d}");
        client
            .publish(topic, QoS::AtLeastOnce, false, Hostile::birth(seq, 2000))
            .await?;
    }
    let birth = Hostile::birth(seq, 2000);
    let started = Instant::now();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = (started.elapsed().as_secs_f64() * per_s) as u64;
        while n < due {
            let kind = (n % 3) as usize;
            let (topic, payload) = match kind {
                0 => (format!("bench/clock{}/data", n % 10), hostile.clock.clone()),
                1 => (format!("bench/wide{}/data", n % 10), hostile.wide.clone()),
                _ => (format!("spBv1.0/evil/DBIRTH/n0/d{}", 50 + n), birth.clone()),
            };
            client
                .publish(topic, QoS::AtLeastOnce, false, payload)
                .await?;
            sent[kind].fetch_add(1, Ordering::Relaxed);
            n += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = client.disconnect().await;
    Ok(())
}

/// What one palletd showed while a phase ran: peaks of its RSS, of its
/// memory budgets' bytes and of the dead letters' bytes in its spool.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub(crate) struct Peaks {
    pub(crate) rss: u64,
    pub(crate) memory: f64,
    pub(crate) deadletter_spool: f64,
}

/// Samples a palletd twice a second into `peaks` until `stop`.
pub(crate) fn sample_peaks(
    pid: u32,
    port: u16,
    peaks: Arc<std::sync::Mutex<Peaks>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let (mut memory, mut deadletter) = (0.0, 0.0);
        if let Ok(body) = http_get(port, "/metrics") {
            for l in body.lines() {
                let value = || l.split_whitespace().last()?.parse::<f64>().ok();
                if l.starts_with(palletd::telemetry::MEMORY_BYTES) {
                    memory += value().unwrap_or(0.0);
                } else if l.starts_with(palletd::telemetry::SPOOL_DEADLETTER_BYTES) {
                    deadletter = value().unwrap_or(0.0);
                }
            }
        }
        {
            let mut p = peaks.lock().unwrap_or_else(|e| e.into_inner());
            p.rss = p.rss.max(rss);
            p.memory = p.memory.max(memory);
            p.deadletter_spool = p.deadletter_spool.max(deadletter);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub(crate) fn hostile(args: HostileArgs) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let svc = Services::start(&args.run)?;
    let sink = start_sink_with(
        &args.run,
        "buckets",
        &svc,
        &svc.mongodb_uri(),
        "",
        &format!("max_size = \"{}\"", args.spool_max_size),
        "[[subscription]]\ntopic = \"spBv1.0/#\"\nformat = \"sparkplug_b\"\n",
    )?;
    let (pid, port) = (sink.pids()[0], sink.procs[0].1);
    let rt = tokio::runtime::Runtime::new()?;
    let peaks = Arc::new(std::sync::Mutex::new(Peaks::default()));
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peaks, stop) = (peaks.clone(), sampler_stop.clone());
        std::thread::spawn(move || sample_peaks(pid, port, peaks, stop))
    };
    let take_peaks = || std::mem::take(&mut *peaks.lock().unwrap_or_else(|e| e.into_inner()));
    eprintln!("== hostile: warm-up 15 s");
    step(&args.run, &svc, &sink, args.sensors, args.rate, 15)?;
    take_peaks();

    let mut rows = Vec::new();
    let mut measure = |label: &str, m: &Measured, peaks: Peaks| {
        let good = m.step.durable.max(1) as f64;
        let row = json!({
            "phase": label,
            "offered_per_s": m.step.target_per_s,
            "durable_per_s": m.step.achieved_per_s,
            "published": m.step.published,
            "durable": m.step.durable,
            "sustained": m.step.sustained,
            "drained_after_s": m.step.drained_after_s,
            "lag_p50_s": quantile(&m.before.live_age, &m.after.live_age, 0.5),
            "lag_p99_s": quantile(&m.before.live_age, &m.after.live_age, 0.99),
            "cpu_us_per_good_reading": m.cpu.as_secs_f64() * 1e6 / good,
            "peak_rss_mb": peaks.rss as f64 / 1e6,
            "peak_memory_budget_mb": peaks.memory / 1e6,
            "peak_deadletter_spool_mb": peaks.deadletter_spool / 1e6,
            "dead_letters_dropped": counter_sum(port, palletd::telemetry::DEAD_LETTERS_DROPPED),
        });
        eprintln!("  {row}");
        rows.push(row);
    };

    eprintln!("== good sensors only, {} s", args.secs);
    let m = step(&args.run, &svc, &sink, args.sensors, args.rate, args.secs)?;
    measure("good only", &m, take_peaks());

    // Hostile messages are `share` of all messages.
    let hostile_per_s = args.rate * args.share / (1.0 - args.share);
    let stop = Arc::new(AtomicBool::new(false));
    let sent: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let publisher = rt.spawn(publish_hostile(
        svc.broker_port,
        hostile_per_s,
        stop.clone(),
        sent.clone(),
    ));
    std::thread::sleep(Duration::from_secs(5));
    take_peaks();
    eprintln!(
        "== with {hostile_per_s:.0} hostile messages/s beside them, {} s",
        args.secs
    );
    let m = step(&args.run, &svc, &sink, args.sensors, args.rate, args.secs)?;
    measure("with 1% hostile", &m, take_peaks());

    eprintln!(
        "== database stopped for {} s with both flowing",
        args.outage_secs
    );
    // Not `step`: a backlog that grows is the point here. The simulator
    // runs through the outage and 60 s past it; then everything published
    // must become durable.
    let db_pid = svc.db_pid();
    let signal = |sig: &str| Command::new("kill").args([sig, &db_pid]).status();
    let before = sink.scrape()?;
    let cpu_before = sink.cpu();
    let started = Instant::now();
    let secs = args.outage_secs + 65;
    let mut sim = simulator(&args.run, &svc, args.sensors, args.rate, secs)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_secs(5));
    signal("-STOP")?;
    std::thread::sleep(Duration::from_secs(args.outage_secs));
    signal("-CONT")?;
    let mut report = String::new();
    if let Some(mut out) = sim.stdout.take() {
        let _ = out.read_to_string(&mut report);
    }
    let _ = sim.wait();
    let seconds = started.elapsed().as_secs_f64();
    let (published, sim_lag) = parse_report(&report).unwrap_or((0, f64::NAN));
    let end = Instant::now();
    let mut drained = None;
    let mut after = sink.scrape()?;
    while end.elapsed() < Duration::from_secs(300) {
        after = sink.scrape()?;
        if after.stored - before.stored >= published as f64 {
            drained = Some(end.elapsed().as_secs_f64());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let durable = (after.stored - before.stored) as u64;
    let m = Measured {
        step: Step {
            target_per_s: args.rate,
            seconds,
            published,
            durable,
            achieved_per_s: durable as f64 / seconds,
            simulator_max_lag_s: sim_lag,
            max_backlog: 0.0,
            drained_after_s: drained,
            sustained: drained.is_some(),
            note: String::new(),
        },
        before,
        after,
        cpu: sink.cpu().saturating_sub(cpu_before),
    };
    eprintln!(
        "    {published} published, {durable} durable, {}",
        drained.map_or("not all durable within 300 s".to_string(), |d| format!(
            "all durable {d:.0} s after the last publish"
        ))
    );
    stop.store(true, Ordering::Relaxed);
    let _ = rt.block_on(publisher);
    measure("database stopped, then back", &m, take_peaks());
    sampler_stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();

    let sent: Vec<u64> = sent.iter().map(|n| n.load(Ordering::Relaxed)).collect();
    let out = json!({
        "scenario": "hostile",
        "sensors": args.sensors,
        "good_rate": args.rate,
        "hostile_share": args.share,
        "hostile_per_s": hostile_per_s,
        "hostile_sent": {"wrong_clock": sent[0], "wide_object": sent[1], "oversized_birth": sent[2]},
        "spool_max_size": args.spool_max_size,
        // limits.max_memory = "auto" on this box (BENCH_PALLETD_LIMITS aside).
        "max_memory_mb": palletd::config::memory::auto().0 as f64 / 1e6,
        "dead_letters_total": counter_sum(port, palletd::telemetry::DEAD_LETTERS),
        "phases": rows,
        "machine": machine(),
    });
    println!("| phase | good readings/s offered / durable | lag p50 / p99 s | CPU µs / good reading | peak RSS MB | memory budgets peak MB (of {:.0}) | dead letters in spool peak MB | dead letters dropped |", out["max_memory_mb"].as_f64().unwrap_or(0.0));
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in out["phases"].as_array().into_iter().flatten() {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} / {}{} | {} / {} | {} | {} | {} | {} | {} |",
            r["phase"].as_str().unwrap_or(""),
            f("offered_per_s", 0),
            f("durable_per_s", 0),
            if r["sustained"].as_bool() == Some(true) {
                ""
            } else {
                " (not sustained)"
            },
            f("lag_p50_s", 2),
            f("lag_p99_s", 2),
            f("cpu_us_per_good_reading", 1),
            f("peak_rss_mb", 0),
            f("peak_memory_budget_mb", 1),
            f("peak_deadletter_spool_mb", 1),
            f("dead_letters_dropped", 0),
        );
    }
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("hostile-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    // palletd's log beside it (what it said of the limits and the outage).
    let _ = std::fs::copy(
        svc.dir.path().join("buckets-0.log"),
        args.run.out.join(format!("{name}-palletd.log")),
    );
    eprintln!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
