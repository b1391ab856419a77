//! Signals and the shutdown sequence's tokens.
//!
//! Order on SIGTERM/SIGINT: `stop` is cancelled, so ingest stops handing on
//! messages (the broker keeps them); the admission spools what it already
//! received, waits until it is durable and releases the acknowledgements
//! (`acked`), after which ingest sends them and disconnects; the pipeline
//! takes what the admission offered and writes what memory holds (what is only
//! on disk stays in the spool for the next start), then the endpoints stop
//! (`done`). If that takes longer than `--shutdown-timeout`, `abort` is
//! cancelled: every task returns at once and the process exits non-zero
//! naming what was left (it stays in the spool; the broker redelivers
//! whatever was not acknowledged).

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Cancels `stop` on the first SIGTERM or SIGINT.
pub async fn stop_on_signal(stop: CancellationToken) -> std::io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = stop.cancelled() => return,
        };
        info!(signal = name, "Shutting down: flushing buffered samples.");
        stop.cancel();
    });
    Ok(())
}
