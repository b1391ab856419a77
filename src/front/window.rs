//! What the broker can still resend: each MQTT session's redelivery
//! window ([`Window`]), and the same windows as the spool keeps them
//! across restarts ([`Windows`], with the file they are carried in).
//!
//! # Why a window is exact
//! A broker resends, with the DUP flag and the packet id it had, only a
//! QoS 1/2 message it sent on that session and got no PUBACK for
//! (MQTT 3.1.1 §4.4; Mosquitto measured: it never hands a member's
//! unacknowledged message to another member of a shared group, see
//! `bench/probes/shared_redispatch.py`). What bounds which:
//! - it holds at most its in-flight window `W` of them at once (MQTT 5:
//!   the client's Receive Maximum, which it must respect);
//! - a resumed session gets its unacknowledged messages first, in order;
//! - palletd sends PUBACKs in the order the PUBLISHes arrived, and the
//!   MQTT client drops the PUBACKs it had not written when a connection
//!   dies, so on one connection the PUBACKs the broker got are a prefix
//!   of those for that connection's messages. One released after its
//!   link failed is not sent at all (`ingest::acker::Generations`: on a
//!   broker that renumbers, its packet id names another message there);
//!   the broker resends that message, acknowledged when it arrives.
//!
//! So a message the broker may still resend was last received on a
//! connection after which nothing came (it would have been resent
//! first), and on that connection at most `W - 1` messages came after it
//! while it was in flight. It is among the last `W` distinct messages
//! palletd received on the session, counting a redelivery where it
//! arrived last; palletd keeps `2W` (the margin older versions needed,
//! when a held-over PUBACK could free a place in the broker's window). A DUP is a redelivery iff the
//! latest message of that window with its packet id has its digest (a
//! packet id is reused only after its PUBACK arrived, so an older one with
//! that id is acknowledged). Never older: a message outside the window was
//! acknowledged beyond doubt, and a new message that looks like it (the
//! same packet id after the ids wrapped, the same topic and payload, its
//! first sending lost with a connection) is new. The model in
//! `src/front/tests.rs` plays this out, PUBACKs carried over included (a
//! window of `W` there stores a redelivery twice).
//!
//! What stays a heuristic: a broker that reuses a packet id as soon as its
//! PUBACK arrives (rather than counting up, as Mosquitto, EMQX, VerneMQ
//! and aedes do) may send a new message under the id of one still in the
//! window; if its first sending is lost with the connection and its topic
//! and payload equal that one's, it is taken for a redelivery.
//!
//! # Brokers that renumber their resends
//! RabbitMQ's MQTT plugin resends a resumed session's unacknowledged
//! messages with DUP under the new connection's packet ids, counting from
//! 1 again, so no packet id names what it had. What still holds: it
//! resends them first, in their order, and what it holds is a suffix of
//! what palletd received on the session (PUBACKs leave in order on one
//! TCP stream, so the broker got a prefix of them). So the resends are
//! aligned by digest with the tail of the window as it was at the resume
//! ([`Window::resume`]): the first DUP that no packet id explains, under
//! an id a broker that keeps its ids could not have given it (one within
//! the window's size past the newest id the window holds is such a
//! broker's message palletd never kept: received and lost with a crash
//! before it was durable, or never read), is anchored at the one entry
//! with its digest, and each DUP after it is placed while it continues
//! the tail in order. A placed resend is that message again, or a new
//! one with the same topic and payload whose first sending was lost with
//! the link (a device toggling `ON` and `OFF` sends such pairs): nothing
//! in MQTT tells them apart, so it is [`Resend::Uncertain`], a redelivery
//! only where its payload says (a Sparkplug B payload; readings that all
//! carry a time of their own: the same time and payload are the same
//! reading) and stored otherwise. Where the first one's digest is not
//! unique in the tail (a constant payload), or a DUP does not continue
//! the tail (one sent but lost with the link before palletd read it, so
//! never received), the message is stored. A duplicate, never a loss; a
//! sequence number in a payload without a time is not recognised as one.
//! A DUP the packet id explains shows the broker keeps its ids: nothing
//! is aligned on that session until the next resume. (A crash in the
//! middle of a run of renumbered resends leaves both copies of those
//! identities in the spool until the settling record: after the restart
//! their digests are not unique, and the broker's next resends of them
//! are stored again.)
//!
//! # Keeping windows across restarts
//! Each message's identity (session key, packet id, digest) is its last
//! record in the spool, so a message whose identity is recovered is whole
//! there; a redelivery's identity is recorded again where it arrived. A
//! record with packet id [`RESET`], which no QoS 1/2 message has, voids
//! the session's identities below the LSN its digest field holds: its
//! own LSN after a CONNACK without a session (the broker forgot it and
//! resends nothing from before); where the session was last resumed, once
//! the broker resent what it held (those it resent were recorded again
//! since; the others are acknowledged, see [`Window`]). The spool keeps
//! each session's window of the durable identities ([`Windows`]: what a
//! crash would leave) and, before it deletes a segment (confirmed by the
//! database, or dropped when full), writes them to the file `message-ids`
//! ([`Windows::encode`]). Recovery goes through the file's entries and
//! the records still in segments in LSN order ([`Replay`]).

use std::collections::{HashMap, VecDeque};

/// FNV-1a, 64 bits: stable across versions and machines (spools keep it).
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A digest of topic and payload: what tells a message from another one
/// with the same packet id.
pub(crate) fn digest(topic: &str, payload: &[u8]) -> u64 {
    fnv(&[topic.as_bytes(), &[0], payload])
}

/// The key a session's messages are recorded under in the spool: a digest
/// of its client id (the broker keeps the session under that id, whatever
/// connection index palletd gives it this run).
pub(crate) fn session_key(client_id: &str) -> u64 {
    fnv(&[client_id.as_bytes()])
}

/// The packet id of an identity record that voids the session's
/// identities below the LSN in its digest field: no QoS 1/2 message has
/// it.
pub(crate) const RESET: u16 = 0;

/// A QoS 1/2 message as the window keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub pkid: u16,
    pub digest: u64,
}

/// One session's redelivery window: the last `cap` distinct QoS 1/2
/// messages it received, a redelivery where it arrived last (a packet id
/// taken in again replaces the entry it had: the same message again, or
/// the older one was acknowledged before its id was reused).
///
/// When a session is resumed, what the window holds is *provisional*
/// ([`Window::resume`]; what a start recovered is, too): the broker resends
/// a resumed session's unacknowledged messages at once, before anything
/// else it writes on that connection, so a message it still holds comes
/// back before the session's first message without DUP and before the
/// answer to palletd's next SUBSCRIBE or UNSUBSCRIBE. One that does is
/// confirmed (taken in again); the first of those ends the others
/// ([`Window::settle`]). Without that, identities of a session the broker
/// has since forgotten (it restarted without persistence, and palletd
/// died, or the link dropped, before it read the CONNACK that said so)
/// could stand for the new session's messages under the same packet ids.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    cap: usize,
    /// (sequence, packet id), oldest first; an entry whose packet id was
    /// taken in again since is stale and skipped.
    order: VecDeque<(u64, u16)>,
    /// Per packet id, the entry: (sequence, digest, LSN of its record).
    latest: HashMap<u16, (u64, u64, u64)>,
    next: u64,
    /// Sequences below this are provisional (recovered, not confirmed).
    provisional: u64,
    /// Between a resume and the settling: the window as it was at the
    /// resume, to align resends under new packet ids with.
    align: Option<Align>,
    /// How the broker numbers its resends, as far as seen.
    numbering: Numbering,
    /// The first message since the resume is yet to come (it shows how
    /// the broker numbers).
    first: bool,
    /// What a message showed of the broker's numbering, not yet taken
    /// ([`Window::learned`]).
    learned: Option<Numbering>,
    /// Provisional entries a renumbered resend confirmed where they stand
    /// ([`Window::rekey`]).
    confirmed: std::collections::HashSet<u64>,
}

/// How a broker numbers a resumed session's resends, as seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Numbering {
    /// Not seen yet: a DUP is a redelivery only where its payload tells
    /// it ([`Resend::Uncertain`]).
    #[default]
    Unknown,
    /// Under the packet ids they had (Mosquitto, EMQX, VerneMQ, aedes):
    /// the first message of a resumed connection came under another id
    /// than 1, which a broker numbering each connection anew never gives.
    Kept,
    /// Under the new connection's ids, from 1 (RabbitMQ): a resend came
    /// under an id the window holds for another message.
    Renumbered,
}

impl Numbering {
    /// Its name, in the file palletd keeps it in and in the logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Numbering::Unknown => "unknown",
            Numbering::Kept => "kept",
            Numbering::Renumbered => "renumbered",
        }
    }

    /// The numbering of a name [`Numbering::name`] gave.
    pub(crate) fn parse(name: &str) -> Option<Numbering> {
        [Numbering::Unknown, Numbering::Kept, Numbering::Renumbered]
            .into_iter()
            .find(|n| n.name() == name)
    }
}

/// A resumed session's tail, for resends a broker sends under new packet
/// ids (see the module's "Brokers that renumber their resends").
#[derive(Debug, Clone)]
struct Align {
    /// (sequence, packet id, digest) of each entry at the resume, oldest
    /// first.
    tail: Vec<(u64, u16, u64)>,
    /// The entry the next resend must match, once anchored.
    next: Option<usize>,
    /// How far past the newest packet id of the tail a broker that keeps
    /// its ids can number a message palletd has no identity of: the
    /// window's size (`0`: the broker is known to renumber).
    reach: usize,
}

impl Align {
    /// Where in the tail a resend with this identity lies, if that is
    /// beyond doubt; `None` ends the alignment.
    fn place(&self, seen: Seen) -> Option<usize> {
        if let Some(j) = self.next {
            return (self.tail.get(j)?.2 == seen.digest).then_some(j);
        }
        // While the numbering is not known: a broker that keeps its ids
        // resends what palletd has no identity of (received and lost with
        // a crash before it was durable, or never read) under the ids that
        // follow the newest it has, at most its window of them: those are
        // new. Ids anywhere else may be a broker's that numbered anew.
        let newest = self.tail.last()?.1;
        let ahead = (i32::from(seen.pkid) - i32::from(newest)).rem_euclid(65_535) as usize;
        if (1..=self.reach).contains(&ahead) {
            return None;
        }
        let mut hits = (self.tail.iter().enumerate()).filter(|(_, e)| e.2 == seen.digest);
        match (hits.next(), hits.next()) {
            (Some((i, _)), None) => Some(i),
            _ => None,
        }
    }
}

/// A DUP message the window recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Under the packet id it had, from a broker that keeps its ids: a
    /// redelivery beyond doubt.
    Same,
    /// A message with the digest of one the window holds, as a broker that
    /// renumbers its resends sends it (aligned with the message received
    /// as `was`), or under its packet id before the broker showed how it
    /// numbers: the same message, or a new one with the same topic and
    /// payload. A redelivery if its payload tells (its readings carry
    /// times of their own: see [`crate::admission`]), else stored.
    Uncertain { was: Option<u16> },
}

impl Window {
    /// A window of the last `cap` messages (at least one), holding
    /// `recovered` (oldest first), provisionally, of a broker that numbers
    /// its resends as `numbering` says.
    pub fn new(cap: usize, recovered: &[Seen], numbering: Numbering) -> Window {
        let mut w = Window::empty(cap);
        w.numbering = numbering;
        for s in recovered {
            w.push(*s);
        }
        w.provisional = w.next;
        w
    }

    fn empty(cap: usize) -> Window {
        Window {
            cap: cap.max(1),
            order: VecDeque::new(),
            latest: HashMap::new(),
            next: 0,
            provisional: 0,
            align: None,
            numbering: Numbering::Unknown,
            first: false,
            learned: None,
            confirmed: Default::default(),
        }
    }

    /// Whether a DUP message with this identity is a redelivery of one the
    /// window holds.
    pub(crate) fn holds(&self, seen: Seen) -> bool {
        self.latest
            .get(&seen.pkid)
            .is_some_and(|(_, d, _)| *d == seen.digest)
    }

    /// The session is resumed: everything held is provisional until the
    /// broker's resends are through, and the tail is kept to align resends
    /// under new packet ids with.
    pub(crate) fn resume(&mut self) {
        self.provisional = self.next;
        self.first = true;
        self.confirmed.clear();
        let tail: Vec<(u64, u16, u64)> = (self.order.iter())
            .filter_map(|(seq, pkid)| {
                let (s, digest, _) = self.latest.get(pkid)?;
                (s == seq).then_some((*seq, *pkid, *digest))
            })
            .collect();
        let reach = match self.numbering {
            Numbering::Renumbered => 0,
            _ => self.cap,
        };
        self.align = (!tail.is_empty()).then_some(Align {
            tail,
            next: None,
            reach,
        });
    }

    /// A QoS 1/2 message arrived, with DUP or not: the first since a
    /// resume shows how the broker numbers (an id other than 1: it keeps
    /// its ids; see [`Numbering::Kept`]).
    pub(crate) fn observe(&mut self, pkid: u16) {
        if std::mem::take(&mut self.first) && self.numbering == Numbering::Unknown && pkid != 1 {
            self.numbering = Numbering::Kept;
            self.learned = Some(Numbering::Kept);
        }
    }

    /// How the broker numbers, as known elsewhere: taken when not known
    /// here.
    pub(crate) fn numbering(&mut self, known: Numbering) {
        if self.numbering == Numbering::Unknown {
            self.numbering = known;
        }
    }

    /// What a message showed of the broker's numbering since the last
    /// call.
    pub(crate) fn learned(&mut self) -> Option<Numbering> {
        self.learned.take()
    }

    /// A DUP message received: a redelivery of one the window holds, or
    /// new (`None`). Under the packet id it had, from a broker that keeps
    /// its ids, beyond doubt; else (a broker that renumbers, aligned with
    /// the tail between a resume and the settling; or one not yet seen)
    /// [`Resend::Uncertain`]. It moves to where it arrived last,
    /// confirmed if it was provisional.
    pub(crate) fn redelivered(&mut self, seen: Seen) -> Option<Resend> {
        let held = self.holds(seen);
        if self.numbering == Numbering::Unknown && !held && self.align.is_some() {
            // A resend under an id the window holds for another message:
            // no broker that keeps its ids gives that.
            if self.latest.contains_key(&seen.pkid) {
                self.numbering = Numbering::Renumbered;
                self.learned = Some(Numbering::Renumbered);
                if let Some(a) = &mut self.align {
                    a.reach = 0;
                }
            }
        }
        match (self.numbering, held) {
            (Numbering::Kept, _) => {
                self.align = None;
                self.push(seen);
                return held.then_some(Resend::Same);
            }
            (Numbering::Unknown, true) => {
                self.push(seen);
                return Some(Resend::Uncertain { was: None });
            }
            _ => {}
        }
        let placed = self.align.as_ref().and_then(|a| a.place(seen));
        let Some(at) = placed else {
            self.align = None;
            self.push(seen);
            return None;
        };
        let align = self.align.as_mut()?;
        align.next = Some(at + 1);
        let (seq, was, _) = align.tail[at];
        self.rekey(seq, was, seen);
        Some(Resend::Uncertain { was: Some(was) })
    }

    /// A message without DUP: new, and every resent one came before it.
    pub(crate) fn arrived(&mut self, seen: Seen) {
        self.settle();
        self.push(seen);
    }

    /// The broker has resent what it held when it resumed the session (it
    /// wrote something after the resent messages): provisional messages
    /// not resent by now never will be.
    pub(crate) fn settle(&mut self) {
        self.align = None;
        if self.provisional > 0 {
            let p = self.provisional;
            let confirmed = std::mem::take(&mut self.confirmed);
            self.latest
                .retain(|_, (seq, _, _)| *seq >= p || confirmed.contains(seq));
            self.compact();
            self.provisional = 0;
        }
    }

    /// Takes a message in.
    pub fn push(&mut self, seen: Seen) {
        self.push_at(seen, 0);
    }

    /// Takes in a message whose identity record has LSN `lsn`: the oldest
    /// leaves when the window is full.
    fn push_at(&mut self, seen: Seen, lsn: u64) {
        let seq = self.next;
        self.next += 1;
        self.order.push_back((seq, seen.pkid));
        self.latest.insert(seen.pkid, (seq, seen.digest, lsn));
        while self.latest.len() > self.cap {
            if let Some((old, pkid)) = self.order.pop_front() {
                if self.latest.get(&pkid).is_some_and(|e| e.0 == old) {
                    self.latest.remove(&pkid);
                }
            }
        }
        if self.order.len() > 2 * self.cap + 16 {
            self.compact();
        }
    }

    /// The entry `seq` (under packet id `was`) came again as `seen`, under
    /// a new packet id: it keeps its place in the order, the broker's (a
    /// renumbering broker resends in its order; moved to the end, a run of
    /// resends cut short by a dropped link would leave the next run's
    /// tail out of that order), and is confirmed.
    fn rekey(&mut self, seq: u64, was: u16, seen: Seen) {
        let Some((_, _, lsn)) = self.latest.get(&was).copied().filter(|e| e.0 == seq) else {
            self.push(seen);
            return;
        };
        self.latest.remove(&was);
        if let Ok(i) = self.order.binary_search_by_key(&seq, |e| e.0) {
            self.order[i].1 = seen.pkid;
        }
        // An older message under the new id (acknowledged: a renumbering
        // broker reuses ids on every connection) leaves the window.
        self.latest.insert(seen.pkid, (seq, seen.digest, lsn));
        if seq < self.provisional {
            // Confirmed: it survives the settling.
            self.confirmed.insert(seq);
        }
    }

    /// Drops the stale entries of `order`.
    fn compact(&mut self) {
        let latest = &self.latest;
        self.order
            .retain(|(seq, pkid)| latest.get(pkid).is_some_and(|e| e.0 == *seq));
    }

    /// The entries, oldest first: (LSN of the record, identity).
    fn entries(&self) -> impl Iterator<Item = (u64, Seen)> + '_ {
        self.order.iter().filter_map(|(seq, pkid)| {
            let (s, digest, lsn) = self.latest.get(pkid)?;
            (s == seq).then_some((
                *lsn,
                Seen {
                    pkid: *pkid,
                    digest: *digest,
                },
            ))
        })
    }

    /// Drops the entries whose record lies below `lsn`.
    fn void_below(&mut self, lsn: u64) {
        self.latest.retain(|_, (_, _, l)| *l >= lsn);
        self.compact();
    }

    /// The broker kept no session: it resends nothing.
    pub fn clear(&mut self) {
        self.order.clear();
        self.latest.clear();
        self.provisional = 0;
        self.align = None;
        self.confirmed.clear();
    }

    /// The broker's window is larger than was thought: keep the last
    /// `cap` messages from now on.
    pub(crate) fn widen(&mut self, cap: usize) {
        self.cap = self.cap.max(cap);
    }

    /// How many identities it holds (the tests count them).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }
}

/// The name of the file the windows are carried in.
pub(crate) const FILE_NAME: &str = "message-ids";

const MAGIC: &[u8; 4] = b"PMI1";
/// key, LSN, packet id, digest.
const ENTRY: usize = 8 + 8 + 2 + 8;

/// The file could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the message-ids file is damaged ({0})")]
pub(crate) struct Damaged(&'static str);

/// Every session's window as the spool keeps it: of the identities that
/// are durable, the last `cap` distinct ones of each session, with the
/// LSNs of their records (what a crash would leave).
#[derive(Debug, Clone)]
pub struct Windows {
    cap: usize,
    sessions: HashMap<u64, Kept>,
    /// Changed since the file last took everything.
    dirty: bool,
}

/// One session's window, and the LSN of its newest record (an identity
/// or a void): older ones are known already.
#[derive(Debug, Clone)]
struct Kept {
    last: Option<u64>,
    window: Window,
}

impl Windows {
    pub fn new(cap: usize) -> Windows {
        Windows {
            cap: cap.max(1),
            sessions: HashMap::new(),
            dirty: false,
        }
    }

    /// The record at `lsn` of session `key`'s identity `seen`, durable
    /// (packet id [`RESET`]: those below the LSN in `seen.digest` are
    /// void). One at or below the session's newest is known already.
    pub(crate) fn record(&mut self, key: u64, lsn: u64, seen: Seen) {
        let cap = self.cap;
        let k = self.sessions.entry(key).or_insert_with(|| Kept {
            last: None,
            window: Window::empty(cap),
        });
        if k.last.is_some_and(|l| l >= lsn) {
            return;
        }
        k.last = Some(lsn);
        self.dirty = true;
        match seen.pkid {
            RESET => k.window.void_below(seen.digest),
            _ => k.window.push_at(seen, lsn),
        }
    }

    /// The broker's window is larger than was thought: every session's
    /// window keeps the last `cap` messages from now on.
    pub(crate) fn widen(&mut self, cap: usize) {
        if cap > self.cap {
            self.cap = cap;
            for k in self.sessions.values_mut() {
                k.window.widen(cap);
            }
        }
    }

    /// A session the broker can resend nothing of (retired, or no longer
    /// palletd's).
    pub(crate) fn forget(&mut self, key: u64) {
        if self.sessions.remove(&key).is_some() {
            self.dirty = true;
        }
    }

    /// Whether anything changed since the file last took everything
    /// ([`Windows::saved`]).
    pub(crate) fn dirty(&self) -> bool {
        self.dirty
    }

    /// The file now holds what [`Windows::encode`] gave.
    pub(crate) fn saved(&mut self) {
        self.dirty = false;
    }

    /// Session `key`'s window, oldest first.
    pub(crate) fn of(&self, key: u64) -> Vec<Seen> {
        self.sessions
            .get(&key)
            .map(|k| k.window.entries().map(|(_, s)| s).collect())
            .unwrap_or_default()
    }

    /// The session keys held.
    pub(crate) fn keys(&self) -> Vec<u64> {
        self.sessions.keys().copied().collect()
    }

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + ENTRY * self.cap * self.sessions.len() + 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[0u8; 4]);
        let mut n = 0u32;
        let mut keys = self.keys();
        keys.sort_unstable();
        for key in keys {
            for (lsn, s) in self.sessions[&key].window.entries() {
                out.extend_from_slice(&key.to_le_bytes());
                out.extend_from_slice(&lsn.to_le_bytes());
                out.extend_from_slice(&s.pkid.to_le_bytes());
                out.extend_from_slice(&s.digest.to_le_bytes());
                n += 1;
            }
        }
        out[4..8].copy_from_slice(&n.to_le_bytes());
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

/// Rebuilds the windows at a start: the file's entries and the identity
/// records still in the spool's segments, merged in LSN order as the
/// segments are scanned (a void then drops exactly what came before it).
#[derive(Debug)]
pub(crate) struct Replay {
    windows: Windows,
    /// The file's entries not yet taken, by LSN: (LSN, key, identity).
    file: VecDeque<(u64, u64, Seen)>,
}

impl Replay {
    /// Starts without a file.
    pub(crate) fn empty(cap: usize) -> Replay {
        Replay {
            windows: Windows::new(cap),
            file: VecDeque::new(),
        }
    }

    /// Starts from the bytes of a file written by [`Windows::encode`].
    pub fn new(cap: usize, bytes: &[u8]) -> Result<Replay, Damaged> {
        if bytes.len() < 12 || &bytes[..4] != MAGIC {
            return Err(Damaged("not a message-ids file"));
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return Err(Damaged("checksum"));
        }
        let n = u32::from_le_bytes([body[4], body[5], body[6], body[7]]) as usize;
        let raw = &body[8..];
        if raw.len() != n * ENTRY {
            return Err(Damaged("length"));
        }
        let mut entries = Vec::with_capacity(n);
        for e in raw.chunks_exact(ENTRY) {
            let u64_at = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().unwrap_or([0; 8]));
            let seen = Seen {
                pkid: u16::from_le_bytes([e[16], e[17]]),
                digest: u64_at(18),
            };
            entries.push((u64_at(8), u64_at(0), seen));
        }
        entries.sort_unstable_by_key(|e| e.0);
        let mut r = Replay::empty(cap);
        r.file = entries.into();
        Ok(r)
    }

    /// An identity record of the spool, in LSN order.
    pub(crate) fn record(&mut self, key: u64, lsn: u64, seen: Seen) {
        self.file_until(lsn);
        if self.file.front().is_some_and(|e| e.0 == lsn) {
            self.file.pop_front();
        }
        self.windows.record(key, lsn, seen);
    }

    fn file_until(&mut self, lsn: u64) {
        while self.file.front().is_some_and(|e| e.0 < lsn) {
            if let Some((l, key, seen)) = self.file.pop_front() {
                self.windows.record(key, l, seen);
            }
        }
    }

    /// The windows, once every segment was scanned. They count as not yet
    /// in the file: what came from segments is only there, and goes to
    /// the file before those are deleted.
    pub(crate) fn finish(mut self) -> Windows {
        self.file_until(u64::MAX);
        self.windows
    }
}

/// How the spool keeps the windows: how many messages per session, and
/// which session each connection index of an older spool's records meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redelivery {
    /// Messages kept per session: twice the broker's in-flight window
    /// (`mqtt.max_inflight` for MQTT 3.1.1, where the broker does not say
    /// it; `mqtt.receive_maximum` for MQTT 5, which the broker must
    /// respect).
    pub window: usize,
    /// Session keys by connection index, for the records of palletd 0.1
    /// (keyed by the index of the connection they came on): each index
    /// is taken to mean the client id it has under this configuration.
    pub by_index: Vec<u64>,
}

impl Default for Redelivery {
    fn default() -> Self {
        Redelivery {
            window: 40,
            by_index: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pkid: u16, digest: u64) -> Seen {
        Seen { pkid, digest }
    }

    #[test]
    fn a_window_holds_the_latest_message_of_each_packet_id_among_the_last_cap() {
        let mut w = Window::new(3, &[seen(1, 10), seen(2, 20)], Numbering::Kept);
        assert!(w.holds(seen(1, 10)) && w.holds(seen(2, 20)));
        assert!(!w.holds(seen(1, 11)), "another message under that id");
        // A packet id used again: the older message was acknowledged.
        w.push(seen(1, 12));
        assert!(!w.holds(seen(1, 10)) && w.holds(seen(1, 12)));
        assert_eq!(w.len(), 2, "one entry per packet id");
        w.push(seen(3, 30));
        w.push(seen(4, 40));
        assert_eq!(w.len(), 3);
        assert!(!w.holds(seen(2, 20)), "out of the window");
        assert!(w.holds(seen(1, 12)) && w.holds(seen(3, 30)));
        w.push(seen(5, 50));
        assert!(!w.holds(seen(1, 12)), "out of the window");
        // A redelivery moves to where it arrived last.
        assert_eq!(w.redelivered(seen(3, 30)), Some(Resend::Same));
        w.push(seen(6, 60));
        assert!(w.holds(seen(3, 30)) && !w.holds(seen(4, 40)));
        w.clear();
        assert!(w.is_empty() && !w.holds(seen(5, 50)));
        // Recovered: confirmed by a redelivery, else ended by the first
        // new message.
        let mut w = Window::new(4, &[seen(1, 10), seen(2, 20)], Numbering::Kept);
        assert_eq!(w.redelivered(seen(2, 20)), Some(Resend::Same));
        assert_eq!(w.redelivered(seen(3, 30)), None, "new, sent first with DUP");
        w.arrived(seen(4, 40));
        assert!(!w.holds(seen(1, 10)), "not resent before a new one: gone");
        assert!(w.holds(seen(2, 20)) && w.holds(seen(3, 30)));
        assert_eq!(
            w.redelivered(seen(2, 20)),
            Some(Resend::Same),
            "and again after a reconnect"
        );
        // The same message again and again does not grow it.
        for _ in 0..1000 {
            w.redelivered(seen(2, 20));
        }
        assert!(w.order.len() <= 2 * 4 + 16);
        assert_ne!(digest("a", b"bc"), digest("ab", b"c"));
        assert_ne!(session_key("box-1"), session_key("box-2"));
    }

    #[test]
    fn resends_under_new_packet_ids_are_aligned_with_the_tail() {
        let uncertain = |was| Some(Resend::Uncertain { was: Some(was) });
        // Received 1..=5 (distinct payloads); the broker holds 3..=5 and
        // resends them as 1, 2, 3 (RabbitMQ), then one it had sent and
        // palletd never read (6, as 4), then a new one. Resend 1 comes
        // under an id the window holds for another message: the broker
        // renumbers.
        let mut w = Window::new(10, &[], Numbering::Unknown);
        for p in 1..=5 {
            w.arrived(seen(p, 100 + u64::from(p)));
        }
        w.resume();
        w.observe(1);
        assert_eq!(w.learned(), None, "id 1 first: not known yet");
        assert_eq!(w.redelivered(seen(1, 103)), uncertain(3));
        assert_eq!(w.learned(), Some(Numbering::Renumbered));
        assert_eq!(w.redelivered(seen(2, 104)), uncertain(4));
        assert_eq!(w.redelivered(seen(3, 105)), uncertain(5));
        assert_eq!(w.redelivered(seen(4, 106)), None, "past the tail: new");
        w.arrived(seen(5, 107));
        assert!(w.holds(seen(1, 103)) && w.holds(seen(3, 105)));
        assert!(
            !w.holds(seen(4, 104)),
            "its first arrival went; it is under 2 now"
        );
        // Resumed again: the resends of 106 and 107, renumbered again.
        w.resume();
        assert_eq!(w.redelivered(seen(1, 106)), uncertain(4));
        assert_eq!(w.redelivered(seen(2, 107)), uncertain(5));

        // A DUP out of the tail's order ends the alignment.
        let mut w = Window::new(10, &[], Numbering::Renumbered);
        for p in 1..=4 {
            w.arrived(seen(p, 200 + u64::from(p)));
        }
        w.resume();
        assert_eq!(w.redelivered(seen(1, 202)), uncertain(2));
        assert_eq!(
            w.redelivered(seen(2, 204)),
            None,
            "203 skipped: not aligned"
        );
        assert_eq!(w.redelivered(seen(9, 203)), None, "and nothing after");

        // A digest that is not unique in the tail (a constant payload):
        // stored, a duplicate rather than a loss.
        let mut w = Window::new(10, &[], Numbering::Renumbered);
        for p in 1..=3 {
            w.arrived(seen(p, 7));
        }
        w.resume();
        assert_eq!(w.redelivered(seen(9, 7)), None);
    }

    #[test]
    fn the_first_message_of_a_resumed_connection_shows_how_the_broker_numbers() {
        // A broker that keeps its ids resends what palletd lost with a
        // crash before it was durable under the ids after the newest it
        // holds: a payload like an older one's is still a new message.
        let mut w = Window::new(10, &[seen(1, 501), seen(2, 502)], Numbering::Unknown);
        w.resume();
        w.observe(3);
        assert_eq!(w.learned(), Some(Numbering::Kept), "an id other than 1");
        assert_eq!(
            w.redelivered(seen(3, 501)),
            None,
            "lost before durable: new"
        );
        assert_eq!(w.redelivered(seen(4, 502)), None);
        // Known to keep: the packet id tells beyond doubt, and nothing is
        // aligned.
        let mut w = Window::new(10, &[], Numbering::Kept);
        for p in 1..=3 {
            w.arrived(seen(p, 300 + u64::from(p)));
        }
        w.resume();
        assert_eq!(w.redelivered(seen(2, 302)), Some(Resend::Same));
        assert_eq!(
            w.redelivered(seen(9, 303)),
            None,
            "no alignment once ids held"
        );
        // Not known (the first message came under id 1): a packet id that
        // holds is only a likely redelivery.
        let mut w = Window::new(10, &[seen(1, 601)], Numbering::Unknown);
        w.resume();
        w.observe(1);
        assert_eq!(
            w.redelivered(seen(1, 601)),
            Some(Resend::Uncertain { was: None })
        );
        assert_eq!(w.learned(), None);
        // Nor after the settling.
        let mut w = Window::new(10, &[], Numbering::Renumbered);
        w.arrived(seen(1, 401));
        w.resume();
        w.arrived(seen(2, 402));
        assert_eq!(w.redelivered(seen(3, 401)), None);
    }

    #[test]
    fn windows_carry_the_durable_identities_through_their_file() {
        let mut w = Windows::new(2);
        w.record(7, 10, seen(1, 100));
        w.record(7, 11, seen(2, 200));
        w.record(7, 12, seen(3, 300));
        w.record(9, 13, seen(1, 900));
        w.record(9, 13, seen(5, 5)); // known already
        assert_eq!(w.of(7), [seen(2, 200), seen(3, 300)]);
        assert!(w.dirty());
        let bytes = w.encode();
        w.saved();
        assert!(!w.dirty());
        let back = Replay::new(2, &bytes).unwrap().finish();
        assert_eq!(back.of(7), [seen(2, 200), seen(3, 300)]);
        assert_eq!(back.of(9), [seen(1, 900)]);
        // The segments then add what the file did not have.
        let mut replay = Replay::new(2, &bytes).unwrap();
        replay.record(7, 12, seen(3, 300));
        replay.record(7, 14, seen(4, 400));
        let back = replay.finish();
        assert_eq!(back.of(7), [seen(3, 300), seen(4, 400)]);
        let mut damaged = bytes.clone();
        damaged[12] ^= 1;
        assert_eq!(
            Replay::new(2, &damaged).map(|_| ()),
            Err(Damaged("checksum"))
        );
        w.forget(7);
        assert!(w.dirty() && w.of(7).is_empty());
    }

    #[test]
    fn a_void_drops_what_lies_below_its_boundary_in_lsn_order() {
        let mut w = Windows::new(4);
        w.record(7, 10, seen(1, 100));
        w.record(7, 12, seen(2, 200));
        let file = w.encode();
        // The segments still hold a reset at 11 (between the two) and a
        // message after it: replayed in LSN order with the file's entries.
        let mut replay = Replay::new(4, &file).unwrap();
        replay.record(7, 11, seen(RESET, 11));
        replay.record(7, 12, seen(2, 200));
        replay.record(7, 14, seen(3, 300));
        assert_eq!(replay.finish().of(7), [seen(2, 200), seen(3, 300)]);
        // A run that started at 14 settles: the broker resent 2, recorded
        // again at 16; 1 is void.
        w.record(7, 16, seen(2, 200));
        w.record(7, 17, seen(RESET, 14));
        assert_eq!(w.of(7), [seen(2, 200)]);
        w.record(7, 18, seen(RESET, 18));
        assert!(w.of(7).is_empty());
        w.record(7, 17, seen(9, 9));
        assert!(w.of(7).is_empty(), "older than the reset");
    }
}
