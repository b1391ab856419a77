//! The closer: seals buckets whose window ended more than `closer.grace` ago
//! (`closed: true`, `closedAt`, samples sorted by `ts`, `avg.<field> =
//! sum.<field> / n.<field>`), including buckets an earlier run left open.
//!
//! Sealing is one multi-document update that the `{closed: 1, endTs: 1}`
//! index serves, so a run is one round trip whatever the number of buckets.
//! On MongoDB 5.2 and later (and SecantusDB) it is a pipeline update with
//! `$sortArray`; older servers get two statements in the same command: a
//! classic `$push {$each: [], $sort}` that seals and sorts, then a pipeline
//! update that adds `avg` to exactly the buckets the first one sealed.
//!
//! The pipeline runs the closer between flushes, right after a flush, so a
//! bucket is never sealed while a write to it is in flight, and everything
//! received before the run is in its bucket when it is sealed. Each bucket is
//! sealed by one atomic document update; a write that races a seal finds no
//! open bucket and starts a new one of that window (counted as late data).

use bson::{doc, Bson, Document};
use mongodb::Database;

/// First wire version with `$sortArray` (MongoDB 5.2).
const WIRE_VERSION_SORT_ARRAY: i32 = 15;

pub struct Closer {
    collection: String,
    grace_ms: i64,
    /// Whether the server lacks `$sortArray`; learned on the first run.
    legacy: Option<bool>,
}

impl Closer {
    pub fn new(collection: &str, grace: std::time::Duration) -> Self {
        Closer {
            collection: collection.to_string(),
            grace_ms: grace.as_millis() as i64,
            legacy: None,
        }
    }

    /// Forces the update form for servers before 5.2 (for tests).
    pub fn with_legacy_update(mut self, legacy: bool) -> Self {
        self.legacy = Some(legacy);
        self
    }

    /// Buckets whose `endTs` is at or before this are sealed at `now_ms`.
    pub fn cutoff(&self, now_ms: i64) -> i64 {
        now_ms - self.grace_ms
    }

    /// Seals every open bucket whose window ended at or before the cutoff.
    /// Returns how many were sealed.
    pub async fn run(&mut self, db: &Database, now_ms: i64) -> mongodb::error::Result<u64> {
        let legacy = match self.legacy {
            Some(l) => l,
            None => {
                let hello = db.run_command(doc! { "hello": 1 }).await?;
                let wire = hello.get_i32("maxWireVersion").unwrap_or(0);
                *self.legacy.insert(wire < WIRE_VERSION_SORT_ARRAY)
            }
        };
        let cutoff = bson::DateTime::from_millis(self.cutoff(now_ms));
        let now = bson::DateTime::from_millis(now_ms);
        let updates = if legacy {
            legacy_statements(cutoff, now)
        } else {
            vec![seal_statement(cutoff)]
        };
        let reply = db
            .run_command(doc! {
                "update": &self.collection,
                "updates": updates,
                "ordered": true,
                "writeConcern": { "w": "majority" },
            })
            .await?;
        if let Ok(errors) = reply.get_array("writeErrors") {
            if let Some(Bson::Document(e)) = errors.first() {
                return Err(mongodb::error::Error::custom(format!(
                    "seal rejected (code {}): {}",
                    e.get_i32("code").unwrap_or(-1),
                    e.get_str("errmsg").unwrap_or("")
                )));
            }
        }
        // In the legacy form the second statement touches the same buckets.
        Ok(reply.get_i32("nModified").unwrap_or(0).max(0) as u64 / if legacy { 2 } else { 1 })
    }
}

fn open_and_ended(cutoff: bson::DateTime) -> Document {
    doc! { "closed": false, "endTs": { "$lte": cutoff } }
}

/// `avg.<f> = sum.<f> / n.<f>` for every rolled-up field, as an expression
/// that MongoDB 5.0 accepts (`$getField` takes only constant names before 7.2).
fn avg_expression() -> Document {
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

/// The one-statement seal (MongoDB 5.2+).
fn seal_statement(cutoff: bson::DateTime) -> Document {
    doc! {
        "q": open_and_ended(cutoff),
        "u": [ { "$set": {
            "closed": true,
            "closedAt": "$$NOW",
            "samples": { "$sortArray": { "input": "$samples", "sortBy": { "ts": 1 } } },
            "avg": avg_expression(),
        } } ],
        "multi": true,
        "hint": { "closed": 1, "endTs": 1 },
    }
}

/// The two-statement seal for servers without `$sortArray`.
fn legacy_statements(cutoff: bson::DateTime, now: bson::DateTime) -> Vec<Document> {
    vec![
        doc! {
            "q": open_and_ended(cutoff),
            "u": {
                "$push": { "samples": { "$each": [], "$sort": { "ts": 1 } } },
                "$set": { "closed": true, "closedAt": now },
            },
            "multi": true,
            "hint": { "closed": 1, "endTs": 1 },
        },
        doc! {
            "q": { "closed": true, "endTs": { "$lte": cutoff }, "closedAt": now, "avg": { "$exists": false } },
            "u": [ { "$set": { "avg": avg_expression() } } ],
            "multi": true,
            "hint": { "closed": 1, "endTs": 1 },
        },
    ]
}
