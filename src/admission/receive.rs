//! One message taken in: its identity's records, its readings decoded,
//! thinned and spooled as samples, what was refused as a dead letter, and
//! its acknowledgement queued.

use super::*;

use tracing::info;

use crate::bucket::Sample;
use crate::deadletter;
use crate::decode::{Decoded, Retained};
use crate::front::acks::AckQueue;
use crate::front::retained::topic_key;
use crate::front::window::digest;
use crate::ingest::{Disposition, Identity, Message, Void};
use crate::spool::{EntryRef, SessionId};
use crate::telemetry;
use crate::telemetry::Reporter;

impl Admission {
    /// Counts what a Sparkplug B message did, spools the changes it made to
    /// the state (records of their own, before its samples) and sends a
    /// rebirth request.
    pub(super) fn sparkplug_outcome(
        &mut self,
        o: &crate::decode::sparkplug::Effects,
        now_ms: i64,
        batch: &mut Arrivals,
    ) {
        let Some(kind) = o.kind else { return };
        match batch.sparkplug.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => batch.sparkplug.push((kind, 1)),
        }
        if o.seq_gaps > 0 {
            metrics::counter!(telemetry::SPARKPLUG_SEQ_GAPS).increment(u64::from(o.seq_gaps));
        }
        if o.out_of_order > 0 {
            metrics::counter!(telemetry::SPARKPLUG_OUT_OF_ORDER)
                .increment(u64::from(o.out_of_order));
        }
        for datatype in &o.skipped {
            metrics::counter!(telemetry::SPARKPLUG_SKIPPED, "datatype" => *datatype).increment(1);
        }
        if o.stale_death {
            metrics::counter!(telemetry::SPARKPLUG_STALE_DEATHS).increment(1);
        }
        for change in &o.changes {
            let json = serde_json::to_vec(change).expect("a change serializes");
            let entry = EntryRef::Sparkplug { change: &json };
            batch.append(&mut self.next_lsn, now_ms, entry);
            if let Some(file) = &mut self.sparkplug {
                file.changed(json.len());
            }
        }
        if !o.changes.is_empty() {
            if let Some(file) = &mut self.sparkplug {
                let state = self.decoder.sparkplug_state();
                if o.evicted > 0 {
                    file.evicted(o.evicted, state, self.decoder.limits().max_sparkplug_bytes);
                }
                metrics::gauge!(telemetry::MEMORY_BYTES, "part" => "sparkplug")
                    .set(state.bytes() as f64);
            }
        }
        if let Some(topic) = &o.rebirth {
            let payload = crate::decode::sparkplug::rebirth_payload(now_ms);
            let sent = self.acker.publish_nowait(topic.clone(), payload);
            let outcome = if sent { "sent" } else { "dropped" };
            metrics::counter!(telemetry::SPARKPLUG_REBIRTHS, "outcome" => outcome).increment(1);
            info!(topic = ?topic, sent, "Asked a Sparkplug B edge node for a rebirth.");
        }
    }

    /// Records of the session's identities that are not a message's
    /// samples: a redelivery's, where it arrived again, and those that void
    /// earlier ones (crate::front::window), which the connection waits to be
    /// durable before it subscribes. `false`: the message only said where a
    /// resumed session's records begin; nothing more to do.
    pub(super) fn identity_record(&mut self, m: &Message, batch: &mut Arrivals) -> bool {
        let identity = match (m.disposition, m.id) {
            (Disposition::Store, _) | (Disposition::Probe, _) | (_, None) => None,
            (Disposition::Redelivery | Disposition::Resent, Some(id)) => Some(id),
            (Disposition::Void(Void::Reset), Some(id)) => Some(Identity {
                digest: self.next_lsn,
                ..id
            }),
            (Disposition::Void(Void::Settled), Some(id)) => Some(Identity {
                digest: *self.resumed_at.get(&id.session).unwrap_or(&self.run_start),
                ..id
            }),
            (Disposition::Resumed, Some(id)) => {
                self.resumed_at.insert(id.session, self.next_lsn);
                return false;
            }
        };
        if let Some(id) = identity {
            let entry = EntryRef::MessageId {
                session: SessionId::Key(id.session),
                pkid: id.pkid,
                digest: id.digest,
                topic: None,
            };
            batch.append(&mut self.next_lsn, m.received_ms, entry);
        }
        true
    }

    /// A likely redelivery ([`Disposition::Resent`]: a broker that
    /// renumbers its resends, or one not yet seen to keep its ids) is a
    /// redelivery when its payload tells: a Sparkplug B payload (its
    /// sequence number and time stamp make each one its own), or one whose
    /// readings all carry a time of their own (another message with that
    /// topic and payload is the same readings again). Any other is stored:
    /// a duplicate rather than a loss. Returns what it decoded to, when it
    /// is stored (not decoded twice).
    fn resent(&mut self, m: &mut Message) -> Option<Decoded> {
        if m.disposition != Disposition::Resent {
            return None;
        }
        if self.decoder.format_of(&m.topic) == Some(crate::decode::PayloadFormat::SparkplugB) {
            m.disposition = Disposition::Redelivery;
            return None;
        }
        let decoded =
            self.decoder
                .decode_with(&m.topic, &m.payload, m.props.as_deref(), m.received_ms);
        let timed = !decoded.readings.is_empty()
            && decoded.errors.is_empty()
            && decoded.readings.iter().all(|r| r.ts_ms != m.received_ms);
        match timed {
            true => {
                m.disposition = Disposition::Redelivery;
                None
            }
            false => {
                m.disposition = Disposition::Store;
                Some(decoded)
            }
        }
    }

    /// Decodes a message into `batch` and queues its acknowledgement (due
    /// once the batch is durable).
    pub(super) fn receive(
        &mut self,
        mut m: Message,
        acks: &mut AckQueue<Unacked>,
        reporter: &mut Reporter,
        batch: &mut Arrivals,
    ) {
        self.queue.sub(m.cost());
        let early = self.resent(&mut m);
        let unacked = Unacked {
            ack: m.ack,
            received_ms: m.received_ms,
        };
        if !self.identity_record(&m, batch) {
            return;
        }
        if m.disposition != Disposition::Store {
            // A redelivery of what is spooled, palletd's own probe, or a
            // void: acknowledged (or told) once everything before it is
            // durable, nothing stored.
            if m.disposition == Disposition::Redelivery {
                metrics::counter!(telemetry::REDELIVERIES_SKIPPED).increment(1);
            }
            acks.push(self.next_lsn, unacked);
            self.release(acks);
            return;
        }
        // A retained copy of the topic's last value is passed over (see
        // crate::front::retained); what is taken in changes that value.
        let topic = topic_key(&m.topic);
        let digest =
            m.id.map_or_else(|| digest(&m.topic, &m.payload), |id| id.digest);
        let decoded = match (m.retained, self.decoder.retained_rule(&m.topic)) {
            (true, Retained::Skip) => Decoded::skipped(crate::decode::SKIPPED_RETAINED),
            (true, Retained::Changed) if self.last_values.same(topic, digest) => {
                Decoded::skipped(crate::decode::SKIPPED_RETAINED_SEEN)
            }
            _ => match early {
                Some(decoded) => decoded,
                None => self.decoder.decode_with(
                    &m.topic,
                    &m.payload,
                    m.props.as_deref(),
                    m.received_ms,
                ),
            },
        };
        let changed = decoded.skipped != Some(crate::decode::SKIPPED_RETAINED_SEEN)
            && self.decoder.retained_of(decoded.subscription) == Retained::Changed
            && self.last_values.take(topic, digest);
        if let Some(reason) = decoded.skipped {
            metrics::counter!(telemetry::MESSAGES_SKIPPED, "reason" => reason).increment(1);
        }
        self.sparkplug_outcome(&decoded.sparkplug, m.received_ms, batch);
        batch.messages += 1;
        // Everything refused of the message goes into one dead letter.
        let mut refused = deadletter::Refusals::default();
        for e in &decoded.errors {
            refused.add(e.cause(), e.index(), || e.to_string());
        }
        for d in &decoded.dropped {
            reporter.dropped(d.cause, &m.topic, &d.message);
        }
        let rules = (decoded.subscription)
            .and_then(|i| self.decoder.subscriptions().get(i))
            .map_or(&[][..], |s| &s.thinning[..]);
        for reading in &decoded.readings {
            if !self.sensors.admit(&reading.sensor, m.received_ms) {
                let max = self.sensors.max;
                refused.add("too_many_sensors", Some(reading.index), || {
                    format!(
                        "sensor {:?} is new and limits.max_sensors ({max}) active sensors are already tracked",
                        reading.sensor
                    )
                });
                continue;
            }
            // The verdicts go into the records (a replay reads them back);
            // the points of earlier readings that end a run go first.
            let (thinned, later) = self
                .thinning
                .thin(rules, reading, m.received_ms, self.next_lsn);
            for sample in later.samples(self.next_lsn) {
                batch.sample(&mut self.next_lsn, m.received_ms, &reading.sensor, &sample);
                batch.archived += 1;
            }
            let sample = Sample::encode_thinned(reading, self.next_lsn, &thinned);
            if let Err(too_big) = self.shape.check(sample.as_ref()) {
                refused.add("sample_too_large", Some(reading.index), || {
                    too_big.to_string()
                });
                continue;
            }
            batch.sample(&mut self.next_lsn, m.received_ms, &reading.sensor, &sample);
            batch.samples += 1;
        }
        if !refused.is_empty() {
            self.dead_letter(&m, &refused, reporter, batch);
        }
        // The message's identity goes last: recovery cuts a torn write off
        // at its first bad byte, so a message whose identity is recovered
        // has all its records in the spool, and its redelivery may be
        // skipped. (First, a redelivery of a message whose samples were cut
        // with the torn tail was taken as spooled, and its readings lost.)
        // A message that changed its topic's last value says so in its
        // identity (its digest is the message's), or, without one (QoS 0),
        // in a record of its own, last too: a torn write cut off before
        // never leaves the last value of a message the broker sends again
        // (its retained copy would be passed over, and lost).
        let topic = changed.then_some(topic);
        match m.id {
            Some(id) => batch.append(
                &mut self.next_lsn,
                m.received_ms,
                EntryRef::MessageId {
                    session: SessionId::Key(id.session),
                    pkid: id.pkid,
                    digest: id.digest,
                    topic,
                },
            ),
            None => {
                if let Some(topic) = topic {
                    let entry = EntryRef::LastValue { topic, digest };
                    batch.append(&mut self.next_lsn, m.received_ms, entry);
                }
            }
        }
        acks.push(self.next_lsn, unacked);
    }
}
