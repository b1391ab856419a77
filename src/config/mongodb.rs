//! `[mongodb]`: the database, its collections, write concern and
//! compression.

use super::*;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteConcern {
    Majority,
    Nodes(u32),
}

#[derive(Debug, Clone)]
pub struct MongoSettings {
    pub uri: Secret,
    pub database: String,
    pub collection: String,
    pub write_concern: WriteConcern,
    pub journal: bool,
    /// Wire compression palletd offers the server, in order of preference
    /// (`compressors=` in the URI takes precedence).
    pub compressors: Vec<String>,
    /// The zstd or zlib level (`None`: chosen by where the server is,
    /// [`MongoSettings::compression_level_for`]).
    pub compression_level: Option<i32>,
    /// Every write command's `maxTimeMS`: how long a write palletd lost
    /// sight of can still be running on the server ([`crate::store`]).
    pub write_time_limit: std::time::Duration,
}

/// The wire compressors palletd is built with.
pub const COMPRESSORS: &[&str] = &["zstd", "zlib", "snappy"];

/// zstd's level when the server is on another host: zstd's own default.
/// (`bench wan` at `max_delay = "3s"`, one run each: 56.6 bytes a reading
/// on the link at level 1, 53.3 at 3, 41.0 at 6, 47.0 at 9; how many
/// readings a statement carries matters more. The driver compresses each
/// command with a streaming encoder of the level's full window: level 3's
/// takes 3.7 MB while it lives, higher levels more.)
pub(crate) const REMOTE_ZSTD_LEVEL: i32 = 3;

/// zstd's level when every host of the URI is this machine (no link to
/// spare): the smallest compressor (level 3's takes 3.7 MB while it lives,
/// heaptrack at 10,000 sensors: 7.3 MB of a 28 MB heap; level 1 a quarter).
pub(crate) const LOCAL_ZSTD_LEVEL: i32 = 1;

impl MongoSettings {
    /// The dead-letter collection, `<collection>_deadletter`.
    pub(crate) fn deadletter_collection(&self) -> String {
        format!("{}_deadletter", self.collection)
    }

    /// `<collection>_latest`: each sensor's newest sample (`[latest]`).
    pub(crate) fn latest_collection(&self) -> String {
        format!("{}_latest", self.collection)
    }

    /// The level `compressor` compresses at, for a server at `hosts`:
    /// `compression_level` when set (zlib's at most 9), else zstd at
    /// [`LOCAL_ZSTD_LEVEL`] when every host is a loopback address or a
    /// Unix socket and [`REMOTE_ZSTD_LEVEL`] otherwise, zlib at its own
    /// default. `None` for snappy (no levels).
    pub(crate) fn compression_level_for(
        &self,
        compressor: &str,
        hosts: &[::mongodb::options::ServerAddress],
    ) -> Option<i32> {
        match (compressor, self.compression_level) {
            ("zstd", Some(level)) => Some(level),
            ("zlib", Some(level)) => Some(level.min(9)),
            ("zstd", None) if hosts.iter().all(is_loopback) => Some(LOCAL_ZSTD_LEVEL),
            ("zstd", None) => Some(REMOTE_ZSTD_LEVEL),
            _ => None,
        }
    }
}

/// Whether the server at `a` is this machine.
fn is_loopback(a: &::mongodb::options::ServerAddress) -> bool {
    match a {
        ::mongodb::options::ServerAddress::Tcp { host, .. } => {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        _ => true,
    }
}

impl Validator {
    pub(super) fn mongo(&mut self, m: RawMongo, base: Option<&Path>) -> MongoSettings {
        let uri = match (m.uri, m.uri_file) {
            (Some(_), Some(_)) => {
                self.err("mongodb.uri_file", "set either uri or uri_file, not both");
                String::new()
            }
            (Some(u), None) => u,
            (None, Some(f)) => {
                let p = resolve(base, &f);
                self.warn_if_readable_by_others("mongodb.uri_file", &p);
                match std::fs::read_to_string(&p) {
                    Ok(u) => u.trim().to_string(),
                    Err(e) => {
                        self.err(
                            "mongodb.uri_file",
                            format!("cannot read {}: {e}", p.display()),
                        );
                        String::new()
                    }
                }
            }
            (None, None) => {
                self.err("mongodb.uri", "required: set uri or uri_file");
                String::new()
            }
        };
        if !(uri.is_empty() || uri.starts_with("mongodb://") || uri.starts_with("mongodb+srv://")) {
            self.err(
                "mongodb.uri",
                "must start with mongodb:// or mongodb+srv://",
            );
        }
        check_name(
            self,
            "mongodb.database",
            &m.database,
            &['/', '\\', '.', ' ', '"', '$'],
        );
        let collection = m.collection.unwrap_or_else(|| "readings".into());
        check_name(self, "mongodb.collection", &collection, &['$']);
        if collection.starts_with("system.") {
            self.err("mongodb.collection", "must not start with \"system.\"");
        }
        let write_concern = match m.write_concern {
            None => WriteConcern::Majority,
            Some(RawWriteConcern::Tag(t)) if t == "majority" => WriteConcern::Majority,
            Some(RawWriteConcern::Tag(t)) => {
                self.err(
                    "mongodb.write_concern",
                    format!("must be \"majority\" or a number of nodes, got {t:?}"),
                );
                WriteConcern::Majority
            }
            Some(RawWriteConcern::Nodes(n)) if (1..=50).contains(&n) => {
                WriteConcern::Nodes(n as u32)
            }
            Some(RawWriteConcern::Nodes(n)) => {
                self.err(
                    "mongodb.write_concern",
                    format!("a number of nodes must be between 1 and 50, got {n} (0 would not wait for the write)"),
                );
                WriteConcern::Majority
            }
        };
        let journal = m.journal.unwrap_or(true);
        if let WriteConcern::Nodes(n) = write_concern {
            self.warnings.push(format!(
                "mongodb.write_concern = {n}: a write is acknowledged once {n} node(s) have it; if that is not a majority of the replica set's voting members, an election can roll it back after palletd counted it as stored, and the reading is lost. \"majority\" (the default) gives the exactly-once the README describes"
            ));
        }
        if !journal {
            self.warnings.push(
                "mongodb.journal = false: a write is acknowledged before it is in the server's journal; a server crash can lose it after palletd counted it as stored. journal = true (the default) gives the exactly-once the README describes".into(),
            );
        }
        let compressors = m.compressors.unwrap_or_else(|| vec!["zstd".into()]);
        for c in &compressors {
            if !COMPRESSORS.contains(&c.as_str()) {
                self.err(
                    "mongodb.compressors",
                    format!(
                        "unknown compressor {c:?} (one of {})",
                        COMPRESSORS.join(", ")
                    ),
                );
            }
        }
        let compression_level = m.compression_level.and_then(|level| {
            if (1..=22).contains(&level) {
                Some(level as i32)
            } else {
                self.err(
                    "mongodb.compression_level",
                    format!("must be between 1 and 22 (zlib's at most 9), got {level}"),
                );
                None
            }
        });
        let write_time_limit = self.positive_duration(
            "mongodb.write_time_limit",
            m.write_time_limit.as_deref(),
            "10s",
        );
        if write_time_limit < std::time::Duration::from_millis(100) {
            self.err("mongodb.write_time_limit", "must be at least 100ms");
        }
        MongoSettings {
            uri: Secret::new(uri),
            database: m.database,
            collection,
            write_concern,
            journal,
            compressors,
            compression_level,
            write_time_limit,
        }
    }
}

/// A write concern: `"majority"` or a number of nodes.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawWriteConcern {
    Nodes(i64),
    Tag(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMongo {
    pub uri: Option<String>,
    pub uri_file: Option<String>,
    pub database: String,
    pub collection: Option<String>,
    pub write_concern: Option<RawWriteConcern>,
    pub journal: Option<bool>,
    pub compressors: Option<Vec<String>>,
    pub compression_level: Option<i64>,
    pub write_time_limit: Option<String>,
}
