//! Owns the rumqttc event loop: connect, subscribe, reconnect, and hand each
//! PUBLISH to the pipeline. Acknowledgements are sent by the pipeline through
//! [`Acker`] (a non-blocking `try_ack` into rumqttc's request channel); this
//! task never awaits an ack or a subscribe, so it always keeps polling, and
//! the keep-alive and the PUBACKs go out even while the database is slow.
//!
//! Session: clean session off under the configured client id, so the broker
//! keeps unacknowledged messages across disconnects and restarts. The
//! subscriptions are made on the first connect of each run and after every
//! CONNACK without a session. A subscription that an earlier configuration
//! made stays in the broker's session; its messages go to the dead letter as
//! `unknown_topic`.
//!
//! Backpressure: the hand-off channel is bounded. The broker sends at most
//! its in-flight window of unacknowledged QoS 1/2 messages, which the channel
//! holds; if a broker ignores that window the task waits on the channel, which
//! stops reading from the socket.

pub mod acks;

use std::time::Duration;

use rumqttc::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use std::sync::Arc;

use crate::config::{MqttSettings, Subscription};
use crate::telemetry::{self, Health};
use crate::writer::Backoff;

/// One received PUBLISH, as the pipeline sees it.
#[derive(Debug)]
pub struct Message {
    pub topic: String,
    pub payload: bytes::Bytes,
    /// `None` for QoS 0 (nothing to acknowledge).
    pub ack: Option<AckToken>,
    pub received_ms: i64,
}

/// What is needed to acknowledge a PUBLISH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckToken {
    qos: QoS,
    pkid: u16,
}

/// Sends acknowledgements without ever blocking.
#[derive(Clone)]
pub struct Acker {
    client: AsyncClient,
}

impl Acker {
    pub fn ack(&self, token: AckToken) {
        let mut p = rumqttc::Publish::new("", token.qos, Vec::new());
        p.pkid = token.pkid;
        if let Err(e) = self.client.try_ack(&p) {
            // The request channel holds one slot per possible packet id, so
            // this only happens when the event loop is gone (shutdown).
            warn!(error = %e, pkid = token.pkid, "Could not queue an acknowledgement; the broker will redeliver.");
        }
    }
}

/// Capacity of rumqttc's request channel: one slot for every packet id that
/// can be in flight, plus subscriptions and the disconnect.
const REQUEST_CAPACITY: usize = 65_536 + 64;

/// The MQTT client and its event loop, not yet connected.
pub struct Connection {
    client: AsyncClient,
    eventloop: EventLoop,
    filters: Vec<(String, QoS)>,
}

impl Connection {
    pub fn new(mqtt: &MqttSettings, subscriptions: &[Subscription]) -> Self {
        let mut opts = MqttOptions::new(mqtt.client_id.clone(), mqtt.host.clone(), mqtt.port);
        opts.set_keep_alive(mqtt.keep_alive)
            .set_clean_session(false)
            .set_manual_acks(true)
            .set_max_packet_size(mqtt.max_packet_size, mqtt.max_packet_size)
            .set_inflight(mqtt.max_inflight.clamp(1, u16::MAX as usize) as u16)
            .set_request_channel_capacity(REQUEST_CAPACITY);
        if let (Some(user), Some(pass)) = (&mqtt.username, &mqtt.password) {
            opts.set_credentials(user.clone(), pass.expose().to_string());
        } else if let Some(user) = &mqtt.username {
            opts.set_credentials(user.clone(), "");
        }
        let (client, eventloop) = AsyncClient::new(opts, REQUEST_CAPACITY);
        let filters = subscriptions
            .iter()
            .map(|s| (s.pattern.filter(), qos(s.qos)))
            .collect();
        Connection {
            client,
            eventloop,
            filters,
        }
    }

    pub fn acker(&self) -> Acker {
        Acker {
            client: self.client.clone(),
        }
    }

    /// Runs the event loop until `done` (the pipeline finished: disconnect
    /// cleanly) or `abort` (give up now). After `stop`, new messages are no
    /// longer handed on: they stay unacknowledged and the broker keeps them.
    pub async fn run(
        mut self,
        tx: mpsc::Sender<Message>,
        stop: CancellationToken,
        done: CancellationToken,
        abort: CancellationToken,
        health: Arc<Health>,
    ) {
        let mut backoff = Backoff::default();
        // Shows the loop is alive while the broker is quiet (it polls
        // only on traffic and keep-alive pings).
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut down_since: Option<std::time::Instant> = None;
        let mut disconnecting = false;
        let mut subscribed = false;
        loop {
            let event = tokio::select! {
                _ = abort.cancelled() => return,
                _ = done.cancelled(), if !disconnecting => {
                    disconnecting = true;
                    if self.client.try_disconnect().is_err() {
                        return;
                    }
                    continue;
                }
                _ = beat.tick() => {
                    health.ingest_beat();
                    continue;
                }
                ev = self.eventloop.poll() => ev,
            };
            health.ingest_beat();
            match event {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    backoff = Backoff::default();
                    health.set_broker_connected(true);
                    match down_since.take() {
                        Some(t) => {
                            metrics::counter!(telemetry::BROKER_RECONNECTS).increment(1);
                            info!(
                            session_present = ack.session_present,
                            after = ?Duration::from_secs(t.elapsed().as_secs()),
                            "Reconnected to the MQTT broker."
                            )
                        }
                        None => info!(
                            session_present = ack.session_present,
                            "Connected to the MQTT broker."
                        ),
                    }
                    // Subscribe on this process's first connect (the config
                    // may have changed since the session was made) and
                    // whenever the broker kept no session. Not on every
                    // reconnect: each subscribe re-sends retained messages.
                    if !ack.session_present || !subscribed {
                        subscribed = true;
                        let subs = self
                            .filters
                            .iter()
                            .map(|(f, q)| rumqttc::SubscribeFilter::new(f.clone(), *q));
                        if let Err(e) = self.client.try_subscribe_many(subs) {
                            error!(error = %e, "Could not queue the subscriptions.");
                        }
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) => {
                    for (code, (filter, _)) in ack.return_codes.iter().zip(&self.filters) {
                        match code {
                            rumqttc::SubscribeReasonCode::Success(q) => {
                                info!(%filter, qos = ?q, "Subscribed.")
                            }
                            rumqttc::SubscribeReasonCode::Failure => {
                                error!(%filter, "The broker refused the subscription; check its ACLs.")
                            }
                        }
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if stop.is_cancelled() {
                        continue;
                    }
                    tracing::trace!(topic = %p.topic, pkid = p.pkid, "Message received.");
                    metrics::counter!(telemetry::MESSAGES_RECEIVED).increment(1);
                    let ack = (p.qos != QoS::AtMostOnce).then_some(AckToken {
                        qos: p.qos,
                        pkid: p.pkid,
                    });
                    let msg = Message {
                        topic: p.topic,
                        payload: p.payload,
                        ack,
                        received_ms: crate::now_ms(),
                    };
                    tokio::select! {
                        r = tx.send(msg) => if r.is_err() { debug!("Pipeline closed; message left to the broker."); },
                        _ = stop.cancelled() => {}
                    }
                }
                Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                    health.set_broker_connected(false);
                    info!("Disconnected from the MQTT broker.");
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    health.set_broker_connected(false);
                    if disconnecting {
                        return;
                    }
                    if down_since.is_none() {
                        down_since = Some(std::time::Instant::now());
                        warn!(error = %describe(&e), "MQTT connection lost or refused; reconnecting with backoff.");
                    } else {
                        debug!(error = %describe(&e), "MQTT reconnect failed.");
                    }
                    let delay = backoff.next_delay();
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = abort.cancelled() => return,
                        _ = done.cancelled() => return,
                    }
                }
            }
        }
    }
}

fn describe(e: &ConnectionError) -> String {
    match e {
        ConnectionError::ConnectionRefused(code) => {
            format!("broker refused the connection: {code:?}")
        }
        other => other.to_string(),
    }
}

fn qos(q: u8) -> QoS {
    match q {
        0 => QoS::AtMostOnce,
        2 => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    }
}
