//! The rollup passes: take the due entries of the queue, compute their
//! intervals' rollups (merged from the buckets' summaries, or aggregated
//! from the time series documents), upsert them and clear the entries'
//! bits; the queries planned in ranges of sensors and intervals.

use std::collections::{BTreeMap, HashSet};

use bson::{doc, Bson, Document};
use futures_util::TryStreamExt;
use mongodb::Database;

use super::merge::Rollup;
use super::{Entry, Pass, Passes, Rollups, Source, KEYS_PER_PASS, PARKED_FOR, SENSORS_PER_QUERY};
use crate::bucket::{ARCHIVE, LEFT_OUT};
use crate::config::RollupSettings;
use crate::store::mongo::{self, Decision};
use crate::store::read;
use crate::store::statements;
use crate::telemetry;

/// Summaries of one rollup query at most: buckets it may read, counted
/// as windows (a window of late data or of full buckets has more). The
/// results stream; palletd holds one summary per key.
pub(super) const SUMMARIES_PER_QUERY: i64 = 10_000;

impl Passes {
    /// One pass, timed and logged (a failure once until one works; its
    /// keys stay for the next pass). Whether it left due keys.
    pub(super) async fn run(&self, db: &Database, now_ms: i64, failing: &mut bool) -> bool {
        let started = std::time::Instant::now();
        let more = match self.pass(db, now_ms).await {
            Ok(p) => {
                if std::mem::take(failing) {
                    tracing::info!("Rollups are written again.");
                }
                p.more
            }
            Err(e) => {
                if !std::mem::replace(failing, true) {
                    tracing::warn!(error = %e, "Could not write rollups; retrying at the closer's next run.")
                }
                false
            }
        };
        metrics::histogram!(telemetry::ROLLUP_PASS_SECONDS).record(started.elapsed().as_secs_f64());
        more
    }

    /// When the interval of `spec` starting at `start` is due: its end
    /// plus `closer.grace`.
    pub(super) fn due_ms(&self, spec: &RollupSettings, start: i64) -> i64 {
        start + spec.interval_ms() + self.grace_ms
    }

    /// One pass: computes and writes the due rollups (and the partial
    /// ones), clearing the keys done.
    async fn pass(&self, db: &Database, now_ms: i64) -> mongodb::error::Result<Pass> {
        let mut out = Pass::default();
        let now = bson::DateTime::from_millis(now_ms);
        let due = doc! { "due": { "$lte": now }, "hold": { "$not": { "$gt": now } } };
        let (due, more) = self.entries(db, due).await?;
        out.more = more;
        self.compute_keys(db, due, now_ms, false, &mut out).await?;
        for spec in self.specs.iter().filter(|s| s.partial) {
            let open = doc! {
                "r": spec.name.as_str(),
                "$or": [{ "until": { "$gt": now } }, { "due": { "$gt": now } }],
            };
            let (open, _) = self.entries(db, open).await?;
            self.compute_keys(db, open, now_ms, true, &mut out).await?;
        }
        metrics::counter!(telemetry::ROLLUPS_WRITTEN).increment(out.written);
        metrics::counter!(telemetry::ROLLUP_STATEMENTS).increment(out.statements);
        Ok(out)
    }

    /// The queue entries `filter` matches, earliest due first, whole,
    /// until they hold [`KEYS_PER_PASS`] intervals; whether more may match.
    async fn entries(
        &self,
        db: &Database,
        filter: Document,
    ) -> mongodb::error::Result<(Vec<Entry>, bool)> {
        let mut cursor = db
            .collection::<Document>(&self.queue)
            .find(filter)
            .sort(doc! { "due": 1 })
            .limit(KEYS_PER_PASS)
            .await?;
        let (mut out, mut keys, mut read) = (Vec::new(), 0, 0);
        while let Some(d) = cursor.try_next().await? {
            read += 1;
            if let Some(e) = Entry::parse(&d) {
                keys += e.mask.map_or(1, |m| m.count_ones() as i64);
                out.push(e);
            }
            if keys >= KEYS_PER_PASS {
                return Ok((out, true));
            }
        }
        Ok((out, read >= KEYS_PER_PASS))
    }

    /// Computes the rollups of queue entries `entries` (of their intervals
    /// due, or if `partial` of those not due), query by query
    /// ([`queries`]); then, unless `partial`, clears the intervals done
    /// ([`Passes::settle`]).
    async fn compute_keys(
        &self,
        db: &Database,
        entries: Vec<Entry>,
        now_ms: i64,
        partial: bool,
        out: &mut Pass,
    ) -> mongodb::error::Result<()> {
        let mut by_rollup: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
        for e in entries {
            by_rollup.entry(e.rollup.clone()).or_default().push(e);
        }
        for (name, entries) in by_rollup {
            let Some(spec) = self.specs.iter().find(|s| s.name == name) else {
                // A rollup no longer configured: its keys just go.
                if !partial {
                    self.delete(db, entries.iter(), out).await?;
                }
                continue;
            };
            // (sensor, interval start), and the index of its entry.
            let mut keys: Vec<(&str, i64)> = Vec::new();
            let mut owner: Vec<usize> = Vec::new();
            for (i, e) in entries.iter().enumerate() {
                for start in e.intervals(spec.interval_ms()) {
                    let due = self.due_ms(spec, start) <= now_ms;
                    if e.mask.is_none() || due != partial {
                        keys.push((e.sensor.as_str(), start));
                        owner.push(i);
                    }
                }
            }
            let mut failed: Vec<(usize, String)> = Vec::new();
            for query in self.queries_of(spec, &keys) {
                let f = self
                    .compute_query(db, spec, &query, &keys, now_ms, partial, out)
                    .await?;
                failed.extend(f);
            }
            let mut parked: BTreeMap<usize, &str> = BTreeMap::new();
            for (k, error) in &failed {
                parked.entry(owner[*k]).or_insert(error);
            }
            if !parked.is_empty() {
                let parked: Vec<(&Entry, &str)> =
                    parked.into_iter().map(|(i, e)| (&entries[i], e)).collect();
                out.parked += failed.len() as u64;
                self.park(db, &name, &parked, failed.len(), now_ms).await?;
            }
            if !partial {
                let failed: HashSet<usize> = failed.into_iter().map(|(k, _)| k).collect();
                let mut done = vec![Vec::new(); entries.len()];
                for (k, &(_, start)) in keys.iter().enumerate() {
                    if !failed.contains(&k) {
                        done[owner[k]].push(start);
                    }
                }
                self.settle(db, spec, &entries, &done, out).await?;
            }
        }
        Ok(())
    }

    /// The queries that compute these keys of `spec`: over buckets, a
    /// bounded range of windows for several sensors
    /// ([`SUMMARIES_PER_QUERY`]); over time series documents, one interval.
    fn queries_of(&self, spec: &RollupSettings, keys: &[(&str, i64)]) -> Vec<Query> {
        let interval = spec.interval_ms();
        match self.source {
            Source::Buckets => {
                let windows = (interval / self.window_ms.max(1)).max(1);
                queries(
                    keys,
                    interval,
                    (SUMMARIES_PER_QUERY / windows).max(1),
                    |n| {
                        (SUMMARIES_PER_QUERY / (windows * n)).clamp(1, SENSORS_PER_QUERY as i64)
                            as usize
                    },
                )
            }
            Source::Timeseries => queries(keys, interval, 1, |_| SENSORS_PER_QUERY),
        }
    }

    /// One query's rollups, computed and written; returns the keys (indexes
    /// into `keys`) whose rollup could not be, with the error.
    #[allow(clippy::too_many_arguments)]
    async fn compute_query(
        &self,
        db: &Database,
        spec: &RollupSettings,
        query: &Query,
        keys: &[(&str, i64)],
        now_ms: i64,
        partial: bool,
        out: &mut Pass,
    ) -> mongodb::error::Result<Vec<(usize, String)>> {
        let wanted: HashSet<(&str, i64)> = query.keys.iter().map(|&k| keys[k]).collect();
        let mut failed: Vec<(usize, String)> = Vec::new();
        let docs = match self
            .compute(db, spec, query, &wanted, now_ms, partial)
            .await
        {
            Ok(docs) => docs,
            // Refused by the server (not the link): each key alone, so one
            // that cannot be computed is set aside and the others go on.
            Err(e) if mongo::refused(&e) => {
                let mut docs = Vec::new();
                for &k in &query.keys {
                    let (sensor, start) = keys[k];
                    let one = Query {
                        sensors: vec![sensor.to_string()],
                        from: start,
                        to: start + spec.interval_ms(),
                        keys: Vec::new(),
                    };
                    let key = HashSet::from([(sensor, start)]);
                    match self.compute(db, spec, &one, &key, now_ms, partial).await {
                        Ok(d) => docs.extend(d),
                        Err(e) if mongo::refused(&e) => failed.push((k, e.to_string())),
                        Err(e) => return Err(e),
                    }
                }
                docs
            }
            Err(e) => return Err(e),
        };
        if !docs.is_empty() {
            let keys_of: Vec<(String, i64)> = docs.iter().map(key_of).collect();
            let updates: Vec<Document> = docs
                .into_iter()
                .map(|d| {
                    let q = doc! { "sensorId": d.get("sensorId").cloned().unwrap_or(Bson::Null), "start": d.get("start").cloned().unwrap_or(Bson::Null) };
                    doc! { "q": q, "u": d, "upsert": true }
                })
                .collect();
            out.statements += updates.len() as u64;
            let coll = Rollups::collection_of(&self.base, spec);
            let errors = write(db, &self.concern, &coll, "update", "updates", updates).await?;
            out.written += (keys_of.len() - errors.len()) as u64;
            for (i, error) in errors {
                let (sensor, start) = &keys_of[i];
                let of = |&&k: &&usize| keys[k] == (sensor.as_str(), *start);
                failed.extend(query.keys.iter().filter(of).map(|&k| (k, error.clone())));
            }
        }
        Ok(failed)
    }

    /// After a pass computed `done[i]`, intervals of `entries[i]`: each
    /// entry loses their bits, if its version is still the one read (a
    /// write since then recorded it again: the next pass computes its due
    /// intervals again); an entry left with none (or of one interval) is
    /// deleted, one left with some is due at the earliest's due time.
    async fn settle(
        &self,
        db: &Database,
        spec: &RollupSettings,
        entries: &[Entry],
        done: &[Vec<i64>],
        out: &mut Pass,
    ) -> mongodb::error::Result<()> {
        let interval = spec.interval_ms();
        let mut gone: Vec<&Entry> = Vec::new();
        let mut updates: Vec<Document> = Vec::new();
        for (e, done) in entries.iter().zip(done) {
            let Some(mask) = e.mask else {
                if !done.is_empty() {
                    gone.push(e);
                }
                continue;
            };
            let cleared = done
                .iter()
                .fold(0_u64, |m, t| m | 1 << ((t - e.start) / interval));
            let rest = mask & !cleared;
            if rest == 0 {
                gone.push(e);
            } else if cleared != 0 {
                let earliest = e.start + rest.trailing_zeros() as i64 * interval;
                let due = bson::DateTime::from_millis(self.due_ms(spec, earliest));
                updates.push(doc! {
                    "q": { "_id": &e.id, "v": e.version },
                    "u": { "$bit": { "m": { "and": !cleared as i64 } }, "$set": { "due": due } },
                });
            }
        }
        self.delete(db, gone.into_iter(), out).await?;
        out.statements += updates.len() as u64;
        if !updates.is_empty() {
            write(db, &self.concern, &self.queue, "update", "updates", updates).await?;
        }
        Ok(())
    }

    /// Deletes queue entries, each only if its version is still the one
    /// read (a write since then recorded it again).
    async fn delete<'a>(
        &self,
        db: &Database,
        entries: impl Iterator<Item = &'a Entry>,
        out: &mut Pass,
    ) -> mongodb::error::Result<()> {
        let deletes: Vec<Document> = entries
            .map(|e| doc! { "q": { "_id": &e.id, "v": e.version }, "limit": 1 })
            .collect();
        out.statements += deletes.len() as u64;
        if !deletes.is_empty() {
            write(db, &self.concern, &self.queue, "delete", "deletes", deletes).await?;
        }
        Ok(())
    }

    /// Sets aside the entries of keys (`keys` in all) whose rollup could
    /// not be computed or written, with the first error of each: no pass
    /// takes them for [`PARKED_FOR`] (so they never block a pass; the
    /// other intervals of such a block wait as long), counted, logged once
    /// per pass with the first error.
    async fn park(
        &self,
        db: &Database,
        rollup: &str,
        failed: &[(&Entry, &str)],
        keys: usize,
        now_ms: i64,
    ) -> mongodb::error::Result<()> {
        let again = bson::DateTime::from_millis(now_ms + PARKED_FOR.as_millis() as i64);
        let updates: Vec<Document> = failed
            .iter()
            .map(|(e, error)| {
                let error = crate::decode::truncate(error, 512);
                doc! {
                    "q": { "_id": &e.id },
                    "u": { "$max": { "hold": again }, "$set": { "parked": true, "error": error } },
                }
            })
            .collect();
        metrics::counter!(telemetry::ROLLUP_KEYS_PARKED).increment(keys as u64);
        tracing::warn!(
            rollup,
            keys,
            sensor = ?failed[0].0.sensor,
            error = ?failed[0].1,
            again = ?PARKED_FOR,
            "Rollups that cannot be written are set aside (the others go on); tried again later."
        );
        write(db, &self.concern, &self.queue, "update", "updates", updates).await?;
        Ok(())
    }

    /// The rollup documents of the `wanted` keys among `query`'s sensors
    /// and intervals.
    async fn compute(
        &self,
        db: &Database,
        spec: &RollupSettings,
        query: &Query,
        wanted: &HashSet<(&str, i64)>,
        now_ms: i64,
        partial: bool,
    ) -> mongodb::error::Result<Vec<Document>> {
        let rollups = match self.source {
            Source::Buckets => self.merge_buckets(db, spec, query, wanted).await?,
            Source::Timeseries => self.aggregate_readings(db, spec, query).await?,
        };
        Ok(rollups
            .into_iter()
            .filter(|(k, _)| wanted.contains(&(k.0.as_str(), k.1)))
            .map(|((sensor, start), r)| {
                r.to_doc(&sensor, start, spec.interval_ms(), now_ms, partial)
            })
            .collect())
    }

    /// Rollups from the buckets' own summaries: one range read of the
    /// summaries, never the samples, except of buckets written without
    /// `first` and `last` (by palletd 0.1), whose first and last readings
    /// are taken from their samples.
    async fn merge_buckets(
        &self,
        db: &Database,
        spec: &RollupSettings,
        query: &Query,
        wanted: &HashSet<(&str, i64)>,
    ) -> mongodb::error::Result<BTreeMap<(String, i64), Rollup>> {
        let coll = db.collection::<Document>(&self.base);
        let filter = doc! {
            "sensorId": { "$in": &query.sensors },
            "startTs": {
                "$gte": bson::DateTime::from_millis(query.from),
                "$lt": bson::DateTime::from_millis(query.to),
            },
        };
        let summaries = doc! {
            "sensorId": 1, "startTs": 1, "count": 1, "thinned": 1, "sum": 1, "n": 1,
            "min": 1, "max": 1, "first": 1, "last": 1,
        };
        let mut out: BTreeMap<(String, i64), Rollup> = BTreeMap::new();
        let mut without_edges: Vec<Bson> = Vec::new();
        let mut cursor = coll.find(filter).projection(summaries).await?;
        while let Some(b) = cursor.try_next().await? {
            let (Ok(sensor), Ok(start)) = (b.get_str("sensorId"), b.get_datetime("startTs")) else {
                continue;
            };
            let key = (sensor, spec.start_of(start.timestamp_millis()));
            if !wanted.contains(&key) {
                continue;
            }
            let r = out.entry((key.0.to_string(), key.1)).or_default();
            if !r.add_bucket(&b) {
                without_edges.extend(b.get("_id").cloned());
            }
        }
        for ids in without_edges.chunks(SENSORS_PER_QUERY) {
            let mut cursor = coll
                .find(doc! { "_id": { "$in": ids } })
                .projection(doc! { "sensorId": 1, "startTs": 1, "samples": 1 })
                .await?;
            while let Some(b) = cursor.try_next().await? {
                let (Ok(sensor), Ok(start)) = (b.get_str("sensorId"), b.get_datetime("startTs"))
                else {
                    continue;
                };
                if let Some(r) =
                    out.get_mut(&(sensor.to_string(), spec.start_of(start.timestamp_millis())))
                {
                    r.add_edges_of_samples(
                        b.get_array("samples").map(|a| a.as_slice()).unwrap_or(&[]),
                    );
                }
            }
        }
        Ok(out)
    }

    /// Rollups of time series documents (one interval: `query.from`),
    /// computed on the server; only the results travel. Of the readings'
    /// documents, then the summaries of the readings thinning left out
    /// (one per sensor and window, or a few), added in palletd; points
    /// thinning stored late are neither.
    async fn aggregate_readings(
        &self,
        db: &Database,
        spec: &RollupSettings,
        query: &Query,
    ) -> mongodb::error::Result<BTreeMap<(String, i64), Rollup>> {
        let start = query.from;
        let from = bson::DateTime::from_millis(start);
        let to = bson::DateTime::from_millis(start + spec.interval_ms());
        let coll = db.collection::<Document>(&self.base);
        let sensors =
            doc! { "sensorId": { "$in": &query.sensors }, "ts": { "$gte": from, "$lt": to } };
        let mut readings = sensors.clone();
        readings.insert(LEFT_OUT, doc! { "$exists": false });
        readings.insert(ARCHIVE, doc! { "$exists": false });
        let matching = doc! { "$match": readings };
        let mut out: BTreeMap<(String, i64), Rollup> = BTreeMap::new();
        let counting = vec![
            matching.clone(),
            doc! { "$group": { "_id": "$sensorId", "count": { "$sum": 1 } } },
        ];
        let mut cursor = coll.aggregate(counting).await?;
        while let Some(row) = cursor.try_next().await? {
            if let Ok(s) = row.get_str("_id") {
                out.entry((s.to_string(), start)).or_default().count =
                    read::number(row.get("count")).unwrap_or(0.0) as i64;
            }
        }
        let fields = vec![
            matching,
            doc! { "$project": { "sensorId": 1, "ts": 1, "kv": { "$objectToArray": "$$ROOT" } } },
            doc! { "$unwind": "$kv" },
            doc! { "$match": {
                "kv.k": { "$nin": ["_id", "sensorId", "ts", "lsn", crate::store::timeseries::SPOOL] },
                "$expr": { "$isNumber": "$kv.v" },
            } },
            doc! { "$sort": { "ts": 1, "kv.v": 1 } },
            doc! { "$group": {
                "_id": { "s": "$sensorId", "f": "$kv.k" },
                "sum": { "$sum": "$kv.v" },
                "n": { "$sum": 1 },
                "min": { "$min": "$kv.v" },
                "max": { "$max": "$kv.v" },
                "first": { "$first": { "t": "$ts", "v": "$kv.v" } },
                "last": { "$last": { "t": "$ts", "v": "$kv.v" } },
            } },
        ];
        let mut cursor = coll.aggregate(fields).await?;
        while let Some(row) = cursor.try_next().await? {
            let Ok(id) = row.get_document("_id") else {
                continue;
            };
            let (Ok(sensor), Ok(field)) = (id.get_str("s"), id.get_str("f")) else {
                continue;
            };
            if let Some(r) = out.get_mut(&(sensor.to_string(), start)) {
                r.add_field(field, &row);
            }
        }
        let mut left_out = sensors;
        left_out.insert(LEFT_OUT, doc! { "$exists": true });
        let mut cursor = coll
            .find(left_out)
            .projection(doc! { "_id": 0, "sensorId": 1, LEFT_OUT: 1 })
            .await?;
        while let Some(d) = cursor.try_next().await? {
            let (Ok(sensor), Ok(sums)) = (d.get_str("sensorId"), d.get_document(LEFT_OUT)) else {
                continue;
            };
            let r = out.entry((sensor.to_string(), start)).or_default();
            r.add_bucket(sums);
        }
        Ok(out)
    }
}

/// One rollup query: `sensors`' intervals in `[from, to)`, for the keys
/// `keys` (indexes into the keys planned).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Query {
    pub(super) sensors: Vec<String>,
    pub(super) from: i64,
    pub(super) to: i64,
    pub(super) keys: Vec<usize>,
}

/// Plans the queries of rollup keys (sensor, interval start): each
/// sensor's keys in runs of consecutive intervals, cut at blocks of
/// `per_query` intervals (aligned to the epoch, so the sensors of one
/// backfill or one live interval get the same ranges); the sensors of one
/// range share queries, `sensors(intervals in the range)` at most. Every
/// key is in exactly one query, whose range holds its interval.
pub(super) fn queries(
    keys: &[(&str, i64)],
    interval_ms: i64,
    per_query: i64,
    sensors: impl Fn(i64) -> usize,
) -> Vec<Query> {
    let mut by_sensor: BTreeMap<&str, Vec<(i64, usize)>> = BTreeMap::new();
    for (i, (sensor, start)) in keys.iter().enumerate() {
        by_sensor.entry(sensor).or_default().push((*start, i));
    }
    let block = interval_ms * per_query.max(1);
    // (from, to) -> [(sensor, key indexes)]
    type Ranges<'a> = BTreeMap<(i64, i64), Vec<(&'a str, Vec<usize>)>>;
    let mut ranges: Ranges = BTreeMap::new();
    for (sensor, mut starts) in by_sensor {
        starts.sort_unstable();
        let mut run: Option<(i64, i64, Vec<usize>)> = None;
        for (start, i) in starts {
            match run.as_mut() {
                Some((_, to, ks)) if start < *to => ks.push(i), // the same interval again
                Some((from, to, ks))
                    if start == *to && start.div_euclid(block) == from.div_euclid(block) =>
                {
                    *to = start + interval_ms;
                    ks.push(i);
                }
                _ => {
                    if let Some((from, to, ks)) = run.take() {
                        ranges.entry((from, to)).or_default().push((sensor, ks));
                    }
                    run = Some((start, start + interval_ms, vec![i]));
                }
            }
        }
        if let Some((from, to, ks)) = run {
            ranges.entry((from, to)).or_default().push((sensor, ks));
        }
    }
    let mut out = Vec::new();
    for ((from, to), group) in ranges {
        let per = sensors((to - from) / interval_ms).max(1);
        for part in group.chunks(per) {
            out.push(Query {
                sensors: part.iter().map(|(s, _)| s.to_string()).collect(),
                from,
                to,
                keys: part.iter().flat_map(|(_, ks)| ks.iter().copied()).collect(),
            });
        }
    }
    out
}

/// (sensorId, start ms) of a rollup document.
fn key_of(d: &Document) -> (String, i64) {
    (
        d.get_str("sensorId").unwrap_or_default().to_string(),
        d.get_datetime("start")
            .map(|t| t.timestamp_millis())
            .unwrap_or(0),
    )
}

/// Sends one write command (`update` or `delete`), unordered; returns the
/// statements the server refused for good: (index, error). One refused for
/// now (a write conflict; a queue entry's upsert that raced another to its
/// `_id`) fails the pass, which is tried again (every statement is
/// idempotent), rather than setting its key aside for [`PARKED_FOR`].
async fn write(
    db: &Database,
    concern: &Document,
    coll: &str,
    name: &str,
    field: &str,
    statements: Vec<Document>,
) -> mongodb::error::Result<Vec<(usize, String)>> {
    let cmd = doc! { name: coll, field: statements, "ordered": false };
    let errors = statements::send_once(db, concern, cmd, &format!("rollup {name}"))
        .await?
        .write_errors;
    if let Some(e) = errors
        .iter()
        .find(|e| mongo::statement_error(e, true) != Decision::GiveUp)
    {
        return Err(mongodb::error::Error::custom(format!(
            "rollup {name}: a statement refused for now (code {}): {}",
            e.code, e.msg
        )));
    }
    Ok(errors
        .into_iter()
        .map(|e| {
            let (code, msg) = (e.code, e.msg);
            (
                e.index,
                format!("rollup {name} rejected (code {code}): {msg}"),
            )
        })
        .collect())
}
