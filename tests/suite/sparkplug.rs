//! `format = "sparkplug_b"` against real Mosquitto and SecantusDB: what edge
//! nodes send is stored with the names their BIRTHs gave, across a palletd
//! restart between BIRTH and DATA, with sequence gaps, and DEATHs (sent,
//! and by the broker as a last will) are recorded.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{Bson, Document};
use common::*;
use palletd::decode::sparkplug::proto::{self, metric::Value};
use palletd::decode::sparkplug::{field_name, DataType};
use prost::Message as _;

/// Every stored sample, by sensor, in time order.
async fn samples(stack: &Stack) -> BTreeMap<String, Vec<Document>> {
    let mut out: BTreeMap<String, Vec<Document>> = BTreeMap::new();
    for b in stack.docs("readings").await {
        let sensor = b.get_str("sensorId").unwrap().to_string();
        for s in b.get_array("samples").unwrap() {
            out.entry(sensor.clone())
                .or_default()
                .push(s.as_document().unwrap().clone());
        }
    }
    for v in out.values_mut() {
        v.sort_by_key(|s| s.get_datetime("ts").unwrap().timestamp_millis());
    }
    out
}

/// Waits until `f` holds for the stored samples.
async fn wait_samples(
    stack: &Stack,
    what: &str,
    f: impl Fn(&BTreeMap<String, Vec<Document>>) -> bool,
) {
    eventually(Duration::from_secs(60), what, || async {
        f(&samples(stack).await)
    })
    .await;
}

/// The samples of `sensor` that have field `name`.
fn with_field<'a>(
    all: &'a BTreeMap<String, Vec<Document>>,
    sensor: &str,
    name: &str,
) -> Vec<&'a Document> {
    all.get(sensor)
        .map(|v| v.iter().filter(|s| s.contains_key(name)).collect())
        .unwrap_or_default()
}

fn metric(name: Option<&str>, alias: u64, t: DataType, value: Value) -> proto::Metric {
    proto::Metric {
        name: name.map(Into::into),
        alias: Some(alias),
        datatype: Some(t as u32),
        value: Some(value),
        ..Default::default()
    }
}

fn by_alias(alias: u64, ts: i64, value: Value) -> proto::Metric {
    proto::Metric {
        alias: Some(alias),
        timestamp: Some(ts as u64),
        value: Some(value),
        ..Default::default()
    }
}

fn payload(ts: i64, seq: Option<u64>, metrics: Vec<proto::Metric>) -> Vec<u8> {
    proto::Payload {
        timestamp: Some(ts as u64),
        seq,
        metrics,
        ..Default::default()
    }
    .encode_to_vec()
}

fn stored_f64(s: &Document, field: &str) -> f64 {
    match s.get(field) {
        Some(Bson::Double(x)) => *x,
        other => panic!("{field}: expected a double, got {other:?} in {s:?}"),
    }
}

#[tokio::test]
async fn values_are_stored_by_name_across_a_restart_between_birth_and_data() {
    let mut stack = Stack::start("sparkplug", |c| c.sparkplug(None)).await;
    let mut p = stack.publisher().await;
    let t0 = now_ms() - 60_000;
    // NBIRTH: names, aliases, types, values; one metric of each kind.
    let nbirth = payload(
        t0,
        Some(0),
        vec![
            metric(Some("bdSeq"), 0, DataType::Int64, Value::LongValue(4)),
            metric(Some("Temp.C"), 1, DataType::Float, Value::FloatValue(20.5)),
            metric(
                Some("Motor/Speed"),
                2,
                DataType::Int32,
                Value::IntValue(-7i32 as u32),
            ),
            metric(
                Some("Running"),
                3,
                DataType::Boolean,
                Value::BooleanValue(true),
            ),
            metric(
                Some("Mode"),
                4,
                DataType::String,
                Value::StringValue("auto".into()),
            ),
            metric(
                Some("Since"),
                5,
                DataType::DateTime,
                Value::LongValue(t0 as u64 - 5000),
            ),
            metric(Some("$cost"), 6, DataType::Double, Value::DoubleValue(0.25)),
            metric(Some("Table"), 7, DataType::Int8, Value::IntValue(0)),
            proto::Metric {
                name: Some("Recipe".into()),
                alias: Some(8),
                datatype: Some(16),
                value: Some(Value::DatasetValue(proto::Opaque {})),
                ..Default::default()
            },
        ],
    );
    p.publish("spBv1.0/G1/NBIRTH/edge-1", nbirth).await;
    let dbirth = payload(
        t0,
        Some(1),
        vec![metric(
            Some("level"),
            20,
            DataType::UInt16,
            Value::IntValue(300),
        )],
    );
    p.publish("spBv1.0/G1/DBIRTH/edge-1/tank-a", dbirth).await;
    p.flush().await;
    wait_samples(&stack, "both BIRTHs stored", |all| {
        !with_field(all, "G1:edge-1", "_state").is_empty()
            && !with_field(all, "G1:edge-1:tank-a", "_state").is_empty()
    })
    .await;
    assert_eq!(
        stack.palletd.metric(
            "palletd_sparkplug_metrics_skipped_total",
            Some(("datatype", "DataSet"))
        ),
        1.0
    );
    let all = samples(&stack).await;
    let birth = with_field(&all, "G1:edge-1", "_state")[0];
    assert_eq!(birth.get_str("_state").unwrap(), "online");
    assert_eq!(birth.get_i64("_bdSeq"), Ok(4), "an integer, not a double");
    assert_eq!(stored_f64(birth, "Temp%2EC"), 20.5);
    assert_eq!(stored_f64(birth, "Motor/Speed"), -7.0);
    assert!(birth.get_bool("Running").unwrap());
    assert_eq!(birth.get_str("Mode").unwrap(), "auto");
    assert_eq!(
        birth.get_datetime("Since").unwrap().timestamp_millis(),
        t0 - 5000
    );
    assert_eq!(stored_f64(birth, &field_name("$cost")), 0.25);
    assert_eq!(stored_f64(birth, "Table"), 0.0);
    assert!(!birth.contains_key("Recipe"), "datasets are skipped");

    // palletd dies before any DATA: the aliases must survive it.
    stack.palletd.kill();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    let mut sent: Vec<(i64, f64, f64)> = Vec::new();
    for i in 0..20u64 {
        let ts = t0 + 1000 * (i as i64 + 1);
        let (temp, level) = (21.0 + i as f64 / 4.0, 300.0 + i as f64);
        sent.push((ts, temp, level));
        let ndata = payload(
            ts,
            Some(2 * i + 2),
            vec![
                by_alias(1, ts, Value::FloatValue(temp as f32)),
                by_alias(2, ts, Value::IntValue((-(i as i32)) as u32)),
            ],
        );
        p.publish("spBv1.0/G1/NDATA/edge-1", ndata).await;
        let ddata = payload(
            ts,
            Some(2 * i + 3),
            vec![by_alias(20, ts, Value::IntValue(level as u32))],
        );
        p.publish("spBv1.0/G1/DDATA/edge-1/tank-a", ddata).await;
    }
    // A historical value, and DATA of a device no BIRTH announced.
    let mut old = by_alias(1, t0 - 30_000, Value::FloatValue(5.5));
    old.is_historical = Some(true);
    p.publish("spBv1.0/G1/NDATA/edge-1", payload(t0, Some(42), vec![old]))
        .await;
    p.publish(
        "spBv1.0/G1/DDATA/edge-1/tank-b",
        payload(t0, Some(43), vec![by_alias(20, t0, Value::IntValue(1))]),
    )
    .await;
    p.flush().await;
    wait_samples(&stack, "all DATA stored", |all| {
        with_field(all, "G1:edge-1", "Temp%2EC").len() == 22
            && with_field(all, "G1:edge-1:tank-a", "level").len() == 21
    })
    .await;
    let all = samples(&stack).await;
    let temps = with_field(&all, "G1:edge-1", "Temp%2EC");
    let historical = temps[0];
    assert_eq!(
        historical.get_datetime("ts").unwrap().timestamp_millis(),
        t0 - 30_000
    );
    assert_eq!(stored_f64(historical, "Temp%2EC"), 5.5);
    assert!(historical.get_bool("_historical").unwrap());
    let data: Vec<&Document> = temps[2..].to_vec();
    let levels = with_field(&all, "G1:edge-1:tank-a", "level");
    for (i, (ts, temp, level)) in sent.iter().enumerate() {
        let d = data[i];
        assert_eq!(d.get_datetime("ts").unwrap().timestamp_millis(), *ts);
        assert_eq!(stored_f64(d, "Temp%2EC"), f64::from(*temp as f32));
        assert_eq!(stored_f64(d, "Motor/Speed"), -(i as f64));
        assert!(!d.contains_key("_historical"));
        let l = levels[i + 1];
        assert_eq!(l.get_datetime("ts").unwrap().timestamp_millis(), *ts);
        assert_eq!(stored_f64(l, "level"), *level);
    }
    assert!(!all.contains_key("G1:edge-1:tank-b"));
    eventually(
        Duration::from_secs(60),
        "the unknown device's DATA dead-lettered",
        || async {
            stack
                .docs("readings_deadletter")
                .await
                .iter()
                .any(|d| d.get_str("cause") == Ok("unknown_alias"))
        },
    )
    .await;
    let dead = stack.docs("readings_deadletter").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        dead[0].get_str("topic").unwrap(),
        "spBv1.0/G1/DDATA/edge-1/tank-b"
    );
    stack.stop();
}

/// Subscribes to `filter` and collects what arrives: (topic, payload).
async fn listen(
    broker: &Broker,
    filter: &str,
) -> tokio::sync::mpsc::UnboundedReceiver<(String, Vec<u8>)> {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
    let opts = MqttOptions::new(format!("listen-{}", free_port()), "127.0.0.1", broker.port);
    let (client, mut eventloop) = AsyncClient::new(opts, 100);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
    let mut subscribed_tx = Some(subscribed_tx);
    client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    tokio::spawn(async move {
        let _client = client;
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(t) = subscribed_tx.take() {
                        let _ = t.send(());
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let _ = tx.send((p.topic.clone(), p.payload.to_vec()));
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), subscribed)
        .await
        .expect("subscribed")
        .unwrap();
    rx
}

#[tokio::test]
async fn a_sequence_gap_is_counted_stored_and_answered_with_one_rebirth_request() {
    let mut stack = Stack::start("sparkplug-seq", |c| c.sparkplug(Some("1h"))).await;
    let mut ncmd = listen(&stack.broker, "spBv1.0/G2/NCMD/+").await;
    let mut p = stack.publisher().await;
    let t0 = now_ms() - 10_000;
    let birth = payload(
        t0,
        Some(0),
        vec![
            metric(Some("bdSeq"), 0, DataType::Int64, Value::LongValue(0)),
            metric(Some("v"), 1, DataType::Double, Value::DoubleValue(0.0)),
        ],
    );
    p.publish("spBv1.0/G2/NBIRTH/n1", birth).await;
    // 1, 2, then 5 (3 and 4 missing), then 3 arriving late, then 6.
    for seq in [1u64, 2, 5, 3, 6] {
        let ts = t0 + 100 * seq as i64;
        p.publish(
            "spBv1.0/G2/NDATA/n1",
            payload(
                ts,
                Some(seq),
                vec![by_alias(1, ts, Value::DoubleValue(seq as f64))],
            ),
        )
        .await;
    }
    p.flush().await;
    wait_samples(&stack, "every DATA stored, the late one too", |all| {
        with_field(all, "G2:n1", "v").len() == 6
    })
    .await;
    let all = samples(&stack).await;
    let values: Vec<f64> = with_field(&all, "G2:n1", "v")
        .iter()
        .map(|s| stored_f64(s, "v"))
        .collect();
    assert_eq!(values, vec![0.0, 1.0, 2.0, 3.0, 5.0, 6.0]);
    assert_eq!(
        stack
            .palletd
            .metric("palletd_sparkplug_seq_gaps_total", None),
        1.0
    );
    assert_eq!(
        stack
            .palletd
            .metric("palletd_sparkplug_out_of_order_total", None),
        1.0
    );
    let request = tokio::time::timeout(Duration::from_secs(30), ncmd.recv())
        .await
        .expect("a rebirth request")
        .unwrap();
    let request = proto::Payload::decode(request.1.as_slice()).unwrap();
    assert_eq!(
        request.metrics[0].name.as_deref(),
        Some("Node Control/Rebirth")
    );
    assert_eq!(request.metrics[0].value, Some(Value::BooleanValue(true)));
    // Another gap within rebirth_min_interval asks nothing more.
    let ts = t0 + 2000;
    p.publish(
        "spBv1.0/G2/NDATA/n1",
        payload(
            ts,
            Some(20),
            vec![by_alias(1, ts, Value::DoubleValue(20.0))],
        ),
    )
    .await;
    p.flush().await;
    stack
        .palletd
        .wait_metric("palletd_sparkplug_seq_gaps_total", 2.0)
        .await;
    assert_eq!(
        stack.palletd.metric(
            "palletd_sparkplug_rebirth_requests_total",
            Some(("outcome", "sent"))
        ),
        1.0
    );
    assert!(ncmd.try_recv().is_err());
    stack.stop();
}

/// Runs `palletd simulate --format sparkplug_b` against the stack's broker.
fn simulate(stack: &Stack, prefix: &str, duration: &str) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_palletd"))
        .args([
            "simulate",
            "--url",
            &stack.broker.url(),
            "--format",
            "sparkplug_b",
            "--sensors",
            "4",
            "--devices-per-node",
            "2",
            "--rate",
            "5",
            "--duration",
            duration,
            "--sensor-prefix",
            prefix,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("palletd simulate")
}

fn state_of(s: &Document) -> Option<(&str, i64)> {
    let bd_seq = s
        .get_i64("_bdSeq")
        .unwrap_or_else(|_| panic!("_bdSeq: an integer in {s:?}"));
    Some((s.get_str("_state").ok()?, bd_seq))
}

/// MQTT 5: BIRTH before DATA on the one session, every value stored as
/// sent, the NDEATHs recorded.
#[tokio::test]
async fn simulated_nodes_over_mqtt5_are_stored_as_sent() {
    let mut stack = Stack::start("sparkplug-v5", |c| {
        c.sparkplug(None).set("mqtt.protocol", "5")
    })
    .await;
    a_clean_run_is_stored_as_sent(&stack).await;
    assert!(stack.docs("readings_deadletter").await.is_empty());
    stack.stop();
}

/// Four connections: the JSON subscription is shared over all of them,
/// the Sparkplug B one stays on the first, unshared (a node's BIRTH is read
/// before its DATA): every Sparkplug message arrives on connection 0,
/// every value is stored as sent, no DATA waits for an alias.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_four_connections_sparkplug_stays_on_the_first() {
    let mut stack = Stack::start("sparkplug-conns", |c| {
        c.sparkplug(None).set("mqtt.connections", 4)
    })
    .await;
    a_clean_run_is_stored_as_sent(&stack).await;
    let mut sent = publish_steadily(stack.publisher().await, 8, 200.0, 40).await;
    let json = |all: &BTreeMap<String, Vec<Document>>| -> Vec<(String, i64)> {
        let mut v: Vec<(String, i64)> = all
            .iter()
            .flat_map(|(sensor, ss)| {
                ss.iter()
                    .filter_map(|s| Some((sensor.clone(), s.get_f64("seq").ok()? as i64)))
            })
            .collect();
        v.sort();
        v
    };
    wait_samples(&stack, "the JSON readings stored", |all| {
        json(all).len() >= 40
    })
    .await;
    sent.sort();
    assert_eq!(json(&samples(&stack).await), sent, "each JSON reading once");
    assert!(stack.docs("readings_deadletter").await.is_empty());
    let s = stack.palletd.scrape();
    let on = |k: &str| {
        common::metric(
            &s,
            "palletd_messages_received_total",
            Some(("connection", k)),
        )
    };
    let sparkplug = common::metric(&s, "palletd_sparkplug_messages_total", None);
    let others: Vec<f64> = ["1", "2", "3"].iter().map(|k| on(k)).collect();
    assert!(sparkplug > 40.0, "{sparkplug}");
    assert!(
        on("0") >= sparkplug,
        "every Sparkplug message on the first connection: {} of {sparkplug}",
        on("0")
    );
    assert!(
        others.iter().all(|n| *n > 0.0) && others.iter().sum::<f64>() <= 40.0,
        "the JSON readings alone shared over the others: {others:?}"
    );
    let file = stack.config.settings().spool.dir.join("mqtt-sessions.json");
    let held: BTreeMap<String, Vec<String>> =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    for (id, filters) in &held {
        let first = id == "palletd-sparkplug-conns";
        assert_eq!(
            filters.contains(&"spBv1.0/#".to_string()),
            first,
            "{held:?}"
        );
    }
    stack.stop();
}

const SIM_NODES: [&str; 2] = ["plant:a-n0000", "plant:a-n0001"];
const SIM_DEVICES: [&str; 4] = [
    "plant:a-n0000:d000",
    "plant:a-n0000:d001",
    "plant:a-n0001:d000",
    "plant:a-n0001:d001",
];

/// Two simulated nodes run for 3 s: every DATA published is stored as
/// sent, then their clean NDEATHs.
async fn a_clean_run_is_stored_as_sent(stack: &Stack) {
    let (nodes, devices) = (SIM_NODES, SIM_DEVICES);
    // A clean run: every DATA published is stored as sent, then the NDEATH.
    let mut heard = listen(&stack.broker, "spBv1.0/plant/DDATA/#").await;
    let out = simulate(stack, "a-", "3s").wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let published: usize = text
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(published >= 40, "{text}");
    wait_samples(stack, "every simulated reading stored", |all| {
        devices
            .iter()
            .map(|d| with_field(all, d, "temperature").len())
            .sum::<usize>()
            == published + devices.len()
    })
    .await;
    // What the nodes sent, decoded here: per (device, time) the values of
    // its three metrics, sorted (so no alias map is needed to compare).
    type Values = BTreeMap<(String, i64), Vec<Vec<u64>>>;
    let mut sent = Values::new();
    let mut n = 0;
    while n < published {
        let (topic, bytes) = tokio::time::timeout(Duration::from_secs(30), heard.recv())
            .await
            .expect("the listener heard every DDATA")
            .unwrap();
        n += 1;
        let device: Vec<&str> = topic.split('/').collect();
        let p = proto::Payload::decode(bytes.as_slice()).unwrap();
        let mut values: Vec<f64> = p
            .metrics
            .iter()
            .map(|m| match m.value {
                // A Float is stored as the decimal it was written as.
                Some(Value::FloatValue(x)) => x.to_string().parse().unwrap(),
                Some(Value::DoubleValue(x)) => x,
                ref other => panic!("{other:?}"),
            })
            .collect();
        values.sort_by(f64::total_cmp);
        let ts = p.metrics[0].timestamp.unwrap() as i64;
        sent.entry((format!("plant:{}:{}", device[3], device[4]), ts))
            .or_default()
            .push(values.iter().map(|x| x.to_bits()).collect());
    }
    let mut stored = Values::new();
    for (sensor, samples) in samples(stack).await {
        for s in samples.iter().filter(|s| !s.contains_key("_state")) {
            let mut values: Vec<f64> = ["temperature", "humidity", "pressure"]
                .iter()
                .map(|f| stored_f64(s, f))
                .collect();
            values.sort_by(f64::total_cmp);
            stored
                .entry((
                    sensor.clone(),
                    s.get_datetime("ts").unwrap().timestamp_millis(),
                ))
                .or_default()
                .push(values.iter().map(|x| x.to_bits()).collect());
        }
    }
    for v in sent.values_mut().chain(stored.values_mut()) {
        v.sort();
    }
    assert_eq!(stored, sent);
    wait_samples(stack, "the clean NDEATHs recorded", |all| {
        nodes.iter().chain(devices.iter()).all(|s| {
            with_field(all, s, "_state")
                .last()
                .and_then(|x| state_of(x))
                == Some(("offline", 0))
        })
    })
    .await;
}

#[tokio::test]
async fn simulated_nodes_are_stored_reborn_after_a_reconnect_and_their_deaths_recorded() {
    let mut stack = Stack::start("sparkplug-sim", |c| c.sparkplug(None)).await;
    a_clean_run_is_stored_as_sent(&stack).await;
    // A node that loses the broker is born again with the next bdSeq; one
    // that is killed dies by its will.
    let mut sim = simulate(&stack, "b-", "10m");
    wait_samples(&stack, "the second simulator's DATA", |all| {
        with_field(all, "plant:b-n0001:d001", "temperature").len() >= 2
    })
    .await;
    stack.broker.restart();
    wait_samples(
        &stack,
        "a rebirth with bdSeq 1 after the reconnect",
        |all| {
            ["plant:b-n0000", "plant:b-n0001"].iter().all(|n| {
                with_field(all, n, "_state")
                    .iter()
                    .any(|s| state_of(s) == Some(("online", 1)))
            })
        },
    )
    .await;
    wait_samples(&stack, "DATA after the rebirth", |all| {
        let reborn = with_field(all, "plant:b-n0000", "_state")
            .last()
            .map(|s| s.get_datetime("ts").unwrap().timestamp_millis())
            .unwrap_or(i64::MAX);
        with_field(all, "plant:b-n0000:d000", "temperature")
            .iter()
            .any(|s| s.get_datetime("ts").unwrap().timestamp_millis() > reborn)
    })
    .await;
    sim.kill().unwrap();
    sim.wait().unwrap();
    wait_samples(&stack, "the will's NDEATHs recorded", |all| {
        ["plant:b-n0000", "plant:b-n0001", "plant:b-n0000:d001"]
            .iter()
            .all(|s| {
                with_field(all, s, "_state")
                    .last()
                    .and_then(|x| state_of(x))
                    == Some(("offline", 1))
            })
    })
    .await;
    // A will from an older session (bdSeq 0) is stale: counted, not stored.
    let mut p = stack.publisher().await;
    p.publish(
        "spBv1.0/plant/NDEATH/b-n0000",
        palletd::simulate::sparkplug::death_payload(0),
    )
    .await;
    p.flush().await;
    stack
        .palletd
        .wait_metric("palletd_sparkplug_stale_deaths_total", 1.0)
        .await;
    let all = samples(&stack).await;
    assert_eq!(
        with_field(&all, "plant:b-n0000", "_state")
            .last()
            .and_then(|x| state_of(x)),
        Some(("offline", 1))
    );
    assert!(stack.docs("readings_deadletter").await.is_empty());
    stack.stop();
}

/// A BIRTH is acknowledged as soon as its records are durable, like any
/// message: what it taught is a record in the spool beside its samples,
/// and the state's snapshot is made in the background. Here the snapshot
/// cannot be written at all (its temporary file's name is taken by a
/// directory): the BIRTHs are acknowledged anyway, palletd is killed, and
/// after the restart their DATA decodes by the aliases replayed from the
/// spool; once the way is clear the snapshot is written and holds them.
/// (Before, every acknowledgement after a BIRTH waited for a save of the
/// whole state, and a save that failed held them all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn births_are_acknowledged_without_waiting_for_a_save_and_replayed_after_a_crash() {
    let mut stack = Stack::start("spsave", |c| c.sparkplug(None)).await;
    let spool = stack
        .broker
        .dir
        .path()
        .join(format!("spool-{}", stack.config.client_id()));
    let blocker = spool.join("sparkplug.json.tmp");
    std::fs::create_dir_all(blocker.join("x")).unwrap();
    let mut p = stack.publisher().await;
    let birth = |bd: i64| {
        payload(
            now_ms(),
            Some(0),
            vec![
                metric(
                    Some("bdSeq"),
                    0,
                    DataType::Int64,
                    Value::LongValue(bd as u64),
                ),
                metric(Some("T"), 1, DataType::Double, Value::DoubleValue(1.0)),
            ],
        )
    };
    for node in 0..300 {
        p.publish(&format!("spBv1.0/G/NBIRTH/N{node}"), birth(0))
            .await;
    }
    p.flush().await;
    stack.all_acknowledged().await;
    wait_samples(&stack, "the 300 BIRTHs stored", |all| all.len() == 300).await;
    let saved = std::fs::read_to_string(spool.join("sparkplug.json")).unwrap();
    assert!(!saved.contains("G/N0"), "no snapshot holds the BIRTHs yet");

    stack.palletd.kill();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    let ts = now_ms();
    for node in [0, 150, 299] {
        let data = payload(ts, Some(1), vec![by_alias(1, ts, Value::DoubleValue(42.0))]);
        p.publish(&format!("spBv1.0/G/NDATA/N{node}"), data).await;
    }
    p.flush().await;
    wait_samples(&stack, "the DATA stored by name", |all| {
        ["G:N0", "G:N150", "G:N299"].iter().all(|s| {
            all.get(*s)
                .is_some_and(|v| v.iter().any(|d| d.get_f64("T") == Ok(42.0)))
        })
    })
    .await;
    assert!(stack.docs("readings_deadletter").await.is_empty());
    assert!(
        stack
            .palletd
            .metric("palletd_sparkplug_state_save_errors_total", None)
            >= 1.0,
        "the snapshot at start failed"
    );
    std::fs::remove_dir_all(&blocker).unwrap();
    eventually(
        Duration::from_secs(30),
        "a snapshot holding the BIRTHs",
        || async {
            std::fs::read_to_string(spool.join("sparkplug.json"))
                .is_ok_and(|s| s.contains("G/N0") && s.contains("G/N299"))
        },
    )
    .await;
    stack.stop();
}

/// A device cannot write a line of its own into palletd's log: an edge
/// node whose id holds a newline and a forged log line is logged escaped
/// where palletd asks it for a rebirth (and where it dead-letters its
/// message). Through aedes: Mosquitto refuses a topic with a control
/// character (it closed the publisher's connection). With a sensor id
/// pattern that takes any character: the default one refuses the id (a
/// dead letter, whose log line has the topic escaped).
#[tokio::test]
async fn a_node_id_with_a_newline_cannot_forge_a_log_line() {
    let aedes = Aedes::start();
    let db = Database::start();
    let config = Config::new_with(&aedes.url(), aedes.dir.path(), &db, "forge")
        .set("mqtt.connections", 1)
        .set("bucket.sensor_id_pattern", "(?s).{1,128}")
        .sparkplug(Some("1h"));
    let palletd = Palletd::start(&config);
    palletd.ready().await;
    let forged = "2026-12-03T00:00:00.000000Z ERROR palletd: the spool is lost";
    let topic = format!("spBv1.0/G3/NDATA/evil\n{forged}");
    let mut p = Publisher::connect_to(aedes.port, "pub-forge").await;
    let ts = now_ms();
    p.publish(
        &topic,
        payload(ts, Some(0), vec![by_alias(1, ts, Value::DoubleValue(1.0))]),
    )
    .await;
    p.flush().await;
    palletd
        .wait_metric("palletd_sparkplug_rebirth_requests_total", 1.0)
        .await;
    let log = palletd.log();
    assert!(
        log.contains("rebirth") && log.contains("evil\\n2026-12-03T00:00:00"),
        "the topic, escaped: {log}"
    );
    assert!(
        !log.lines().any(|l| l.starts_with(forged)),
        "a forged line: {log}"
    );
}

/// An NBIRTH of `bdSeq` 0 and no other metric, at `ts`.
fn nbirth(ts: i64) -> Vec<u8> {
    let bd_seq = metric(Some("bdSeq"), 0, DataType::Int64, Value::LongValue(0));
    payload(ts, Some(0), vec![bd_seq])
}

/// A flood of BIRTHs under ever new edge nodes and devices (60 nodes x 40
/// devices, twice what fits) keeps the Sparkplug B state within its share
/// of `limits.max_memory` (an eighth: 512 KiB of 4 MiB) by forgetting the
/// nodes silent the longest; a real node born after the flood is taken and
/// its DATA stored by name, also after a restart. (Before, the state had
/// no total in bytes, and a new node beyond max_sparkplug_nodes was
/// refused for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_births_stays_within_the_budget_and_a_new_node_is_taken() {
    let mut stack = Stack::start("sparkplug-flood", |c| {
        c.sparkplug(None)
            .set("limits.max_memory", "4MiB")
            .set("limits.max_sparkplug_nodes", 50)
    })
    .await;
    let budget = 512.0 * 1024.0;
    let now = now_ms();
    let mut p = stack.publisher().await;
    for n in 0..60 {
        let node = format!("junk{n:03}");
        p.publish(&format!("spBv1.0/flood/NBIRTH/{node}"), nbirth(now))
            .await;
        for d in 0..40 {
            let metrics = ["temperature", "humidity", "pressure"]
                .iter()
                .enumerate()
                .map(|(k, name)| {
                    metric(
                        Some(name),
                        1 + k as u64,
                        DataType::Double,
                        Value::DoubleValue(1.0),
                    )
                })
                .collect();
            p.publish(
                &format!("spBv1.0/flood/DBIRTH/{node}/dev{d:03}"),
                payload(now, Some(1 + d), metrics),
            )
            .await;
        }
    }
    p.flush().await;
    eventually(Duration::from_secs(120), "the flood admitted", || async {
        let m = stack.palletd.scrape();
        common::metric(
            &m,
            "palletd_sparkplug_messages_total",
            Some(("type", "DBIRTH")),
        ) >= 2400.0
    })
    .await;
    let evicted = stack
        .palletd
        .metric("palletd_sparkplug_nodes_evicted_total", None);
    assert!(evicted >= 10.0, "evicted {evicted}");
    let used = stack
        .palletd
        .metric("palletd_memory_bytes", Some(("part", "sparkplug")));
    eprintln!("after the flood: {evicted} nodes evicted, state {used} bytes of {budget}");
    assert!(used > 0.0 && used <= budget, "state {used} bytes");

    // A real node after the flood.
    p.publish("spBv1.0/site/NBIRTH/line1", nbirth(now_ms()))
        .await;
    p.publish(
        "spBv1.0/site/DBIRTH/line1/press",
        payload(
            now_ms(),
            Some(1),
            vec![metric(
                Some("force"),
                7,
                DataType::Double,
                Value::DoubleValue(1.0),
            )],
        ),
    )
    .await;
    let data = |seq: u64, x: f64| {
        let ts = now_ms();
        payload(ts, Some(seq), vec![by_alias(7, ts, Value::DoubleValue(x))])
    };
    p.publish("spBv1.0/site/DDATA/line1/press", data(2, 42.5))
        .await;
    p.flush().await;
    let force = |x: f64| {
        move |all: &BTreeMap<String, Vec<Document>>| {
            with_field(all, "site:line1:press", "force")
                .iter()
                .any(|s| stored_f64(s, "force") == x)
        }
    };
    wait_samples(&stack, "the new node's DATA stored by name", force(42.5)).await;

    // Across a restart the state is read back within the budget.
    stack.palletd.terminate();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    let used = stack
        .palletd
        .metric("palletd_memory_bytes", Some(("part", "sparkplug")));
    assert!(
        used > 0.0 && used <= budget,
        "state {used} bytes after the restart"
    );
    p.publish("spBv1.0/site/DDATA/line1/press", data(3, 43.5))
        .await;
    p.flush().await;
    wait_samples(
        &stack,
        "its DATA stored by name after the restart",
        force(43.5),
    )
    .await;
    let letters = stack.docs("readings_deadletter").await;
    assert!(
        letters
            .iter()
            .all(|d| !d.get_str("topic").unwrap_or_default().contains("/line1")),
        "nothing of line1 dead-lettered: {letters:?}"
    );
    stack.stop();
}
