//! The per-reading hot path without services: payload decoding, and
//! building a flush's bucket statements (pending samples, planner, BSON
//! encoding).
//! `cargo bench --bench hot_path` (criterion; it keeps a baseline in
//! target/criterion and reports changes against it).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use palletd::bucket::{self, Sample, Shape};
use palletd::decode::Decoder;
use palletd::internals::Pending;

const NOW: i64 = 1_796_000_000_000;

fn decoder() -> Decoder {
    // The example config, and a Sparkplug B subscription.
    let text = format!(
        "{}\n[[subscription]]\ntopic = \"spBv1.0/#\"\nformat = \"sparkplug_b\"\n",
        palletd::config::EXAMPLE
    );
    let settings = palletd::config::parse(&text, None).expect("example config");
    Decoder::new(settings.subscriptions.clone(), settings.decode_limits())
}

/// A Sparkplug B payload: three metrics (Float, Double, Double) by name and
/// alias (a BIRTH) or by alias only (DATA), stamped `ts`.
fn sparkplug(seq: u64, ts: i64, birth: bool) -> Vec<u8> {
    use palletd::decode::sparkplug::{proto, DataType};
    use prost::Message as _;
    let names = [
        ("temperature", DataType::Float),
        ("humidity", DataType::Double),
        ("pressure", DataType::Double),
    ];
    let metrics = names
        .iter()
        .enumerate()
        .map(|(k, (name, t))| proto::Metric {
            name: birth.then(|| name.to_string()),
            alias: Some(16 + k as u64),
            datatype: birth.then_some(*t as u32),
            timestamp: Some(ts as u64),
            value: Some(match t {
                DataType::Float => proto::metric::Value::FloatValue(21.5),
                _ => proto::metric::Value::DoubleValue(1000.25 + k as f64),
            }),
            ..Default::default()
        })
        .collect();
    proto::Payload {
        timestamp: Some(ts as u64),
        seq: Some(seq),
        metrics,
        ..Default::default()
    }
    .encode_to_vec()
}

fn payload(i: usize) -> String {
    format!(
        r#"{{"ts":{},"temp":{:.2},"humidity":{:.2},"pressure":{:.2}}}"#,
        NOW - 1000 + i as i64,
        20.0 + (i % 100) as f64 / 10.0,
        40.0 + (i % 50) as f64 / 5.0,
        1000.0 + (i % 30) as f64
    )
}

fn decode(c: &mut Criterion) {
    let mut d = decoder();
    let one = payload(7);
    let array = format!("[{}]", (0..10).map(payload).collect::<Vec<_>>().join(","));
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(1));
    g.bench_function("json object, 3 fields (~80 bytes)", |b| {
        b.iter(|| {
            d.decode(
                black_box("sensors/s00042/telemetry"),
                black_box(one.as_bytes()),
                NOW,
            )
        })
    });
    d.decode(
        "spBv1.0/plant/DBIRTH/n0001/d042",
        &sparkplug(0, NOW, true),
        NOW,
    );
    let ddata = sparkplug(1, NOW - 1000, false);
    g.bench_function("sparkplug DDATA, 3 metrics by alias (~60 bytes)", |b| {
        b.iter(|| {
            d.decode(
                black_box("spBv1.0/plant/DDATA/n0001/d042"),
                black_box(&ddata),
                NOW,
            )
        })
    });
    g.throughput(Throughput::Elements(10));
    g.bench_function("json array of 10 readings", |b| {
        b.iter(|| {
            d.decode(
                black_box("sensors/s00042/telemetry"),
                black_box(array.as_bytes()),
                NOW,
            )
        })
    });
    g.finish();
}

/// Decoding in bytes per second: flat JSON (the same payloads as
/// `decode`), and nested JSON through the flattening path as Tasmota and
/// Shelly send it (their presets' subscriptions).
fn decode_bytes(c: &mut Criterion) {
    let text = format!(
        "{}\n{}{}",
        palletd::config::EXAMPLE,
        palletd::config::presets::preset("tasmota").unwrap(),
        palletd::config::presets::preset("shelly").unwrap()
    );
    let settings = palletd::config::parse(&text, None).expect("example config with presets");
    let mut d = Decoder::new(settings.subscriptions.clone(), settings.decode_limits());
    // Tasmota's local time in its preset's zone (CET in winter).
    let local = chrono::DateTime::from_timestamp_millis(NOW - 1000 + 3_600_000)
        .unwrap()
        .format("%Y-%m-%dT%H:%M:%S");
    let tasmota = format!(
        r#"{{"Time":"{local}","ENERGY":{{"TotalStartTime":"2020-12-27T10:51:14","Total":12.003,"Yesterday":0.412,"Today":0.003,"Period":0,"Power":12,"ApparentPower":14,"ReactivePower":6,"Factor":0.85,"Voltage":229,"Current":0.061}},"AM2301":{{"Temperature":24.6,"Humidity":58.2}},"TempUnit":"C"}}"#
    );
    let shelly = format!(
        r#"{{"src":"shellyplusht-b8d61a8b17cc","dst":"shellyplusht-b8d61a8b17cc/events","method":"NotifyFullStatus","params":{{"ts":{},"ble":{{}},"cloud":{{"connected":false}},"devicepower:0":{{"id":0,"battery":{{"V":0.43,"percent":0}},"external":{{"present":true}}}},"ht_ui":{{}},"humidity:0":{{"id":0,"rh":42.2}},"mqtt":{{"connected":true}},"sys":{{"mac":"B8D61A8B17CC","restart_required":false,"time":null,"unixtime":null,"uptime":3,"ram_size":235300,"ram_free":164244,"fs_size":458752,"fs_free":118784,"cfg_rev":10,"kvs_rev":0,"webhook_rev":0,"available_updates":{{}},"wakeup_reason":{{"boot":"deepsleep_wake","cause":"status_update"}},"wakeup_period":600}},"temperature:0":{{"id":0,"tC":19.8,"tF":67.6}},"wifi":{{"sta_ip":"192.168.3.183","status":"got ip","ssid":"winos","rssi":-57}}}}}}"#,
        (NOW - 1000) as f64 / 1e3
    );
    let one = payload(7);
    let array = format!("[{}]", (0..10).map(payload).collect::<Vec<_>>().join(","));
    let cases: [(&str, &str, &str); 4] = [
        ("flat json object", "sensors/s00042/telemetry", &one),
        ("flat json array of 10", "sensors/s00042/telemetry", &array),
        ("tasmota SENSOR, nested", "tele/plug1/SENSOR", &tasmota),
        (
            "shelly NotifyFullStatus, nested",
            "shellyplusht-b8d61a8b17cc/events/rpc",
            &shelly,
        ),
    ];
    let mut g = c.benchmark_group("decode bytes");
    for (name, topic, payload) in cases {
        let out = d.decode(topic, payload.as_bytes(), NOW);
        assert!(
            out.errors.is_empty() && !out.readings.is_empty(),
            "{name}: {out:?}"
        );
        g.throughput(Throughput::Bytes(payload.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| d.decode(black_box(topic), black_box(payload.as_bytes()), NOW))
        });
    }
    g.finish();
}

/// The worst shapes found for each decoder, per byte, beside an ordinary
/// payload of about the same size (criterion prints each one's bytes/s:
/// work linear in the bytes shows as rates of the same order).
fn hostile(c: &mut Criterion) {
    use palletd::decode::sparkplug::{proto, DataType};
    use prost::Message as _;
    let mut d = decoder();
    let readings = format!("[{}]", (0..1000).map(payload).collect::<Vec<_>>().join(","));
    let future = NOW + 10 * 365 * 86_400_000;
    let clock = format!(
        "[{}]",
        (0..1000)
            .map(|i| format!(r#"{{"ts":{},"temp":21.5,"humidity":40.25}}"#, future + i))
            .collect::<Vec<_>>()
            .join(",")
    );
    let wide = format!(
        "{{{}}}",
        (0..15_000)
            .map(|i| format!(r#""k{i:05}":{i}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    let long_array = format!(
        r#"{{"v":[{}]}}"#,
        (0..40_000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let metric = |i: usize, name: bool| proto::Metric {
        name: name.then(|| format!("metric-{i:05}")),
        alias: Some(i as u64),
        datatype: Some(DataType::Double as u32),
        value: Some(proto::metric::Value::DoubleValue(1.0)),
        ..Default::default()
    };
    let birth = proto::Payload {
        seq: Some(1),
        metrics: (0..2000).map(|i| metric(i, true)).collect(),
        ..Default::default()
    }
    .encode_to_vec();
    let many = proto::Payload {
        seq: Some(2),
        metrics: (0..40_000)
            .map(|i| proto::Metric {
                alias: Some(i as u64),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
    .encode_to_vec();
    let json = "sensors/s00042/telemetry";
    let cases: [(&str, &str, &[u8]); 7] = [
        (
            "json: 1,000 ordinary readings (baseline)",
            json,
            readings.as_bytes(),
        ),
        (
            "json: 1,000 samples ten years ahead",
            json,
            clock.as_bytes(),
        ),
        ("json: one object of 15,000 keys", json, wide.as_bytes()),
        (
            "json: an array of 40,000 numbers",
            json,
            long_array.as_bytes(),
        ),
        ("json: 100,000 nested arrays", json, deep.as_bytes()),
        (
            "sparkplug: NBIRTH of 2,000 metrics",
            "spBv1.0/evil/NBIRTH/n0",
            &birth,
        ),
        (
            "sparkplug: NDATA of 40,000 metrics by unknown aliases",
            "spBv1.0/evil/NDATA/n0",
            &many,
        ),
    ];
    let mut g = c.benchmark_group("hostile");
    for (name, topic, bytes) in cases {
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| d.decode(black_box(topic), black_box(bytes), NOW))
        });
    }
    g.finish();
}

/// One flush of 1,000 sensors with 20 readings each: push into memory,
/// take them, plan statements, encode each statement to BSON.
fn statements(c: &mut Criterion) {
    let mut d = decoder();
    let shape = Shape {
        window_ms: 3_600_000,
        max_samples: 200,
        max_bytes: 256 * 1024,
    };
    let mut samples = Vec::new();
    for i in 0..20_000usize {
        let topic = format!("sensors/s{:05}/telemetry", i % 1000);
        let decoded = d.decode(&topic, payload(i).as_bytes(), NOW);
        for r in &decoded.readings {
            samples.push((r.sensor.clone(), Sample::encode(r, i as u64)));
        }
    }
    let mut g = c.benchmark_group("flush");
    g.throughput(Throughput::Elements(samples.len() as u64));
    g.bench_function("1000 sensors x 20 readings: hold, plan, encode", |b| {
        b.iter_batched(
            || samples.clone(),
            |samples| {
                let mut pending = Pending::new(shape, 0, 10_000);
                for (sensor, s) in &samples {
                    pending.push(sensor, s.as_ref(), 0);
                }
                let all = pending.all();
                let mut runs = pending.take(&all);
                let mut bytes = 0;
                for run in runs.iter_mut() {
                    for st in bucket::plan(
                        &run.samples,
                        &mut run.fills,
                        &shape,
                        &palletd::internals::Tags::new(1),
                    ) {
                        bytes += st
                            .to_bson(&run.sensor, &run.samples, &shape, false)
                            .as_bytes()
                            .len();
                    }
                }
                black_box(bytes)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, decode, decode_bytes, hostile, statements);
criterion_main!(benches);
