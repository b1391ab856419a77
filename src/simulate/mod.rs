//! `palletd simulate`: a load generator publishing realistic readings.
//!
//! Each sensor walks temperature, humidity and pressure randomly. The
//! schedule is open-loop: the n-th reading is due at n / (sensors × rate)
//! seconds whatever happened before, so when the broker or the client cannot
//! keep up the generator falls behind (and says so) instead of slowing the
//! offered load. A share of the sensors sends batches: a JSON array of
//! several readings in one message.
//!
//! With [`SimFormat::SparkplugB`] the sensors are Sparkplug B devices of
//! edge nodes instead ([`sparkplug`]).

pub mod sparkplug;

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rumqttc::{AsyncClient, Event, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// What the simulated sensors publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimFormat {
    /// JSON objects (and arrays) on `topic`.
    Json,
    /// Sparkplug B edge nodes and devices ([`sparkplug`]).
    SparkplugB,
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub format: SimFormat,
    /// Sparkplug B: devices per edge node, and the group id.
    pub devices_per_node: usize,
    pub group: String,
    /// Broker, credentials and TLS, as for the daemon.
    pub mqtt: crate::config::MqttSettings,
    pub client_id: String,
    pub sensors: usize,
    /// Readings per second per sensor.
    pub rate: f64,
    pub duration: Duration,
    /// Topic with a `{sensor}` placeholder.
    pub topic: String,
    pub qos: QoS,
    /// Share of the sensors (0..=1) that send arrays of `batch_size` readings.
    pub batch_share: f64,
    pub batch_size: usize,
    pub sensor_prefix: String,
    pub seed: u64,
    /// Print a progress line on stderr every second (on a terminal).
    pub progress: bool,
}

/// What was done.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimReport {
    pub readings: u64,
    pub messages: u64,
    pub elapsed: Duration,
    /// Largest delay behind the schedule seen when a reading was published.
    pub max_lag: Duration,
    /// QoS 1 messages the broker had not acknowledged at the end.
    pub unacknowledged: u64,
    /// Sparkplug B: readings not sent because their edge node was not
    /// connected and born when they were due.
    pub skipped: u64,
}

impl SimReport {
    pub fn rate(&self) -> f64 {
        self.readings as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Clone)]
struct Walk {
    temp: f64,
    humidity: f64,
    pressure: f64,
    batch: Vec<serde_json::Value>,
}

impl Walk {
    fn new(rng: &mut StdRng) -> Walk {
        Walk {
            temp: rng.gen_range(15.0..25.0),
            humidity: rng.gen_range(35.0..65.0),
            pressure: rng.gen_range(990.0..1030.0),
            batch: Vec::new(),
        }
    }

    fn step(&mut self, rng: &mut StdRng, ts_ms: i64) -> serde_json::Value {
        self.temp = (self.temp + rng.gen_range(-0.1..0.1)).clamp(-40.0, 85.0);
        self.humidity = (self.humidity + rng.gen_range(-0.3..0.3)).clamp(0.0, 100.0);
        self.pressure = (self.pressure + rng.gen_range(-0.2..0.2)).clamp(900.0, 1100.0);
        let round = |x: f64| (x * 100.0).round() / 100.0;
        serde_json::json!({
            "ts": ts_ms,
            "temp": round(self.temp),
            "humidity": round(self.humidity),
            "pressure": round(self.pressure),
        })
    }
}

/// One simulated sensor's readings as the simulator publishes them, `n`
/// of them `step_ms` apart from `start_ms` (the same walk for the same
/// seed): (ts, temp, humidity, pressure). For measurements off the broker
/// (`bench thinning`).
pub fn walk_series(seed: u64, n: usize, start_ms: i64, step_ms: i64) -> Vec<(i64, [f64; 3])> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut walk = Walk::new(&mut rng);
    (0..n as i64)
        .map(|i| {
            let ts = start_ms + i * step_ms;
            let v = walk.step(&mut rng, ts);
            let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
            (ts, [f("temp"), f("humidity"), f("pressure")])
        })
        .collect()
}

/// Why the simulator stopped early.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{0}")]
    Tls(#[from] crate::ingest::tls::TlsError),
    #[error("publishing: {0}")]
    Client(#[from] rumqttc::ClientError),
    #[error("a simulated edge node stopped: {0}")]
    Node(String),
}

/// One progress line, written over the last one.
fn show_progress(report: &SimReport, elapsed: Duration, duration: Duration, outstanding: u64) {
    use std::io::Write;
    let secs = elapsed.as_secs_f64().max(0.001);
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r{:>6.0}s of {}: {} readings published ({:.0}/s), {} awaiting the broker's ack   ",
        secs,
        humantime::format_duration(duration),
        report.readings,
        report.readings as f64 / secs,
        outstanding
    );
    let _ = err.flush();
}

/// Publishes readings on schedule until `duration` passes or `stop` fires.
pub async fn run(opts: SimOptions, stop: CancellationToken) -> Result<SimReport, SimError> {
    if opts.format == SimFormat::SparkplugB {
        return sparkplug::run(opts, stop).await;
    }
    let mut mqtt = crate::ingest::mqtt_options(&opts.mqtt, &opts.client_id)?;
    mqtt.set_inflight(1000);
    let (client, mut eventloop) = AsyncClient::new(mqtt, 10_000);
    let (acks_tx, mut acks_rx) = mpsc::unbounded_channel::<()>();
    let poller = tokio::spawn(async move {
        let mut down = false;
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => {
                    let _ = acks_tx.send(());
                }
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    if down {
                        info!("Simulator reconnected.");
                    }
                    down = false;
                }
                Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
                Ok(_) => {}
                Err(e) => {
                    if !down {
                        warn!(error = %e, "Simulator lost the broker; retrying.");
                        down = true;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    });

    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut walks: Vec<Walk> = (0..opts.sensors).map(|_| Walk::new(&mut rng)).collect();
    let batchers = (opts.sensors as f64 * opts.batch_share.clamp(0.0, 1.0)).round() as usize;
    let total_rate = opts.sensors as f64 * opts.rate;
    let mut report = SimReport::default();
    let started = Instant::now();
    let mut next_sensor = 0usize;
    let mut last_warn = Instant::now() - Duration::from_secs(60);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut outstanding: u64 = 0;
    let mut shown = Instant::now();
    'outer: loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if opts.progress && shown.elapsed() >= Duration::from_secs(1) {
            shown = Instant::now();
            show_progress(&report, started.elapsed(), opts.duration, outstanding);
        }
        let elapsed = started.elapsed().min(opts.duration);
        let due = (elapsed.as_secs_f64() * total_rate).floor() as u64;
        while report.readings < due {
            if stop.is_cancelled() {
                break 'outer;
            }
            let scheduled = Duration::from_secs_f64(report.readings as f64 / total_rate);
            let lag = started.elapsed().saturating_sub(scheduled);
            report.max_lag = report.max_lag.max(lag);
            if lag > Duration::from_secs(1) && last_warn.elapsed() > Duration::from_secs(5) {
                warn!(behind = ?lag, "Simulator is behind its schedule.");
                last_warn = Instant::now();
            }
            let i = next_sensor;
            next_sensor = (next_sensor + 1) % opts.sensors.max(1);
            let reading = walks[i].step(&mut rng, crate::clock::now_ms());
            report.readings += 1;
            let payload = if i < batchers {
                walks[i].batch.push(reading);
                if walks[i].batch.len() < opts.batch_size.max(1) {
                    continue;
                }
                serde_json::Value::Array(std::mem::take(&mut walks[i].batch))
            } else {
                reading
            };
            outstanding += publish(&client, &opts, i, &payload).await?;
            report.messages += 1;
            while acks_rx.try_recv().is_ok() {
                outstanding = outstanding.saturating_sub(1);
            }
        }
        if started.elapsed() >= opts.duration {
            break;
        }
    }
    // Flush the partial batches so every generated reading is sent.
    for (i, w) in walks.iter_mut().enumerate().take(batchers) {
        if !w.batch.is_empty() {
            let payload = serde_json::Value::Array(std::mem::take(&mut w.batch));
            outstanding += publish(&client, &opts, i, &payload).await?;
            report.messages += 1;
        }
    }
    report.elapsed = started.elapsed();
    if opts.progress {
        show_progress(&report, report.elapsed, opts.duration, outstanding);
        eprintln!();
    }
    // Wait (bounded) for the broker to acknowledge what was sent.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while outstanding > 0 {
        match tokio::time::timeout_at(deadline, acks_rx.recv()).await {
            Ok(Some(())) => outstanding -= 1,
            _ => break,
        }
    }
    report.unacknowledged = outstanding;
    let _ = client.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), poller).await;
    Ok(report)
}

fn sensor_id(opts: &SimOptions, i: usize) -> String {
    format!("{}{:05}", opts.sensor_prefix, i)
}

/// Publishes one message of sensor `i`; returns 1 if it awaits a PUBACK.
async fn publish(
    client: &AsyncClient,
    opts: &SimOptions,
    i: usize,
    payload: &serde_json::Value,
) -> Result<u64, SimError> {
    let topic = opts.topic.replace("{sensor}", &sensor_id(opts, i));
    client
        .publish(topic, opts.qos, false, payload.to_string())
        .await?;
    Ok(u64::from(opts.qos != QoS::AtMostOnce))
}
