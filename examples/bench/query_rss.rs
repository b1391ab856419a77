//! The `query-rss` scenario: `palletd query`'s memory over one sensor's long history.

use crate::*;

pub(crate) fn query_rss(args: QueryRssArgs) -> anyhow::Result<()> {
    let svc = Services::start(&args.run)?;
    let rt = tokio::runtime::Runtime::new()?;
    let start = std::time::Instant::now();
    rt.block_on(store_one_sensor(&svc.mongodb_uri(), args.rows))?;
    eprintln!(
        "stored {} readings in {:.0} s",
        args.rows,
        start.elapsed().as_secs_f64()
    );
    let cfg = svc.dir.path().join("query.toml");
    std::fs::write(
        &cfg,
        format!(
            "[mqtt]\nurl = \"mqtt://127.0.0.1:{}\"\nclient_id = \"bench-query\"\n[mongodb]\nuri = \"{}\"\ndatabase = \"bench\"\n\
             collection = \"readings\"\n[spool]\ndir = \"{}\"\n[[subscription]]\ntopic = \"q/{{sensor}}\"\n",
            svc.broker_port,
            svc.mongodb_uri(),
            svc.dir.path().join("spool").display()
        ),
    )?;
    println!("| palletd | format | rows | seconds | peak RSS |");
    println!("|---|---|---|---|---|");
    for palletd in std::iter::once(&args.run.palletd).chain(&args.also) {
        for format in ["csv", "jsonl"] {
            let mut child = Command::new(palletd)
                .args(["query", "--sensor", "s", "--format", format, "--config"])
                .arg(&cfg)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()?;
            let pid = child.id();
            let out = child.stdout.take().expect("piped");
            let counter = std::thread::spawn(move || {
                BufReader::with_capacity(1 << 20, out).lines().count() as u64
            });
            let started = Instant::now();
            // VmHWM only grows: the last reading before exit is the peak.
            let mut peak = 0;
            while child.try_wait()?.is_none() {
                peak = peak_rss_of(pid).max(peak);
                std::thread::sleep(Duration::from_millis(50));
            }
            let lines = counter.join().expect("counter");
            let expected = args.rows + u64::from(format == "csv");
            anyhow::ensure!(
                lines == expected,
                "{} --format {format} printed {lines} lines, not {expected}",
                palletd.display()
            );
            println!(
                "| {} | {format} | {} | {:.0} | {:.0} MB |",
                palletd.display(),
                args.rows,
                started.elapsed().as_secs_f64(),
                peak as f64 / 1e6
            );
        }
    }
    Ok(())
}

/// One sensor, `rows` readings a second apart from 2025-01-01, as bucket
/// documents the way palletd writes them (sealed, 900 samples each).
pub(crate) async fn store_one_sensor(uri: &str, rows: u64) -> anyhow::Result<()> {
    let coll = indexed_readings(uri, doc! { "sensorId": 1, "startTs": 1 }).await?;
    const PER_BUCKET: u64 = 900;
    let t0 = 1_735_689_600_000i64; // 2025-01-01T00:00:00Z
    let mut batch = Vec::new();
    let mut i = 0u64;
    while i < rows {
        let n = PER_BUCKET.min(rows - i);
        let first = t0 + i as i64 * 1000;
        let start = first - first.rem_euclid(3_600_000);
        let samples: Vec<bson::Document> = (i..i + n)
            .map(|k| {
                let temp = 20.0 + (k % 100) as f64 / 10.0;
                doc! {
                    "ts": bson::DateTime::from_millis(t0 + k as i64 * 1000),
                    "temp": temp,
                    "humidity": 40.0 + (k % 37) as f64,
                }
            })
            .collect();
        batch.push(doc! {
            "sensorId": "s",
            "startTs": bson::DateTime::from_millis(start),
            "endTs": bson::DateTime::from_millis(start + 3_600_000),
            "closed": true,
            "count": n as i64,
            "lsn": (i + n) as i64,
            "samples": samples,
        });
        i += n;
        if batch.len() == 100 || i == rows {
            coll.insert_many(std::mem::take(&mut batch)).await?;
        }
    }
    Ok(())
}
