//! MQTT 5 (`[mqtt] protocol = "5"`) against the real Mosquitto: a
//! reading's time and sensor from user properties, the format from the
//! content type, the same guarantees as 3.1.1 through SIGKILLs and a
//! broker restart, and the session expiry honoured by the broker.

use crate::common;

use std::time::Duration;

use common::*;
use rumqttc::v5::mqttbytes::v5::{Packet as Packet5, PublishProperties};
use rumqttc::v5::mqttbytes::QoS as QoS5;

/// An MQTT 5 publisher (rumqttc's v5 client) whose QoS 1 publishes are
/// all acknowledged by the broker when `flush` returns.
struct Publisher5 {
    client: rumqttc::v5::AsyncClient,
    acks: tokio::sync::mpsc::UnboundedReceiver<()>,
    sent: usize,
}

impl Publisher5 {
    async fn connect(broker: &Broker, id: &str) -> Publisher5 {
        let opts = rumqttc::v5::MqttOptions::new(id, "127.0.0.1", broker.port);
        let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(opts, 100);
        let (tx, acks) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(rumqttc::v5::Event::Incoming(Packet5::PubAck(_))) => {
                        let _ = tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        Publisher5 {
            client,
            acks,
            sent: 0,
        }
    }

    async fn publish(
        &mut self,
        topic: &str,
        payload: &str,
        user: &[(&str, &str)],
        content_type: Option<&str>,
    ) {
        let props = PublishProperties {
            user_properties: user
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            content_type: content_type.map(str::to_string),
            ..Default::default()
        };
        self.client
            .publish_with_properties(topic, QoS5::AtLeastOnce, false, payload.to_string(), props)
            .await
            .unwrap();
        self.sent += 1;
    }

    async fn flush(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.sent > 0 {
            match tokio::time::timeout_at(deadline, self.acks.recv()).await {
                Ok(Some(())) => self.sent -= 1,
                _ => panic!("broker did not acknowledge {} publishes", self.sent),
            }
        }
    }
}

fn v5(c: Config) -> Config {
    c.set("mqtt.protocol", "5")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_properties_give_the_time_and_sensor_and_the_content_type_the_format() {
    let mut stack = Stack::start("v5props", |c| {
        v5(c)
            .subscription(&[
                ("topic", "devices/telemetry".into()),
                ("sensor_property", "device".into()),
                ("timestamp_property", "time".into()),
            ])
            .subscription(&[
                ("topic", "mixed/{sensor}".into()),
                ("field", "v".into()),
                ("format_from_content_type", true.into()),
            ])
    })
    .await;
    let mut p = Publisher5::connect(&stack.broker, "pub-v5props").await;
    let t0 = now_ms() - 60_000;
    let epoch = t0.to_string();
    let text = bson::DateTime::from_millis(t0 + 1000)
        .try_to_rfc3339_string()
        .unwrap();
    // Time and sensor from properties; epoch milliseconds and RFC 3339.
    p.publish(
        "devices/telemetry",
        r#"{"temp": 1}"#,
        &[("device", "d1"), ("time", &epoch)],
        None,
    )
    .await;
    p.publish(
        "devices/telemetry",
        r#"{"temp": 2}"#,
        &[("device", "d1"), ("time", &text)],
        None,
    )
    .await;
    // A payload's own timestamp wins over the property.
    let own = t0 + 2000;
    p.publish(
        "devices/telemetry",
        &format!(r#"{{"temp": 3, "ts": {own}}}"#),
        &[("device", "d2"), ("time", &epoch)],
        None,
    )
    .await;
    // The content type chooses the format: a bare number, then JSON.
    p.publish("mixed/m1", "12.5", &[], Some("text/plain")).await;
    p.publish(
        "mixed/m1",
        r#"{"v": 13.5}"#,
        &[],
        Some("application/json; charset=utf-8"),
    )
    .await;
    // Refused as a payload's field would be: no sensor, a bad time.
    p.publish(
        "devices/telemetry",
        r#"{"temp": 4}"#,
        &[("time", &epoch)],
        None,
    )
    .await;
    p.publish(
        "devices/telemetry",
        r#"{"temp": 5}"#,
        &[("device", "d1"), ("time", "last tuesday")],
        None,
    )
    .await;
    p.flush().await;

    eventually(
        Duration::from_secs(60),
        "5 readings and 2 dead letters",
        || async {
            stack.stored().await >= 5 && stack.docs("readings_deadletter").await.len() >= 2
        },
    )
    .await;
    stack.palletd.settled().await;
    let mut got: Vec<(String, i64, f64)> = Vec::new();
    for b in stack.docs("readings").await {
        for s in b.get_array("samples").unwrap() {
            let s = s.as_document().unwrap();
            let v = s.get_f64("temp").or_else(|_| s.get_f64("v")).unwrap();
            got.push((
                b.get_str("sensorId").unwrap().to_string(),
                ts_of(&s.clone().into()),
                v,
            ));
        }
    }
    got.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (m1_first, m1_second) = (got[3].1, got[4].1);
    assert_eq!(
        got[..3],
        [
            ("d1".to_string(), t0, 1.0),
            ("d1".to_string(), t0 + 1000, 2.0),
            ("d2".to_string(), own, 3.0)
        ],
        "{got:?}"
    );
    // Stamped on arrival, over four connections: two messages a
    // millisecond apart may arrive in either order.
    let mut m1 = [(got[3].0.as_str(), got[3].2), (got[4].0.as_str(), got[4].2)];
    m1.sort_by(|a, b| a.partial_cmp(b).unwrap());
    assert_eq!(m1, [("m1", 12.5), ("m1", 13.5)], "{got:?}");
    // Stamped on arrival: no time property there.
    assert!(m1_first > t0 + 30_000 && m1_second > t0 + 30_000);
    let dead = stack.docs("readings_deadletter").await;
    let mut causes: Vec<&str> = dead.iter().map(|d| d.get_str("cause").unwrap()).collect();
    causes.sort_unstable();
    assert_eq!(causes, ["bad_sensor", "bad_timestamp"]);
    let log = stack.palletd.log();
    assert!(
        log.contains("MQTT 5 CONNACK"),
        "the broker's limits are logged at connect:\n{log}"
    );
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_three_times_with_a_v5_session_stores_every_reading_exactly_once() {
    let mut stack = Stack::start("v5crash", |c| v5(c).max_delay("300ms")).await;
    let stream = tokio::spawn(publish_steadily(stack.publisher().await, 20, 250.0, 2500));
    stack.kill_repeatedly(3, 11).await;
    let sent = stream.await.unwrap();
    assert_exactly_once(&stack.client, "v5crash", &sent, Duration::from_secs(120)).await;
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_with_a_v5_session_loses_nothing() {
    let mut stack = Stack::start("v5restart", v5).await;
    let sent = stack.publish_through_a_broker_restart(1.0).await;
    assert_exactly_once(&stack.client, "v5restart", &sent, Duration::from_secs(120)).await;
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_drops_the_session_after_its_expiry_and_keeps_it_before() {
    // A long expiry (the default, 7 days): what arrives while palletd is
    // stopped waits for it.
    let mut stack = Stack::start("v5expiry", v5).await;
    stack.stop();
    let mut publisher = stack.publisher().await;
    publish_ten_while_stopped(&stack, &mut publisher, 0).await;
    stack.palletd = Palletd::start(&stack.config);
    stack.wait_stored(10).await;
    stack.stop();

    // A short one: the broker drops the session and what it held for it.
    stack.config = stack.config.clone().set("mqtt.session_expiry", "2s");
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    stack.stop();
    publish_ten_while_stopped(&stack, &mut publisher, 10).await;
    eventually(
        Duration::from_secs(30),
        "the broker dropped the expired session's messages",
        || async { stack.broker.held_messages().await == 0 },
    )
    .await;
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    stack
        .palletd
        .wait_for_log("session_present=false", Duration::from_secs(10))
        .await;
    // Subscribed again, it takes new readings; the ten sent while its
    // session had expired never reached it.
    publisher.json("e1", serde_json::json!({ "seq": 20 })).await;
    publisher.flush().await;
    stack.wait_stored(11).await;
    stack.palletd.settled().await;
    assert_eq!(stack.stored().await, 11);
    stack.stop();
}

/// Publishes ten readings from `from` while palletd is stopped; the
/// broker holds them for its session.
async fn publish_ten_while_stopped(stack: &Stack, publisher: &mut Publisher, from: i64) {
    for seq in from..from + 10 {
        publisher
            .json("e1", serde_json::json!({ "seq": seq }))
            .await;
    }
    publisher.flush().await;
    eventually(
        Duration::from_secs(10),
        "the broker holding them for the session",
        || async { stack.broker.held_messages().await >= 10 },
    )
    .await;
}
