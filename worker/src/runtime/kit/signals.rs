//! SIGTERM/SIGINT: the first signal starts a drain (stop pulling, commit and ack what is in
//! flight); if the drain cannot finish within [`DRAIN_DEADLINE`] (the store is down), or a second
//! signal arrives, batches still waiting are nacked so Pub/Sub redelivers them. If even that does
//! not end the process within [`EXIT_DEADLINE`], or a third signal arrives, it exits with code 1
//! at once. Nothing is acked without its commit in any case, so each step is safe; the deadlines
//! add up to less than Kubernetes' default 30 s grace period.
//!
//! [`escalate`] is that sequence over any stream of signals; [`install`] feeds it SIGTERM and
//! SIGINT and exits when it returns.

use futures::{Stream, StreamExt};
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
    let term = signal(SignalKind::terminate())?;
    let int = signal(SignalKind::interrupt())?;
    // One item per SIGTERM or SIGINT received.
    let signals = futures::stream::unfold((term, int), |(mut term, mut int)| async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        Some(((), (term, int)))
    });
    let tokens = shutdown.clone();
    tokio::spawn(async move {
        escalate(signals, &tokens).await;
        tracing::error!(
            "shutdown did not finish; exiting now (uncommitted messages were not acked)"
        );
        std::process::exit(1);
    });
    Ok(shutdown)
}

/// The escalation over `signals`: cancels `drain` at the first signal, `give_up` at the second
/// or [`DRAIN_DEADLINE`] after the first, and returns at the third or [`EXIT_DEADLINE`] after
/// giving up (the caller then exits). A stream that ends brings no more signals; the deadlines
/// still run.
pub async fn escalate(signals: impl Stream<Item = ()>, tokens: &Shutdown) {
    let mut signals = std::pin::pin!(signals);
    let mut next = async || {
        if signals.next().await.is_none() {
            std::future::pending::<()>().await;
        }
    };
    next().await;
    tracing::info!("signal received; draining (stop pulling, commit and ack what is in flight)");
    tokens.drain.cancel();
    tokio::select! {
        _ = next() => tracing::warn!("second signal; nacking what is not committed"),
        _ = tokio::time::sleep(DRAIN_DEADLINE) => {
            tracing::warn!(?DRAIN_DEADLINE, "drain deadline passed; nacking what is not committed");
        }
    }
    tokens.give_up.cancel();
    tokio::select! {
        _ = next() => {}
        _ = tokio::time::sleep(EXIT_DEADLINE) => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use tokio::task::JoinHandle;
    use tokio::time::{Instant, sleep};

    /// `escalate` running on a channel of signals, with the tokens it cancels.
    struct Escalation {
        signals: mpsc::UnboundedSender<()>,
        tokens: Shutdown,
        exited: JoinHandle<Instant>,
    }

    impl Escalation {
        fn start() -> Self {
            let (signals, received) = mpsc::unbounded();
            let tokens = Shutdown::default();
            let watched = tokens.clone();
            let exited = tokio::spawn(async move {
                escalate(received, &watched).await;
                Instant::now()
            });
            Self {
                signals,
                tokens,
                exited,
            }
        }

        /// Sends one signal and lets `escalate` act on it.
        async fn signal(&self) {
            self.signals.unbounded_send(()).unwrap();
            settle().await;
        }
    }

    /// Lets every spawned task run as far as it can without the clock moving.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_signal_drains_and_nothing_happens_before_it() {
        let escalation = Escalation::start();
        sleep(Duration::from_secs(3600)).await;
        assert!(!escalation.tokens.drain.is_cancelled());
        escalation.signal().await;
        assert!(escalation.tokens.drain.is_cancelled());
        assert!(!escalation.tokens.give_up.is_cancelled());
        assert!(!escalation.exited.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_second_signal_give_up_comes_exactly_at_the_drain_deadline() {
        let escalation = Escalation::start();
        escalation.signal().await;
        let drained_at = Instant::now();
        escalation.tokens.give_up.cancelled().await;
        assert_eq!(drained_at.elapsed(), DRAIN_DEADLINE);
        assert!(!escalation.exited.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_signal_gives_up_at_once() {
        let escalation = Escalation::start();
        escalation.signal().await;
        sleep(Duration::from_secs(3)).await;
        assert!(!escalation.tokens.give_up.is_cancelled());
        escalation.signal().await;
        assert!(escalation.tokens.give_up.is_cancelled());
        assert!(!escalation.exited.is_finished());
    }

    #[tokio::test(start_paused = true)]
    async fn the_exit_comes_ten_seconds_after_giving_up() {
        // Given up at the deadline.
        let escalation = Escalation::start();
        escalation.signal().await;
        let drained_at = Instant::now();
        let exited_at = escalation.exited.await.unwrap();
        assert_eq!(exited_at - drained_at, DRAIN_DEADLINE + EXIT_DEADLINE);
        // Given up at a second signal.
        let escalation = Escalation::start();
        escalation.signal().await;
        sleep(Duration::from_secs(3)).await;
        escalation.signal().await;
        let gave_up_at = Instant::now();
        let exited_at = escalation.exited.await.unwrap();
        assert_eq!(exited_at - gave_up_at, EXIT_DEADLINE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_third_signal_exits_at_once() {
        let escalation = Escalation::start();
        escalation.signal().await;
        sleep(Duration::from_secs(1)).await;
        escalation.signal().await;
        sleep(Duration::from_secs(1)).await;
        assert!(!escalation.exited.is_finished());
        escalation.signal().await;
        assert!(escalation.exited.is_finished());
        assert!(escalation.tokens.give_up.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn signals_that_end_leave_the_deadlines_running() {
        let escalation = Escalation::start();
        escalation.signal().await;
        let drained_at = Instant::now();
        drop(escalation.signals);
        let exited_at = escalation.exited.await.unwrap();
        assert_eq!(exited_at - drained_at, DRAIN_DEADLINE + EXIT_DEADLINE);
        assert!(escalation.tokens.give_up.is_cancelled());
    }
}
