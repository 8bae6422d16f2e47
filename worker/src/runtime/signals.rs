//! SIGTERM/SIGINT: the first signal starts a drain (stop pulling, commit and ack what is in
//! flight); if the drain cannot finish within [`DRAIN_DEADLINE`] (the store is down), or a second
//! signal arrives, batches still waiting are nacked so Pub/Sub redelivers them. If even that does
//! not end the process within [`EXIT_DEADLINE`], or a third signal arrives, it exits with code 1
//! at once. Nothing is acked without its commit in any case, so each step is safe; the deadlines
//! add up to less than Kubernetes' default 30 s grace period.

use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// How long a drain may wait on an unavailable store before giving up (nacking).
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(15);
/// How long after giving up the process may take to exit before it is ended with code 1.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(10);

/// The tokens a run watches.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    /// Cancelled at the first signal: stop pulling, finish what is in flight.
    pub drain: CancellationToken,
    /// Cancelled after the deadline or at a second signal: nack what cannot be committed.
    pub give_up: CancellationToken,
}

/// Installs the handlers and returns the tokens they cancel.
pub fn install() -> std::io::Result<Shutdown> {
    let shutdown = Shutdown::default();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let tokens = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!(
            "signal received; draining (stop pulling, commit and ack what is in flight)"
        );
        tokens.drain.cancel();
        tokio::select! {
            _ = term.recv() => tracing::warn!("second signal; nacking what is not committed"),
            _ = int.recv() => tracing::warn!("second signal; nacking what is not committed"),
            _ = tokio::time::sleep(DRAIN_DEADLINE) => {
                tracing::warn!(?DRAIN_DEADLINE, "drain deadline passed; nacking what is not committed");
            }
        }
        tokens.give_up.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = tokio::time::sleep(EXIT_DEADLINE) => {}
        }
        tracing::error!(
            "shutdown did not finish; exiting now (uncommitted messages were not acked)"
        );
        std::process::exit(1);
    });
    Ok(shutdown)
}
