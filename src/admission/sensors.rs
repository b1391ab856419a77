//! [`SensorLimit`]: bounds the distinct sensors palletd tracks
//! (`limits.max_sensors`), so a flood of made-up sensor ids cannot grow
//! memory. Sans-IO.

use std::collections::HashMap;

/// Bounds the distinct sensors palletd tracks. A sensor not seen for
/// `idle_ms` (a window plus the closer's grace: its bucket is done) may be
/// forgotten to make room; a new sensor when all places are taken by active
/// ones is refused (its readings go to the dead letter), so a flood of
/// made-up sensor ids cannot grow memory.
pub struct SensorLimit {
    pub(super) max: usize,
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
    pub(crate) fn admit(&mut self, sensor: &str, now_ms: i64) -> bool {
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

impl SensorLimit {
    /// The `n` sensors heard from least recently: (sensor, last reading
    /// ms), the quietest first.
    pub(crate) fn quietest(&self, n: usize) -> Vec<(String, i64)> {
        let mut heap: std::collections::BinaryHeap<(i64, &str)> = Default::default();
        for (sensor, &t) in &self.last_seen {
            heap.push((t, sensor));
            if heap.len() > n {
                heap.pop();
            }
        }
        let mut out: Vec<(String, i64)> =
            heap.into_iter().map(|(t, s)| (s.to_string(), t)).collect();
        out.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        out
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

    #[test]
    fn the_quietest_sensors_come_first() {
        let mut l = SensorLimit::new(10, 1_000_000);
        for (i, s) in ["a", "b", "c", "d"].iter().enumerate() {
            l.admit(s, 100 - i as i64 * 10);
        }
        let quiet = l.quietest(2);
        assert_eq!(quiet, vec![("d".to_string(), 70), ("c".to_string(), 80)]);
        assert_eq!(l.quietest(10).len(), 4);
    }
}
