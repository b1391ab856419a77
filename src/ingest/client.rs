//! The MQTT client behind one connection, over either protocol version
//! (rumqttc's 3.1.1 and v5 clients): [`Client`] to act, a link to poll
//! for events, and the options a connection starts with ([`mqtt_options`]).

use super::*;

/// The client half of either protocol's connection: what the admission
/// and the event loop ask of it, never blocking.
#[derive(Clone)]
pub(crate) enum Client {
    V311(AsyncClient),
    V5(rumqttc::v5::AsyncClient),
}

impl Client {
    /// Queues the acknowledgement; false if the request channel is full.
    pub(super) fn try_ack(&self, t: AckToken) -> bool {
        match self {
            Client::V311(c) => {
                let mut p = rumqttc::Publish::new("", t.qos, Vec::new());
                p.pkid = t.pkid;
                c.try_ack(&p).is_ok()
            }
            Client::V5(c) => c.try_ack(&v5::ack_for(t.qos, t.pkid)).is_ok(),
        }
    }

    /// Queues a PUBLISH; false if the request channel is full.
    pub(super) fn try_publish(&self, topic: String, qos: QoS, payload: Vec<u8>) -> bool {
        match self {
            Client::V311(c) => c.try_publish(topic, qos, false, payload).is_ok(),
            Client::V5(c) => c.try_publish(topic, v5::qos(qos), false, payload).is_ok(),
        }
    }

    pub(super) fn try_subscribe(&self, filters: &[(String, QoS)]) -> Result<(), String> {
        match self {
            Client::V311(c) => c
                .try_subscribe_many(
                    filters
                        .iter()
                        .map(|(f, q)| rumqttc::SubscribeFilter::new(f.clone(), *q)),
                )
                .map_err(|e| e.to_string()),
            Client::V5(c) => c
                .try_subscribe_many(filters.iter().map(|(f, q)| v5::filter(f, *q)))
                .map_err(|e| e.to_string()),
        }
    }

    pub(super) fn try_unsubscribe(&self, filter: &str) -> Result<(), String> {
        match self {
            Client::V311(c) => c.try_unsubscribe(filter).map_err(|e| e.to_string()),
            Client::V5(c) => c.try_unsubscribe(filter).map_err(|e| e.to_string()),
        }
    }

    pub(super) fn try_disconnect(&self) -> bool {
        match self {
            Client::V311(c) => c.try_disconnect().is_ok(),
            Client::V5(c) => c.try_disconnect().is_ok(),
        }
    }
}

/// The event loop of either protocol (one per process: the size of the
/// larger one is no matter).
#[allow(clippy::large_enum_variant)]
pub(super) enum Link {
    V311(EventLoop),
    V5(rumqttc::v5::EventLoop),
}

/// What the event loop reacts to, whichever the protocol.
pub(super) enum Event {
    ConnAck {
        session_present: bool,
    },
    /// Per filter: the granted QoS, or why the broker refused it.
    SubAck(Vec<Result<u8, String>>),
    /// The broker took a filter off the session (one per UNSUBSCRIBE).
    UnsubAck,
    Publish(Incoming),
    /// palletd's own DISCONNECT went out.
    Disconnected,
    Other,
}

/// A PUBLISH as received, whichever the protocol.
pub(super) struct Incoming {
    pub(super) topic: String,
    pub(super) payload: bytes::Bytes,
    pub(super) qos: QoS,
    pub(super) pkid: u16,
    pub(super) dup: bool,
    pub(super) retain: bool,
    pub(super) props: Option<Box<crate::decode::Properties>>,
}

impl Link {
    /// The connection failed: the SUBSCRIBEs and UNSUBSCRIBEs the client
    /// still held for it are not sent on the next one (rumqttc would send
    /// them after the next CONNACK, before palletd read it); the session
    /// decides again what to subscribe once it did.
    pub(super) fn forget_subscriptions(&mut self) {
        match self {
            Link::V311(l) => l.pending.retain(|r| {
                !matches!(
                    r,
                    rumqttc::Request::Subscribe(_) | rumqttc::Request::Unsubscribe(_)
                )
            }),
            Link::V5(l) => l.pending.retain(|r| {
                !matches!(
                    r,
                    rumqttc::v5::Request::Subscribe(_) | rumqttc::v5::Request::Unsubscribe(_)
                )
            }),
        }
    }

    /// The connection failed: the PUBACKs still in the client's channel
    /// are dropped (rumqttc's `EventLoop::clean`, which its poll already
    /// did at the failure; again here, under the connection's lock, for
    /// any handed over since: see [`super::Generations`]).
    pub(super) fn clean(&mut self) {
        match self {
            Link::V311(l) => l.clean(),
            Link::V5(l) => l.clean(),
        }
    }

    /// The next event; an error is the connection's failure, described.
    pub(super) async fn poll(&mut self) -> Result<Event, String> {
        match self {
            Link::V311(l) => l.poll().await.map(event).map_err(|e| describe(&e)),
            Link::V5(l) => l.poll().await.map(v5::event).map_err(|e| v5::describe(&e)),
        }
    }
}

/// One 3.1.1 event as the event loop sees either protocol's.
pub(super) fn event(ev: rumqttc::Event) -> Event {
    match ev {
        rumqttc::Event::Incoming(Packet::ConnAck(ack)) => Event::ConnAck {
            session_present: ack.session_present,
        },
        rumqttc::Event::Incoming(Packet::SubAck(ack)) => Event::SubAck(
            ack.return_codes
                .iter()
                .map(|c| match c {
                    rumqttc::SubscribeReasonCode::Success(q) => Ok(*q as u8),
                    rumqttc::SubscribeReasonCode::Failure => Err("Failure".to_string()),
                })
                .collect(),
        ),
        rumqttc::Event::Incoming(Packet::UnsubAck(_)) => Event::UnsubAck,
        rumqttc::Event::Incoming(Packet::Publish(p)) => Event::Publish(Incoming {
            topic: p.topic,
            payload: p.payload,
            qos: p.qos,
            pkid: p.pkid,
            dup: p.dup,
            retain: p.retain,
            props: None,
        }),
        rumqttc::Event::Outgoing(Outgoing::Disconnect) => Event::Disconnected,
        _ => Event::Other,
    }
}

/// User name and password, if a user name is set (either protocol).
pub(super) fn credentials(mqtt: &MqttSettings) -> Option<(String, String)> {
    let user = mqtt.username.clone()?;
    let pass = mqtt.password.as_ref().map(|p| p.expose().to_string());
    Some((user, pass.unwrap_or_default()))
}

/// The transport for `mqtts://` (either protocol).
pub(super) fn tls_transport(
    t: &crate::config::MqttTls,
) -> Result<rumqttc::Transport, tls::TlsError> {
    if t.insecure_skip_verify {
        warn!("mqtt.tls.insecure_skip_verify is on: the broker's certificate is NOT verified. Never use this in production.");
    }
    let config = tls::client_config(t)?;
    Ok(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
        Arc::new(config),
    )))
}

/// palletd's own QoS 1 messages in flight at once (the client's window for
/// what it publishes: the probe, Sparkplug B rebirth requests), whatever
/// the broker's window for what it sends palletd (`mqtt.max_inflight`):
/// rumqttc keeps a slot for each.
pub(super) const OUTGOING_INFLIGHT: u16 = 64;

/// Capacity of rumqttc's request channel: one slot for every packet id that
/// can be in flight, plus subscriptions and the disconnect.
pub(super) const REQUEST_CAPACITY: usize = 65_536 + 64;

/// Connection options shared by the daemon and the simulator: broker
/// address, keep-alive, packet size, credentials and TLS.
pub(crate) fn mqtt_options(
    mqtt: &MqttSettings,
    client_id: &str,
) -> Result<MqttOptions, tls::TlsError> {
    let mut opts = MqttOptions::new(client_id, mqtt.host.clone(), mqtt.port);
    opts.set_keep_alive(mqtt.keep_alive)
        .set_max_packet_size(mqtt.max_packet_size, mqtt.max_packet_size);
    if let Some((user, pass)) = credentials(mqtt) {
        opts.set_credentials(user, pass);
    }
    if let Some(t) = &mqtt.tls {
        opts.set_transport(tls_transport(t)?);
    }
    Ok(opts)
}
