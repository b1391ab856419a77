//! Reading rollups back: a sensor's rollup documents (`palletd query
//! --stats --rollup`), and those settled (what `/api/series` takes from a
//! rollup before the windows).

use std::collections::{BTreeMap, HashSet};

use bson::{doc, Document};
use futures_util::TryStreamExt;
use mongodb::Database;

use super::{Entry, Rollups, BLOCK};
use crate::config::RollupSettings;
use crate::store::read::{self, Range};

/// One rollup document as `palletd query --stats --rollup` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupRow {
    pub start_ms: i64,
    pub count: i64,
    pub partial: bool,
    /// field -> (sum, n, min, max, avg, first, last)
    pub fields: BTreeMap<String, [f64; 7]>,
}

/// A sensor's rollups of one interval, in time order; at most `max`
/// documents ([`read::within`]).
pub async fn read_rollups(
    db: &Database,
    collection: &str,
    sensor: &str,
    range: Range,
    max: Option<u64>,
) -> read::Result<Vec<RollupRow>> {
    let coll = db.collection::<Document>(collection);
    let mut find = coll
        .find(read::filter(sensor, "start", range))
        .sort(doc! { "start": 1 });
    if let Some(max) = max {
        find = find.limit(max as i64 + 1);
    }
    let mut cursor = find.await?;
    let mut out = Vec::new();
    let empty = Document::new();
    while let Some(d) = cursor.try_next().await? {
        read::within(out.len() as u64 + 1, max)?;
        let part = |name: &str| d.get_document(name).unwrap_or(&empty).clone();
        let parts = ["sum", "n", "min", "max", "avg", "first", "last"].map(part);
        let mut fields = BTreeMap::new();
        for (field, _) in &parts[0] {
            let v = |i: usize| read::number(parts[i].get(field)).unwrap_or(f64::NAN);
            fields.insert(field.clone(), [v(0), v(1), v(2), v(3), v(4), v(5), v(6)]);
        }
        out.push(RollupRow {
            start_ms: d.get_datetime("start")?.timestamp_millis(),
            count: read::number(d.get("count")).unwrap_or(0.0) as i64,
            partial: d.get_bool("partial").unwrap_or(false),
            fields,
        });
    }
    Ok(out)
}

/// A sensor's settled rollups of `spec` over `from..to` (whole
/// intervals): its documents that are not `partial` and whose interval is
/// not due again in the queue (a late reading recorded, a pass yet to
/// run), so each is what a pass computes from the readings now. At most
/// `max` documents read. The queue is read by the `_id`s of the blocks
/// over the range (an interval in 64), on its `_id` index; entries of one
/// interval each (queued before blocks, by an older palletd) are not
/// looked up: the first pass after an upgrade takes them, all due.
pub async fn settled(
    db: &Database,
    base: &str,
    spec: &RollupSettings,
    sensor: &str,
    (from, to): (i64, i64),
    max: u64,
) -> read::Result<Vec<RollupRow>> {
    let interval = spec.interval_ms();
    let intervals = (to - from).div_euclid(interval) as u64;
    if intervals > max {
        return Err(read::QueryError::TooMuch(format!(
            "{intervals} intervals of rollup {}: more than {max}",
            spec.name
        )));
    }
    let range = Range {
        from: Some(from),
        to: Some(to),
    };
    let coll = Rollups::collection_of(base, spec);
    let rows = read_rollups(db, &coll, sensor, range, Some(max)).await?;
    let span = interval * BLOCK;
    let ids: Vec<String> = (from.div_euclid(span) * span..to)
        .step_by(span as usize)
        .map(|start| format!("{}|b{start}|{sensor}", spec.name))
        .collect();
    let mut due = HashSet::new();
    let mut cursor = db
        .collection::<Document>(&format!("{base}_rollup_due"))
        .find(doc! { "_id": { "$in": ids } })
        .await?;
    while let Some(e) = cursor.try_next().await? {
        if let Some(e) = Entry::parse(&e) {
            due.extend(e.intervals(interval));
        }
    }
    Ok(rows
        .into_iter()
        .filter(|r| !r.partial && !due.contains(&r.start_ms))
        .collect())
}
