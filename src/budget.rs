//! A byte budget shared by a producer and a consumer: what a queue between
//! two tasks may hold, counted in bytes, not items (a million small items
//! and a thousand large ones are not the same memory).
//!
//! The producer adds what it hands on and the consumer takes it off; the
//! producer either waits while the budget is spent ([`Budget::over`],
//! [`Budget::room`]: ingest stops reading from the broker) or leaves the
//! item where it is ([`Budget::try_add`]: the admission's feed, whose items
//! are on disk anyway).

use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicUsize,
    limit: usize,
    freed: tokio::sync::Notify,
}

impl Budget {
    pub fn new(limit: usize) -> Budget {
        Budget {
            used: AtomicUsize::new(0),
            limit,
            freed: tokio::sync::Notify::new(),
        }
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Adds `n` bytes, whatever the budget says (the producer checks
    /// [`Budget::over`] before taking more).
    pub fn add(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` bytes if they fit; false (nothing added) if they do not.
    /// One item larger than the whole budget fits into an empty one, so
    /// nothing is refused for good.
    pub(crate) fn try_add(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            if used > 0 && used + n > self.limit {
                return false;
            }
            match self.used.compare_exchange_weak(
                used,
                used + n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    /// Takes `n` bytes off (the consumer took the item).
    pub(crate) fn sub(&self, n: usize) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(n))
            });
        self.freed.notify_waiters();
    }

    /// Whether the budget is spent.
    pub(crate) fn over(&self) -> bool {
        self.used() >= self.limit
    }

    /// Resolves once the budget is not spent (at once if it is not now).
    /// Registers for the wake-up before looking, so bytes taken off in
    /// between are not missed.
    pub(crate) async fn room(&self) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if !self.over() {
                return;
            }
            freed.await;
        }
    }
}

/// Bytes held in a budget until dropped (the last clone gives them back).
#[derive(Debug)]
pub(crate) struct Held {
    budget: std::sync::Arc<Budget>,
    bytes: usize,
}

impl Held {
    /// Takes `bytes` from `budget` if they fit ([`Budget::try_add`]).
    pub(crate) fn try_take(budget: &std::sync::Arc<Budget>, bytes: usize) -> Option<Held> {
        budget.try_add(bytes).then(|| Held {
            budget: budget.clone(),
            bytes,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_fit_or_wait_and_one_large_item_fits_an_empty_budget() {
        let b = Budget::new(100);
        assert!(b.try_add(60));
        assert!(!b.try_add(50), "60 + 50 > 100");
        assert!(b.try_add(40));
        assert!(b.over());
        b.sub(100);
        assert!(!b.over());
        assert!(b.try_add(1000), "alone, however large");
        assert!(!b.try_add(1));
    }

    #[tokio::test]
    async fn room_is_seen_however_the_taking_off_and_the_waiting_interleave() {
        let b = std::sync::Arc::new(Budget::new(10));
        b.add(10);
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.room().await }
        });
        tokio::task::yield_now().await;
        b.sub(5);
        tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .unwrap();
        b.sub(5);
        b.room().await;
    }
}
