//! One connection's event loop state around its [`Session`] (the
//! decisions, [`crate::front::session`]): carries out the session's
//! actions on the client, the sessions file and the health, keeps the
//! reconnect backoff and the messages waiting for room in the channel to
//! the admission.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::{qos, AckToken, Client, Identity, Incoming, Message, Shared};
use crate::clock::now_ms;
use crate::front::session::{
    proves_sharing, Action, Disposition, Evidence, ProbeCheck, ProbeStep, Session,
};
use crate::front::window::{digest, RESET};
use crate::retry::Backoff;
use crate::telemetry::{self, Health};

/// What the event loop keeps besides the session's decisions.
pub(super) struct Conn {
    pub(super) session: Session,
    pub(super) backoff: Backoff,
    pub(super) down_since: Option<Instant>,
    pub(super) disconnecting: bool,
    /// Messages the channel to the admission had no room for yet.
    pub(super) overflow: std::collections::VecDeque<Message>,
    /// The session holds a plain filter that matches the probe's topic: a
    /// probe arriving here proves nothing.
    pub(super) plain_probe_match: bool,
    /// The probe's timing (the first connection, while it is pending).
    pub(super) probe: Option<ProbeCheck>,
    /// `palletd_messages_received_total` of this connection.
    pub(super) messages: metrics::Counter,
    /// The link's generation ([`super::Generations`]): what its PUBACKs
    /// carry.
    pub(super) gen: u32,
    /// PUBACKs handed to the client when this connection was made.
    pub(super) acked_at_connect: u64,
}

impl Conn {
    pub(super) fn new(session: Session, plain_probe_match: bool, probing: bool) -> Conn {
        Conn {
            messages: metrics::counter!(telemetry::MESSAGES_RECEIVED, "connection" => session.index.to_string()),
            probe: probing.then(ProbeCheck::default),
            session,
            backoff: Backoff::default(),
            down_since: None,
            disconnecting: false,
            overflow: Default::default(),
            plain_probe_match,
            gen: 0,
            acked_at_connect: 0,
        }
    }

    pub(super) fn index(&self) -> usize {
        self.session.index
    }

    /// Connected (a CONNACK).
    pub(super) fn on_connack(&mut self, session_present: bool, client: &Client, shared: &Shared) {
        self.backoff = Backoff::default();
        self.gen = shared.gens.current(self.index());
        self.acked_at_connect = shared.acked.get(self.index());
        // What the broker was asked, or another session saw, since.
        self.session.numbering(shared.window.numbering());
        let s = &self.session;
        if !s.retiring() {
            shared.health.set_broker_connected(s.index, true);
        }
        match self.down_since.take() {
            Some(t) => {
                metrics::counter!(telemetry::BROKER_RECONNECTS).increment(1);
                info!(
                    client_id = %s.client_id,
                    session_present,
                    after = ?Duration::from_secs(t.elapsed().as_secs()),
                    "Reconnected to the MQTT broker."
                )
            }
            None => {
                info!(client_id = %s.client_id, session_present, "Connected to the MQTT broker.")
            }
        }
        let actions = self.session.connected(session_present, Instant::now());
        self.apply(actions, client, shared);
    }

    /// Carries out what the session decided.
    pub(super) fn apply(&mut self, actions: Vec<Action>, client: &Client, shared: &Shared) {
        let (index, client_id) = (self.session.index, self.session.client_id.clone());
        for a in actions {
            match a {
                Action::Hold(filters) => shared.sessions.subscribing(&client_id, &filters),
                Action::Subscribe(filters) => {
                    let filters: Vec<_> = filters.into_iter().map(|(f, q)| (f, qos(q))).collect();
                    if let Err(e) = client.try_subscribe(&filters) {
                        error!(error = %e, "Could not queue the subscriptions.");
                    }
                }
                Action::Unsubscribe(filter) => {
                    if let Err(e) = client.try_unsubscribe(&filter) {
                        error!(error = %e, %filter, "Could not queue an unsubscribe.");
                    }
                }
                Action::Released(filter) => {
                    info!(%client_id, %filter, "Unsubscribed what the configuration no longer has.");
                    shared.sessions.unsubscribed(&client_id, &filter);
                }
                Action::Ready(yes) => shared.health.set_subscribed(index, yes),
                Action::Granted { filter, qos } => info!(%client_id, %filter, qos, "Subscribed."),
                Action::Refused { filter, reason } => {
                    error!(%client_id, %filter, %reason, "The broker refused the subscription; check its ACLs.")
                }
                Action::ProbeReady => {
                    if let Some(check) = &mut self.probe {
                        let step = check.ready(Instant::now());
                        probe_step(step, client, shared);
                    }
                }
                Action::NotShared => shared.settle(
                    Evidence::Refused,
                    "the broker refused a shared subscription",
                ),
                Action::Void(void) => {
                    // Told back once its record is durable.
                    let token = AckToken {
                        conn: index as u8,
                        qos: rumqttc::QoS::AtMostOnce,
                        pkid: RESET,
                        reset: true,
                        gen: 0,
                    };
                    self.hand_on(self.marker(Disposition::Void(void), Some(token)), shared);
                }
                Action::Resumed => self.hand_on(self.marker(Disposition::Resumed, None), shared),
                Action::Numbering(n) => shared.window.numbered(&client_id, n),
                Action::Leaves => {
                    info!(%client_id, "Retiring this MQTT session: the broker does not deliver through shared subscriptions, so the first connection takes everything unshared.");
                    shared.health.drop_connection(index);
                    shared.health.set_broker_connected(index, false);
                }
            }
        }
    }

    /// A message for the admission that is no PUBLISH: a mark in the
    /// session's records.
    fn marker(&self, disposition: Disposition, ack: Option<AckToken>) -> Message {
        Message {
            topic: String::new(),
            payload: bytes::Bytes::new(),
            ack,
            received_ms: now_ms(),
            id: Some(Identity {
                session: self.session.key,
                pkid: RESET,
                digest: 0,
            }),
            disposition,
            props: None,
            retained: false,
        }
    }

    /// The probe's clock, on the first connection: it counts only while
    /// palletd reads from the broker (its queue to the spool has room).
    pub(super) fn probe_tick(&mut self, client: &Client, shared: &Shared) {
        if let Some(check) = &mut self.probe {
            let step = check.tick(Instant::now(), !shared.queue.over());
            probe_step(step, client, shared);
        }
    }

    /// A message for the admission, with its acknowledgement token and
    /// what it is (new, a redelivery, the probe).
    pub(super) fn on_publish(&mut self, p: Incoming, client: &Client, shared: &Shared) {
        tracing::trace!(topic = %p.topic.escape_debug(), pkid = p.pkid, "Message received.");
        let is_probe = shared.probe_topic.as_deref() == Some(p.topic.as_str());
        if !is_probe {
            // palletd's own probe is not counted.
            self.messages.increment(1);
        }
        if is_probe && proves_sharing(self.plain_probe_match) {
            shared.settle(Evidence::ProbeBack, "a probe came back through the group");
        }
        let qos = p.qos as u8;
        let d = if qos > 0 {
            digest(&p.topic, &p.payload)
        } else {
            0
        };
        let (disposition, actions) =
            self.session
                .publish(qos, p.pkid, p.dup, d, is_probe, Instant::now());
        self.apply(actions, client, shared);
        let ack = (qos > 0).then_some(AckToken {
            conn: self.session.index as u8,
            qos: p.qos,
            pkid: p.pkid,
            reset: false,
            gen: self.gen,
        });
        if qos > 0 {
            let acked_here = shared.acked.get(self.index()) - self.acked_at_connect;
            if let Some(window) = self.session.learn(acked_here) {
                shared.learned(&self.session.client_id, window);
            }
        }
        if ack.is_none() && disposition == Disposition::Probe {
            return;
        }
        let msg = Message {
            topic: p.topic,
            payload: p.payload,
            ack,
            received_ms: now_ms(),
            id: ack.map(|_| Identity {
                session: self.session.key,
                pkid: p.pkid,
                digest: d,
            }),
            disposition,
            props: p.props,
            retained: p.retain,
        };
        self.hand_on(msg, shared);
    }

    /// Hands a message to the admission, in order behind those waiting.
    fn hand_on(&mut self, msg: Message, shared: &Shared) {
        shared.queue.add(msg.cost());
        if !self.overflow.is_empty() {
            self.overflow.push_back(msg);
            return;
        }
        match shared.tx.try_send(msg) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(m)) => self.overflow.push_back(m),
            Err(mpsc::error::TrySendError::Closed(m)) => {
                shared.queue.sub(m.cost());
                debug!("Admission closed; message left to the broker.")
            }
        }
    }

    /// The channel made room: the oldest waiting message goes on (all are
    /// given up if the admission is gone).
    pub(super) fn hand_on_waiting(
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
    pub(super) async fn on_error(
        &mut self,
        e: &str,
        health: &Health,
        abort: &CancellationToken,
        done: &CancellationToken,
    ) -> bool {
        self.session.disconnected();
        if let Some(check) = &mut self.probe {
            check.disconnected();
        }
        health.set_broker_connected(self.session.index, false);
        if self.disconnecting {
            return false;
        }
        let client_id = &self.session.client_id;
        if self.down_since.is_none() {
            self.down_since = Some(Instant::now());
            warn!(%client_id, error = %e, "MQTT connection lost or refused; reconnecting with backoff.");
        } else {
            debug!(%client_id, error = %e, "MQTT reconnect failed.");
        }
        // The first seconds of an outage are retried at the first step's
        // pace: a broker that restarts is back within them, and a broker
        // that forgets shared subscriptions at its restart (Mosquitto 2.0)
        // drops what is published to the group until palletd is back.
        let delay = match self.down_since {
            Some(t) if t.elapsed() < FAST_RECONNECT => Backoff::default().next_delay(),
            _ => self.backoff.next_delay(),
        };
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = abort.cancelled() => false,
            _ = done.cancelled() => false,
        }
    }
}

/// Publishes the probe, or gives it up.
fn probe_step(step: ProbeStep, client: &Client, shared: &Shared) {
    match step {
        ProbeStep::Wait => {}
        ProbeStep::Publish => {
            if let Some(topic) = &shared.probe_topic {
                // QoS 1: the broker routes it before it acknowledges.
                if !client.try_publish(topic.to_string(), rumqttc::QoS::AtLeastOnce, Vec::new()) {
                    debug!("The probe did not fit into the client's queue; sent again shortly.");
                }
            }
        }
        ProbeStep::GiveUp => shared.settle(
            Evidence::ProbeLost,
            "the probe published to its topic did not come back through the group",
        ),
    }
}

/// How long into an outage reconnects are tried every 50-100 ms before the
/// backoff grows.
const FAST_RECONNECT: Duration = Duration::from_secs(5);
