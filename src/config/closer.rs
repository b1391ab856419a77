//! `[closer]`: when buckets whose window is over are sealed.

use super::*;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCloser {
    pub interval: Option<String>,
    pub grace: Option<String>,
}

#[derive(Debug, Clone)]
pub struct CloserSettings {
    /// How often the closer runs.
    pub interval: Duration,
    /// A bucket is sealed once its window ended more than this long ago, so
    /// samples that arrive a little late still join the open bucket.
    pub grace: Duration,
}

impl Validator {
    pub(super) fn closer(&mut self, c: RawCloser) -> CloserSettings {
        CloserSettings {
            interval: self.positive_duration("closer.interval", c.interval.as_deref(), "1m"),
            grace: self.duration("closer.grace", c.grace.as_deref(), "5m"),
        }
    }
}
