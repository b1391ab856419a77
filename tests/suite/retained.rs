//! The retained rule (`retained = "changed"`, the default): a message the
//! broker sends with the RETAIN flag is stored only when it differs from
//! the last value palletd took in from its topic. Through four shared
//! connections on Mosquitto (Debian's 2.0.11 sends a topic's retained
//! value to every member of a shared group), a SIGKILL, a broker restart,
//! and a value published at QoS 0 while palletd was away (only the
//! broker's retained copy carries it); and through one connection on
//! aedes and on RabbitMQ. Every value is stored once. (RabbitMQ 3.10
//! sends a retained value on subscribe only to a filter that is its topic,
//! no wildcard: palletd's filters get none, so there it is what arrives
//! live, or queued in the session at QoS 1, that is stored once.)

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::Bson;
use common::*;
use palletd::testkit::Rabbit;

/// Every stored value by (sensor, field), in time order.
async fn values(client: &mongodb::Client, db: &str) -> BTreeMap<(String, String), Vec<Bson>> {
    let mut out: BTreeMap<(String, String), Vec<(i64, Bson)>> = BTreeMap::new();
    for b in all_docs(client, db, "readings").await {
        let sensor = b.get_str("sensorId").unwrap().to_string();
        for s in b.get_array("samples").unwrap() {
            let s = s.as_document().unwrap();
            let ts = s.get_datetime("ts").unwrap().timestamp_millis();
            for (k, v) in s.iter().filter(|(k, _)| *k != "ts") {
                out.entry((sensor.clone(), k.clone()))
                    .or_default()
                    .push((ts, v.clone()));
            }
        }
    }
    out.into_iter()
        .map(|(k, mut v)| {
            v.sort_by_key(|x| x.0);
            (k, v.into_iter().map(|x| x.1).collect())
        })
        .collect()
}

fn text(s: &str) -> Bson {
    Bson::String(s.into())
}

/// Waits until palletd passed at least `n` retained copies over.
async fn copies_passed_over(palletd: &Palletd, n: f64) {
    palletd
        .wait_until(
            Duration::from_secs(30),
            "retained copies passed over",
            |p| {
                p.metric(
                    "palletd_messages_skipped_total",
                    Some(("reason", "retained_seen")),
                ) >= n
            },
        )
        .await;
}

/// The device's retained values before palletd ever ran: a Tasmota plug's
/// LWT and a Home Assistant statestream entity.
async fn device_state(publisher: &mut Publisher) {
    publisher
        .retain(&[
            ("tele/plug1/LWT", "Online"),
            ("homeassistant/statestream/sensor/kitchen/state", "21.5"),
            (
                "homeassistant/statestream/sensor/kitchen/unit_of_measurement",
                "\"°C\"",
            ),
        ])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_values_are_stored_once_through_four_shared_connections_kills_and_a_broker_restart(
) {
    let broker = Broker::start();
    let mut device = Publisher::connect(&broker, "device-retained").await;
    device_state(&mut device).await;
    let mut stack = Stack::on(broker, Database::start(), "retained", |c| {
        c.preset("tasmota").preset("homeassistant")
    })
    .await;
    stack.palletd.connections_up(4.0).await;
    stack.wait_stored(3).await;
    stack.all_acknowledged().await;
    // Killed, and started again: every connection subscribes, and the
    // broker sends each member of the group the retained values again.
    stack.palletd.nothing_left_to_write().await;
    stack.palletd.kill();
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    copies_passed_over(&stack.palletd, 3.0).await;
    // The broker restarts (it keeps its sessions): the connections come
    // back, subscribe again, and get the copies again.
    stack.broker.restart();
    stack
        .palletd
        .wait_metric("palletd_broker_reconnects_total", 4.0)
        .await;
    stack.palletd.ready().await;
    copies_passed_over(&stack.palletd, 6.0).await;
    // Away: the plug goes offline at QoS 0 (nothing is queued for
    // palletd's sessions): only the broker's retained copy carries it.
    stack.stop();
    let mut device = Publisher::connect(&stack.broker, "device-retained").await;
    device.retain_qos0("tele/plug1/LWT", "Offline").await;
    device
        .retain(&[("homeassistant/statestream/sensor/kitchen/state", "22")])
        .await;
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    stack.wait_stored(5).await;
    stack.all_acknowledged().await;
    stack.palletd.settled().await;
    let v = values(&stack.client, "retained").await;
    let at = |s: &str, f: &str| v.get(&(s.to_string(), f.to_string())).cloned();
    assert_eq!(
        at("plug1", "LWT"),
        Some(vec![text("Online"), text("Offline")])
    );
    assert_eq!(
        at("kitchen", "state"),
        Some(vec![Bson::Double(21.5), Bson::Double(22.0)])
    );
    assert_eq!(at("kitchen", "unit_of_measurement"), Some(vec![text("°C")]));
    assert!(stack.docs("readings_deadletter").await.is_empty());
    stack.stop();
}

/// The rule on one connection of a broker of another make: the values
/// before (`copies`: the broker sends them on subscribe to palletd's
/// wildcard filters, else they are published once palletd runs), a
/// restart's copies passed over, a value published away (at QoS 0 when
/// the broker sends copies, else at QoS 1, queued in the session).
async fn once_through_a_restart(
    url: &str,
    dir: &std::path::Path,
    port: u16,
    name: &str,
    copies: bool,
) {
    let db = Database::start();
    let config = Config::new_with(url, dir, &db, name)
        .preset("tasmota")
        .set("mqtt.connections", 1);
    let mut device = Publisher::connect_to(port, &format!("device-{name}")).await;
    if copies {
        device.retain(&[("tele/plug1/LWT", "Online")]).await;
    }
    let mut palletd = Palletd::start(&config);
    palletd.ready().await;
    if !copies {
        device.retain(&[("tele/plug1/LWT", "Online")]).await;
    }
    let client = db.client().await;
    let stored = |n: usize| {
        let client = client.clone();
        async move { stored_samples(&client, name).await >= n }
    };
    eventually(Duration::from_secs(60), "the retained value stored", || {
        stored(1)
    })
    .await;
    palletd.nothing_left_to_write().await;
    palletd.kill();
    let mut palletd = Palletd::start(&config);
    palletd.ready().await;
    if copies {
        copies_passed_over(&palletd, 1.0).await;
    }
    assert_eq!(palletd.terminate(), Some(0));
    match copies {
        true => device.retain_qos0("tele/plug1/LWT", "Offline").await,
        false => device.retain(&[("tele/plug1/LWT", "Offline")]).await,
    }
    let mut palletd = Palletd::start(&config);
    palletd.ready().await;
    eventually(
        Duration::from_secs(60),
        "the value published away stored",
        || stored(2),
    )
    .await;
    palletd.nothing_left_to_write().await;
    let v = values(&client, name).await;
    assert_eq!(
        v.get(&("plug1".to_string(), "LWT".to_string())),
        Some(&vec![text("Online"), text("Offline")]),
        "{v:?}"
    );
    assert_eq!(palletd.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_values_are_stored_once_on_aedes() {
    let aedes = Aedes::start();
    once_through_a_restart(
        &aedes.url(),
        aedes.dir.path(),
        aedes.port,
        "retained_aedes",
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_values_are_stored_once_on_rabbitmq() {
    let rabbit = Rabbit::start(100);
    once_through_a_restart(
        &rabbit.url(),
        rabbit.dir.path(),
        rabbit.port,
        "retained_rabbit",
        false,
    )
    .await;
}
