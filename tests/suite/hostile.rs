//! Hostile and broken devices, with real processes: what one device sends
//! must not cost the other sensors or the box more than its share.

use crate::common;

use std::time::Duration;

use common::*;

/// A device with a clock ten years ahead sends one message of 1,000
/// samples: one dead letter holds the payload once and says which samples
/// it refused and why. Before, it became 1,000 dead letters, each with the
/// whole payload (1,120 times the message, in the spool and in MongoDB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_a_thousand_samples_from_a_wrong_clock_is_one_dead_letter() {
    let mut stack = Stack::start("wrongclock", |c| c).await;
    let mut publisher = stack.publisher().await;
    let ahead = now_ms() + 10 * 365 * 86_400_000;
    let samples: Vec<serde_json::Value> = (0..1000)
        .map(|i| serde_json::json!({ "ts": ahead + i * 1000, "seq": i, "temp": 20.5 }))
        .collect();
    let payload = serde_json::Value::Array(samples).to_string();
    assert!(payload.len() > 40_000);
    publisher
        .publish("sensors/late1/telemetry", payload.clone())
        .await;
    publisher
        .json("good1", serde_json::json!({ "seq": 7, "temp": 1.0 }))
        .await;
    publisher.flush().await;
    stack.wait_stored(1).await;
    eventually(
        Duration::from_secs(30),
        "the dead letter written",
        || async { !stack.docs("readings_deadletter").await.is_empty() },
    )
    .await;
    stack
        .palletd
        .wait_until(
            Duration::from_secs(10),
            "counting every refused sample",
            |p| {
                p.metric(
                    "palletd_dead_letters_total",
                    Some(("cause", "time_out_of_range")),
                ) == 1000.0
            },
        )
        .await;
    let dead = stack.docs("readings_deadletter").await;
    assert_eq!(dead.len(), 1, "one dead letter for the message");
    let d = &dead[0];
    assert_eq!(d.get_str("cause"), Ok("time_out_of_range"));
    assert_eq!(d.get_i64("refused"), Ok(1000));
    let causes = d.get_array("causes").unwrap();
    assert_eq!(causes.len(), 1);
    let c = causes[0].as_document().unwrap();
    assert_eq!(c.get_i64("count"), Ok(1000));
    let indexes: Vec<i64> = c
        .get_array("samples")
        .unwrap()
        .iter()
        .map(|i| i.as_i64().unwrap())
        .collect();
    assert_eq!(
        indexes,
        (0..100).collect::<Vec<_>>(),
        "the first 100 indexes"
    );
    let stored_payload = d.get_binary_generic("payload").unwrap();
    assert_eq!(stored_payload, payload.as_bytes(), "the payload, once");
    let bytes = bson::to_vec(d).unwrap().len();
    assert!(bytes < payload.len() + 4096, "{bytes} bytes of dead letter");
    stack.stop();
}

/// A TCP proxy in front of the broker that drops the connection the first
/// time one of palletd's sessions sends a SUBSCRIBE (before the broker
/// sees it), then passes everything; with `question`, the first SUBSCRIBE
/// of palletd's question about the broker's resends instead.
async fn subscribe_cutter(broker: u16, question: bool) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", broker)).await else {
                continue;
            };
            let cut = cut.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let down = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                // Client to broker, packet by packet: a fixed header (type,
                // remaining length as a varint), then the rest.
                loop {
                    let mut head = [0u8; 1];
                    if cr.read_exact(&mut head).await.is_err() {
                        break;
                    }
                    let (mut len, mut shift, mut raw) = (0usize, 0, vec![head[0]]);
                    loop {
                        let mut b = [0u8; 1];
                        if cr.read_exact(&mut b).await.is_err() {
                            return;
                        }
                        raw.push(b[0]);
                        len |= ((b[0] & 0x7f) as usize) << shift;
                        shift += 7;
                        if b[0] & 0x80 == 0 {
                            break;
                        }
                    }
                    let mut body = vec![0u8; len];
                    if cr.read_exact(&mut body).await.is_err() {
                        break;
                    }
                    // palletd's question to the broker about its resends
                    // has a session of its own, `<client_id>-resends`.
                    let asks = body.windows(8).any(|w| w == b"/resends");
                    let ours = head[0] >> 4 == 8 && asks == question;
                    if ours && !cut.swap(true, std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    raw.extend(body);
                    if sw.write_all(&raw).await.is_err() {
                        break;
                    }
                }
                down.abort();
            });
        }
    });
    port
}

/// The link drops after palletd's SUBSCRIBE left and before the broker got
/// it; the broker had made the session at the CONNECT, so the reconnect
/// says `session_present`. palletd subscribes again (no SUBACK was seen)
/// and stores what is published. Before, it took the kept session for its
/// subscriptions: subscribed to nothing, /readyz green, nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_lost_before_the_suback_does_not_leave_palletd_subscribed_to_nothing() {
    let broker = Broker::start();
    let proxy = subscribe_cutter(broker.port, false).await;
    let db = Database::start();
    let config =
        Config::new(&broker, &db, "suback").set("mqtt.url", format!("mqtt://127.0.0.1:{proxy}"));
    let palletd = Palletd::start(&config);
    palletd.ready().await;
    let client = db.client().await;
    let mut publisher = Publisher::connect(&broker, "pub-suback").await;
    publisher
        .json("sub1", serde_json::json!({ "seq": 1, "v": 1.0 }))
        .await;
    publisher.flush().await;
    eventually(Duration::from_secs(20), "the reading stored", || async {
        stored_samples(&client, "suback").await == 1
    })
    .await;
    assert!(
        palletd.log().contains("session_present=true"),
        "{}",
        palletd.log()
    );
}

/// The link of palletd's question about the broker's resends drops: it
/// asks again (5 s later) and learns that Mosquitto keeps its packet ids.
/// Before, one failed question left it unknown until a resumed session
/// showed it, and every resend without a time of its own was stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_about_the_brokers_resends_that_fails_is_asked_again() {
    let broker = Broker::start();
    let proxy = subscribe_cutter(broker.port, true).await;
    let db = Database::start();
    let config =
        Config::new(&broker, &db, "askagain").set("mqtt.url", format!("mqtt://127.0.0.1:{proxy}"));
    let palletd = Palletd::start(&config);
    palletd
        .wait_until(Duration::from_secs(60), "the numbering learned", |p| {
            p.metric("palletd_mqtt_broker_resends", Some(("numbering", "kept"))) == 1.0
        })
        .await;
    assert!(
        palletd.log().contains("asking again"),
        "the first question failed: {}",
        palletd.log()
    );
}

/// A device sends garbage while the database is away: its dead letters
/// take at most a tenth of `spool.max_size`, the rest are dropped and
/// counted, and the good sensors' readings are spooled and stored as ever.
/// Before, dead letters took the spool like anything else: enough garbage
/// filled it and stopped every sensor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_take_at_most_their_share_of_the_spool() {
    let mut stack = Stack::without_database("deadshare", |c| c.set("spool.max_size", "1MiB")).await;
    let mut publisher = stack.publisher().await;
    let garbage = format!("not json {}", "#".repeat(2000));
    for _ in 0..200 {
        publisher
            .publish("sensors/noisy/telemetry", garbage.clone())
            .await;
    }
    publisher.flush().await;
    let good = Publisher::connect(&stack.broker, "pub-deadshare-good").await;
    let sent = publish_steadily(good, 10, 2000.0, 1000).await;
    stack.all_acknowledged().await;
    let dropped = stack
        .palletd
        .metric("palletd_dead_letters_dropped_total", None);
    assert!(dropped >= 100.0, "{dropped} dropped");
    stack.db.start_again();
    assert_exactly_once(&stack.client, "deadshare", &sent, Duration::from_secs(60)).await;
    let dead = stack.docs("readings_deadletter").await;
    let bytes: usize = dead.iter().map(|d| bson::to_vec(d).unwrap().len()).sum();
    assert!(bytes <= 110 * 1024, "{bytes} bytes of dead letters");
    assert_eq!(
        dead.len() + dropped as usize,
        200,
        "every one stored or counted"
    );
    stack.stop();
}

/// A flood of large bad payloads faster than `limits.max_deadletter_rate`:
/// the first ones keep their payload (the burst), the rest keep its first
/// 256 bytes, and every message is recorded; good readings are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_past_their_rate_keep_the_start_of_the_payload_and_every_message_is_recorded()
{
    // 1 KiB/s: the burst is two of the largest dead letters.
    let mut stack = Stack::start("deadrate", |c| c.set("limits.max_deadletter_rate", "1KiB")).await;
    let mut publisher = stack.publisher().await;
    let garbage = format!("not json {}", "#".repeat(60_000));
    for _ in 0..10 {
        publisher
            .publish("sensors/noisy/telemetry", garbage.clone())
            .await;
    }
    publisher
        .json("good1", serde_json::json!({ "seq": 1, "temp": 1.0 }))
        .await;
    publisher.flush().await;
    stack.wait_stored(1).await;
    eventually(
        Duration::from_secs(30),
        "every message recorded",
        || async { stack.docs("readings_deadletter").await.len() == 10 },
    )
    .await;
    let dead = stack.docs("readings_deadletter").await;
    let kept: Vec<usize> = dead
        .iter()
        .map(|d| match d.get("payload") {
            Some(bson::Bson::Binary(b)) => b.bytes.len(),
            _ => 0,
        })
        .collect();
    let whole = kept.iter().filter(|n| **n == garbage.len()).count();
    let cut = kept.iter().filter(|n| **n == 256).count();
    assert_eq!((whole, cut), (2, 8), "{kept:?}");
    assert!(dead
        .iter()
        .filter(|d| d.get_bool("truncated") == Ok(true))
        .all(|d| d.get_i64("payloadSize") == Ok(garbage.len() as i64)));
    assert_eq!(
        stack
            .palletd
            .metric("palletd_dead_letter_payloads_cut_total", None),
        8.0
    );
    stack.stop();
}
