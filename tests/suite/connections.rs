//! `[mqtt] connections = N`: N sessions in one shared subscription, against
//! a real Mosquitto. The broker spreads the messages over the connections
//! (each one's counter moves); a SIGKILL, a broker restart and one
//! connection's socket cut lose and duplicate nothing; fewer connections
//! retire the sessions left over, whose queued messages are stored.

use crate::common;

use std::time::Duration;

use common::*;
use palletd::testkit::netem::{Link, Proxy};

/// Messages each of the first `n` connections received.
fn per_connection(p: &Palletd, n: usize) -> Vec<f64> {
    let s = p.scrape();
    (0..n)
        .map(|k| {
            metric(
                &s,
                "palletd_messages_received_total",
                Some(("connection", &k.to_string())),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_connections_share_the_messages_and_sigkills_lose_and_duplicate_nothing() {
    let mut stack = Stack::start("conn-kill", |c| {
        c.set("mqtt.connections", 4).max_delay("300ms")
    })
    .await;
    stack.palletd.connections_up(4.0).await;
    let first = Publisher::connect(&stack.broker, "pub-conn-kill-0").await;
    let warmup = publish_steadily_from(first, 20, 400.0, 0..400).await;
    stack.wait_stored(400).await;
    let counts = per_connection(&stack.palletd, 4);
    assert!(
        counts.iter().all(|c| *c > 0.0),
        "the broker spread the messages over the four connections: {counts:?}"
    );
    assert_eq!(counts.iter().sum::<f64>(), 400.0);
    let stream = tokio::spawn(publish_steadily_from(
        stack.publisher().await,
        20,
        250.0,
        400..3400,
    ));
    stack.kill_repeatedly(4, 32).await;
    let mut sent = stream.await.unwrap();
    sent.extend(warmup);
    assert_exactly_once(&stack.client, "conn-kill", &sent, Duration::from_secs(120)).await;
    stack.all_acknowledged().await;
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_with_four_connections_loses_and_duplicates_nothing() {
    let mut stack = Stack::start("conn-restart", |c| c.set("mqtt.connections", 4)).await;
    stack.palletd.connections_up(4.0).await;
    // Every connection comes back on its own.
    let sent = stack.publish_through_a_broker_restart(4.0).await;
    stack.palletd.connections_up(4.0).await;
    assert_exactly_once(
        &stack.client,
        "conn-restart",
        &sent,
        Duration::from_secs(120),
    )
    .await;
    stack.all_acknowledged().await;
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_cut_while_the_others_run_loses_nothing() {
    let broker = Broker::start();
    let link = Link {
        one_way: Duration::ZERO,
        bytes_per_sec: 0,
    };
    let proxy = Proxy::link(broker.port, link).await.unwrap();
    let url = format!("mqtt://127.0.0.1:{}", proxy.port);
    let mut stack = Stack::on(broker, Database::start(), "conn-cut", |c| {
        c.set("mqtt.connections", 4).set("mqtt.url", url.as_str())
    })
    .await;
    stack.palletd.connections_up(4.0).await;
    let stream = tokio::spawn(publish_steadily(stack.publisher().await, 10, 200.0, 3000));
    stack.wait_stored(200).await;
    assert!(proxy.cut_one(), "a connection to cut");
    // The other three stay up and go on storing while the fourth is away.
    stack.palletd.connections_up(3.0).await;
    let before = stack.stored().await;
    stack.wait_stored(before + 300).await;
    assert_eq!(
        stack.palletd.metric("palletd_broker_connections_up", None),
        3.0
    );
    let (status, why) = stack.palletd.readyz();
    assert_eq!(status, 503, "{why}");
    proxy.restore();
    stack.palletd.connections_up(4.0).await;
    let sent = stream.await.unwrap();
    assert_exactly_once(&stack.client, "conn-cut", &sent, Duration::from_secs(120)).await;
    stack.all_acknowledged().await;
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fewer_connections_retire_the_sessions_left_over_with_their_messages() {
    let mut stack = Stack::start("conn-retire", |c| c.set("mqtt.connections", 4)).await;
    stack.palletd.connections_up(4.0).await;
    stack.stop();
    // While palletd is down the broker queues for all four sessions.
    let queued = publish_steadily(stack.publisher().await, 10, 500.0, 400).await;
    stack.config = stack.config.clone().set("mqtt.connections", 2);
    stack.palletd = Palletd::start(&stack.config);
    stack.palletd.ready().await;
    stack.palletd.connections_up(2.0).await;
    let sessions = stack.config.settings().spool.dir.join("mqtt-sessions.json");
    stack
        .palletd
        .wait_until(Duration::from_secs(60), "sessions 2 and 3 retired", |_| {
            let text = std::fs::read_to_string(&sessions).unwrap_or_default();
            !text.contains("conn-retire-2") && !text.contains("conn-retire-3")
        })
        .await;
    // Mosquitto queued a share for the offline sessions 2 and 3: the
    // retiring connections (indexes 64 and 65) received it.
    let s = stack.palletd.scrape();
    let retired: f64 = ["64", "65"]
        .iter()
        .map(|k| {
            metric(
                &s,
                "palletd_messages_received_total",
                Some(("connection", k)),
            )
        })
        .sum();
    assert!(
        retired > 0.0,
        "the retired sessions' queued messages were received"
    );
    // Published after the retirement: shared by the two alone (no share
    // queues for the retired sessions: the broker holds nothing at the end).
    let second = Publisher::connect(&stack.broker, "pub-conn-retire-2").await;
    let after = publish_steadily_from(second, 10, 500.0, 400..800).await;
    let mut sent = queued;
    sent.extend(after);
    assert_exactly_once(
        &stack.client,
        "conn-retire",
        &sent,
        Duration::from_secs(120),
    )
    .await;
    stack.all_acknowledged().await;
    let counts = per_connection(&stack.palletd, 2);
    assert!(counts.iter().all(|c| *c > 0.0), "{counts:?}");
    stack.stop();
}
