//! Signals and the shutdown sequence's tokens.
//!
//! Order on SIGTERM/SIGINT: `stop` is cancelled, so ingest stops handing on
//! messages (the broker keeps them) and the pipeline drains its channel,
//! flushes everything and releases the acknowledgements that became due; then
//! ingest sends them and disconnects. If that takes longer than
//! `--shutdown-timeout`, `abort` is cancelled: every task returns at once and
//! the process exits non-zero naming what was left (the broker redelivers
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
