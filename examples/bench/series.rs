//! The `series` scenario: a week read back through `/api/series` from each source.

use crate::*;

pub(crate) fn series(args: SeriesArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let minutes = args.days * 24 * 60;
    let readings = args.sensors * minutes;
    let svc = Services::start(&args.run)?;
    let tail = format!(
        "[bucket]\nwindow = \"1h\"\nmax_lateness = \"{}d\"\n[flush]\nmax_delay = \"2s\"\n\
         [closer]\ninterval = \"1s\"\ngrace = \"1s\"\n[[rollup]]\ninterval = \"1h\"\n",
        args.days + 2
    );
    let sink = buckets_sink(&args.run, &svc, &tail)?;
    let port = sink.procs[0].1;
    let minute = 60_000i64;
    let end = chrono::Utc::now().timestamp_millis() / minute * minute;
    let first = end - (minutes as i64 - 1) * minute;
    eprintln!(
        "== series: {} sensors x {} days of a reading a minute",
        args.sensors, args.days
    );
    let started = Instant::now();
    let messages = (0..minutes).flat_map(|m| {
        (0..args.sensors).map(move |s| {
            let mut v = weather(s, m);
            v["ts"] = json!(first + m as i64 * minute);
            (format!("station-{s}"), v)
        })
    });
    rt.block_on(publish_acknowledged(
        svc.broker_port,
        "bench-series",
        readings,
        messages,
    ))?;
    while counter_sum(port, palletd::telemetry::SAMPLES_STORED) < readings as f64 {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "not all stored"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every hour over rolled up (the last one or two are read from the
    // windows in any case).
    let hours_over = (end - first) / 3_600_000;
    while counter_sum(port, palletd::telemetry::ROLLUPS_WRITTEN)
        < (args.sensors as i64 * hours_over) as f64
    {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "not all rolled up"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "stored and rolled up in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let iso = |ms: i64| palletd::clock::iso(ms);
    let to = (end / 3_600_000 + 1) * 3_600_000;
    let from = to - args.days as i64 * 86_400_000;
    let path = |source: &str| {
        format!(
            "/api/series?sensor=station-0&from={}&to={}&step=1h&source={source}",
            iso(from),
            iso(to)
        )
    };
    let server = |uri: String| -> anyhow::Result<[f64; 5]> {
        rt.block_on(async {
            let client = mongodb::Client::with_uri_str(&uri).await?;
            let s = client
                .database("admin")
                .run_command(doc! { "serverStatus": 1 })
                .await?;
            let at = |path: &[&str]| -> f64 {
                let mut d = &s;
                for p in &path[..path.len() - 1] {
                    match d.get_document(p) {
                        Ok(next) => d = next,
                        Err(_) => return f64::NAN,
                    }
                }
                match d.get(path[path.len() - 1]) {
                    Some(bson::Bson::Int32(x)) => *x as f64,
                    Some(bson::Bson::Int64(x)) => *x as f64,
                    Some(bson::Bson::Double(x)) => *x,
                    _ => f64::NAN,
                }
            };
            Ok::<_, anyhow::Error>([
                at(&["opcounters", "query"]) + at(&["opcounters", "getmore"]),
                at(&["metrics", "document", "returned"]),
                at(&["network", "bytesOut"]),
                at(&["network", "bytesIn"]),
                at(&["opcounters", "command"]),
            ])
        })
    };
    let mut text = format!(
        "{} sensors x {} days of a reading a minute (3 fields), one sensor's week at an hour a point, {} answers per source ({})\n\n\
         | source | ms per answer (median) | p90 | points | readings counted | finds+getMores per answer | documents returned per answer | bytes the server sent per answer | bytes it received | palletd CPU ms per answer |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        args.sensors,
        args.days,
        args.repeat,
        machine()
    );
    let mut answers = Vec::new();
    for source in ["rollup", "windows", "samples"] {
        // One to warm the caches, then the measured ones.
        let body = http_get(port, &path(source))?;
        let rows: Vec<serde_json::Value> =
            serde_json::from_str(&body).map_err(|e| anyhow::anyhow!("{source}: {e}: {body}"))?;
        let before = server(svc.mongodb_uri())?;
        let cpu0 = sink.cpu();
        let mut times = Vec::new();
        for _ in 0..args.repeat {
            let t = Instant::now();
            let body = http_get(port, &path(source))?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            anyhow::ensure!(body.starts_with('['), "{source}: {body}");
        }
        let cpu = sink.cpu().saturating_sub(cpu0).as_secs_f64() * 1000.0;
        let after = server(svc.mongodb_uri())?;
        times.sort_by(f64::total_cmp);
        let per = |i: usize| (after[i] - before[i]) / args.repeat as f64;
        let counted: i64 = rows.iter().filter_map(|r| r["n"].as_i64()).sum();
        text += &format!(
            "| {source} | {:.2} | {:.2} | {} | {counted} | {:.1} | {:.1} | {:.0} | {:.0} | {:.2} |\n",
            times[times.len() / 2],
            times[times.len() * 9 / 10],
            rows.len(),
            per(0),
            per(1),
            per(2),
            per(3),
            cpu / args.repeat as f64,
        );
        answers.push((source, rows));
    }
    // The same figures from every source (no thinning here).
    let key = |rows: &Vec<serde_json::Value>| -> Vec<(String, String, i64, String)> {
        rows.iter()
            .map(|r| {
                (
                    r["time"].to_string(),
                    r["field"].to_string(),
                    r["n"].as_i64().unwrap_or(-1),
                    format!("{:.6}", r["sum"].as_f64().unwrap_or(f64::NAN)),
                )
            })
            .collect()
    };
    for (source, rows) in &answers[1..] {
        anyhow::ensure!(
            key(rows) == key(&answers[0].1),
            "{source} answers differently from the rollup"
        );
    }
    eprintln!("the three sources give the same points");
    std::fs::create_dir_all(&args.run.out)?;
    let stamp = chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ");
    std::fs::write(args.run.out.join(format!("series-{stamp}-table.md")), &text)?;
    println!("{text}");
    Ok(())
}
