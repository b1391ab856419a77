//! The database's own failures, as a replica set replies them (a primary
//! stepping down before or while it runs a write, a write concern timeout,
//! duplicate keys, time limits, lost and late replies, a message over the
//! limits), injected by palletd's fault proxy (`palletd::testkit::netem::faults`)
//! between palletd and a real SecantusDB. Each fault alone in both storage
//! modes, then a random mix of all of them during a sustained backfill with
//! the closer, a rollup and two instances. Each ends by comparing what was
//! published with what MongoDB holds: every reading exactly once, in the
//! collection or (a statement an operator's unique index refuses) in the
//! dead letter.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bson::Document;
use common::*;
use palletd::testkit::netem::faults::{Fault, Plan, Rule};
use palletd::testkit::netem::Proxy;

/// The driver learns a stepped-down primary is writable again at its next
/// check (10 s by default; 500 ms is the least it takes).
const HEARTBEAT: &str = "&heartbeatFrequencyMS=500";

/// A rule for the write command of a storage mode's readings (bucket
/// writes push samples; the seal does not), not its dead letters' or the
/// latest values'.
fn readings_rule(timeseries: bool, fault: Fault) -> Rule {
    let (command, marker) = match timeseries {
        false => ("update", Some(b"$push".as_slice())),
        true => ("insert", None),
    };
    Rule {
        collection: Some("readings"),
        marker,
        ..Rule::once(command, fault)
    }
}

/// (sensor, seq) of the readings the dead letter holds, refused by the
/// database, each with how many times.
async fn dead_lettered(client: &mongodb::Client, db: &str) -> HashMap<(String, i64), usize> {
    let mut out = HashMap::new();
    for d in all_docs(client, db, "readings_deadletter").await {
        assert_eq!(d.get_str("cause").unwrap(), "rejected_by_database", "{d}");
        assert!(d.get_str("error").unwrap().contains("11000"), "{d}");
        let sample = d.get_document("sample").unwrap();
        let seq = sample.get_f64("seq").unwrap() as i64;
        *out.entry((d.get_str("sensorId").unwrap().to_string(), seq))
            .or_default() += 1;
    }
    out
}

/// Every reading sent is stored once or dead-lettered once, nothing else.
async fn exactly_once_or_dead_lettered(
    client: &mongodb::Client,
    db: &str,
    sent: &[(String, i64)],
) -> usize {
    let both = || async {
        let mut all = stored_counts(client, db).await;
        let dead = dead_lettered(client, db).await;
        for (k, n) in &dead {
            *all.entry(k.clone()).or_default() += n;
        }
        (all, dead)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (all, _) = both().await;
        let missing: Vec<_> = sent.iter().filter(|k| !all.contains_key(*k)).collect();
        if missing.is_empty() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let letters = all_docs(client, db, "readings_deadletter").await;
            panic!(
                "{} readings neither stored nor dead-lettered, e.g. {:?}; dead letters: {letters:?}",
                missing.len(),
                &missing[..missing.len().min(10)]
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (all, dead) = both().await;
    let twice: Vec<_> = all.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(twice.is_empty(), "stored more than once: {twice:?}");
    assert_eq!(all.len(), sent.len(), "nothing missing, nothing extra");
    dead.len()
}

async fn each_fault_alone(name: &str, timeseries: bool) {
    let db = Database::start();
    let plan = Plan::new(1, Duration::from_secs(2));
    let proxy = Proxy::faults(db.port, plan.clone()).await.unwrap();
    let mut stack = Stack::on(Broker::start(), db, name, |c| {
        let c = c
            .mongodb_uri(&proxy.mongodb_uri(HEARTBEAT))
            .uncompressed()
            .max_delay("200ms")
            .set("mongodb.write_time_limit", "1s");
        match timeseries {
            true => c.timeseries(),
            false => c,
        }
    })
    .await;
    let mut sent = Vec::new();
    for (k, fault) in Fault::ALL.into_iter().enumerate() {
        plan.add(readings_rule(timeseries, fault));
        let from = k as i64 * 100;
        let p = Publisher::connect(&stack.broker, &format!("pub-{name}-{k}")).await;
        let batch = publish_steadily_from(p, 10, 400.0, from..from + 100).await;
        sent.extend(batch);
        eventually(
            Duration::from_secs(30),
            &format!("{fault:?} injected"),
            || async { plan.injected(fault) == 1 },
        )
        .await;
        eprintln!("{fault:?} injected");
    }
    let dead = {
        let _g = LogOnPanic(&stack.palletd);
        exactly_once_or_dead_lettered(&stack.client, name, &sent).await
    };
    // An operator's unique index refused one statement: its readings (one
    // sensor's run in a bucket write, one reading in an insert) are in the
    // dead letter; nothing else is.
    assert!(dead >= 1, "the unique index's statement is dead-lettered");
    assert!(dead <= 100, "{dead}");
    let p = &stack.palletd;
    assert!(
        p.metric(
            "palletd_database_errors_total",
            Some(("kind", "write_concern"))
        ) >= 1.0
    );
    assert!(p.metric("palletd_database_errors_total", Some(("kind", "command"))) >= 3.0);
    assert!(p.metric("palletd_database_errors_total", Some(("kind", "network"))) >= 1.0);
    assert!(
        p.metric(
            "palletd_database_errors_total",
            Some(("kind", "statement_rejected"))
        ) >= 1.0
    );
    // The bucket whose `_id` was "taken" sent its statement to the next.
    if !timeseries {
        assert!(p.metric("palletd_bucket_id_collisions_total", None) >= 1.0);
    }
    assert_eq!(p.readyz().0, 200, "ready again");
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_database_fault_alone_loses_and_duplicates_nothing_in_buckets() {
    each_fault_alone("dbfaultsb", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_database_fault_alone_loses_and_duplicates_nothing_in_timeseries() {
    each_fault_alone("dbfaultst", true).await;
}

/// Readings of the hour three hours ago, one in 3 s per sensor: their
/// windows are over (the closer seals them as they come), and the rollup's
/// intervals are due as soon as they are written.
async fn backfill(
    mut publisher: Publisher,
    sensors: usize,
    rate: f64,
    seqs: std::ops::Range<i64>,
    start_ms: i64,
) -> Vec<(String, i64, i64)> {
    let started = tokio::time::Instant::now();
    let mut sent = Vec::new();
    for seq in seqs.clone() {
        let due = started + Duration::from_secs_f64((seq - seqs.start) as f64 / rate);
        tokio::time::sleep_until(due).await;
        let sensor = format!("f{:02}", seq as usize % sensors);
        let ts = start_ms + (seq / sensors as i64) * 3000;
        let payload = serde_json::json!({ "ts": ts, "seq": seq, "temp": (seq % 50) as f64 / 2.0 });
        publisher
            .publish(&format!("sensors/{sensor}/telemetry"), payload.to_string())
            .await;
        sent.push((sensor, seq, ts));
    }
    publisher.flush().await;
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_mix_of_database_faults_during_a_shared_backfill_loses_and_duplicates_nothing() {
    random_mix("dbfaultmix", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_mix_of_database_faults_in_timeseries_loses_and_duplicates_nothing() {
    random_mix("dbfaultmixt", true).await;
}

/// A random mix of every fault, each command's with a probability, while
/// two instances share a backfill, the closer seals its windows and a 10
/// minute rollup follows: every reading exactly once (or dead-lettered),
/// the rollups' counts equal to the readings stored in their intervals.
async fn random_mix(name: &str, timeseries: bool) {
    let broker = Broker::start();
    let db = Database::start();
    let plan = Plan::new(31, Duration::from_millis(1500));
    let proxy = Proxy::faults(db.port, plan.clone()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a_config = Config::new(&broker, &db, name)
        .mongodb_uri(&proxy.mongodb_uri(HEARTBEAT))
        .uncompressed()
        .set("mqtt.share_group", "palletd")
        .set("mongodb.write_time_limit", "1s")
        .max_delay("300ms")
        .closer("1s", "1s")
        .window("5m")
        .rollup("10m", false, None);
    let a_config = match timeseries {
        true => a_config.timeseries(),
        false => a_config,
    };
    let b_config = a_config.another(&format!("{name}-b"), dir.path());
    let a = Palletd::start(&a_config);
    let b = Palletd::start(&b_config);
    a.ready().await;
    b.ready().await;
    let client = db.client().await;
    // Every kind of command palletd sends, any fault now and then; a
    // write conflict in any write; a duplicate key only where a statement
    // can meet one: the readings' writes (a bucket's `_id`, or an index of
    // the operator's).
    for (fault, probability) in [
        (Fault::DuplicateKeyId, 0.01),
        (Fault::DuplicateKeyUnique, 0.005),
    ] {
        plan.add(Rule {
            probability,
            times: u64::MAX,
            ..readings_rule(timeseries, fault)
        });
    }
    for command in ["update", "insert", "find", "aggregate", "delete"] {
        for fault in Fault::ALL {
            let statement = matches!(
                fault,
                Fault::DuplicateKeyId | Fault::DuplicateKeyUnique | Fault::WriteConflict
            );
            let writes = ["update", "insert", "delete"].contains(&command);
            // (A read over the limits is refused for good, and its rollup
            // key set aside for an hour: palletd's reads are bounded, a
            // real server does not say it to them.)
            let refused_read = fault == Fault::TooLarge && !writes;
            if refused_read || statement && (fault != Fault::WriteConflict || !writes) {
                continue;
            }
            plan.add(Rule::sometimes(command, fault, 0.004));
        }
    }
    let start_ms = (now_ms() / 3_600_000 - 3) * 3_600_000;
    let publisher = Publisher::connect(&broker, "pub-mix").await;
    let sent = backfill(publisher, 20, 200.0, 0..6000, start_ms).await;
    let keys: Vec<(String, i64)> = sent.iter().map(|(s, q, _)| (s.clone(), *q)).collect();
    let dead = exactly_once_or_dead_lettered(&client, name, &keys).await;
    for p in [&a, &b] {
        assert!(
            p.metric("palletd_samples_stored_total", None) > 0.0,
            "both took part"
        );
    }
    let injected: BTreeMap<String, u64> = Fault::ALL
        .iter()
        .map(|f| (format!("{f:?}"), plan.injected(*f)))
        .collect();
    eprintln!("faults injected: {injected:?}; readings dead-lettered: {dead}");
    assert!(plan.injected_total() >= 10, "{injected:?}");
    // Quiet again: the rollup's counts are the readings stored (the dead
    // letters' aside) in each of its intervals.
    plan.clear();
    let dead_keys = dead_lettered(&client, name).await;
    let mut want: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for (sensor, seq, ts) in &sent {
        if !dead_keys.contains_key(&(sensor.clone(), *seq)) {
            *want
                .entry((sensor.clone(), ts.div_euclid(600_000) * 600_000))
                .or_default() += 1;
        }
    }
    poll_until(
        Duration::from_secs(120),
        || async {
            let got: BTreeMap<(String, i64), i64> = all_docs(&client, name, "readings_10m")
                .await
                .iter()
                .map(|d: &Document| {
                    (
                        (
                            d.get_str("sensorId").unwrap().to_string(),
                            d.get_datetime("start").unwrap().timestamp_millis(),
                        ),
                        d.get_i64("count")
                            .or_else(|_| d.get_i32("count").map(i64::from))
                            .unwrap(),
                    )
                })
                .collect();
            got == want
        },
        || "the rollup's counts equal the readings stored".into(),
    )
    .await;
    // The closer sealed every window of the backfill.
    if timeseries {
        return;
    }
    poll_until(
        Duration::from_secs(60),
        || async {
            all_docs(&client, name, "readings")
                .await
                .iter()
                .all(|b| b.get_bool("closed").unwrap_or(false))
        },
        || "every bucket sealed".into(),
    )
    .await;
    for b in all_docs(&client, name, "readings").await {
        check_bucket(&b, 5 * 60_000, 200, 256 * 1024);
        check_sealed(&b);
    }
}

struct LogOnPanic<'a>(&'a Palletd);
impl Drop for LogOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.0.log();
            eprintln!("palletd log:\n{}", &log[log.len().saturating_sub(20000)..]);
        }
    }
}
