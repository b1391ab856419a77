//! The sinks the `run` scenarios compare palletd with: the ceiling subscriber and the naive and batched bridges.

use crate::*;

/// A baseline gateway: subscribes with manual acks and makes each reading
/// durable its own way before acknowledging it.
pub(crate) async fn sink(args: SinkArgs) -> anyhow::Result<()> {
    let handle = palletd::telemetry::install();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = palletd::internals::serve(
        ([127, 0, 0, 1], args.metrics_port).into(),
        &Default::default(),
        palletd::internals::Pages {
            metrics: handle,
            health: Arc::new(palletd::telemetry::Health::default()),
            history: Arc::default(),
            flush_bound: Duration::from_secs(10),
            api: None,
        },
        stop.clone(),
    )
    .await?;
    tokio::spawn(server);
    let mut opts = MqttOptions::new(
        format!("bench-{}", args.kind),
        "127.0.0.1",
        args.broker_port,
    );
    opts.set_manual_acks(true);
    opts.set_keep_alive(Duration::from_secs(30));
    opts.set_max_packet_size(1 << 20, 1 << 20);
    opts.set_inflight(args.inflight);
    let (client, mut eventloop) = AsyncClient::new(opts, 65_536);
    client.subscribe(FILTER, QoS::AtLeastOnce).await?;
    let db = mongodb::Client::with_uri_str(&args.mongodb)
        .await?
        .database("bench");
    let collection = db.collection::<bson::Document>("readings");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<rumqttc::Publish>();
    let worker = match args.kind.as_str() {
        "ceiling" => tokio::spawn(ceiling(client.clone(), rx)),
        "naive" => tokio::spawn(naive(client.clone(), rx, collection, 1)),
        "naive16" => tokio::spawn(naive(client.clone(), rx, collection, 16)),
        "batched" | "batched-plain" => {
            if args.kind == "batched" {
                db.run_command(doc! {
                    "create": "readings",
                    "timeseries": { "timeField": "ts", "metaField": "sensorId", "granularity": "seconds" },
                })
                .await?;
            } else {
                collection
                    .create_index(
                        mongodb::IndexModel::builder()
                            .keys(doc! { "sensorId": 1, "ts": 1 })
                            .build(),
                    )
                    .await?;
            }
            tokio::spawn(batched(client.clone(), rx, collection, args.batch))
        }
        other => anyhow::bail!("unknown sink {other}"),
    };
    println!("sink ready");
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if tx.send(p).is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("sink: broker: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    worker.abort();
    Ok(())
}

pub(crate) type Publishes = tokio::sync::mpsc::UnboundedReceiver<rumqttc::Publish>;

/// Decodes and acknowledges: the most any gateway can do on this box.
pub(crate) async fn ceiling(client: AsyncClient, mut rx: Publishes) {
    while let Some(p) = rx.recv().await {
        if let Some((_, ts_ms, _)) = decode(&p) {
            durable(ts_ms, 1);
        }
        let _ = client.try_ack(&p);
    }
}

/// One `insert_one` per message, `in_flight` at a time, each acknowledged
/// after its insert.
pub(crate) async fn naive(
    client: AsyncClient,
    mut rx: Publishes,
    collection: mongodb::Collection<bson::Document>,
    in_flight: usize,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    while let Some(p) = rx.recv().await {
        let Some((sensor, ts_ms, mut doc)) = decode(&p) else {
            let _ = client.ack(&p).await;
            continue;
        };
        doc.insert("sensorId", sensor);
        let permit = permits.clone().acquire_owned().await.expect("open");
        let (collection, client) = (collection.clone(), client.clone());
        let insert = async move {
            // Retried until it succeeds, as a bridge must.
            while collection.insert_one(&doc).await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            durable(ts_ms, 1);
            let _ = client.ack(&p).await;
            drop(permit);
        };
        if in_flight == 1 {
            insert.await;
        } else {
            tokio::spawn(insert);
        }
    }
}

/// Telegraf's shape: a batch of up to `batch` messages or whatever came
/// within a second of the first, written with one unordered `insert_many`,
/// one write at a time, then every message of it acknowledged.
pub(crate) async fn batched(
    client: AsyncClient,
    mut rx: Publishes,
    collection: mongodb::Collection<bson::Document>,
    batch: usize,
) {
    let opts = mongodb::options::InsertManyOptions::builder()
        .ordered(false)
        .build();
    loop {
        let Some(first) = rx.recv().await else { return };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let mut msgs = vec![first];
        while msgs.len() < batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(p)) => msgs.push(p),
                Ok(None) => return,
                Err(_) => break,
            }
        }
        let mut docs = Vec::with_capacity(msgs.len());
        let mut stamps = Vec::with_capacity(msgs.len());
        for p in &msgs {
            if let Some((sensor, ts_ms, mut doc)) = decode(p) {
                doc.insert("sensorId", sensor);
                docs.push(doc);
                stamps.push(ts_ms);
            }
        }
        // Retried until it succeeds, as Telegraf does.
        while !docs.is_empty()
            && collection
                .insert_many(&docs)
                .with_options(opts.clone())
                .await
                .is_err()
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for ts in stamps {
            durable(ts, 1);
        }
        for p in &msgs {
            let _ = client.ack(p).await;
        }
    }
}

/// The sensor (from the topic), timestamp and document of a reading.
pub(crate) fn decode(p: &rumqttc::Publish) -> Option<(String, i64, bson::Document)> {
    let sensor = p.topic.split('/').nth(1)?.to_string();
    let value: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&p.payload).ok()?;
    let ts_ms = value.get("ts")?.as_i64()?;
    let mut doc = bson::Document::new();
    doc.insert("ts", bson::DateTime::from_millis(ts_ms));
    for (k, v) in value {
        if k != "ts" {
            doc.insert(k, v.as_f64()?);
        }
    }
    Some((sensor, ts_ms, doc))
}

pub(crate) fn durable(ts_ms: i64, n: u64) {
    metrics::counter!(palletd::telemetry::SAMPLES_STORED).increment(n);
    let age = (palletd::clock::now_ms() - ts_ms).max(0) as f64 / 1000.0;
    metrics::histogram!(palletd::telemetry::SAMPLE_AGE_SECONDS).record(age);
}
