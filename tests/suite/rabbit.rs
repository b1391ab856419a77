//! A third broker: RabbitMQ's MQTT plugin (Debian's rabbitmq-server 3.10,
//! a private node per test). It resends a resumed session's
//! unacknowledged messages with DUP under the new connection's packet ids
//! (counting from 1), so no packet id names what it had: palletd asks it
//! once how it numbers, aligns the resends with what the session received
//! before by their digests, and never sends a PUBACK of an earlier
//! connection on the next one (there its packet id would name another
//! message). Readings carrying their own time, as a device's do: each
//! stored once after lost acknowledgements and a palletd restart, and
//! through a RabbitMQ restart under load. It also grants `$share/`
//! without delivering through it: palletd falls back to one connection.

use crate::common;

use std::time::Duration;

use common::*;
use palletd::testkit::netem::{Link, Proxy};
use palletd::testkit::Rabbit;

async fn proxy(port: u16) -> Proxy {
    let link = Link {
        one_way: Duration::ZERO,
        bytes_per_sec: 0,
    };
    Proxy::link(port, link).await.unwrap()
}

/// PUBACKs lost with a dying connection, then a restart: RabbitMQ resends
/// all 100 under new packet ids; they are recognised, none stored twice;
/// and the 50 after, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renumbered_resends_after_lost_acknowledgements_and_a_restart_store_nothing_twice() {
    let rabbit = Rabbit::start(200);
    let proxy = proxy(rabbit.port).await;
    let db = Database::start();
    let config = Config::new_with(
        &format!("mqtt://127.0.0.1:{}", proxy.port),
        rabbit.dir.path(),
        &db,
        "rabbitack",
    )
    .set("mqtt.connections", 1);
    let mut palletd = Palletd::start(&config);
    palletd.ready().await;
    assert_eq!(
        palletd.metric(
            "palletd_mqtt_broker_resends",
            Some(("numbering", "renumbered"))
        ),
        1.0,
        "RabbitMQ asked how it numbers its resends"
    );
    let client = db.client().await;
    // From here on what palletd sends (its PUBACKs) is lost.
    proxy.lose(true, false);
    let publisher = Publisher::connect_to(rabbit.port, "pub-rabbitack").await;
    let first = publish_timed_from(publisher, 10, 200.0, 0..100).await;
    eventually(Duration::from_secs(60), "100 stored", || async {
        stored_samples(&client, "rabbitack").await >= 100
    })
    .await;
    palletd.nothing_left_to_write().await;
    palletd.kill();
    proxy.lose(false, false);
    let mut palletd = Palletd::start(&config);
    palletd.ready().await;
    let publisher = Publisher::connect_to(rabbit.port, "pub-rabbitack-2").await;
    let more = publish_timed_from(publisher, 10, 200.0, 100..150).await;
    let sent: Vec<_> = first.into_iter().chain(more).collect();
    assert_exactly_once(&client, "rabbitack", &sent, Duration::from_secs(60)).await;
    assert!(
        palletd.metric("palletd_redeliveries_skipped_total", None) >= 100.0,
        "RabbitMQ resent the 100 and palletd recognised them"
    );
    assert_eq!(palletd.terminate(), Some(0));
}

/// PUBACKs released while the link is down (held over) are not sent on
/// the next connection, where RabbitMQ numbers other messages with their
/// ids; then RabbitMQ restarts holding palletd's messages, some sent and
/// not acknowledged: every reading once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_over_acknowledgements_and_a_rabbitmq_restart_under_load_lose_and_double_nothing() {
    let mut rabbit = Rabbit::start(100);
    let proxy = proxy(rabbit.port).await;
    let db = Database::start();
    let config = Config::new_with(
        &format!("mqtt://127.0.0.1:{}", proxy.port),
        rabbit.dir.path(),
        &db,
        "rabbitrestart",
    )
    .set("mqtt.connections", 1);
    let mut palletd = Palletd::start(&config);
    palletd.ready().await;
    let client = db.client().await;
    let publisher = Publisher::connect_to(rabbit.port, "pub-rabbitrestart").await;
    let stream = tokio::spawn(publish_timed_from(publisher, 10, 200.0, 0..400));
    // PUBACKs lost, then the link cut: those released meanwhile wait in
    // the client for the next connection.
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.lose(true, false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.cut();
    proxy.lose(false, false);
    proxy.restore();
    let mut sent = stream.await.unwrap();
    palletd
        .wait_metric("palletd_broker_reconnects_total", 1.0)
        .await;
    // RabbitMQ restarts with palletd's PUBACKs of its last 100 messages
    // lost and 200 more queued for it: after the restart it sends them
    // all, the 100 again under new ids.
    proxy.lose(true, false);
    let publisher = Publisher::connect_to(rabbit.port, "pub-rabbitrestart-b").await;
    sent.extend(publish_timed_from(publisher, 10, 1000.0, 400..700).await);
    eventually(
        Duration::from_secs(60),
        "RabbitMQ's window sent",
        || async { stored_samples(&client, "rabbitrestart").await >= 480 },
    )
    .await;
    rabbit.restart();
    proxy.lose(false, false);
    assert_exactly_once(&client, "rabbitrestart", &sent, Duration::from_secs(120)).await;
    palletd.nothing_left_to_write().await;
    assert_eq!(palletd.terminate(), Some(0));
}
