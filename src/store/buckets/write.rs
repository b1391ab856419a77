//! Writing a flush: the statements planned per sensor, sent in one ordered
//! `update` (split at the server's limits), a statement that met a full or
//! sealed bucket sent to the next; the fills of open buckets learned first.

use super::*;
use std::collections::HashMap;

use bson::{doc, Bson, Document};
use mongodb::Collection;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::mongo::{count_statement_error, rejection, Decision, Mongo, WriteError};
use crate::bucket::{self, Fill};
use crate::handoff::{Batch, Outcome, Written};
use crate::retry::{Aborted, Backoff};
use crate::store::statements::Ordered;

/// Records what the database did with a statement: `Some(inserted)` when
/// it was applied (the fill it now has), `None` when it was not (unknown).
pub(super) fn settle(fills: &mut bucket::Fills, st: &bucket::Statement, applied: Option<bool>) {
    match applied.and_then(|inserted| st.fill_after(inserted)) {
        Some(fill) => {
            fills.insert(st.start_ms, fill);
        }
        None => {
            fills.remove(&st.start_ms);
        }
    }
}

/// Sequence numbers asked for per (sensor, window) in one round of
/// [`open_fills`]: most windows have one to three buckets.
pub(super) const FILL_SEQS: u32 = 4;

/// `_id`s per fill query: 2,048 windows of 4 sequence numbers each. On
/// SecantusDB 8,192 `_id`s took 0.12-0.13 s with 240 hourly buckets per
/// sensor stored, where `sensorId $in` x `startTs $in` over 2,048 pairs
/// took 1.5-2.0 s (0.04-0.09 s on an empty collection: it grows with each
/// sensor's history) and, after a restart beside a month of history,
/// stalled the first flushes of 10,000 sensors for a minute.
pub(super) const FILL_IDS_PER_QUERY: usize = 8_192;

/// What is known of the newest bucket of (sensor, window start) pairs:
/// the one with the highest sequence number ([`bucket::bucket_id`]), its
/// fill, or [`Fill::sealed`] if the closer sealed it. A pair without such a
/// bucket is absent (buckets written before buckets were addressed by
/// `_id`, with an ObjectId, are left alone: read and sealed, never written
/// again).
///
/// Asked by `_id`, [`FILL_SEQS`] sequence numbers per pair and round, at
/// most [`FILL_IDS_PER_QUERY`] per query, so each query costs the same
/// however much history the sensors have. A window's buckets are numbered
/// from 0 without gaps (a bucket is started only past the one before it),
/// so a pair whose last number asked exists is asked again for the next
/// ones, and only those.
pub(super) async fn open_fills(
    coll: &Collection<Document>,
    pairs: &[(&str, i64)],
) -> mongodb::error::Result<HashMap<(String, i64), Fill>> {
    let mut newest: HashMap<(String, i64), Fill> = HashMap::new();
    let mut asking: Vec<(&str, i64)> = pairs.to_vec();
    let mut from = 0;
    while !asking.is_empty() && from < MAX_SEQ {
        for chunk in asking.chunks(FILL_IDS_PER_QUERY / FILL_SEQS as usize) {
            let ids: Vec<String> = (chunk.iter())
                .flat_map(|&(s, w)| {
                    (from..from + FILL_SEQS).map(move |q| bucket::bucket_id(s, w, q))
                })
                .collect();
            let cursor = coll
                .find(doc! { "_id": { "$in": ids } })
                .projection(
                    doc! { "_id": 1, "sensorId": 1, "startTs": 1, "count": 1, "size": 1, "closed": 1 },
                )
                .await?;
            newest_buckets(cursor, &mut newest).await?;
        }
        let top = from + FILL_SEQS - 1;
        asking.retain(|&(s, w)| {
            newest
                .get(&(s.to_string(), w))
                .is_some_and(|f| f.seq == top)
        });
        from += FILL_SEQS;
    }
    Ok(newest)
}

/// Keeps, per (sensor, window start), what is known of its newest bucket.
pub(super) async fn newest_buckets(
    mut cursor: mongodb::Cursor<Document>,
    newest: &mut HashMap<(String, i64), Fill>,
) -> mongodb::error::Result<()> {
    while cursor.advance().await? {
        let d = cursor.deserialize_current()?;
        let (Ok(sensor), Ok(start), Some(seq)) = (
            d.get_str("sensorId"),
            d.get_datetime("startTs"),
            d.get_str("_id").ok().and_then(bucket::seq_of),
        ) else {
            continue;
        };
        let fill = match d.get_bool("closed") {
            Ok(false) => Fill {
                count: d.get_i32("count").unwrap_or(0).max(0) as u32,
                bytes: d.get_i32("size").unwrap_or(0).max(0) as u32,
                seq,
            },
            _ => Fill::sealed(seq),
        };
        newest
            .entry((sensor.to_string(), start.timestamp_millis()))
            .and_modify(|f| {
                if fill.seq > f.seq {
                    *f = fill;
                }
            })
            .or_insert(fill);
    }
    Ok(())
}

impl Buckets {
    /// Plans and sends the batch's statements; sets every sample's outcome
    /// and the runs' open-bucket fills.
    pub(in crate::store) async fn write(
        &mut self,
        mongo: &mut Mongo,
        batch: &mut Batch,
        abort: &CancellationToken,
    ) -> Result<Written, Aborted> {
        let mut written = Written::default();
        self.learn_fills(mongo, batch).await;
        let shard_key = self.shard_key(&mongo.db).await;
        let shape = self.shape;
        let mut plans: Vec<Vec<bucket::Statement>> = batch
            .runs
            .iter_mut()
            .map(|r| {
                r.outcomes = vec![Outcome::NotSent; r.samples.len()];
                bucket::plan(&r.samples, &mut r.fills, &shape, &self.tags)
            })
            .collect();
        // Every statement in order: sensors one after another, each in LSN
        // order, so what an ordered command applies is a prefix per sensor.
        let mut order: Vec<(usize, usize)> = plans
            .iter()
            .enumerate()
            .flat_map(|(r, p)| (0..p.len()).map(move |s| (r, s)))
            .collect();
        let mut backoff = Backoff::default();
        let mut next = 0;
        let mut relearned = false;
        while next < order.len() {
            let runs = &batch.runs;
            let sent = mongo
                .send_ordered("write buckets", true, &mut backoff, abort, |m| {
                    let statements = order[next..].iter().map(|&(r, s)| {
                        plans[r][s].to_bson(&runs[r].sensor, &runs[r].samples, &shape, shard_key)
                    });
                    m.batch_command("update", &self.collection, "updates", statements, true)
                })
                .await?;
            let (applied, upserted, refused) = match sent {
                Ordered::Answered {
                    applied,
                    upserted,
                    refused,
                } => (applied, upserted, refused),
                Ordered::Lost { len } => {
                    // Unknown what the command applied; the pipeline learns
                    // it before sending these samples again.
                    for &(r, s) in &order[next..next + len] {
                        let st = &plans[r][s];
                        batch.runs[r].outcomes[st.range.clone()].fill(Outcome::Unknown);
                    }
                    break;
                }
            };
            for i in 0..applied {
                let (r, s) = order[next + i];
                let st = &plans[r][s];
                let inserted = upserted.contains(&i);
                self.applied(&mut batch.runs[r], st, inserted, &mut written);
            }
            next += applied;
            let Some((error, decision)) = refused else {
                backoff.reset();
                continue;
            };
            let (r, s) = order[next];
            match decision {
                // Its bucket is there and it does not fit (full or sealed,
                // beyond what palletd knew): the next bucket, at once (a
                // collision past MAX_SEQ buckets is given up: it would be
                // sent for ever).
                Decision::NextBucket if plans[r][s].seq < MAX_SEQ => {
                    bucket::collided(&mut plans[r], s);
                    batch.runs[r].fills.surprised();
                    metrics::counter!(crate::telemetry::BUCKET_COLLISIONS).increment(1);
                    backoff.reset();
                    if !relearned {
                        relearned = true;
                        self.replan_after(mongo, batch, &mut plans, &mut order, r)
                            .await;
                    }
                }
                Decision::RetryStatement => {
                    count_statement_error(decision);
                    debug!(code = error.code, error = %error.msg, "Transient statement error; retrying from it.");
                    mongo.wait(&mut backoff, abort).await?;
                }
                _ => {
                    count_statement_error(Decision::GiveUp);
                    let WriteError { code, msg, .. } = error;
                    let st = &plans[r][s];
                    batch.runs[r].outcomes[st.range.clone()]
                        .fill(Outcome::Rejected(rejection(code, &msg)));
                    next += 1;
                    backoff.reset();
                }
            }
        }
        // A statement not applied leaves its window's fill unknown: learned
        // again before the next write to it.
        for (run, plan) in batch.runs.iter_mut().zip(&plans) {
            for st in plan {
                if run.outcomes[st.range.start] != Outcome::Applied {
                    settle(&mut run.fills, st, None);
                }
            }
        }
        Ok(written)
    }

    /// A statement the database applied: its samples' outcome, the bytes
    /// it rewrote, the buckets it filled held for an early seal, the fill
    /// it leaves.
    fn applied(
        &mut self,
        run: &mut crate::handoff::Run,
        st: &bucket::Statement,
        inserted: bool,
        written: &mut Written,
    ) {
        let shape = self.shape;
        run.outcomes[st.range.clone()].fill(Outcome::Applied);
        // A $push rewrites the whole bucket: what it held and what
        // the statement added.
        let held = if inserted {
            0
        } else {
            st.base.map_or(0, |b| b.bytes)
        };
        written.bytes_rewritten += u64::from(held + st.bytes);
        let full = st
            .fill_after(inserted)
            .is_some_and(|f| f.count >= shape.max_samples);
        if full && self.full.len() < FULL_HELD {
            let id = bucket::bucket_id(&run.sensor, st.start_ms, st.seq);
            self.full.push(Bson::String(id));
        }
        if st.leaves && self.full.len() < FULL_HELD {
            let id = bucket::bucket_id(&run.sensor, st.start_ms, st.seq - 1);
            self.full.push(Bson::String(id));
        }
        settle(&mut run.fills, st, Some(inserted));
        written.statements += 1;
        written.buckets_created += inserted as u64;
    }

    /// After a collision in run `r`: another writer may have filled the
    /// buckets of the runs not sent yet too (a second instance, or the other
    /// lane: each lane knows only its own fills), and each of their
    /// statements would collide in turn, the rest of the command sent again
    /// after each (over a slow link a write of 1,000 sensors then took tens
    /// of minutes). So their fills are looked up again (one query per
    /// [`FILL_IDS_PER_QUERY`]) and they are planned anew; `order` from run
    /// `r` on follows. Done once per write: the lookup is what the planner
    /// needs, and a later collision is a race, sent on as before.
    pub(super) async fn replan_after(
        &self,
        mongo: &mut Mongo,
        batch: &mut Batch,
        plans: &mut [Vec<bucket::Statement>],
        order: &mut Vec<(usize, usize)>,
        r: usize,
    ) {
        if r + 1 >= batch.runs.len() {
            return;
        }
        for (run, plan) in batch.runs[r + 1..].iter_mut().zip(&plans[r + 1..]) {
            for st in plan {
                run.fills.remove(&st.start_ms);
            }
            run.fills.surprised();
        }
        self.learn_fills(mongo, batch).await;
        let cut = order.partition_point(|&(run, _)| run <= r);
        order.truncate(cut);
        for (i, run) in batch.runs.iter_mut().enumerate().skip(r + 1) {
            plans[i] = bucket::plan(&run.samples, &mut run.fills, &self.shape, &self.tags);
            order.extend((0..plans[i].len()).map(|s| (i, s)));
        }
    }

    /// Learns the fill of open buckets the runs have no memory of (after a
    /// restart, or a sensor seen for the first time): `_id` point lookups
    /// ([`open_fills`]). One attempt: the fill only improves packing,
    /// correctness never depends on it.
    pub(super) async fn learn_fills(&self, mongo: &mut Mongo, batch: &mut Batch) {
        // A quiet sensor's new windows, and a window newer than every
        // one known of its sensor, are taken to be empty (seq 0).
        for run in batch.runs.iter_mut() {
            let mut windows: Vec<i64> = (run.samples.iter())
                .map(|s| self.shape.window_start(s.ts_ms))
                .collect();
            windows.dedup();
            for w in windows {
                if !run.fills.contains_key(&w) && run.fills.assume_empty(w) {
                    run.fills.insert(w, Fill::default());
                }
            }
        }
        let mut unknown: Vec<(usize, i64)> = batch
            .runs
            .iter()
            .enumerate()
            .flat_map(|(i, run)| {
                run.samples
                    .iter()
                    .map(|s| self.shape.window_start(s.ts_ms))
                    .filter(|w| !run.fills.contains_key(w))
                    .map(move |w| (i, w))
            })
            .collect();
        if unknown.is_empty() {
            return;
        }
        unknown.sort_unstable();
        unknown.dedup();
        metrics::counter!(crate::telemetry::FILL_LOOKUPS).increment(unknown.len() as u64);
        let pairs: Vec<(&str, i64)> = (unknown.iter())
            .map(|&(i, w)| (batch.runs[i].sensor.as_str(), w))
            .collect();
        match open_fills(&self.coll(&mongo.db), &pairs).await {
            Ok(found) => {
                let mut any = vec![None; batch.runs.len()];
                for &(i, start) in &unknown {
                    let key = (batch.runs[i].sensor.clone(), start);
                    let fill = found.get(&key).copied();
                    let seen = any[i].get_or_insert(false);
                    *seen |= fill.is_some();
                    batch.runs[i].fills.insert(start, fill.unwrap_or_default());
                }
                for (run, found) in batch.runs.iter_mut().zip(any) {
                    if let Some(found) = found {
                        run.fills.looked_up(found);
                    }
                }
            }
            Err(e) => debug!(error = %e, "Could not learn open bucket fills; writing without."),
        }
    }
}
