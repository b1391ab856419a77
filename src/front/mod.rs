//! The front door's decisions, sans-IO: which MQTT sessions palletd opens
//! and what each subscribes ([`plan`]), what each does on the broker's
//! packets: subscribe, take off, recognise a redelivery, trust a shared
//! subscription, retire ([`session`]), and what the broker can still
//! resend, kept across restarts ([`window`]), what a retained message is
//! ([`retained`]: the last value taken in from each topic), and the
//! ordered queue that
//! releases PUBACKs in arrival order once what they acknowledge is durable
//! ([`acks`]). The ingest task feeds a [`session::Session`] per connection
//! and carries out its actions; the spool keeps the [`window::Windows`];
//! the admission holds the [`acks::AckQueue`].
//!
//! `tests.rs` plays a broker against these types, through reconnects,
//! lost PUBACKs, redeliveries, packet ids that wrap, several sessions, a
//! change of `connections`, a broker without shared subscriptions and
//! crashes, and checks that every message is admitted exactly once.

pub(crate) mod acks;
pub mod plan;
pub(crate) mod retained;
pub(crate) mod session;
#[cfg(test)]
mod tests;
pub(crate) mod window;
