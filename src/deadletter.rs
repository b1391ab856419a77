//! The dead letter: what cannot become a sample goes to
//! `<collection>_deadletter` with its cause, and its message is
//! acknowledged. This module owns the documents' shape, their idempotent
//! `_id` and the causes (counted and logged by `telemetry::Reporter`).
//! Sans-IO.
//!
//! A dead letter carries the LSN of its spool record in its `_id`, so
//! writing it again after a crash or an interrupted insert is harmless.

use bson::{doc, Document};

/// Payloads are kept up to this size (`truncated: true` beyond).
pub(crate) const PAYLOAD_MAX: usize = 64 * 1024;

/// What is kept of a payload while dead letters come faster than
/// `limits.max_deadletter_rate`.
pub(crate) const PAYLOAD_CUT: usize = 256;

/// Every cause a reading or a message is dead-lettered for: the label
/// values of `palletd_dead_letters_total` (and of the dropped and cut
/// counters), each registered at 0 at start. A cause not listed here is a
/// bug (debug builds stop on it).
pub const CAUSES: &[&str] = &[
    "payload_too_large",
    "unknown_topic",
    "bad_sensor",
    "bad_payload",
    "bad_timestamp",
    "time_out_of_range",
    "bad_field",
    "field_collision",
    "unknown_alias",
    "too_many_samples",
    "too_many_fields",
    "field_name_too_long",
    "string_too_long",
    "too_many_sparkplug_devices",
    "too_many_sparkplug_aliases",
    "too_many_sensors",
    "sample_too_large",
    "rejected_by_database",
];

/// A dead letter waiting to be written: its spool LSN and its document,
/// as the BSON bytes it was spooled as (sent on without decoding).
pub(crate) type DeadLetter = (u64, bson::RawDocumentBuf);

/// The `_id` of the dead letter of spool `tag` with this LSN.
pub(crate) fn id(tag: u32, lsn: u64) -> bson::oid::ObjectId {
    let mut bytes = [0u8; 12];
    bytes[0..4].copy_from_slice(&tag.to_be_bytes());
    bytes[4..12].copy_from_slice(&lsn.to_be_bytes());
    bson::oid::ObjectId::from_bytes(bytes)
}

/// The LSN in a dead letter's `_id` ([`id`]).
pub(crate) fn lsn_of(id: bson::oid::ObjectId) -> u64 {
    let bytes = id.bytes();
    u64::from_be_bytes(bytes[4..12].try_into().expect("8 bytes"))
}

/// A cause is listed with at most this many of the sample indexes it
/// refused, and its first error text cut to this many bytes.
const MAX_INDEXES: usize = 100;
const MAX_ERROR: usize = 512;

/// What was refused of one message, by cause (first seen first): its
/// dead letter holds the payload once and all of this, however many of the
/// message's samples were refused. Bounded: the causes are a fixed set,
/// each keeps its first error and at most [`MAX_INDEXES`] indexes.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Refusals {
    causes: Vec<Refused>,
}

/// The samples of a message refused for one cause.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refused {
    pub cause: &'static str,
    /// The first error of this cause.
    pub error: String,
    pub count: u64,
    /// Indexes of the refused samples in the message (the first
    /// [`MAX_INDEXES`]); none for a refusal of the whole message.
    pub samples: Vec<u32>,
}

impl Refusals {
    /// One refusal: the whole message (`index` `None`) or one sample.
    pub fn add(
        &mut self,
        cause: &'static str,
        index: Option<usize>,
        error: impl FnOnce() -> String,
    ) {
        debug_assert!(CAUSES.contains(&cause), "{cause} is not in CAUSES");
        let r = match self.causes.iter_mut().position(|r| r.cause == cause) {
            Some(i) => &mut self.causes[i],
            None => {
                let mut error = error();
                error.truncate(crate::decode::truncate(&error, MAX_ERROR).len());
                self.causes.push(Refused {
                    cause,
                    error,
                    count: 0,
                    samples: Vec::new(),
                });
                self.causes.last_mut().expect("pushed")
            }
        };
        r.count += 1;
        if let Some(i) = index {
            if r.samples.len() < MAX_INDEXES {
                r.samples.push(i as u32);
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.causes.is_empty()
    }

    pub(crate) fn causes(&self) -> &[Refused] {
        &self.causes
    }
}

/// A message that was refused, wholly or some of its samples: its topic,
/// (the first 64 KiB of) its payload once, and every cause with how many
/// samples it refused and which (`causes`); `cause` and `error` name the
/// first.
pub(crate) fn for_message(
    tag: u32,
    lsn: u64,
    received_ms: i64,
    topic: &str,
    payload: &[u8],
    refused: &Refusals,
    keep_max: usize,
) -> Document {
    let keep = payload.len().min(keep_max);
    let first = refused.causes.first();
    let causes: Vec<bson::Bson> = refused
        .causes
        .iter()
        .map(|r| {
            bson::Bson::Document(doc! {
                "cause": r.cause,
                "error": &r.error,
                "count": r.count as i64,
                "samples": r.samples.iter().map(|i| i64::from(*i)).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut doc = doc! {
        "_id": id(tag, lsn),
        "receivedAt": bson::DateTime::from_millis(received_ms),
        "topic": topic,
        "payload": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: payload[..keep].to_vec() },
        "error": first.map_or("", |r| r.error.as_str()),
        "cause": first.map_or("", |r| r.cause),
        "refused": refused.causes.iter().map(|r| r.count as i64).sum::<i64>(),
        "causes": causes,
    };
    if keep < payload.len() {
        doc.insert("truncated", true);
        doc.insert("payloadSize", payload.len() as i64);
    }
    doc
}

/// One decoded sample that cannot go into the collection (too large for a
/// bucket, refused by the database): its sensor and the sample itself.
pub(crate) fn for_sample(
    tag: u32,
    lsn: u64,
    now_ms: i64,
    sensor: &str,
    sample: &bson::RawDocument,
    cause: &str,
    error: &str,
) -> Document {
    let sample = Document::try_from(sample)
        .map(bson::Bson::Document)
        .unwrap_or(bson::Bson::Null);
    doc! {
        "_id": id(tag, lsn),
        "receivedAt": bson::DateTime::from_millis(now_ms),
        "sensorId": sensor,
        "sample": sample,
        "error": error,
        "cause": cause,
    }
}

/// A sample refused on its way to a bucket, for an edge to count and log
/// (`telemetry::Reporter`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub cause: &'static str,
    pub sensor: String,
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_per_spool_and_lsn() {
        assert_ne!(id(1, 2), id(1, 3));
        assert_ne!(id(1, 2), id(2, 2));
        assert_eq!(id(7, 9), id(7, 9));
    }

    fn one(cause: &'static str) -> Refusals {
        let mut r = Refusals::default();
        r.add(cause, None, || "e".into());
        r
    }

    #[test]
    fn large_payloads_are_truncated_and_say_so() {
        let d = for_message(
            1,
            2,
            0,
            "t",
            &vec![b'x'; PAYLOAD_MAX + 5],
            &one("bad_payload"),
            PAYLOAD_MAX,
        );
        assert_eq!(d.get_bool("truncated"), Ok(true));
        assert_eq!(d.get_i64("payloadSize"), Ok((PAYLOAD_MAX + 5) as i64));
        let small = for_message(1, 2, 0, "t", b"abc", &one("bad_payload"), PAYLOAD_MAX);
        assert!(small.get("truncated").is_none());
    }

    #[test]
    fn a_message_refused_a_thousand_times_is_one_bounded_document() {
        let mut r = Refusals::default();
        for i in 0..1000 {
            r.add("time_out_of_range", Some(i), || {
                format!("sample {i}: {}", "x".repeat(2000))
            });
        }
        r.add("bad_field", Some(3), || "sample 3: bad".into());
        let d = for_message(1, 2, 0, "t", b"[...]", &r, PAYLOAD_MAX);
        assert_eq!(d.get_str("cause"), Ok("time_out_of_range"));
        assert_eq!(d.get_i64("refused"), Ok(1001));
        let causes = d.get_array("causes").unwrap();
        assert_eq!(causes.len(), 2);
        let first = causes[0].as_document().unwrap();
        assert_eq!(first.get_i64("count"), Ok(1000));
        assert_eq!(first.get_array("samples").unwrap().len(), MAX_INDEXES);
        assert!(first.get_str("error").unwrap().len() <= MAX_ERROR);
        assert!(
            bson::to_vec(&d).unwrap().len() < 4096,
            "bounded whatever the count"
        );
    }
}
