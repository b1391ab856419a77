//! What palletd sets up in the database at start-up, idempotently: the
//! bucket indexes and the retention (TTL) indexes, or in `timeseries` mode
//! the time series collection.
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

use crate::config::{Settings, StorageMode};

/// Why the schema could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(transparent)]
    Database(#[from] mongodb::error::Error),
    /// The collection exists in a shape palletd must not write into.
    #[error("{0}")]
    Mismatch(String),
}

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

/// Creates the collection's indexes (or the time series collection) and
/// brings retention in line with `settings`.
pub async fn ensure(db: &Database, settings: &Settings) -> Result<(), SchemaError> {
    let coll = &settings.mongodb.collection;
    match settings.storage.mode {
        StorageMode::Buckets => {
            db.collection::<Document>(coll)
                .create_indexes(bucket_indexes())
                .await?;
            sync_ttl(
                db,
                coll,
                "endTs",
                BUCKET_TTL_INDEX,
                settings.retention.expire_after,
            )
            .await?;
        }
        StorageMode::Timeseries => ensure_timeseries(db, settings).await?,
    }
    sync_ttl(
        db,
        &settings.mongodb.deadletter_collection(),
        "receivedAt",
        DEADLETTER_TTL_INDEX,
        settings.retention.deadletter_expire_after,
    )
    .await?;
    Ok(())
}

/// The collection's `listCollections` entry, if it exists.
async fn collection_info(db: &Database, name: &str) -> mongodb::error::Result<Option<Document>> {
    let reply = db
        .run_command(doc! { "listCollections": 1, "filter": { "name": name } })
        .await?;
    Ok(reply
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_array("firstBatch").ok())
        .and_then(|b| b.first())
        .and_then(|d| d.as_document())
        .cloned())
}

/// Creates the time series collection if it is missing (`timeField: "ts"`,
/// `metaField: "sensorId"`, the configured granularity, `expireAfterSeconds`
/// from `retention.expire_after`), refuses a collection of another shape,
/// and follows a changed retention with `collMod`.
async fn ensure_timeseries(db: &Database, settings: &Settings) -> Result<(), SchemaError> {
    let name = &settings.mongodb.collection;
    let want_ttl = settings.retention.expire_after;
    let info = match collection_info(db, name).await? {
        Some(info) => info,
        None => {
            let mut create = doc! {
                "create": name,
                "timeseries": {
                    "timeField": "ts",
                    "metaField": "sensorId",
                    "granularity": settings.storage.granularity,
                },
            };
            if let Some(ttl) = want_ttl {
                create.insert("expireAfterSeconds", ttl.as_secs() as i64);
            }
            match db.run_command(create).await {
                Ok(_) => info!(
                    collection = %name,
                    granularity = settings.storage.granularity,
                    "Time series collection created."
                ),
                // 48 NamespaceExists: created meanwhile; checked below.
                Err(e) if matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 48) =>
                    {}
                Err(e) => return Err(e.into()),
            }
            collection_info(db, name).await?.unwrap_or_default()
        }
    };
    let options = info.get_document("options").cloned().unwrap_or_default();
    let ts = options.get_document("timeseries").ok();
    let fields = ts.map(|t| (t.get_str("timeField").ok(), t.get_str("metaField").ok()));
    if info.get_str("type").ok() != Some("timeseries")
        || fields != Some((Some("ts"), Some("sensorId")))
    {
        return Err(SchemaError::Mismatch(format!(
            "collection {name:?} exists but is not a time series collection with timeField \"ts\" and \
             metaField \"sensorId\"; storage.mode = \"timeseries\" needs another mongodb.collection \
             (or drop this one)"
        )));
    }
    if let Some(g) = ts.and_then(|t| t.get_str("granularity").ok()) {
        if g != settings.storage.granularity {
            tracing::warn!(
                collection = %name,
                have = g,
                configured = settings.storage.granularity,
                "The time series collection keeps the granularity it was created with."
            );
        }
    }
    let have_ttl = match options.get("expireAfterSeconds") {
        Some(bson::Bson::Int32(n)) => Some(Duration::from_secs((*n).max(0) as u64)),
        Some(bson::Bson::Int64(n)) => Some(Duration::from_secs((*n).max(0) as u64)),
        _ => None,
    };
    if have_ttl != want_ttl {
        let value = want_ttl.map_or(bson::Bson::from("off"), |t| {
            bson::Bson::Int64(t.as_secs() as i64)
        });
        db.run_command(doc! { "collMod": name, "expireAfterSeconds": value })
            .await?;
        info!(collection = %name, expire_after = ?want_ttl, "Retention changed.");
    }
    // MongoDB 6.3+ creates this index itself; 5.0 does not.
    db.collection::<Document>(name)
        .create_index(
            IndexModel::builder()
                .keys(doc! { "sensorId": 1, "ts": 1 })
                .build(),
        )
        .await?;
    Ok(())
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
