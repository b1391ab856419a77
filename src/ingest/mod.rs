//! Owns the rumqttc event loop: connect, subscribe, reconnect, and hand each
//! PUBLISH to the admission. MQTT 3.1.1 and MQTT 5 (`[mqtt] protocol`) run
//! through the same loop: [`Client`], `Link` and `Event` are what either
//! protocol's client is seen as, and `v5.rs` holds what MQTT 5 adds.
//! Acknowledgements are sent by the admission through [`Acker`] (a
//! non-blocking `try_ack` into rumqttc's request channel) once a message is
//! durable in the spool; this task never awaits an ack or a subscribe, so
//! it always keeps polling, and the keep-alive and the PUBACKs go out even
//! while the spool or the database is slow.
//!
//! Session: clean session off under the configured client id, so the broker
//! keeps unacknowledged messages across disconnects and restarts (MQTT 5:
//! clean start off, the session kept `mqtt.session_expiry`). The
//! subscriptions are made on the first connect of each run and after every
//! CONNACK without a session. A subscription that an earlier configuration
//! made stays in the broker's session; its messages go to the dead letter as
//! `unknown_topic`.
//!
//! Backpressure: the hand-off channel is bounded. When it is full, messages
//! wait in a local queue while the event loop keeps being polled (so pings
//! and PUBACKs still flow and the connection stays up); unacknowledged QoS 1/2
//! messages are bounded by the broker's in-flight window and by the 16-bit
//! packet ids. Only past 65,536 waiting messages (a QoS 0 flood) does the task
//! stop reading from the socket.

pub mod tls;
mod v5;

use std::time::Duration;

use rumqttc::{AsyncClient, ConnectionError, EventLoop, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::now_ms;
use crate::config::{MqttProtocol, MqttSettings};
use crate::decode::Subscription;
use crate::retry::Backoff;
use crate::telemetry::{self, Health};

/// One received PUBLISH, as the admission sees it.
#[derive(Debug)]
pub struct Message {
    pub topic: String,
    pub payload: bytes::Bytes,
    /// `None` for QoS 0 (nothing to acknowledge).
    pub ack: Option<AckToken>,
    pub received_ms: i64,
    /// Packet id and digest of topic and payload (QoS 1/2), spooled so that
    /// a redelivery after a restart can be recognised.
    pub id: Option<(u16, u64)>,
    /// A redelivery of a message already spooled: acknowledge, store nothing.
    pub duplicate: bool,
    /// MQTT 5: the user properties and content type the decoder may read.
    pub props: Option<Box<crate::decode::Properties>>,
}

impl Message {
    /// Bytes it holds while it waits for the admission (payload, topic, and
    /// the message itself).
    pub fn cost(&self) -> usize {
        let props = self.props.as_ref().map_or(0, |p| {
            p.user
                .iter()
                .map(|(k, v)| k.len() + v.len() + 48)
                .sum::<usize>()
                + p.content_type.as_ref().map_or(0, String::len)
        });
        self.payload.len() + self.topic.len() + props + std::mem::size_of::<Message>()
    }
}

/// FNV-1a over topic and payload: a stable digest to recognise redeliveries.
pub fn digest(topic: &str, payload: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in topic.as_bytes().iter().chain([0u8].iter()).chain(payload) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Recognises redeliveries of messages palletd already spooled.
///
/// A broker resends unacknowledged QoS 1/2 messages after a reconnect with
/// the same packet id and the DUP flag (MQTT 3.1.1 §4.4). Acknowledgements
/// can be lost on the way (rumqttc drops queued PUBACKs when the connection
/// breaks, or palletd was killed right after spooling), so a resent message
/// may already be in the spool. `previous` holds the packet ids and digests
/// of messages received before the last (re)connect, including those
/// recovered from the spool at start; a DUP message matching one of them is
/// a redelivery. Without a kept session the broker resends nothing, and the
/// memory is cleared.
#[derive(Debug)]
pub struct Redeliveries {
    /// A digest per packet id (`0`: none), of messages received before the
    /// last (re)connect, and since: two fixed tables of 512 KiB, whatever
    /// the traffic (packet ids cycle through all 65,535 values, so maps of
    /// them grew to that size anyway, with their rehashing on top).
    previous: Box<[u64]>,
    current: Box<[u64]>,
}

/// The table's entry for a digest: never 0, which marks none.
fn entry(digest: u64) -> u64 {
    digest.max(1)
}

impl Redeliveries {
    pub fn new(recovered: HashMap<u16, u64>) -> Self {
        let mut previous = vec![0u64; 1 << 16].into_boxed_slice();
        for (pkid, digest) in recovered {
            previous[pkid as usize] = entry(digest);
        }
        Redeliveries {
            previous,
            current: vec![0u64; 1 << 16].into_boxed_slice(),
        }
    }

    pub fn connected(&mut self, session_present: bool) {
        for (p, c) in self.previous.iter_mut().zip(self.current.iter_mut()) {
            if !session_present {
                *p = 0;
            } else if *c != 0 {
                *p = *c;
            }
            *c = 0;
        }
    }

    /// Whether this message was spooled before; remembers it if not.
    pub fn is_redelivery(&mut self, pkid: u16, dup: bool, digest: u64) -> bool {
        let (i, d) = (pkid as usize, entry(digest));
        // A resend arrives with DUP and the packet id it had: after a
        // reconnect (previous) or, from some brokers, within the connection
        // when the PUBACK is late (current).
        let redelivery = dup && (self.previous[i] == d || self.current[i] == d);
        if redelivery {
            self.previous[i] = 0;
        }
        // Remembered either way: it may be resent once more after another
        // reconnect if this acknowledgement is lost too.
        self.current[i] = d;
        redelivery
    }
}

/// What is needed to acknowledge a PUBLISH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckToken {
    qos: QoS,
    pkid: u16,
}

/// Sends acknowledgements without ever blocking, in order.
///
/// rumqttc's request channel can fill when the broker sends faster than the
/// event loop writes PUBACKs; an acknowledgement that does not fit waits
/// here (with every later one behind it, to keep arrival order) and is
/// retried by [`Acker::retry`], never dropped.
pub struct Acker {
    client: Client,
    waiting: std::collections::VecDeque<AckToken>,
}

impl Acker {
    pub fn ack(&mut self, token: AckToken) {
        self.waiting.push_back(token);
        self.retry();
    }

    /// Queues the waiting acknowledgements that now fit; true when none waits.
    pub fn retry(&mut self) -> bool {
        while let Some(token) = self.waiting.front().copied() {
            if !self.client.try_ack(token) {
                // Full (or, at shutdown, closed): try again later.
                return false;
            }
            self.waiting.pop_front();
        }
        true
    }

    /// Publishes a message at QoS 0 without waiting; false if the client's
    /// queue is full (the message is not sent).
    pub fn publish_nowait(&self, topic: String, payload: Vec<u8>) -> bool {
        self.client.try_publish(topic, payload)
    }

    /// Acknowledgements not yet handed to the event loop.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// The client half of either protocol's connection: what the admission
/// and the event loop ask of it, never blocking.
#[derive(Clone)]
pub enum Client {
    V311(AsyncClient),
    V5(rumqttc::v5::AsyncClient),
}

impl Client {
    /// Queues the acknowledgement; false if the request channel is full.
    fn try_ack(&self, t: AckToken) -> bool {
        match self {
            Client::V311(c) => {
                let mut p = rumqttc::Publish::new("", t.qos, Vec::new());
                p.pkid = t.pkid;
                c.try_ack(&p).is_ok()
            }
            Client::V5(c) => c.try_ack(&v5::ack_for(t.qos, t.pkid)).is_ok(),
        }
    }

    /// Queues a QoS 0 PUBLISH; false if the request channel is full.
    fn try_publish(&self, topic: String, payload: Vec<u8>) -> bool {
        match self {
            Client::V311(c) => c
                .try_publish(topic, QoS::AtMostOnce, false, payload)
                .is_ok(),
            Client::V5(c) => c
                .try_publish(topic, v5::qos(QoS::AtMostOnce), false, payload)
                .is_ok(),
        }
    }

    fn try_subscribe(&self, filters: &[(String, QoS)]) -> Result<(), String> {
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

    fn try_disconnect(&self) -> bool {
        match self {
            Client::V311(c) => c.try_disconnect().is_ok(),
            Client::V5(c) => c.try_disconnect().is_ok(),
        }
    }
}

/// The event loop of either protocol (one per process: the size of the
/// larger one is no matter).
#[allow(clippy::large_enum_variant)]
enum Link {
    V311(EventLoop),
    V5(rumqttc::v5::EventLoop),
}

/// What the event loop reacts to, whichever the protocol.
enum Event {
    ConnAck {
        session_present: bool,
    },
    /// Per filter: the granted QoS, or why the broker refused it.
    SubAck(Vec<Result<u8, String>>),
    Publish(Incoming),
    /// palletd's own DISCONNECT went out.
    Disconnected,
    Other,
}

/// One poll of the event loop in progress, owning it until it returns.
type Polling =
    std::pin::Pin<Box<dyn std::future::Future<Output = (Link, Result<Event, String>)> + Send>>;

/// A PUBLISH as received, whichever the protocol.
struct Incoming {
    topic: String,
    payload: bytes::Bytes,
    qos: QoS,
    pkid: u16,
    dup: bool,
    props: Option<Box<crate::decode::Properties>>,
}

impl Link {
    /// The next event; an error is the connection's failure, described.
    async fn poll(&mut self) -> Result<Event, String> {
        match self {
            Link::V311(l) => l.poll().await.map(event).map_err(|e| describe(&e)),
            Link::V5(l) => l.poll().await.map(v5::event).map_err(|e| v5::describe(&e)),
        }
    }
}

/// One 3.1.1 event as the event loop sees either protocol's.
fn event(ev: rumqttc::Event) -> Event {
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
        rumqttc::Event::Incoming(Packet::Publish(p)) => Event::Publish(Incoming {
            topic: p.topic,
            payload: p.payload,
            qos: p.qos,
            pkid: p.pkid,
            dup: p.dup,
            props: None,
        }),
        rumqttc::Event::Outgoing(Outgoing::Disconnect) => Event::Disconnected,
        _ => Event::Other,
    }
}

/// User name and password, if a user name is set (either protocol).
fn credentials(mqtt: &MqttSettings) -> Option<(String, String)> {
    let user = mqtt.username.clone()?;
    let pass = mqtt.password.as_ref().map(|p| p.expose().to_string());
    Some((user, pass.unwrap_or_default()))
}

/// The transport for `mqtts://` (either protocol).
fn tls_transport(t: &crate::config::MqttTls) -> Result<rumqttc::Transport, tls::TlsError> {
    if t.insecure_skip_verify {
        warn!("mqtt.tls.insecure_skip_verify is on: the broker's certificate is NOT verified. Never use this in production.");
    }
    let config = tls::client_config(t)?;
    Ok(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
        Arc::new(config),
    )))
}

/// Capacity of rumqttc's request channel: one slot for every packet id that
/// can be in flight, plus subscriptions and the disconnect.
const REQUEST_CAPACITY: usize = 65_536 + 64;

/// Connection options shared by the daemon and the simulator: broker
/// address, keep-alive, packet size, credentials and TLS.
pub fn mqtt_options(mqtt: &MqttSettings, client_id: &str) -> Result<MqttOptions, tls::TlsError> {
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

/// The MQTT client and its event loop, not yet connected.
pub struct Connection {
    client: Client,
    eventloop: Link,
    filters: Vec<(String, QoS)>,
    /// Bytes of messages on their way to the admission.
    queue: Arc<crate::budget::Budget>,
}

impl Connection {
    pub fn new(mqtt: &MqttSettings, subscriptions: &[Subscription]) -> Result<Self, tls::TlsError> {
        let (client, eventloop) = match mqtt.protocol {
            MqttProtocol::V311 => {
                let mut opts = mqtt_options(mqtt, &mqtt.client_id)?;
                opts.set_clean_session(false)
                    .set_manual_acks(true)
                    .set_inflight(mqtt.max_inflight.clamp(1, u16::MAX as usize) as u16)
                    .set_request_channel_capacity(REQUEST_CAPACITY);
                let (c, l) = AsyncClient::new(opts, REQUEST_CAPACITY);
                (Client::V311(c), Link::V311(l))
            }
            MqttProtocol::V5 => {
                let (c, l) = v5::connect(mqtt, &mqtt.client_id, REQUEST_CAPACITY)?;
                (Client::V5(c), Link::V5(l))
            }
        };
        let filters = subscriptions
            .iter()
            .map(|s| {
                let filter = s.pattern.filter();
                let filter = match &mqtt.share_group {
                    Some(group) => format!("$share/{group}/{filter}"),
                    None => filter,
                };
                (filter, qos(s.qos))
            })
            .collect();
        Ok(Connection {
            client,
            eventloop,
            filters,
            queue: Arc::new(crate::budget::Budget::new(usize::MAX)),
        })
    }

    /// Messages received and not yet taken by the admission may hold this
    /// budget's bytes; beyond, the loop stops reading from the broker (the
    /// admission takes them off the budget as it takes them).
    pub fn limit_queue(&mut self, budget: Arc<crate::budget::Budget>) {
        self.queue = budget;
    }

    pub fn acker(&self) -> Acker {
        Acker {
            client: self.client.clone(),
            waiting: Default::default(),
        }
    }

    /// Runs the event loop until `done` (the pipeline finished: disconnect
    /// cleanly) or `abort` (give up now). After `stop`, new messages are no
    /// longer handed on: they stay unacknowledged and the broker keeps them.
    pub async fn run(
        self,
        tx: mpsc::Sender<Message>,
        stop: CancellationToken,
        done: CancellationToken,
        abort: CancellationToken,
        health: Arc<Health>,
        redeliveries: Redeliveries,
    ) {
        let mut session = Session {
            health,
            redeliveries,
            backoff: Backoff::default(),
            down_since: None,
            disconnecting: false,
            subscribed: false,
            overflow: Default::default(),
        };
        // Shows the loop is alive while the broker is quiet (it polls
        // only on traffic and keep-alive pings).
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // rumqttc's poll is not cancel-safe while it connects: dropped
        // between its CONNECT and its CONNACK (when another branch of the
        // select fires), the next poll connects again and the broker sees
        // two connections, the first CONNACK lost. So one poll runs to its
        // end across the loop's turns; it owns the event loop meanwhile.
        let Connection {
            client,
            eventloop,
            filters,
            queue,
        } = self;
        let mut link = Some(eventloop);
        let mut polling: Option<Polling> = None;
        loop {
            let next = polling.get_or_insert_with(|| {
                let mut l = link.take().expect("the event loop, between polls");
                Box::pin(async move {
                    let ev = l.poll().await;
                    (l, ev)
                })
            });
            // While messages wait in `overflow` the loop keeps polling (pings,
            // PUBACKs) and hands them on as the channel makes room.
            let event = tokio::select! {
                _ = abort.cancelled() => return,
                permit = tx.reserve(), if !session.overflow.is_empty() => {
                    session.hand_on_waiting(permit, &queue);
                    continue;
                }
                _ = done.cancelled(), if !session.disconnecting => {
                    session.disconnecting = true;
                    if !client.try_disconnect() {
                        return;
                    }
                    continue;
                }
                _ = beat.tick() => {
                    session.health.ingest_beat();
                    continue;
                }
                // Over its byte budget, the queue to the admission takes no
                // more: reading from the broker waits (the broker keeps
                // what it has not sent; QoS 1 waits in its window).
                _ = queue.room(), if queue.over() => continue,
                (l, ev) = next, if !queue.over() => {
                    link = Some(l);
                    ev
                }
            };
            polling = None;
            session.health.ingest_beat();
            match event {
                Ok(Event::ConnAck { session_present }) => {
                    session.on_connack(session_present, &client, &filters)
                }
                Ok(Event::SubAck(codes)) => session.on_suback(&codes, &filters),
                Ok(Event::Publish(p)) => {
                    if !stop.is_cancelled() {
                        session.on_publish(p, &queue, &tx);
                    }
                }
                Ok(Event::Disconnected) => {
                    session.health.set_broker_connected(false);
                    info!("Disconnected from the MQTT broker.");
                    return;
                }
                Ok(Event::Other) => {}
                Err(e) => {
                    if !session.on_error(&e, &abort, &done).await {
                        return;
                    }
                }
            }
        }
    }
}

/// What the event loop keeps of its MQTT session: the broker's state as
/// seen here, the reconnect backoff, the messages waiting for room.
struct Session {
    health: Arc<Health>,
    redeliveries: Redeliveries,
    backoff: Backoff,
    down_since: Option<std::time::Instant>,
    disconnecting: bool,
    /// The broker acknowledged every subscription (a SUBACK) since this
    /// process started.
    subscribed: bool,
    /// Messages the channel to the admission had no room for yet.
    overflow: std::collections::VecDeque<Message>,
}

impl Session {
    /// Connected: subscribes until the broker acknowledged it on this
    /// process (the config may have changed since the session was made; a
    /// link that dropped before the SUBACK may have lost the SUBSCRIBE),
    /// and whenever the broker kept no session. Not on every reconnect:
    /// each subscribe re-sends retained messages.
    fn on_connack(&mut self, session_present: bool, client: &Client, filters: &[(String, QoS)]) {
        self.backoff = Backoff::default();
        self.health.set_broker_connected(true);
        self.redeliveries.connected(session_present);
        match self.down_since.take() {
            Some(t) => {
                metrics::counter!(telemetry::BROKER_RECONNECTS).increment(1);
                info!(
                    session_present,
                    after = ?Duration::from_secs(t.elapsed().as_secs()),
                    "Reconnected to the MQTT broker."
                )
            }
            None => info!(session_present, "Connected to the MQTT broker."),
        }
        if !session_present || !self.subscribed {
            self.health.set_subscribed(false);
            if let Err(e) = client.try_subscribe(filters) {
                error!(error = %e, "Could not queue the subscriptions.");
            }
        } else {
            // The broker kept the session and its subscriptions.
            self.health.set_subscribed(true);
        }
    }

    fn on_suback(&mut self, codes: &[Result<u8, String>], filters: &[(String, QoS)]) {
        let mut all = true;
        for (code, (filter, _)) in codes.iter().zip(filters) {
            match code {
                Ok(qos) => info!(%filter, qos, "Subscribed."),
                Err(reason) => {
                    all = false;
                    error!(%filter, %reason, "The broker refused the subscription; check its ACLs.")
                }
            }
        }
        self.health.set_subscribed(all);
        self.subscribed = all;
    }

    /// A message for the admission, with its acknowledgement token and
    /// whether it is a redelivery of one already spooled.
    fn on_publish(
        &mut self,
        p: Incoming,
        queue: &crate::budget::Budget,
        tx: &mpsc::Sender<Message>,
    ) {
        tracing::trace!(topic = %p.topic, pkid = p.pkid, "Message received.");
        metrics::counter!(telemetry::MESSAGES_RECEIVED).increment(1);
        let ack = (p.qos != QoS::AtMostOnce).then_some(AckToken {
            qos: p.qos,
            pkid: p.pkid,
        });
        let (id, duplicate) = match ack {
            Some(_) => {
                let d = digest(&p.topic, &p.payload);
                (
                    Some((p.pkid, d)),
                    self.redeliveries.is_redelivery(p.pkid, p.dup, d),
                )
            }
            None => (None, false),
        };
        let msg = Message {
            topic: p.topic,
            payload: p.payload,
            ack,
            received_ms: now_ms(),
            id,
            duplicate,
            props: p.props,
        };
        queue.add(msg.cost());
        if !self.overflow.is_empty() {
            self.overflow.push_back(msg);
            return;
        }
        match tx.try_send(msg) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(m)) => self.overflow.push_back(m),
            Err(mpsc::error::TrySendError::Closed(m)) => {
                queue.sub(m.cost());
                debug!("Admission closed; message left to the broker.")
            }
        }
    }

    /// The channel made room: the oldest waiting message goes on (all are
    /// given up if the admission is gone).
    fn hand_on_waiting(
        &mut self,
        permit: Result<mpsc::Permit<'_, Message>, mpsc::error::SendError<()>>,
        queue: &crate::budget::Budget,
    ) {
        match (permit, self.overflow.pop_front()) {
            (Ok(permit), Some(m)) => permit.send(m),
            _ => {
                for m in self.overflow.drain(..) {
                    queue.sub(m.cost());
                }
            }
        }
    }

    /// The connection failed: logged once per outage, then a backoff.
    /// `false`: stop (disconnecting, done or aborted).
    async fn on_error(
        &mut self,
        e: &str,
        abort: &CancellationToken,
        done: &CancellationToken,
    ) -> bool {
        self.health.set_broker_connected(false);
        if self.disconnecting {
            return false;
        }
        if self.down_since.is_none() {
            self.down_since = Some(std::time::Instant::now());
            warn!(error = %e, "MQTT connection lost or refused; reconnecting with backoff.");
        } else {
            debug!(error = %e, "MQTT reconnect failed.");
        }
        let delay = self.backoff.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = abort.cancelled() => false,
            _ = done.cancelled() => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redeliveries_are_recognised_only_with_dup_and_a_kept_session() {
        let mut r = Redeliveries::new(HashMap::from([(7, 70)]));
        r.connected(true);
        assert!(!r.is_redelivery(7, false, 70), "no DUP flag: a new message");
        assert!(!r.is_redelivery(8, true, 80));
        let mut r = Redeliveries::new(HashMap::from([(7, 70)]));
        r.connected(true);
        assert!(r.is_redelivery(7, true, 70));
        assert!(
            r.is_redelivery(7, true, 70),
            "a resend within the connection is recognised too"
        );
        r.connected(true);
        assert!(
            r.is_redelivery(7, true, 70),
            "and again after another reconnect"
        );
        assert!(!r.is_redelivery(9, true, 99), "first seen, even with DUP");
        // Received in this connection, resent after a reconnect.
        r.connected(true);
        assert!(r.is_redelivery(9, true, 99));
        // A new session: the broker resends nothing old.
        r.is_redelivery(10, false, 100);
        r.connected(false);
        assert!(!r.is_redelivery(10, true, 100));
        assert_ne!(digest("a", b"bc"), digest("ab", b"c"));
    }
}
