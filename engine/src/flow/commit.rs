//! Commit-then-ack: stage a batch, commit its effects in one store transaction, and only then
//! ack its messages.
//!
//! Failure handling:
//! * the store cannot commit (unreachable, locked, read-only, closed; anything but a refusal of
//!   the data): retry the same batch with backoff (leases keep extending, nothing is acked),
//!   logging once per backoff step, for ever or, in a triggered run, for at most
//!   [`RetrySettings::give_up_after`], after which the flow stops failed and the batch is
//!   nacked; when the caller gives up (shutdown deadline) the batch is nacked;
//! * a stage that is unavailable ([`crate::StageError::unavailable`]): the same, the stage
//!   called again with the same batch (so the same batch id);
//! * a stage failure or a commit the store refuses ([`StoreError::Rejected`]): a batch of several
//!   is split into single messages to find the culprit, without charging anyone; a single
//!   message uses one attempt per failure, and once it has used `max_attempts` it is committed as
//!   a dead letter (reason `max_attempts`, with its last error) and then acked; its attempts
//!   start from Pub/Sub's `delivery_attempt` when the subscription has a dead-letter policy,
//!   so a restart does not reset them; with `poison: nack` ([`CommitThenAck::hand_poison_back`])
//!   a failing single is nacked at once instead, for Pub/Sub's retry and dead-letter policies;
//! * a dead letter the store refuses as it is (a value over one of its limits): committed at
//!   once without the message's data and attributes (reason `unstorable`, the store's error in
//!   its text), so that no record, however malformed, is retried for ever;
//! * a delivery held longer than the flow's commit bound ([`RetrySettings::commit_bound`], the
//!   dedup window minus a margin, see `commit_bound.rs`): given back (nacked), never committed,
//!   whether the committer finds it so before staging or the store finds the batch past its
//!   deadline inside the transaction ([`StoreError::Stale`]: then the whole batch is nacked);
//! * a table source's page whose position moved meanwhile ([`StoreError::Moved`]: another
//!   replica reads the table now, or the flow was reset): given back whole, nothing written;
//!   the source reads on from the stored position.
//!
//! The counts and settings are in `commit/report.rs`, the store's work for a batch in
//! `commit/store_batch.rs`, the sink file's publication in `commit/sink_files.rs`.

mod dropped;
mod failure;
mod report;
mod sink_files;
mod store_batch;
mod typed_flow;

use failure::Failure;
pub(crate) use failure::Stopped;
pub use report::{BatchWork, CommitReport, RetrySettings};
use typed_flow::{Expected, with_query_failures};

use crate::backoff::Backoff;
use crate::flow::batch::Batch;
use crate::flow::expectations::Expectations;
use crate::flow::query_cell::QueryCell;
use crate::flow::sink::{JsonlSink, SinkCommit};
use crate::flow::stage::Stage;
use crate::flow::storable::UNSTORABLE;
use report::count_and_settle;
use sluice_store::LedgerStore;
use sluice_store::{Effect, FlowHandle, StoreError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Commits batches of one flow to a store and acks them afterwards.
pub struct CommitThenAck {
    store: Arc<dyn LedgerStore>,
    flow: FlowHandle,
    table: Arc<str>,
    stage: Arc<dyn Stage>,
    retry: RetrySettings,
    give_up: CancellationToken,
    sink: Option<Arc<JsonlSink>>,
    work: Option<Arc<dyn BatchWork>>,
    /// Ordering keys are kept in order: a batch with a stale delivery is given back whole.
    keep_order: bool,
    /// A message that fails is handed back to Pub/Sub (`poison: nack`) instead of retried.
    hand_poison_back: bool,
    /// New dead letters also go to the outbox of the pipeline's dead-letter topic.
    publish_dead_letters: bool,
    /// A typed table's query, with which the store writes each new row (read for each batch:
    /// it may grow while running, see `flow/query_cell.rs`).
    typed: Option<Arc<QueryCell>>,
    /// The typed query's expectations (in the order of its checks).
    expectations: Option<Arc<Expectations>>,
    /// Why the flow stopped (an expectation with `fail`, or `give_up_after` spent): set
    /// once, then nothing more commits.
    failure: Arc<OnceLock<Stopped>>,
    /// Stops the flow's source when it fails.
    stop_flow: Option<CancellationToken>,
    /// Batches of a failed flow, given back once its source has closed (see
    /// [`CommitThenAck::given_back_after_close`]).
    held_back: Arc<Mutex<Vec<Batch>>>,
}

impl CommitThenAck {
    /// Keeps ordering keys in order (see [`Batch`]'s `nack_older_than`); the runner sets it for
    /// a source that says it is [`crate::SourceHandle::ordered`].
    pub(crate) fn keep_order(&mut self) {
        self.keep_order = true;
    }

    /// Also writes each committed batch's new records to a JSONL sink file (see
    /// [`crate::JsonlSink`]).
    pub fn with_sink(mut self, sink: Arc<JsonlSink>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Does `work` in each batch's transaction instead of writing target rows.
    pub fn with_work(mut self, work: Arc<dyn BatchWork>) -> Self {
        self.work = Some(work);
        self
    }

    /// Hands a message that fails back to Pub/Sub at once (a nack), never dead-lettering it in
    /// the table: the subscription's retry policy and dead-letter topic take over
    /// (`poison: nack`).
    pub fn hand_poison_back(mut self) -> Self {
        self.hand_poison_back = true;
        self
    }

    /// Places each new dead letter in the outbox of the pipeline's dead-letter topic in the
    /// same transaction as its dead-letter row (`dead_letter.topic`; see
    /// `sluice_store::OutboxLetter`).
    pub fn publish_dead_letters(mut self) -> Self {
        self.publish_dead_letters = true;
        self
    }

    /// How many batches of this flow may commit at once: what the store asks for.
    pub fn concurrency(&self) -> usize {
        self.store.commit_concurrency()
    }

    /// A committer of `flow` into `table` (a full table name, see `sluice_store::table_name`).
    /// Cancelling `give_up` makes batches waiting on an unavailable store be nacked instead of
    /// retried further.
    pub fn new(
        store: Arc<dyn LedgerStore>,
        flow: FlowHandle,
        table: Arc<str>,
        stage: Arc<dyn Stage>,
        retry: RetrySettings,
        give_up: CancellationToken,
    ) -> Self {
        Self {
            store,
            flow,
            table,
            stage,
            retry: RetrySettings {
                max_attempts: retry.max_attempts.max(1),
                ..retry
            },
            give_up,
            sink: None,
            work: None,
            keep_order: false,
            hand_poison_back: false,
            publish_dead_letters: false,
            typed: None,
            expectations: None,
            failure: Arc::new(OnceLock::new()),
            stop_flow: None,
            held_back: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Stages, commits and acks one batch (retrying as the module docs say). Returns when every
    /// message of the batch is acked, or nacked because the caller gave up.
    pub async fn process(&self, batch: Batch) -> CommitReport {
        self.process_with(batch, self.work.clone()).await
    }

    /// As [`CommitThenAck::process`], with `work` in the transaction instead of this
    /// committer's own (a stream-style job's batch committed with its own closure).
    pub async fn process_with(
        &self,
        batch: Batch,
        work: Option<Arc<dyn BatchWork>>,
    ) -> CommitReport {
        let mut report = CommitReport::default();
        let mut queue = VecDeque::from([batch]);
        while let Some(batch) = queue.pop_front() {
            let given_back = report.abandoned;
            if let Some(rest) = self.process_one(batch, &mut report, work.as_ref()).await {
                for (i, single) in rest.into_iter().enumerate() {
                    queue.insert(i, single);
                }
            }
            // Keeping ordering keys in order: what follows a given-back message in the batch
            // must not commit before it comes again.
            if self.keep_order && report.abandoned > given_back {
                for rest in queue.drain(..) {
                    report.abandoned += rest.len() as u64;
                    rest.abandon();
                }
            }
        }
        report
    }

    /// Processes one batch; returns its singles when it had to be split.
    async fn process_one(
        &self,
        batch: Batch,
        report: &mut CommitReport,
        work: Option<&Arc<dyn BatchWork>>,
    ) -> Option<Vec<Batch>> {
        let mut backoff = Backoff::giving_up_after(self.retry.give_up_after);
        // Sink attempts whose transaction ran but whose commit reported an error: the commit
        // may have landed all the same (a lost answer), so they are decided from the store
        // once the batch is settled.
        let mut uncertain: Vec<Arc<SinkCommit>> = Vec::new();
        let singles = self
            .attempt_until_settled(batch, report, &mut backoff, &mut uncertain, work)
            .await;
        self.resolve_uncertain(uncertain).await;
        singles
    }

    /// Retries `batch` until it is committed and acked or abandoned (`None`), or must be split
    /// (its singles).
    async fn attempt_until_settled(
        &self,
        mut batch: Batch,
        report: &mut CommitReport,
        backoff: &mut Backoff,
        uncertain: &mut Vec<Arc<SinkCommit>>,
        work: Option<&Arc<dyn BatchWork>>,
    ) -> Option<Vec<Batch>> {
        loop {
            if self.failure.get().is_some() {
                // The flow stopped: nothing more is committed or acked.
                report.abandoned += batch.len() as u64;
                self.give_back_after_close(batch);
                return None;
            }
            if let Some(bound) = self.retry.commit_bound {
                let stale = batch.nack_older_than(bound, self.keep_order);
                if stale > 0 {
                    tracing::warn!(flow = %self.flow.name, batch = batch.id, stale,
                        bound_ms = bound.as_millis() as u64,
                        "deliveries held past the commit bound; giving them back uncommitted");
                    report.abandoned += stale;
                }
                if batch.is_empty() {
                    return None;
                }
            }
            let exhausted = match batch.deliveries() {
                // Dead-lettered only after failing here too: attempts that Pub/Sub counted
                // (`delivery_attempt`) may have been deliveries given back, not failures.
                [single]
                    if single.attempts >= self.retry.max_attempts
                        && single.last_error.is_some()
                        && !self.hand_poison_back =>
                {
                    Some(single)
                }
                _ => None,
            };
            let refused = match batch.deliveries() {
                [single] => single.store_refused.as_ref(),
                _ => None,
            };
            let effects = match exhausted {
                // The store refused this message's dead letter as it was: kept bare.
                _ if let Some(why) = refused => Ok(vec![Effect::DeadLetter {
                    reason: UNSTORABLE.to_owned(),
                    error: format!(
                        "the store refused it as it was ({why}); kept without its data and \
                         attributes"
                    ),
                    attempts: batch.deliveries()[0].attempts,
                }]),
                // A table source's page whose records were all duplicates in memory: only its
                // position change commits.
                None if batch.is_empty() => Ok(Vec::new()),
                Some(single) => Ok(vec![Effect::DeadLetter {
                    reason: "max_attempts".to_owned(),
                    error: single.last_error.clone().unwrap_or_default(),
                    attempts: single.attempts,
                }]),
                None => self
                    .stage
                    .stage(batch.deliveries())
                    .await
                    .map(|effects| with_query_failures(batch.deliveries(), effects)),
            };
            let mut dead: Vec<Option<String>> = Vec::new();
            let mut row_event_times: Vec<Option<i64>> = Vec::new();
            let mut violations: Vec<Vec<bool>> = Vec::new();
            let outcome = match effects {
                Ok(effects) if effects.len() != batch.len() => Err(Failure::Stage(format!(
                    "stage returned {} effects for {} messages",
                    effects.len(),
                    batch.len()
                ))),
                Ok(mut effects) => 'commit: {
                    // Expectations first: the store evaluates them over this batch's rows.
                    if let Some(expectations) = &self.expectations {
                        match self.expect(&batch, &mut effects, expectations).await {
                            Ok(found) => violations = found,
                            Err(Expected::Store(error)) => {
                                break 'commit Err(Failure::Store(error));
                            }
                            Err(Expected::Failed(why)) => {
                                tracing::error!(flow = %self.flow.name, batch = batch.id,
                                    %why, "an expectation with on_violation: fail was violated; \
                                    the flow stops and the batch is not acked");
                                self.stop_the_flow(Stopped::Expectation(why));
                                report.abandoned += batch.len() as u64;
                                self.give_back_after_close(batch);
                                return None;
                            }
                        }
                    }
                    if self.failure.get().is_some() {
                        // Another lane's batch stopped the flow meanwhile.
                        report.abandoned += batch.len() as u64;
                        self.give_back_after_close(batch);
                        return None;
                    }
                    dead = effects
                        .iter()
                        .map(|e| match e {
                            Effect::DeadLetter { reason, .. } => Some(reason.clone()),
                            Effect::Row { .. } => None,
                        })
                        .collect();
                    if batch.counters().watermark().is_some() {
                        row_event_times = effects
                            .iter()
                            .map(|e| match e {
                                Effect::Row { event_time_ms, .. } => Some(*event_time_ms),
                                Effect::DeadLetter { .. } => None,
                            })
                            .collect();
                    }
                    let started = Instant::now();
                    let work = work.map(|w| w.work(&batch, &effects));
                    let (mut commit_batch, sink_commit) = self.commit_batch(&batch, effects, work);
                    // Counted by the store in the same transaction, for the new keys.
                    commit_batch.verdicts = violations.clone();
                    let dropped = batch.counters().take_unrecorded_memory_duplicates();
                    commit_batch.memory_duplicates = dropped;
                    let query = commit_batch.typed.clone();
                    let commit = self.store.commit(commit_batch);
                    let result = tokio::select! {
                        result = commit => result.map_err(Failure::Store),
                        // The commit may still land; its messages are nacked and the ledger
                        // absorbs their redelivery.
                        _ = self.give_up.cancelled() => Err(Failure::GaveUp),
                        // A silent store (a partition) would hold a triggered run for ever.
                        unanswered = failure::unanswered_within(self.retry.give_up_after) => {
                            Err(unanswered)
                        }
                    };
                    batch
                        .counters()
                        .commit_took(started.elapsed().as_secs_f64());
                    if let (Ok(_), Some(cell), Some(query)) = (&result, &self.typed, &query) {
                        cell.committed(query);
                    }
                    // A commit given up on may still land: its drops are not counted again.
                    if matches!(result, Err(Failure::Store(_))) {
                        batch.counters().memory_duplicates_unrecorded(dropped);
                    }
                    if let Some(sink) = sink_commit {
                        match &result {
                            Ok(_) => self.publish(&sink).await,
                            // May still land after this: the next start's recovery decides.
                            Err(Failure::Unanswered(_)) => sink.release(),
                            Err(_) if sink.ran() => uncertain.push(sink),
                            Err(_) => {}
                        }
                    }
                    result
                }
                Err(error) if error.transient => Err(Failure::StageUnavailable(error.message)),
                Err(error) => Err(Failure::Stage(error.message)),
            };
            let failure = match outcome {
                Ok(outcome) => {
                    if let Some(expectations) = &self.expectations {
                        expectations.count(&violations, &outcome.written);
                    }
                    *report += count_and_settle(
                        batch,
                        &dead,
                        &row_event_times,
                        &outcome.written,
                        outcome.filtered,
                    );
                    return None;
                }
                Err(failure) => failure,
            };
            if let Failure::Store(StoreError::Record {
                index,
                column,
                error,
            }) = &failure
            {
                // Deterministic: that record becomes a dead letter and the rest commit now.
                tracing::warn!(flow = %self.flow.name, batch = batch.id, column = %column,
                    %error, "a record's typed query failed; dead-lettering it");
                batch.counters().commit_failed(
                    StoreError::Record {
                        index: *index,
                        column: String::new(),
                        error: String::new(),
                    }
                    .commit_error_kind(),
                );
                batch.query_failed(*index, column, error);
                continue;
            }
            if matches!(failure, Failure::Store(StoreError::Moved)) {
                tracing::warn!(flow = %self.flow.name, batch = batch.id,
                    "the table source's position moved (another replica reads it, or a reset); \
                     giving the page back");
                batch
                    .counters()
                    .commit_failed(StoreError::Moved.commit_error_kind());
                report.abandoned += batch.len() as u64;
                batch.abandon();
                return None;
            }
            if matches!(failure, Failure::Store(StoreError::Stale)) {
                tracing::warn!(flow = %self.flow.name, batch = batch.id,
                    "the store found the batch past its commit deadline; giving it back");
                batch
                    .counters()
                    .commit_failed(StoreError::Stale.commit_error_kind());
                report.abandoned += batch.nack_stale_batch();
                return None;
            }
            batch.counters().commit_failed(match &failure {
                Failure::Store(error) => error.commit_error_kind(),
                Failure::Stage(_) => "stage",
                Failure::StageUnavailable(_) => "stage_unavailable",
                Failure::GaveUp => "gave_up",
                Failure::Unanswered(_) => "unavailable",
            });
            let message_at_fault = matches!(
                failure,
                Failure::Stage(_) | Failure::Store(StoreError::Rejected(_))
            );
            if message_at_fault && batch.len() > 1 {
                tracing::warn!(flow = %self.flow.name, batch = batch.id, error = %failure,
                    "batch failed; retrying its messages one by one to find the culprit");
                return Some(batch.into_singles());
            }
            if let (Failure::Store(StoreError::Rejected(why)), [Some(_)], None) =
                (&failure, dead.as_slice(), refused)
            {
                // A dead letter the store cannot hold (a value over one of its limits):
                // kept without the payload, at once; retrying it as it is would never end.
                tracing::warn!(flow = %self.flow.name, batch = batch.id, error = %why,
                    "the store refused a dead letter; keeping it without its payload");
                batch.refused_by_store(why);
                continue;
            }
            if message_at_fault {
                batch.count_failed_attempt(&failure.to_string());
                if self.hand_poison_back {
                    tracing::warn!(flow = %self.flow.name, batch = batch.id, error = %failure,
                        attempts = batch.deliveries()[0].attempts,
                        "message failed; handed back to Pub/Sub (poison: nack), whose retry \
                         and dead-letter policies take over");
                    report.abandoned += batch.len() as u64;
                    batch.abandon();
                    return None;
                }
            }
            if self.give_up.is_cancelled() {
                tracing::warn!(flow = %self.flow.name, batch = batch.id, error = %failure,
                    "giving up at shutdown; nacking the uncommitted batch");
                report.abandoned += batch.len() as u64;
                batch.abandon();
                return None;
            }
            let spent = match failure {
                Failure::Unanswered(patience) => Some(patience),
                _ => backoff.exhausted(),
            };
            if !message_at_fault && let Some(patience) = spent {
                report.abandoned += batch.len() as u64;
                self.give_up_waiting(batch, patience, &failure);
                return None;
            }
            let delay = backoff.next_delay();
            self.log_retry(&batch, &failure, message_at_fault, backoff.step(), delay);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.give_up.cancelled() => {}
            }
        }
    }
}
