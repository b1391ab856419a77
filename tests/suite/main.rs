//! palletd's integration tests: one test binary, a module per area, so the
//! crate and the harness (`common`) are compiled and linked once (22
//! binaries took 22 links of the whole crate, and let each area's slowest
//! test hold the next area back).
//!
//! Each area runs against a real Mosquitto and a real SecantusDB that the
//! harness starts per test (`common`). One area, or one test:
//! `scripts/test --test suite service::` or
//! `scripts/test --test suite kit::a_sensors_charts`.

mod common;

mod cli;
mod connections;
mod corpus;
mod dbfaults;
mod devices;
mod disk;
mod end_to_end;
mod faults;
mod fleet;
mod front_door;
mod hostile;
mod kit;
mod layout;
mod lifecycle;
mod mqtt5;
mod operator;
mod rabbit;
mod reference;
mod retained;
mod rollups;
mod security;
mod service;
mod sparkplug;
mod thinning;
mod timeseries;
mod wan;
