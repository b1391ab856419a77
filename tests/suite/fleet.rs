//! Several palletd instances behind one broker's shared subscription
//! (`[mqtt] share_group`), writing one database: every reading stored
//! exactly once through a SIGKILL of one instance mid-stream, with buckets
//! written by both instances within their caps.

use crate::common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_load_exactly_once_through_a_kill() {
    share_the_load_through_a_kill("fleet", |c| c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mqtt5_instances_share_the_load_exactly_once_through_a_kill() {
    share_the_load_through_a_kill("fleet5", |c| c.set("mqtt.protocol", "5")).await;
}

async fn share_the_load_through_a_kill(name: &str, configure: impl FnOnce(Config) -> Config) {
    let broker = Broker::start();
    let db = Database::start();
    let dir = tempfile::tempdir().unwrap();
    // A few samples per bucket, so both instances write into shared windows
    // and fill buckets.
    let a_config = configure(Config::new(&broker, &db, name))
        .set("mqtt.share_group", "palletd")
        .max_delay("300ms");
    let b_config = a_config.another(&format!("{name}-b"), dir.path());
    let a = Palletd::start(&a_config);
    let mut b = Palletd::start(&b_config);
    // Both subscribed: the broker only keeps messages for a group with a
    // member.
    a.ready().await;
    b.ready().await;
    let client = db.client().await;
    let publisher = Publisher::connect(&broker, &format!("pub-{name}")).await;
    let sending = tokio::spawn(publish_steadily(publisher, 8, 400.0, 4000));
    // Both take part, then one dies mid-stream and comes back.
    for p in [&a, &b] {
        p.wait_until(Duration::from_secs(30), "taking its share", |p| {
            p.metric("palletd_samples_stored_total", None) > 0.0
        })
        .await;
    }
    b.kill();
    assert!(
        !sending.is_finished(),
        "the kill happened mid-stream (publish more or faster)"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    b = Palletd::start(&b_config);
    let sent = sending.await.unwrap();
    assert_exactly_once(&client, name, &sent, Duration::from_secs(90)).await;
    // The broker spread the load: the restarted instance took its share of
    // what came after the kill, and the other one of the rest.
    assert!(a.metric("palletd_samples_stored_total", None) > 0.0);
    b.wait_until(Duration::from_secs(10), "storing after its restart", |p| {
        p.metric("palletd_messages_received_total", None) > 0.0
    })
    .await;
}
