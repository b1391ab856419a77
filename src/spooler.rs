//! The spooler task: decodes each message, appends what it carried (samples,
//! dead letters, the message's identity) to the spool with fresh LSNs, and
//! acknowledges the message as soon as the spool is durable up to its last
//! record. It never waits for the database.
//!
//! What it appended is also offered to the pipeline in memory (a bounded
//! channel, never awaited); a batch the pipeline has no room for stays on
//! disk only, and the pipeline reads it back later (catch-up).
//!
//! When the spool reaches `spool.max_size`, the spooler stops taking
//! messages: they stay unacknowledged at the broker until the checkpoint
//! frees segments. It says so at ERROR, with the numbers.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::bucket::Sample;
use crate::decode::Decoder;
use crate::ingest::acks::AckQueue;
use crate::ingest::{AckToken, Acker, Message};
use crate::spool::{Command, Entry, Record, SpoolStats};
use crate::telemetry;

/// Dead-letter payloads are kept up to this size (`truncated: true` beyond).
pub const DEADLETTER_PAYLOAD_MAX: usize = 64 * 1024;

/// How often a cause of rejection is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Bounds the distinct sensors palletd tracks. A sensor not seen for
/// `idle_ms` (a window plus the closer's grace: its bucket is done) may be
/// forgotten to make room; a new sensor when all places are taken by active
/// ones is refused (its readings go to the dead letter), so a flood of
/// made-up sensor ids cannot grow memory.
pub struct SensorLimit {
    max: usize,
    idle_ms: i64,
    last_seen: HashMap<String, i64>,
    last_sweep: i64,
}

impl SensorLimit {
    pub fn new(max: usize, idle_ms: i64) -> Self {
        SensorLimit {
            max,
            idle_ms,
            last_seen: HashMap::new(),
            last_sweep: 0,
        }
    }

    /// Whether a reading of `sensor` at `now_ms` may be taken.
    pub fn admit(&mut self, sensor: &str, now_ms: i64) -> bool {
        if let Some(t) = self.last_seen.get_mut(sensor) {
            *t = now_ms;
            return true;
        }
        if self.last_seen.len() >= self.max && now_ms - self.last_sweep >= 1000 {
            // At most once a second: forget sensors that went idle.
            self.last_sweep = now_ms;
            let idle = self.idle_ms;
            self.last_seen.retain(|_, t| now_ms - *t < idle);
        }
        if self.last_seen.len() >= self.max {
            return false;
        }
        self.last_seen.insert(sensor.to_string(), now_ms);
        true
    }
}

/// What one message appended, offered to the pipeline.
#[derive(Debug)]
pub struct Feed {
    /// LSN of the first record of the batch of messages.
    pub first: u64,
    /// LSN after its last record.
    pub end: u64,
    pub samples: Vec<(String, Sample)>,
    pub deadletters: Vec<(u64, Document)>,
}

/// Messages handled together: one spool append and one feed for all.
struct Batch {
    bytes: Vec<u8>,
    feed: Feed,
    messages: usize,
}

impl Batch {
    fn new(first: u64) -> Batch {
        Batch {
            bytes: Vec::new(),
            feed: Feed {
                first,
                end: first,
                samples: Vec::new(),
                deadletters: Vec::new(),
            },
            messages: 0,
        }
    }
}

/// Messages taken from the channel at once, when that many are waiting.
const MAX_BATCH_MESSAGES: usize = 512;

/// How often the spool gauges are refreshed.
const GAUGE_EVERY: Duration = Duration::from_millis(100);

/// A message waiting for its acknowledgement.
struct Unacked {
    /// `None` for QoS 0: nothing to send.
    ack: Option<AckToken>,
    received_ms: i64,
}

/// The `_id` of the dead letter with this LSN: idempotent inserts.
pub fn deadletter_id(tag: u32, lsn: u64) -> bson::oid::ObjectId {
    let mut bytes = [0u8; 12];
    bytes[0..4].copy_from_slice(&tag.to_be_bytes());
    bytes[4..12].copy_from_slice(&lsn.to_be_bytes());
    bson::oid::ObjectId::from_bytes(bytes)
}

pub struct Spooler {
    pub decoder: Decoder,
    pub acker: Acker,
    pub spool: mpsc::Sender<Command>,
    pub durable: watch::Receiver<u64>,
    pub stats: Arc<SpoolStats>,
    pub next_lsn: u64,
    pub tag: u32,
    pub max_size: u64,
    /// Bytes one sample may have (`bucket.max_bytes`).
    pub max_sample_bytes: u32,
    pub feed: mpsc::Sender<Feed>,
    pub sensors: SensorLimit,
}

impl Spooler {
    /// Runs until `stop`; then spools what is already received, waits until
    /// it is durable and releases the acknowledgements. Returns the number of
    /// messages left unacknowledged if `abort` cut that short.
    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<Message>,
        stop: CancellationToken,
        abort: CancellationToken,
    ) -> Result<(), usize> {
        let mut acks: AckQueue<Unacked> = AckQueue::default();
        let mut throttle = LogThrottle::default();
        let mut full_since: Option<Instant> = None;
        // (first LSN, received) of a message at most once a second, to tell
        // the age of the oldest record the checkpoint has not passed.
        let mut marks: std::collections::VecDeque<(u64, i64)> = Default::default();
        let mut gauges_at = Instant::now() - GAUGE_EVERY;
        loop {
            if gauges_at.elapsed() >= GAUGE_EVERY {
                gauges_at = Instant::now();
                self.gauges(&mut marks, &acks);
            }
            let full = self.stats.bytes.load(Ordering::Relaxed) >= self.max_size;
            match (full, full_since) {
                (true, None) => {
                    full_since = Some(Instant::now());
                    error!(
                        bytes = self.stats.bytes.load(Ordering::Relaxed),
                        max_size = self.max_size,
                        unconfirmed_records = self.next_lsn.saturating_sub(self.stats.checkpoint.load(Ordering::Relaxed)),
                        "Spool is full: not acknowledging new messages (the broker keeps them) until the database takes the backlog."
                    );
                }
                (false, Some(t)) => {
                    info!(after = ?Duration::from_secs(t.elapsed().as_secs()), "Spool has room again; taking messages.");
                    full_since = None;
                }
                _ => {}
            }
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                changed = self.durable.changed() => {
                    if changed.is_err() {
                        error!("The spool writer stopped; no more acknowledgements.");
                        return Err(acks.len());
                    }
                    self.release(&mut acks);
                }
                m = rx.recv(), if !full => match m {
                    Some(m) => {
                        // Take what else is waiting: one append, one feed.
                        let mut batch = Batch::new(self.next_lsn);
                        self.receive(m, &mut acks, &mut throttle, &mut batch);
                        while batch.messages < MAX_BATCH_MESSAGES {
                            match rx.try_recv() {
                                Ok(m) => self.receive(m, &mut acks, &mut throttle, &mut batch),
                                Err(_) => break,
                            }
                        }
                        self.send(batch).await;
                    }
                    None => break,
                },
                // While full, look again shortly: checkpoints free segments.
                _ = tokio::time::sleep(Duration::from_millis(200)), if full => {}
                // PUBACKs that did not fit into the client's queue.
                _ = tokio::time::sleep(Duration::from_millis(2)), if self.acker.waiting() > 0 => {
                    self.acker.retry();
                }
            }
        }
        rx.close();
        while let Some(m) = rx.recv().await {
            let mut batch = Batch::new(self.next_lsn);
            self.receive(m, &mut acks, &mut throttle, &mut batch);
            self.send(batch).await;
        }
        let end = self.next_lsn;
        loop {
            self.release(&mut acks);
            if *self.durable.borrow() >= end {
                break;
            }
            tokio::select! {
                changed = self.durable.changed() => if changed.is_err() { break },
                _ = abort.cancelled() => return Err(acks.len()),
            }
        }
        self.release(&mut acks);
        // Hand every due PUBACK to the client before ingest disconnects.
        while !self.acker.retry() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(2)) => {}
                _ = abort.cancelled() => return Err(acks.len() + self.acker.waiting()),
            }
        }
        if acks.is_empty() {
            Ok(())
        } else {
            Err(acks.len())
        }
    }

    fn release(&mut self, acks: &mut AckQueue<Unacked>) {
        let durable = *self.durable.borrow();
        let acker = &mut self.acker;
        acks.pop_ready(durable, |u| {
            if let Some(a) = u.ack {
                acker.ack(a);
            }
        });
    }

    /// Refreshes the spool and acknowledgement gauges.
    fn gauges(&self, marks: &mut std::collections::VecDeque<(u64, i64)>, acks: &AckQueue<Unacked>) {
        let checkpoint = self.stats.checkpoint.load(Ordering::Relaxed);
        while marks.len() > 1 && marks[1].0 <= checkpoint {
            marks.pop_front();
        }
        if marks.back().is_none_or(|m| crate::now_ms() - m.1 >= 1000) {
            marks.push_back((self.next_lsn, crate::now_ms()));
        }
        let oldest = marks
            .front()
            .filter(|m| m.0 < self.next_lsn && checkpoint < self.next_lsn);
        metrics::gauge!(telemetry::SPOOL_OLDEST_SECONDS)
            .set(oldest.map_or(0.0, |m| (crate::now_ms() - m.1).max(0) as f64 / 1000.0));
        metrics::counter!(telemetry::SPOOL_FSYNCS)
            .absolute(self.stats.fsyncs.load(Ordering::Relaxed));
        let oldest = acks.oldest().map_or(0.0, |u| {
            (crate::now_ms() - u.received_ms).max(0) as f64 / 1000.0
        });
        metrics::gauge!(telemetry::OLDEST_UNACKED_SECONDS).set(oldest);
        metrics::gauge!(telemetry::SPOOL_BYTES)
            .set(self.stats.bytes.load(Ordering::Relaxed) as f64);
    }

    /// Appends a batch to the spool, then offers it to the pipeline.
    async fn send(&mut self, batch: Batch) {
        if batch.bytes.is_empty() {
            return;
        }
        metrics::counter!(telemetry::SAMPLES_DECODED).increment(batch.feed.samples.len() as u64);
        let command = Command::Append {
            bytes: batch.bytes,
            end: batch.feed.end,
        };
        if self.spool.send(command).await.is_err() {
            error!("The spool writer stopped; the messages are left to the broker.");
            return;
        }
        // Never wait for the pipeline: what it cannot take now it reads back
        // from the spool.
        let _ = self.feed.try_send(batch.feed);
    }

    /// Decodes a message into `batch` and queues its acknowledgement (due
    /// once the batch is durable).
    fn receive(
        &mut self,
        m: Message,
        acks: &mut AckQueue<Unacked>,
        throttle: &mut LogThrottle,
        batch: &mut Batch,
    ) {
        let unacked = Unacked {
            ack: m.ack,
            received_ms: m.received_ms,
        };
        if m.duplicate {
            // Already spooled before a reconnect or restart: acknowledge it
            // once everything before it is durable, store nothing.
            metrics::counter!(telemetry::REDELIVERIES_SKIPPED).increment(1);
            acks.push(self.next_lsn, unacked);
            self.release(acks);
            return;
        }
        let decoded = self.decoder.decode(&m.topic, &m.payload, m.received_ms);
        batch.messages += 1;
        let feed = &mut batch.feed;
        let bytes = &mut batch.bytes;
        let mut append = |lsn: u64, entry: Entry| {
            bytes.extend_from_slice(
                &Record {
                    lsn,
                    received_ms: m.received_ms,
                    entry,
                }
                .encode(),
            );
        };
        if let (Some((pkid, digest)), Some(_)) = (m.id, m.ack) {
            append(self.next_lsn, Entry::MessageId { pkid, digest });
            self.next_lsn += 1;
        }
        let mut rejections: Vec<(&'static str, String)> = decoded
            .errors
            .iter()
            .map(|e| (e.cause(), e.to_string()))
            .collect();
        for reading in &decoded.readings {
            if !self.sensors.admit(&reading.sensor, m.received_ms) {
                rejections.push((
                    "too_many_sensors",
                    format!(
                        "sensor {:?} is new and limits.max_sensors ({}) active sensors are already tracked",
                        reading.sensor, self.sensors.max
                    ),
                ));
                continue;
            }
            let sample = Sample::encode(reading, self.next_lsn);
            if sample.bytes() > self.max_sample_bytes {
                rejections.push((
                    "sample_too_large",
                    crate::buffer::TooBig {
                        bytes: sample.bytes(),
                        max_bytes: self.max_sample_bytes,
                    }
                    .to_string(),
                ));
                continue;
            }
            append(
                self.next_lsn,
                Entry::Sample {
                    sensor: reading.sensor.clone(),
                    doc: sample.doc.as_bytes().to_vec(),
                },
            );
            self.next_lsn += 1;
            feed.samples.push((reading.sensor.clone(), sample));
        }
        for (cause, error) in rejections {
            throttle.log(cause, &m.topic, &error);
            metrics::counter!(telemetry::DEAD_LETTERS, "cause" => cause).increment(1);
            let lsn = self.next_lsn;
            let doc = deadletter_doc(self.tag, lsn, &m, cause, error);
            append(
                lsn,
                Entry::DeadLetter {
                    doc: bson::to_vec(&doc).unwrap_or_default(),
                },
            );
            self.next_lsn += 1;
            feed.deadletters.push((lsn, doc));
        }
        feed.end = self.next_lsn;
        acks.push(self.next_lsn, unacked);
    }
}

fn deadletter_doc(tag: u32, lsn: u64, m: &Message, cause: &'static str, error: String) -> Document {
    let keep = m.payload.len().min(DEADLETTER_PAYLOAD_MAX);
    let mut doc = doc! {
        "_id": deadletter_id(tag, lsn),
        "receivedAt": bson::DateTime::from_millis(m.received_ms),
        "topic": &m.topic,
        "payload": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: m.payload[..keep].to_vec() },
        "error": error,
        "cause": cause,
    };
    if keep < m.payload.len() {
        doc.insert("truncated", true);
        doc.insert("payloadSize", m.payload.len() as i64);
    }
    doc
}

/// Logs each cause of rejection at most once per [`LOG_EVERY`], with how
/// many were suppressed since.
#[derive(Default)]
pub struct LogThrottle {
    last: HashMap<&'static str, (Instant, u64)>,
}

impl LogThrottle {
    pub fn log(&mut self, cause: &'static str, subject: &str, error: &str) {
        let now = Instant::now();
        match self.last.get_mut(cause) {
            Some((at, suppressed)) if now.duration_since(*at) < LOG_EVERY => {
                *suppressed += 1;
            }
            Some((at, suppressed)) => {
                warn!(
                    cause,
                    subject,
                    error,
                    suppressed = *suppressed,
                    "Reading sent to the dead letter."
                );
                *at = now;
                *suppressed = 0;
            }
            None => {
                warn!(cause, subject, error, "Reading sent to the dead letter.");
                self.last.insert(cause, (now, 0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sensor_limit_refuses_new_sensors_until_idle_ones_are_forgotten() {
        let mut l = SensorLimit::new(2, 10_000);
        assert!(l.admit("a", 0));
        assert!(l.admit("b", 0));
        assert!(!l.admit("c", 5_000), "both still active");
        assert!(l.admit("a", 6_000), "known sensors always pass");
        assert!(l.admit("c", 12_000), "b went idle and was forgotten");
        assert!(!l.admit("d", 12_500), "a and c are active");
    }
}
