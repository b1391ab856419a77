//! Thinning (`[subscription.thinning.<field>]`) end to end: real series
//! (statsmodels' weekly CO2 under a swinging door, monthly El Nino sea
//! temperatures under a deadband) published through Mosquitto, palletd
//! SIGKILLed halfway and stopped cleanly at the end. What MongoDB holds:
//! every point left out within its rule's bound of what a reader sees,
//! no point twice, and the summaries and rollups of every reading.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{Bson, Document};
use common::*;

/// The swinging door's deviation on CO2 (ppm): half a percent of its span.
const DOOR: f64 = 0.3;
/// The deadband on the sea temperature (degrees C).
const BAND: f64 = 0.1;
/// The reading whose `temp` is a string (a device reporting a fault).
const FAULT: usize = 1000;

/// One reading as published.
struct Reading {
    ts: i64,
    temp: Option<f64>,
    sst: f64,
    door: bool,
}

/// The whole CO2 series a minute apart, ending three hours ago, with the
/// sea temperatures beside it and a door opened every 97th minute.
fn readings() -> Vec<Reading> {
    let co2 = co2();
    let sst = elnino();
    let hour = 3_600_000;
    let start = (now_ms() / hour - 3) * hour - co2.len() as i64 * 60_000;
    co2.iter()
        .enumerate()
        .map(|(i, (_, ppm))| Reading {
            ts: start + i as i64 * 60_000,
            temp: (i != FAULT).then_some(*ppm),
            sst: sst[i % sst.len()],
            door: i % 97 == 0,
        })
        .collect()
}

fn config(c: Config) -> Config {
    let rules: toml::Table = toml::from_str(&format!(
        r#"
temp = {{ kind = "swinging_door", deviation = {DOOR}, max_interval = "1h" }}
sst = {{ kind = "deadband", deviation = {BAND}, max_interval = "1h" }}
"#
    ))
    .unwrap();
    c.window("1h")
        .rollup("1h", false, None)
        .closer("2s", "2s")
        .subscription(&[
            ("topic", "greenhouse/{sensor}/telemetry".into()),
            ("thinning", toml::Value::Table(rules)),
        ])
}

async fn publish(publisher: &mut Publisher, readings: &[Reading]) {
    for r in readings {
        let mut v = serde_json::json!({ "ts": r.ts, "sst": r.sst });
        v["temp"] = match r.temp {
            Some(x) => x.into(),
            None => "sensor fault".into(),
        };
        if r.door {
            v["door"] = "open".into();
        }
        publisher
            .publish("greenhouse/mauna-loa/telemetry", v.to_string())
            .await;
    }
    publisher.flush().await;
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Every stored value of `field` in buckets' samples, by time: no time
/// twice.
fn stored_points(buckets: &[Document], field: &str) -> BTreeMap<i64, Bson> {
    let samples = buckets
        .iter()
        .flat_map(|b| b.get_array("samples").unwrap())
        .map(|s| s.as_document().unwrap());
    let samples: Vec<&Document> = samples.collect();
    for s in &samples {
        assert!(
            !s.keys().any(|k| k.starts_with('_')),
            "palletd's own keys are not stored: {s}"
        );
    }
    points(&samples, field)
}

/// Every stored value of `field` in documents of a reading's time (samples,
/// time series documents), by time: no time twice.
fn points(docs: &[&Document], field: &str) -> BTreeMap<i64, Bson> {
    let mut out = BTreeMap::new();
    for d in docs {
        if let Some(v) = d.get(field) {
            let ts = d.get_datetime("ts").unwrap().timestamp_millis();
            assert!(
                out.insert(ts, v.clone()).is_none(),
                "{field} at {ts} stored twice"
            );
        }
    }
    out
}

/// A counter's value, summed over the series with these labels.
fn counter(p: &Palletd, metric: &str, labels: &[(&str, &str)]) -> f64 {
    p.scrape()
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(x) => x,
            _ => 0.0,
        })
        .sum()
}

/// Publishes `readings` through a SIGKILL halfway and a clean stop at
/// the end, checking the counts and the status page on the way; returns
/// the stack, palletd started again and settled.
async fn through_a_kill_and_a_stop(name: &str, timeseries: bool, readings: &[Reading]) -> Stack {
    let n = readings.len();
    let half = n / 2;
    let mut stack = Stack::start(name, |c| match timeseries {
        true => config(c).timeseries(),
        false => config(c),
    })
    .await;
    let mut publisher = stack.publisher().await;
    publish(&mut publisher, &readings[..half]).await;
    stack.all_acknowledged().await;
    stack.wait_stored(1).await;
    // Killed with points held: the door's candidate ends of its run.
    stack.palletd.kill();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    publish(&mut publisher, &readings[half..]).await;
    stack.all_acknowledged().await;
    let counted = |p: &Palletd, rule: &str, outcome: &str| {
        counter(
            p,
            "palletd_thinning_points_total",
            &[("rule", rule), ("outcome", outcome)],
        )
    };
    let second = (n - half) as f64;
    stack
        .palletd
        .wait_until(Duration::from_secs(30), "the second half counted", |p| {
            counted(p, "deadband", "received") == second
        })
        .await;
    assert_eq!(counted(&stack.palletd, "swinging_door", "received"), second);
    let door_stored = counted(&stack.palletd, "swinging_door", "stored");
    assert!(door_stored > 0.0 && door_stored < second, "{door_stored}");
    assert_eq!(counted(&stack.palletd, "swinging_door", "unordered"), 0.0);
    // The status page shows the share stored.
    let (_, page) = http_get(stack.palletd.http_port, "/");
    let share = format!(
        "id=\"thinning-swinging_door\">{:.1}%",
        100.0 * door_stored / second
    );
    assert!(page.contains(&share), "{share} in {page}");
    // A clean stop stores every point still held.
    stack.stop();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    stack.palletd.settled().await;
    stack
}

/// The stored points of each field: what the rules keep, within their
/// bounds of every reading; `numeric`: the door's numbers stored.
fn check_points(
    readings: &[Reading],
    temp: &BTreeMap<i64, Bson>,
    sst: &BTreeMap<i64, Bson>,
    doors: &BTreeMap<i64, Bson>,
) -> usize {
    let n = readings.len();
    let half = n / 2;
    let source: BTreeMap<i64, &Reading> = readings.iter().map(|r| (r.ts, r)).collect();

    // The swinging door: the first and last points, the fault, and the
    // point held at the kill (read back from the spool at the restart)
    // are stored; every point left out is within the deviation of the
    // line between the stored points around it.
    assert_eq!(
        temp.get(&readings[FAULT].ts),
        Some(&Bson::String("sensor fault".into()))
    );
    let numeric: Vec<(i64, f64)> = temp
        .iter()
        .filter_map(|(t, v)| Some((*t, v.as_f64()?)))
        .collect();
    for (t, v) in &numeric {
        assert_eq!(source[t].temp, Some(*v), "stored as received");
    }
    for r in [&readings[0], &readings[half - 1], &readings[n - 1]] {
        assert!(temp.contains_key(&r.ts), "{} stored", r.ts);
    }
    assert!(
        numeric.len() < n * 6 / 10,
        "thinned: {} of {n}",
        numeric.len()
    );
    let mut worst: f64 = 0.0;
    for w in numeric.windows(2) {
        let ((ta, va), (tb, vb)) = (w[0], w[1]);
        for r in source.range(ta + 1..tb).map(|e| e.1) {
            let Some(v) = r.temp else { continue };
            let line = va + (vb - va) * (r.ts - ta) as f64 / (tb - ta) as f64;
            worst = worst.max((v - line).abs());
        }
    }
    assert!(
        worst <= DOOR + 1e-9,
        "a dropped CO2 point is {worst} off the line"
    );

    // The deadband: every point left out is within the band of the last
    // one stored.
    let mut last: Option<f64> = None;
    let mut kept = 0;
    for r in readings {
        match sst.get(&r.ts) {
            Some(v) => {
                assert_eq!(v.as_f64(), Some(r.sst));
                last = Some(r.sst);
                kept += 1;
            }
            None => {
                let held = last.expect("the first point is stored");
                assert!(
                    (r.sst - held).abs() <= BAND + 1e-9,
                    "{} dropped, {held} held",
                    r.sst
                );
            }
        }
    }
    assert!(kept < n, "some sea temperatures were left out");
    // A field without a rule: every value.
    assert_eq!(doors.len(), readings.iter().filter(|r| r.door).count());
    numeric.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinned_fields_keep_their_bounds_and_every_reading_s_summary_through_a_kill_and_a_stop() {
    let readings = readings();
    let n = readings.len();
    let stack = through_a_kill_and_a_stop("thinning", false, &readings).await;
    let buckets = stack.docs("readings").await;
    let temp = stored_points(&buckets, "temp");
    let sst = stored_points(&buckets, "sst");
    let doors = stored_points(&buckets, "door");
    let stored_temp = check_points(&readings, &temp, &sst, &doors);

    // The summaries hold every reading once, stored or not.
    let total = |path: &str| {
        buckets
            .iter()
            .map(|b| number(b.get(path).or(Some(&Bson::Int32(0)))))
            .sum::<f64>()
    };
    assert_eq!(
        total("count") + total("thinned"),
        n as f64,
        "readings represented"
    );
    assert_eq!(
        total("count"),
        buckets
            .iter()
            .map(|b| b.get_array("samples").unwrap().len() as f64)
            .sum::<f64>()
    );
    let sum_of = |path: &str, field: &str| -> f64 {
        buckets
            .iter()
            .filter_map(|b| {
                b.get_document(path)
                    .ok()?
                    .get(field)
                    .map(|v| number(Some(v)))
            })
            .sum()
    };
    assert_eq!(sum_of("n", "temp"), (n - 1) as f64);
    assert_eq!(sum_of("n", "sst"), n as f64);
    let co2_sum: f64 = readings.iter().filter_map(|r| r.temp).sum();
    assert!(close(sum_of("sum", "temp"), co2_sum));
    let b0 = buckets
        .iter()
        .find(|b| b.get_document("thinning").is_ok())
        .unwrap();
    let rules = b0.get_document("thinning").unwrap();
    assert_eq!(
        rules.get_document("temp").unwrap().get_str("kind"),
        Ok("swinging_door")
    );
    assert_eq!(
        rules.get_document("temp").unwrap().get_f64("deviation"),
        Ok(DOOR)
    );
    assert_eq!(
        rules.get_document("sst").unwrap().get_str("kind"),
        Ok("deadband")
    );
    assert_eq!(rules.get_document("sst").unwrap().get_f64("band"), Ok(BAND));
    let stored_by_rule: f64 = buckets
        .iter()
        .filter_map(|b| b.get_document("thinning").ok()?.get_document("temp").ok())
        .map(|t| number(t.get("stored")))
        .sum();
    assert_eq!(
        stored_by_rule, stored_temp as f64,
        "thinning.temp.stored: the numbers"
    );

    check_rollups(&stack, &readings).await;
}

/// The hourly rollups are those of every reading.
async fn check_rollups(stack: &Stack, readings: &[Reading]) {
    let hour = 3_600_000;
    let mut want: BTreeMap<i64, (i64, Vec<(i64, f64)>)> = BTreeMap::new();
    for r in readings {
        let e = want.entry(r.ts.div_euclid(hour) * hour).or_default();
        e.0 += 1;
        if let Some(x) = r.temp {
            e.1.push((r.ts, x));
        }
    }
    let matches = |docs: &[Document]| -> Result<(), String> {
        if docs.len() != want.len() {
            return Err(format!("{} of {} rollups", docs.len(), want.len()));
        }
        for d in docs {
            let start = d.get_datetime("start").unwrap().timestamp_millis();
            let (count, values) = &want[&start];
            let f = |p: &str| number(d.get_document(p).unwrap().get("temp"));
            let sum: f64 = values.iter().map(|v| v.1).sum();
            let min = values.iter().map(|v| v.1).fold(f64::INFINITY, f64::min);
            let max = values.iter().map(|v| v.1).fold(f64::NEG_INFINITY, f64::max);
            let ok = number(d.get("count")) == *count as f64
                && f("n") == values.len() as f64
                && close(f("sum"), sum)
                && f("min") == min
                && f("max") == max
                && close(f("avg"), sum / values.len() as f64)
                && f("first") == values[0].1
                && f("last") == values[values.len() - 1].1;
            if !ok {
                return Err(format!("{d} against {count} readings {values:?}"));
            }
        }
        Ok(())
    };
    let mut last_error = String::new();
    for _ in 0..300 {
        match matches(&stack.docs("readings_1h").await) {
            Ok(()) => return,
            Err(e) => last_error = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the hourly rollups never matched every reading: {last_error}");
}

/// The same in time series mode: a document per reading with anything
/// stored, the values left out summed up per window in documents of
/// their own (those open at the kill read back from the spool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_time_series_mode_the_values_left_out_are_summed_up_once_through_a_kill_and_a_stop() {
    let readings = readings();
    let stack = through_a_kill_and_a_stop("thinning-ts", true, &readings).await;
    check_time_series(&stack, &readings).await;
}

/// Features together, in time series mode: the reply to an insert holding
/// a summary of values left out is lost after the server applied it, then
/// the database is away while the second half comes (spooled,
/// acknowledged, written from the backlog when it is back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_time_series_mode_a_lost_reply_and_an_outage_store_every_reading_once() {
    let readings = readings();
    let half = readings.len() / 2;
    let db = Database::start();
    let proxy = CutProxy::start_cutting(db.port, "insert", Some(b"_leftOut")).await;
    let mut stack = Stack::on(Broker::start(), db, "thinning-cut", |c| {
        config(c)
            .timeseries()
            .mongodb_uri(&proxy.uri())
            .uncompressed()
    })
    .await;
    proxy.arm();
    let mut publisher = stack.publisher().await;
    publish(&mut publisher, &readings[..half]).await;
    stack.all_acknowledged().await;
    stack
        .palletd
        .wait_for_log(
            "An interrupted insert had been applied in part",
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(proxy.cuts(), 1);
    stack.db.stop();
    publish(&mut publisher, &readings[half..]).await;
    stack.all_acknowledged().await;
    stack.db.start_again();
    stack.stop();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    stack.palletd.settled().await;
    check_time_series(&stack, &readings).await;
}

/// What a time series collection holds after `readings`: each record
/// once, the points within their bounds, every reading once in a document
/// of its own or a summary, `palletd query` and the rollups of every
/// reading.
async fn check_time_series(stack: &Stack, readings: &[Reading]) {
    let n = readings.len();
    let docs = stack.docs("readings").await;
    let mut records = std::collections::HashSet::new();
    for d in &docs {
        let record = (d.get_str("_spool").unwrap(), d.get_i64("lsn").unwrap());
        assert!(records.insert(record), "{record:?} stored twice");
        assert!(!d.contains_key("_thin"), "{d}");
    }
    let (left_out, stored): (Vec<&Document>, Vec<&Document>) =
        docs.iter().partition(|d| d.contains_key("_leftOut"));
    let temp = points(&stored, "temp");
    let sst = points(&stored, "sst");
    let doors = points(&stored, "door");
    check_points(readings, &temp, &sst, &doors);
    let own: Vec<&&Document> = stored
        .iter()
        .filter(|d| !d.contains_key("_archive"))
        .collect();
    assert!(own.len() < n, "{} documents of {n} readings", own.len());

    // Every reading once: a document of its own, or counted in a summary.
    let summary = |d: &Document| d.get_document("_leftOut").unwrap().clone();
    let left = |part: &str, field: &str| -> f64 {
        (left_out.iter().map(|d| summary(d)))
            .filter_map(|s| Some(number(Some(s.get_document(part).ok()?.get(field)?))))
            .sum()
    };
    let counted: f64 = left_out
        .iter()
        .map(|d| number(summary(d).get("count")))
        .sum();
    assert_eq!(own.len() as f64 + counted, n as f64, "readings represented");
    let own_values =
        |field: &str| -> Vec<f64> { own.iter().filter_map(|d| d.get_f64(field).ok()).collect() };
    assert_eq!(
        own_values("temp").len() as f64 + left("n", "temp"),
        (n - 1) as f64
    );
    assert_eq!(own_values("sst").len() as f64 + left("n", "sst"), n as f64);
    let co2_sum: f64 = readings.iter().filter_map(|r| r.temp).sum();
    assert!(close(
        own_values("temp").iter().sum::<f64>() + left("sum", "temp"),
        co2_sum
    ));
    // The rule and its bound go with the values left out.
    for s in left_out.iter().map(|d| summary(d)) {
        let rules = s.get_document("thinning").unwrap();
        for field in s.get_document("n").unwrap().keys() {
            let (kind, bound, value) = match field.as_str() {
                "temp" => ("swinging_door", "deviation", DOOR),
                "sst" => ("deadband", "band", BAND),
                other => panic!("{other} left out: {s}"),
            };
            let rule = rules.get_document(field).unwrap();
            assert_eq!(rule.get_str("kind"), Ok(kind));
            assert_eq!(rule.get_f64(bound), Ok(value));
        }
    }

    // `palletd query`: the points stored, and per window every reading.
    let cfg = (stack.config).write_to(stack.palletd.dir.path(), "query.toml");
    let lines = query_ok(&cfg, &["--sensor", "mauna-loa"]);
    let printed = lines.lines().filter(|l| l.contains("\"temp\"")).count();
    assert_eq!(printed, temp.len(), "the points, no summary: {lines:.300}");
    assert!(!lines.contains("_leftOut") && !lines.contains("_archive"));
    let summary = query_ok(&cfg, &["--summary"]);
    let points = format!("holding {} samples of 1 sensors", stored.len());
    assert!(summary.contains(&points), "{points} in {summary}");
    let hour = 3_600_000;
    let mut want: BTreeMap<i64, (i64, f64)> = BTreeMap::new();
    for r in readings {
        let e = want.entry(r.ts.div_euclid(hour) * hour).or_default();
        e.0 += 1;
        e.1 += r.temp.unwrap_or(0.0);
    }
    let stats = query_ok(&cfg, &["--sensor", "mauna-loa", "--stats"]);
    let stats: Vec<serde_json::Value> = (stats.lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(stats.len(), want.len());
    for (w, (count, sum)) in stats.iter().zip(want.values()) {
        assert_eq!(w["count"].as_i64(), Some(*count), "{w}");
        assert!(
            close(w["fields"]["temp"]["sum"].as_f64().unwrap(), *sum),
            "{w}"
        );
    }
    check_rollups(stack, readings).await;
}

/// Many sensors in a small memory: thinning's runs take an eighth of
/// `limits.max_memory` (512 KiB of 4 MiB, about 350 sensors of these two
/// fields); beyond it the runs of the sensors heard from longest ago end
/// early, their held points stored, and every bound and summary holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_their_memory_share_runs_end_early_and_keep_their_bounds() {
    const SENSORS: usize = 800;
    const EACH: usize = 5;
    let mut stack = Stack::start("thinning-memory", |c| {
        config(c).set("limits.max_memory", "4MiB")
    })
    .await;
    let mut publisher = stack.publisher().await;
    let start = (now_ms() / 60_000 - 30) * 60_000;
    // A straight line per sensor: the door leaves out all but a run's
    // ends; a deadband of a constant stores its first point.
    let value = |i: usize, k: usize| 300.0 + i as f64 * 0.01 + k as f64 * 0.05;
    let mut publish = async |ks: std::ops::Range<usize>| {
        for k in ks {
            for i in 0..SENSORS {
                let v = serde_json::json!({ "ts": start + k as i64 * 60_000, "temp": value(i, k), "sst": 25.0 });
                publisher
                    .publish(&format!("greenhouse/s{i:03}/telemetry"), v.to_string())
                    .await;
            }
        }
        publisher.flush().await;
    };
    // Three readings each, then the runs of some end for memory; two more.
    publish(0..3).await;
    stack.all_acknowledged().await;
    stack
        .palletd
        .wait_until(Duration::from_secs(30), "runs ended for memory", |p| {
            counter(p, "palletd_thinning_sensors_ended_total", &[]) > 0.0
        })
        .await;
    publish(3..EACH).await;
    stack.all_acknowledged().await;
    stack.stop();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    stack.palletd.settled().await;

    let buckets = stack.docs("readings").await;
    let total = |path: &str| -> f64 {
        (buckets.iter())
            .map(|b| number(b.get(path).or(Some(&Bson::Int32(0)))))
            .sum()
    };
    let n = (SENSORS * EACH) as f64;
    assert_eq!(total("count") + total("thinned"), n, "readings represented");
    let mut ended = 0;
    for i in 0..SENSORS {
        let sensor = format!("s{i:03}");
        let mine: Vec<Document> = (buckets.iter())
            .filter(|b| b.get_str("sensorId") == Ok(sensor.as_str()))
            .cloned()
            .collect();
        let temp = stored_points(&mine, "temp");
        let ts = |k: usize| start + k as i64 * 60_000;
        // Each point left out lies on the line between the stored ones.
        let points: Vec<(i64, f64)> = temp
            .iter()
            .map(|(t, v)| (*t, v.as_f64().unwrap()))
            .collect();
        for w in points.windows(2) {
            let ((ta, va), (tb, vb)) = (w[0], w[1]);
            for k in (0..EACH).filter(|k| (ta + 1..tb).contains(&ts(*k))) {
                let line = va + (vb - va) * (ts(k) - ta) as f64 / (tb - ta) as f64;
                assert!((value(i, k) - line).abs() <= DOOR + 1e-9, "{sensor} at {k}");
            }
        }
        // A run's ends; a run ended early (at any sweep) adds its held
        // point and the next run's first, and the deadband's constant
        // starts again with the next run.
        assert_eq!(temp.keys().next(), Some(&ts(0)), "{sensor}");
        assert_eq!(temp.keys().last(), Some(&ts(EACH - 1)), "{sensor}");
        let sst = stored_points(&mine, "sst").len();
        assert_eq!(sst > 1, temp.len() > 2, "{sensor}: {sst} sst, {temp:?}");
        ended += (temp.len() > 2) as usize;
    }
    // Some ended early: those ended before the last two readings came.
    assert!(ended > 0, "none ended early");
}
