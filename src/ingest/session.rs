//! One connection's MQTT session as its event loop keeps it: what the
//! broker holds (subscriptions made, filters being taken off, whether a
//! retiring session is done), the reconnect backoff, the messages waiting
//! for room in the channel to the admission.

use std::time::Duration;

use rumqttc::QoS;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::{digest, sessions, AckToken, Client, Counters, Incoming, Message, Redeliveries};
use crate::clock::now_ms;
use crate::retry::Backoff;
use crate::telemetry::{self, Health};

/// What the event loop keeps of its MQTT session: the broker's state as
/// seen here, the reconnect backoff, the messages waiting for room.
pub(super) struct Session {
    pub(super) index: usize,
    /// Whether a refused shared subscription may be made unshared.
    pub(super) may_unshare: bool,
    /// A session the configuration no longer has: unsubscribes and drains.
    pub(super) retiring: bool,
    pub(super) client_id: String,
    pub(super) subscribe: Vec<(String, QoS)>,
    /// Filters to take off the session once the new ones are subscribed.
    pub(super) unsubscribe: Vec<String>,
    /// UNSUBSCRIBEs sent, oldest first, waiting for their UNSUBACK.
    pub(super) unsubscribing: std::collections::VecDeque<String>,
    pub(super) redeliveries: Redeliveries,
    pub(super) backoff: Backoff,
    pub(super) down_since: Option<std::time::Instant>,
    pub(super) disconnecting: bool,
    /// The broker acknowledged every subscription (a SUBACK) since this
    /// process started.
    pub(super) subscribed: bool,
    /// Messages the channel to the admission had no room for yet.
    pub(super) overflow: std::collections::VecDeque<Message>,
    /// QoS 1/2 messages received (each is acknowledged once spooled).
    pub(super) received: u64,
    pub(super) last_publish: std::time::Instant,
    /// `palletd_messages_received_total` of this connection.
    pub(super) messages: metrics::Counter,
}

impl Session {
    /// A session for `plan`, subscribing `subscribe`.
    pub(super) fn new(
        plan: sessions::Planned,
        subscribe: Vec<(String, QoS)>,
        may_unshare: bool,
        redeliveries: Redeliveries,
    ) -> Session {
        Session {
            messages: metrics::counter!(telemetry::MESSAGES_RECEIVED, "connection" => plan.index.to_string()),
            index: plan.index,
            may_unshare,
            retiring: plan.retiring,
            client_id: plan.client_id,
            subscribe,
            unsubscribe: plan.unsubscribe,
            unsubscribing: Default::default(),
            redeliveries,
            backoff: Backoff::default(),
            down_since: None,
            disconnecting: false,
            subscribed: false,
            overflow: Default::default(),
            received: 0,
            last_publish: std::time::Instant::now(),
        }
    }

    /// Connected: subscribes until the broker acknowledged it on this
    /// process (the config may have changed since the session was made; a
    /// link that dropped before the SUBACK may have lost the SUBSCRIBE),
    /// whenever the broker kept no session, and on every connect when a
    /// subscription is shared (see below). Plain ones not on every
    /// reconnect: each subscribe re-sends retained messages. Then takes off
    /// the filters an earlier configuration left (again after a reconnect
    /// until the broker acknowledged it).
    pub(super) fn on_connack(&mut self, session_present: bool, client: &Client, health: &Health) {
        self.backoff = Backoff::default();
        self.redeliveries.connected(session_present);
        if !self.retiring {
            health.set_broker_connected(self.index, true);
        }
        match self.down_since.take() {
            Some(t) => {
                metrics::counter!(telemetry::BROKER_RECONNECTS).increment(1);
                info!(
                    client_id = %self.client_id,
                    session_present,
                    after = ?Duration::from_secs(t.elapsed().as_secs()),
                    "Reconnected to the MQTT broker."
                )
            }
            None => {
                info!(client_id = %self.client_id, session_present, "Connected to the MQTT broker.")
            }
        }
        // Shared subscriptions are made again on every connect: Mosquitto
        // 2.0 keeps a session's plain subscriptions across its restart but
        // not its shared ones (and sends no retained messages to a shared
        // subscription, so making one again costs nothing).
        let shared = self.subscribe.iter().any(|(f, _)| unshared(f).is_some());
        if self.retiring {
            // Nothing to subscribe: counts as done.
            self.subscribed = true;
        } else if !session_present || !self.subscribed || shared {
            health.set_subscribed(self.index, false);
            if let Err(e) = client.try_subscribe(&self.subscribe) {
                error!(error = %e, "Could not queue the subscriptions.");
            }
        } else {
            // The broker kept the session and its subscriptions.
            health.set_subscribed(self.index, true);
        }
        self.unsubscribing.clear();
        for filter in &self.unsubscribe {
            match client.try_unsubscribe(filter) {
                Ok(()) => self.unsubscribing.push_back(filter.clone()),
                Err(e) => error!(error = %e, %filter, "Could not queue an unsubscribe."),
            }
        }
    }

    /// The broker answered the subscriptions. True when it refused a
    /// shared subscription of palletd's own group (a broker without shared
    /// subscriptions): the first connection then subscribes unshared, and
    /// the caller ends the others.
    pub(super) fn on_suback(
        &mut self,
        codes: &[Result<u8, String>],
        client: &Client,
        health: &Health,
    ) -> bool {
        let mut all = true;
        let mut unshare = Vec::new();
        for (i, (code, (filter, _))) in codes.iter().zip(&self.subscribe).enumerate() {
            match code {
                Ok(qos) => info!(client_id = %self.client_id, %filter, qos, "Subscribed."),
                Err(reason) => {
                    all = false;
                    match unshared(filter).filter(|_| self.may_unshare) {
                        Some(plain) => {
                            error!(client_id = %self.client_id, %filter, %reason, "The broker refused a shared subscription (it has none, or its ACLs forbid it): palletd goes on with one connection, unshared. Set mqtt.connections = 1 to say so.");
                            unshare.push((i, plain.to_string()));
                        }
                        None => {
                            error!(client_id = %self.client_id, %filter, %reason, "The broker refused the subscription; check its ACLs.")
                        }
                    }
                }
            }
        }
        let fallback = !unshare.is_empty();
        if fallback && self.index == 0 {
            // The refused ones unshared, the rest as they were, all
            // subscribed again (the ACL case is refused again).
            for (i, plain) in unshare {
                self.subscribe[i].0 = plain;
            }
            // A plain filter an earlier configuration left is wanted
            // again: no longer taken off (an UNSUBSCRIBE already sent is
            // answered before this SUBSCRIBE, so the broker ends up
            // holding it).
            let wanted = |f: &String| self.subscribe.iter().any(|(w, _)| w == f);
            self.unsubscribe.retain(|f| !wanted(f));
            if let Err(e) = client.try_subscribe(&self.subscribe) {
                error!(error = %e, "Could not queue the subscriptions.");
            }
            return true;
        }
        health.set_subscribed(self.index, all);
        self.subscribed = all;
        fallback
    }

    /// The broker answered the oldest UNSUBSCRIBE: the filter it took
    /// off, to be forgotten in `mqtt-sessions.json`, unless a SUBSCRIBE
    /// sent after it (the unshared fallback) put it back.
    pub(super) fn on_unsuback(&mut self) -> Option<String> {
        let filter = self.unsubscribing.pop_front()?;
        self.unsubscribe.retain(|f| *f != filter);
        let again = self.subscribe.iter().any(|(f, _)| *f == filter);
        (!again).then_some(filter)
    }

    /// Retiring, and done: the broker took every filter off, and nothing
    /// came for [`sessions::RETIRE_QUIET`] with everything received
    /// acknowledged (the broker sends what it queued as the window frees).
    pub(super) fn retired(&self, acked: &Counters) -> bool {
        self.retiring
            && self.down_since.is_none()
            && self.subscribed
            && self.unsubscribing.is_empty()
            && acked.get(self.index) >= self.received
            && self.last_publish.elapsed() >= sessions::RETIRE_QUIET
    }

    /// A message for the admission, with its acknowledgement token and
    /// whether it is a redelivery of one already spooled.
    pub(super) fn on_publish(
        &mut self,
        p: Incoming,
        queue: &crate::budget::Budget,
        tx: &mpsc::Sender<Message>,
    ) {
        tracing::trace!(topic = %p.topic, pkid = p.pkid, "Message received.");
        self.messages.increment(1);
        self.last_publish = std::time::Instant::now();
        let ack = (p.qos != QoS::AtMostOnce).then_some(AckToken {
            conn: self.index as u8,
            qos: p.qos,
            pkid: p.pkid,
        });
        let (id, duplicate) = match ack {
            Some(_) => {
                self.received += 1;
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
        health.set_broker_connected(self.index, false);
        if self.disconnecting {
            return false;
        }
        if self.down_since.is_none() {
            self.down_since = Some(std::time::Instant::now());
            warn!(client_id = %self.client_id, error = %e, "MQTT connection lost or refused; reconnecting with backoff.");
        } else {
            debug!(client_id = %self.client_id, error = %e, "MQTT reconnect failed.");
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

/// How long into an outage reconnects are tried every 50-100 ms before the
/// backoff grows.
const FAST_RECONNECT: Duration = Duration::from_secs(5);

/// The filter of a shared subscription (`$share/<group>/<filter>`).
pub(super) fn unshared(filter: &str) -> Option<&str> {
    let rest = filter.strip_prefix("$share/")?;
    rest.split_once('/').map(|(_, f)| f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(filters: &[&str], may_unshare: bool) -> Session {
        let plan = sessions::Planned {
            index: 0,
            client_id: "box".into(),
            subscribe: Vec::new(),
            unsubscribe: Vec::new(),
            retiring: false,
        };
        let subscribe = filters
            .iter()
            .map(|f| (f.to_string(), QoS::AtLeastOnce))
            .collect();
        Session::new(
            plan,
            subscribe,
            may_unshare,
            Redeliveries::new(Default::default()),
        )
    }

    #[test]
    fn a_refused_shared_subscription_goes_on_unshared_on_the_first_connection() {
        let (c, _link) =
            rumqttc::AsyncClient::new(rumqttc::MqttOptions::new("t", "localhost", 1883), 10);
        let client = Client::V311(c);
        let health = Health::default();
        let mut s = session(&["$share/box/s/+/data", "spBv1.0/#"], true);
        assert!(s.on_suback(&[Err("Failure".into()), Ok(1)], &client, &health));
        let filters: Vec<&str> = s.subscribe.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(filters, ["s/+/data", "spBv1.0/#"], "the Sparkplug one kept");
        // Upgraded from one session: its plain filter was being taken off
        // when the shared one was refused; it stays, in the file too.
        let mut s = session(&["$share/box/s/+/data"], true);
        s.unsubscribe = vec!["s/+/data".into(), "old/+".into()];
        s.unsubscribing = s.unsubscribe.iter().cloned().collect();
        assert!(s.on_suback(&[Err("Failure".into())], &client, &health));
        assert_eq!(s.unsubscribe, ["old/+"], "not taken off at a reconnect");
        assert_eq!(s.on_unsuback(), None, "subscribed again after it");
        assert_eq!(s.on_unsuback().as_deref(), Some("old/+"));
        assert_eq!(s.on_unsuback(), None);
        // The operator's own group (several instances): never unshared.
        let mut s = session(&["$share/g/s/+/data"], false);
        assert!(!s.on_suback(&[Err("Failure".into())], &client, &health));
        assert_eq!(s.subscribe[0].0, "$share/g/s/+/data");
        assert!(!s.subscribed);
        assert_eq!(unshared("$share/g/a/b/#"), Some("a/b/#"));
        assert_eq!(unshared("a/b"), None);
    }
}
