//! A proxy in front of the database that loses the reply to one write
//! after the server applied it (an ambiguous write): palletd's fault
//! injector ([`palletd::testkit::netem::faults`]) with one rule, armed by the test.

use std::sync::Arc;
use std::time::Duration;

use palletd::testkit::netem::faults::{Fault, Plan, Rule};
use palletd::testkit::netem::Proxy;

pub struct CutProxy {
    proxy: Proxy,
    plan: Arc<Plan>,
    command: &'static str,
    marker: Option<&'static [u8]>,
}

impl CutProxy {
    /// Cuts after the next bucket write (an `update` with `$push`) once armed.
    pub async fn start(upstream: u16) -> CutProxy {
        Self::start_cutting(upstream, "update", Some(b"$push")).await
    }

    /// Cuts after the next `command` (holding `marker`) once armed.
    pub async fn start_cutting(
        upstream: u16,
        command: &'static str,
        marker: Option<&'static [u8]>,
    ) -> CutProxy {
        let plan = Plan::new(0, Duration::ZERO);
        let proxy = Proxy::faults(upstream, plan.clone()).await.unwrap();
        CutProxy {
            proxy,
            plan,
            command,
            marker,
        }
    }

    pub fn port(&self) -> u16 {
        self.proxy.port
    }

    pub fn arm(&self) {
        self.plan.add(Rule {
            collection: Some("readings"),
            marker: self.marker,
            ..Rule::once(self.command, Fault::ResetAfterSend)
        });
    }

    /// Replies lost so far.
    pub fn cuts(&self) -> u64 {
        self.plan.injected(Fault::ResetAfterSend)
    }

    pub fn uri(&self) -> String {
        self.proxy.mongodb_uri("")
    }
}
