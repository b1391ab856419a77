//! The `sparkplug-flood` and `sparkplug-state` scenarios: BIRTH floods and the Sparkplug B state's size.

use crate::*;

/// See [`Cli::SparkplugFlood`]. Every DBIRTH is also a reading of a new
/// sensor (its `_state`), which costs palletd what any new sensor costs;
/// the yardstick, in the same run on fresh services, is the same number of
/// one-reading JSON messages under the same sensor ids, so the difference
/// in peak RSS is what the Sparkplug B state costs.
pub(crate) fn sparkplug_flood(args: SparkplugFloodArgs) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    // The `[limits]` keys of this scenario, through the sinks' hook for them.
    std::env::set_var(
        "BENCH_PALLETD_LIMITS",
        format!(
            "max_memory = \"{}\"\nmax_sparkplug_nodes = 1000000\n",
            args.max_memory
        ),
    );
    let budget = flood_settings(&args.max_memory)?.limits.split().sparkplug;
    let births = (args.nodes * (args.devices + 1)) as u64;
    let mut rows = Vec::new();
    for kind in ["sparkplug", "json"] {
        let svc = Services::start(&args.run)?;
        let sink = start_sink(
            &args.run,
            if kind == "json" { "buckets" } else { kind },
            &svc,
        )?;
        let (pid, port) = (sink.pids()[0], sink.procs[0].1);
        let rt = tokio::runtime::Runtime::new()?;
        let client = rt.block_on(async {
            let mut opts = MqttOptions::new("bench-flood", "127.0.0.1", svc.broker_port);
            opts.set_inflight(100);
            opts.set_keep_alive(Duration::from_secs(30));
            let (client, mut eventloop) = AsyncClient::new(opts, 1000);
            tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
            client
        });
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // The buffers' bytes (limits.max_memory's parts but the state's).
        let buffers = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let (peak, buffers, stop) = (peak.clone(), buffers.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_of(pid), Ordering::Relaxed);
                    let held: f64 = http_get(port, "/metrics")
                        .unwrap_or_default()
                        .lines()
                        .filter(|l| l.starts_with(palletd::telemetry::MEMORY_BYTES))
                        .filter(|l| !l.contains("sparkplug"))
                        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                        .sum();
                    buffers.fetch_max(held as u64, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        let taken = || match kind {
            "json" => counter_sum(port, palletd::telemetry::MESSAGES_RECEIVED),
            _ => counter_sum(port, palletd::telemetry::SPARKPLUG_MESSAGES),
        };
        let wait_for = |n: f64| -> anyhow::Result<f64> {
            let started = Instant::now();
            while taken() < n {
                anyhow::ensure!(
                    started.elapsed() < Duration::from_secs(3600),
                    "the flood was not taken in an hour"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(started.elapsed().as_secs_f64())
        };
        let flood = |prefix: String, nodes: usize| {
            let client = client.clone();
            let devices = args.devices;
            rt.block_on(async move {
                for n in 0..nodes {
                    let node = format!("{prefix}{n:05}");
                    for (topic, payload) in flood_node(kind, &node, devices) {
                        client
                            .publish(topic, QoS::AtLeastOnce, false, payload)
                            .await?;
                    }
                }
                anyhow::Ok(())
            })
        };
        // One node of the shape, then the RSS at rest.
        flood("first".into(), 1)?;
        wait_for((args.devices + 1) as f64)?;
        std::thread::sleep(Duration::from_secs(5));
        let rest = rss_of(pid);
        peak.store(0, Ordering::Relaxed);
        buffers.store(0, Ordering::Relaxed);
        let cpu_before = cpu_of(pid);
        eprintln!("== {kind}: {} nodes x {} devices", args.nodes, args.devices);
        let started = Instant::now();
        flood("n".into(), args.nodes)?;
        wait_for((births + args.devices as u64 + 1) as f64)?;
        let secs = started.elapsed().as_secs_f64();
        // What was received is being written: the peak may come after.
        std::thread::sleep(Duration::from_secs(5));
        let cpu = cpu_of(pid) - cpu_before;
        let mut row = json!({
            "kind": kind,
            "rss_at_rest_mb": rest as f64 / 1e6,
            "peak_rss_mb": peak.load(Ordering::Relaxed) as f64 / 1e6,
            "peak_buffers_mb": buffers.load(Ordering::Relaxed) as f64 / 1e6,
            "messages_per_s": births as f64 / secs,
            "cpu_us_per_message": cpu.as_secs_f64() * 1e6 / births as f64,
        });
        if kind == "sparkplug" {
            let state = http_get(port, "/metrics")
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("palletd_memory_bytes{part=\"sparkplug\"}"))
                .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                .unwrap_or(0.0);
            // A node born after the flood: its DATA decodes by alias (its
            // new sensor may still be refused by limits.max_sensors, which
            // the flood's sensors filled: that is not the state's doing).
            let unknown = || {
                http_get(port, "/metrics")
                    .unwrap_or_default()
                    .lines()
                    .find(|l| l.starts_with("palletd_dead_letters_total{cause=\"unknown_alias\"}"))
                    .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            let before = (unknown(), taken());
            for (topic, payload) in flood_node(kind, "line1", 1) {
                rt.block_on(client.publish(
                    topic.replace("/flood/", "/site/"),
                    QoS::AtLeastOnce,
                    false,
                    payload,
                ))?;
            }
            let data = flood_data(7.5);
            rt.block_on(client.publish(
                "spBv1.0/site/DDATA/line1/d0000",
                QoS::AtLeastOnce,
                false,
                data,
            ))?;
            wait_for(before.1 + 3.0)?;
            row["state_budget_mb"] = json!(budget as f64 / 1e6);
            row["state_estimated_mb"] = json!(state / 1e6);
            row["nodes_evicted"] = json!(counter_sum(port, palletd::telemetry::SPARKPLUG_EVICTED));
            row["snapshots_written"] =
                json!(counter_sum(port, palletd::telemetry::SPARKPLUG_STATE_SAVES));
            row["new_node_decoded"] = json!(unknown() == before.0);
        }
        stop.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        eprintln!("  {row}");
        rows.push(row);
    }
    let growth = |r: &serde_json::Value| {
        r["peak_rss_mb"].as_f64().unwrap_or(0.0) - r["rss_at_rest_mb"].as_f64().unwrap_or(0.0)
    };
    let state_mb = growth(&rows[0]) - growth(&rows[1]);
    // The state alone, without the million new sensors' noise around it.
    let alone = std::process::Command::new(std::env::current_exe()?)
        .args([
            "sparkplug-state",
            "--nodes",
            &args.nodes.to_string(),
            "--devices",
            &args.devices.to_string(),
            "--max-memory",
            &args.max_memory,
        ])
        .output()?;
    anyhow::ensure!(
        alone.status.success(),
        "sparkplug-state: {}",
        String::from_utf8_lossy(&alone.stderr)
    );
    let alone: serde_json::Value = serde_json::from_slice(&alone.stdout)?;
    eprintln!("  the state alone: {alone}");
    let result = json!({
        "nodes": args.nodes,
        "devices_per_node": args.devices,
        "max_memory": args.max_memory,
        "runs": rows,
        "state_alone": alone,
        "state_rss_mb": state_mb,
        "state_rss_over_budget": state_mb * 1e6 / budget as f64,
    });
    println!("{}", serde_json::to_string_pretty(&result)?);
    let path = args.run.out.join(format!(
        "sparkplug-flood-{}.json",
        chrono::Utc::now().format("%Y-%m-%dT%H%M%SZ")
    ));
    std::fs::create_dir_all(&args.run.out)?;
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&json!({"machine": machine(), "result": result}))?,
    )?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// The settings of palletd in the flood: a Sparkplug B subscription and
/// `[limits]` as the sinks get them (`max_memory`, nodes unbounded).
pub(crate) fn flood_settings(max_memory: &str) -> anyhow::Result<palletd::config::Settings> {
    palletd::config::parse(
        &format!(
            "[mqtt]\nurl = \"mqtt://x\"\nclient_id = \"x\"\n[mongodb]\nuri = \"mongodb://x\"\ndatabase = \"x\"\n\
             [[subscription]]\ntopic = \"spBv1.0/#\"\nformat = \"sparkplug_b\"\n[limits]\nmax_memory = \"{max_memory}\"\nmax_sparkplug_nodes = 1000000\n"
        ),
        None,
    )
    .map_err(|e| anyhow::anyhow!("{e:?}"))
}

/// See [`Cli::SparkplugState`].
pub(crate) fn sparkplug_state(args: SparkplugFloodArgs) -> anyhow::Result<()> {
    let settings = flood_settings(&args.max_memory)?;
    let limits = settings.decode_limits();
    let budget = limits.max_sparkplug_bytes;
    let mut decoder = palletd::decode::Decoder::new(settings.subscriptions.clone(), limits);
    let before = rss_of(std::process::id());
    let (mut peak, mut messages, mut snapshot_bytes) = (before, 0u64, 0usize);
    let mut chunk = Vec::new();
    let now = palletd::clock::now_ms();
    for n in 0..args.nodes {
        for (topic, payload) in flood_node("sparkplug", &format!("n{n}"), args.devices) {
            let _ = decoder.decode_with(&topic, &payload, None, now);
            messages += 1;
            if messages % 1000 == 0 {
                // A snapshot as palletd makes it: a chunk at a time.
                let state = decoder.sparkplug_state();
                let mut after = None;
                loop {
                    chunk.clear();
                    after = state.snapshot_lines(
                        after.as_ref(),
                        &mut chunk,
                        palletd::internals::SPARKPLUG_SNAPSHOT_CHUNK_BYTES,
                    );
                    snapshot_bytes = snapshot_bytes.max(chunk.capacity());
                    if after.is_none() {
                        break;
                    }
                }
                peak = peak.max(rss_of(std::process::id()));
            }
        }
    }
    let end = rss_of(std::process::id());
    peak = peak.max(end);
    let estimate = decoder.sparkplug_state().bytes();
    let result = json!({
        "messages": messages,
        "rss_growth_mb": (end - before) as f64 / 1e6,
        "peak_rss_growth_mb": (peak - before) as f64 / 1e6,
        "state_estimated_mb": estimate as f64 / 1e6,
        "state_budget_mb": budget as f64 / 1e6,
        "peak_over_budget": (peak - before) as f64 / budget as f64,
        "snapshot_chunk_mb": snapshot_bytes as f64 / 1e6,
    });
    println!("{result}");
    Ok(())
}

/// One node's messages of the flood: for `sparkplug` an NBIRTH and a
/// DBIRTH of three metrics per device; for `json` one message per device
/// sensor with the same three fields, and one for the node.
pub(crate) fn flood_node(kind: &str, node: &str, devices: usize) -> Vec<(String, Vec<u8>)> {
    use palletd::decode::sparkplug::{proto, DataType};
    use prost::Message as _;
    let now = chrono::Utc::now().timestamp_millis();
    if kind == "json" {
        let one = |sensor: String| {
            let body = json!({"ts": now, "temperature": 1.0, "humidity": 1.0, "pressure": 1.0});
            (
                format!("bench/{sensor}/data"),
                body.to_string().into_bytes(),
            )
        };
        return std::iter::once(one(format!("flood:{node}")))
            .chain((0..devices).map(|d| one(format!("flood:{node}:d{d:04}"))))
            .collect();
    }
    let metric = |name: &str, alias: u64, t: DataType, v: proto::metric::Value| proto::Metric {
        name: Some(name.into()),
        alias: Some(alias),
        datatype: Some(t as u32),
        value: Some(v),
        ..Default::default()
    };
    let payload = |seq: u64, metrics: Vec<proto::Metric>| {
        proto::Payload {
            timestamp: Some(now as u64),
            seq: Some(seq % 256),
            metrics,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let bd_seq = metric(
        "bdSeq",
        0,
        DataType::Int64,
        proto::metric::Value::LongValue(0),
    );
    let mut out = vec![(
        format!("spBv1.0/flood/NBIRTH/{node}"),
        payload(0, vec![bd_seq]),
    )];
    for d in 0..devices {
        let metrics = ["temperature", "humidity", "pressure"]
            .iter()
            .enumerate()
            .map(|(k, n)| {
                metric(
                    n,
                    1 + k as u64,
                    DataType::Double,
                    proto::metric::Value::DoubleValue(1.0),
                )
            })
            .collect();
        out.push((
            format!("spBv1.0/flood/DBIRTH/{node}/d{d:04}"),
            payload(1 + d as u64, metrics),
        ));
    }
    out
}

/// A DDATA of the flood's first metric (alias 1) by alias.
pub(crate) fn flood_data(x: f64) -> Vec<u8> {
    use palletd::decode::sparkplug::proto;
    use prost::Message as _;
    let ts = chrono::Utc::now().timestamp_millis() as u64;
    proto::Payload {
        timestamp: Some(ts),
        seq: Some(2),
        metrics: vec![proto::Metric {
            alias: Some(1),
            timestamp: Some(ts),
            value: Some(proto::metric::Value::DoubleValue(x)),
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec()
}

/// The resident set size of a process now, in bytes.
pub(crate) fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A counter's value summed over its labels.
pub(crate) fn counter_sum(port: u16, name: &str) -> f64 {
    http_get(port, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}
