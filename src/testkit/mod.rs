//! The test kit (the `testkit` feature: the tests, the benchmark and the
//! examples turn it on; the daemon and the Debian package are built
//! without it): the services palletd runs against, started on free ports
//! with their own directories ([`Broker`], [`Aedes`], [`Database`]; the
//! tests', the benchmark's and, through `examples/services.rs`, the
//! demo's), and
//! the proxy that slows, cuts and injects faults between palletd and them
//! ([`netem`]). A missing service binary is a panic that names the command
//! installing it ([`INSTALL_HINT`]).

pub mod netem;
mod services;

pub use services::*;
