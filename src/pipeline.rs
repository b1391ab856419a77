//! The task between ingest and the database: decodes each message, buffers
//! its samples, flushes, and releases acknowledgements once everything a
//! message carried is durable. It owns the [`Buffer`], the [`AckQueue`] and
//! the [`Writer`]; no state is shared.
//!
//! A flush is awaited in this task, so at most one flush is in flight and
//! while it lasts no new messages are taken (the channel from ingest fills
//! and then holds the broker back). Flushes happen:
//! - every `flush.interval` (all sensors);
//! - early when a sensor has enough samples to fill its open bucket (ready
//!   sensors only);
//! - at once when `flush.max_pending_samples` samples are buffered, or when
//!   `mqtt.max_inflight` messages wait for acknowledgement (the broker sends
//!   no more until some are acknowledged), both for all sensors;
//! - right before each closer run (every `closer.interval`), which therefore
//!   never overlaps a write.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::bucket::{Sample, Shape};
use crate::buffer::Buffer;
use crate::closer::Closer;
use crate::decode::Decoder;
use crate::ingest::acks::AckQueue;
use crate::ingest::{AckToken, Acker, Message};
use crate::telemetry::{self, Health};
use crate::writer::{Aborted, Outcome, Writer};

/// Dead-letter payloads are kept up to this size (`truncated: true` beyond).
pub const DEADLETTER_PAYLOAD_MAX: usize = 64 * 1024;

/// How often a cause of rejection is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// A message waiting for its acknowledgement.
struct Unacked {
    /// `None` for QoS 0: released in order, but nothing to send.
    ack: Option<AckToken>,
    received_ms: i64,
}

struct DeadLetter {
    msg: u64,
    doc: Document,
}

/// How often the pipeline flushes and runs the closer.
#[derive(Debug, Clone, Copy)]
pub struct Intervals {
    pub flush: Duration,
    pub closer: Duration,
}

/// What was left undone when shutdown gave up.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Leftover {
    pub samples: usize,
    pub dead_letters: usize,
    pub unacknowledged: usize,
}

pub struct Pipeline {
    decoder: Decoder,
    buffer: Buffer,
    acks: AckQueue<Unacked>,
    acker: Acker,
    writer: Writer,
    deadletters: Vec<DeadLetter>,
    max_pending: usize,
    max_unacked: usize,
    max_lateness_ms: i64,
    throttle: LogThrottle,
    closer: Closer,
    /// Windows ending at or before this were sealed by the last closer run.
    sealed_until: Option<i64>,
    closer_failing: bool,
    health: Arc<Health>,
}

impl Pipeline {
    pub fn new(
        settings: &crate::config::Settings,
        decoder: Decoder,
        acker: Acker,
        writer: Writer,
        shape: Shape,
        health: Arc<Health>,
    ) -> Self {
        Pipeline {
            decoder,
            buffer: Buffer::new(shape),
            acks: AckQueue::default(),
            acker,
            writer,
            deadletters: Vec::new(),
            max_pending: settings.flush.max_pending_samples,
            max_unacked: settings.mqtt.max_inflight,
            max_lateness_ms: settings.bucket.max_lateness.as_millis() as i64,
            throttle: LogThrottle::default(),
            closer: Closer::new(&settings.mongodb.collection, settings.closer.grace),
            sealed_until: None,
            closer_failing: false,
            health,
        }
    }

    /// Runs until `stop`, then drains what was received, flushes everything
    /// and releases the acknowledgements that became due. Returns what was
    /// left when `abort` cut that short.
    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<Message>,
        intervals: Intervals,
        stop: CancellationToken,
        abort: CancellationToken,
    ) -> Result<(), Leftover> {
        let mut ticker = tokio::time::interval(intervals.flush);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closer_ticker = tokio::time::interval(intervals.closer);
        closer_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                msg = rx.recv() => match msg {
                    Some(m) => {
                        self.receive(m);
                        let all = self.buffer.pending() >= self.max_pending
                            || self.acks.len() >= self.max_unacked;
                        if (all || self.buffer.has_ready()) && self.flush(all, &abort).await.is_err() {
                            return Err(self.leftover(&rx));
                        }
                    }
                    None => break,
                },
                _ = ticker.tick() => {
                    if self.flush(true, &abort).await.is_err() {
                        return Err(self.leftover(&rx));
                    }
                }
                _ = closer_ticker.tick() => {
                    // Flush first: what arrived before the run joins its bucket
                    // before the bucket is sealed.
                    if self.flush(true, &abort).await.is_err() {
                        return Err(self.leftover(&rx));
                    }
                    self.close_buckets().await;
                }
            }
        }
        // Shutdown: take what is already in the channel, then flush it all.
        rx.close();
        while let Some(m) = rx.recv().await {
            self.receive(m);
        }
        let pending = self.buffer.pending();
        if pending > 0 {
            info!(samples = pending, "Flushing buffered samples before exit.");
        }
        if self.flush(true, &abort).await.is_err() {
            return Err(self.leftover(&rx));
        }
        Ok(())
    }

    /// One closer run. A failure is logged and retried at the next interval;
    /// it never holds up the data path.
    async fn close_buckets(&mut self) {
        // The seal is hinted to the closer's index: it must exist. One
        // attempt; the writer logs the outage and the next run tries again.
        if !self.writer.try_ensure_indexes().await {
            return;
        }
        let now = crate::now_ms();
        match self.closer.run(self.writer.db(), now).await {
            Ok(sealed) => {
                if self.closer_failing {
                    info!("The closer works again.");
                    self.closer_failing = false;
                }
                if sealed > 0 {
                    metrics::counter!(telemetry::BUCKETS_SEALED).increment(sealed);
                    debug!(sealed, "Sealed buckets.");
                }
                let cutoff = self.closer.cutoff(now);
                self.sealed_until = Some(cutoff);
                // Sealed windows' buckets take no more samples: forget them.
                let window = self.buffer.shape().window_ms;
                self.buffer.forget_before(cutoff - window + 1);
            }
            Err(e) => {
                if !self.closer_failing {
                    warn!(error = %e, "The closer could not seal buckets; retrying at its next interval.");
                    self.closer_failing = true;
                }
            }
        }
    }

    fn leftover(&self, rx: &mpsc::Receiver<Message>) -> Leftover {
        Leftover {
            samples: self.buffer.pending(),
            dead_letters: self.deadletters.len(),
            // Messages still in the channel were not acknowledged either.
            unacknowledged: self.acks.len() + rx.len(),
        }
    }

    /// Decodes a message into the buffer and the dead-letter list.
    fn receive(&mut self, m: Message) {
        let decoded = self.decoder.decode(&m.topic, &m.payload, m.received_ms);
        let items = (decoded.readings.len() + decoded.errors.len()) as u32;
        let seq = self.acks.push(
            Some(Unacked {
                ack: m.ack,
                received_ms: m.received_ms,
            }),
            items,
        );
        metrics::counter!(telemetry::SAMPLES_DECODED).increment(decoded.readings.len() as u64);
        for reading in &decoded.readings {
            let sample = Sample::encode(reading, seq);
            if let Err(e) = self.buffer.push(&reading.sensor, sample) {
                self.dead_letter(seq, &m, "sample_too_large", e.to_string());
            }
        }
        for e in &decoded.errors {
            self.dead_letter(seq, &m, e.cause(), e.to_string());
        }
        self.release_acks();
    }

    fn dead_letter(&mut self, msg: u64, m: &Message, cause: &'static str, error: String) {
        self.throttle.log(cause, &m.topic, &error);
        metrics::counter!(telemetry::DEAD_LETTERS, "cause" => cause).increment(1);
        let keep = m.payload.len().min(DEADLETTER_PAYLOAD_MAX);
        let mut doc = doc! {
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
        self.deadletters.push(DeadLetter { msg, doc });
    }

    /// Writes dead letters and the pending samples (all sensors', or only the
    /// ready ones), then releases the acknowledgements that became due.
    async fn flush(&mut self, all: bool, abort: &CancellationToken) -> Result<(), Aborted> {
        let started = Instant::now();
        // Learn the fill of open buckets palletd has no memory of (after a
        // restart, or a sensor seen for the first time), so the batch fills
        // them instead of starting new ones.
        let unknown = self.buffer.unknown_windows(all);
        if !unknown.is_empty() {
            match self.writer.open_fills(&unknown).await {
                Ok(found) => self.buffer.learn(&unknown, found),
                Err(e) => debug!(error = %e, "Could not learn open bucket fills; writing without."),
            }
        }
        let statements = self.buffer.take(all);
        let mut samples = 0;
        let writing = !statements.is_empty() || !self.deadletters.is_empty();
        if writing {
            self.health.flush_started();
        }
        if !statements.is_empty() {
            let outcomes = match self.writer.write_statements(&statements, abort).await {
                Ok(o) => o,
                Err(e) => {
                    // Put nothing back: shutdown is giving up and the broker
                    // still holds every unacknowledged message.
                    return Err(e);
                }
            };
            for (st, outcome) in statements.iter().zip(outcomes) {
                match outcome {
                    Outcome::Applied { inserted } => {
                        self.buffer.settle(st, Some(inserted));
                        if inserted {
                            metrics::counter!(telemetry::BUCKETS_CREATED).increment(1);
                        }
                        let window = self.buffer.shape().window_ms;
                        if self.sealed_until.is_some_and(|t| st.start_ms + window <= t) {
                            metrics::counter!(telemetry::SAMPLES_LATE_INTO_SEALED)
                                .increment(st.samples.len() as u64);
                        }
                        samples += st.samples.len();
                        for s in &st.samples {
                            self.acks.resolve(s.msg, 1);
                        }
                    }
                    Outcome::Rejected(error) => {
                        self.buffer.settle(st, None);
                        self.throttle
                            .log("rejected_by_database", &st.sensor, &error);
                        for s in &st.samples {
                            let doc = doc! {
                                "receivedAt": bson::DateTime::now(),
                                "sensorId": &st.sensor,
                                "sample": bson::to_bson(&s.doc).unwrap_or(bson::Bson::Null),
                                "error": &error,
                                "cause": "rejected_by_database",
                            };
                            self.deadletters.push(DeadLetter { msg: s.msg, doc });
                        }
                    }
                }
            }
        }
        if !self.deadletters.is_empty() {
            let docs: Vec<Document> = self.deadletters.iter().map(|d| d.doc.clone()).collect();
            self.writer.write_deadletters(&docs, abort).await?;
            for d in std::mem::take(&mut self.deadletters) {
                self.acks.resolve(d.msg, 1);
            }
        }
        if all {
            let keep_from = self
                .buffer
                .shape()
                .window_start(crate::now_ms() - self.max_lateness_ms)
                - self.buffer.shape().window_ms;
            self.buffer.forget_before(keep_from);
        }
        if writing {
            self.health.flush_finished(samples as u64);
            metrics::counter!(telemetry::FLUSHES).increment(1);
            metrics::counter!(telemetry::STATEMENTS).increment(statements.len() as u64);
            metrics::counter!(telemetry::SAMPLES_STORED).increment(samples as u64);
            metrics::histogram!(telemetry::FLUSH_SECONDS).record(started.elapsed().as_secs_f64());
        }
        let acked = self.release_acks();
        if samples > 0 || acked > 0 {
            debug!(
                statements = statements.len(),
                samples,
                acked,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "Flushed."
            );
        }
        Ok(())
    }

    fn release_acks(&mut self) -> usize {
        let acker = &self.acker;
        let released = self.acks.pop_ready(|u| {
            if let Some(a) = u.ack {
                acker.ack(a);
            }
        });
        let oldest = self.acks.oldest().map_or(0.0, |u| {
            (crate::now_ms() - u.received_ms).max(0) as f64 / 1000.0
        });
        metrics::gauge!(telemetry::OLDEST_UNACKED_SECONDS).set(oldest);
        metrics::gauge!(telemetry::PENDING_SAMPLES).set(self.buffer.pending() as f64);
        released
    }
}

/// Logs each cause of rejection at most once per [`LOG_EVERY`], with how
/// many were suppressed since.
#[derive(Default)]
struct LogThrottle {
    last: HashMap<&'static str, (Instant, u64)>,
}

impl LogThrottle {
    fn log(&mut self, cause: &'static str, subject: &str, error: &str) {
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
