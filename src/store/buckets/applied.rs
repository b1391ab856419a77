//! What a replay already applied: the LSN pairs of the buckets of a
//! flush's uncertain samples, looked up in bounded queries.

use super::*;
use std::collections::HashMap;

use bson::{doc, Document};
use mongodb::options::ReadConcern;
use mongodb::Collection;
use tokio_util::sync::CancellationToken;

use super::mongo::{self, Mongo};
use crate::bucket::{self};
use crate::handoff::{Resolution, Resolve};
use crate::retry::Aborted;

/// What the buckets of one sensor and window say was applied to them.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// Per spool id, its LSN ranges, `[first, last, ...]`.
    ranges: Vec<(u32, Vec<u64>)>,
    /// The highest `lsn` of its buckets: set only by palletd 0.1, whose
    /// writes applied a prefix of each sensor's samples.
    legacy: Option<u64>,
}

impl Applied {
    /// Whether the record `lsn`, written under spool id `tag`, was applied.
    fn holds(&self, tag: u32, lsn: u64) -> bool {
        let ranges = self.ranges.iter().find(|r| r.0 == tag);
        ranges.is_some_and(|r| bucket::ranges_hold(&r.1, lsn))
            || self.legacy.is_some_and(|l| lsn <= l)
    }
}

/// The applied ranges (of the spool ids `tags`) of the buckets of these
/// lookups' windows and sensors: one query on `{sensorId, startTs}` per
/// lookup.
pub(super) async fn applied_ranges(
    coll: Collection<Document>,
    concern: Option<ReadConcern>,
    lookups: &[Lookup<'_>],
    tags: &[u32],
) -> mongodb::error::Result<HashMap<(String, i64), Applied>> {
    let mut out: HashMap<(String, i64), Applied> = HashMap::new();
    let mut projection = doc! { "_id": 0, "sensorId": 1, "startTs": 1, "lsn": 1 };
    for tag in tags {
        projection.insert(bucket::lsns_field(*tag), 1);
    }
    for l in lookups {
        let find = coll.find(l.filter()).projection(projection.clone());
        let cursor = match concern.clone() {
            Some(c) => find.read_concern(c).await?,
            None => find.await?,
        };
        collect_applied(cursor, tags, &mut out).await?;
    }
    Ok(out)
}

/// Adds the ranges of the buckets `cursor` returns to `out`.
pub(super) async fn collect_applied(
    mut cursor: mongodb::Cursor<Document>,
    tags: &[u32],
    out: &mut HashMap<(String, i64), Applied>,
) -> mongodb::error::Result<()> {
    while cursor.advance().await? {
        let d = cursor.deserialize_current()?;
        let (Ok(sensor), Ok(start)) = (d.get_str("sensorId"), d.get_datetime("startTs")) else {
            continue;
        };
        let entry = out
            .entry((sensor.to_string(), start.timestamp_millis()))
            .or_default();
        for tag in tags {
            let field = bucket::lsns_field(*tag);
            let Some((top, key)) = field.split_once('.') else {
                continue;
            };
            if let Ok(pairs) = d.get_document(top).and_then(|l| l.get_array(key)) {
                // Every bucket of the window adds its pairs (a window with
                // full buckets has several).
                let pairs = pairs.iter().filter_map(mongo::as_u64);
                match entry.ranges.iter_mut().find(|r| r.0 == *tag) {
                    Some(r) => r.1.extend(pairs),
                    None => entry.ranges.push((*tag, pairs.collect())),
                }
            }
        }
        if let Some(lsn) = d.get("lsn").and_then(mongo::as_u64) {
            entry.legacy = entry.legacy.max(Some(lsn));
        }
    }
    Ok(())
}

/// At most this many (sensor, window start) combinations a lookup of
/// buckets names (`sensorId $in` times `startTs $in`): what it can return
/// beyond the pairs asked for, and the query's size, stay bounded however
/// many windows a flush spans (a backfill of a year of hourly windows is
/// 8,760 per sensor).
pub(crate) const MAX_LOOKUP_PAIRS: usize = 2048;

/// One lookup of buckets on `{sensorId, startTs}`: its sensors times its
/// window starts, and which of those pairs were asked for.
#[derive(Debug, PartialEq)]
pub(super) struct Lookup<'a> {
    sensors: Vec<&'a str>,
    starts: Vec<i64>,
    /// Per sensor, the window starts asked for (sorted).
    asked: std::collections::BTreeMap<&'a str, Vec<i64>>,
}

impl Lookup<'_> {
    fn filter(&self) -> Document {
        let starts: Vec<bson::DateTime> = self
            .starts
            .iter()
            .map(|s| bson::DateTime::from_millis(*s))
            .collect();
        doc! { "sensorId": { "$in": &self.sensors }, "startTs": { "$in": starts } }
    }
}

/// Cuts (sensor, window start) pairs into lookups of at most
/// [`MAX_LOOKUP_PAIRS`] combinations each: sensors are gathered while
/// their windows together keep within it (the live case: a thousand
/// sensors and one window are one lookup); a sensor with more windows than
/// that gets lookups of its own. The number of lookups grows with the pairs
/// asked for, never with the square of anything.
pub(super) fn lookups(mut pairs: Vec<(&str, i64)>) -> Vec<Lookup<'_>> {
    pairs.sort_unstable();
    pairs.dedup();
    let mut out: Vec<Lookup<'_>> = Vec::new();
    let mut current: Option<(Lookup<'_>, std::collections::BTreeSet<i64>)> = None;
    let mut rest = pairs.as_slice();
    while let Some(&(sensor, _)) = rest.first() {
        let n = rest.iter().take_while(|p| p.0 == sensor).count();
        let (mine, after) = rest.split_at(n);
        rest = after;
        let starts: Vec<i64> = mine.iter().map(|p| p.1).collect();
        if let Some((l, union)) = current.as_mut() {
            let added = starts.iter().filter(|s| !union.contains(s)).count();
            if (l.sensors.len() + 1) * (union.len() + added) <= MAX_LOOKUP_PAIRS {
                union.extend(starts.iter().copied());
                l.sensors.push(sensor);
                l.asked.insert(sensor, starts);
                continue;
            }
        }
        if let Some((mut l, union)) = current.take() {
            l.starts = union.into_iter().collect();
            out.push(l);
        }
        if starts.len() > MAX_LOOKUP_PAIRS {
            for chunk in starts.chunks(MAX_LOOKUP_PAIRS) {
                out.push(Lookup {
                    sensors: vec![sensor],
                    starts: chunk.to_vec(),
                    asked: [(sensor, chunk.to_vec())].into(),
                });
            }
            continue;
        }
        let union = starts.iter().copied().collect();
        current = Some((
            Lookup {
                sensors: vec![sensor],
                starts: Vec::new(),
                asked: [(sensor, starts)].into(),
            },
            union,
        ));
    }
    if let Some((mut l, union)) = current {
        l.starts = union.into_iter().collect();
        out.push(l);
    }
    out
}

impl Buckets {
    /// Each uncertain sample is in MongoDB iff a bucket of its sensor and
    /// window holds a range of this spool around its LSN, or (a bucket
    /// written by palletd 0.1) an `lsn` at or above it.
    pub(in crate::store) async fn resolve(
        &self,
        mongo: &mut Mongo,
        req: &[Resolve],
        abort: &CancellationToken,
    ) -> Result<Resolution, Aborted> {
        let shape = self.shape;
        // The (sensor, window) pairs with uncertain samples.
        let pairs: Vec<(&str, i64)> = req
            .iter()
            .flat_map(|r| {
                r.samples
                    .iter()
                    .map(|&(_, ts)| (r.sensor.as_str(), shape.window_start(ts)))
            })
            .collect();
        let lookups = lookups(pairs);
        // The ids the uncertain samples were written under (one, but for a
        // spool copied from another box).
        let mut tags: Vec<u32> = req
            .iter()
            .flat_map(|r| r.samples.iter().map(|s| self.tags.of(s.0)))
            .collect();
        tags.sort_unstable();
        tags.dedup();
        let coll = self.collection.clone();
        let found = mongo
            .read_retrying("read applied LSNs", abort, |db, concern| {
                applied_ranges(db.collection(&coll), concern, &lookups, &tags)
            })
            .await?;
        let mut out = Resolution::default();
        for r in req {
            for &(lsn, ts) in &r.samples {
                let key = (r.sensor.clone(), shape.window_start(ts));
                if found
                    .get(&key)
                    .is_some_and(|a| a.holds(self.tags.of(lsn), lsn))
                {
                    out.applied.insert(lsn);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn combos(l: &Lookup<'_>) -> usize {
        l.sensors.len() * l.starts.len()
    }

    /// The live case (a thousand sensors, one window) is one lookup; a
    /// backfill (three sensors, a year of hourly windows) is lookups of at
    /// most MAX_LOOKUP_PAIRS combinations, not one of 26,280 clauses.
    /// Mutant this kills: the resolve lookup's `$or` of a clause per window.
    #[test]
    fn lookups_stay_bounded_for_many_sensors_and_for_many_windows() {
        let names: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
        let live: Vec<(&str, i64)> = names.iter().map(|n| (n.as_str(), 3_600_000)).collect();
        let l = lookups(live);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].sensors.len(), l[0].starts.len()), (1000, 1));

        let hour = 3_600_000;
        let year: Vec<(&str, i64)> = names[..3]
            .iter()
            .flat_map(|n| (0..8760).map(move |h| (n.as_str(), h * hour)))
            .collect();
        let l = lookups(year);
        assert!(l.iter().all(|l| combos(l) <= MAX_LOOKUP_PAIRS));
        assert_eq!(l.len(), 3 * 8760_usize.div_ceil(MAX_LOOKUP_PAIRS));
    }

    proptest! {
        /// Every pair asked for is in exactly one lookup, asked there,
        /// within its sensors and starts; no lookup names more than
        /// MAX_LOOKUP_PAIRS combinations.
        #[test]
        fn every_pair_is_looked_up_once_within_the_bound(
            raw in proptest::collection::vec((0u16..300, 0i64..5000), 0..6000),
        ) {
            let names: Vec<String> = (0..300).map(|i| format!("s{i}")).collect();
            let pairs: Vec<(&str, i64)> =
                raw.iter().map(|&(s, w)| (names[s as usize].as_str(), w)).collect();
            let ls = lookups(pairs.clone());
            let mut seen = std::collections::HashMap::new();
            for l in &ls {
                prop_assert!(combos(l) <= MAX_LOOKUP_PAIRS);
                for (sensor, starts) in &l.asked {
                    prop_assert!(l.sensors.contains(sensor));
                    for s in starts {
                        prop_assert!(l.starts.binary_search(s).is_ok());
                        *seen.entry((*sensor, *s)).or_insert(0) += 1;
                    }
                }
            }
            let mut want = pairs;
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(seen.len(), want.len());
            prop_assert!(seen.values().all(|n| *n == 1));
            prop_assert!(want.iter().all(|p| seen.contains_key(p)));
        }
    }
}
