//! Waiting before trying again: capped exponential backoff with full
//! jitter, shared by the broker connection and the database writes, and the
//! one way a retry loop ends early (shutdown gave up).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Shutdown gave up while something was still being retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("gave up: shutdown deadline passed")]
pub(crate) struct Aborted;

/// Capped exponential backoff with full jitter: by default 100 ms
/// doubling to 30 s (the broker connection, the database); every wait
/// before trying again in palletd is one of these.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    first: Duration,
    cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(Self::FIRST, Self::CAP)
    }
}

impl Backoff {
    pub(crate) const FIRST: Duration = Duration::from_millis(100);
    pub(crate) const CAP: Duration = Duration::from_secs(30);

    /// From `first`, doubling, up to `cap`.
    pub fn new(first: Duration, cap: Duration) -> Backoff {
        Backoff {
            next: first,
            first,
            cap,
        }
    }

    /// The next delay: uniformly between half and all of the current step.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(self.cap);
        let half = step / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// Back to the first step (after a success).
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }

    /// Sleeps for the next delay, or returns `Aborted` when `abort` fires.
    pub(crate) async fn wait(&mut self, abort: &CancellationToken) -> Result<(), Aborted> {
        let d = self.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(d) => Ok(()),
            _ = abort.cancelled() => {
                tracing::warn!("Shutdown deadline reached while retrying.");
                Err(Aborted)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<Duration> = (0..20).map(|_| b.next_delay()).collect();
        assert!(delays[0] <= Backoff::FIRST);
        assert!(delays.iter().all(|d| *d <= Backoff::CAP));
        assert!(delays[19] >= Backoff::CAP / 2);
        b.reset();
        assert!(b.next_delay() <= Backoff::FIRST);
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(50), ms(200));
        let delays: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
        assert!(delays[0] >= ms(25) && delays[0] <= ms(50), "{delays:?}");
        assert!(delays[5] >= ms(100) && delays[5] <= ms(200), "{delays:?}");
    }
}
