//! Thinning: which readings of a field are stored as samples, under a
//! rule with a stated error bound. Sans-IO: one [`Field`] per sensor and
//! field, fed the field's points in time order.
//!
//! Two rules, as historians define them:
//!
//! - **Deadband** (OSIsoft PI's exception deviation, Ignition's deadband):
//!   a point is stored when it differs from the last stored one by more
//!   than the band, or `max_interval` after it (a heartbeat). A reader who
//!   holds each stored value until the next is never further off than the
//!   band. `min_interval` drops points that come sooner than that after a
//!   stored one, whatever their value: it breaks the bound on purpose (a
//!   flapping sensor).
//! - **Swinging door** (PI's compression deviation and maximum time): a
//!   point is dropped while a straight line from the last stored point to
//!   it passes within the deviation of every point dropped since; when the
//!   next point does not allow that, the last one that did is stored (the
//!   last point of a run) and starts the next run. A reader interpolating
//!   linearly between stored points is never further off than the
//!   deviation. The classic algorithm tests only that *some* line from the
//!   stored point fits the door; the line a reader draws, to the point
//!   actually stored, may then miss an earlier point by more than the
//!   deviation (stored 0 at t=0, dropped 1 at t=1, stored -0.5 at t=10,
//!   deviation 1: the reader sees -0.05 at t=1). Here the slope to the
//!   candidate itself must lie in the door of the points it would drop, so
//!   the bound is the reader's.
//!
//! A point that is not a finite number (a string, a flag) or that is not
//! newer than the field's last point is stored as it is and leaves the
//! rule's state alone: the bound is stated for a field's numbers in time
//! order. Rollups and bucket summaries do not come from here: they are
//! computed from every reading, stored or not.

/// One reading of a field: its time (ms) and value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub t: i64,
    pub v: f64,
}

pub(crate) const DEADBAND: &str = "deadband";
pub(crate) const SWINGING_DOOR: &str = "swinging_door";

/// A field's thinning rule, with its bound in the field's own unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    Deadband {
        band: f64,
        max_interval_ms: i64,
        min_interval_ms: i64,
    },
    SwingingDoor {
        deviation: f64,
        max_interval_ms: i64,
    },
}

impl Rule {
    /// The rule's name as the bucket and the metrics give it.
    pub fn kind(&self) -> &'static str {
        match self {
            Rule::Deadband { .. } => DEADBAND,
            Rule::SwingingDoor { .. } => SWINGING_DOOR,
        }
    }

    /// The bound: the band or the deviation.
    pub(crate) fn bound(&self) -> f64 {
        match *self {
            Rule::Deadband { band, .. } => band,
            Rule::SwingingDoor { deviation, .. } => deviation,
        }
    }
}

/// What became of the points offered so far, as [`Field::offer`] says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verdict {
    /// Earlier points that are now to be stored: the swinging door's last
    /// point of a run, or points a late arrival made necessary.
    pub earlier: Vec<Point>,
    /// Whether the point offered is stored now. When not, it may still be
    /// stored later as a verdict's `earlier` or by [`Field::finish`].
    pub keep: bool,
    /// The rule did not apply (not a finite number, or older than what
    /// the field remembers of its run): stored as it is, the state
    /// unchanged.
    pub passed: bool,
}

/// The newest points of a run a field remembers one by one, so that a
/// reading that arrives out of order among them (messages of one sensor
/// over several connections) is thinned as if it had come in order.
pub(crate) const TAIL: usize = 8;

/// One field's thinning state: the last stored point, the newest points
/// after it (at most [`TAIL`]; for a swinging door the newest of them is
/// the candidate end of the run, not stored yet) and, for a swinging door,
/// the slopes from the stored point that pass within the deviation of
/// every point of the run before those (`[lo, hi]`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Field {
    rule: Rule,
    stored: Option<Point>,
    tail: std::collections::VecDeque<Point>,
    /// Points of the run left the tail (into `lo`, `hi`).
    evicted: bool,
    lo: f64,
    hi: f64,
    /// The run before, as it was when it ended at `stored` (which is not
    /// in its tail): a reading that arrives after the run's end but
    /// belongs before it is thinned in that run.
    prev: Option<Box<Field>>,
}

impl Field {
    pub fn new(rule: Rule) -> Field {
        Field {
            rule,
            stored: None,
            tail: Default::default(),
            evicted: false,
            lo: f64::NEG_INFINITY,
            hi: f64::INFINITY,
            prev: None,
        }
    }

    pub(crate) fn rule(&self) -> &Rule {
        &self.rule
    }

    /// Heap bytes it holds (the remembered points, the run before).
    pub(crate) fn heap_bytes(&self) -> usize {
        let own = self.tail.capacity() * std::mem::size_of::<Point>();
        own + self
            .prev
            .as_ref()
            .map_or(0, |p| std::mem::size_of::<Field>() + p.heap_bytes())
    }

    /// The swinging door's point not stored yet: the candidate end of its
    /// run.
    pub(crate) fn held(&self) -> Option<Point> {
        match self.rule {
            Rule::SwingingDoor { .. } => self.tail.back().copied(),
            Rule::Deadband { .. } => None,
        }
    }

    /// Offers the field's next point; `p.v` must be finite (else use
    /// [`Field::offer_other`]). A point older than the newest is thinned
    /// in its place when it falls among the points the field remembers.
    pub(crate) fn offer(&mut self, p: Point) -> Verdict {
        let Some(stored) = self.stored else {
            return self.start(p);
        };
        let newest = self.tail.back().map_or(stored.t, |q| q.t);
        if !p.v.is_finite() || p.t == stored.t || self.tail.iter().any(|q| q.t == p.t) {
            return self.offer_other();
        }
        if p.t < stored.t {
            return self.offer_to_prev(p, stored);
        }
        if p.t > newest {
            let mut earlier = Vec::new();
            let keep = self.push(p, &mut earlier);
            return Verdict {
                earlier,
                keep,
                passed: false,
            };
        }
        if self.evicted && self.tail.front().is_some_and(|q| p.t < q.t) {
            // Before the points remembered: where it falls, the run is
            // summed up, not known point by point.
            return self.offer_other();
        }
        // Among the remembered points: the run from the stored point is
        // thinned again with it in its place. Points stored by that are
        // earlier points to store now (each was left out so far).
        self.rethin(p, None)
    }

    /// Thins the remembered run again with the late point `p` in its
    /// place (and `end` after the run, a point stored already): what the
    /// points stored by that mean for `p`, and the others, each left out
    /// so far, to store now.
    fn rethin(&mut self, p: Point, end: Option<Point>) -> Verdict {
        let mut points: Vec<Point> = self.tail.drain(..).collect();
        let at = points.partition_point(|q| q.t < p.t);
        points.insert(at, p);
        points.extend(end);
        let mut verdict = Verdict::default();
        for q in points {
            let mut ends = Vec::new();
            if self.push(q, &mut ends) {
                ends.push(q);
            }
            for e in ends {
                if e.t == p.t {
                    verdict.keep = true;
                } else if end.is_none_or(|end| e.t != end.t) {
                    verdict.earlier.push(e);
                }
            }
        }
        verdict
    }

    /// Offers a point older than the run's stored point to the run before,
    /// which ended there: thinned again with it, that run ends at
    /// `stored` as before (which stays stored), and may store more.
    fn offer_to_prev(&mut self, p: Point, stored: Point) -> Verdict {
        let Some(mut prev) = self.prev.take() else {
            return self.offer_other();
        };
        let within = prev.stored.is_some_and(|a| a.t < p.t)
            && !(prev.evicted && prev.tail.front().is_some_and(|q| p.t < q.t))
            && !prev.tail.iter().any(|q| q.t == p.t);
        if !within {
            self.prev = Some(prev);
            return self.offer_other();
        }
        let verdict = prev.rethin(p, Some(stored));
        // It ends at `stored`, stored already: the run as it is now, held
        // there, or ended there as the re-thinned run stored it.
        if prev.tail.back().is_some_and(|q| q.t == stored.t) {
            prev.tail.pop_back();
            prev.prev = None;
            self.prev = Some(prev);
        } else if prev.stored == Some(stored) {
            self.prev = prev.prev.take();
        }
        verdict
    }

    /// Adds a point newer than every one of the run; returns whether it is
    /// stored, and puts the earlier points to store in `earlier`.
    fn push(&mut self, p: Point, earlier: &mut Vec<Point>) -> bool {
        let Some(stored) = self.stored else {
            self.start(p);
            return true;
        };
        match self.rule {
            Rule::Deadband {
                band,
                max_interval_ms,
                min_interval_ms,
            } => {
                let since = p.t - stored.t;
                let keep = since >= min_interval_ms
                    && ((p.v - stored.v).abs() > band || since >= max_interval_ms);
                if keep {
                    self.start(p);
                } else {
                    self.remember(p);
                }
                keep
            }
            Rule::SwingingDoor {
                deviation,
                max_interval_ms,
            } => {
                let Some(h) = self.tail.back().copied() else {
                    // Only the stored point so far: `p` is the candidate.
                    if p.t - stored.t >= max_interval_ms {
                        self.start(p);
                        return true;
                    }
                    self.remember(p);
                    return false;
                };
                // The held point would be dropped: the door is that of
                // every point of the run but `p`.
                let (mut lo, mut hi) = (self.lo, self.hi);
                for q in &self.tail {
                    let dt = (q.t - stored.t) as f64;
                    lo = lo.max((q.v - deviation - stored.v) / dt);
                    hi = hi.min((q.v + deviation - stored.v) / dt);
                }
                let slope = (p.v - stored.v) / (p.t - stored.t) as f64;
                if lo <= slope && slope <= hi && p.t - stored.t < max_interval_ms {
                    self.remember(p);
                    return false;
                }
                // The run ends at the held point, which starts the next.
                earlier.push(h);
                self.start(h);
                self.push(p, earlier)
            }
        }
    }

    /// Adds a point of the run that is not stored (yet); the oldest one
    /// beyond [`TAIL`] goes into the door.
    fn remember(&mut self, p: Point) {
        self.tail.push_back(p);
        if self.tail.len() > TAIL {
            let q = self.tail.pop_front().expect("more than TAIL");
            self.evicted = true;
            if let (Rule::SwingingDoor { deviation, .. }, Some(a)) = (self.rule, self.stored) {
                let dt = (q.t - a.t) as f64;
                self.lo = self.lo.max((q.v - deviation - a.v) / dt);
                self.hi = self.hi.min((q.v + deviation - a.v) / dt);
            }
        }
    }

    /// Offers a point that is not a finite number, or not newer than the
    /// field's last: it is stored, and the state stays.
    pub(crate) fn offer_other(&mut self) -> Verdict {
        Verdict {
            earlier: Vec::new(),
            keep: true,
            passed: true,
        }
    }

    /// Ends the run: the point still held, if any, is to be stored, and
    /// the next point starts afresh.
    pub(crate) fn finish(&mut self) -> Option<Point> {
        let held = self.held();
        *self = Field::new(self.rule);
        held
    }

    /// `p` is stored and starts a run.
    fn start(&mut self, p: Point) -> Verdict {
        let mut ended = std::mem::replace(self, Field::new(self.rule));
        // The run that ends, without the point that ends it.
        if ended.stored.is_some() {
            if ended.tail.back().is_some_and(|q| q.t == p.t) {
                ended.tail.pop_back();
            }
            ended.prev = None;
            self.prev = Some(Box::new(ended));
        }
        self.stored = Some(p);
        Verdict {
            earlier: Vec::new(),
            keep: true,
            passed: false,
        }
    }
}

/// Thins a whole series (in time order) under `rule`: which points are
/// stored, by index, the last one included. What the rule does to a
/// series, for the table in docs/storage.md and the tests.
pub fn thin_series(rule: Rule, points: &[Point]) -> Vec<bool> {
    let mut keep = vec![false; points.len()];
    let mut field = Field::new(rule);
    // Where each time is (a later point is always newer).
    let mut index = std::collections::HashMap::new();
    for (i, p) in points.iter().enumerate() {
        index.insert(p.t, i);
        let v = field.offer(*p);
        for e in v.earlier {
            keep[index[&e.t]] = true;
        }
        keep[i] |= v.keep;
    }
    if let Some(e) = field.finish() {
        keep[index[&e.t]] = true;
    }
    keep
}

/// The largest error of a reader of the stored points against the
/// series: interpolating linearly between them, and holding each until
/// the next.
pub fn errors(points: &[Point], keep: &[bool]) -> (f64, f64) {
    let mut linear: f64 = 0.0;
    let mut hold: f64 = 0.0;
    let mut prev: Option<Point> = None;
    let mut dropped: Vec<Point> = Vec::new();
    for (p, k) in points.iter().zip(keep) {
        if !k {
            dropped.push(*p);
            continue;
        }
        if let Some(a) = prev {
            for d in &dropped {
                let at = a.v + (p.v - a.v) * (d.t - a.t) as f64 / (p.t - a.t) as f64;
                linear = linear.max((d.v - at).abs());
                hold = hold.max((d.v - a.v).abs());
            }
        }
        dropped.clear();
        prev = Some(*p);
    }
    (linear, hold)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Points in time order: steps of 1 ms to 10 s, values a walk.
    fn series() -> impl Strategy<Value = Vec<Point>> {
        prop::collection::vec((1i64..10_000, -50.0f64..50.0, prop::bool::ANY), 1..300).prop_map(
            |steps| {
                let mut t = 1_700_000_000_000;
                let mut v = 0.0;
                steps
                    .into_iter()
                    .map(|(dt, dv, jump)| {
                        t += dt;
                        v = if jump { dv } else { v + dv / 50.0 };
                        Point { t, v }
                    })
                    .collect()
            },
        )
    }

    /// Floating-point slack on a bound.
    fn within(err: f64, bound: f64) -> bool {
        err <= bound * (1.0 + 1e-9) + 1e-9
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Every point the swinging door drops lies within the deviation
        /// of the straight line between the stored points around it; the
        /// first and last points are stored.
        #[test]
        fn every_point_the_door_drops_is_within_the_deviation_of_the_line(
            points in series(),
            deviation in 0.0f64..5.0,
            max_s in 1i64..100,
        ) {
            let rule = Rule::SwingingDoor { deviation, max_interval_ms: max_s * 1000 };
            let keep = thin_series(rule, &points);
            prop_assert!(keep[0] && keep[points.len() - 1]);
            let (linear, _) = errors(&points, &keep);
            prop_assert!(within(linear, deviation), "{linear} > {deviation}");
            // No two stored points further apart than max_interval with a
            // point between them.
            let stored: Vec<usize> = (0..points.len()).filter(|i| keep[*i]).collect();
            for w in stored.windows(2) {
                if w[1] > w[0] + 1 {
                    prop_assert!(points[w[1]].t - points[w[0]].t < max_s * 1000);
                }
            }
        }

        /// Every point the deadband drops is within the band of the last
        /// stored one, and less than max_interval after it.
        #[test]
        fn every_point_the_deadband_drops_is_within_the_band_of_the_last_stored(
            points in series(),
            band in 0.0f64..5.0,
            max_s in 1i64..100,
        ) {
            let max_interval_ms = max_s * 1000;
            let rule = Rule::Deadband { band, max_interval_ms, min_interval_ms: 0 };
            let keep = thin_series(rule, &points);
            prop_assert!(keep[0]);
            let (_, hold) = errors(&points, &keep);
            prop_assert!(within(hold, band), "{hold} > {band}");
            let mut last = points[0];
            for (p, k) in points.iter().zip(&keep) {
                if *k {
                    last = *p;
                } else {
                    prop_assert!(p.t - last.t < max_interval_ms);
                }
            }
        }
    }

    /// Feeds `points` in the order `order` gives; returns what is stored
    /// (by index of `points`) and how many points no rule applied to.
    fn thin_in_order(rule: Rule, points: &[Point], order: &[usize]) -> (Vec<bool>, usize) {
        let at: std::collections::HashMap<i64, usize> =
            points.iter().enumerate().map(|(i, p)| (p.t, i)).collect();
        let mut keep = vec![false; points.len()];
        let mut passed = 0;
        let mut field = Field::new(rule);
        for &i in order {
            let v = field.offer(points[i]);
            passed += v.passed as usize;
            for e in v.earlier {
                assert!(!keep[at[&e.t]], "{:?} stored twice", e);
                keep[at[&e.t]] = true;
            }
            if v.keep {
                assert!(!keep[i], "{:?} stored twice", points[i]);
                keep[i] = true;
            }
        }
        if let Some(e) = field.finish() {
            keep[at[&e.t]] = true;
        }
        (keep, passed)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Readings of one sensor that come a few places out of order
        /// (over several connections) are thinned in their place: no point
        /// is stored twice, and the bounds hold over the series in time
        /// order.
        #[test]
        fn points_a_few_places_out_of_order_are_thinned_in_their_place(
            points in series(),
            jitter in prop::collection::vec(0usize..4, 300),
            bound in 0.0f64..5.0,
            door in prop::bool::ANY,
        ) {
            let mut order: Vec<usize> = (0..points.len()).collect();
            order.sort_by_key(|&i| i + jitter[i]);
            let rule = match door {
                true => Rule::SwingingDoor { deviation: bound, max_interval_ms: 30_000 },
                false => Rule::Deadband { band: bound, max_interval_ms: 30_000, min_interval_ms: 0 },
            };
            let (keep, _) = thin_in_order(rule, &points, &order);
            let (linear, hold) = errors(&points, &keep);
            let err = if door { linear } else { hold };
            prop_assert!(within(err, bound), "{err} > {bound}");
        }
    }

    /// The classic door's counterexample: the reader's line to the stored
    /// point must pass within the deviation of the dropped one.
    #[test]
    fn the_reader_line_not_only_some_line_fits_the_door() {
        let points = [
            Point { t: 0, v: 0.0 },
            Point { t: 1, v: 1.0 },
            Point { t: 10, v: -0.5 },
            Point { t: 11, v: -0.55 },
        ];
        let rule = Rule::SwingingDoor {
            deviation: 1.0,
            max_interval_ms: 1_000,
        };
        let keep = thin_series(rule, &points);
        assert_eq!(keep, [true, true, false, true]);
    }

    /// A constant field is stored once per max_interval (and its last
    /// point); a string in between is stored and leaves the run alone.
    #[test]
    fn a_constant_field_is_stored_at_each_max_interval() {
        let points: Vec<Point> = (0..100)
            .map(|i| Point {
                t: i * 1000,
                v: 5.0,
            })
            .collect();
        let rule = Rule::SwingingDoor {
            deviation: 0.1,
            max_interval_ms: 30_000,
        };
        let keep = thin_series(rule, &points);
        let stored: Vec<i64> = (0..100).filter(|i| keep[*i as usize]).collect();
        assert_eq!(stored, [0, 29, 58, 87, 99]);
        let mut f = Field::new(rule);
        f.offer(points[0]);
        f.offer(points[1]);
        assert!(f.offer_other().keep);
        assert_eq!(f.offer(points[2]), Verdict::default());
        assert_eq!(
            f.offer(points[1]),
            f.clone().offer_other(),
            "older: stored as it is"
        );
        let band = Rule::Deadband {
            band: 0.1,
            max_interval_ms: 30_000,
            min_interval_ms: 0,
        };
        let keep = thin_series(band, &points);
        let stored: Vec<i64> = (0..100).filter(|i| keep[*i as usize]).collect();
        assert_eq!(stored, [0, 30, 60, 90]);
    }
}
