//! Hostile and broken devices, with real processes: what one device sends
//! must not cost the other sensors or the box more than its share.

mod common;

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
