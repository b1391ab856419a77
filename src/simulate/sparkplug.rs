//! `palletd simulate --format sparkplug_b`: Sparkplug B edge nodes.
//!
//! The sensors are devices, `devices_per_node` to an edge node; each edge
//! node has its own MQTT connection under group `group`, with an NDEATH
//! (carrying its `bdSeq`) as the last will. On every connect it publishes
//! NBIRTH and a DBIRTH per device, which name each metric and tie it to an
//! alias; then DDATA messages carry only aliases, timestamps and values
//! (temperature as Float, humidity and pressure as Double), with the node's
//! sequence number. It answers an NCMD `Node Control/Rebirth` with new
//! BIRTHs; after a lost connection it reconnects with the next `bdSeq` and is
//! born again; at the end it publishes its NDEATH and disconnects. Killed,
//! the broker publishes its NDEATH for it (the will).
//!
//! Edge node ids are `<sensor_prefix>n<number>`, device ids `d<number>`, so
//! palletd stores sensors `<group>:<sensor_prefix>n0000:d000`. While a node
//! is not connected and born, the readings it would have sent are skipped
//! (a node does not publish DATA before its BIRTH), and counted.

use std::time::{Duration, Instant};

use prost::Message as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rumqttc::{AsyncClient, Event, LastWill, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{SimError, SimOptions, SimReport};
use crate::clock::now_ms;
use crate::decode::sparkplug::{proto, DataType, NAMESPACE, REBIRTH_METRIC};
use proto::metric::Value;

/// Metrics of each device, with their alias offset and type.
const DEVICE_METRICS: &[(&str, DataType)] = &[
    ("temperature", DataType::Float),
    ("humidity", DataType::Double),
    ("pressure", DataType::Double),
];

/// Aliases are unique within an edge node: device `d` has `16 (d + 1) + k`.
fn alias(device: usize, k: usize) -> u64 {
    (16 * (device + 1) + k) as u64
}

/// Runs every edge node until `duration` passes or `stop` fires.
pub async fn run(opts: SimOptions, stop: CancellationToken) -> Result<SimReport, SimError> {
    let per_node = opts.devices_per_node.max(1);
    let nodes = opts.sensors.div_ceil(per_node);
    let mut tasks = Vec::with_capacity(nodes);
    for n in 0..nodes {
        let devices = per_node.min(opts.sensors - n * per_node);
        let opts = opts.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            EdgeNode::new(&opts, n, devices).run(&opts, stop).await
        }));
    }
    let mut report = SimReport::default();
    for t in tasks {
        let r = t.await.map_err(|e| SimError::Node(e.to_string()))??;
        report.readings += r.readings;
        report.messages += r.messages;
        report.skipped += r.skipped;
        report.unacknowledged += r.unacknowledged;
        report.elapsed = report.elapsed.max(r.elapsed);
        report.max_lag = report.max_lag.max(r.max_lag);
    }
    Ok(report)
}

/// What the poller tells the node.
enum NodeEvent {
    /// Connected with this `bdSeq` in the will: be born.
    Connected(u64),
    /// Lost the connection: stop sending DATA.
    Lost,
    Rebirth,
    Acked,
}

struct EdgeNode {
    group: String,
    id: String,
    devices: Vec<Walk>,
    rng: StdRng,
    seq: u8,
}

#[derive(Debug, Clone)]
struct Walk {
    values: [f64; 3],
}

/// A simulated edge node's event loop: tells `tx` when it is connected
/// (and with which bdSeq), acknowledged, lost or asked for a rebirth on
/// `ncmd`; a new session after a loss takes the next bdSeq, in its will
/// on `death_topic` too.
async fn poll_node(
    mut eventloop: rumqttc::EventLoop,
    tx: mpsc::UnboundedSender<NodeEvent>,
    ncmd: String,
    death_topic: String,
    mut bd_seq: u64,
) {
    let mut down = false;
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                if down {
                    info!(bd_seq, "Simulated edge node reconnected; born again.");
                }
                down = false;
                let _ = tx.send(NodeEvent::Connected(bd_seq));
            }
            Ok(Event::Incoming(Packet::PubAck(_))) => {
                let _ = tx.send(NodeEvent::Acked);
            }
            Ok(Event::Incoming(Packet::Publish(p))) if p.topic == ncmd => {
                let asked = proto::Payload::decode(p.payload.as_ref())
                    .map(|p| {
                        p.metrics.iter().any(|m| {
                            m.name.as_deref() == Some(REBIRTH_METRIC)
                                && m.value == Some(Value::BooleanValue(true))
                        })
                    })
                    .unwrap_or(false);
                if asked {
                    let _ = tx.send(NodeEvent::Rebirth);
                }
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
            Ok(_) => {}
            Err(e) => {
                if !down {
                    warn!(error = %e, "Simulated edge node lost the broker; retrying.");
                    down = true;
                    // A new MQTT session: the next bdSeq, in the will too.
                    bd_seq += 1;
                    eventloop
                        .mqtt_options
                        .set_last_will(death_will(&death_topic, bd_seq));
                    let _ = tx.send(NodeEvent::Lost);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

impl EdgeNode {
    fn new(opts: &SimOptions, n: usize, devices: usize) -> EdgeNode {
        let mut rng = StdRng::seed_from_u64(opts.seed.wrapping_add(n as u64));
        let mut start =
            |range: std::ops::Range<f64>| (rng.gen_range(range) * 100.0).round() / 100.0;
        let devices = (0..devices)
            .map(|_| Walk {
                values: [start(15.0..25.0), start(35.0..65.0), start(990.0..1030.0)],
            })
            .collect();
        EdgeNode {
            group: opts.group.clone(),
            id: format!("{}n{:04}", opts.sensor_prefix, n),
            devices,
            rng,
            seq: 0,
        }
    }

    fn topic(&self, kind: &str, device: Option<usize>) -> String {
        match device {
            Some(d) => format!("{NAMESPACE}/{}/{kind}/{}/d{d:03}", self.group, self.id),
            None => format!("{NAMESPACE}/{}/{kind}/{}", self.group, self.id),
        }
    }

    fn next_seq(&mut self) -> u64 {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(1);
        u64::from(s)
    }

    async fn run(
        mut self,
        opts: &SimOptions,
        stop: CancellationToken,
    ) -> Result<SimReport, SimError> {
        let bd_seq: u64 = 0;
        let mut mqtt =
            crate::ingest::mqtt_options(&opts.mqtt, &format!("{}-{}", opts.client_id, self.id))?;
        mqtt.set_inflight(100)
            .set_last_will(death_will(&self.topic("NDEATH", None), bd_seq));
        let (client, eventloop) = AsyncClient::new(mqtt, 10_000);
        let (tx, mut rx) = mpsc::unbounded_channel::<NodeEvent>();
        let ncmd = self.topic("NCMD", None);
        let death_topic = self.topic("NDEATH", None);
        let poller = tokio::spawn(poll_node(eventloop, tx, ncmd, death_topic, bd_seq));

        let rate = self.devices.len() as f64 * opts.rate;
        let mut report = SimReport::default();
        let mut born: Option<u64> = None;
        let mut outstanding: u64 = 0;
        let mut scheduled: u64 = 0;
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let qos = opts.qos;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                ev = rx.recv() => match ev {
                    Some(NodeEvent::Connected(bd)) => {
                        client.subscribe(self.topic("NCMD", None), QoS::AtLeastOnce).await?;
                        outstanding += self.births(&client, qos, bd, &mut report).await?;
                        born = Some(bd);
                    }
                    Some(NodeEvent::Rebirth) => {
                        if let Some(bd) = born {
                            outstanding += self.births(&client, qos, bd, &mut report).await?;
                        }
                    }
                    Some(NodeEvent::Lost) => born = None,
                    Some(NodeEvent::Acked) => outstanding = outstanding.saturating_sub(1),
                    None => break,
                },
                _ = tick.tick() => {}
            }
            let elapsed = started.elapsed().min(opts.duration);
            let due = (elapsed.as_secs_f64() * rate).floor() as u64;
            while scheduled < due {
                let at = Duration::from_secs_f64(scheduled as f64 / rate);
                report.max_lag = report.max_lag.max(started.elapsed().saturating_sub(at));
                let device = (scheduled % self.devices.len() as u64) as usize;
                scheduled += 1;
                if born.is_none() {
                    report.skipped += 1;
                    continue;
                }
                let payload = self.ddata(device);
                client
                    .publish(self.topic("DDATA", Some(device)), qos, false, payload)
                    .await?;
                report.readings += 1;
                report.messages += 1;
                outstanding += u64::from(qos != QoS::AtMostOnce);
            }
            if started.elapsed() >= opts.duration {
                break;
            }
        }
        report.elapsed = started.elapsed();
        // A clean end: say so (the will is only for an unclean one).
        if let Some(bd) = born {
            client
                .publish(
                    self.topic("NDEATH", None),
                    QoS::AtLeastOnce,
                    false,
                    death_payload(bd),
                )
                .await?;
            outstanding += 1;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while outstanding > 0 {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(NodeEvent::Acked)) => outstanding -= 1,
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        report.unacknowledged = outstanding;
        let _ = client.disconnect().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), poller).await;
        Ok(report)
    }

    /// NBIRTH and a DBIRTH per device; returns the messages awaiting acks.
    async fn births(
        &mut self,
        client: &AsyncClient,
        qos: QoS,
        bd_seq: u64,
        report: &mut SimReport,
    ) -> Result<u64, SimError> {
        self.seq = 0;
        let now = now_ms() as u64;
        let node = proto::Payload {
            timestamp: Some(now),
            seq: Some(self.next_seq()),
            metrics: vec![
                named("bdSeq", DataType::Int64, 0, Value::LongValue(bd_seq)),
                named(
                    REBIRTH_METRIC,
                    DataType::Boolean,
                    1,
                    Value::BooleanValue(false),
                ),
                named(
                    "devices",
                    DataType::UInt16,
                    2,
                    Value::IntValue(self.devices.len() as u32),
                ),
            ],
            ..Default::default()
        };
        client
            .publish(self.topic("NBIRTH", None), qos, false, node.encode_to_vec())
            .await?;
        for d in 0..self.devices.len() {
            let metrics = DEVICE_METRICS
                .iter()
                .enumerate()
                .map(|(k, (name, t))| {
                    named(name, *t, alias(d, k), value(*t, self.devices[d].values[k]))
                })
                .collect();
            let birth = proto::Payload {
                timestamp: Some(now),
                seq: Some(self.next_seq()),
                metrics,
                ..Default::default()
            };
            client
                .publish(
                    self.topic("DBIRTH", Some(d)),
                    qos,
                    false,
                    birth.encode_to_vec(),
                )
                .await?;
        }
        let sent = 1 + self.devices.len() as u64;
        report.messages += sent;
        Ok(if qos == QoS::AtMostOnce { 0 } else { sent })
    }

    /// A DDATA of device `d`: its metrics by alias, stamped now.
    fn ddata(&mut self, d: usize) -> Vec<u8> {
        let now = now_ms() as u64;
        let w = &mut self.devices[d];
        let steps = [0.1, 0.3, 0.2];
        let bounds = [(-40.0, 85.0), (0.0, 100.0), (900.0, 1100.0)];
        let mut metrics = Vec::with_capacity(DEVICE_METRICS.len());
        for (k, (_, t)) in DEVICE_METRICS.iter().enumerate() {
            let x = w.values[k] + self.rng.gen_range(-steps[k]..steps[k]);
            w.values[k] = (x.clamp(bounds[k].0, bounds[k].1) * 100.0).round() / 100.0;
            metrics.push(proto::Metric {
                alias: Some(alias(d, k)),
                timestamp: Some(now),
                value: Some(value(*t, w.values[k])),
                ..Default::default()
            });
        }
        proto::Payload {
            timestamp: Some(now),
            seq: Some(self.next_seq()),
            metrics,
            ..Default::default()
        }
        .encode_to_vec()
    }
}

fn named(name: &str, t: DataType, alias: u64, value: Value) -> proto::Metric {
    proto::Metric {
        name: Some(name.into()),
        alias: Some(alias),
        datatype: Some(t as u32),
        value: Some(value),
        ..Default::default()
    }
}

fn value(t: DataType, x: f64) -> Value {
    match t {
        DataType::Float => Value::FloatValue(x as f32),
        _ => Value::DoubleValue(x),
    }
}

/// The NDEATH of an MQTT session with this `bdSeq`.
pub fn death_payload(bd_seq: u64) -> Vec<u8> {
    proto::Payload {
        timestamp: Some(now_ms() as u64),
        metrics: vec![named("bdSeq", DataType::Int64, 0, Value::LongValue(bd_seq))],
        ..Default::default()
    }
    .encode_to_vec()
}

fn death_will(topic: &str, bd_seq: u64) -> LastWill {
    LastWill::new(topic, death_payload(bd_seq), QoS::AtLeastOnce, false)
}
