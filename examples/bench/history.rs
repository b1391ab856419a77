//! The `history` scenario: writes beside a long history.

use crate::*;

pub(crate) fn history(args: HistoryArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let tail = "[flush]\nmax_delay = \"200ms\"\n";
    let mut rows = Vec::new();
    for &sensors in &args.sensors {
        for stored_days in [0, args.days] {
            let label = if stored_days == 0 {
                "empty collection".to_string()
            } else {
                format!("{stored_days} days of hourly buckets stored")
            };
            eprintln!("== history, {sensors} sensors, {label}");
            let svc = Services::start(&args.run)?;
            let prefill_s = if stored_days > 0 {
                let s = rt.block_on(prefill(&svc.mongodb_uri(), sensors, stored_days * 24))?;
                eprintln!(
                    "  {} buckets stored in {s:.0} s",
                    sensors * stored_days * 24
                );
                rt.block_on(async {
                    mongodb::Client::with_uri_str(svc.mongodb_uri())
                        .await?
                        .database("admin")
                        .run_command(doc! { "fsync": 1 })
                        .await
                })?;
                std::thread::sleep(Duration::from_secs(args.settle));
                Some(s)
            } else {
                None
            };
            let sink = buckets_sink(&args.run, &svc, tail)?;
            let port = sink.procs[0].1;
            step(&args.run, &svc, &sink, sensors, args.rate, args.warmup)?;
            let before = counter_sum(port, palletd::telemetry::STATEMENTS);
            let m = step(&args.run, &svc, &sink, sensors, args.rate, args.secs)?;
            let statements = counter_sum(port, palletd::telemetry::STATEMENTS) - before;
            let row = json!({
                "sensors": sensors,
                "variant": label,
                "stored_buckets": sensors * stored_days * 24,
                "prefill_s": prefill_s,
                "offered_per_s": m.step.target_per_s,
                "durable_per_s": m.step.achieved_per_s,
                "statements_per_s": statements / m.step.seconds,
                "lag_p50_s": quantile(&m.before.live_age, &m.after.live_age, 0.5),
                "lag_p99_s": quantile(&m.before.live_age, &m.after.live_age, 0.99),
            });
            eprintln!("  {row}");
            rows.push(row);
            drop(sink);
        }
    }
    println!("| sensors | collection | offered/s | durable/s | statements/s | lag p50 | lag p99 |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} | {} | {} | {} s | {} s |",
            f("sensors", 0),
            r["variant"].as_str().unwrap_or(""),
            f("offered_per_s", 0),
            f("durable_per_s", 0),
            f("statements_per_s", 0),
            f("lag_p50_s", 2),
            f("lag_p99_s", 2),
        );
    }
    let out =
        json!({ "scenario": "history", "days": args.days, "rows": rows, "machine": machine() });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("history-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}
