//! The `replay` scenario: a restart with a spool of days to replay.

use crate::*;

pub(crate) fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let readings = args.sensors * args.windows * args.per_window;
    let windows = args.sensors * args.windows;
    let tail = format!(
        "[bucket]\nwindow = \"1m\"\nmax_lateness = \"{}m\"\n[flush]\nmax_delay = \"2s\"\n",
        args.windows + 60
    );
    let mut rows = Vec::new();
    // (label, killed, [mongodb] settings)
    let variants = [
        ("no crash", false, ""),
        ("SIGKILL, then replay", true, ""),
        (
            "SIGKILL, write_time_limit = 2s",
            true,
            "write_time_limit = \"2s\"",
        ),
    ];
    for (label, crash, mongodb) in variants {
        eprintln!("== replay, {label}: {readings} readings over {windows} windows");
        let svc = Services::start(&args.run)?;
        let db = rt
            .block_on(mongodb::Client::with_uri_str(svc.mongodb_uri()))?
            .database("bench");
        let start = |svc: &Services| {
            start_sink_with(
                &args.run,
                "buckets",
                svc,
                &svc.mongodb_uri(),
                mongodb,
                "",
                &tail,
            )
        };
        let mut sink = start(&svc)?;
        let db_pid = svc.db_pid();
        let signal = |sig: &str, pid: &str| Command::new("kill").args([sig, pid]).status();
        signal("-STOP", &db_pid)?;
        // Every reading published and acknowledged (so spooled).
        let now = chrono::Utc::now().timestamp_millis() / 60_000 * 60_000;
        let first = now - args.windows as i64 * 60_000;
        let step_ms = 60_000 / args.per_window as i64;
        let published = Instant::now();
        let messages = (0..args.windows * args.per_window).flat_map(|i| {
            (0..args.sensors).map(move |s| {
                let v = json!({ "ts": first + i as i64 * step_ms, "temp": (i % 97) as f64 / 4.0 });
                (format!("r{s}"), v)
            })
        });
        rt.block_on(publish_acknowledged(
            svc.broker_port,
            "bench-replay",
            readings,
            messages,
        ))?;
        let published_s = published.elapsed().as_secs_f64();
        eprintln!("  {readings} acknowledged in {published_s:.1} s");
        if crash {
            signal("-KILL", &sink.pids()[0].to_string())?;
        }
        let started = Instant::now();
        signal("-CONT", &db_pid)?;
        if crash {
            // The same configuration and spool (a new metrics port).
            sink = start(&svc)?;
        }
        let port = sink.procs[0].1;
        let mut stored = 0;
        let mut first_stored_s = None;
        while started.elapsed() < Duration::from_secs(1200) {
            stored = rt.block_on(stored_in_db(&db))?;
            if stored > 0 && first_stored_s.is_none() {
                first_stored_s = Some(started.elapsed().as_secs_f64());
            }
            if stored >= readings as i64 {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let drained_s = started.elapsed().as_secs_f64();
        // Nothing stored twice, after a little more time to show it.
        std::thread::sleep(Duration::from_secs(3));
        let finally = rt.block_on(stored_in_db(&db))?;
        let row = json!({
            "variant": label,
            "readings": readings,
            "windows": windows,
            "published_s": published_s,
            "drained_s": drained_s,
            "drained_per_s": stored as f64 / drained_s,
            "first_stored_s": first_stored_s,
            "stored": finally,
            "duplicates": finally - readings as i64,
            "statements": counter_sum(port, palletd::telemetry::STATEMENTS),
            "flushes": counter_sum(port, palletd::telemetry::FLUSHES),
        });
        eprintln!("  {row}");
        rows.push(row);
        drop(sink);
    }
    let base = rows[0]["drained_per_s"].as_f64().unwrap_or(0.0);
    println!(
        "| variant | readings | windows | first stored after | drained in | readings/s | of no crash | stored twice |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} | {} s | {} s | {} | {:.0}% | {} |",
            r["variant"].as_str().unwrap_or(""),
            f("readings", 0),
            f("windows", 0),
            f("first_stored_s", 1),
            f("drained_s", 1),
            f("drained_per_s", 0),
            r["drained_per_s"].as_f64().unwrap_or(0.0) / base.max(1e-9) * 100.0,
            f("duplicates", 0),
        );
    }
    let out = json!({
        "scenario": "replay",
        "sensors": args.sensors,
        "windows_per_sensor": args.windows,
        "per_window": args.per_window,
        "variants": rows,
        "machine": machine(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("replay-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}

/// What the sealed buckets of bench.readings weigh.
#[derive(Debug, Default)]
pub(crate) struct SealedBytes {
    pub(crate) buckets: u64,
    pub(crate) readings: u64,
    /// BSON bytes of the whole documents.
    pub(crate) bytes: u64,
    /// Bytes of their `lsns` elements.
    pub(crate) lsns_bytes: u64,
    pub(crate) with_lsns: u64,
}

pub(crate) async fn sealed_bytes(uri: &str) -> anyhow::Result<SealedBytes> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::RawDocumentBuf>("readings");
    let mut cursor = coll.find(doc! { "closed": true }).await?;
    let mut out = SealedBytes::default();
    while let Some(d) = cursor.try_next().await? {
        out.buckets += 1;
        out.bytes += d.as_bytes().len() as u64;
        if let Ok(c) = d.get_i32("count") {
            out.readings += c.max(0) as u64;
        }
        if let Ok(l) = d.get_document("lsns") {
            out.with_lsns += 1;
            // The element: type, "lsns", NUL, the document.
            out.lsns_bytes += 1 + 5 + l.as_bytes().len() as u64;
        }
    }
    Ok(out)
}

/// Inserts `hours` sealed hourly buckets (one sample each) of each of the
/// simulator's first `sensors` sensors, before the current hour; returns
/// the seconds it took.
pub(crate) async fn prefill(uri: &str, sensors: usize, hours: usize) -> anyhow::Result<f64> {
    let coll = mongodb::Client::with_uri_str(uri)
        .await?
        .database("bench")
        .collection::<bson::Document>("readings");
    coll.create_indexes(palletd::internals::bucket_indexes())
        .await?;
    let now = chrono::Utc::now().timestamp_millis() / 3_600_000 * 3_600_000;
    let started = Instant::now();
    let mut docs = Vec::with_capacity(10_000);
    for h in 1..=hours as i64 {
        let start = now - h * 3_600_000;
        let (t, end) = (
            bson::DateTime::from_millis(start),
            bson::DateTime::from_millis(start + 3_600_000),
        );
        for s in 0..sensors {
            let sensor = format!("s{s:05}");
            let edge = doc! { "t": t, "v": 21.5 };
            docs.push(doc! {
                "_id": palletd::bucket::bucket_id(&sensor, start, 0),
                "sensorId": &sensor, "startTs": t, "endTs": end, "closed": true, "closedAt": end,
                "count": 1, "size": 200, "minTs": t, "maxTs": t,
                "sum": { "temp": 21.5 }, "n": { "temp": 1 }, "min": { "temp": 21.5 }, "max": { "temp": 21.5 },
                "avg": { "temp": 21.5 }, "first": { "temp": edge.clone() }, "last": { "temp": edge },
                "samples": [ { "ts": t, "temp": 21.5 } ],
            });
            if docs.len() == 10_000 {
                coll.insert_many(std::mem::take(&mut docs))
                    .ordered(false)
                    .await?;
            }
        }
    }
    if !docs.is_empty() {
        coll.insert_many(docs).ordered(false).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}
