//! What the sections' raw forms share. Each section's file holds its raw
//! form (the TOML as written: plain serde structs, no validation beyond
//! types), its validation and its settings; durations and sizes are kept as
//! written (strings) so that validation can report every bad value with its
//! path instead of stopping at the first.

use serde::Deserialize;

/// A size written either as a number of bytes or as a string like `"256KiB"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawSize {
    Bytes(u64),
    Text(String),
}
