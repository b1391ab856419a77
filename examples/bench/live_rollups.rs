//! The `live-rollups` scenario: rollup passes beside live writes.

use crate::*;

pub(crate) fn live_rollups(args: LiveRollupsArgs) -> anyhow::Result<()> {
    let rollups = "[[rollup]]\ninterval = \"1h\"\npartial = true\n[[rollup]]\ninterval = \"1d\"\npartial = true\n";
    let mut rows = Vec::new();
    for (label, tail) in [("rollups off", ""), ("rollups 1h + 1d, partial", rollups)] {
        eprintln!(
            "== live rollups, {label}: {} sensors, {}/s, {} s",
            args.sensors, args.rate, args.secs
        );
        let svc = Services::start(&args.run)?;
        let sink = buckets_sink(&args.run, &svc, tail)?;
        let port = sink.procs[0].1;
        step(&args.run, &svc, &sink, args.sensors, args.rate, 15)?;
        let m = step(&args.run, &svc, &sink, args.sensors, args.rate, args.secs)?;
        let good = m.step.durable.max(1) as f64;
        let row = json!({
            "variant": label,
            "offered_per_s": m.step.target_per_s,
            "durable_per_s": m.step.achieved_per_s,
            "sustained": m.step.sustained,
            "lag_p50_s": quantile(&m.before.live_age, &m.after.live_age, 0.5),
            "lag_p99_s": quantile(&m.before.live_age, &m.after.live_age, 0.99),
            "cpu_us_per_reading": m.cpu.as_secs_f64() * 1e6 / good,
            "statements": counter_sum(port, palletd::telemetry::STATEMENTS),
            "rollup_statements": counter_sum(port, palletd::telemetry::ROLLUP_STATEMENTS),
            "rollups_written": counter_sum(port, palletd::telemetry::ROLLUPS_WRITTEN),
            "rollup_passes": histogram_count(port, palletd::telemetry::ROLLUP_PASS_SECONDS),
            "rollup_pass_longest_at_most_s": longest_of(port, palletd::telemetry::ROLLUP_PASS_SECONDS),
        });
        eprintln!("  {row}");
        rows.push(row);
        drop(sink);
    }
    println!("| variant | offered/s | durable/s | lag p50 | lag p99 | CPU µs / reading | rollups written | passes (longest) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} | {} s | {} s | {} | {} | {} (<= {} s) |",
            r["variant"].as_str().unwrap_or(""),
            f("offered_per_s", 0),
            f("durable_per_s", 0),
            f("lag_p50_s", 2),
            f("lag_p99_s", 2),
            f("cpu_us_per_reading", 1),
            f("rollups_written", 0),
            f("rollup_passes", 0),
            f("rollup_pass_longest_at_most_s", 2),
        );
    }
    let out = json!({
        "scenario": "live-rollups",
        "sensors": args.sensors,
        "rate": args.rate,
        "secs": args.secs,
        "variants": rows,
        "machine": machine(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!(
        "live-rollups-{}",
        chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ")
    );
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}

/// Readings stored in bench.readings (the sum of the buckets' counts).
pub(crate) async fn stored_in_db(db: &mongodb::Database) -> anyhow::Result<i64> {
    let mut cursor = db
        .collection::<bson::Document>("readings")
        .aggregate([doc! { "$group": { "_id": null, "n": { "$sum": "$count" } } }])
        .await?;
    Ok(match cursor.try_next().await? {
        Some(d) => d
            .get_i32("n")
            .map(i64::from)
            .or_else(|_| d.get_i64("n"))
            .unwrap_or(0),
        None => 0,
    })
}
