//! Per-sensor pending samples and the memory of each sensor's open buckets.
//! Sans-IO: the pipeline pushes samples in, takes statements out for a
//! flush, and settles each statement with what the database reported.
//!
//! A sensor is *ready* once it holds enough samples to fill its open bucket;
//! the pipeline then flushes early instead of waiting for the interval.

use std::collections::HashMap;

use crate::bucket::{self, Fill, Sample, Shape, Statement};

#[derive(Debug, Default)]
struct SensorBuf {
    pending: Vec<Sample>,
    /// Open-bucket fill per window start; absent means unknown.
    memory: HashMap<i64, Fill>,
    ready: bool,
    /// Highest LSN of this sensor known to be in MongoDB; `None` until
    /// learned from the database (after a start, for samples replayed from
    /// the spool) or set by a write.
    applied: Option<u64>,
}

/// All sensors' pending samples.
#[derive(Debug)]
pub struct Buffer {
    shape: Shape,
    sensors: HashMap<String, SensorBuf>,
    ready: Vec<String>,
    pending: usize,
}

/// A sample larger than a whole bucket may hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sample of {bytes} bytes does not fit in a bucket (bucket.max_bytes = {max_bytes})")]
pub struct TooBig {
    pub bytes: u32,
    pub max_bytes: u32,
}

impl Buffer {
    pub fn new(shape: Shape) -> Self {
        Buffer {
            shape,
            sensors: HashMap::new(),
            ready: Vec::new(),
            pending: 0,
        }
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Samples waiting to be flushed.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Whether some sensor has enough samples to fill its open bucket.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Adds a sample to its sensor's queue (arrival order).
    pub fn push(&mut self, sensor: &str, sample: Sample) -> Result<(), TooBig> {
        let bytes = sample.bytes();
        if bytes > self.shape.max_bytes {
            return Err(TooBig {
                bytes,
                max_bytes: self.shape.max_bytes,
            });
        }
        let start = self.shape.window_start(sample.ts_ms);
        let buf = match self.sensors.get_mut(sensor) {
            Some(b) => b,
            None => self.sensors.entry(sensor.to_string()).or_default(),
        };
        buf.pending.push(sample);
        self.pending += 1;
        if !buf.ready {
            let filled = buf.memory.get(&start).map_or(0, |f| f.count) as usize;
            if filled + buf.pending.len() >= self.shape.max_samples as usize {
                buf.ready = true;
                self.ready.push(sensor.to_string());
            }
        }
        Ok(())
    }

    /// (sensor, window start) pairs among the samples `take(all)` would take
    /// whose open-bucket fill is not known.
    pub fn unknown_windows(&self, all: bool) -> Vec<(String, i64)> {
        let names: Vec<&String> = if all {
            self.sensors.keys().collect()
        } else {
            self.ready.iter().collect()
        };
        let mut out = Vec::new();
        for name in names {
            let Some(buf) = self.sensors.get(name) else {
                continue;
            };
            let mut starts: Vec<i64> = buf
                .pending
                .iter()
                .map(|s| self.shape.window_start(s.ts_ms))
                .filter(|w| !buf.memory.contains_key(w))
                .collect();
            starts.sort_unstable();
            starts.dedup();
            out.extend(starts.into_iter().map(|w| (name.clone(), w)));
        }
        out
    }

    /// Records fills learned from the database; an asked pair that is not in
    /// `found` has no open bucket (fill zero).
    pub fn learn(&mut self, asked: &[(String, i64)], found: HashMap<(String, i64), Fill>) {
        for key in asked {
            if let Some(buf) = self.sensors.get_mut(&key.0) {
                buf.memory
                    .insert(key.1, found.get(key).copied().unwrap_or_default());
            }
        }
    }

    /// Takes pending samples as statements: every sensor's when `all`, else
    /// only the ready sensors'. Statements of one sensor are contiguous and in
    /// arrival order.
    pub fn take(&mut self, all: bool) -> Vec<Statement> {
        let names: Vec<String> = if all {
            self.ready.clear();
            self.sensors
                .iter()
                .filter(|(_, b)| !b.pending.is_empty())
                .map(|(n, _)| n.clone())
                .collect()
        } else {
            std::mem::take(&mut self.ready)
        };
        let mut out = Vec::new();
        for name in names {
            let Some(buf) = self.sensors.get_mut(&name) else {
                continue;
            };
            buf.ready = false;
            self.pending -= buf.pending.len();
            let samples = std::mem::take(&mut buf.pending);
            bucket::plan(&name, samples, &mut buf.memory, &self.shape, &mut out);
        }
        out
    }

    /// Records what the database did with a statement: `Some(inserted)` when
    /// it was applied, `None` when it was rejected.
    pub fn settle(&mut self, st: &Statement, applied: Option<bool>) {
        let Some(buf) = self.sensors.get_mut(&st.sensor) else {
            return;
        };
        if applied.is_some() {
            buf.applied = Some(buf.applied.unwrap_or(0).max(st.last_lsn()));
        }
        match applied.and_then(|inserted| st.fill_after(inserted)) {
            Some(fill) => {
                buf.memory.insert(st.start_ms, fill);
            }
            None => {
                buf.memory.remove(&st.start_ms);
            }
        }
    }

    /// Sensors among those `take(all)` would take whose applied LSN is not
    /// known yet.
    pub fn unknown_applied(&self, all: bool) -> Vec<String> {
        let names: Vec<&String> = if all {
            self.sensors.keys().collect()
        } else {
            self.ready.iter().collect()
        };
        names
            .into_iter()
            .filter(|n| {
                self.sensors
                    .get(*n)
                    .is_some_and(|b| b.applied.is_none() && !b.pending.is_empty())
            })
            .cloned()
            .collect()
    }

    /// Records the applied LSNs learned from the database (a sensor asked
    /// about and not found has none) and drops the pending samples at or
    /// below them: MongoDB already has those. Returns how many were dropped.
    pub fn learn_applied(&mut self, asked: &[String], found: &HashMap<String, u64>) -> usize {
        let mut dropped = 0;
        for name in asked {
            let Some(buf) = self.sensors.get_mut(name) else {
                continue;
            };
            let applied = found.get(name).copied().unwrap_or(0);
            buf.applied = Some(applied);
            let before = buf.pending.len();
            buf.pending.retain(|s| s.lsn > applied);
            dropped += before - buf.pending.len();
        }
        self.pending -= dropped;
        dropped
    }

    /// Takes every sensor's pending samples, in arrival order (time series
    /// mode: no statements, one document per sample).
    pub fn take_samples(&mut self) -> Vec<(String, Vec<Sample>)> {
        self.ready.clear();
        self.pending = 0;
        self.sensors
            .iter_mut()
            .filter(|(_, b)| !b.pending.is_empty())
            .map(|(n, b)| {
                b.ready = false;
                (n.clone(), std::mem::take(&mut b.pending))
            })
            .collect()
    }

    /// The lowest LSN of a pending sample, if any.
    pub fn min_pending_lsn(&self) -> Option<u64> {
        self.sensors
            .values()
            .filter_map(|b| b.pending.first().map(|s| s.lsn))
            .min()
    }

    /// Forgets open-bucket memory of windows that started before `start_ms`
    /// and drops sensors with nothing pending and nothing remembered, so
    /// memory follows the sensors that are active.
    pub fn forget_before(&mut self, start_ms: i64) {
        self.sensors.retain(|_, b| {
            b.memory.retain(|s, _| *s >= start_ms);
            // A dropped sensor's applied LSN is learned again if it returns.
            !b.pending.is_empty() || !b.memory.is_empty()
        });
    }

    /// Number of sensors held in memory.
    pub fn sensors(&self) -> usize {
        self.sensors.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{FieldValue, Reading};

    const SHAPE: Shape = Shape {
        window_ms: 60_000,
        max_samples: 3,
        max_bytes: 1000,
    };

    fn sample(ts_ms: i64) -> Sample {
        Sample::encode(
            &Reading {
                sensor: "s".into(),
                ts_ms,
                fields: vec![("v".into(), FieldValue::Num(1.0))],
            },
            0,
        )
    }

    #[test]
    fn sensor_becomes_ready_when_it_can_fill_its_bucket() {
        let mut b = Buffer::new(SHAPE);
        b.push("a", sample(0)).unwrap();
        b.push("b", sample(0)).unwrap();
        b.push("a", sample(1)).unwrap();
        assert!(!b.has_ready());
        b.push("a", sample(2)).unwrap();
        assert!(b.has_ready());
        let sts = b.take(false);
        assert_eq!(sts.len(), 1);
        assert_eq!(sts[0].sensor, "a");
        assert_eq!(b.pending(), 1);
        let sts = b.take(true);
        assert_eq!(sts[0].sensor, "b");
        assert_eq!(b.pending(), 0);
    }

    #[test]
    fn settle_keeps_the_fill_the_database_reported() {
        let mut b = Buffer::new(SHAPE);
        b.push("a", sample(0)).unwrap();
        let st = b.take(true).remove(0);
        b.settle(&st, Some(true));
        b.push("a", sample(1)).unwrap();
        b.push("a", sample(2)).unwrap();
        assert!(b.has_ready(), "1 stored + 2 pending fills a bucket of 3");
        let st = b.take(false).remove(0);
        assert_eq!(
            st.base,
            Some(Fill {
                count: 1,
                bytes: st.bytes / 2
            })
        );
        b.settle(&st, None);
        b.forget_before(60_000);
        assert_eq!(b.sensors(), 0);
    }

    #[test]
    fn learning_applied_lsns_drops_what_mongodb_has() {
        let mut b = Buffer::new(SHAPE);
        for (i, sensor) in ["a", "a", "b", "a"].iter().enumerate() {
            let mut s = sample(i as i64);
            s.lsn = 10 + i as u64;
            b.push(sensor, s).unwrap();
        }
        let mut unknown = b.unknown_applied(true);
        unknown.sort();
        assert_eq!(unknown, vec!["a", "b"]);
        assert_eq!(b.min_pending_lsn(), Some(10));
        let dropped = b.learn_applied(&unknown, &HashMap::from([("a".to_string(), 11)]));
        assert_eq!(dropped, 2);
        assert_eq!(b.pending(), 2);
        assert_eq!(b.min_pending_lsn(), Some(12));
        assert!(b.unknown_applied(true).is_empty());
    }

    #[test]
    fn take_samples_takes_everything_in_arrival_order() {
        let mut b = Buffer::new(SHAPE);
        for (i, sensor) in ["a", "b", "a"].iter().enumerate() {
            let mut s = sample(100 - i as i64);
            s.lsn = 10 + i as u64;
            b.push(sensor, s).unwrap();
        }
        let mut taken = b.take_samples();
        taken.sort_by(|x, y| x.0.cmp(&y.0));
        let lsns: Vec<(String, Vec<u64>)> = taken
            .into_iter()
            .map(|(n, v)| (n, v.iter().map(|s| s.lsn).collect()))
            .collect();
        assert_eq!(
            lsns,
            vec![("a".into(), vec![10, 12]), ("b".into(), vec![11])]
        );
        assert_eq!(b.pending(), 0);
        assert!(!b.has_ready());
    }

    #[test]
    fn oversized_sample_is_refused() {
        let mut b = Buffer::new(Shape {
            max_bytes: 10,
            ..SHAPE
        });
        assert!(b.push("a", sample(0)).is_err());
        assert_eq!(b.pending(), 0);
    }
}
