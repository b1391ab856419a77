//! MQTT 5 (`[mqtt] protocol = "5"`): rumqttc's v5 client behind the same
//! [`super::Client`] and [`super::Event`] the 3.1.1 client is seen
//! through, so the event loop in [`super::Connection::run`], the
//! acknowledgements and the redelivery recognition are one for both.
//!
//! What MQTT 5 adds here:
//! - the session is kept `mqtt.session_expiry` after the connection drops
//!   (clean start off), not for ever as a 3.1.1 broker keeps it;
//! - the client's Receive Maximum (`mqtt.receive_maximum`) tells the broker
//!   how many unacknowledged messages it may send, whatever its own
//!   default window for 3.1.1 clients;
//! - the CONNACK's reason code and the broker's limits (maximum packet
//!   size, receive maximum, topic alias maximum, session expiry) are
//!   logged at connect; rumqttc honours the broker's receive maximum and
//!   maximum packet size for what palletd sends (PUBACKs are small, a
//!   Sparkplug rebirth request is too), and palletd asks for no topic
//!   aliases (its topic alias maximum is 0), so every PUBLISH names its
//!   topic;
//! - a message's user properties and content type go to the decoder
//!   ([`crate::decode::Properties`]);
//! - SUBACK and server DISCONNECT reason codes are logged by name.

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{
    ConnAck, Filter, Packet, Publish, PublishProperties, SubscribeReasonCode,
};
use rumqttc::v5::mqttbytes::QoS as QoS5;
use rumqttc::{Outgoing, QoS};
use tracing::{info, warn};

use super::{tls, Event, Incoming};
use crate::config::MqttSettings;
use crate::decode::Properties;

/// The v5 client and event loop for `client_id`.
pub(super) fn connect(
    mqtt: &MqttSettings,
    client_id: &str,
    capacity: usize,
) -> Result<(rumqttc::v5::AsyncClient, rumqttc::v5::EventLoop), tls::TlsError> {
    let mut opts = rumqttc::v5::MqttOptions::new(client_id, mqtt.host.clone(), mqtt.port);
    opts.set_keep_alive(mqtt.keep_alive)
        .set_clean_start(false)
        .set_manual_acks(true)
        .set_session_expiry_interval(Some(
            mqtt.session_expiry.as_secs().min(u32::MAX as u64) as u32
        ))
        .set_receive_maximum(Some(mqtt.receive_maximum))
        .set_max_packet_size(Some(mqtt.max_packet_size.min(u32::MAX as usize) as u32))
        .set_outgoing_inflight_upper_limit(super::OUTGOING_INFLIGHT)
        .set_request_channel_capacity(capacity);
    if let Some((user, pass)) = super::credentials(mqtt) {
        opts.set_credentials(user, pass);
    }
    if let Some(t) = &mqtt.tls {
        opts.set_transport(super::tls_transport(t)?);
    }
    Ok(rumqttc::v5::AsyncClient::new(opts, capacity))
}

/// One v5 event as the event loop sees either protocol's.
pub(super) fn event(ev: rumqttc::v5::Event) -> Event {
    match ev {
        rumqttc::v5::Event::Incoming(Packet::ConnAck(ack)) => {
            log_connack(&ack);
            Event::ConnAck {
                session_present: ack.session_present,
            }
        }
        rumqttc::v5::Event::Incoming(Packet::SubAck(ack)) => Event::SubAck(
            ack.return_codes
                .iter()
                .map(|c| match c {
                    SubscribeReasonCode::Success(q) => Ok(*q as u8),
                    refused => Err(format!("{refused:?}")),
                })
                .collect(),
        ),
        rumqttc::v5::Event::Incoming(Packet::UnsubAck(_)) => Event::UnsubAck,
        rumqttc::v5::Event::Incoming(Packet::Publish(p)) => Event::Publish(incoming(p)),
        rumqttc::v5::Event::Incoming(Packet::Disconnect(d)) => {
            warn!(
                reason = ?d.reason_code,
                reason_string = d.properties.as_ref().and_then(|p| p.reason_string.as_deref()).unwrap_or(""),
                "The MQTT broker sent a DISCONNECT."
            );
            Event::Other
        }
        rumqttc::v5::Event::Outgoing(Outgoing::Disconnect) => Event::Disconnected,
        _ => Event::Other,
    }
}

fn log_connack(ack: &ConnAck) {
    let p = ack.properties.as_ref();
    info!(
        reason = ?ack.code,
        session_present = ack.session_present,
        receive_maximum = ?p.and_then(|p| p.receive_max),
        maximum_packet_size = ?p.and_then(|p| p.max_packet_size),
        topic_alias_maximum = ?p.and_then(|p| p.topic_alias_max),
        session_expiry = ?p.and_then(|p| p.session_expiry_interval),
        shared_subscriptions = ?p.and_then(|p| p.shared_subscription_available),
        maximum_qos = ?p.and_then(|p| p.max_qos),
        "MQTT 5 CONNACK: the broker's limits (none named: the protocol's defaults)."
    );
}

fn incoming(p: Publish) -> Incoming {
    let topic = match String::from_utf8(p.topic.to_vec()) {
        Ok(t) => t,
        // MQTT topics are UTF-8; a broker that sends otherwise gets its
        // topic read lossily (it then matches no subscription: a dead
        // letter, never a crash).
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    };
    Incoming {
        topic,
        payload: p.payload,
        qos: match p.qos {
            QoS5::AtMostOnce => QoS::AtMostOnce,
            QoS5::AtLeastOnce => QoS::AtLeastOnce,
            QoS5::ExactlyOnce => QoS::ExactlyOnce,
        },
        pkid: p.pkid,
        dup: p.dup,
        retain: p.retain,
        props: p.properties.and_then(properties),
    }
}

/// What the decoder may read of a PUBLISH's properties (`None` when
/// there is nothing of it).
fn properties(p: PublishProperties) -> Option<Box<Properties>> {
    if p.user_properties.is_empty() && p.content_type.is_none() {
        return None;
    }
    Some(Box::new(Properties {
        user: p.user_properties,
        content_type: p.content_type,
    }))
}

pub(super) fn qos(q: QoS) -> QoS5 {
    match q {
        QoS::AtMostOnce => QoS5::AtMostOnce,
        QoS::AtLeastOnce => QoS5::AtLeastOnce,
        QoS::ExactlyOnce => QoS5::ExactlyOnce,
    }
}

/// A PUBACK (or PUBREC) for packet `pkid`.
pub(super) fn ack_for(q: QoS, pkid: u16) -> Publish {
    let mut p = Publish::new("", qos(q), Bytes::new(), None);
    p.pkid = pkid;
    p
}

/// A subscription's filter: the broker sends the topics' retained values
/// only when the subscription is new to the session (Retain Handling 1),
/// not on the SUBSCRIBE palletd repeats on every connect.
pub(super) fn filter(path: &str, q: QoS) -> Filter {
    let mut f = Filter::new(path, qos(q));
    f.retain_forward_rule = rumqttc::v5::mqttbytes::v5::RetainForwardRule::OnNewSubscribe;
    f
}

/// The connection error, described (a refusal names its reason code).
pub(super) fn describe(e: &rumqttc::v5::ConnectionError) -> String {
    match e {
        rumqttc::v5::ConnectionError::ConnectionRefused(code) => {
            format!("broker refused the connection: {code:?}")
        }
        other => other.to_string(),
    }
}
