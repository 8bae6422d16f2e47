//! One flow, end to end: a source, the batcher and the committer, pipelined (the next batch
//! fills while the previous one commits), with a clean drain.
//!
//! Batches of one flow may commit concurrently, as many at once as the store asks for
//! ([`sluice_store::LedgerStore::commit_concurrency`]: one for SQLite's single writer, several for
//! PostgreSQL). That is safe because no key is ever in two batches in flight at once (a
//! redelivery of an in-flight key is parked with its original, see `sluice_dedup`), so
//! concurrent batches never race on a ledger key.
//!
//! Drain: cancelling the `drain` token stops the source from asking for messages; everything
//! already received is still batched, committed and acked; then the source is closed (acks
//! flushed, anything the client still holds unasked is nacked by it). If the store stays
//! unavailable during a drain, `give_up` makes the waiting batches be nacked instead.
//!
//! A once flow that several replicas read ends only when they agree it drained
//! ([`DrainAgreement`]): an idle replica keeps reading while another may still hold messages
//! that could come back to the subscription.

use crate::flow::batcher::{BatchSettings, BatchSource, DedupSettings};
use crate::flow::budget::Budget;
use crate::flow::commit::{CommitReport, CommitThenAck, Stopped};
use crate::source::MessageSource;
use crate::source::SourceError;
use crate::telemetry::Counters;
use std::sync::{Arc, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Batches waiting for the committers beyond one per committer: the batcher fills the next
/// while they commit.
pub(crate) const COMMIT_QUEUE: usize = 1;

/// How often the system-lag gauge is sampled.
pub const GAUGE_INTERVAL: Duration = Duration::from_secs(1);

/// Whether a run that found its source idle (nothing arrived for the idle time, nothing in
/// flight) may end: for a once flow read by several replicas, all of them must have drained, and
/// messages held by a replica that died must have had the time to come back.
#[async_trait::async_trait]
pub trait DrainAgreement: Send + Sync {
    /// The run reads (at its start, and when it received something after [`Self::may_finish`]
    /// said no).
    async fn reading(&self);
    /// The run found its source idle holding nothing; `false`: go on reading, ask again at the
    /// next idle time.
    async fn may_finish(&self) -> bool;
    /// The run was stopped (a drain) holding nothing.
    async fn stopped(&self);
}

/// When a flow's run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunUntil {
    /// Until the drain token is cancelled (continuous mode).
    Drained,
    /// Until no message arrived for this long (triggered runs, once flows), or the drain token.
    Idle(Duration),
    /// Until the source ends by itself (a file source read to its end) and all it delivered
    /// is settled, or the drain token.
    Exhausted,
}

/// Everything one flow's run needs.
pub struct FlowRun {
    /// Where messages come from.
    pub source: Box<dyn MessageSource>,
    /// In-flight bound.
    pub budget: Budget,
    /// Dedup key and window.
    pub dedup: DedupSettings,
    /// Batch bounds.
    pub batch: BatchSettings,
    /// Stage, commit and ack.
    pub committer: CommitThenAck,
    /// Counters of the flow.
    pub counters: Counters,
    /// When the run ends.
    pub until: RunUntil,
    /// For an idle run (`RunUntil::Idle`) read by several replicas: whether it may end. `None`:
    /// it ends when this worker finds the source idle.
    pub drain_agreement: Option<Arc<dyn DrainAgreement>>,
}

/// How a flow's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The source stayed empty for the idle time, or ended by itself: a once flow or
    /// triggered run is complete.
    Drained,
    /// The drain token stopped it (a signal), whatever was left on the subscription.
    Stopped,
}

/// A finished run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowEnd {
    /// What the commits did.
    pub report: CommitReport,
    /// Why it ended.
    pub ended: Ended,
}

/// Why a flow could not run to its end.
///
/// ```
/// use sluice_engine::{FlowError, SourceError};
/// fn explain(error: &FlowError) -> &'static str {
///     match error {
///         FlowError::Source(SourceError::Refused(_)) => "grant the role it names",
///         FlowError::Source(_) => "the subscription could not be read",
///         _ => "see the message",
///     }
/// }
/// # let _ = explain;
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlowError {
    /// The source could not be started.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The committer task panicked; its batches were nacked when they were dropped.
    #[error("the committer of the flow panicked: {0}")]
    Committer(String),
    /// A record violated an expectation with `on_violation: fail`; its batch, and every batch
    /// after it, was given back unacked.
    #[error("{0}")]
    Expectation(String),
    /// The store or a stage stayed unavailable for longer than the run was to wait (a
    /// triggered run's `give_up_after`); the batch waiting was given back unacked.
    #[error("{0}")]
    GaveUp(String),
}

impl FlowRun {
    /// Runs the flow until it ends (see [`RunUntil`]) and returns what was committed.
    pub async fn run(self, drain: CancellationToken) -> Result<FlowEnd, FlowError> {
        self.run_notifying(drain, None).await
    }

    /// As [`FlowRun::run`]; `started` is told once the source runs (for Pub/Sub: once the
    /// subscription answered), which is when a worker counts the flow as up.
    pub async fn run_notifying(
        self,
        drain: CancellationToken,
        started: Option<tokio::sync::oneshot::Sender<()>>,
    ) -> Result<FlowEnd, FlowError> {
        let stop_source = drain.child_token();
        let counters = self.counters.clone();
        let (mut batches, mut handle) = BatchSource::start(
            self.source,
            self.budget,
            self.dedup,
            self.batch,
            self.counters,
            stop_source.clone(),
        )
        .await?;
        if let Some(started) = started {
            let _ = started.send(());
        }
        // The system-lag gauge moves while nothing else happens (a stuck commit), so it is
        // sampled on a clock rather than per batch.
        let lag_sampler = {
            let counters = counters.clone();
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(GAUGE_INTERVAL);
                loop {
                    ticks.tick().await;
                    counters.publish_lag();
                }
            })
        };
        let ordered = handle.ordered();
        let mut committer = self.committer;
        if ordered {
            committer.keep_order();
        }
        // A failed expectation or a give-up stops the source; the flow then ends FAILED.
        committer.stop_flow_with(stop_source.clone());
        let failure = committer.failure();
        let held_back = committer.given_back_after_close();
        let count = committer.concurrency();
        let committer = Arc::new(committer);
        let (dispatch, mut commit_tasks) =
            crate::flow::commit_lanes::start(committer.clone(), count, ordered, COMMIT_QUEUE);
        let commits = async move {
            let mut report = CommitReport::default();
            while let Some(joined) = commit_tasks.join_next().await {
                report += joined?;
            }
            Ok::<_, tokio::task::JoinError>(report)
        };
        let agreement = self.drain_agreement;
        if let Some(agreement) = &agreement {
            agreement.reading().await;
        }
        // Whether this run told the agreement it drained and has not received since.
        let mut reported_drained = false;
        let mut drained = false;
        // Asked after each idle period, before the source counts as drained.
        let mut idle_check = handle.idle_check();
        let mut asked_idle = false;
        // The source's service stopped answering for longer than the run was to wait.
        let mut unreachable = None;
        loop {
            let next = match self.until {
                RunUntil::Idle(idle) if !stop_source.is_cancelled() => {
                    batches.next_batch_or_idle(idle).await
                }
                _ => Ok(batches.next_batch().await),
            };
            match next {
                Ok(Some(batch)) => {
                    if let Some(check) = idle_check.as_mut()
                        && std::mem::take(&mut asked_idle)
                    {
                        check.messages_came();
                    }
                    if let Some(agreement) = &agreement
                        && std::mem::take(&mut reported_drained)
                    {
                        agreement.reading().await;
                    }
                    counters.publish_cache_entries(batches.cache_entries());
                    if !dispatch.send(batch).await {
                        break;
                    }
                }
                Ok(None) => {
                    // A bounded source that ended by itself has drained; any other source
                    // closes only after a stop (an idle drain already said so above).
                    drained |= self.until == RunUntil::Exhausted;
                    break;
                }
                Err(_idle) => {
                    // An idle source only counts as drained if its service says so.
                    if let Some(check) = idle_check.as_mut() {
                        asked_idle = true;
                        let answer = tokio::select! {
                            answer = check.confirm_idle() => answer,
                            () = stop_source.cancelled() => continue,
                        };
                        match answer {
                            Ok(true) => {}
                            Ok(false) => continue,
                            Err(error) => {
                                unreachable = Some(error);
                                stop_source.cancel();
                                continue;
                            }
                        }
                    }
                    if let Some(agreement) = &agreement {
                        reported_drained = true;
                        if !agreement.may_finish().await {
                            continue;
                        }
                    }
                    drained = true;
                    stop_source.cancel();
                }
            }
        }
        drop(dispatch);
        let committed = commits.await;
        committer.record_dropped_duplicates(&counters).await;
        lag_sampler.abort();
        counters.publish_lag();
        // Release the intake before closing, so no source task waits on a full channel.
        drop(batches);
        stop_source.cancel();
        handle.close().await;
        // A failed flow's batches go back now that the streams are closed.
        for batch in std::mem::take(&mut *held_back.lock().unwrap_or_else(PoisonError::into_inner))
        {
            batch.abandon();
        }
        let ended = if drained && !drain.is_cancelled() {
            Ended::Drained
        } else {
            Ended::Stopped
        };
        let result = match (committed, failure.get(), unreachable) {
            (Err(panicked), _, _) => Err(FlowError::Committer(panicked.to_string())),
            (_, Some(Stopped::Expectation(why)), _) => Err(FlowError::Expectation(why.clone())),
            (_, Some(Stopped::GaveUp(why)), _) => Err(FlowError::GaveUp(why.clone())),
            (_, None, Some(error)) => Err(FlowError::Source(error)),
            (Ok(report), None, None) => Ok(FlowEnd { report, ended }),
        };
        // The other replicas do not wait for a flow that did not drain here.
        if !matches!(&result, Ok(end) if end.ended == Ended::Drained)
            && let Some(agreement) = &agreement
        {
            agreement.stopped().await;
        }
        result
    }
}
