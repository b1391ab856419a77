//! The ordered ack queue: one entry per received message, in arrival order,
//! with the LSN after the message's last spool record. A message may be
//! acknowledged once the spool is durable up to that LSN; only the durable
//! prefix is released, so PUBACKs leave in the order the PUBLISHes arrived
//! (MQTT 3.1.1 §4.6). Sans-IO.

use std::collections::VecDeque;

/// Messages waiting for their spool records to become durable.
#[derive(Debug)]
pub(crate) struct AckQueue<T> {
    entries: VecDeque<(u64, T)>,
}

impl<T> Default for AckQueue<T> {
    fn default() -> Self {
        AckQueue {
            entries: VecDeque::new(),
        }
    }
}

impl<T> AckQueue<T> {
    /// Adds a message whose records all lie below `end` (an LSN).
    pub fn push(&mut self, end: u64, token: T) {
        self.entries.push_back((end, token));
    }

    /// Releases, oldest first, the messages whose records are all below
    /// `durable`; stops at the first that is not, to keep arrival order.
    pub(crate) fn pop_ready(&mut self, durable: u64, mut f: impl FnMut(T)) -> usize {
        let mut released = 0;
        while self.entries.front().is_some_and(|(end, _)| *end <= durable) {
            if let Some((_, t)) = self.entries.pop_front() {
                released += 1;
                f(t);
            }
        }
        released
    }

    /// The oldest message not yet released.
    pub(crate) fn oldest(&self) -> Option<&T> {
        self.entries.front().map(|(_, t)| t)
    }

    /// Messages received and not yet released.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_leave_in_arrival_order_once_durable() {
        let mut q = AckQueue::default();
        q.push(12, 'a');
        q.push(13, 'b');
        q.push(13, 'c'); // a redelivery: nothing new to wait for
        q.push(20, 'd');
        let mut out = Vec::new();
        assert_eq!(q.pop_ready(11, |t| out.push(t)), 0);
        assert_eq!(q.pop_ready(13, |t| out.push(t)), 3);
        assert_eq!(out, vec!['a', 'b', 'c']);
        assert_eq!(q.oldest(), Some(&'d'));
        q.pop_ready(25, |t| out.push(t));
        assert_eq!(out.last(), Some(&'d'));
        assert!(q.is_empty());
    }
}
