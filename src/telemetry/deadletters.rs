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
}

impl Reporter {
    /// Counts `n` readings dead-lettered for `cause` and maybe logs it.
    pub fn report(&mut self, cause: &'static str, subject: &str, error: &str, n: u64) {
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
}
