//! The memory tier's duplicates in the store. Each commit records the duplicates the memory
//! tier dropped since the one before (`CommitBatch::memory_duplicates`); those dropped after a
//! flow's last commit are recorded when the flow ends, by a commit without entries. So the
//! store's count of a flow's duplicates is both tiers', as the run's summary, the log and
//! `/metrics` count them. A crash loses at most the drops since the last commit, and a store
//! that does not answer within [`RECORD_TIMEOUT`] at the end the drops since the last commit:
//! a count, never data (the flow's end, a drain's included, never waits longer for it).

use super::CommitThenAck;
use crate::telemetry::Counters;
use crate::time::now_ms;
use sluice_store::CommitBatch;
use std::sync::Arc;
use std::time::Duration;

/// How long a flow's end waits to record its last drops.
const RECORD_TIMEOUT: Duration = Duration::from_secs(3);

impl CommitThenAck {
    /// Records the memory tier's duplicates not recorded yet (none for a library job, whose
    /// transaction work the store would need for a commit).
    pub(crate) async fn record_dropped_duplicates(&self, counters: &Counters) {
        let dropped = counters.take_unrecorded_memory_duplicates();
        if dropped == 0 || self.work.is_some() {
            return;
        }
        let now = now_ms();
        let window = i64::try_from(self.retry.dedup_window.as_millis()).unwrap_or(i64::MAX);
        let batch = CommitBatch {
            flow: self.flow.clone(),
            table: self.table.clone(),
            entries: Vec::new(),
            now_ms: now,
            expires_at_ms: now.saturating_add(window),
            commit_by_ms: None,
            hook: None,
            watermark_progress: false,
            position: None,
            position_gate: None,
            work: None,
            publish_dead_letters: false,
            verdicts: Vec::new(),
            // It writes no rows: no column is added for it.
            typed: self.typed.as_ref().map(|cell| {
                let mut query = sluice_store::TypedQuery::clone(&cell.current());
                query.grown.clear();
                Arc::new(query)
            }),
            memory_duplicates: dropped,
        };
        let recorded = tokio::time::timeout(RECORD_TIMEOUT, self.store.commit(batch)).await;
        if !matches!(recorded, Ok(Ok(_))) {
            tracing::debug!(flow = %self.flow.name, dropped,
                "the memory tier's last duplicates are not recorded in the store");
        }
    }
}
