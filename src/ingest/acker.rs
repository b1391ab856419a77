//! Acknowledgements: the [`Acker`] the admission releases PUBACKs through (in
//! arrival order, once durable), each message's [`AckToken`], the sessions'
//! resets and the per-connection counters.

use super::*;

/// What is needed to acknowledge a PUBLISH: which connection it came on,
/// and its packet id there; or, for a reset (the broker kept no session),
/// that its record is durable and the connection may subscribe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AckToken {
    pub(super) conn: u8,
    pub(super) qos: QoS,
    pub(super) pkid: u16,
    pub(super) reset: bool,
    /// The connection's generation when the message arrived
    /// ([`Generations`]): a PUBACK of an earlier one is not sent.
    pub(super) gen: u32,
}

/// Per connection index, how many times its link failed: the generation
/// of what arrives on it. A PUBACK released after the link its message
/// came on failed is held over to the next connection by the client, and
/// there its packet id may name another message: a broker that renumbers
/// its resends (RabbitMQ) numbers the new connection's messages from 1,
/// so it would acknowledge one palletd has not spooled. Such a PUBACK is
/// not sent, whatever the broker: on a resumed session the broker resends
/// every message it got no PUBACK for (MQTT 3.1.1 §4.4), and the resend is
/// acknowledged when it arrives (a redelivery, under the id it has then).
/// The check and the hand-over to the client happen under the
/// connection's lock, which the event loop takes to move to the next
/// generation and empty the client's channel of PUBACKs (rumqttc's
/// `EventLoop::clean`): none of an earlier generation reaches the wire.
#[derive(Debug)]
pub(crate) struct Generations(Vec<std::sync::Mutex<u32>>);

impl Generations {
    pub(super) fn new() -> Self {
        Generations((0..256).map(|_| Default::default()).collect())
    }

    /// The generation of what arrives on `conn` now.
    pub(super) fn current(&self, conn: usize) -> u32 {
        *self.lock(conn)
    }

    pub(super) fn lock(&self, conn: usize) -> std::sync::MutexGuard<'_, u32> {
        self.0[conn].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Sends acknowledgements without ever blocking, in order on each
/// connection.
///
/// rumqttc's request channel can fill when the broker sends faster than the
/// event loop writes PUBACKs; an acknowledgement that does not fit waits
/// here (with every later one of its connection behind it, to keep arrival
/// order) and is retried by [`Acker::retry`], never dropped. A connection's
/// full channel holds up no other connection's acknowledgements.
pub(crate) struct Acker {
    /// By connection index (`None`: no such connection).
    pub(super) clients: Vec<Option<Client>>,
    pub(super) waiting: Vec<std::collections::VecDeque<AckToken>>,
    /// Acknowledgements handed to each connection's event loop.
    pub(super) acked: Arc<Counters>,
    /// Acknowledgements not sent: their connection failed since
    /// ([`Generations`]).
    pub(super) stale: Arc<Counters>,
    pub(super) gens: Arc<Generations>,
    /// Resets made durable, told to each connection.
    pub(super) resets: Arc<Resets>,
    pub(super) queued: usize,
}

/// Per connection index: resets whose record is durable, and the
/// connection's wake-up.
#[derive(Debug)]
pub(crate) struct Resets {
    pub(super) done: Vec<std::sync::atomic::AtomicU32>,
    pub(super) wake: Vec<tokio::sync::Notify>,
}

impl Resets {
    pub(super) fn new() -> Self {
        Resets {
            done: (0..256).map(|_| Default::default()).collect(),
            wake: (0..256).map(|_| Default::default()).collect(),
        }
    }

    pub(super) fn tell(&self, conn: usize) {
        self.done[conn].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.wake[conn].notify_one();
    }

    /// Resets made durable since the last call.
    pub(super) fn take(&self, conn: usize) -> u32 {
        self.done[conn].swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Per connection index: acknowledgements handed to its event loop (a
/// retiring session is done when it has acknowledged all it received).
#[derive(Debug)]
pub(crate) struct Counters(Vec<std::sync::atomic::AtomicU64>);

impl Counters {
    pub(super) fn new() -> Self {
        Counters((0..256).map(|_| Default::default()).collect())
    }

    pub(super) fn get(&self, conn: usize) -> u64 {
        self.0[conn].load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) fn add(&self, conn: usize) {
        self.0[conn].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Acker {
    pub(crate) fn ack(&mut self, token: AckToken) {
        self.waiting[token.conn as usize].push_back(token);
        self.queued += 1;
        self.retry_one(token.conn as usize);
    }

    pub(super) fn retry_one(&mut self, conn: usize) -> bool {
        let Some(client) = &self.clients[conn] else {
            // Never: a token comes from a connection that exists.
            self.queued -= self.waiting[conn].len();
            self.waiting[conn].clear();
            return true;
        };
        let gen = self.gens.lock(conn);
        while let Some(token) = self.waiting[conn].front().copied() {
            if token.reset {
                self.resets.tell(conn);
            } else if token.gen != *gen {
                self.stale.add(conn);
            } else if client.try_ack(token) {
                self.acked.add(conn);
            } else {
                // Full (or, at shutdown, closed): try again later.
                return false;
            }
            self.waiting[conn].pop_front();
            self.queued -= 1;
        }
        true
    }

    /// Queues the waiting acknowledgements that now fit; true when none waits.
    pub(crate) fn retry(&mut self) -> bool {
        if self.queued == 0 {
            return true;
        }
        let mut all = true;
        for conn in 0..self.waiting.len() {
            if !self.waiting[conn].is_empty() {
                all &= self.retry_one(conn);
            }
        }
        all
    }

    /// Publishes a message at QoS 0 on the first connection without
    /// waiting; false if the client's queue is full (the message is not
    /// sent).
    pub(crate) fn publish_nowait(&self, topic: String, payload: Vec<u8>) -> bool {
        self.clients[0]
            .as_ref()
            .is_some_and(|c| c.try_publish(topic, QoS::AtMostOnce, payload))
    }

    /// Acknowledgements not yet handed to the event loops.
    pub(crate) fn waiting(&self) -> usize {
        self.queued
    }
}
