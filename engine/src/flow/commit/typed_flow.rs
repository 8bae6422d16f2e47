//! A typed flow's part of the commit: its query and expectations on the committer, the
//! store's verdict on a batch before its commit, a record whose query failed turned into a dead
//! letter, and a failed flow's batches held back until its source has closed.

use super::CommitThenAck;
use crate::flow::batch::Batch;
use crate::flow::delivery::Delivery;
use crate::flow::expectations::Expectations;
use crate::flow::query_cell::QueryCell;
use sluice_store::{Effect, StoreError};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use tokio_util::sync::CancellationToken;

impl CommitThenAck {
    /// Holds `batch` (unacked) until the flow's source has closed: a message given back while
    /// its stream is still open may flow back into that stream and wait out its lease there,
    /// where a stream that closes with it outstanding gives it back to the others at once.
    pub(super) fn give_back_after_close(&self, batch: Batch) {
        self.held_back
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(batch);
    }

    /// The batches a failed flow holds back; the runner gives them back (drops them, which
    /// nacks) once the source has closed.
    pub(crate) fn given_back_after_close(&self) -> Arc<Mutex<Vec<Batch>>> {
        self.held_back.clone()
    }

    /// Checks each batch against `expectations` (the typed query's, in its order) before its
    /// commit.
    pub fn with_expectations(mut self, expectations: Expectations) -> Self {
        self.expectations = Some(Arc::new(expectations));
        self
    }

    /// Why the flow stopped, once it did.
    pub(crate) fn failure(&self) -> Arc<OnceLock<super::Stopped>> {
        self.failure.clone()
    }

    /// Cancels `stop` (the flow's source) when the committer stops the flow.
    pub(crate) fn stop_flow_with(&mut self, stop: CancellationToken) {
        self.stop_flow = Some(stop);
    }

    /// The store's verdict on `effects` under `expectations`: drops applied to `effects`, the
    /// violations returned (per entry, per expectation) for counting once committed.
    pub(super) async fn expect(
        &self,
        batch: &Batch,
        effects: &mut [Effect],
        expectations: &Expectations,
    ) -> Result<Vec<Vec<bool>>, Expected> {
        let (probe, _) = self.commit_batch(batch, effects.to_vec(), None);
        let violations = self
            .store
            .violations(&probe)
            .await
            .map_err(Expected::Store)?;
        let ids: Vec<&str> = batch
            .deliveries()
            .iter()
            .map(|d| d.message.message_id.as_str())
            .collect();
        let attempts: Vec<u32> = batch.deliveries().iter().map(|d| d.attempts).collect();
        expectations
            .apply(&violations, effects, &ids, &attempts)
            .map_err(Expected::Failed)?;
        Ok(violations)
    }

    /// Writes rows into a typed table through `query` (its stage decodes the fields).
    pub fn with_typed(self, query: Arc<sluice_store::TypedQuery>) -> Self {
        self.with_typed_cell(Arc::new(QueryCell::fixed(query)))
    }

    /// Writes rows into a typed table through the query `cell` holds as each batch commits
    /// (its decoder may widen it, see [`QueryCell`]).
    pub fn with_typed_cell(mut self, cell: Arc<QueryCell>) -> Self {
        self.typed = Some(cell);
        self
    }
}

/// The reason of the dead letter of a record whose typed query failed: `expression:<column>`.
pub(super) const EXPRESSION_REASON: &str = "expression";

/// Each delivery whose typed query failed becomes a dead letter naming the column.
pub(super) fn with_query_failures(deliveries: &[Delivery], effects: Vec<Effect>) -> Vec<Effect> {
    deliveries
        .iter()
        .zip(effects)
        .map(|(delivery, effect)| match &delivery.query_failed {
            Some((column, error)) => Effect::DeadLetter {
                reason: format!("{EXPRESSION_REASON}:{column}"),
                error: format!("column {column}: {error}"),
                attempts: delivery.attempts + 1,
            },
            None => effect,
        })
        .collect()
}

/// Why a batch's expectations stopped its commit.
pub(super) enum Expected {
    /// The store could not evaluate them (or a check failed on a record).
    Store(StoreError),
    /// A `fail` expectation was violated.
    Failed(String),
}
