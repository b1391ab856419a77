//! What palletd sets up in the database at start-up, idempotently: the
//! bucket indexes and the retention (TTL) indexes.
//!
//! Retention follows the configuration on every start: a TTL index that is
//! missing is created, one whose `expireAfterSeconds` differs is changed in
//! place with `collMod` (no rebuild, no error), and one that is no longer
//! configured is dropped.

use std::time::Duration;

use bson::{doc, Document};
use futures_util::TryStreamExt;
use mongodb::options::IndexOptions;
use mongodb::{Database, IndexModel};
use tracing::info;

use crate::config::Settings;

/// Name of the TTL index on the buckets' `endTs`.
pub const BUCKET_TTL_INDEX: &str = "endTs_ttl";
/// Name of the TTL index on the dead letters' `receivedAt`.
pub const DEADLETTER_TTL_INDEX: &str = "receivedAt_ttl";

/// The indexes the buckets need: range reads, the closer, applied LSNs.
pub fn bucket_indexes() -> Vec<IndexModel> {
    vec![
        IndexModel::builder()
            .keys(doc! { "sensorId": 1, "startTs": 1 })
            .build(),
        IndexModel::builder()
            .keys(doc! { "closed": 1, "endTs": 1 })
            .build(),
        // Each sensor's highest applied spool LSN (exactly-once writes).
        IndexModel::builder()
            .keys(doc! { "sensorId": 1, "lsn": -1 })
            .build(),
    ]
}

/// Creates the indexes and brings the TTL indexes in line with `settings`.
pub async fn ensure(db: &Database, settings: &Settings) -> mongodb::error::Result<()> {
    let buckets = &settings.mongodb.collection;
    db.collection::<Document>(buckets)
        .create_indexes(bucket_indexes())
        .await?;
    sync_ttl(
        db,
        buckets,
        "endTs",
        BUCKET_TTL_INDEX,
        settings.retention.expire_after,
    )
    .await?;
    sync_ttl(
        db,
        &settings.mongodb.deadletter_collection(),
        "receivedAt",
        DEADLETTER_TTL_INDEX,
        settings.retention.deadletter_expire_after,
    )
    .await
}

/// The `expireAfterSeconds` of the index `name`, if it exists.
pub async fn ttl_of(
    db: &Database,
    coll: &str,
    name: &str,
) -> mongodb::error::Result<Option<Duration>> {
    let cursor = match db.collection::<Document>(coll).list_indexes().await {
        Ok(c) => c,
        // NamespaceNotFound: no collection yet, so no index.
        Err(e) if matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 26) => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let indexes: Vec<IndexModel> = cursor.try_collect().await?;
    Ok(indexes
        .into_iter()
        .filter_map(|i| i.options)
        .find(|o| o.name.as_deref() == Some(name))
        .map(|o| o.expire_after.unwrap_or_default()))
}

async fn sync_ttl(
    db: &Database,
    coll: &str,
    field: &str,
    name: &str,
    want: Option<Duration>,
) -> mongodb::error::Result<()> {
    let have = ttl_of(db, coll, name).await?;
    match (have, want) {
        (None, Some(after)) => {
            let index = IndexModel::builder()
                .keys(doc! { field: 1 })
                .options(
                    IndexOptions::builder()
                        .name(name.to_string())
                        .expire_after(after)
                        .build(),
                )
                .build();
            db.collection::<Document>(coll).create_index(index).await?;
            info!(collection = coll, expire_after = %humantime::format_duration(after), "Retention index created.");
        }
        (Some(old), Some(after)) if old != after => {
            db.run_command(doc! {
                "collMod": coll,
                "index": { "name": name, "expireAfterSeconds": after.as_secs() as i64 },
            })
            .await?;
            info!(
                collection = coll,
                from = %humantime::format_duration(old),
                to = %humantime::format_duration(after),
                "Retention changed."
            );
        }
        (Some(_), None) => {
            db.collection::<Document>(coll).drop_index(name).await?;
            info!(collection = coll, "Retention removed: documents are kept.");
        }
        _ => {}
    }
    Ok(())
}
