//! The front door against a model broker: every message the broker
//! routes to one of palletd's sessions is admitted (spooled) exactly once,
//! through arbitrary sequences of publishes, connections that die with
//! packets in flight either way, PUBACKs lost with them, syncs of the
//! spool, checkpoints that delete its records, crashes (what was not
//! durable is gone), restarts with another `mqtt.connections`, broker
//! restarts that forget the shared subscriptions (Mosquitto 2.0) or every
//! session, and a broker that grants `$share/` without delivering through
//! it (aedes).
//!
//! The model broker behaves as Mosquitto was measured to: persistent
//! sessions; an in-flight window ([`BROKER_WINDOW`]) per session; packet
//! ids counted up per session and wrapping after [`PACKET_IDS`] (so ids
//! are reused within a run); unacknowledged messages resent first, in
//! order, with DUP, when the session is resumed, never to another member
//! of a group; a shared group served round robin over its members, online
//! or not (offline ones queue their share); QoS 0 not queued for an
//! offline session. Topics and payloads come from a tiny set, so many
//! messages share a digest (a constant sensor). palletd's side is the
//! real [`Session`], [`ProbeCheck`], [`plan`], the admission's
//! [`AckQueue`] and the spool's [`Windows`] (recorded as the appender
//! does, written to their file before a checkpoint deletes records,
//! recovered from the file and the records left), glued as the edges glue
//! them. The network carries each direction in order; what palletd hands
//! its client while the link is down waits as rumqttc keeps it: made
//! before the client saw the link die, PUBACKs (rumqttc) and
//! (UN)SUBSCRIBEs (palletd) are dropped and the rest sent again after the
//! next CONNACK if the session was kept; made after, it waits in the
//! request channel for the next connection.
//!
//! A message routed twice (during a change of configuration a session
//! may briefly hold both a plain and a shared filter: the new one is
//! subscribed before the old one is taken off) is two deliveries; each is
//! admitted once. The model assumes what [`RETIRE_QUIET`] assumes: the
//! broker sends what a session holds within that time of having room
//! (time passes only once the network is quiet). `PALLETD_MODEL_TRACE=1`
//! prints what happens, to read a failing case.
//!
//! Mutants this kills (each tried with `PROPTEST_CASES=2000`; the named
//! tests kill theirs every time):
//! - matching a DUP against any earlier message with its packet id, not
//!   only the window's: a constant sensor's message after the ids wrapped
//!   is skipped, lost (`a_constant_sensors_message_...`);
//! - keying the identities by connection index instead of client id: a
//!   retiring session's redeliveries stored twice;
//! - a window of the broker's `W` rather than `2W`: a PUBACK carried over
//!   to the next connection lets the broker send past the one it will
//!   resend, stored twice;
//! - keeping the window when the broker kept no session: the new
//!   session's numbers used again, lost (`a_forgotten_sessions_...`);
//! - subscribing before the record that voids old identities is durable:
//!   a crash leaves them standing for the new session's messages, lost
//!   (`a_crash_after_a_forgotten_session_...`);
//! - keeping identities the broker did not resend on a resume: a session
//!   it made anew (the CONNACK that said so lost) inherits them, lost
//!   (`a_lost_connack_...`);
//! - not recording a redelivery's identity again where it arrived: the
//!   void at settling drops it, stored twice;
//! - acknowledging a redelivery at once rather than behind what came
//!   before it (the admission's rule, glued here as there): its original
//!   not yet durable, lost with a crash;
//! - retiring a session before everything it received is acknowledged:
//!   a message not yet durable is stranded with it, lost
//!   (`a_retiring_session_...`).
//!
//! The ack queue's own order (releasing ready entries past one that is
//! not) is no mutant here: ends only grow, so it cannot reorder. The
//! spool's property test kills the two mutants of keeping the windows on
//! disk (recording identities before they are durable; deleting segments
//! without writing the file first).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::plan::{self, Probe, Subscribed, RETIRE_QUIET};
use super::session::{
    proves_sharing, Action, Disposition, Evidence, ProbeCheck, ProbeStep, Session, Verdict, Void,
    PROBE_WAIT, SETTLE_FILTER,
};
use super::window::{digest, session_key, Numbering, Replay, Seen, Windows, RESET};
use crate::config::MqttSettings;
use crate::decode::Subscription;

/// The broker's in-flight window per session (palletd keeps as many).
const BROKER_WINDOW: usize = 3;
/// Packet ids 1..=PACKET_IDS, counted up and wrapping.
const PACKET_IDS: u16 = 12;
const TOPICS: [&str; 2] = ["s/a/data", "s/b/data"];
const PAYLOADS: [&str; 2] = ["1", "2"];

/// One routing of a message to a session: (message, routing).
type Copy = (u32, u32);

#[derive(Debug, Clone)]
struct Delivery {
    copy: Copy,
    topic: String,
    payload: String,
    qos: u8,
}

/// Broker to palletd.
#[derive(Debug, Clone)]
enum Down {
    ConnAck(bool),
    Publish { pkid: u16, dup: bool, d: Delivery },
    SubAck(Vec<Result<u8, String>>),
    UnsubAck,
}

/// palletd to broker.
#[derive(Debug, Clone)]
enum Up {
    Subscribe(Vec<(String, u8)>),
    Unsubscribe(String),
    PubAck(u16),
    /// palletd's probe (QoS 1).
    Probe,
    Disconnect,
}

#[derive(Debug, Default)]
struct BSession {
    subs: BTreeMap<String, u8>,
    inflight: VecDeque<(u16, Delivery)>,
    queue: VecDeque<Delivery>,
    last_pkid: u16,
    /// The link it is attached to (its client id's).
    online: bool,
}

/// One client id's TCP connection (and rumqttc's request channel).
#[derive(Debug, Default)]
struct Link {
    up: bool,
    /// The link died and palletd's event loop has not polled the error
    /// yet (its session still takes itself for connected).
    unnoticed: bool,
    down: VecDeque<Down>,
    up_q: VecDeque<Up>,
    /// Requests made before the client saw the link die: rumqttc then
    /// drops the PUBACKs (`EventLoop::clean`), palletd the (UN)SUBSCRIBEs,
    /// and the rest is sent again after the next CONNACK if the broker
    /// kept the session.
    pending: VecDeque<Up>,
    /// Requests made while the link is known down: they wait in the
    /// request channel and go out on the next connection.
    outbox: VecDeque<Up>,
}

#[derive(Debug)]
struct Broker {
    sessions: BTreeMap<String, BSession>,
    links: BTreeMap<String, Link>,
    shared_ok: bool,
    /// Resends a resumed session's unacknowledged messages under the new
    /// connection's packet ids, counting from 1 (RabbitMQ), rather than
    /// the ids they had.
    renumbers: bool,
    rr: BTreeMap<String, usize>,
    next_copy: u32,
    /// Every QoS 1 routing to a session.
    routed: Vec<Copy>,
    /// Routings lost with a broker that forgot its sessions.
    forgotten: BTreeSet<Copy>,
}

fn matches(filter: &str, topic: &str) -> bool {
    let (mut f, mut t) = (filter.split('/'), topic.split('/'));
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

impl Broker {
    fn new(shared_ok: bool, renumbers: bool) -> Broker {
        Broker {
            sessions: BTreeMap::new(),
            links: BTreeMap::new(),
            shared_ok,
            renumbers,
            rr: BTreeMap::new(),
            next_copy: 0,
            routed: Vec::new(),
            forgotten: BTreeSet::new(),
        }
    }

    fn link(&mut self, id: &str) -> &mut Link {
        self.links.entry(id.to_string()).or_default()
    }

    /// A client connects: CONNACK, then its unacknowledged messages again
    /// (DUP), then what it has room for.
    fn connect(&mut self, id: &str) {
        let present = self.sessions.contains_key(id);
        trace(|| format!("{id} connects, session present {present}"));
        let s = self.sessions.entry(id.to_string()).or_default();
        s.online = true;
        if self.renumbers {
            // The new connection numbers from 1, its resends first.
            s.last_pkid = 0;
            for (pkid, _) in s.inflight.iter_mut() {
                s.last_pkid += 1;
                *pkid = s.last_pkid;
            }
        }
        // A CONNECT taking over a session resends its window.
        let mut down = vec![Down::ConnAck(present)];
        for (pkid, d) in &s.inflight {
            down.push(Down::Publish {
                pkid: *pkid,
                dup: true,
                d: d.clone(),
            });
        }
        let link = self.links.entry(id.to_string()).or_default();
        link.up = true;
        link.down.extend(down);
        // What the client holds goes out now: its pending requests if the
        // session was kept, then its request channel.
        let pending: Vec<Up> = link.pending.drain(..).collect();
        if present {
            link.up_q.extend(pending);
        }
        let out: Vec<Up> = link.outbox.drain(..).collect();
        link.up_q.extend(out);
        self.fill(id);
    }

    /// The connection dies: what was on the wire either way is lost.
    fn drop_link(&mut self, id: &str) {
        if let Some(l) = self.links.get_mut(id) {
            l.unnoticed |= l.up;
            l.up = false;
            l.down.clear();
            l.up_q.clear();
        }
        if let Some(s) = self.sessions.get_mut(id) {
            s.online = false;
        }
    }

    /// Sends queued messages while the window has room.
    fn fill(&mut self, id: &str) {
        let Some(s) = self.sessions.get_mut(id) else {
            return;
        };
        if !s.online {
            return;
        }
        let mut out = Vec::new();
        while s.inflight.len() < BROKER_WINDOW {
            let Some(d) = s.queue.pop_front() else { break };
            let mut pkid = s.last_pkid;
            loop {
                pkid = pkid % PACKET_IDS + 1;
                if !s.inflight.iter().any(|(p, _)| *p == pkid) {
                    break;
                }
            }
            trace(|| format!("broker sends {:?} to {id} as {pkid}", d.copy));
            s.last_pkid = pkid;
            s.inflight.push_back((pkid, d.clone()));
            out.push(Down::Publish {
                pkid,
                dup: false,
                d,
            });
        }
        self.link(id).down.extend(out);
    }

    fn deliver(&mut self, id: &str, d: Delivery) {
        let s = self.sessions.get_mut(id).expect("routed to a session");
        if d.qos == 0 {
            if s.online {
                self.link(id).down.push_back(Down::Publish {
                    pkid: 0,
                    dup: false,
                    d,
                });
            }
            return;
        }
        self.routed.push(d.copy);
        s.queue.push_back(d);
        self.fill(id);
    }

    /// Routes a message: to every session holding a plain filter that
    /// matches, and to one member of each shared group that does (if the
    /// broker delivers through groups at all).
    fn publish(&mut self, msg: u32, topic: &str, payload: &str, qos: u8) {
        let mut plain = Vec::new();
        let mut groups: BTreeMap<String, Vec<(String, u8)>> = BTreeMap::new();
        for (id, s) in &self.sessions {
            for (f, q) in &s.subs {
                match plan::unshared(f) {
                    Some(inner) if matches(inner, topic) => {
                        groups.entry(f.clone()).or_default().push((id.clone(), *q))
                    }
                    None if matches(f, topic) => plain.push((id.clone(), *q)),
                    _ => {}
                }
            }
        }
        let mut targets = plain;
        if self.shared_ok {
            for (f, members) in groups {
                let n = self.rr.entry(f).or_default();
                targets.push(members[*n % members.len()].clone());
                *n += 1;
            }
        }
        for (id, sub_qos) in targets {
            self.next_copy += 1;
            let d = Delivery {
                copy: (msg, self.next_copy),
                topic: topic.to_string(),
                payload: payload.to_string(),
                qos: qos.min(sub_qos),
            };
            self.deliver(&id, d);
        }
    }

    /// Takes one packet palletd sent on `id`'s link.
    fn take(&mut self, id: &str, probe_topic: &str) -> bool {
        let Some(up) = self.links.get_mut(id).and_then(|l| l.up_q.pop_front()) else {
            return false;
        };
        match up {
            Up::Subscribe(filters) => {
                let s = self.sessions.get_mut(id).expect("connected");
                let codes = filters.iter().map(|(_, q)| Ok(*q)).collect();
                s.subs.extend(filters);
                self.link(id).down.push_back(Down::SubAck(codes));
            }
            Up::Unsubscribe(f) => {
                if let Some(s) = self.sessions.get_mut(id) {
                    s.subs.remove(&f);
                }
                self.link(id).down.push_back(Down::UnsubAck);
            }
            Up::PubAck(pkid) => {
                trace(|| format!("broker gets PUBACK {pkid} from {id}"));
                if let Some(s) = self.sessions.get_mut(id) {
                    s.inflight.retain(|(p, _)| *p != pkid);
                }
                self.fill(id);
            }
            Up::Probe => self.publish(u32::MAX, probe_topic, "", 1),
            Up::Disconnect => self.drop_link(id),
        }
        true
    }

    /// A broker restart: every connection drops; Mosquitto 2.0 keeps the
    /// sessions and their plain subscriptions but not the shared ones;
    /// without persistence it keeps nothing.
    fn restart(&mut self, forget: bool) {
        let ids: Vec<String> = self.links.keys().cloned().collect();
        for id in ids {
            self.drop_link(&id);
        }
        if forget {
            for s in self.sessions.values() {
                for (_, d) in &s.inflight {
                    self.forgotten.insert(d.copy);
                }
                for d in &s.queue {
                    self.forgotten.insert(d.copy);
                }
            }
            self.sessions.clear();
        } else {
            for s in self.sessions.values_mut() {
                s.subs.retain(|f, _| plan::unshared(f).is_none());
            }
        }
    }

    /// Nothing held for these sessions.
    fn holds_nothing_for(&self, ids: &[String]) -> bool {
        ids.iter().all(|id| {
            self.sessions
                .get(id)
                .is_none_or(|s| s.inflight.is_empty() && s.queue.is_empty())
        })
    }
}

/// What survives a crash of palletd.
#[derive(Debug, Default)]
struct Disk {
    /// The spool's records: (LSN, sample's routing or identity).
    records: Vec<(u64, Rec)>,
    /// Everything below this is durable.
    durable: u64,
    /// Samples the database has (their records deleted by a checkpoint).
    confirmed: Vec<Copy>,
    /// `message-ids`.
    windows_file: Option<Vec<u8>>,
    /// `mqtt-sessions.json`.
    sessions: Subscribed,
    /// How the broker numbers its resends, as learned (`mqtt-broker`).
    numbering: super::window::Numbering,
}

#[derive(Debug, Clone, Copy)]
enum Rec {
    Sample(Copy),
    Id { key: u64, pkid: u16, digest: u64 },
}

struct Conn {
    session: Session,
    /// Holds a plain filter matching the probe's topic.
    plain_match: bool,
    probe: Option<ProbeCheck>,
    /// PUBACKs handed to its client, or not sent (an earlier
    /// generation's).
    acked: u64,
    disconnecting: bool,
    /// How many times the event loop saw its link fail.
    gen: u32,
    /// The LSN of a resend aligned under a new packet id, when no record
    /// voiding identities came after it and is durable.
    resent_undone: Option<u64>,
}

/// What the ack queue releases once durable.
#[derive(Debug, Clone, Copy)]
enum Ack {
    /// A PUBACK on connection `0`, of a message that arrived in the
    /// connection's generation `2` (a PUBACK of an earlier generation is
    /// not sent: `crate::ingest`'s `Generations`).
    Pub(usize, u16, u32),
    /// A record voiding connection `0`'s identities, at LSN `1`, is
    /// durable.
    Void(usize, u64),
}

/// palletd's memory: lost with a crash.
struct Palletd {
    probe: Option<Probe>,
    conns: Vec<Conn>,
    verdict: Verdict,
    acks: super::acks::AckQueue<Ack>,
    next_lsn: u64,
    /// The first LSN of this run.
    run_start: u64,
    /// The appender's windows (of durable identities).
    windows: Windows,
    /// Identities appended, not yet durable.
    appended: Vec<(u64, u64, Seen)>,
    /// Per session key, where its records start since it was last resumed.
    resumed_at: BTreeMap<u64, u64>,
}

fn settings(connections: usize) -> (MqttSettings, Vec<Subscription>) {
    let text = format!(
        "[mqtt]\nurl = \"mqtt://localhost\"\nclient_id = \"box\"\nconnections = {connections}\nmax_inflight = {BROKER_WINDOW}\n[mongodb]\nuri = \"mongodb://localhost\"\ndatabase = \"d\"\ncollection = \"c\"\n[spool]\ndir = \"/tmp/x\"\n[[subscription]]\ntopic = \"s/{{sensor}}/data\"\nformat = \"json\"\n"
    );
    let s = crate::config::parse(&text, None).unwrap_or_else(|e| panic!("{e:?}"));
    (s.mqtt, s.subscriptions)
}

struct World {
    broker: Broker,
    disk: Disk,
    palletd: Palletd,
    now: Instant,
    next_msg: u32,
    /// Every message's payload differs from every other's.
    distinct: bool,
    /// A message may be admitted more than once (never less): a broker
    /// that renumbers its resends of payloads that repeat.
    at_least_once: bool,
}

impl World {
    /// A world whose broker delivers through `$share/` or not, renumbers
    /// its resends or not; palletd starts knowing how it numbers as
    /// `numbering` says (a keeper, learned by an earlier run, unless said).
    fn new(connections: usize, shared_ok: bool, renumbers: bool) -> World {
        let numbering = match renumbers {
            true => Numbering::Unknown,
            false => Numbering::Kept,
        };
        World::learning(connections, shared_ok, renumbers, numbering)
    }

    fn learning(
        connections: usize,
        shared_ok: bool,
        renumbers: bool,
        numbering: Numbering,
    ) -> World {
        let mut disk = Disk {
            numbering,
            ..Disk::default()
        };
        let palletd = Palletd::start(connections, &mut disk);
        World {
            broker: Broker::new(shared_ok, renumbers),
            disk,
            palletd,
            now: Instant::now(),
            next_msg: 0,
            distinct: false,
            at_least_once: false,
        }
    }
}

impl Palletd {
    /// Starts from what the disk holds: the windows from their file and
    /// the records left, the sessions by plan.
    fn start(connections: usize, disk: &mut Disk) -> Palletd {
        let (mqtt, subs) = settings(connections);
        let redelivery = mqtt.redelivery();
        let mut replay = match &disk.windows_file {
            Some(bytes) => Replay::new(redelivery.window, bytes).expect("the file as written"),
            None => Replay::empty(redelivery.window),
        };
        for (lsn, r) in &disk.records {
            if let Rec::Id { key, pkid, digest } = r {
                replay.record(
                    *key,
                    *lsn,
                    Seen {
                        pkid: *pkid,
                        digest: *digest,
                    },
                );
            }
        }
        let mut windows = replay.finish();
        if disk.sessions.is_empty() {
            disk.sessions = plan::legacy(&mqtt, &subs);
        }
        let probe = plan::probe(&mqtt, &subs);
        let planned = plan::plan(&mqtt, &subs, &disk.sessions);
        let verdict = Verdict::initial(probe.as_ref());
        let mut conns = Vec::new();
        let keys: Vec<u64> = planned.iter().map(|p| session_key(&p.client_id)).collect();
        for key in windows.keys() {
            if !keys.contains(&key) {
                windows.forget(key);
            }
        }
        for p in &planned {
            let plain_match = probe.as_ref().is_some_and(|pr| {
                disk.sessions
                    .get(&p.client_id)
                    .into_iter()
                    .flatten()
                    .chain(p.subscribe.iter().map(|(f, _)| f))
                    .any(|f| plan::unshared(f).is_none() && matches(f, &pr.topic))
            });
            let held = disk.sessions.entry(p.client_id.clone()).or_default();
            held.extend(p.subscribe.iter().map(|(f, _)| f.clone()));
            if !p.retiring {
                held.extend(probe.as_ref().map(|pr| pr.filter.clone()));
            }
            let seen = windows.of(session_key(&p.client_id));
            conns.push(Conn {
                probe: (p.index == 0 && probe.is_some()).then(ProbeCheck::default),
                session: Session::new(
                    p.clone(),
                    probe.clone(),
                    redelivery.window,
                    &seen,
                    verdict,
                    disk.numbering,
                ),
                plain_match,
                acked: 0,
                disconnecting: false,
                gen: 0,
                resent_undone: None,
            });
        }
        let next_lsn = disk
            .records
            .last()
            .map_or(disk.durable, |r| r.0 + 1)
            .max(disk.durable);
        Palletd {
            probe,
            conns,
            verdict,
            acks: Default::default(),
            next_lsn,
            run_start: next_lsn,
            windows,
            appended: Vec::new(),
            resumed_at: BTreeMap::new(),
        }
    }
}

impl World {
    fn probe_topic(&self) -> String {
        self.palletd
            .probe
            .as_ref()
            .map_or(String::new(), |p| p.topic.clone())
    }

    fn client_id(&self, c: usize) -> String {
        self.palletd.conns[c].session.client_id.clone()
    }

    /// Carries out a session's actions, as the ingest task does.
    fn apply(&mut self, c: usize, actions: Vec<Action>) {
        let id = self.client_id(c);
        for a in actions {
            match a {
                Action::Hold(f) => self.disk.sessions.entry(id.clone()).or_default().extend(f),
                Action::Subscribe(f) => self.send(c, Up::Subscribe(f)),
                Action::Unsubscribe(f) => self.send(c, Up::Unsubscribe(f)),
                Action::Released(f) => {
                    if let Some(h) = self.disk.sessions.get_mut(&id) {
                        h.remove(&f);
                    }
                }
                Action::ProbeReady => {
                    let now = self.now;
                    if let Some(p) = &mut self.palletd.conns[c].probe {
                        let step = p.ready(now);
                        self.probe_step(c, step);
                    }
                }
                Action::NotShared => self.settle(Evidence::Refused),
                Action::Void(void) => {
                    let p = &mut self.palletd;
                    let key = p.conns[c].session.key;
                    let below = match void {
                        Void::Reset => p.next_lsn,
                        Void::Settled => *p.resumed_at.get(&key).unwrap_or(&p.run_start),
                    };
                    let rec = Rec::Id {
                        key,
                        pkid: RESET,
                        digest: below,
                    };
                    self.disk.records.push((p.next_lsn, rec));
                    p.appended.push((
                        p.next_lsn,
                        key,
                        Seen {
                            pkid: RESET,
                            digest: below,
                        },
                    ));
                    p.next_lsn += 1;
                    p.acks.push(p.next_lsn, Ack::Void(c, p.next_lsn - 1));
                    self.release();
                }
                Action::Resumed => {
                    let p = &mut self.palletd;
                    let key = p.conns[c].session.key;
                    p.resumed_at.insert(key, p.next_lsn);
                }
                Action::Numbering(n) => self.disk.numbering = n,
                Action::Ready(_)
                | Action::Granted { .. }
                | Action::Refused { .. }
                | Action::Leaves => {}
            }
        }
    }

    fn probe_step(&mut self, c: usize, step: ProbeStep) {
        match step {
            ProbeStep::Wait => {}
            ProbeStep::Publish => self.send(c, Up::Probe),
            ProbeStep::GiveUp => self.settle(Evidence::ProbeLost),
        }
    }

    fn settle(&mut self, evidence: Evidence) {
        let Some(to) = self.palletd.verdict.after(evidence) else {
            return;
        };
        self.palletd.verdict = to;
        if to != Verdict::Pending {
            self.palletd.conns[0].probe = None;
        }
        for c in 0..self.palletd.conns.len() {
            let actions = self.palletd.conns[c].session.verdict(to);
            self.apply(c, actions);
        }
    }

    /// A request palletd's client sends: on the wire when the link is up,
    /// else waiting in the request channel.
    fn send(&mut self, c: usize, up: Up) {
        let id = self.client_id(c);
        let link = self.broker.link(&id);
        match (link.up, link.unnoticed) {
            (true, _) => link.up_q.push_back(up),
            (false, true)
                if matches!(up, Up::PubAck(_) | Up::Subscribe(_) | Up::Unsubscribe(_)) => {}
            (false, true) => link.pending.push_back(up),
            (false, false) => link.outbox.push_back(up),
        }
    }

    /// palletd's event loop reconnects (after it polled the error).
    fn connect(&mut self, c: usize) {
        self.notice(c);
        let id = self.client_id(c);
        let conn = &self.palletd.conns[c];
        if conn.disconnecting || self.broker.links.get(&id).is_some_and(|l| l.up) {
            return;
        }
        self.broker.connect(&id);
    }

    /// The event loop polls the error of a link that died.
    fn notice(&mut self, c: usize) -> bool {
        let id = self.client_id(c);
        let link = self.broker.link(&id);
        if !std::mem::take(&mut link.unnoticed) {
            return false;
        }
        let conn = &mut self.palletd.conns[c];
        conn.gen += 1;
        conn.session.disconnected();
        if let Some(p) = &mut conn.probe {
            p.disconnected();
        }
        true
    }

    /// palletd takes one packet (or the error) from the broker on
    /// connection `c`.
    fn receive(&mut self, c: usize) -> bool {
        if self.notice(c) {
            return true;
        }
        let id = self.client_id(c);
        let Some(down) = self
            .broker
            .links
            .get_mut(&id)
            .and_then(|l| l.down.pop_front())
        else {
            return false;
        };
        let now = self.now;
        match down {
            Down::ConnAck(present) => {
                let actions = self.palletd.conns[c].session.connected(present, now);
                self.apply(c, actions);
            }
            Down::SubAck(codes) => {
                let actions = self.palletd.conns[c].session.suback(&codes);
                self.apply(c, actions);
            }
            Down::UnsubAck => {
                let actions = self.palletd.conns[c].session.unsuback();
                self.apply(c, actions);
            }
            Down::Publish { pkid, dup, d } => {
                trace(|| format!("{id} receives {:?} pkid {pkid} dup {dup}", d.copy));
                let probe = d.topic == self.probe_topic();
                if probe && proves_sharing(self.palletd.conns[c].plain_match) {
                    self.settle(Evidence::ProbeBack);
                }
                let dg = digest(&d.topic, d.payload.as_bytes());
                let (disposition, actions) = self.palletd.conns[c]
                    .session
                    .publish(d.qos, pkid, dup, dg, probe, now);
                self.apply(c, actions);
                // The admission's rule: a likely redelivery whose payload
                // carries its own time (here: every payload differs) is
                // not stored again; any other is.
                if disposition == Disposition::Resent {
                    self.palletd.conns[c].resent_undone = Some(self.palletd.next_lsn);
                }
                let disposition = match (disposition, self.distinct) {
                    (Disposition::Resent, true) => Disposition::Redelivery,
                    (Disposition::Resent, false) => Disposition::Store,
                    (d, _) => d,
                };
                trace(|| format!("  -> {disposition:?}"));
                if d.qos == 0 {
                    return true;
                }
                let p = &mut self.palletd;
                let key = p.conns[c].session.key;
                if disposition == Disposition::Store {
                    self.disk.records.push((p.next_lsn, Rec::Sample(d.copy)));
                    p.next_lsn += 1;
                }
                if matches!(disposition, Disposition::Store | Disposition::Redelivery) {
                    let rec = Rec::Id {
                        key,
                        pkid,
                        digest: dg,
                    };
                    self.disk.records.push((p.next_lsn, rec));
                    p.appended
                        .push((p.next_lsn, key, Seen { pkid, digest: dg }));
                    p.next_lsn += 1;
                }
                let gen = p.conns[c].gen;
                p.acks.push(p.next_lsn, Ack::Pub(c, pkid, gen));
                self.release();
            }
        }
        true
    }

    /// PUBACKs of what is durable, in arrival order; resets made durable
    /// told to their session.
    fn release(&mut self) {
        let mut out = Vec::new();
        self.palletd
            .acks
            .pop_ready(self.disk.durable, |a| out.push(a));
        for a in out {
            match a {
                Ack::Pub(c, pkid, gen) => {
                    self.palletd.conns[c].acked += 1;
                    if gen == self.palletd.conns[c].gen {
                        self.send(c, Up::PubAck(pkid));
                    }
                }
                Ack::Void(c, lsn) => {
                    let undone = &mut self.palletd.conns[c].resent_undone;
                    if undone.is_some_and(|r| r < lsn) {
                        *undone = None;
                    }
                    let actions = self.palletd.conns[c].session.recorded();
                    self.apply(c, actions);
                }
            }
        }
    }

    fn sync(&mut self) {
        self.disk.durable = self.palletd.next_lsn;
        let p = &mut self.palletd;
        for (lsn, key, seen) in p.appended.drain(..) {
            p.windows.record(key, lsn, seen);
        }
        self.release();
    }

    /// The database has everything durable: the windows go to their file
    /// first, then the records are deleted.
    fn checkpoint(&mut self) {
        let durable = self.disk.durable;
        if !self.disk.records.iter().any(|r| r.0 < durable) {
            return;
        }
        let w = &mut self.palletd.windows;
        if w.dirty() {
            self.disk.windows_file = Some(w.encode());
            w.saved();
        }
        let (gone, kept): (Vec<_>, Vec<_>) =
            self.disk.records.drain(..).partition(|r| r.0 < durable);
        self.disk.records = kept;
        for (_, r) in gone {
            if let Rec::Sample(copy) = r {
                self.disk.confirmed.push(copy);
            }
        }
    }

    /// palletd dies: what was not durable is gone, and every connection;
    /// it starts again with `connections`.
    fn crash(&mut self, connections: usize) {
        // A crash after renumbered resends, before the record that settles
        // their run is durable, leaves both arrivals of those messages in
        // the spool (see the window's "Brokers that renumber their
        // resends"): the next run's resends of them may be stored again;
        // none is lost.
        if self.palletd.conns.iter().any(|c| c.resent_undone.is_some()) {
            self.at_least_once = true;
        }
        for c in 0..self.palletd.conns.len() {
            let id = self.client_id(c);
            self.broker.drop_link(&id);
            let link = self.broker.link(&id);
            link.outbox.clear();
            link.pending.clear();
            link.unnoticed = false;
        }
        let durable = self.disk.durable;
        self.disk.records.retain(|r| r.0 < durable);
        self.palletd = Palletd::start(connections, &mut self.disk);
    }

    /// Everything in flight on the wire arrives, both ways.
    fn drain(&mut self) {
        let probe = self.probe_topic();
        loop {
            let mut moved = false;
            let ids: Vec<String> = self.broker.links.keys().cloned().collect();
            for id in ids {
                while self.broker.take(&id, &probe) {
                    moved = true;
                }
            }
            for c in 0..self.palletd.conns.len() {
                while self.receive(c) {
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Time passes once the network is quiet: the probe's clock (ticking
    /// as the first connection's task does, every quarter second, the
    /// network quiet again between), and retiring sessions that are done.
    fn tick(&mut self, ms: u64) {
        self.drain();
        let mut left = ms;
        loop {
            let step = left.min(250);
            left -= step;
            self.now += Duration::from_millis(step);
            let now = self.now;
            if let Some(p) = &mut self.palletd.conns[0].probe {
                let step = p.tick(now, true);
                self.probe_step(0, step);
                self.drain();
            }
            if left == 0 {
                break;
            }
        }
        let now = self.now;
        for c in 0..self.palletd.conns.len() {
            let conn = &self.palletd.conns[c];
            if conn.disconnecting || !conn.session.retired(conn.acked, now) {
                continue;
            }
            let (id, key) = (conn.session.client_id.clone(), conn.session.key);
            self.disk.sessions.remove(&id);
            self.palletd.windows.forget(key);
            self.send(c, Up::Disconnect);
            self.palletd.conns[c].disconnecting = true;
        }
    }

    fn publish(&mut self, topic: usize, payload: usize) {
        self.next_msg += 1;
        let msg = self.next_msg;
        // Each payload its own (a device's time stamp in it), or from a
        // tiny set (a constant sensor).
        let p = match self.distinct {
            true => format!("m{msg}"),
            false => PAYLOADS[payload].to_string(),
        };
        self.broker.publish(msg, TOPICS[topic], &p, 1);
    }

    /// Everything settles: links up, the network quiet, the spool synced,
    /// time for the probe and the retirements, until the broker holds
    /// nothing for anyone.
    fn heal(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..200 {
            for c in 0..self.palletd.conns.len() {
                self.connect(c);
            }
            self.drain();
            self.sync();
            self.drain();
            self.tick(1000);
            let retiring_left = self
                .palletd
                .conns
                .iter()
                .any(|c| c.session.retiring() && !c.disconnecting);
            let ours: Vec<String> = self
                .palletd
                .conns
                .iter()
                .filter(|c| !c.disconnecting)
                .map(|c| c.session.client_id.clone())
                .collect();
            if self.broker.holds_nothing_for(&ours)
                && !retiring_left
                && self.palletd.verdict != Verdict::Pending
                && self.palletd.acks.is_empty()
            {
                return Ok(());
            }
        }
        let stuck: Vec<(String, usize, usize)> = self
            .broker
            .sessions
            .iter()
            .map(|(id, s)| (id.clone(), s.inflight.len(), s.queue.len()))
            .collect();
        Err(TestCaseError::fail(format!(
            "never settled: verdict {:?}, broker holds {stuck:?}",
            self.palletd.verdict
        )))
    }

    /// Every routing of a message to a session (but those a broker
    /// forgot) is in the spool or the database exactly once.
    fn check(&self) -> Result<(), TestCaseError> {
        let mut admitted: BTreeMap<Copy, usize> = BTreeMap::new();
        let spooled = self.disk.records.iter().filter_map(|r| match r.1 {
            Rec::Sample(c) => Some(c),
            Rec::Id { .. } => None,
        });
        for copy in self.disk.confirmed.iter().copied().chain(spooled) {
            *admitted.entry(copy).or_default() += 1;
        }
        for copy in &self.broker.routed {
            if self.broker.forgotten.contains(copy) {
                continue;
            }
            let n = admitted.get(copy).copied().unwrap_or(0);
            if self.at_least_once {
                prop_assert!(n >= 1, "message {:?} lost", copy);
            } else {
                prop_assert_eq!(n, 1, "message {:?} admitted {} times", copy, n);
            }
        }
        prop_assert!(
            admitted.keys().all(|c| self.broker.routed.contains(c)),
            "nothing admitted that was not routed"
        );
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Step {
    Publish { topic: usize, payload: usize },
    Broker(u8),
    Receive { conn: usize, n: u8 },
    Connect(usize),
    Drop(usize),
    Sync,
    Checkpoint,
    Tick(u16),
    Crash { connections: usize },
    BrokerRestart { forget: bool },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0..TOPICS.len(), 0..PAYLOADS.len()).prop_map(|(topic, payload)| Step::Publish { topic, payload }),
        4 => (1u8..6).prop_map(Step::Broker),
        6 => (0usize..6, 1u8..6).prop_map(|(conn, n)| Step::Receive { conn, n }),
        3 => (0usize..6).prop_map(Step::Connect),
        2 => (0usize..6).prop_map(Step::Drop),
        3 => Just(Step::Sync),
        2 => Just(Step::Checkpoint),
        2 => (0u16..4000).prop_map(Step::Tick),
        1 => (1usize..5).prop_map(|connections| Step::Crash { connections }),
        1 => proptest::bool::weighted(0.3).prop_map(|forget| Step::BrokerRestart { forget }),
    ]
}

/// Says what happens when `PALLETD_MODEL_TRACE` is set (to debug a
/// minimal failing case).
fn trace(what: impl FnOnce() -> String) {
    if std::env::var_os("PALLETD_MODEL_TRACE").is_some() {
        eprintln!("{}", what());
    }
}

fn run(connections: usize, shared_ok: bool, steps: &[Step]) -> Result<(), TestCaseError> {
    run_on(World::new(connections, shared_ok, false), steps)
}

fn run_on(mut w: World, steps: &[Step]) -> Result<(), TestCaseError> {
    for c in 0..w.palletd.conns.len() {
        w.connect(c);
    }
    let probe = w.probe_topic();
    for s in steps {
        let n = w.palletd.conns.len();
        trace(|| format!("step {s:?}"));
        match s {
            Step::Publish { topic, payload } => w.publish(*topic, *payload),
            Step::Broker(k) => {
                let ids: Vec<String> = w.broker.links.keys().cloned().collect();
                for id in ids {
                    for _ in 0..*k {
                        w.broker.take(&id, &probe);
                    }
                }
            }
            Step::Receive { conn, n: k } => {
                for _ in 0..*k {
                    w.receive(conn % n);
                }
            }
            Step::Connect(c) => w.connect(c % n),
            Step::Drop(c) => {
                let id = w.client_id(c % n);
                w.broker.drop_link(&id);
            }
            Step::Sync => w.sync(),
            Step::Checkpoint => w.checkpoint(),
            Step::Tick(ms) => w.tick(u64::from(*ms)),
            Step::Crash { connections } => w.crash(*connections),
            Step::BrokerRestart { forget } => w.broker.restart(*forget),
        }
    }
    w.heal()?;
    // What is published once everything settled is admitted too.
    for i in 0..6 {
        w.publish(i % TOPICS.len(), 0);
    }
    w.heal()?;
    w.check()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Against a broker with shared subscriptions (Mosquitto).
    #[test]
    fn every_routed_message_is_admitted_exactly_once(
        connections in 1usize..5,
        steps in proptest::collection::vec(step(), 1..200),
    ) {
        run(connections, true, &steps)?;
    }

    /// Against a broker that grants `$share/` and delivers nothing through
    /// it (aedes): palletd goes on unshared, and loses nothing routed.
    #[test]
    fn without_shared_delivery_every_routed_message_is_admitted_exactly_once(
        connections in 1usize..5,
        steps in proptest::collection::vec(step(), 1..200),
    ) {
        run(connections, false, &steps)?;
    }

    /// Against a broker that resends under new packet ids and delivers
    /// nothing through `$share/` (RabbitMQ), with payloads that differ
    /// (a device's time stamp in them): resends are aligned by digest,
    /// PUBACKs of an earlier connection are not sent.
    #[test]
    fn against_a_broker_that_renumbers_every_routed_message_is_admitted_exactly_once(
        connections in 1usize..5,
        steps in proptest::collection::vec(step(), 1..200),
    ) {
        let mut w = World::new(connections, false, true);
        w.distinct = true;
        run_on(w, &steps)?;
    }

    /// The same with payloads that repeat (a constant sensor): where the
    /// alignment is in doubt the message is stored, a duplicate rather
    /// than a loss.
    #[test]
    fn against_a_broker_that_renumbers_constant_payloads_every_routed_message_is_admitted(
        connections in 1usize..5,
        steps in proptest::collection::vec(step(), 1..200),
    ) {
        let mut w = World::new(connections, false, true);
        w.at_least_once = true;
        run_on(w, &steps)?;
    }

    /// A broker that keeps its ids, before palletd has seen so (a new
    /// spool): with payloads that differ, every message exactly once;
    /// with payloads that repeat, none lost.
    #[test]
    fn a_keeper_not_yet_known_loses_nothing_and_is_exact_where_payloads_differ(
        connections in 1usize..5,
        steps in proptest::collection::vec(step(), 1..200),
        distinct in proptest::bool::ANY,
    ) {
        let mut w = World::learning(connections, true, false, Numbering::Unknown);
        w.distinct = distinct;
        w.at_least_once = !distinct;
        run_on(w, &steps)?;
    }
}

/// A broker that forgot the session (restarted without persistence)
/// numbers the new one's messages from 1 again: the new session's first
/// message, its first sending lost with the connection, comes again with
/// DUP under the packet id of one admitted before, with the same topic
/// and payload. It is new.
#[test]
fn a_forgotten_sessions_numbers_used_again_are_new() {
    use Step::*;
    let p = Publish {
        topic: 0,
        payload: 0,
    };
    let steps = vec![
        Tick(0),
        Sync,
        Tick(0),
        p.clone(),
        Tick(0),
        Sync,
        Tick(0),
        BrokerRestart { forget: true },
        Connect(0),
        Tick(0),
        Sync,
        Tick(0),
        p,
        Drop(0),
    ];
    run(1, true, &steps).unwrap();
}

/// The broker says it forgot the session and palletd dies before that
/// is durable: nothing was subscribed meanwhile, so nothing of the new
/// session was sent that the old identities could be taken for.
#[test]
fn a_crash_after_a_forgotten_session_is_seen_loses_nothing() {
    use Step::*;
    let p = Publish {
        topic: 0,
        payload: 0,
    };
    let steps = vec![
        Tick(0),
        Sync,
        Tick(0),
        p.clone(),
        Tick(0),
        Sync,
        Tick(0),
        BrokerRestart { forget: true },
        Connect(0),
        Tick(0),
        p,
        Crash { connections: 1 },
    ];
    run(1, true, &steps).unwrap();
}

/// The broker forgot the sessions and the CONNACK that said so was lost
/// with the first connection's link: the next connect finds the session
/// it made anew (present, empty). The identities from before are void
/// once the broker has resent what it holds (nothing): the new session's
/// first message, its first sending lost, is new. (Shared subscriptions
/// are made again on every connect; a plain one palletd took for kept
/// would stay unsubscribed: see the README's *Redeliveries*.)
#[test]
fn a_lost_connack_of_a_forgotten_session_leaves_no_old_identity_standing() {
    use Step::*;
    let p = Publish {
        topic: 0,
        payload: 0,
    };
    let steps = vec![
        Tick(0),
        Sync,
        Tick(0),
        Sync,
        Tick(0),
        p.clone(),
        Tick(0),
        Sync,
        Tick(0),
        BrokerRestart { forget: true },
        Connect(1),
        Connect(0),
        Drop(0),
        Connect(0),
        Tick(0),
        Sync,
        Tick(0),
        Sync,
        Tick(0),
        p.clone(),
        p,
        Drop(0),
    ];
    run(2, true, &steps).unwrap();
}

/// A retiring session holds a message it has not acknowledged (not yet
/// durable): it is not retired, so a crash before the message is durable
/// leaves the session to the next start, whose connect gets it again.
#[test]
fn a_retiring_session_with_a_message_not_acknowledged_stays() {
    use Step::*;
    let p = |topic| Publish { topic, payload: 0 };
    let steps = vec![
        Tick(0),
        Sync,
        Tick(0),
        Tick(0),
        Crash { connections: 1 },
        p(0),
        p(1),
        Connect(0),
        Connect(1),
        Tick(0),
        Sync,
        Tick(0),
        Tick(4000),
        Crash { connections: 1 },
    ];
    run(2, true, &steps).unwrap();
}

/// The wrap a constant sensor meets, step by step: a message palletd
/// never received comes again with DUP under the packet id of one it
/// admitted [`PACKET_IDS`] messages earlier, with the same topic and
/// payload.
#[test]
fn a_constant_sensors_message_under_a_reused_packet_id_is_new() {
    let steps: Vec<Step> = (0..PACKET_IDS as usize + 1)
        .flat_map(|_| {
            [
                Step::Publish {
                    topic: 0,
                    payload: 0,
                },
                Step::Receive { conn: 0, n: 1 },
                Step::Sync,
                Step::Broker(1),
            ]
        })
        .chain([
            Step::Publish {
                topic: 0,
                payload: 0,
            },
            Step::Drop(0),
        ])
        .collect();
    run(1, true, &steps).unwrap();
    let _ = (PROBE_WAIT + RETIRE_QUIET, SETTLE_FILTER);
}
