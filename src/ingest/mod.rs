//! Owns the rumqttc event loop: connect, subscribe, reconnect, and hand each
//! PUBLISH to the admission. MQTT 3.1.1 and MQTT 5 (`[mqtt] protocol`) run
//! through the same loop: [`Client`], `Link` and `Event` are what either
//! protocol's client is seen as ([`client`]), and `v5.rs` holds what MQTT 5
//! adds. Acknowledgements are sent by the admission through [`Acker`] (a
//! non-blocking `try_ack` into rumqttc's request channel) once a message is
//! durable in the spool ([`acker`]); this task never awaits an ack or a subscribe, so
//! it always keeps polling, and the keep-alive and the PUBACKs go out even
//! while the spool or the database is slow.
//!
//! Connections: `mqtt.connections` sessions, each its own event loop task,
//! in-flight window, ordered PUBACKs ([`Acker`] per connection) and
//! redelivery window, all handing on to the one admission (one spool, one
//! group commit). What each session decides (what to subscribe and take
//! off, what a received PUBLISH is, whether shared subscriptions are
//! delivered, when a retiring session is done) is the sans-IO
//! [`crate::front::session::Session`]; a connection's task feeds it the
//! broker's packets and carries out its actions ([`conn`]);
//! `mqtt-sessions.json` records what each client id holds ([`sessions_file`]).
//! A connection that drops loses nothing: its session keeps its messages
//! and the others go on.
//!
//! Session: clean session off under each connection's client id, so the broker
//! keeps unacknowledged messages across disconnects and restarts (MQTT 5:
//! clean start off, the session kept `mqtt.session_expiry`). Plain
//! subscriptions are made on the first connect of each run and after every
//! CONNACK without a session, shared ones on every connect, once the
//! broker is seen to deliver through them (the probe). A subscription an
//! earlier configuration made is unsubscribed; what its session had
//! queued still arrives, and goes to the dead letter as `unknown_topic`
//! when no subscription matches it.
//!
//! Backpressure: the hand-off channel is bounded. When it is full, messages
//! wait in a local queue while the event loop keeps being polled (so pings
//! and PUBACKs still flow and the connection stays up); unacknowledged QoS 1/2
//! messages are bounded by the broker's in-flight window and by the 16-bit
//! packet ids. Only past 65,536 waiting messages (a QoS 0 flood) does the task
//! stop reading from the socket.

mod acker;
mod client;
mod conn;
pub(crate) mod learned;
mod numbering;
pub(crate) mod sessions_file;
pub mod tls;
mod v5;

use std::time::Duration;

use rumqttc::{AsyncClient, ConnectionError, EventLoop, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use std::sync::Arc;

use crate::config::{MqttProtocol, MqttSettings};
use crate::decode::Subscription;
pub use crate::front::plan::{self, Planned, Probe};
pub use crate::front::session::{Disposition, Evidence, Session, Verdict, Void, PROBE_EVERY};
use crate::front::window::{session_key, Numbering, Windows};
use crate::telemetry::Health;

pub(crate) use acker::*;
pub(crate) use client::*;
pub(crate) use learned::redelivery_window;
use learned::Learned;

/// One received PUBLISH, as the admission sees it.
#[derive(Debug)]
pub(crate) struct Message {
    pub topic: String,
    pub payload: bytes::Bytes,
    /// `None` for QoS 0 (nothing to acknowledge).
    pub ack: Option<AckToken>,
    pub received_ms: i64,
    /// The identity of a QoS 1/2 message, spooled (as its last record) so
    /// that a redelivery after a restart can be recognised.
    pub id: Option<Identity>,
    /// New (spool it), a redelivery of one already spooled, or palletd's
    /// own probe: the last two are acknowledged in order, nothing stored.
    pub disposition: Disposition,
    /// MQTT 5: the user properties and content type the decoder may read.
    pub props: Option<Box<crate::decode::Properties>>,
    /// The broker sent it with the RETAIN flag: a topic's last value, sent
    /// again because palletd subscribed.
    pub retained: bool,
}

/// A QoS 1/2 message's identity: its session's key, its packet id there,
/// the digest of its topic and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    pub session: u64,
    pub pkid: u16,
    pub digest: u64,
}

impl Message {
    /// Bytes it holds while it waits for the admission (payload, topic, and
    /// the message itself).
    pub(crate) fn cost(&self) -> usize {
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

/// One poll of the event loop in progress, owning it until it returns.
type Polling =
    std::pin::Pin<Box<dyn std::future::Future<Output = (Link, Result<Event, String>)> + Send>>;

/// The MQTT sessions palletd opens (`mqtt.connections` of them, and any
/// retiring: see [`crate::front::plan`]), not yet connected.
pub(crate) struct Connections {
    list: Vec<Connection>,
    acked: Arc<Counters>,
    stale: Arc<Counters>,
    gens: Arc<Generations>,
    resets: Arc<Resets>,
    sessions: sessions_file::SessionsFile,
    probe: Option<Probe>,
    /// Messages kept per session to recognise redeliveries.
    window: usize,
    /// The spool's directory (where a learned window is kept).
    dir: std::path::PathBuf,
    /// How to reach the broker (for asking how it numbers its resends).
    mqtt: MqttSettings,
}

/// One MQTT client and its event loop, not yet connected.
struct Connection {
    plan: Planned,
    client: Client,
    eventloop: Link,
    /// It holds a plain filter matching the probe's topic (see
    /// [`crate::front::session::proves_sharing`]).
    plain_probe_match: bool,
}

/// What every connection of a process shares.
#[derive(Clone)]
pub(crate) struct Shared {
    tx: mpsc::Sender<Message>,
    stop: CancellationToken,
    done: CancellationToken,
    abort: CancellationToken,
    health: Arc<Health>,
    /// Bytes of messages on their way to the admission.
    queue: Arc<crate::budget::Budget>,
    sessions: Arc<sessions_file::SessionsFile>,
    acked: Arc<Counters>,
    stale: Arc<Counters>,
    gens: Arc<Generations>,
    resets: Arc<Resets>,
    /// The broker's in-flight window as palletd takes it, raised as seen
    /// (the largest of every session's).
    window: Arc<Learned>,
    /// Whether the broker delivers through shared subscriptions.
    verdict: Arc<tokio::sync::watch::Sender<Verdict>>,
    /// The probe's topic, when subscriptions are shared.
    probe_topic: Option<Arc<str>>,
    /// Whether the shared group is palletd's own (it may go unshared).
    own_group: bool,
    /// Where a retired session's message identities are forgotten.
    spool: crate::spool::Spool,
}

impl Shared {
    /// A session of `client_id` held `window` unacknowledged messages,
    /// beyond the window palletd took the broker's for: the spool keeps
    /// more identities per session from now on ([`learned`]).
    fn learned(&self, client_id: &str, window: usize) {
        if let Some(cap) = self.window.raise(client_id, window) {
            self.spool.widen_windows(cap);
        }
    }

    /// The verdict on shared subscriptions moves on `evidence`
    /// ([`Verdict::after`]), said once.
    fn settle(&self, evidence: Evidence, why: &str) {
        let mut to = Verdict::Unneeded;
        let changed = self.verdict.send_if_modified(|v| match v.after(evidence) {
            Some(next) => {
                *v = next;
                to = next;
                true
            }
            None => false,
        });
        if !changed {
            return;
        }
        self.health.set_shared(to, self.own_group);
        match (to, self.own_group) {
            (Verdict::Delivered, _) => {
                info!(why, "The broker delivers through shared subscriptions: the connections share the messages.")
            }
            (_, true) => {
                self.health.set_connections(1);
                warn!(why, "The broker does not deliver through shared subscriptions ($share/...): palletd goes on with one connection, unshared, and retires the others. Set mqtt.connections = 1 to say so.")
            }
            (_, false) => {
                error!(why, "The broker does not deliver through shared subscriptions ($share/...): nothing published to mqtt.share_group's filters reaches palletd. Use a broker with shared subscriptions (Mosquitto 2, EMQX, HiveMQ), or remove mqtt.share_group and run one instance.")
            }
        }
    }
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
        let before = sessions_file::SessionsFile::load(spool_dir, mqtt, subscriptions);
        let probe = plan::probe(mqtt, subscriptions);
        let planned = plan::plan(mqtt, subscriptions, &before);
        let plain_match = |client_id: &str, extra: &[(String, u8)]| -> bool {
            let Some(p) = &probe else { return false };
            before
                .get(client_id)
                .into_iter()
                .flatten()
                .chain(extra.iter().map(|(f, _)| f))
                .any(|f| plan::unshared(f).is_none() && rumqttc::matches(&p.topic, f))
        };
        let mut list = Vec::new();
        for p in &planned {
            let (client, eventloop) = match mqtt.protocol {
                MqttProtocol::V311 => {
                    let mut opts = mqtt_options(mqtt, &p.client_id).map_err(|e| e.to_string())?;
                    opts.set_clean_session(false)
                        .set_manual_acks(true)
                        .set_inflight(OUTGOING_INFLIGHT)
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
            list.push(Connection {
                plain_probe_match: plain_match(&p.client_id, &p.subscribe),
                plan: p.clone(),
                client,
                eventloop,
            });
        }
        let sessions =
            sessions_file::SessionsFile::start(spool_dir, before, &planned, probe.as_ref());
        Ok(Connections {
            list,
            acked: Arc::new(Counters::new()),
            stale: Arc::new(Counters::new()),
            gens: Arc::new(Generations::new()),
            resets: Arc::new(Resets::new()),
            sessions,
            probe,
            window: redelivery_window(mqtt, spool_dir),
            dir: spool_dir.to_path_buf(),
            mqtt: mqtt.clone(),
        })
    }

    /// The configured connections that opened (retiring ones aside).
    pub(crate) fn count(&self) -> usize {
        self.list.iter().filter(|c| !c.plan.retiring).count()
    }

    pub(crate) fn acker(&self) -> Acker {
        let mut clients = vec![None; 256];
        for c in &self.list {
            clients[c.plan.index] = Some(c.client.clone());
        }
        Acker {
            clients,
            waiting: (0..256).map(|_| Default::default()).collect(),
            acked: self.acked.clone(),
            stale: self.stale.clone(),
            gens: self.gens.clone(),
            resets: self.resets.clone(),
            queued: 0,
        }
    }

    /// Starts every connection's event loop on `tracker`; each runs until
    /// `done` (the pipeline finished: it disconnects cleanly) or `abort`
    /// (give up now). After `stop`, new messages are no longer handed on:
    /// they stay unacknowledged and the broker keeps them. Messages go to
    /// `tx`, their bytes held in `queue` until the admission takes them.
    /// Each session's window starts from what `recovered` holds under its
    /// client id's key; the windows of sessions palletd no longer has are
    /// forgotten in `spool`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn(
        self,
        tracker: &tokio_util::task::TaskTracker,
        tx: mpsc::Sender<Message>,
        queue: Arc<crate::budget::Budget>,
        tokens: [CancellationToken; 3],
        health: Arc<Health>,
        recovered: &Windows,
        spool: crate::spool::Spool,
    ) {
        let [stop, done, abort] = tokens;
        health.set_connections(self.count());
        let verdict = Verdict::initial(self.probe.as_ref());
        let own_group = self.probe.as_ref().is_some_and(|p| p.own_group);
        health.set_shared(verdict, own_group);
        let keys: Vec<u64> = self
            .list
            .iter()
            .map(|c| session_key(&c.plan.client_id))
            .collect();
        for key in recovered.keys() {
            if !keys.contains(&key) {
                spool.forget_session(key);
            }
        }
        let shared = Shared {
            tx,
            stop,
            done,
            abort,
            health,
            queue,
            sessions: Arc::new(self.sessions),
            acked: self.acked,
            stale: self.stale,
            gens: self.gens,
            resets: self.resets,
            window: Arc::new(Learned::new(self.window / 2, self.dir, &self.mqtt)),
            verdict: Arc::new(tokio::sync::watch::Sender::new(verdict)),
            probe_topic: self.probe.as_ref().map(|p| Arc::from(p.topic.as_str())),
            own_group,
            spool,
        };
        let numbering = shared.window.numbering();
        if numbering == Numbering::Unknown {
            let (mqtt, shared) = (self.mqtt.clone(), shared.clone());
            tracker.spawn(async move {
                let known = || shared.window.numbering() != Numbering::Unknown;
                tokio::select! {
                    asked = numbering::ask_until(&mqtt, known) => {
                        if let Some(n) = asked {
                            shared.window.numbered("(probe)", n);
                        }
                    }
                    _ = shared.done.cancelled() => {}
                    _ = shared.abort.cancelled() => {}
                }
            });
        }
        for c in self.list {
            let seen = recovered.of(session_key(&c.plan.client_id));
            let probing = c.plan.index == 0 && self.probe.is_some();
            let (session, verdicts) = follow_verdicts(&shared.verdict, |v| {
                Session::new(c.plan, self.probe.clone(), self.window, &seen, v, numbering)
            });
            let conn = conn::Conn::new(session, c.plain_probe_match, probing);
            tracker.spawn(run(conn, c.client, c.eventloop, shared.clone(), verdicts));
        }
    }
}

/// A session made by `new` and the receiver of the verdicts it follows:
/// the session starts from the verdict the receiver has seen, so every
/// later one reaches it. (A session made from the verdict at start and a
/// receiver made after the probe came back, the spawning thread preempted
/// for a few milliseconds on a busy box, took Pending as its verdict and
/// Delivered as seen: it never subscribed its data and palletd never became
/// ready.)
fn follow_verdicts(
    verdicts: &tokio::sync::watch::Sender<Verdict>,
    new: impl FnOnce(Verdict) -> Session,
) -> (Session, tokio::sync::watch::Receiver<Verdict>) {
    let mut rx = verdicts.subscribe();
    let now = *rx.borrow_and_update();
    (new(now), rx)
}

/// One connection's event loop, until `done` or `abort`.
async fn run(
    mut conn: conn::Conn,
    client: Client,
    eventloop: Link,
    shared: Shared,
    mut verdict: tokio::sync::watch::Receiver<Verdict>,
) {
    // Shows the loop is alive while the broker is quiet (it polls only on
    // traffic and keep-alive pings).
    let mut beat = tokio::time::interval(Duration::from_secs(1));
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probe_beat = tokio::time::interval(PROBE_EVERY / 2);
    probe_beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // rumqttc's poll is not cancel-safe while it connects: dropped
    // between its CONNECT and its CONNACK (when another branch of the
    // select fires), the next poll connects again and the broker sees
    // two connections, the first CONNACK lost. So one poll runs to its
    // end across the loop's turns; it owns the event loop meanwhile.
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
        let probing = conn.probe.as_ref().is_some_and(|p| p.waiting());
        // While messages wait in `overflow` the loop keeps polling (pings,
        // PUBACKs) and hands them on as the channel makes room.
        let event = tokio::select! {
            _ = shared.abort.cancelled() => return,
            permit = shared.tx.reserve(), if !conn.overflow.is_empty() => {
                conn.hand_on_waiting(permit, &shared.queue);
                continue;
            }
            _ = shared.done.cancelled(), if !conn.disconnecting => {
                conn.disconnecting = true;
                if !client.try_disconnect() {
                    return;
                }
                continue;
            }
            changed = verdict.changed() => {
                if changed.is_ok() {
                    let v = *verdict.borrow_and_update();
                    on_verdict(&mut conn, v, &client, &shared);
                }
                continue;
            }
            _ = shared.resets.wake[conn.index()].notified() => {
                for _ in 0..shared.resets.take(conn.index()) {
                    let actions = conn.session.recorded();
                    conn.apply(actions, &client, &shared);
                }
                continue;
            }
            _ = probe_beat.tick(), if probing => {
                conn.probe_tick(&client, &shared);
                continue;
            }
            _ = beat.tick() => {
                shared.health.ingest_beat();
                if !retire_if_done(&mut conn, &client, &shared) {
                    return;
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
                conn.on_connack(session_present, &client, &shared)
            }
            Ok(Event::SubAck(codes)) => {
                let actions = conn.session.suback(&codes);
                conn.apply(actions, &client, &shared);
            }
            Ok(Event::UnsubAck) => {
                let actions = conn.session.unsuback();
                conn.apply(actions, &client, &shared);
            }
            Ok(Event::Publish(p)) => {
                if !shared.stop.is_cancelled() {
                    conn.on_publish(p, &client, &shared);
                }
            }
            Ok(Event::Disconnected) => {
                shared.health.set_broker_connected(conn.index(), false);
                info!(client_id = %conn.session.client_id, "Disconnected from the MQTT broker.");
                return;
            }
            Ok(Event::Other) => {}
            Err(e) => {
                if let Some(l) = link.as_mut() {
                    // The next generation: no PUBACK of this link's
                    // messages goes out on the next one (acker.rs).
                    let mut gen = shared.gens.lock(conn.index());
                    *gen = gen.wrapping_add(1);
                    l.clean();
                    drop(gen);
                    l.forget_subscriptions();
                }
                if !conn
                    .on_error(&e, &shared.health, &shared.abort, &shared.done)
                    .await
                {
                    return;
                }
            }
        }
    }
}

/// The shared-subscription verdict, decided or changed: the session
/// subscribes (or unsubscribes) as it says.
fn on_verdict(conn: &mut conn::Conn, v: Verdict, client: &Client, shared: &Shared) {
    if v != Verdict::Pending {
        // Decided: the probe's clock stops.
        conn.probe = None;
    }
    let actions = conn.session.verdict(v);
    conn.apply(actions, client, shared);
}

/// A session the configuration no longer has, once unsubscribed and every
/// message it held is spooled: forgotten and disconnected. `false`: the
/// connection's task ends now (the client could not take the DISCONNECT).
fn retire_if_done(conn: &mut conn::Conn, client: &Client, shared: &Shared) -> bool {
    // Those not sent are for messages the broker resends: received again.
    let acked = shared.acked.get(conn.index()) + shared.stale.get(conn.index());
    if conn.disconnecting || !conn.session.retired(acked, std::time::Instant::now()) {
        return true;
    }
    let s = &conn.session;
    shared.sessions.retired(&s.client_id);
    shared.spool.forget_session(s.key);
    info!(client_id = %s.client_id, "Retired an MQTT session the configuration no longer has: unsubscribed, and every message it held is spooled.");
    conn.disconnecting = true;
    client.try_disconnect()
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
    use crate::front::plan::{plan, probe, tests as p, Subscribed};
    use crate::front::session::Action;

    /// Connection 1's session, made after the probe already came back
    /// (connection 0's, while the thread that spawns the connections was
    /// preempted): once connected, its data is subscribed, or a verdict is
    /// still on its way to it.
    #[test]
    fn a_session_made_after_the_verdict_subscribes_its_data() {
        let m = p::settings(2);
        let pr = probe(&m, &p::subs());
        let planned = plan(&m, &p::subs(), &Subscribed::new());
        let verdicts = tokio::sync::watch::Sender::new(Verdict::initial(pr.as_ref()));
        verdicts.send_replace(Verdict::Delivered);
        let (mut session, rx) = follow_verdicts(&verdicts, |v| {
            Session::new(
                planned[1].clone(),
                pr.clone(),
                20,
                &[],
                v,
                Default::default(),
            )
        });
        let actions = session.connected(true, std::time::Instant::now());
        let data = actions.iter().any(|a| {
            matches!(a, Action::Subscribe(f) if f.iter().any(|(f, _)| f == "$share/box/s/+/data"))
        });
        assert!(
            data || rx.has_changed().unwrap(),
            "the session waits for a verdict that never comes: {actions:?}"
        );
    }
}
