//! One way to wait for the store before and around a run: an operation is tried again with
//! backoff (exponential with jitter, from 100 ms up to 10 s; logged at each step) until it
//! succeeds or the drain begins. Nothing is dropped or acked meanwhile; the caller decides what
//! a give-up means. (A window flow following a table retries its own reads: it never gives up
//! while it runs, `runtime/flow/windows.rs`.)

use sluice_engine::Backoff;
use sluice_store::StoreError;
use std::future::Future;
use tokio_util::sync::CancellationToken;

/// Which errors are waited out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Only an unavailable store (`StoreError::is_transient`); another error is returned.
    WhileUnavailable,
    /// Every error (what must be recorded whatever went wrong, such as a once flow's
    /// completion).
    Always,
}

/// Runs `attempt` until it succeeds. An error that `retry` waits out is tried again after the
/// next backoff delay, logged with `what`; another error, or one that comes once `drain` is
/// cancelled, is returned. A drain that begins during a delay ends the delay: one last
/// attempt follows.
pub async fn until_stored<T, F, Fut>(
    what: &str,
    retry: Retry,
    drain: &CancellationToken,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut backoff = Backoff::default();
    loop {
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(error)
                if (retry == Retry::Always || error.is_transient()) && !drain.is_cancelled() =>
            {
                let delay = backoff.next_delay();
                tracing::warn!(what, step = backoff.step(), retry_in_ms = delay.as_millis() as u64,
                    %error, "store unavailable; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = drain.cancelled() => {}
                }
            }
            Err(error) => return Err(error),
        }
    }
}
