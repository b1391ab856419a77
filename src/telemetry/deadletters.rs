//! Counting and logging what went to the dead letter: a counter by cause,
//! and each cause logged at most once a minute with how many were
//! suppressed since (nothing per message above DEBUG otherwise). The parts
//! that refuse readings (the admission, the pipeline through its task) report
//! here; the causes are [`crate::deadletter::CAUSES`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often one cause of rejection is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Counts rejections by cause and logs each cause at most once a minute,
/// with how many were suppressed since.
#[derive(Default)]
pub struct Reporter {
    last: HashMap<&'static str, (Instant, u64)>,
    /// The same for fields left out of stored readings.
    dropped: HashMap<&'static str, (Instant, u64)>,
}

impl Reporter {
    /// Counts `n` readings dead-lettered for `cause` and maybe logs it.
    pub(crate) fn report(&mut self, cause: &'static str, subject: &str, error: &str, n: u64) {
        debug_assert!(
            crate::deadletter::CAUSES.contains(&cause),
            "{cause} is not in CAUSES"
        );
        metrics::counter!(super::DEAD_LETTERS, "cause" => cause).increment(n);
        let now = Instant::now();
        match self.last.get_mut(cause) {
            Some((at, suppressed)) if now.duration_since(*at) < LOG_EVERY => {
                *suppressed += n;
            }
            Some((at, suppressed)) => {
                tracing::warn!(
                    cause,
                    subject,
                    error,
                    suppressed = *suppressed,
                    "Reading sent to the dead letter."
                );
                *at = now;
                *suppressed = n.saturating_sub(1);
            }
            None => {
                tracing::warn!(cause, subject, error, "Reading sent to the dead letter.");
                self.last.insert(cause, (now, n.saturating_sub(1)));
            }
        }
    }

    /// Counts a field left out of a stored reading (the reading is kept)
    /// and logs its cause at most once a minute.
    pub(crate) fn dropped(&mut self, cause: &'static str, subject: &str, error: &str) {
        metrics::counter!(super::FIELDS_DROPPED, "cause" => cause).increment(1);
        let now = Instant::now();
        match self.dropped.get_mut(cause) {
            Some((at, suppressed)) if now.duration_since(*at) < LOG_EVERY => *suppressed += 1,
            entry => {
                let suppressed = entry.map_or(0, |e| e.1);
                tracing::warn!(
                    cause,
                    subject,
                    error,
                    suppressed,
                    "Field left out of a stored reading."
                );
                self.dropped.insert(cause, (now, 0));
            }
        }
    }
}
