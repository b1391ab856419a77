//! The seal: the buckets of windows over, in chunks, closed with their
//! samples sorted, their average, and the LSN pairs no replay needs dropped.

use super::*;
use std::collections::HashMap;

use bson::{doc, Bson, Document};
use futures_util::TryStreamExt;
use mongodb::Database;

use crate::store::statements;

pub(super) fn open_and_ended(cutoff: bson::DateTime) -> Document {
    doc! { "closed": false, "endTs": { "$lte": cutoff } }
}

/// The next chunk's size after a full chunk of `n` buckets took `took`:
/// about [`SEAL_CHUNK_TIME`]'s worth, growing at most fourfold a step.
pub(super) fn next_seal_chunk(n: usize, took: std::time::Duration) -> usize {
    let per_bucket = took.as_secs_f64().max(1e-6) / n as f64;
    let fit = (SEAL_CHUNK_TIME.as_secs_f64() / per_bucket) as usize;
    fit.min(n * 4).clamp(SEAL_CHUNK_MIN, SEAL_CHUNK_MAX)
}

/// [`open_and_ended`], of the buckets `ids` only (a seal's chunk).
pub(super) fn chunk_filter(ids: &[Bson], cutoff: bson::DateTime) -> Document {
    let mut q = doc! { "_id": { "$in": ids } };
    q.extend(open_and_ended(cutoff));
    q
}

/// `avg.<f> = sum.<f> / n.<f>` for every rolled-up field, as an expression
/// that MongoDB 5.0 accepts (`$getField` takes only constant names before 7.2).
pub(super) fn avg_expression() -> Document {
    doc! {
        "$arrayToObject": { "$map": {
            "input": { "$objectToArray": { "$ifNull": ["$sum", {}] } },
            "as": "s",
            "in": {
                "k": "$$s.k",
                "v": { "$divide": ["$$s.v", { "$let": {
                    "vars": { "n": { "$arrayElemAt": [
                        { "$filter": {
                            "input": { "$objectToArray": { "$ifNull": ["$n", {}] } },
                            "cond": { "$eq": ["$$this.k", "$$s.k"] },
                        } }, 0] } },
                    "in": "$$n.v",
                } }] },
            },
        } }
    }
}

/// `lsns` without the spools' pairs that no replay needs: an entry
/// `lsns.<spool>` goes when its largest LSN is below the checkpoint that
/// spool published (every record below it is in MongoDB), and the field
/// goes with its last entry. A spool that resolves an LSN below its
/// published checkpoint (after a crash before the spool stored that
/// checkpoint, or a restored backup or a copy of it) takes it as applied
/// (`Store::resolve`), so it never looks for those pairs. `None` without
/// published checkpoints.
///
/// The rule's proof is the pipeline model's (`src/pipeline/tests.rs`):
/// every seal there publishes and removes pairs, finer than this (each
/// pair below the checkpoint, in open windows too), through crashes, lost
/// replies, two instances and a backlog, and every sample stays stored
/// exactly once; `tests/suite/faults.rs` restores a spool from a backup.
pub(super) fn strip_expression(published: &HashMap<String, u64>) -> Option<Document> {
    if published.is_empty() {
        return None;
    }
    let mut spools: Vec<(&String, &u64)> = published.iter().collect();
    spools.sort();
    let passed: Vec<Document> = spools
        .into_iter()
        .map(|(field, c)| {
            doc! { "$and": [
                { "$eq": ["$$e.k", field.as_str()] },
                { "$lt": [{ "$max": "$$e.v" }, *c as i64] },
            ] }
        })
        .collect();
    let kept = doc! { "$filter": {
        "input": { "$objectToArray": { "$ifNull": ["$lsns", {}] } },
        "as": "e",
        "cond": { "$not": [{ "$or": passed }] },
    } };
    Some(doc! { "$let": {
        "vars": { "kept": kept },
        "in": { "$cond": [
            { "$eq": [{ "$size": "$$kept" }, 0] },
            "$$REMOVE",
            { "$arrayToObject": "$$kept" },
        ] },
    } })
}

/// The one-statement seal of the buckets `q` finds (MongoDB 5.2+).
pub(super) fn seal_statement(q: Document, published: &HashMap<String, u64>) -> Document {
    let mut set = doc! {
        "closed": true,
        "closedAt": "$$NOW",
        "samples": { "$sortArray": { "input": "$samples", "sortBy": { "ts": 1 } } },
        "avg": avg_expression(),
    };
    if let Some(lsns) = strip_expression(published) {
        set.insert("lsns", lsns);
    }
    doc! {
        "q": q,
        "u": [ { "$set": set } ],
        "multi": true,
    }
}

/// The two-statement seal of the buckets `q` finds, among `ids`, for
/// servers without `$sortArray`.
pub(super) fn legacy_seal_statements(
    ids: &[Bson],
    q: Document,
    now: bson::DateTime,
    published: &HashMap<String, u64>,
) -> Vec<Document> {
    let mut set = doc! { "avg": avg_expression() };
    if let Some(lsns) = strip_expression(published) {
        set.insert("lsns", lsns);
    }
    vec![
        doc! {
            "q": q,
            "u": {
                "$push": { "samples": { "$each": [], "$sort": { "ts": 1 } } },
                "$set": { "closed": true, "closedAt": now },
            },
            "multi": true,
        },
        doc! {
            "q": { "_id": { "$in": ids }, "closed": true, "closedAt": now, "avg": { "$exists": false } },
            "u": [ { "$set": set } ],
            "multi": true,
        },
    ]
}

impl Buckets {
    /// Seals a chunk of the open buckets whose window ended at or before
    /// `now_ms - closer.grace` (their `_id`s found first on the `{closed,
    /// endTs}` index), or, when none is left, of the buckets this run
    /// filled ([`Buckets::full`]). Returns how many it sealed and whether
    /// more may be left: the caller calls again, after letting flushes go
    /// (the hour's seal of 10,000 sensors' buckets is tens of seconds of
    /// the server's time: one statement for all of them held every flush
    /// up that long, and its work grew with the data).
    ///
    /// `published`: the checkpoint each spool published (by `lsns` field
    /// name); a sealed bucket keeps only the `lsns.<spool>` whose pairs
    /// reach that spool's checkpoint, and none once all are past
    /// ([`strip_expression`]).
    pub async fn seal(
        &mut self,
        db: &Database,
        now_ms: i64,
        published: &HashMap<String, u64>,
    ) -> mongodb::error::Result<Sealed> {
        let legacy = match self.legacy_seal {
            Some(l) => l,
            None => {
                let hello = db.run_command(doc! { "hello": 1 }).await?;
                let wire = hello.get_i32("maxWireVersion").unwrap_or(0);
                *self.legacy_seal.insert(wire < WIRE_VERSION_SORT_ARRAY)
            }
        };
        let cutoff = bson::DateTime::from_millis(self.cutoff(now_ms));
        let now = bson::DateTime::from_millis(now_ms);
        let ids: Vec<Bson> = self
            .coll(db)
            .find(open_and_ended(cutoff))
            .projection(doc! { "_id": 1 })
            .hint(mongodb::options::Hint::Keys(
                doc! { "closed": 1, "endTs": 1 },
            ))
            .limit(self.seal_chunk as i64)
            .batch_size(self.seal_chunk as u32)
            .await?
            .try_filter_map(|d| async move { Ok(d.get("_id").cloned()) })
            .try_collect()
            .await?;
        let (ids, q, more) = if !ids.is_empty() {
            let q = chunk_filter(&ids, cutoff);
            let more = ids.len() >= self.seal_chunk || !self.full.is_empty();
            (ids, q, more)
        } else if !self.full.is_empty() {
            let take = self.full.len().min(self.seal_chunk);
            let ids: Vec<Bson> = self.full.drain(..take).collect();
            // (Full, or left with little room: no statement of this run
            // adds to them, whatever their window; a bucket that has more
            // room than `Shape::little_room` is not sealed early.)
            let q = doc! {
                "_id": { "$in": &ids },
                "closed": false,
                "count": { "$gte": self.shape.nearly_full() as i64 },
            };
            (ids, q, !self.full.is_empty())
        } else {
            return Ok(Sealed::default());
        };
        let started = std::time::Instant::now();
        let updates = if legacy {
            legacy_seal_statements(&ids, q, now, published)
        } else {
            vec![seal_statement(q, published)]
        };
        let cmd = doc! {
            "update": &self.collection,
            "updates": updates,
            "ordered": true,
        };
        let reply = statements::send_once(db, &self.concern, cmd, "seal").await?;
        reply.refusal("seal")?;
        if more && !self.seal_chunk_fixed {
            self.seal_chunk = next_seal_chunk(self.seal_chunk, started.elapsed());
        }
        // In the legacy form the second statement touches the same buckets.
        let modified = reply.modified;
        Ok(Sealed {
            buckets: modified / if legacy { 2 } else { 1 },
            more,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    #[test]
    fn a_seal_chunk_is_sized_to_take_a_quarter_second() {
        let ms = std::time::Duration::from_millis;
        // 1.3 ms a bucket: about 190.
        assert_eq!(next_seal_chunk(100, ms(130)), 192);
        assert_eq!(next_seal_chunk(200, ms(500)), 100);
        assert_eq!(next_seal_chunk(100, ms(1)), 400, "fourfold at most");
        assert_eq!(next_seal_chunk(1000, ms(1)), SEAL_CHUNK_MAX);
        assert_eq!(next_seal_chunk(100, ms(60_000)), SEAL_CHUNK_MIN);
    }

    /// On a sharded collection a multi-document update needs no shard key
    /// (MongoDB routes it to every shard); it must not change one.
    #[test]
    fn the_seal_is_an_update_many_that_leaves_the_shard_key_alone() {
        let cutoff = bson::DateTime::from_millis(3_600_000);
        let published: HashMap<String, u64> = [("s00000001".to_string(), 5)].into();
        let ids = [Bson::String("a|0|0".into()), Bson::String("b|0|0".into())];
        let q = chunk_filter(&ids, cutoff);
        let mut statements = vec![seal_statement(q.clone(), &published)];
        statements.extend(legacy_seal_statements(&ids, q, cutoff, &published));
        for st in statements {
            assert_eq!(st.get_bool("multi"), Ok(true), "{st}");
            let q = st.get_document("q").unwrap();
            assert_eq!(
                q.get_document("_id").unwrap(),
                &doc! { "$in": ids.to_vec() },
                "a chunk's buckets only"
            );
            assert!(!st.get_bool("upsert").unwrap_or(false));
            let sets: Vec<&Document> = match st.get("u").unwrap() {
                Bson::Array(stages) => stages
                    .iter()
                    .filter_map(|s| s.as_document()?.get_document("$set").ok())
                    .collect(),
                Bson::Document(u) => u.values().filter_map(|v| v.as_document()).collect(),
                other => panic!("{other}"),
            };
            for set in sets {
                assert!(!set.contains_key("sensorId") && !set.contains_key("startTs"));
            }
        }
    }
}
