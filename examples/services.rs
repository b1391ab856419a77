//! Mosquitto and SecantusDB on free local ports, started as the tests and
//! the benchmark start them (palletd's test kit), until SIGINT or SIGTERM;
//! then both are stopped. `scripts/demo` runs palletd against them.
//!
//! ```text
//! cargo run --example services -- ["<extra mosquitto.conf lines>"]
//! ```
//!
//! Prints `broker <mqtt url>`, `database <mongodb uri>` and then `ready`,
//! one line each.

use std::io::Write;

use palletd::testkit::{Broker, Database};
use tokio::signal::unix::{signal, SignalKind};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let extra = std::env::args().nth(1).unwrap_or_default();
    // Each line of the argument is a line of the broker's configuration.
    let broker = Broker::start_with(&format!("{}\n", extra.replace("\\n", "\n")));
    let db = Database::start();
    let mut out = std::io::stdout().lock();
    writeln!(out, "broker {}", broker.url())?;
    writeln!(out, "database {}", db.uri())?;
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    // Dropped here: the broker and the database are stopped.
    drop((broker, db));
    Ok(())
}
