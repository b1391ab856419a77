//! An MQTT publisher whose QoS 1 publishes are acknowledged when it says
//! so, and steady streams of readings.

use super::*;

/// An MQTT publisher whose QoS 1 publishes are all acknowledged by the broker
/// when `flush` returns.
pub struct Publisher {
    client: AsyncClient,
    acks: tokio::sync::mpsc::UnboundedReceiver<()>,
    sent: usize,
}

impl Publisher {
    pub async fn connect(broker: &Broker, id: &str) -> Publisher {
        Self::connect_to(broker.port, id).await
    }

    /// A publisher on the broker at this local port (aedes).
    pub async fn connect_to(port: u16, id: &str) -> Publisher {
        Self::connect_with(port, id, true, Duration::from_millis(100)).await
    }

    /// A publisher with a kept session: it resends unacknowledged
    /// publishes after the broker restarts, reconnecting 500 ms after it
    /// lost the broker (a device faster than palletd's own reconnect and
    /// SUBSCRIBE can publish into a shared group the restarted broker has
    /// no member of yet, which drops it; on 2 busy cores 100 ms was).
    pub async fn connect_persistent(broker: &Broker, id: &str) -> Publisher {
        Self::connect_with(broker.port, id, false, Duration::from_millis(500)).await
    }

    async fn connect_with(port: u16, id: &str, clean: bool, retry: Duration) -> Publisher {
        let mut opts = MqttOptions::new(id, "127.0.0.1", port);
        opts.set_clean_session(clean);
        opts.set_max_packet_size(4 << 20, 4 << 20);
        opts.set_inflight(200);
        let (client, mut eventloop) = AsyncClient::new(opts, 1000);
        let (tx, acks) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        let _ = tx.send(());
                    }
                    Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(retry).await,
                }
            }
        });
        Publisher {
            client,
            acks,
            sent: 0,
        }
    }

    pub async fn publish(&mut self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.publish_with(topic, payload, false).await;
    }

    /// Publishes each (topic, value) with the RETAIN flag (the broker keeps
    /// it as the topic's last value) and waits until all are acknowledged.
    pub async fn retain(&mut self, messages: &[(&str, &str)]) {
        for (topic, value) in messages {
            self.publish_with(topic, *value, true).await;
        }
        self.flush().await;
    }

    /// Publishes a value with the RETAIN flag at QoS 0 (as Tasmota does):
    /// the broker keeps it as the topic's last value and queues nothing
    /// for a session that is away.
    pub async fn retain_qos0(&mut self, topic: &str, value: &str) {
        self.client
            .publish(topic, QoS::AtMostOnce, true, value.as_bytes().to_vec())
            .await
            .unwrap();
    }

    /// Publishes as a device does: at this QoS, with the RETAIN flag or
    /// without ([`Publisher::flush`] waits for those acknowledged).
    pub async fn publish_as(
        &mut self,
        topic: &str,
        payload: impl Into<Vec<u8>>,
        qos: QoS,
        retain: bool,
    ) {
        self.client
            .publish(topic, qos, retain, payload.into())
            .await
            .unwrap();
        if qos != QoS::AtMostOnce {
            self.sent += 1;
        }
    }

    async fn publish_with(&mut self, topic: &str, payload: impl Into<Vec<u8>>, retain: bool) {
        self.client
            .publish(topic, QoS::AtLeastOnce, retain, payload.into())
            .await
            .unwrap();
        self.sent += 1;
    }

    /// Publishes a JSON reading of `sensor` on `sensors/<sensor>/telemetry`.
    pub async fn json(&mut self, sensor: &str, value: serde_json::Value) {
        self.publish(&format!("sensors/{sensor}/telemetry"), value.to_string())
            .await;
    }

    /// Waits until the broker acknowledged every publish so far.
    pub async fn flush(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.sent > 0 {
            match tokio::time::timeout_at(deadline, self.acks.recv()).await {
                Ok(Some(())) => self.sent -= 1,
                _ => panic!("broker did not acknowledge {} publishes", self.sent),
            }
        }
    }
}

/// Publishes `count` readings over `sensors` sensors at `rate` per second
/// and waits until the broker acknowledged them all. Returns what was sent.
pub async fn publish_steadily(
    publisher: Publisher,
    sensors: usize,
    rate: f64,
    count: i64,
) -> Vec<(String, i64)> {
    publish_steadily_from(publisher, sensors, rate, 0..count).await
}

/// [`publish_steadily_from`] with each reading's time in its payload
/// (`ts`, milliseconds), as a device with a clock writes it.
pub async fn publish_timed_from(
    mut publisher: Publisher,
    sensors: usize,
    rate: f64,
    seqs: std::ops::Range<i64>,
) -> Vec<(String, i64)> {
    let started = tokio::time::Instant::now();
    let mut sent = Vec::new();
    let first = seqs.start;
    for seq in seqs {
        let due = started + Duration::from_secs_f64((seq - first) as f64 / rate);
        tokio::time::sleep_until(due).await;
        let sensor = format!("f{:02}", seq as usize % sensors);
        let payload =
            serde_json::json!({ "ts": now_ms(), "seq": seq, "temp": (seq % 50) as f64 / 2.0 });
        publisher
            .publish(&format!("sensors/{sensor}/telemetry"), payload.to_string())
            .await;
        sent.push((sensor, seq));
    }
    publisher.flush().await;
    sent
}

/// [`publish_steadily`] with these sequence numbers.
pub async fn publish_steadily_from(
    mut publisher: Publisher,
    sensors: usize,
    rate: f64,
    seqs: std::ops::Range<i64>,
) -> Vec<(String, i64)> {
    let started = tokio::time::Instant::now();
    let mut sent = Vec::new();
    let first = seqs.start;
    for seq in seqs {
        let due = started + Duration::from_secs_f64((seq - first) as f64 / rate);
        tokio::time::sleep_until(due).await;
        let sensor = format!("f{:02}", seq as usize % sensors);
        let payload = serde_json::json!({ "seq": seq, "temp": (seq % 50) as f64 / 2.0, "hum": 40 });
        publisher
            .publish(&format!("sensors/{sensor}/telemetry"), payload.to_string())
            .await;
        sent.push((sensor, seq));
    }
    publisher.flush().await;
    sent
}
