//! The ordered ack queue: one entry per received message, in arrival order,
//! counting the items (samples and dead letters) that must become durable
//! before the message may be acknowledged. Only the resolved prefix is
//! released, so PUBACKs leave in the order the PUBLISHes arrived
//! (MQTT 3.1.1 §4.6). Sans-IO.

use std::collections::VecDeque;

#[derive(Debug)]
struct Entry<T> {
    remaining: u32,
    token: Option<T>,
}

/// Messages waiting for their items to become durable.
#[derive(Debug)]
pub struct AckQueue<T> {
    entries: VecDeque<Entry<T>>,
    /// Sequence number of `entries[0]`.
    first: u64,
}

impl<T> Default for AckQueue<T> {
    fn default() -> Self {
        AckQueue {
            entries: VecDeque::new(),
            first: 0,
        }
    }
}

impl<T> AckQueue<T> {
    /// Adds a message with `items` pending items; returns its sequence number.
    /// `token` is what acknowledges it (`None` for QoS 0).
    pub fn push(&mut self, token: Option<T>, items: u32) -> u64 {
        let seq = self.first + self.entries.len() as u64;
        self.entries.push_back(Entry {
            remaining: items,
            token,
        });
        seq
    }

    /// Marks `n` items of message `seq` durable.
    ///
    /// Resolving more items than were pushed is a bug in the caller (each
    /// sample and dead letter is resolved exactly once), checked in debug.
    pub fn resolve(&mut self, seq: u64, n: u32) {
        let Some(idx) = seq.checked_sub(self.first) else {
            debug_assert!(false, "resolve of an already released message {seq}");
            return;
        };
        if let Some(e) = self.entries.get_mut(idx as usize) {
            debug_assert!(e.remaining >= n, "message {seq} resolved too often");
            e.remaining = e.remaining.saturating_sub(n);
        }
    }

    /// Releases the resolved prefix, oldest first.
    pub fn pop_ready(&mut self, mut f: impl FnMut(T)) -> usize {
        let mut released = 0;
        while self.entries.front().is_some_and(|e| e.remaining == 0) {
            if let Some(e) = self.entries.pop_front() {
                self.first += 1;
                released += 1;
                if let Some(t) = e.token {
                    f(t);
                }
            }
        }
        released
    }

    /// The token of the oldest message not yet released.
    pub fn oldest(&self) -> Option<&T> {
        self.entries.front().and_then(|e| e.token.as_ref())
    }

    /// Messages received and not yet released.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_leave_in_arrival_order() {
        let mut q = AckQueue::default();
        let a = q.push(Some('a'), 2);
        let b = q.push(Some('b'), 1);
        let c = q.push(None, 1);
        let d = q.push(Some('d'), 1);
        q.resolve(b, 1);
        q.resolve(d, 1);
        let mut out = Vec::new();
        assert_eq!(q.pop_ready(|t| out.push(t)), 0, "a blocks the rest");
        q.resolve(a, 1);
        q.resolve(a, 1);
        q.pop_ready(|t| out.push(t));
        assert_eq!(out, vec!['a', 'b']);
        q.resolve(c, 1);
        q.pop_ready(|t| out.push(t));
        assert_eq!(out, vec!['a', 'b', 'd']);
        assert!(q.is_empty());
        let e = q.push(Some('e'), 0);
        assert_eq!(e, 4);
        q.pop_ready(|t| out.push(t));
        assert_eq!(out.last(), Some(&'e'));
    }
}
