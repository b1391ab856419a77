//! palletd writing to a remote MongoDB over a slow, flaky link: a proxy
//! that delays, throttles and cuts the connection (`palletd::testkit::netem`).
//! After a cut, live readings are stored with their normal lag while the
//! backlog drains behind them, and every reading is stored exactly once,
//! through SIGKILLs and a lost reply during the drain.

use crate::common;

use std::time::Duration;

use common::*;
use palletd::testkit::netem::{Link, Proxy};

/// Readings of one sensor, one every `every`, with these sequence numbers.
async fn publish_every(
    publisher: &mut Publisher,
    sensor: &str,
    seqs: std::ops::Range<i64>,
    every: Duration,
) -> Vec<(String, i64)> {
    let mut sent = Vec::new();
    for seq in seqs {
        publisher
            .json(sensor, serde_json::json!({ "seq": seq, "temp": 20.5 }))
            .await;
        sent.push((sensor.to_string(), seq));
        tokio::time::sleep(every).await;
    }
    publisher.flush().await;
    sent
}

/// A stack whose database is behind a link (5 ms each way,
/// `bytes_per_sec`; 0: unthrottled) in front of a proxy that drops the
/// reply to one write once armed; `max_delay` 500 ms, wire compression off
/// (the proxy picks the write to cut by its bytes), then `configure`.
async fn behind_a_cutter(
    name: &str,
    bytes_per_sec: u64,
    configure: impl FnOnce(Config) -> Config,
) -> (CutProxy, Proxy, Stack) {
    let db = Database::start();
    let cutter = CutProxy::start(db.port).await;
    let link = Proxy::link(
        cutter.port(),
        Link {
            one_way: Duration::from_millis(5),
            bytes_per_sec,
        },
    )
    .await
    .unwrap();
    let stack = Stack::on(Broker::start(), db, name, |c| {
        configure(
            c.mongodb_uri(&link.mongodb_uri(""))
                .uncompressed()
                .max_delay("500ms"),
        )
    })
    .await;
    (cutter, link, stack)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_link_cut_live_readings_are_stored_while_the_backlog_drains() {
    let db = Database::start();
    // About 64 kbit/s: the backlog takes many seconds to drain (wire
    // compression on, as by default, makes it small).
    let link = Proxy::link(
        db.port,
        Link {
            one_way: Duration::from_millis(10),
            bytes_per_sec: 8_000,
        },
    )
    .await
    .unwrap();
    let mut stack = Stack::on(Broker::start(), db, "wan", |c| {
        c.mongodb_uri(&link.mongodb_uri("")).max_delay("1s")
    })
    .await;
    // Running normally first.
    let mut publisher = Publisher::connect(&stack.broker, "pub-first").await;
    let first = publish_every(&mut publisher, "first-1", 0..5, Duration::ZERO).await;
    stack.wait_stored(5).await;
    let errors_before = stack.palletd.metric("palletd_database_errors_total", None);
    link.cut();
    let old = publish_steadily(stack.publisher().await, 20, 2000.0, 20_000).await;
    stack.all_acknowledged().await;
    // The cut lasts until a write has met it: a write that only waits (the
    // driver selecting a server) and is answered after the restore is not
    // an outage, and the live lane would not fall back.
    stack
        .palletd
        .wait_until(
            Duration::from_secs(60),
            "a write failing on the cut link",
            |p| p.metric("palletd_database_errors_total", None) > errors_before,
        )
        .await;
    link.restore();
    // Once palletd is writing again, what waited is the backlog and
    // readings arriving from then on are live.
    stack
        .palletd
        .wait_until(Duration::from_secs(30), "a backlog draining", |p| {
            p.metric("palletd_backlog_readings", None) > 0.0
        })
        .await;
    let mut publisher = Publisher::connect(&stack.broker, "pub-live").await;
    let live = publish_every(&mut publisher, "live-1", 0..5, Duration::from_millis(200)).await;
    eventually(
        Duration::from_secs(30),
        "the live readings stored",
        || async {
            let stored = stored_counts(&stack.client, "wan").await;
            live.iter().all(|k| stored.contains_key(k))
        },
    )
    .await;
    let old_stored = stored_counts(&stack.client, "wan")
        .await
        .keys()
        .filter(|k| k.0 != "live-1" && k.0 != "first-1")
        .count();
    let (_, readyz) = stack.palletd.readyz();
    eprintln!(
        "live stored with {old_stored} of {} backlog readings stored; {readyz}",
        old.len()
    );
    assert!(
        old_stored < old.len(),
        "the live readings went before the backlog had drained ({old_stored} of {} stored)",
        old.len()
    );
    assert!(readyz.contains("draining a backlog"), "{readyz}");
    assert!(stack.palletd.metric("palletd_backlog_readings", None) > 0.0);
    let all: Vec<_> = first.into_iter().chain(old).chain(live).collect();
    assert_exactly_once(&stack.client, "wan", &all, Duration::from_secs(120)).await;
    let (up, _) = link.bytes();
    assert!(up > 0);
    stack.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_backlog_is_stored_exactly_once_through_kills_and_a_lost_reply() {
    let (cutter, link, mut stack) = behind_a_cutter("wanfaults", 100_000, |c| c).await;
    link.cut();
    let old = publish_steadily(stack.publisher().await, 20, 1000.0, 6000).await;
    stack.all_acknowledged().await;
    cutter.arm();
    link.restore();
    let live = tokio::spawn(publish_steadily_from(
        Publisher::connect(&stack.broker, "pub-live").await,
        20,
        200.0,
        6000..7000,
    ));
    // Killed twice while a backlog drains (after a restart, what the spool
    // holds unconfirmed is the backlog): once some of it was written. (The
    // backlog gauge is published once a second; a short drain can end
    // between two, so the test waits on the counter.) A run killed after
    // its last write was applied but before its checkpoint leaves a
    // backlog that the next run finds applied and writes nothing of: that
    // run is killed once its replay is resolved.
    for _ in 0..2 {
        stack
            .palletd
            .wait_until(Duration::from_secs(30), "writing a backlog", |p| {
                p.metric("palletd_backlog_samples_stored_total", None) > 0.0
                    || (p.metric("palletd_spool_replayed_records_total", None) > 0.0
                        && p.scrape().samples.iter().any(|s| {
                            s.metric == "palletd_backlog_readings"
                                && s.value == prometheus_parse::Value::Gauge(0.0)
                        }))
            })
            .await;
        eprintln!(
            "killed with {} backlog readings left",
            stack.palletd.metric("palletd_backlog_readings", None)
        );
        stack.palletd.kill();
        stack.palletd = Palletd::start(&stack.config);
    }
    let all: Vec<_> = old.into_iter().chain(live.await.unwrap()).collect();
    assert_exactly_once(&stack.client, "wanfaults", &all, Duration::from_secs(120)).await;
    assert_eq!(cutter.cuts(), 1, "one reply was dropped");
    stack.stop();
}

/// A database slower than the flush delay asks for (each write takes a
/// 500 ms round trip, the delay is 200 ms): due sensors wait past their
/// deadline, so the policy stretches the delay (statements then carry more
/// readings) while readings keep coming, every one of them is stored
/// exactly once, and once the load stops the delay shrinks back to
/// `flush.max_delay`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_slower_than_the_delay_stretches_it_and_it_shrinks_back() {
    let db = Database::start();
    let link = Proxy::link(
        db.port,
        Link {
            one_way: Duration::from_millis(250),
            bytes_per_sec: 0,
        },
    )
    .await
    .unwrap();
    let stack = Stack::on(Broker::start(), db, "stretch", |c| {
        c.mongodb_uri(&link.mongodb_uri(""))
            .max_delay("200ms")
            .set("flush.max_delay_limit", "5s")
    })
    .await;
    let delay = |p: &Palletd| p.metric("palletd_flush_delay_seconds", None);
    assert_eq!(delay(&stack.palletd), 0.2);
    let publishing = publish_steadily(stack.publisher().await, 50, 200.0, 3_000);
    let stretched = stack
        .palletd
        .wait_until(Duration::from_secs(60), "the delay stretched", |p| {
            delay(p) > 0.2
        });
    let (sent, ()) = tokio::join!(publishing, stretched);
    assert!(delay(&stack.palletd) <= 5.0);
    assert_exactly_once(&stack.client, "stretch", &sent, Duration::from_secs(60)).await;
    stack
        .palletd
        .wait_until(
            Duration::from_secs(60),
            "the delay back at max_delay",
            |p| delay(p) == 0.2,
        )
        .await;
    assert!(
        stack
            .palletd
            .log()
            .contains("not keeping up with the flush delay"),
        "{}",
        stack.palletd.log()
    );
}

/// The link is cut just after a write went out (its reply lost) and stays
/// cut while palletd waits to ask what that write applied: once it is back,
/// what waited through the cut is written as backlog, behind new readings,
/// not ahead of them. (Before, the write that followed the resolve ended
/// the outage and the live lane wrote all of it first: `bench wan` saw the
/// probe's lag p99 at 14 s after a 60 s cut, 4.5 s before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_that_lasts_through_the_resolve_of_a_lost_reply_leaves_a_backlog() {
    let (cutter, link, mut stack) =
        behind_a_cutter("wanresolve", 0, |c| c.set("mongodb.write_time_limit", "2s")).await;
    let steady = tokio::spawn(publish_steadily(stack.publisher().await, 20, 200.0, 3000));
    stack.wait_stored(100).await;
    // The next bucket write's reply is lost; the link goes down with it,
    // before palletd asks what that write applied (it waits out the write
    // time limit first), and stays down for 6 s (`behind` is 1.5 s).
    cutter.arm();
    eventually(Duration::from_secs(30), "a reply lost", || async {
        cutter.cuts() == 1
    })
    .await;
    link.cut();
    tokio::time::sleep(Duration::from_secs(6)).await;
    link.restore();
    let sent = steady.await.unwrap();
    stack.all_acknowledged().await;
    assert_exactly_once(&stack.client, "wanresolve", &sent, Duration::from_secs(120)).await;
    let backlog = stack
        .palletd
        .metric("palletd_backlog_samples_stored_total", None);
    assert!(
        backlog > 0.0,
        "what waited through the cut was written as backlog ({backlog} backlog samples stored)"
    );
    stack.stop();
}
