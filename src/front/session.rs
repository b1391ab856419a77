//! One MQTT session's decisions, sans-IO: what to subscribe and take off
//! on each connect, what a received PUBLISH is (new, a redelivery, a
//! probe), when shared subscriptions may be trusted, when a retiring
//! session is done. The connection's task ([`crate::ingest`]) feeds it
//! the broker's packets and carries out the [`Action`]s.
//!
//! Shared subscriptions are verified, not assumed ([`Verdict`]): a broker
//! may grant `$share/<group>/<filter>` and deliver nothing through it
//! (aedes; RabbitMQ's MQTT plugin has none). Every configured session
//! subscribes the probe's filter (QoS 0) and the first connection
//! publishes to the probe's topic ([`ProbeCheck`]); a probe that arrives
//! on a session holding no plain filter that matches its topic came
//! through the group ([`proves_sharing`]). Until then a session of
//! palletd's own group subscribes no data; when none arrives within
//! [`PROBE_WAIT`] (or the broker refuses a shared subscription), the
//! first session subscribes everything unshared and the others retire.
//! With the operator's own `mqtt.share_group` (several instances) nothing
//! waits and nothing is unshared (each instance would store everything):
//! the verdict is only reported.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::plan::{unshared, Planned, Probe, RETIRE_QUIET};
use super::window::{session_key, Numbering, Resend, Seen, Window};

/// The largest broker window palletd learns: twice as many message ids
/// per session are kept, and no more than 65,535 packet ids exist.
pub(crate) const MAX_BROKER_WINDOW: usize = 32_767;

/// How long the probe may take to come back through the group.
pub(crate) const PROBE_WAIT: Duration = Duration::from_secs(5);
/// How often the probe is published while it has not come back.
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

/// Whether the broker delivers through shared subscriptions, as seen in
/// this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing is shared: nothing to prove.
    Unneeded,
    /// The probe is under way.
    Pending,
    /// A probe came back through the group.
    Delivered,
    /// None came back within [`PROBE_WAIT`], or the broker refused a
    /// shared subscription.
    NotDelivered,
}

/// What can move the verdict on shared subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// A probe came back through the group.
    ProbeBack,
    /// No probe came back within [`PROBE_WAIT`].
    ProbeLost,
    /// The broker refused a shared subscription of palletd's own group.
    Refused,
}

impl Verdict {
    /// The verdict after `evidence`, if it moves: the probe decides only
    /// while it is pending (a probe late after the verdict changes
    /// nothing); a refusal ends shared delivery whenever it comes.
    pub(crate) fn after(self, evidence: Evidence) -> Option<Verdict> {
        match (self, evidence) {
            (Verdict::Pending, Evidence::ProbeBack) => Some(Verdict::Delivered),
            (Verdict::Pending, Evidence::ProbeLost) => Some(Verdict::NotDelivered),
            (Verdict::Pending | Verdict::Delivered, Evidence::Refused) => {
                Some(Verdict::NotDelivered)
            }
            _ => None,
        }
    }

    /// The verdict at start for a configuration with `probe`.
    pub(crate) fn initial(probe: Option<&Probe>) -> Verdict {
        match probe {
            Some(_) => Verdict::Pending,
            None => Verdict::Unneeded,
        }
    }

    /// A bounded label for metrics and the status page.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Verdict::Unneeded => "unused",
            Verdict::Pending => "verifying",
            Verdict::Delivered => "delivered",
            Verdict::NotDelivered => "not_delivered",
        }
    }
}

/// Whether a probe that arrived on a session proves the broker delivers
/// through the group: unless the session holds a plain filter matching
/// the probe's topic, it can only have come through a shared one.
pub(crate) fn proves_sharing(holds_plain_match: bool) -> bool {
    !holds_plain_match
}

/// What the session asks its connection to do, or to tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// The session may hold these filters from now on: recorded in
    /// `mqtt-sessions.json` before they are subscribed.
    Hold(Vec<String>),
    /// Subscribe these (filter, QoS); the SUBACK comes back in order.
    Subscribe(Vec<(String, u8)>),
    Unsubscribe(String),
    /// The broker took this filter off: no longer held.
    Released(String),
    /// Whether this connection counts as subscribed (readiness).
    Ready(bool),
    Granted {
        filter: String,
        qos: u8,
    },
    Refused {
        filter: String,
        reason: String,
    },
    /// The probe's filter is subscribed on this session: the probe may go.
    ProbeReady,
    /// The broker refused a shared subscription of palletd's own group:
    /// it does not deliver through shared subscriptions.
    NotShared,
    /// No longer one of the connections palletd keeps: it retires.
    Leaves,
    /// The broker resumed the session: what is recorded of it from here on
    /// is what it resends and what comes after (the admission notes where
    /// that starts, for [`Void::Settled`]).
    Resumed,
    /// Record in the spool, in order with the messages, that identities
    /// of this session recorded before are void (see
    /// [`super::window::RESET`]); [`Session::recorded`] once durable.
    Void(Void),
    /// A message showed how the broker numbers its resends: kept for the
    /// next start, told to the other sessions.
    Numbering(Numbering),
}

/// Which identities of a session a record voids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Void {
    /// The broker kept no session: every one recorded before.
    Reset,
    /// The broker resent what it held: every one recorded before the
    /// session was last resumed ([`Action::Resumed`]) that it did not
    /// resend (those it resent were recorded again).
    Settled,
}

/// A filter palletd unsubscribes when a session is resumed with
/// identities in its window: the UNSUBACK comes after whatever the broker
/// resent, and no session holds it.
pub(crate) const SETTLE_FILTER: &str = "$palletd/settle";

/// What a received PUBLISH is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// New: decode and spool it.
    Store,
    /// A redelivery of one received before: acknowledge, store nothing.
    Redelivery,
    /// Likely a redelivery (see [`Resend::Uncertain`]): one whose readings
    /// carry times of their own is acknowledged and not stored, any other
    /// is stored (a duplicate rather than a loss).
    Resent,
    /// palletd's own probe: acknowledge (in order), store nothing.
    Probe,
    /// Not a PUBLISH: a record voiding identities (see [`Action::Void`]).
    Void(Void),
    /// Not a PUBLISH: where a resumed session's records start (see
    /// [`Action::Resumed`]).
    Resumed,
}

/// A SUBSCRIBE waiting for its SUBACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    Probe,
    Data,
}

/// One MQTT session as palletd keeps it.
#[derive(Debug, Clone)]
pub struct Session {
    pub index: usize,
    pub client_id: String,
    /// [`session_key`] of the client id: its messages' identities are
    /// recorded under it.
    pub key: u64,
    retiring: bool,
    /// The data filters as planned (shared where shared).
    planned: Vec<(String, u8)>,
    /// What it subscribes (after [`Verdict::NotDelivered`] on the first
    /// session: unshared).
    subscribe: Vec<(String, u8)>,
    probe: Option<Probe>,
    /// Filters to take off once the new ones are subscribed.
    unsubscribe: Vec<String>,
    /// UNSUBSCRIBEs sent, oldest first, waiting for their UNSUBACK.
    unsubscribing: VecDeque<String>,
    subacks: VecDeque<Pending>,
    window: Window,
    verdict: Verdict,
    connected: bool,
    /// The data SUBSCRIBE went out on this connection.
    data_started: bool,
    /// QoS 1/2 messages received (each is acknowledged, in order).
    received: u64,
    /// QoS 1/2 messages received on this connection.
    received_here: u64,
    /// Of those, sent with DUP: the broker's resends hold at least as many
    /// as it had unacknowledged.
    resent_here: u64,
    /// The broker's in-flight window as palletd takes it (half the
    /// redelivery window): what it was told, or more once seen.
    broker_window: usize,
    /// Since when nothing came (a retiring session is done after
    /// [`RETIRE_QUIET`]).
    quiet_since: Option<Instant>,
    /// Records voiding identities ([`Action::Void`]) not yet durable in
    /// the spool: nothing is subscribed until they are, so no message of a
    /// session the broker made anew can come before palletd recorded that
    /// the old one's identities are void.
    voids: u32,
    /// The window's identities from before the session was last resumed
    /// are settled: resent (confirmed) or void. Until then nothing is
    /// subscribed.
    settled: bool,
    /// The UNSUBSCRIBE of [`SETTLE_FILTER`] went out on this connection.
    settling: bool,
}

impl Session {
    /// A session for `plan`, its window of `window` messages holding
    /// `recovered` (oldest first), shared subscriptions proved by `probe`.
    pub fn new(
        plan: Planned,
        probe: Option<Probe>,
        window: usize,
        recovered: &[Seen],
        verdict: Verdict,
        numbering: Numbering,
    ) -> Session {
        Session {
            index: plan.index,
            key: session_key(&plan.client_id),
            client_id: plan.client_id,
            retiring: plan.retiring,
            planned: plan.subscribe.clone(),
            subscribe: plan.subscribe,
            probe: probe.filter(|_| !plan.retiring),
            unsubscribe: plan.unsubscribe,
            unsubscribing: VecDeque::new(),
            subacks: VecDeque::new(),
            window: Window::new(window, recovered, numbering),
            verdict,
            connected: false,
            data_started: false,
            received: 0,
            received_here: 0,
            resent_here: 0,
            broker_window: (window / 2).max(1),
            quiet_since: None,
            voids: 0,
            settled: recovered.is_empty(),
            settling: false,
        }
    }

    pub(crate) fn retiring(&self) -> bool {
        self.retiring
    }

    /// QoS 1/2 messages received so far.
    #[cfg(test)]
    pub(crate) fn received(&self) -> u64 {
        self.received
    }

    fn own_group(&self) -> bool {
        self.probe.as_ref().is_some_and(|p| p.own_group)
    }

    /// Its data waits for the verdict: shared in palletd's own group, and
    /// not yet proved.
    fn waits(&self) -> bool {
        self.own_group()
            && self.verdict == Verdict::Pending
            && self.subscribe.iter().any(|(f, _)| unshared(f).is_some())
    }

    /// Connected (a CONNACK). A broker that kept no session resends
    /// nothing: the window is emptied and that is recorded
    /// ([`Void::Reset`]). A resumed session whose window holds identities
    /// (recovered at start, or from before the link dropped) first learns
    /// which the broker still resends, since a broker that forgot the
    /// session and made it anew (palletd died, or the link dropped, before
    /// it read the CONNACK that said so) numbers its messages from 1 again:
    /// it unsubscribes [`SETTLE_FILTER`], whose UNSUBACK comes after what
    /// the broker resent, and records that the others are void
    /// ([`Void::Settled`]). Nothing is subscribed until such a record is
    /// durable ([`Session::recorded`]). Then it subscribes the probe while
    /// the verdict is pending, and the data (unless it waits for the
    /// verdict) on every connect ([`Session::start_data`]). Then takes off
    /// what an earlier configuration left (again after a reconnect until
    /// the broker acknowledged it).
    pub(crate) fn connected(&mut self, session_present: bool, now: Instant) -> Vec<Action> {
        self.connected = true;
        self.received_here = 0;
        self.resent_here = 0;
        self.data_started = false;
        self.settling = false;
        self.subacks.clear();
        self.unsubscribing.clear();
        self.quiet_since = Some(now);
        let mut out = Vec::new();
        if !session_present {
            self.window.clear();
            self.settled = true;
            self.voids += 1;
            out.push(Action::Void(Void::Reset));
        } else if !self.window.is_empty() {
            self.window.resume();
            self.settled = false;
            out.push(Action::Resumed);
            self.settling = true;
            self.unsubscribing.push_back(SETTLE_FILTER.to_string());
            out.push(Action::Unsubscribe(SETTLE_FILTER.to_string()));
        } else {
            self.settled = true;
        }
        if !self.may_subscribe() {
            out.push(Action::Ready(false));
            return out;
        }
        self.subscribe_all(&mut out);
        out
    }

    /// The broker wrote something after what it resent: identities from
    /// before the resume not resent by now are void, and that is recorded.
    fn settle(&mut self, out: &mut Vec<Action>) {
        if self.settled {
            return;
        }
        self.window.settle();
        self.settled = true;
        self.voids += 1;
        out.push(Action::Void(Void::Settled));
    }

    /// A record of [`Action::Void`] is durable in the spool: once none
    /// waits, the session subscribes what it held back.
    pub(crate) fn recorded(&mut self) -> Vec<Action> {
        self.voids = self.voids.saturating_sub(1);
        let mut out = Vec::new();
        if self.may_subscribe() && self.connected {
            self.subscribe_all(&mut out);
        }
        out
    }

    fn subscribe_all(&mut self, out: &mut Vec<Action>) {
        if self.retiring {
            self.take_off(out);
            return;
        }
        if let (Some(p), Verdict::Pending) = (&self.probe, self.verdict) {
            self.subacks.push_back(Pending::Probe);
            out.push(Action::Subscribe(vec![(p.filter.clone(), 0)]));
        }
        if self.waits() {
            out.push(Action::Ready(false));
            return;
        }
        self.start_data(out);
    }

    /// Subscribes the data filters, on every connect: a kept session may
    /// have lost them (Mosquitto 2.0 keeps a session's plain subscriptions
    /// across its restart but not its shared ones; a SUBSCRIBE lost with
    /// a link, or a CONNACK without a session lost with its link, leaves
    /// them unmade). The broker then sends the topics' retained values
    /// again: the retained rule ([`crate::front::retained`]) stores none
    /// of them twice, and under MQTT 5 the subscription asks for none
    /// when it exists (Retain Handling 1).
    fn start_data(&mut self, out: &mut Vec<Action>) {
        self.subacks.push_back(Pending::Data);
        self.data_started = true;
        out.push(Action::Ready(false));
        out.push(Action::Subscribe(self.subscribe.clone()));
        self.take_off(out);
    }

    /// Sends the UNSUBSCRIBEs not yet under way.
    fn take_off(&mut self, out: &mut Vec<Action>) {
        for f in &self.unsubscribe {
            if !self.unsubscribing.contains(f) {
                self.unsubscribing.push_back(f.clone());
                out.push(Action::Unsubscribe(f.clone()));
            }
        }
    }

    /// Nothing holds the session's subscriptions back.
    fn may_subscribe(&self) -> bool {
        self.voids == 0 && self.settled
    }

    /// The connection dropped.
    pub(crate) fn disconnected(&mut self) {
        self.connected = false;
        self.subacks.clear();
    }

    /// The verdict on shared subscriptions changed. Proved: the data is
    /// subscribed. Not delivered, in palletd's own group: the first
    /// session subscribes everything unshared and takes the shared
    /// filters off, the others retire.
    pub(crate) fn verdict(&mut self, verdict: Verdict) -> Vec<Action> {
        let was = std::mem::replace(&mut self.verdict, verdict);
        let mut out = Vec::new();
        if was == verdict || self.retiring {
            return out;
        }
        match verdict {
            Verdict::Delivered if self.connected && !self.data_started && self.may_subscribe() => {
                self.start_data(&mut out);
            }
            Verdict::NotDelivered if self.own_group() => {
                let mut off: Vec<String> = self
                    .planned
                    .iter()
                    .filter(|(f, _)| unshared(f).is_some())
                    .map(|(f, _)| f.clone())
                    .collect();
                off.extend(self.probe.as_ref().map(|p| p.filter.clone()));
                if self.index == 0 {
                    for (f, _) in &mut self.subscribe {
                        if let Some(plain) = unshared(f) {
                            *f = plain.to_string();
                        }
                    }
                    // A plain filter an earlier configuration left is
                    // wanted again: no longer taken off (an UNSUBSCRIBE
                    // already sent is answered before this SUBSCRIBE, so
                    // the broker ends up holding it).
                    let subscribe = &self.subscribe;
                    self.unsubscribe
                        .retain(|f| !subscribe.iter().any(|(w, _)| w == f));
                    for f in off {
                        if !self.unsubscribe.contains(&f) {
                            self.unsubscribe.push(f);
                        }
                    }
                    out.push(Action::Hold(
                        self.subscribe.iter().map(|(f, _)| f.clone()).collect(),
                    ));
                    if self.connected && self.may_subscribe() {
                        self.start_data(&mut out);
                    }
                } else {
                    self.retiring = true;
                    out.push(Action::Leaves);
                    for f in off {
                        if !self.unsubscribe.contains(&f) {
                            self.unsubscribe.push(f);
                        }
                    }
                    if self.connected && self.may_subscribe() {
                        self.take_off(&mut out);
                    }
                }
            }
            _ => {}
        }
        out
    }

    /// The broker answered the oldest SUBSCRIBE (after any message it
    /// resent on this connection).
    pub(crate) fn suback(&mut self, codes: &[Result<u8, String>]) -> Vec<Action> {
        let mut out = Vec::new();
        self.settle(&mut out);
        if self.subacks.pop_front() == Some(Pending::Probe) {
            match (codes.first(), &self.probe) {
                (Some(Ok(_)), _) => out.push(Action::ProbeReady),
                (Some(Err(reason)), Some(p)) => {
                    out.push(Action::Refused {
                        filter: p.filter.clone(),
                        reason: reason.clone(),
                    });
                    if p.own_group {
                        out.push(Action::NotShared);
                    }
                }
                _ => {}
            }
            return out;
        }
        let mut all = true;
        let mut not_shared = false;
        for (code, (filter, _)) in codes.iter().zip(&self.subscribe) {
            match code {
                Ok(qos) => out.push(Action::Granted {
                    filter: filter.clone(),
                    qos: *qos,
                }),
                Err(reason) => {
                    all = false;
                    not_shared |= unshared(filter).is_some() && self.own_group();
                    out.push(Action::Refused {
                        filter: filter.clone(),
                        reason: reason.clone(),
                    });
                }
            }
        }
        if not_shared {
            out.push(Action::NotShared);
            return out;
        }
        out.push(Action::Ready(all));
        out
    }

    /// The broker answered the oldest UNSUBSCRIBE: the filter it took
    /// off, to be forgotten in `mqtt-sessions.json`, unless a SUBSCRIBE
    /// sent after it (the unshared fallback) put it back; or
    /// [`SETTLE_FILTER`]'s, which settles the recovered identities.
    pub(crate) fn unsuback(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(filter) = self.unsubscribing.pop_front() else {
            return out;
        };
        if filter == SETTLE_FILTER && std::mem::take(&mut self.settling) {
            self.settle(&mut out);
            return out;
        }
        self.unsubscribe.retain(|f| *f != filter);
        let again = self.subscribe.iter().any(|(f, _)| *f == filter);
        if !again || self.retiring {
            out.push(Action::Released(filter));
        }
        out
    }

    /// A PUBLISH arrived: what it is (`probe`: its topic is the probe's),
    /// and what follows from it (the first without DUP settles the
    /// recovered identities: the broker resends before anything new).
    pub(crate) fn publish(
        &mut self,
        qos: u8,
        pkid: u16,
        dup: bool,
        digest: u64,
        probe: bool,
        now: Instant,
    ) -> (Disposition, Vec<Action>) {
        self.quiet_since = Some(now);
        let mut out = Vec::new();
        if qos == 0 {
            let d = match probe {
                true => Disposition::Probe,
                false => Disposition::Store,
            };
            return (d, out);
        }
        self.received += 1;
        self.received_here += 1;
        self.resent_here += u64::from(dup);
        if !dup {
            self.settle(&mut out);
        }
        if probe {
            return (Disposition::Probe, out);
        }
        let seen = Seen { pkid, digest };
        self.window.observe(pkid);
        let d = match dup {
            false => {
                self.window.arrived(seen);
                Disposition::Store
            }
            true => match self.window.redelivered(seen) {
                Some(Resend::Same) => Disposition::Redelivery,
                Some(Resend::Uncertain { .. }) => Disposition::Resent,
                None => Disposition::Store,
            },
        };
        out.extend(self.window.learned().map(Action::Numbering));
        (d, out)
    }

    /// How the broker numbers its resends, as the process knows it now
    /// (asked, or seen by another session): taken if this session did not
    /// know.
    pub(crate) fn numbering(&mut self, known: Numbering) {
        self.window.numbering(known);
    }

    /// `acked_here` PUBACKs of this connection's messages handed to the
    /// client: when more of its messages than the broker's window (as
    /// palletd takes it) are unacknowledged, the broker allows more in
    /// flight than it was told (MQTT 3.1.1 says nothing of it; the
    /// operator sets `mqtt.max_inflight` to the broker's, or leaves the
    /// default). The window is raised to what was seen, and the new size
    /// returned (to keep, say and count): a resend from further back
    /// would be taken for a new message. Unacknowledged here is at most
    /// what the broker holds (it sent at least what arrived, and got at
    /// most the PUBACKs sent), so this never overestimates; nor are the
    /// messages it resent with DUP since the connect.
    pub(crate) fn learn(&mut self, acked_here: u64) -> Option<usize> {
        // The messages it resent on this connection were unacknowledged
        // at once, too.
        let held = self
            .received_here
            .saturating_sub(acked_here)
            .max(self.resent_here) as usize;
        if held <= self.broker_window || self.broker_window >= MAX_BROKER_WINDOW {
            return None;
        }
        // Doubled at least: a broker that keeps sending is learned in a
        // few steps, not one message at a time.
        let window = held.max(2 * self.broker_window).min(MAX_BROKER_WINDOW);
        self.broker_window = window;
        self.window.widen(2 * window);
        Some(window)
    }

    /// Retiring, and done: connected, the broker took every filter off,
    /// every message received is acknowledged (`acked`) and nothing came
    /// for [`RETIRE_QUIET`] (the broker sends what it queued as soon as
    /// the window has room).
    pub(crate) fn retired(&self, acked: u64, now: Instant) -> bool {
        self.retiring
            && self.connected
            && self.may_subscribe()
            && self.unsubscribe.is_empty()
            && acked >= self.received
            && self
                .quiet_since
                .is_some_and(|t| now.saturating_duration_since(t) >= RETIRE_QUIET)
    }
}

/// The probe's timing, on the first connection: published once its
/// filter is subscribed there and again every [`PROBE_EVERY`]; given up
/// after [`PROBE_WAIT`] of reading from the broker without an answer. Time
/// does not count while palletd does not read (the connection is down, or
/// its queue to the spool is full): a probe not read proves nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProbeCheck {
    /// Reading time spent waiting, and when the clock last moved.
    waited: Option<(Duration, Instant)>,
    /// Reading time since the probe was last published.
    since_sent: Duration,
}

/// What the probe's timing asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeStep {
    Wait,
    Publish,
    GiveUp,
}

impl ProbeCheck {
    /// The probe's filter is subscribed on the first connection.
    pub(crate) fn ready(&mut self, now: Instant) -> ProbeStep {
        self.waited = Some((Duration::ZERO, now));
        self.since_sent = Duration::ZERO;
        ProbeStep::Publish
    }

    /// The first connection dropped: the probe starts again on the next.
    pub(crate) fn disconnected(&mut self) {
        self.waited = None;
    }

    /// Whether it waits for an answer now.
    pub(crate) fn waiting(&self) -> bool {
        self.waited.is_some()
    }

    /// The clock moves to `now`; `reading`: palletd read from the broker
    /// meanwhile.
    pub(crate) fn tick(&mut self, now: Instant, reading: bool) -> ProbeStep {
        let Some((waited, last)) = self.waited else {
            return ProbeStep::Wait;
        };
        let dt = match reading {
            true => now.saturating_duration_since(last),
            false => Duration::ZERO,
        };
        let waited = waited + dt;
        self.since_sent += dt;
        self.waited = Some((waited, now));
        if waited >= PROBE_WAIT {
            self.waited = None;
            return ProbeStep::GiveUp;
        }
        if self.since_sent >= PROBE_EVERY {
            self.since_sent = Duration::ZERO;
            return ProbeStep::Publish;
        }
        ProbeStep::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::plan::{plan, probe, tests as p, Subscribed};

    fn sessions(connections: usize, before: &Subscribed) -> Vec<Session> {
        let m = p::settings(connections);
        let pr = probe(&m, &p::subs());
        plan(&m, &p::subs(), before)
            .into_iter()
            .map(|pl| {
                Session::new(
                    pl,
                    pr.clone(),
                    20,
                    &[],
                    Verdict::initial(pr.as_ref()),
                    Numbering::Kept,
                )
            })
            .collect()
    }

    fn subscribes(a: &[Action]) -> Vec<Vec<String>> {
        a.iter()
            .filter_map(|a| match a {
                Action::Subscribe(f) => Some(f.iter().map(|f| f.0.clone()).collect()),
                _ => None,
            })
            .collect()
    }

    fn unsubscribes(a: &[Action]) -> Vec<String> {
        a.iter()
            .filter_map(|a| match a {
                Action::Unsubscribe(f) => Some(f.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn data_waits_for_the_probe_and_is_subscribed_once_it_came_back() {
        let now = Instant::now();
        let mut s = sessions(2, &Subscribed::new());
        let a = s[0].connected(false, now);
        assert_eq!(
            a,
            [Action::Void(Void::Reset), Action::Ready(false)],
            "nothing before the reset is durable"
        );
        let a = s[0].recorded();
        assert_eq!(subscribes(&a), [["$share/box/palletd/probe/box"]]);
        assert!(a.contains(&Action::Ready(false)));
        assert_eq!(s[0].suback(&[Ok(0)]), [Action::ProbeReady]);
        let a = s[0].verdict(Verdict::Delivered);
        assert_eq!(
            subscribes(&a),
            [["$share/box/s/+/data", "spBv1.0/#"]],
            "the data once proved"
        );
        let a = s[0].suback(&[Ok(1), Ok(1)]);
        assert_eq!(a.last(), Some(&Action::Ready(true)));
        // A reconnect: shared filters again, the probe not.
        s[0].disconnected();
        let a = s[0].connected(true, now);
        assert_eq!(subscribes(&a), [["$share/box/s/+/data", "spBv1.0/#"]]);
        // Connected after the verdict: subscribed at once.
        s[1].verdict(Verdict::Delivered);
        let a = s[1].connected(true, now);
        assert_eq!(subscribes(&a), [["$share/box/s/+/data"]]);
    }

    #[test]
    fn not_delivered_unshares_the_first_session_and_retires_the_others() {
        let now = Instant::now();
        let before = crate::front::plan::legacy(&p::settings(1), &p::subs());
        let mut s = sessions(3, &before);
        for x in s.iter_mut() {
            x.connected(true, now);
        }
        let a = s[0].verdict(Verdict::NotDelivered);
        assert_eq!(
            a.first(),
            Some(&Action::Hold(vec!["s/+/data".into(), "spBv1.0/#".into()]))
        );
        assert_eq!(subscribes(&a), [["s/+/data", "spBv1.0/#"]]);
        // The upgrade's plain filter is kept; the shared ones and the
        // probe's go.
        assert_eq!(
            unsubscribes(&a),
            ["$share/box/s/+/data", "$share/box/palletd/probe/box"]
        );
        let a = s[1].verdict(Verdict::NotDelivered);
        assert_eq!(a[0], Action::Leaves);
        assert_eq!(
            unsubscribes(&a),
            ["$share/box/s/+/data", "$share/box/palletd/probe/box"]
        );
        assert!(s[1].retiring());
        assert!(!s[1].retired(0, now + RETIRE_QUIET), "not yet unsubscribed");
        assert_eq!(
            s[1].unsuback(),
            [Action::Released("$share/box/s/+/data".into())]
        );
        s[1].unsuback();
        assert!(s[1].retired(0, now + RETIRE_QUIET));
        assert!(!s[1].retired(0, now + RETIRE_QUIET / 2), "not quiet yet");
    }

    #[test]
    fn a_refused_shared_subscription_is_not_shared_only_in_our_own_group() {
        let now = Instant::now();
        let mut s = sessions(2, &Subscribed::new());
        s[0].connected(false, now);
        s[0].recorded();
        let a = s[0].suback(&[Err("Failure".into())]);
        assert_eq!(a.last(), Some(&Action::NotShared));
        // The operator's own group (several instances): never unshared.
        let mut m = p::settings(2);
        m.share_group = Some("g".into());
        let pr = probe(&m, &p::subs());
        let pl = plan(&m, &p::subs(), &Subscribed::new()).remove(0);
        let mut s = Session::new(pl, pr, 20, &[], Verdict::Pending, Numbering::Kept);
        s.connected(false, now);
        let a = s.recorded();
        assert_eq!(subscribes(&a).len(), 2, "probe and data at once");
        s.suback(&[Ok(0)]);
        let a = s.suback(&[Err("Failure".into()), Ok(1)]);
        assert!(!a.contains(&Action::NotShared));
        assert_eq!(a.last(), Some(&Action::Ready(false)));
        assert!(s.verdict(Verdict::NotDelivered).is_empty());
    }

    #[test]
    fn a_dup_is_a_redelivery_only_of_the_latest_message_with_its_id_in_the_window() {
        let now = Instant::now();
        let m = p::settings(1);
        let pl = plan(&m, &p::subs(), &Subscribed::new()).remove(0);
        let recovered = [
            Seen {
                pkid: 7,
                digest: 70,
            },
            Seen {
                pkid: 6,
                digest: 60,
            },
        ];
        let mut s = Session::new(pl, None, 2, &recovered, Verdict::Unneeded, Numbering::Kept);
        // A start that recovered identities learns first which the broker
        // resends: nothing is subscribed before.
        let a = s.connected(true, now);
        assert_eq!(subscribes(&a), Vec::<Vec<String>>::new());
        assert_eq!(unsubscribes(&a), [SETTLE_FILTER]);
        let publish =
            |s: &mut Session, pkid, dup, digest| s.publish(1, pkid, dup, digest, false, now).0;
        assert_eq!(
            publish(&mut s, 7, true, 70),
            Disposition::Redelivery,
            "resent"
        );
        assert_eq!(s.unsuback(), [Action::Void(Void::Settled)]);
        assert_eq!(
            publish(&mut s, 6, true, 60),
            Disposition::Store,
            "not resent before: void"
        );
        let a = s.recorded();
        assert_eq!(
            subscribes(&a),
            [["s/+/data", "spBv1.0/#"]],
            "durable: subscribed"
        );
        assert_eq!(
            publish(&mut s, 7, false, 70),
            Disposition::Store,
            "no DUP: new"
        );
        assert_eq!(publish(&mut s, 7, true, 70), Disposition::Redelivery);
        assert_eq!(
            publish(&mut s, 8, true, 80),
            Disposition::Store,
            "first seen"
        );
        assert_eq!(publish(&mut s, 9, false, 90), Disposition::Store);
        assert_eq!(
            publish(&mut s, 7, true, 70),
            Disposition::Store,
            "out of the window of 2: acknowledged beyond doubt"
        );
        assert_eq!(s.publish(0, 0, false, 1, false, now).0, Disposition::Store);
        assert_eq!(s.publish(1, 3, false, 1, true, now).0, Disposition::Probe);
        assert_eq!(s.received(), 8);
        let a = s.connected(false, now);
        assert_eq!(a[0], Action::Void(Void::Reset));
        assert_eq!(
            publish(&mut s, 9, true, 90),
            Disposition::Store,
            "no session kept: nothing is resent"
        );
    }

    #[test]
    fn a_broker_window_larger_than_told_is_learned_in_doublings() {
        let now = Instant::now();
        let m = p::settings(1);
        let pl = plan(&m, &p::subs(), &Subscribed::new()).remove(0);
        // Told 10 (a redelivery window of 20).
        let mut s = Session::new(pl, None, 20, &[], Verdict::Unneeded, Numbering::Kept);
        s.connected(true, now);
        for pkid in 1..=10 {
            s.publish(1, pkid, false, u64::from(pkid), false, now);
        }
        assert_eq!(s.learn(0), None, "10 unacknowledged: within");
        s.publish(1, 11, false, 11, false, now);
        assert_eq!(s.learn(0), Some(20), "11: doubled at least");
        assert_eq!(s.learn(5), None);
        for pkid in 12..=60 {
            s.publish(1, pkid, false, u64::from(pkid), false, now);
        }
        assert_eq!(s.learn(0), Some(60), "what was seen, when more than double");
        // Resends count as held, whatever was acknowledged since.
        s.connected(true, now);
        for pkid in 1..=200 {
            s.publish(1, pkid, true, 1000 + u64::from(pkid), false, now);
        }
        assert_eq!(s.learn(200), Some(200));
    }

    #[test]
    fn only_a_refusal_undoes_a_verdict() {
        use Evidence::*;
        let p = Verdict::Pending;
        assert_eq!(p.after(ProbeBack), Some(Verdict::Delivered));
        assert_eq!(p.after(ProbeLost), Some(Verdict::NotDelivered));
        let d = Verdict::Delivered;
        assert_eq!(d.after(ProbeLost), None, "a probe lost after one came back");
        assert_eq!(d.after(ProbeBack), None);
        assert_eq!(d.after(Refused), Some(Verdict::NotDelivered));
        assert_eq!(Verdict::NotDelivered.after(ProbeBack), None);
        assert_eq!(Verdict::Unneeded.after(Refused), None);
    }

    #[test]
    fn the_probe_is_sent_again_and_given_up_only_while_palletd_reads() {
        let t = Instant::now();
        let mut c = ProbeCheck::default();
        assert_eq!(c.tick(t, true), ProbeStep::Wait);
        assert_eq!(c.ready(t), ProbeStep::Publish);
        assert_eq!(c.tick(t + PROBE_EVERY / 2, true), ProbeStep::Wait);
        assert_eq!(c.tick(t + PROBE_EVERY, true), ProbeStep::Publish);
        c.disconnected();
        assert_eq!(
            c.tick(t + PROBE_WAIT * 2, true),
            ProbeStep::Wait,
            "an outage"
        );
        let t = t + PROBE_WAIT * 2;
        c.ready(t);
        // Not reading (the queue to the spool is full): the clock stands.
        assert_eq!(c.tick(t + PROBE_WAIT * 3, false), ProbeStep::Wait);
        assert!(c.waiting());
        let t = t + PROBE_WAIT * 3;
        assert_eq!(c.tick(t + PROBE_WAIT / 2, true), ProbeStep::Publish);
        assert_eq!(c.tick(t + PROBE_WAIT, true), ProbeStep::GiveUp);
        assert!(!c.waiting());
    }
}
