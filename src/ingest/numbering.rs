//! How the broker numbers its resends, asked once: a short-lived session
//! of its own (`<client_id>-resends`) receives two of its own messages,
//! acknowledges the first, reconnects and sees under which packet id the
//! broker resends the second. Under the id it had: the broker keeps its
//! ids (Mosquitto, EMQX, aedes); under 1, the new connection's first: it
//! renumbers (RabbitMQ). The session is removed after (a clean session's
//! connect). See [`crate::front::window::Numbering`].
//!
//! Asked when a spool's `mqtt-broker` does not say yet, in the background
//! at start (the sessions do not wait for it: until it answers, a resend
//! is recognised only where its payload tells). A broker that refuses the
//! probe's topic, a link that drops, or no answer within [`ASK_FOR`]
//! leaves it unknown, said once at INFO, and it is asked again after
//! [`RETRY_FIRST`], twice as long each time up to [`RETRY_MAX`], until it
//! answers or a resumed session shows it ([`ask_until`]).

use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, Incoming, Outgoing, QoS};

use crate::config::MqttSettings;
use crate::front::window::Numbering;

/// The whole exchange, at most.
pub(crate) const ASK_FOR: Duration = Duration::from_secs(10);

/// The first wait before asking again.
pub(crate) const RETRY_FIRST: Duration = Duration::from_secs(5);
/// The longest wait between two askings.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(600);

/// Asks until the broker answers, or `known` says a session showed it
/// meanwhile (then `None`).
pub(crate) async fn ask_until(mqtt: &MqttSettings, known: impl Fn() -> bool) -> Option<Numbering> {
    let mut wait = RETRY_FIRST;
    let mut said = false;
    loop {
        match ask(mqtt).await {
            Ok(n) => return Some(n),
            Err(e) if !said => {
                said = true;
                tracing::info!(error = %e, retry_in = ?wait, "Could not ask the broker how it numbers its resends; asking again. Until then, or a resumed session shows it, a resend is recognised only where its payload tells (a duplicate rather than a loss).");
            }
            Err(e) => {
                tracing::debug!(error = %e, retry_in = ?wait, "The broker did not say how it numbers its resends.")
            }
        }
        tokio::time::sleep(wait).await;
        if known() {
            return None;
        }
        wait = (wait * 2).min(RETRY_MAX);
    }
}

/// The probe's session id and topic for a palletd of `client_id`.
fn names(client_id: &str) -> (String, String) {
    (
        format!("{client_id}-resends"),
        format!(
            "palletd/probe/{}/resends",
            client_id.replace(['/', '+', '#'], "_")
        ),
    )
}

/// How the broker numbers its resends.
pub(crate) async fn ask(mqtt: &MqttSettings) -> Result<Numbering, String> {
    tokio::time::timeout(ASK_FOR, exchange(mqtt))
        .await
        .map_err(|_| format!("no answer within {ASK_FOR:?}"))?
}

fn connect(mqtt: &MqttSettings, id: &str, clean: bool) -> Result<(AsyncClient, EventLoop), String> {
    let mut opts = super::mqtt_options(mqtt, id).map_err(|e| e.to_string())?;
    opts.set_clean_session(clean).set_manual_acks(true);
    Ok(AsyncClient::new(opts, 16))
}

/// The next packet the broker sends (or the client's DISCONNECT going
/// out).
async fn next(el: &mut EventLoop) -> Result<Event, String> {
    el.poll().await.map_err(|e| e.to_string())
}

async fn exchange(mqtt: &MqttSettings) -> Result<Numbering, String> {
    let (id, topic) = names(&mqtt.client_id);
    // Whatever an earlier probe left goes: the ids start at 1.
    forget(mqtt, &id).await?;
    let (client, mut el) = connect(mqtt, &id, false)?;
    let mut held = None;
    while held.is_none() {
        match next(&mut el).await? {
            Event::Incoming(Incoming::ConnAck(_)) => client
                .try_subscribe(&topic, QoS::AtLeastOnce)
                .map_err(|e| e.to_string())?,
            Event::Incoming(Incoming::SubAck(ack)) => {
                if ack
                    .return_codes
                    .contains(&rumqttc::SubscribeReasonCode::Failure)
                {
                    return Err(format!("the broker refused a subscription of {topic}"));
                }
                for payload in ["1", "2"] {
                    client
                        .try_publish(&topic, QoS::AtLeastOnce, false, payload)
                        .map_err(|e| e.to_string())?;
                }
            }
            Event::Incoming(Incoming::Publish(p)) if p.payload.as_ref() == b"1" => {
                client.try_ack(&p).map_err(|e| e.to_string())?
            }
            Event::Incoming(Incoming::Publish(p)) if p.payload.as_ref() == b"2" => {
                held = Some(p.pkid)
            }
            _ => {}
        }
    }
    disconnect(&client, &mut el).await?;
    // The second again, resent: under which id?
    let (client, mut el) = connect(mqtt, &id, false)?;
    let numbering = loop {
        match next(&mut el).await? {
            Event::Incoming(Incoming::ConnAck(ack)) if !ack.session_present => {
                return Err("the broker kept no session for the probe".into())
            }
            Event::Incoming(Incoming::Publish(p)) if p.payload.as_ref() == b"2" => {
                client.try_ack(&p).map_err(|e| e.to_string())?;
                break match Some(p.pkid) == held {
                    true => Numbering::Kept,
                    false => Numbering::Renumbered,
                };
            }
            _ => {}
        }
    };
    client.try_unsubscribe(&topic).map_err(|e| e.to_string())?;
    loop {
        if let Event::Incoming(Incoming::UnsubAck(_)) = next(&mut el).await? {
            break;
        }
    }
    disconnect(&client, &mut el).await?;
    forget(mqtt, &id).await?;
    Ok(numbering)
}

/// Disconnects cleanly (what was queued before goes out first).
async fn disconnect(client: &AsyncClient, el: &mut EventLoop) -> Result<(), String> {
    client.try_disconnect().map_err(|e| e.to_string())?;
    loop {
        if let Event::Outgoing(Outgoing::Disconnect) = next(el).await? {
            return Ok(());
        }
    }
}

/// The probe's session, removed: a clean session's connect.
async fn forget(mqtt: &MqttSettings, id: &str) -> Result<(), String> {
    let (client, mut el) = connect(mqtt, id, true)?;
    loop {
        if let Event::Incoming(Incoming::ConnAck(_)) = next(&mut el).await? {
            break;
        }
    }
    disconnect(&client, &mut el).await
}
