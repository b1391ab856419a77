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
//! Connections: `mqtt.connections` sessions, each its own event loop task,
//! in-flight window, ordered PUBACKs ([`Acker`] per connection) and
//! redelivery tables, all handing on to the one admission (one spool, one
//! group commit); which session subscribes what, and how a changed
//! configuration is undone at the broker, is in [`sessions`]. A
//! connection that drops loses nothing: its session keeps its messages
//! and the others go on.
//!
//! Session: clean session off under each connection's client id, so the broker
//! keeps unacknowledged messages across disconnects and restarts (MQTT 5:
//! clean start off, the session kept `mqtt.session_expiry`). Plain
//! subscriptions are made on the first connect of each run and after every
//! CONNACK without a session, shared ones on every connect. A subscription
//! an earlier configuration made is unsubscribed ([`sessions`]); what its
//! session had queued still arrives, and goes to the dead letter as
//! `unknown_topic` when no subscription matches it.
//!
//! Backpressure: the hand-off channel is bounded. When it is full, messages
//! wait in a local queue while the event loop keeps being polled (so pings
//! and PUBACKs still flow and the connection stays up); unacknowledged QoS 1/2
//! messages are bounded by the broker's in-flight window and by the 16-bit
//! packet ids. Only past 65,536 waiting messages (a QoS 0 flood) does the task
//! stop reading from the socket.

mod session;
pub mod sessions;
pub mod tls;
mod v5;

use std::time::Duration;

use rumqttc::{AsyncClient, ConnectionError, EventLoop, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use std::collections::HashMap;
use std::sync::Arc;

use session::Session;

use crate::config::{MqttProtocol, MqttSettings};
use crate::decode::Subscription;
use crate::telemetry::Health;

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
    /// last (re)connect, and since: two fixed tables of 512 KiB per
    /// connection, whatever the traffic (packet ids cycle through all 65,535 values, so maps of
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

/// What is needed to acknowledge a PUBLISH: which connection it came on,
/// and its packet id there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckToken {
    conn: u8,
    qos: QoS,
    pkid: u16,
}

impl AckToken {
    /// The connection the message came on (its index).
    pub fn connection(&self) -> u8 {
        self.conn
    }
}

/// Sends acknowledgements without ever blocking, in order on each
/// connection.
///
/// rumqttc's request channel can fill when the broker sends faster than the
/// event loop writes PUBACKs; an acknowledgement that does not fit waits
/// here (with every later one of its connection behind it, to keep arrival
/// order) and is retried by [`Acker::retry`], never dropped. A connection's
/// full channel holds up no other connection's acknowledgements.
pub struct Acker {
    /// By connection index (`None`: no such connection).
    clients: Vec<Option<Client>>,
    waiting: Vec<std::collections::VecDeque<AckToken>>,
    /// Acknowledgements handed to each connection's event loop.
    acked: Arc<Counters>,
    queued: usize,
}

/// Per connection index: acknowledgements handed to its event loop (a
/// retiring session is done when it has acknowledged all it received).
#[derive(Debug)]
pub struct Counters(Vec<std::sync::atomic::AtomicU64>);

impl Counters {
    fn new() -> Self {
        Counters((0..256).map(|_| Default::default()).collect())
    }

    fn get(&self, conn: usize) -> u64 {
        self.0[conn].load(std::sync::atomic::Ordering::Relaxed)
    }

    fn add(&self, conn: usize) {
        self.0[conn].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Acker {
    pub fn ack(&mut self, token: AckToken) {
        self.waiting[token.conn as usize].push_back(token);
        self.queued += 1;
        self.retry_one(token.conn as usize);
    }

    fn retry_one(&mut self, conn: usize) -> bool {
        let Some(client) = &self.clients[conn] else {
            // Never: a token comes from a connection that exists.
            self.queued -= self.waiting[conn].len();
            self.waiting[conn].clear();
            return true;
        };
        while let Some(token) = self.waiting[conn].front().copied() {
            if !client.try_ack(token) {
                // Full (or, at shutdown, closed): try again later.
                return false;
            }
            self.waiting[conn].pop_front();
            self.queued -= 1;
            self.acked.add(conn);
        }
        true
    }

    /// Queues the waiting acknowledgements that now fit; true when none waits.
    pub fn retry(&mut self) -> bool {
        if self.queued == 0 {
            return true;
        }
        let mut all = true;
        for conn in 0..self.waiting.len() {
            if !self.waiting[conn].is_empty() {
                all &= self.retry_one(conn);
            }
        }
        all
    }

    /// Publishes a message at QoS 0 on the first connection without
    /// waiting; false if the client's queue is full (the message is not
    /// sent).
    pub fn publish_nowait(&self, topic: String, payload: Vec<u8>) -> bool {
        self.clients[0]
            .as_ref()
            .is_some_and(|c| c.try_publish(topic, payload))
    }

    /// Acknowledgements not yet handed to the event loops.
    pub fn waiting(&self) -> usize {
        self.queued
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

    fn try_unsubscribe(&self, filter: &str) -> Result<(), String> {
        match self {
            Client::V311(c) => c.try_unsubscribe(filter).map_err(|e| e.to_string()),
            Client::V5(c) => c.try_unsubscribe(filter).map_err(|e| e.to_string()),
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
    /// The broker took a filter off the session (one per UNSUBSCRIBE).
    UnsubAck,
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
        rumqttc::Event::Incoming(Packet::UnsubAck(_)) => Event::UnsubAck,
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

/// The MQTT sessions palletd opens (`mqtt.connections` of them, and any
/// retiring: see [`sessions`]), not yet connected.
pub struct Connections {
    list: Vec<Connection>,
    acked: Arc<Counters>,
    sessions: sessions::SessionsFile,
}

/// One MQTT client and its event loop, not yet connected.
struct Connection {
    plan: sessions::Planned,
    client: Client,
    eventloop: Link,
    subscribe: Vec<(String, QoS)>,
    /// Its shared subscriptions are of palletd's own group (no
    /// `mqtt.share_group`): refused, it may go on unshared.
    may_unshare: bool,
}

/// What every connection of a process shares.
#[derive(Clone)]
struct Shared {
    tx: mpsc::Sender<Message>,
    stop: CancellationToken,
    done: CancellationToken,
    abort: CancellationToken,
    health: Arc<Health>,
    /// Bytes of messages on their way to the admission.
    queue: Arc<crate::budget::Budget>,
    sessions: Arc<sessions::SessionsFile>,
    acked: Arc<Counters>,
    /// The broker refused a shared subscription: the first connection
    /// subscribes unshared and the others end.
    single: CancellationToken,
}

impl Connections {
    /// The sessions to open by `mqtt` and `subscriptions`, undoing what
    /// the last configuration subscribed by what `spool_dir`'s
    /// `mqtt-sessions.json` says (saved again before any connects).
    pub fn new(
        mqtt: &MqttSettings,
        subscriptions: &[Subscription],
        spool_dir: &std::path::Path,
    ) -> Result<Self, String> {
        let before = sessions::SessionsFile::load(spool_dir, mqtt, subscriptions);
        let plan = sessions::plan(mqtt, subscriptions, &before);
        let sessions = sessions::SessionsFile::start(spool_dir, before, &plan);
        let mut list = Vec::new();
        for p in plan {
            let (client, eventloop) = match mqtt.protocol {
                MqttProtocol::V311 => {
                    let mut opts = mqtt_options(mqtt, &p.client_id).map_err(|e| e.to_string())?;
                    opts.set_clean_session(false)
                        .set_manual_acks(true)
                        .set_inflight(mqtt.max_inflight.clamp(1, u16::MAX as usize) as u16)
                        .set_request_channel_capacity(REQUEST_CAPACITY);
                    let (c, l) = AsyncClient::new(opts, REQUEST_CAPACITY);
                    (Client::V311(c), Link::V311(l))
                }
                MqttProtocol::V5 => {
                    let (c, l) = v5::connect(mqtt, &p.client_id, REQUEST_CAPACITY)
                        .map_err(|e| e.to_string())?;
                    (Client::V5(c), Link::V5(l))
                }
            };
            let subscribe = p
                .subscribe
                .iter()
                .map(|(f, q)| (f.clone(), qos(*q)))
                .collect();
            list.push(Connection {
                plan: p,
                client,
                eventloop,
                subscribe,
                may_unshare: mqtt.share_group.is_none(),
            });
        }
        Ok(Connections {
            list,
            acked: Arc::new(Counters::new()),
            sessions,
        })
    }

    /// The configured connections that opened (retiring ones aside).
    pub fn count(&self) -> usize {
        self.list.iter().filter(|c| !c.plan.retiring).count()
    }

    pub fn acker(&self) -> Acker {
        let mut clients = vec![None; 256];
        for c in &self.list {
            clients[c.plan.index] = Some(c.client.clone());
        }
        Acker {
            clients,
            waiting: (0..256).map(|_| Default::default()).collect(),
            acked: self.acked.clone(),
            queued: 0,
        }
    }

    /// Starts every connection's event loop on `tracker`; each runs until
    /// `done` (the pipeline finished: it disconnects cleanly) or `abort`
    /// (give up now). After `stop`, new messages are no longer handed on:
    /// they stay unacknowledged and the broker keeps them. Messages go to
    /// `tx`, their bytes held in `queue` until the admission takes them.
    pub fn spawn(
        self,
        tracker: &tokio_util::task::TaskTracker,
        tx: mpsc::Sender<Message>,
        queue: Arc<crate::budget::Budget>,
        tokens: [CancellationToken; 3],
        health: Arc<Health>,
        mut recovered: HashMap<(u8, u16), u64>,
    ) {
        let [stop, done, abort] = tokens;
        health.set_connections(self.count());
        let shared = Shared {
            tx,
            stop,
            done,
            abort,
            health,
            queue,
            sessions: Arc::new(self.sessions),
            acked: self.acked,
            single: CancellationToken::new(),
        };
        for c in self.list {
            let index = c.plan.index as u8;
            let mine = recovered
                .extract_if(|(conn, _), _| *conn == index)
                .map(|((_, pkid), d)| (pkid, d))
                .collect();
            tracker.spawn(c.run(shared.clone(), Redeliveries::new(mine)));
        }
    }
}

impl Connection {
    async fn run(self, shared: Shared, redeliveries: Redeliveries) {
        let Connection {
            plan,
            client,
            eventloop,
            subscribe,
            may_unshare,
        } = self;
        let mut session = Session::new(plan, subscribe, may_unshare, redeliveries);
        // Shows the loop is alive while the broker is quiet (it polls
        // only on traffic and keep-alive pings).
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // rumqttc's poll is not cancel-safe while it connects: dropped
        // between its CONNECT and its CONNACK (when another branch of the
        // select fires), the next poll connects again and the broker sees
        // two connections, the first CONNACK lost. So one poll runs to its
        // end across the loop's turns; it owns the event loop meanwhile.
        let mut link = Some(eventloop);
        let mut polling: Option<Polling> = None;
        // A connection other than the first ends when the broker takes no
        // shared subscriptions (the first subscribes unshared instead).
        let mut ends_if_single = session.index > 0 && !session.retiring;
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
                _ = shared.abort.cancelled() => return,
                permit = shared.tx.reserve(), if !session.overflow.is_empty() => {
                    session.hand_on_waiting(permit, &shared.queue);
                    continue;
                }
                _ = shared.done.cancelled(), if !session.disconnecting => {
                    session.disconnecting = true;
                    if !client.try_disconnect() {
                        return;
                    }
                    continue;
                }
                _ = shared.single.cancelled(), if ends_if_single && !session.disconnecting => {
                    ends_if_single = false;
                    shared.health.drop_connection(session.index);
                    session.disconnecting = true;
                    if !client.try_disconnect() {
                        return;
                    }
                    continue;
                }
                _ = beat.tick() => {
                    shared.health.ingest_beat();
                    if session.retired(&shared.acked) && !session.disconnecting {
                        shared.sessions.retired(&session.client_id);
                        info!(client_id = %session.client_id, "Retired an MQTT session the configuration no longer has: unsubscribed, and every message it held is spooled.");
                        session.disconnecting = true;
                        if !client.try_disconnect() {
                            return;
                        }
                    }
                    continue;
                }
                // Over its byte budget, the queue to the admission takes no
                // more: reading from the broker waits (the broker keeps
                // what it has not sent; QoS 1 waits in its window).
                _ = shared.queue.room(), if shared.queue.over() => continue,
                (l, ev) = next, if !shared.queue.over() => {
                    link = Some(l);
                    ev
                }
            };
            polling = None;
            shared.health.ingest_beat();
            match event {
                Ok(Event::ConnAck { session_present }) => {
                    session.on_connack(session_present, &client, &shared.health)
                }
                Ok(Event::SubAck(codes)) => {
                    if session.on_suback(&codes, &client, &shared.health) {
                        if session.index == 0 {
                            shared
                                .sessions
                                .subscribing(&session.client_id, &session.subscribe);
                        }
                        shared.single.cancel();
                    }
                }
                Ok(Event::UnsubAck) => {
                    if let Some(filter) = session.on_unsuback() {
                        info!(client_id = %session.client_id, %filter, "Unsubscribed what the configuration no longer has.");
                        shared.sessions.unsubscribed(&session.client_id, &filter);
                    }
                }
                Ok(Event::Publish(p)) => {
                    if !shared.stop.is_cancelled() {
                        session.on_publish(p, &shared.queue, &shared.tx);
                    }
                }
                Ok(Event::Disconnected) => {
                    shared.health.set_broker_connected(session.index, false);
                    info!(client_id = %session.client_id, "Disconnected from the MQTT broker.");
                    return;
                }
                Ok(Event::Other) => {}
                Err(e) => {
                    if !session
                        .on_error(&e, &shared.health, &shared.abort, &shared.done)
                        .await
                    {
                        return;
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
