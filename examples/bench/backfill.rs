//! The `backfill` scenario, and helpers the backfill-like scenarios share.

use crate::*;

/// The server's single-sample upsert rate by `_id`: `n` upserts of the
/// shape palletd sends (its `_id`, `sensorId`, `startTs`, `closed` and the
/// caps), each a new bucket of one sample, in commands of 1,000.
pub(crate) async fn probe_upserts(uri: &str, n: usize) -> anyhow::Result<f64> {
    let client = mongodb::Client::with_uri_str(uri).await?;
    let db = client.database("probe");
    db.collection::<bson::Document>("buckets").drop().await?;
    db.collection::<bson::Document>("buckets")
        .create_indexes(palletd::internals::bucket_indexes())
        .await?;
    let statements: Vec<bson::Document> = (0..n)
        .map(|i| {
            let (sensor, start) = (format!("p{}", i % 3), (i / 3) as i64 * 3_600_000);
            let ts = bson::DateTime::from_millis(start);
            doc! {
                "q": {
                    "_id": palletd::bucket::bucket_id(&sensor, start, 0),
                    "sensorId": &sensor, "startTs": ts, "closed": false,
                    "count": { "$lte": 199 }, "size": { "$lte": 262_000 },
                },
                "u": {
                    "$push": { "samples": { "$each": [ { "ts": ts, "temp": 1.5 } ] } },
                    "$inc": { "count": 1, "size": 40, "sum.temp": 1.5, "n.temp": 1 },
                    "$min": { "min.temp": 1.5 }, "$max": { "max.temp": 1.5 },
                    "$setOnInsert": { "endTs": ts },
                },
                "upsert": true,
            }
        })
        .collect();
    let started = Instant::now();
    for chunk in statements.chunks(1000) {
        db.run_command(doc! { "update": "buckets", "updates": chunk, "ordered": true })
            .await?;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The smallest bucket bound of histogram `name` that holds every
/// observation (`inf` if none does).
pub(crate) fn longest_of(port: u16, name: &str) -> f64 {
    let buckets = http_get(port, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket")))
        .filter_map(|l| {
            let le = l
                .split("le=\"")
                .nth(1)?
                .split('"')
                .next()?
                .parse::<f64>()
                .ok()?;
            let n = l.split_whitespace().last()?.parse::<f64>().ok()?;
            Some((le, n))
        })
        .collect::<Vec<_>>();
    let total = buckets.iter().map(|b| b.1).fold(0.0, f64::max);
    buckets
        .iter()
        .filter(|b| b.1 >= total)
        .map(|b| b.0)
        .fold(f64::INFINITY, f64::min)
}

/// Observations of histogram `name`.
pub(crate) fn histogram_count(port: u16, name: &str) -> f64 {
    http_get(port, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_count")))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// Reads every rollup of the backfill (1h, 1d, 7d) and compares its count
/// and its temperature's sum, first and last with a summary of the
/// readings computed here. Returns (documents checked, wrong ones).
pub(crate) async fn check_backfill_rollups(
    uri: &str,
    args: &BackfillArgs,
    first: i64,
) -> anyhow::Result<(usize, usize)> {
    let db = mongodb::Client::with_uri_str(uri).await?.database("bench");
    let (mut checked, mut wrong) = (0, 0);
    for (name, ms) in [
        ("1h", 3_600_000_i64),
        ("1d", 86_400_000),
        ("7d", 7 * 86_400_000),
    ] {
        // (station, start) -> (count, sum, first, last)
        let mut want: HashMap<(String, i64), (i64, f64, f64, f64)> = HashMap::new();
        for s in 0..args.sensors {
            for h in 0..args.hours {
                let ts = first + h as i64 * 3_600_000 + 1_000;
                let t = weather(s, h)["temp"].as_f64().unwrap_or(0.0);
                let e = want
                    .entry((format!("station-{s}"), ts.div_euclid(ms) * ms))
                    .or_insert((0, 0.0, t, t));
                e.0 += 1;
                e.1 += t;
                e.3 = t;
            }
        }
        let mut cursor = db
            .collection::<bson::Document>(&format!("readings_{name}"))
            .find(doc! {})
            .await?;
        while let Some(d) = cursor.try_next().await? {
            checked += 1;
            let key = (
                d.get_str("sensorId").unwrap_or_default().to_string(),
                d.get_datetime("start")
                    .map(|t| t.timestamp_millis())
                    .unwrap_or(0),
            );
            let got = |part: &str| {
                d.get_document(part)
                    .ok()
                    .and_then(|p| p.get_f64("temp").ok())
                    .unwrap_or(f64::NAN)
            };
            let count = d.get_i64("count").unwrap_or(-1);
            let ok = want.get(&key).is_some_and(|w| {
                w.0 == count
                    && (w.1 - got("sum")).abs() <= 1e-9 * w.1.abs().max(1.0)
                    && w.2 == got("first")
                    && w.3 == got("last")
            });
            if !ok {
                wrong += 1;
                if wrong <= 3 {
                    eprintln!("  wrong rollup {name} {key:?}: {d}");
                }
            }
        }
    }
    Ok((checked, wrong))
}

/// Publishes `count` readings (sensor, JSON) at QoS 1 as fast as the
/// broker takes them, and returns once the broker acknowledged them all.
pub(crate) async fn publish_acknowledged(
    broker_port: u16,
    client_id: &str,
    count: usize,
    messages: impl Iterator<Item = (String, serde_json::Value)>,
) -> anyhow::Result<()> {
    let mut opts = MqttOptions::new(client_id, "127.0.0.1", broker_port);
    opts.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut eventloop) = AsyncClient::new(opts, 1000);
    let acks = tokio::spawn(async move {
        let mut acked = 0usize;
        while acked < count {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    for (sensor, v) in messages {
        let topic = TOPIC.replace("{sensor}", &sensor);
        client
            .publish(topic, QoS::AtLeastOnce, false, v.to_string())
            .await?;
    }
    acks.await?;
    Ok(())
}

/// One station's reading at hour `h`: a day's swing and a year's, and
/// noise of a fixed seed (the same in every run).
pub(crate) fn weather(station: usize, h: usize) -> serde_json::Value {
    let day = (h % 24) as f64 / 24.0 * std::f64::consts::TAU;
    let year = (h % 8760) as f64 / 8760.0 * std::f64::consts::TAU;
    let noise = ((h * 7919 + station * 104_729) % 1000) as f64 / 1000.0 - 0.5;
    json!({
        "temp": 10.0 + station as f64 - 6.0 * day.cos() - 9.0 * year.cos() + noise,
        "hum": 70.0 + 15.0 * day.cos() + 5.0 * noise,
        "pres": 1013.0 + 8.0 * (year * 3.0).sin() + noise,
    })
}

pub(crate) fn backfill(args: BackfillArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let readings = args.sensors * args.hours;
    let lateness = format!("{}d", args.hours / 24 + 30);
    let common = format!(
        "[bucket]\nwindow = \"1h\"\nmax_lateness = \"{lateness}\"\n[flush]\nmax_delay = \"2s\"\n"
    );
    let rollups = "[[rollup]]\ninterval = \"1h\"\n[[rollup]]\ninterval = \"1d\"\n[[rollup]]\ninterval = \"7d\"\n";
    let mut rows = Vec::new();
    for (label, tail) in [
        ("rollups off", common.clone()),
        ("rollups 1h + 1d + 7d", format!("{common}{rollups}")),
    ] {
        eprintln!(
            "== backfill, {label}: {} stations x {} hours",
            args.sensors, args.hours
        );
        let svc = Services::start(&args.run)?;
        let probe = rt.block_on(probe_upserts(&svc.mongodb_uri(), 9000))?;
        eprintln!("  probe: {probe:.0} single-sample upserts/s by _id");
        let sink = buckets_sink(&args.run, &svc, &tail)?;
        let port = sink.procs[0].1;
        let now = chrono::Utc::now().timestamp_millis() / 3_600_000 * 3_600_000;
        let first = now - args.hours as i64 * 3_600_000;
        let started = Instant::now();
        let messages = (0..args.hours).flat_map(|h| {
            (0..args.sensors).map(move |s| {
                let mut v = weather(s, h);
                v["ts"] = json!(first + h as i64 * 3_600_000 + 1_000);
                (format!("station-{s}"), v)
            })
        });
        rt.block_on(publish_acknowledged(
            svc.broker_port,
            "bench-backfill",
            readings,
            messages,
        ))?;
        let published_s = started.elapsed().as_secs_f64();
        let mut stored = 0.0;
        while started.elapsed() < Duration::from_secs(1800) {
            stored = counter_sum(port, palletd::telemetry::SAMPLES_STORED);
            if stored >= readings as f64 {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let stored_s = started.elapsed().as_secs_f64();
        let rate = stored / stored_s;
        // Every rollup document there: one per station and interval that
        // is over (and past closer.grace, 5 min, when the pass takes it).
        let intervals = |ms: i64| {
            let (lo, hi) = (first, first + (args.hours as i64 - 1) * 3_600_000 + 1_000);
            let due_by = chrono::Utc::now().timestamp_millis() - 300_000;
            (lo.div_euclid(ms)..=hi.div_euclid(ms))
                .filter(|i| (i + 1) * ms <= due_by)
                .count()
        };
        let want_rollups = if label == "rollups off" {
            0
        } else {
            args.sensors
                * (intervals(3_600_000) + intervals(86_400_000) + intervals(7 * 86_400_000))
        };
        let mut rollups_s = None;
        while want_rollups > 0 && started.elapsed() < Duration::from_secs(1800) {
            if counter_sum(port, palletd::telemetry::ROLLUPS_WRITTEN) >= want_rollups as f64 {
                rollups_s = Some(started.elapsed().as_secs_f64());
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let statements_max = counter_sum(port, palletd::telemetry::FLUSH_STATEMENTS_MAX);
        let longest = longest_of(port, palletd::telemetry::FLUSH_SECONDS);
        // Every rollup document against the same summary computed here.
        let (checked, wrong) = if want_rollups > 0 {
            rt.block_on(check_backfill_rollups(&svc.mongodb_uri(), &args, first))?
        } else {
            (0, 0)
        };
        let row = json!({
            "variant": label,
            "readings": readings,
            "stored": stored,
            "published_s": published_s,
            "stored_s": stored_s,
            "stored_per_s": rate,
            "probe_upserts_per_s": probe,
            "of_probe": rate / probe,
            "flush_statements_max": statements_max,
            "longest_flush_at_most_s": longest,
            "statements": counter_sum(port, palletd::telemetry::STATEMENTS),
            "flushes": counter_sum(port, palletd::telemetry::FLUSHES),
            "collisions": counter_sum(port, palletd::telemetry::BUCKET_COLLISIONS),
            "rollups_written": counter_sum(port, palletd::telemetry::ROLLUPS_WRITTEN),
            "rollups_wanted": want_rollups,
            "rollups_done_s": rollups_s,
            "rollups_after_stored_s": rollups_s.map(|r| r - stored_s),
            "rollups_checked": checked,
            "rollups_wrong": wrong,
            "rollup_pass_longest_at_most_s": longest_of(port, palletd::telemetry::ROLLUP_PASS_SECONDS),
            "rollup_passes": histogram_count(port, palletd::telemetry::ROLLUP_PASS_SECONDS),
        });
        eprintln!("  {row}");
        rows.push(row);
        drop(sink);
    }
    println!("| variant | readings | stored in | readings/s | probe upserts/s by _id | of the probe | statements / flush, max | longest flush | rollups written (all after) | rollups wrong | passes (longest) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let f = |k: &str, d: usize| fmt(r[k].as_f64(), d);
        println!(
            "| {} | {} | {} s | {} | {} | {:.0}% | {} | <= {} s | {} ({} s) | {} of {} | {} (<= {} s) |",
            r["variant"].as_str().unwrap_or(""),
            f("readings", 0),
            f("stored_s", 1),
            f("stored_per_s", 0),
            f("probe_upserts_per_s", 0),
            r["of_probe"].as_f64().unwrap_or(0.0) * 100.0,
            f("flush_statements_max", 0),
            f("longest_flush_at_most_s", 3),
            f("rollups_written", 0),
            f("rollups_done_s", 0),
            f("rollups_wrong", 0),
            f("rollups_checked", 0),
            f("rollup_passes", 0),
            f("rollup_pass_longest_at_most_s", 1),
        );
    }
    let out = json!({
        "scenario": "backfill",
        "sensors": args.sensors,
        "hours": args.hours,
        "variants": rows,
        "machine": machine(),
    });
    std::fs::create_dir_all(&args.run.out)?;
    let name = format!("backfill-{}", chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ"));
    std::fs::write(
        args.run.out.join(format!("{name}.json")),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}
