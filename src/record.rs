//! The spool's record format. Sans-IO.
//!
//! ```text
//! len: u32 LE | crc32(body): u32 LE | body (len bytes)
//! body = lsn: u64 LE | kind: u8 | received_ms: i64 LE | payload
//!   kind 1 sample:     sensor_len: u16 LE | sensor | BSON sample document
//!   kind 2 dead letter: BSON dead-letter document
//!   kind 3 message id:  pkid: u16 LE | digest: u64 LE | session: u64 LE
//!                       [| topic: u64 LE]
//!                       (redelivery detection: the session is the key of
//!                       the client id it came on, see
//!                       [`crate::front::window::session_key`]; palletd 0.1
//!                       wrote a connection index instead: none for the
//!                       first connection, else one byte; with `topic`, the
//!                       message changed that topic's last value, its
//!                       digest the message's: see
//!                       [`crate::front::retained`], spool format 2)
//!   kind 4 Sparkplug B: a change of the Sparkplug B state, JSON
//!                       ([`crate::decode::sparkplug::Change`]; replayed
//!                       onto `sparkplug.json` at start)
//!   kind 5 last value:  topic: u64 LE | digest: u64 LE
//!                       (the last message taken in from a topic changed,
//!                       for a QoS 0 message, which has no identity: its
//!                       last record; see [`crate::front::retained`];
//!                       spool format 2)
//! ```
//!
//! All integers are little-endian whatever the machine, so a spool moves
//! between an x86 and an ARM box unchanged. Every record has a log sequence
//! number (LSN), strictly increasing; within one segment (one run of the
//! admission) they are consecutive, so a gap between two intact records says
//! how many records damage cost.

pub(crate) const HEADER: usize = 8;
/// The smallest body: LSN, kind and receive time.
pub(crate) const MIN_BODY: usize = 17;
/// Records larger than this are damage, not data.
pub(crate) const MAX_RECORD: u32 = 32 * 1024 * 1024;
const KIND_SAMPLE: u8 = 1;
const KIND_DEADLETTER: u8 = 2;
const KIND_MESSAGE_ID: u8 = 3;
const KIND_SPARKPLUG: u8 = 4;
const KIND_LAST_VALUE: u8 = 5;

/// Which MQTT session a message came on, as its identity record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionId {
    /// The key of the session's client id (what palletd writes).
    Key(u64),
    /// The index of the connection it came on (records of palletd 0.1).
    Index(u8),
}

/// What one record holds, owned (the tests build records from it; palletd
/// itself writes [`EntryRef`]s).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Sample {
        sensor: String,
        doc: Vec<u8>,
    },
    DeadLetter {
        doc: Vec<u8>,
    },
    MessageId {
        session: SessionId,
        pkid: u16,
        digest: u64,
        topic: Option<u64>,
    },
    Sparkplug {
        change: Vec<u8>,
    },
    LastValue {
        topic: u64,
        digest: u64,
    },
}

/// A record, owned (tests).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub lsn: u64,
    pub received_ms: i64,
    pub entry: Entry,
}

/// What one record holds, borrowed from where it lies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EntryRef<'a> {
    Sample {
        sensor: &'a str,
        doc: &'a [u8],
    },
    DeadLetter {
        doc: &'a [u8],
    },
    MessageId {
        session: SessionId,
        pkid: u16,
        digest: u64,
        /// The message changed this topic's last value (its digest is the
        /// message's).
        topic: Option<u64>,
    },
    /// A change of the Sparkplug B state (JSON): not a reading, replayed
    /// at start onto the last snapshot ([`crate::admission::sparkplug`]).
    Sparkplug {
        change: &'a [u8],
    },
    /// The last message taken in from a topic (its key, see
    /// [`crate::front::retained::topic_key`]) has this digest: what a
    /// retained copy of it is told apart by.
    LastValue {
        topic: u64,
        digest: u64,
    },
}

/// A record, borrowed: what is encoded and what is parsed back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecordRef<'a> {
    pub lsn: u64,
    pub received_ms: i64,
    pub entry: EntryRef<'a>,
}

impl RecordRef<'_> {
    /// Appends the record as written (header and body) to `out`, without
    /// an allocation of its own.
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0u8; HEADER]);
        out.extend_from_slice(&self.lsn.to_le_bytes());
        match self.entry {
            EntryRef::Sample { sensor, doc } => {
                out.push(KIND_SAMPLE);
                out.extend_from_slice(&self.received_ms.to_le_bytes());
                out.extend_from_slice(&(sensor.len() as u16).to_le_bytes());
                out.extend_from_slice(sensor.as_bytes());
                out.extend_from_slice(doc);
            }
            EntryRef::DeadLetter { doc } => {
                out.push(KIND_DEADLETTER);
                out.extend_from_slice(&self.received_ms.to_le_bytes());
                out.extend_from_slice(doc);
            }
            EntryRef::MessageId {
                session,
                pkid,
                digest,
                topic,
            } => {
                out.push(KIND_MESSAGE_ID);
                out.extend_from_slice(&self.received_ms.to_le_bytes());
                out.extend_from_slice(&pkid.to_le_bytes());
                out.extend_from_slice(&digest.to_le_bytes());
                match session {
                    SessionId::Key(key) => out.extend_from_slice(&key.to_le_bytes()),
                    SessionId::Index(0) => {}
                    SessionId::Index(k) => out.push(k),
                }
                if let (SessionId::Key(_), Some(topic)) = (session, topic) {
                    out.extend_from_slice(&topic.to_le_bytes());
                }
            }
            EntryRef::Sparkplug { change } => {
                out.push(KIND_SPARKPLUG);
                out.extend_from_slice(&self.received_ms.to_le_bytes());
                out.extend_from_slice(change);
            }
            EntryRef::LastValue { topic, digest } => {
                out.push(KIND_LAST_VALUE);
                out.extend_from_slice(&self.received_ms.to_le_bytes());
                out.extend_from_slice(&topic.to_le_bytes());
                out.extend_from_slice(&digest.to_le_bytes());
            }
        }
        let body = start + HEADER;
        let len = (out.len() - body) as u32;
        let crc = crc32fast::hash(&out[body..]);
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4..body].copy_from_slice(&crc.to_le_bytes());
    }

    /// A record's body (after the header); `None` when it is not one.
    fn decode(body: &[u8]) -> Option<RecordRef<'_>> {
        let lsn = u64::from_le_bytes(body.get(0..8)?.try_into().ok()?);
        let kind = *body.get(8)?;
        let received_ms = i64::from_le_bytes(body.get(9..17)?.try_into().ok()?);
        let rest = body.get(17..)?;
        let entry = match kind {
            KIND_SAMPLE => {
                let n = u16::from_le_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
                EntryRef::Sample {
                    sensor: std::str::from_utf8(rest.get(2..2 + n)?).ok()?,
                    doc: rest.get(2 + n..)?,
                }
            }
            KIND_DEADLETTER => EntryRef::DeadLetter { doc: rest },
            KIND_MESSAGE_ID => {
                let (session, topic) = match rest.get(10..)? {
                    [] => (SessionId::Index(0), None),
                    [k] => (SessionId::Index(*k), None),
                    key if key.len() == 8 => (
                        SessionId::Key(u64::from_le_bytes(key.try_into().ok()?)),
                        None,
                    ),
                    both if both.len() == 16 => (
                        SessionId::Key(u64::from_le_bytes(both[0..8].try_into().ok()?)),
                        Some(u64::from_le_bytes(both[8..16].try_into().ok()?)),
                    ),
                    _ => return None,
                };
                EntryRef::MessageId {
                    pkid: u16::from_le_bytes(rest.get(0..2)?.try_into().ok()?),
                    digest: u64::from_le_bytes(rest.get(2..10)?.try_into().ok()?),
                    session,
                    topic,
                }
            }
            KIND_SPARKPLUG => EntryRef::Sparkplug { change: rest },
            KIND_LAST_VALUE if rest.len() == 16 => EntryRef::LastValue {
                topic: u64::from_le_bytes(rest[0..8].try_into().ok()?),
                digest: u64::from_le_bytes(rest[8..16].try_into().ok()?),
            },
            _ => return None,
        };
        Some(RecordRef {
            lsn,
            received_ms,
            entry,
        })
    }

    #[cfg(test)]
    pub fn into_record(self) -> Record {
        Record {
            lsn: self.lsn,
            received_ms: self.received_ms,
            entry: match self.entry {
                EntryRef::Sample { sensor, doc } => Entry::Sample {
                    sensor: sensor.to_string(),
                    doc: doc.to_vec(),
                },
                EntryRef::DeadLetter { doc } => Entry::DeadLetter { doc: doc.to_vec() },
                EntryRef::MessageId {
                    session,
                    pkid,
                    digest,
                    topic,
                } => Entry::MessageId {
                    session,
                    pkid,
                    digest,
                    topic,
                },
                EntryRef::Sparkplug { change } => Entry::Sparkplug {
                    change: change.to_vec(),
                },
                EntryRef::LastValue { topic, digest } => Entry::LastValue { topic, digest },
            },
        }
    }
}

#[cfg(test)]
impl Record {
    pub fn as_ref(&self) -> RecordRef<'_> {
        RecordRef {
            lsn: self.lsn,
            received_ms: self.received_ms,
            entry: match &self.entry {
                Entry::Sample { sensor, doc } => EntryRef::Sample { sensor, doc },
                Entry::DeadLetter { doc } => EntryRef::DeadLetter { doc },
                Entry::MessageId {
                    session,
                    pkid,
                    digest,
                    topic,
                } => EntryRef::MessageId {
                    session: *session,
                    pkid: *pkid,
                    digest: *digest,
                    topic: *topic,
                },
                Entry::Sparkplug { change } => EntryRef::Sparkplug { change },
                Entry::LastValue { topic, digest } => EntryRef::LastValue {
                    topic: *topic,
                    digest: *digest,
                },
            },
        }
    }

    /// Appends the record as written (header and body) to `out`.
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        self.as_ref().encode_into(out);
    }

    /// The record as written: header and body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out);
        out
    }
}

/// The records encoded back to back in `bytes` (as appended, or as read
/// back), in order. Stops at the first that is not a whole record.
pub fn parse(bytes: &[u8]) -> impl Iterator<Item = RecordRef<'_>> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        let len = u32::from_le_bytes(rest.get(0..4)?.try_into().ok()?) as usize;
        let body = rest.get(HEADER..HEADER + len)?;
        let rec = RecordRef::decode(body)?;
        rest = &rest[HEADER + len..];
        Some(rec)
    })
}

/// What the spool keeps of a record beyond the record itself: a
/// message's identity (its session's redelivery window) or a topic's last
/// value ([`crate::front::retained`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    Identity {
        lsn: u64,
        session: SessionId,
        pkid: u16,
        digest: u64,
        /// The message changed this topic's last value.
        topic: Option<u64>,
    },
    LastValue {
        lsn: u64,
        topic: u64,
        digest: u64,
    },
}

/// The marks among records encoded back to back in `bytes` (as
/// appended), in order. Only their headers are read, save for the marks'.
pub(crate) fn marks(bytes: &[u8]) -> impl Iterator<Item = Mark> + '_ {
    let mut rest = bytes;
    std::iter::from_fn(move || loop {
        let len = u32::from_le_bytes(rest.get(0..4)?.try_into().ok()?) as usize;
        let body = rest.get(HEADER..HEADER + len)?;
        rest = &rest[HEADER + len..];
        if !matches!(body.get(8), Some(&KIND_MESSAGE_ID | &KIND_LAST_VALUE)) {
            continue;
        }
        match RecordRef::decode(body) {
            Some(RecordRef {
                lsn,
                entry:
                    EntryRef::MessageId {
                        session,
                        pkid,
                        digest,
                        topic,
                    },
                ..
            }) => {
                return Some(Mark::Identity {
                    lsn,
                    session,
                    pkid,
                    digest,
                    topic,
                })
            }
            Some(RecordRef {
                lsn,
                entry: EntryRef::LastValue { topic, digest },
                ..
            }) => return Some(Mark::LastValue { lsn, topic, digest }),
            _ => {}
        }
    })
}

/// What the bytes at the start of a buffer are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A whole, intact record of this many bytes, with this LSN.
    Whole { len: usize, lsn: u64 },
    /// The start of what may be a record: more bytes are needed to tell.
    Short,
    /// Not a record.
    Bad,
}

/// Checks the record at the start of `buf`: its length, checksum and body.
pub(crate) fn frame(buf: &[u8]) -> Frame {
    let Some(header) = buf.get(..HEADER) else {
        return Frame::Short;
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if !(MIN_BODY as u32..=MAX_RECORD).contains(&len) {
        return Frame::Bad;
    }
    let Some(body) = buf.get(HEADER..HEADER + len as usize) else {
        return Frame::Short;
    };
    if crc32fast::hash(body) != crc {
        return Frame::Bad;
    }
    match RecordRef::decode(body) {
        Some(r) => Frame::Whole {
            len: HEADER + len as usize,
            lsn: r.lsn,
        },
        None => Frame::Bad,
    }
}

/// Whether a record might start at `buf[0]` with an LSN in `lsns`: the
/// cheap checks (length, kind, LSN) that come before the checksum when
/// looking for the next intact record past damage.
pub(crate) fn plausible(buf: &[u8], lsns: &std::ops::Range<u64>) -> bool {
    let Some(head) = buf.get(..HEADER + MIN_BODY) else {
        // Too few bytes left to tell: the caller reads more first.
        return true;
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let lsn = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
    (MIN_BODY as u32..=MAX_RECORD).contains(&len)
        && (KIND_SAMPLE..=KIND_LAST_VALUE).contains(&head[16])
        && lsns.contains(&lsn)
}

/// What damaged bytes held, as far as their headers can still be read: the
/// kind of each record and the sensors of the samples, when the lengths
/// chain from the first record to the end of the bytes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Kinds {
    pub samples: u64,
    pub dead_letters: u64,
    pub message_ids: u64,
    pub sparkplug_changes: u64,
    pub last_values: u64,
    /// Sensors of the damaged samples (at most ten).
    pub sensors: Vec<String>,
}

/// Reads what it can of damaged bytes that are believed to hold whole
/// records (see [`Kinds`]); `None` when their lengths do not chain.
pub(crate) fn describe(mut bytes: &[u8]) -> Option<Kinds> {
    let mut k = Kinds::default();
    while !bytes.is_empty() {
        let head = bytes.get(..HEADER + MIN_BODY)?;
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let rec = bytes.get(..HEADER + len)?;
        match head[16] {
            KIND_SAMPLE => {
                k.samples += 1;
                let name = rec
                    .get(HEADER + MIN_BODY..HEADER + MIN_BODY + 2)
                    .and_then(|n| {
                        let n = u16::from_le_bytes([n[0], n[1]]) as usize;
                        let at = HEADER + MIN_BODY + 2;
                        std::str::from_utf8(rec.get(at..at + n)?).ok()
                    });
                if let Some(name) = name {
                    if k.sensors.len() < 10 && !k.sensors.iter().any(|s| s == name) {
                        k.sensors.push(name.to_string());
                    }
                }
            }
            KIND_DEADLETTER => k.dead_letters += 1,
            KIND_MESSAGE_ID => k.message_ids += 1,
            KIND_SPARKPLUG => k.sparkplug_changes += 1,
            KIND_LAST_VALUE => k.last_values += 1,
            _ => return None,
        }
        bytes = &bytes[HEADER + len..];
    }
    Some(k)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A sample record with a small made-up document.
    pub(crate) fn sample(lsn: u64) -> Record {
        Record {
            lsn,
            received_ms: 7,
            entry: Entry::Sample {
                sensor: format!("s{lsn}"),
                doc: vec![1, 2, 3, lsn as u8],
            },
        }
    }

    #[test]
    fn records_round_trip() {
        for r in [
            sample(5),
            Record {
                lsn: 9,
                received_ms: -1,
                entry: Entry::DeadLetter { doc: vec![9; 40] },
            },
            Record {
                lsn: 10,
                received_ms: 3,
                entry: Entry::MessageId {
                    session: SessionId::Index(0),
                    pkid: 77,
                    digest: 123,
                    topic: None,
                },
            },
            Record {
                lsn: 11,
                received_ms: 3,
                entry: Entry::MessageId {
                    session: SessionId::Index(3),
                    pkid: 77,
                    digest: 123,
                    topic: None,
                },
            },
            Record {
                lsn: 12,
                received_ms: 3,
                entry: Entry::MessageId {
                    session: SessionId::Key(u64::MAX - 5),
                    pkid: 77,
                    digest: 123,
                    topic: None,
                },
            },
            Record {
                lsn: 14,
                received_ms: 3,
                entry: Entry::MessageId {
                    session: SessionId::Key(u64::MAX - 5),
                    pkid: 78,
                    digest: 124,
                    topic: Some(u64::MAX - 7),
                },
            },
            Record {
                lsn: 13,
                received_ms: 4,
                entry: Entry::LastValue {
                    topic: u64::MAX - 1,
                    digest: 99,
                },
            },
        ] {
            let mut bytes = vec![9u8; 3];
            r.encode_into(&mut bytes);
            let bytes = &bytes[3..];
            assert_eq!(bytes, r.encode().as_slice());
            assert_eq!(
                frame(bytes),
                Frame::Whole {
                    len: bytes.len(),
                    lsn: r.lsn
                }
            );
            assert_eq!(frame(&bytes[..bytes.len() - 1]), Frame::Short);
            assert!(plausible(bytes, &(r.lsn..r.lsn + 1)));
            assert!(!plausible(bytes, &(r.lsn + 1..r.lsn + 2)));
            let back: Vec<Record> = parse(bytes).map(|x| x.into_record()).collect();
            assert_eq!(back, vec![r.clone()]);
            let marks: Vec<_> = marks(bytes).collect();
            match r.entry {
                Entry::MessageId {
                    session,
                    pkid,
                    digest,
                    topic,
                } => assert_eq!(
                    marks,
                    [Mark::Identity {
                        lsn: r.lsn,
                        session,
                        pkid,
                        digest,
                        topic,
                    }]
                ),
                Entry::LastValue { topic, digest } => assert_eq!(
                    marks,
                    [Mark::LastValue {
                        lsn: r.lsn,
                        topic,
                        digest
                    }]
                ),
                _ => assert!(marks.is_empty()),
            }
        }
    }

    #[test]
    fn any_flipped_bit_makes_a_record_bad_and_the_kinds_are_read_from_the_headers() {
        let mut bytes = Vec::new();
        sample(40).encode_into(&mut bytes);
        let one = bytes.len();
        sample(41).encode_into(&mut bytes);
        for bit in 0..one * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(
                frame(&b),
                Frame::Whole { len: one, lsn: 40 },
                "bit {bit} flipped"
            );
        }
        let kinds = describe(&bytes).unwrap();
        assert_eq!(kinds.samples, 2);
        assert_eq!(kinds.sensors, vec!["s40".to_string(), "s41".to_string()]);
        assert_eq!(describe(&bytes[..one + 3]), None, "lengths do not chain");
    }
}
