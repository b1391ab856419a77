//! What a retained message is, sans-IO: the last value palletd took in
//! from each topic ([`LastValues`]), as the admission decides by it and
//! as the spool keeps it across restarts.
//!
//! # The rule
//! A PUBLISH the broker sends with the RETAIN flag is its copy of the
//! topic's last value, sent because a subscription was made (MQTT 3.1.1
//! §3.3.1.3: one forwarded to an existing subscription has the flag
//! cleared). It is a new reading only when it differs from the last
//! message palletd took in from that topic: a value published while
//! palletd's session was lost (or at QoS 0, or before palletd existed) is
//! stored, and the copies a broker sends on every subscribe, to every
//! member of a shared group (Mosquitto before 2.0.13) and after every
//! restart are not. Messages without the flag are always taken in: a
//! sensor may send the same value twice.
//!
//! "Took in": stored, dead-lettered or refused alike, so a retained value
//! palletd cannot store is not dead-lettered again at every connect. Each
//! message taken in on a subscription with `retained = "changed"` (the
//! default) that changes its topic's digest says so in the spool: in its
//! identity record (a QoS 1/2 message's last record, which carries the
//! topic's key then), or in a record of its own after its samples (kind
//! 5, a QoS 0 message), see [`crate::record`]; the spool
//! keeps the digests of the durable ones and writes them to the file
//! `retained` before it deletes segments ([`LastValues::encode`]), as it
//! does the message ids; a start reads that file, then the records left.
//!
//! # Bounded
//! At most `cap` topics are kept (the least recently changed goes first):
//! a topic forgotten costs at most one retained copy stored again, never
//! a reading. Topics and digests are 64-bit FNV-1a digests (stable across
//! versions and machines: spools keep them); two topics would have to
//! share a topic digest *and* a value digest for a value to be taken for
//! another's.

use std::collections::{HashMap, VecDeque};

/// The digest a topic is kept under.
pub(crate) fn topic_key(topic: &str) -> u64 {
    super::window::digest(topic, b"\x01retained")
}

/// Bytes a topic costs in one table (its map entry and its place in the
/// order), for the memory gauge; the spool keeps a second table.
pub(crate) const BYTES_PER_TOPIC: usize = 64;

/// The name of the file the spool keeps the durable digests in.
pub(crate) const FILE_NAME: &str = "retained";

const MAGIC: &[u8; 4] = b"PRV1";
/// Topic key, value digest.
const ENTRY: usize = 16;

/// The file could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the retained file is damaged ({0})")]
pub(crate) struct Damaged(&'static str);

/// The digest of the last message palletd took in from each topic, for
/// at most `cap` topics (least recently changed first out).
#[derive(Debug, Clone)]
pub struct LastValues {
    cap: usize,
    /// Per topic key: (value digest, sequence of its last change).
    map: HashMap<u64, (u64, u64)>,
    /// (sequence, topic key), oldest change first; an entry whose topic
    /// changed since is stale and skipped.
    order: VecDeque<(u64, u64)>,
    next: u64,
    /// Changed since the file last took everything.
    dirty: bool,
}

impl LastValues {
    /// An empty table of at most `cap` topics (at least one).
    pub fn new(cap: usize) -> LastValues {
        LastValues {
            cap: cap.max(1),
            map: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
            dirty: false,
        }
    }

    /// Whether `digest` is the last value taken in from topic `key`.
    pub(crate) fn same(&self, key: u64, digest: u64) -> bool {
        self.map.get(&key).is_some_and(|(d, _)| *d == digest)
    }

    /// A message with `digest` taken in from topic `key`; `true` when that
    /// changed the topic's last value (a record is due).
    pub(crate) fn take(&mut self, key: u64, digest: u64) -> bool {
        if self.same(key, digest) {
            return false;
        }
        let seq = self.next;
        self.next += 1;
        self.map.insert(key, (digest, seq));
        self.order.push_back((seq, key));
        self.dirty = true;
        while self.map.len() > self.cap {
            match self.order.pop_front() {
                Some((s, k)) if self.map.get(&k).is_some_and(|e| e.1 == s) => {
                    self.map.remove(&k);
                }
                Some(_) => {}
                None => break,
            }
        }
        if self.order.len() > 2 * self.map.len() + 16 {
            let map = &self.map;
            self.order
                .retain(|(s, k)| map.get(k).is_some_and(|e| e.1 == *s));
        }
        true
    }

    /// Topics kept.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether anything changed since the file last took everything.
    pub(crate) fn dirty(&self) -> bool {
        self.dirty
    }

    /// The file now holds what [`LastValues::encode`] gave.
    pub(crate) fn saved(&mut self) {
        self.dirty = false;
    }

    /// The file's bytes: the topics oldest change first, so a table read
    /// back forgets in the same order.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(12 + ENTRY * self.map.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.map.len() as u32).to_le_bytes());
        for (seq, key) in &self.order {
            if let Some((digest, s)) = self.map.get(key) {
                if s == seq {
                    out.extend_from_slice(&key.to_le_bytes());
                    out.extend_from_slice(&digest.to_le_bytes());
                }
            }
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// A table of at most `cap` topics from the bytes of a file written
    /// by [`LastValues::encode`].
    pub(crate) fn decode(cap: usize, bytes: &[u8]) -> Result<LastValues, Damaged> {
        if bytes.len() < 12 || &bytes[..4] != MAGIC {
            return Err(Damaged("not a retained file"));
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
        let mut t = LastValues::new(cap);
        for e in raw.chunks_exact(ENTRY) {
            let at = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().unwrap_or([0; 8]));
            t.take(at(0), at(8));
        }
        t.dirty = false;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_keeps_its_last_value_and_the_least_recently_changed_goes_first() {
        let mut t = LastValues::new(2);
        assert!(!t.same(1, 10));
        assert!(t.take(1, 10), "new: a record is due");
        assert!(t.same(1, 10) && !t.same(1, 11));
        assert!(!t.take(1, 10), "unchanged: nothing to record");
        assert!(t.take(2, 20));
        assert!(t.take(1, 11), "changed");
        assert!(t.take(3, 30));
        assert_eq!(t.len(), 2);
        assert!(!t.same(2, 20), "changed longest ago: forgotten");
        assert!(t.same(1, 11) && t.same(3, 30));
        // Many changes of one topic do not grow the order.
        for d in 0..1000 {
            t.take(1, d);
        }
        assert!(t.order.len() <= 2 * t.len() + 16);
        assert_ne!(topic_key("a/b"), topic_key("a/c"));
    }

    #[test]
    fn the_file_carries_the_table_and_its_order() {
        let mut t = LastValues::new(3);
        t.take(1, 10);
        t.take(2, 20);
        t.take(3, 30);
        t.take(1, 12);
        assert!(t.dirty());
        let bytes = t.encode();
        t.saved();
        assert!(!t.dirty());
        let mut back = LastValues::decode(3, &bytes).unwrap();
        assert!(!back.dirty());
        assert!(back.same(1, 12) && back.same(2, 20) && back.same(3, 30));
        back.take(4, 40);
        assert!(!back.same(2, 20), "the oldest change goes first, as before");
        assert!(back.same(1, 12));
        let mut damaged = bytes.clone();
        damaged[9] ^= 1;
        assert_eq!(
            LastValues::decode(3, &damaged).map(|_| ()),
            Err(Damaged("checksum"))
        );
        // A smaller cap keeps the newest.
        let small = LastValues::decode(1, &bytes).unwrap();
        assert!(small.same(1, 12) && small.len() == 1);
    }
}
