//! One way to wait for the store before and around a run: an operation is tried again with
//! backoff (exponential with jitter, from 100 ms up to 10 s; logged at each step) until it
//! succeeds, the drain begins, or (a triggered run's `give_up_after`) the store has been away
//! for longer than the run waits. Nothing is dropped or acked meanwhile; the caller decides what
//! a give-up means. (A window flow following a table retries its own reads: it never gives up
//! while it runs, `runtime/flow/windows.rs`.)

use sluice_engine::Backoff;
use sluice_store::StoreError;
use std::future::Future;
use std::time::Duration;
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

/// How long the worker's own waits for the store during a run last before it gives up (the
/// run then fails, exit 1): a triggered run's `give_up_after`, but never in a scheduled
/// pipeline, whose process outlives its runs and waits as long as it takes (its flows' commits
/// still give up, failing the run, which is recorded).
pub fn run_patience(pipeline: &sluice_pipeline::Pipeline) -> Option<Duration> {
    pipeline
        .give_up_after
        .filter(|_| pipeline.schedule.is_none())
}

/// Ends once `patience` has passed; never without one (a `select!` arm that gives up).
pub async fn patience_spent(patience: Option<Duration>) {
    match patience {
        Some(patience) => tokio::time::sleep(patience).await,
        None => std::future::pending().await,
    }
}

/// Runs `attempt` until it succeeds. An error that `retry` waits out is tried again after the
/// next backoff delay, logged with `what`; another error, or one that comes once `drain` is
/// cancelled, is returned. A drain that begins during a delay ends the delay: one last
/// attempt follows. It gives up once the first failure is `give_up` old, or an attempt has
/// had no answer for that long (`None`: never): the last error is returned, saying so.
pub async fn until_stored_within<T, F, Fut>(
    what: &str,
    retry: Retry,
    drain: &CancellationToken,
    give_up: Option<Duration>,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut backoff = Backoff::default();
    let mut first_failure = None;
    loop {
        // A store that does not answer at all (a partition) counts as gone for good once the
        // patience has passed.
        let answer = match give_up {
            Some(limit) => match tokio::time::timeout(limit, attempt()).await {
                Ok(answer) => answer,
                Err(_) => {
                    return Err(StoreError::Unavailable(format!(
                        "the store did not answer ({what}) within {}s; gave up (give_up_after)",
                        limit.as_secs()
                    )));
                }
            },
            None => attempt().await,
        };
        match answer {
            Ok(done) => return Ok(done),
            Err(error)
                if (retry == Retry::Always || error.is_transient()) && !drain.is_cancelled() =>
            {
                let since = *first_failure.get_or_insert_with(tokio::time::Instant::now);
                if let Some(limit) = give_up.filter(|limit| since.elapsed() >= *limit) {
                    let why = match error {
                        StoreError::Unavailable(why) => why,
                        other => other.to_string(),
                    };
                    return Err(StoreError::Unavailable(format!(
                        "{why}; gave up after {}s (give_up_after)",
                        limit.as_secs()
                    )));
                }
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
