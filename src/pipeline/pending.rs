//! What memory holds per sensor: its pending samples in LSN order, what
//! palletd knows of its open buckets, and what is known about whether its
//! samples may already be in MongoDB. Sans-IO.
//!
//! A sample is *uncertain* when it may already be in MongoDB: it was
//! spooled by an earlier run (its LSN is below the first LSN of this run),
//! or it was sent in a write whose result is unknown. Uncertain samples are
//! always the first ones of their sensor's queue (replayed samples arrive
//! before live ones, and unknown ones go back to the front), so a count
//! says which. A store whose writes apply a prefix of each sensor's samples
//! reports a *watermark* when it resolves them; with it, later replayed
//! samples of that sensor are settled on arrival.

use std::collections::HashMap;

use crate::bucket::{Sample, Shape};
use crate::flush::{Fills, Run};

#[derive(Debug)]
struct SensorState {
    samples: Vec<Sample>,
    /// The first `uncertain` samples may already be in MongoDB.
    uncertain: usize,
    /// Samples of this sensor with a lower LSN may be in MongoDB (unless
    /// the watermark settles them).
    uncertain_below: u64,
    /// Every LSN of this sensor at or below it is in MongoDB, none above
    /// (from a store with the prefix rule).
    watermark: Option<u64>,
    fills: Fills,
    ready: bool,
}

/// What became of a sample offered to memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Held,
    /// Replayed, and MongoDB has it already: dropped.
    AlreadyApplied,
}

/// Every sensor's pending samples.
#[derive(Debug)]
pub struct Pending {
    shape: Shape,
    /// LSNs below this were spooled by an earlier run.
    fresh_from: u64,
    sensors: HashMap<String, SensorState>,
    ready: Vec<String>,
    count: usize,
}

impl Pending {
    pub fn new(shape: Shape, fresh_from: u64) -> Pending {
        Pending {
            shape,
            fresh_from,
            sensors: HashMap::new(),
            ready: Vec::new(),
            count: 0,
        }
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Samples held.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Number of sensors held in memory.
    pub fn sensors(&self) -> usize {
        self.sensors.len()
    }

    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    fn state(&mut self, sensor: &str) -> &mut SensorState {
        if !self.sensors.contains_key(sensor) {
            self.sensors.insert(
                sensor.to_string(),
                SensorState {
                    samples: Vec::new(),
                    uncertain: 0,
                    uncertain_below: self.fresh_from,
                    watermark: None,
                    fills: Fills::new(),
                    ready: false,
                },
            );
        }
        self.sensors.get_mut(sensor).expect("inserted above")
    }

    /// Adds a sample to its sensor's queue (LSN order).
    pub fn push(&mut self, sensor: &str, sample: Sample) -> Pushed {
        let s = self.state(sensor);
        let uncertain = sample.lsn < s.uncertain_below
            && match s.watermark {
                Some(w) if sample.lsn <= w => return Pushed::AlreadyApplied,
                Some(_) => false,
                None => true,
            };
        s.samples.push(sample);
        if uncertain {
            // Uncertain samples stay a prefix of the queue.
            s.uncertain = s.samples.len();
        }
        self.count += 1;
        self.update_ready(sensor);
        Pushed::Held
    }

    /// A sensor is ready once its samples can fill its open bucket.
    fn update_ready(&mut self, sensor: &str) {
        let max = self.shape.max_samples as usize;
        let Some(s) = self.sensors.get_mut(sensor) else {
            return;
        };
        let Some(last) = s.samples.last() else {
            return;
        };
        if s.ready {
            return;
        }
        let start = self.shape.window_start(last.ts_ms);
        let filled = s.fills.get(&start).map_or(0, |f| f.count) as usize;
        if filled + s.samples.len() >= max {
            s.ready = true;
            self.ready.push(sensor.to_string());
        }
    }

    /// The sensors a flush of `all` (else: of the ready ones) takes.
    pub fn select(&self, all: bool) -> Vec<String> {
        if all {
            self.sensors
                .iter()
                .filter(|(_, s)| !s.samples.is_empty())
                .map(|(n, _)| n.clone())
                .collect()
        } else {
            self.ready
                .iter()
                .filter(|n| self.sensors.get(*n).is_some_and(|s| !s.samples.is_empty()))
                .cloned()
                .collect()
        }
    }

    /// (lsn, ts) of the uncertain samples of `sensor`.
    pub fn uncertain(&self, sensor: &str) -> Vec<(u64, i64)> {
        self.sensors.get(sensor).map_or_else(Vec::new, |s| {
            s.samples[..s.uncertain]
                .iter()
                .map(|x| (x.lsn, x.ts_ms))
                .collect()
        })
    }

    /// Settles the uncertain samples of `sensor`: those in `applied` are in
    /// MongoDB and leave memory; the others are certainly not. Returns how
    /// many left.
    pub fn resolve(
        &mut self,
        sensor: &str,
        applied: &std::collections::HashSet<u64>,
        watermark: Option<u64>,
    ) -> usize {
        let Some(s) = self.sensors.get_mut(sensor) else {
            return 0;
        };
        let n = s.uncertain;
        let mut kept = Vec::with_capacity(s.samples.len());
        let mut dropped = 0;
        for (i, x) in s.samples.drain(..).enumerate() {
            if i < n && applied.contains(&x.lsn) {
                dropped += 1;
            } else {
                kept.push(x);
            }
        }
        s.samples = kept;
        s.uncertain = 0;
        if watermark.is_some() {
            s.watermark = watermark;
        }
        self.count -= dropped;
        dropped
    }

    /// Takes the samples and open-bucket memory of `sensors` for a flush.
    /// They must hold no uncertain samples.
    pub fn take(&mut self, sensors: &[String]) -> Vec<Run> {
        let mut runs = Vec::with_capacity(sensors.len());
        for name in sensors {
            let Some(s) = self.sensors.get_mut(name) else {
                continue;
            };
            debug_assert_eq!(s.uncertain, 0, "resolved before the write");
            self.count -= s.samples.len();
            s.ready = false;
            runs.push(Run {
                sensor: name.clone(),
                samples: std::mem::take(&mut s.samples),
                fills: std::mem::take(&mut s.fills),
                outcomes: Vec::new(),
            });
        }
        self.ready
            .retain(|n| self.sensors.get(n).is_some_and(|s| s.ready));
        runs
    }

    /// Returns a run after its write: `back` are its samples that are not
    /// in MongoDB for sure (unknown or not sent), in LSN order, the first
    /// `uncertain` of them of unknown fate; `applied_to` is the highest LSN
    /// applied. They go before what arrived meanwhile.
    pub fn put_back(
        &mut self,
        run: Run,
        back: Vec<Sample>,
        uncertain: usize,
        applied_to: Option<u64>,
    ) {
        let s = self.state(&run.sensor);
        s.fills = run.fills;
        if let (Some(w), Some(a)) = (s.watermark, applied_to) {
            s.watermark = Some(w.max(a));
        }
        if uncertain > 0 {
            // The prefix rule's mark is no longer known.
            s.watermark = None;
            let last = back[..uncertain].iter().map(|x| x.lsn).max().unwrap_or(0);
            s.uncertain_below = s.uncertain_below.max(last + 1);
        }
        let arrived = std::mem::take(&mut s.samples);
        let newer_uncertain = s.uncertain;
        s.uncertain = if newer_uncertain > 0 {
            back.len() + newer_uncertain
        } else {
            uncertain
        };
        let returned = back.len();
        s.samples = back;
        s.samples.extend(arrived);
        self.count += returned;
        self.update_ready(&run.sensor);
    }

    /// The lowest LSN held, if any.
    pub fn min_lsn(&self) -> Option<u64> {
        self.sensors
            .values()
            .filter_map(|s| s.samples.first().map(|x| x.lsn))
            .min()
    }

    /// Forgets open-bucket memory of windows that started before `start_ms`
    /// and drops sensors with nothing pending and nothing remembered, so
    /// memory follows the sensors that are active.
    pub fn forget_before(&mut self, start_ms: i64) {
        self.sensors.retain(|_, s| {
            s.fills.retain(|w, _| *w >= start_ms);
            // A dropped sensor's watermark is learned again if it returns.
            !s.samples.is_empty() || !s.fills.is_empty()
        });
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

    fn sample(ts_ms: i64, lsn: u64) -> Sample {
        Sample::encode(
            &Reading {
                sensor: "s".into(),
                ts_ms,
                fields: vec![("v".into(), FieldValue::Num(1.0))],
            },
            lsn,
        )
    }

    #[test]
    fn sensor_becomes_ready_when_it_can_fill_its_bucket() {
        let mut p = Pending::new(SHAPE, 0);
        p.push("a", sample(0, 1));
        p.push("b", sample(0, 2));
        p.push("a", sample(1, 3));
        assert!(!p.has_ready());
        p.push("a", sample(2, 4));
        assert!(p.has_ready());
        assert_eq!(p.select(false), vec!["a".to_string()]);
        let runs = p.take(&p.select(false));
        assert_eq!(runs[0].samples.len(), 3);
        assert_eq!(p.count(), 1);
        assert!(!p.has_ready());
    }

    #[test]
    fn replayed_samples_are_uncertain_until_resolved_and_the_watermark_settles_later_ones() {
        let mut p = Pending::new(SHAPE, 100);
        p.push("a", sample(0, 10));
        p.push("a", sample(0, 11));
        assert_eq!(p.uncertain("a"), vec![(10, 0), (11, 0)]);
        let dropped = p.resolve("a", &[10].into_iter().collect(), Some(10));
        assert_eq!(dropped, 1);
        assert!(p.uncertain("a").is_empty());
        assert_eq!(p.push("a", sample(0, 9)), Pushed::AlreadyApplied);
        assert_eq!(p.push("a", sample(0, 12)), Pushed::Held);
        assert!(p.uncertain("a").is_empty(), "above the watermark: certain");
        assert_eq!(p.push("a", sample(0, 150)), Pushed::Held, "this run's");
        assert_eq!(p.count(), 3);
    }

    #[test]
    fn unknown_samples_go_back_to_the_front_as_uncertain() {
        let mut p = Pending::new(SHAPE, 0);
        p.push("a", sample(0, 1));
        p.push("a", sample(0, 2));
        let mut run = p.take(&["a".to_string()]).remove(0);
        p.push("a", sample(0, 3));
        let back = std::mem::take(&mut run.samples);
        p.put_back(run, back, 2, None);
        assert_eq!(p.uncertain("a"), vec![(1, 0), (2, 0)]);
        assert_eq!(p.min_lsn(), Some(1));
        assert_eq!(p.count(), 3);
        p.forget_before(i64::MAX);
        assert_eq!(p.sensors(), 1, "a sensor with samples stays");
    }
}
