//! The `thinning` scenario: what thinning keeps of real series, and its decisions' cost.

use crate::*;

/// See [`Cli::Thinning`].
pub(crate) fn thinning_table(args: ThinningArgs) -> anyhow::Result<()> {
    use palletd::thin::{errors, thin_series, Point, Rule};
    let dir = args.data.unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/palletd-test/data")
    });
    let csv = |name: &str| -> anyhow::Result<Vec<Vec<f64>>> {
        let text = std::fs::read_to_string(dir.join(name))
            .map_err(|e| anyhow::anyhow!("{name}: {e} (run scripts/install-test-services)"))?;
        Ok(text
            .lines()
            .skip(1)
            .map(|l| {
                l.split(',')
                    .filter_map(|c| c.trim_matches('"').parse().ok())
                    .collect()
            })
            .collect())
    };
    let at = |step_ms: i64, values: Vec<f64>| -> Vec<Point> {
        let t = |i: usize| 1_700_000_000_000 + i as i64 * step_ms;
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| Point { t: t(i), v })
            .collect()
    };
    let week = 7 * 86_400_000;
    let mut series: Vec<(String, Vec<Point>)> = vec![
        (
            "CO2 at Mauna Loa, weekly (ppm)".into(),
            at(
                week,
                csv("co2.csv")?
                    .iter()
                    .filter_map(|r| r.get(1).copied())
                    .collect(),
            ),
        ),
        (
            "El Nino sea temperature, monthly (C)".into(),
            at(
                week * 4,
                csv("elnino.csv")?
                    .iter()
                    .flat_map(|r| r.iter().skip(1).copied().collect::<Vec<_>>())
                    .collect(),
            ),
        ),
        (
            "Sunspots, yearly".into(),
            at(
                week * 52,
                csv("sunspots.csv")?
                    .iter()
                    .filter_map(|r| r.get(1).copied())
                    .collect(),
            ),
        ),
        (
            "Nile flow, yearly".into(),
            at(
                week * 52,
                csv("nile.csv")?
                    .iter()
                    .filter_map(|r| r.get(1).copied())
                    .collect(),
            ),
        ),
    ];
    for (i, field) in ["temp", "hum", "pres"].iter().enumerate() {
        let values = (0..8760)
            .map(|h| weather(0, h)[field].as_f64().unwrap_or(0.0))
            .collect();
        series.push((
            format!("bench hourly weather, a year ({field})"),
            at(3_600_000, values),
        ));
        let walk = palletd::simulate::walk_series(7, 86_400, 1_700_000_000_000, 1000);
        let values = walk.iter().map(|w| w.1[i]).collect();
        series.push((
            format!("simulator walk, a day at 1/s ({field})"),
            at(1000, values),
        ));
    }
    println!("| series | points | rule | bound (% of span) | stored | stored % | largest error, linear | largest error, held |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for (name, points) in &series {
        let lo = points.iter().map(|p| p.v).fold(f64::INFINITY, f64::min);
        let hi = points.iter().map(|p| p.v).fold(f64::NEG_INFINITY, f64::max);
        for pct in [0.5, 1.0, 2.0] {
            let bound = (hi - lo) * pct / 100.0;
            let rules = [
                Rule::SwingingDoor {
                    deviation: bound,
                    max_interval_ms: i64::MAX,
                },
                Rule::Deadband {
                    band: bound,
                    max_interval_ms: i64::MAX,
                    min_interval_ms: 0,
                },
            ];
            for rule in rules {
                let keep = thin_series(rule, points);
                let stored = keep.iter().filter(|k| **k).count();
                let (linear, held) = errors(points, &keep);
                println!(
                    "| {name} | {} | {} | {bound:.3} ({pct}%) | {stored} | {:.1}% | {linear:.3} | {held:.3} |",
                    points.len(),
                    rule.kind(),
                    100.0 * stored as f64 / points.len() as f64,
                );
            }
        }
    }
    thinning_state();
    Ok(())
}

/// What the admission's thinning state costs with many sensors: each of
/// 1,000 and 100,000 sensors sends 40 readings of the simulator's walk
/// 15 s apart (10 minutes: no run ends for silence) under
/// `buckets-thinned`'s rules, in each storage mode; per reading the time
/// of the decision, the verdicts' sample and what is spooled later, and
/// per sensor the state's bytes (as `palletd_memory_bytes{part="thinning"}`
/// counts them).
pub(crate) fn thinning_state() {
    use palletd::bucket::Sample;
    use palletd::decode::{FieldValue, Reading};
    use palletd::internals::Thinning;
    use palletd::thin::Rule;
    let door = |deviation| Rule::SwingingDoor {
        deviation,
        max_interval_ms: 600_000,
    };
    let rules = vec![
        ("temp".to_string(), door(0.25)),
        (
            "humidity".to_string(),
            Rule::Deadband {
                band: 0.65,
                max_interval_ms: 600_000,
                min_interval_ms: 0,
            },
        ),
        ("pressure".to_string(), door(0.5)),
    ];
    const PER_SENSOR: usize = 40;
    println!();
    println!("| sensors | mode | ns / reading | records spooled later / reading | state bytes / sensor |");
    println!("|---:|---|---:|---:|---:|");
    for sensors in [1_000usize, 100_000] {
        for (mode, window) in [("buckets", None), ("timeseries", Some(3_600_000))] {
            let walks: Vec<Vec<(i64, [f64; 3])>> = (0..sensors)
                .map(|i| {
                    palletd::simulate::walk_series(i as u64, PER_SENSOR, 1_700_000_000_000, 15_000)
                })
                .collect();
            let mut th = Thinning::new(window, usize::MAX);
            let mut later = 0usize;
            let mut lsn = 0u64;
            let mut reading = Reading::default();
            let started = Instant::now();
            for k in 0..PER_SENSOR {
                for (i, walk) in walks.iter().enumerate() {
                    let (ts, v) = walk[k];
                    reading.sensor.clear();
                    reading.sensor.push_str(&format!("s{i}"));
                    reading.ts_ms = ts;
                    reading.fields = ["temp", "humidity", "pressure"]
                        .iter()
                        .zip(v)
                        .map(|(n, x)| (n.to_string(), FieldValue::Num(x)))
                        .collect();
                    let (thinned, l) = th.thin(&rules, &reading, ts, lsn);
                    for s in l.samples(lsn) {
                        std::hint::black_box(s);
                    }
                    later += l.len();
                    lsn += l.len() as u64;
                    std::hint::black_box(Sample::encode_thinned(&reading, lsn, &thinned));
                    lsn += 1;
                }
            }
            let ns = started.elapsed().as_nanos() as f64 / (sensors * PER_SENSOR) as f64;
            println!(
                "| {sensors} | {mode} | {ns:.0} | {:.3} | {} |",
                later as f64 / (sensors * PER_SENSOR) as f64,
                th.bytes() / sensors,
            );
        }
    }
}
