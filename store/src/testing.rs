//! Test parts (the `testing` feature): [`FaultStore`], a real store with faults injected into
//! its commits (a commit refused, or committed and its reply lost), for what a real store
//! cannot be made to do on demand. Tests that use it say it is a fake around a real one.

use crate::{
    BucketCounts, BucketMessage, ClearClaim, CommitBatch, CommitOutcome, DrainCensus, DrainStore,
    FeedLag, FeedRow, FeedStore, FileCheckpoint, FlowHandle, FlowProgress, FlowStore, Inspect,
    Layout, LeaseGrant, LeaseRecord, LeaseRequest, LedgerStore, LedgerUpkeep, MembershipStore,
    OutboxCensus, OutboxLetter, OutboxStore, PoolUpdate, PoolUpdateStore, ProgressStore,
    ReadPosition, ResetRows, RowCursor, RunEnd, RunRecord, RunStart, RunStore, Store, StoreError,
    StoredRow, WatermarkRecord, WindowEmission, WindowStore, WindowsEmitted, WorkerBeat,
    WorkerRecord,
};
use async_trait::async_trait;

/// What a commit through a [`FaultStore`] meets.
#[derive(Debug)]
pub enum CommitFault {
    /// Committed by the real store.
    Pass,
    /// Refused with this error; the real store is not asked.
    Fail(StoreError),
    /// Committed by the real store, then answered with this error (a reply lost on the way).
    LoseReply(StoreError),
    /// Never answered, the real store not asked (a store behind a network partition).
    Silent,
}

/// Decides each commit's fault from its batch.
type CommitRule = Box<dyn Fn(&CommitBatch) -> CommitFault + Send + Sync>;

/// A real store whose commits meet what a commit rule decides; every other call goes to the
/// real store as it is.
pub struct FaultStore<S> {
    inner: S,
    on_commit: CommitRule,
}

impl<S: Store + Inspect> FaultStore<S> {
    /// `inner` with no fault.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            on_commit: Box::new(|_| CommitFault::Pass),
        }
    }

    /// Decides each commit with `rule`, called before the real store is asked (so a rule that
    /// counts lost replies counts one even if the real commit then fails: its error is returned
    /// instead).
    pub fn on_commit(
        mut self,
        rule: impl Fn(&CommitBatch) -> CommitFault + Send + Sync + 'static,
    ) -> Self {
        self.on_commit = Box::new(rule);
        self
    }

    /// The real store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

#[async_trait]
impl<S: Store + Inspect> LedgerStore for FaultStore<S> {
    async fn commit(&self, batch: CommitBatch) -> Result<CommitOutcome, StoreError> {
        match (self.on_commit)(&batch) {
            CommitFault::Pass => self.inner.commit(batch).await,
            CommitFault::Fail(error) => Err(error),
            CommitFault::LoseReply(error) => {
                self.inner.commit(batch).await?;
                Err(error)
            }
            CommitFault::Silent => std::future::pending().await,
        }
    }

    fn commit_concurrency(&self) -> usize {
        self.inner.commit_concurrency()
    }

    async fn keys_present(
        &self,
        flow: &FlowHandle,
        table: &str,
        keys: &[String],
    ) -> Result<Vec<bool>, StoreError> {
        self.inner.keys_present(flow, table, keys).await
    }

    async fn commit_recorded(
        &self,
        flow: &FlowHandle,
        commit_id: &str,
    ) -> Result<bool, StoreError> {
        self.inner.commit_recorded(flow, commit_id).await
    }

    async fn violations(&self, batch: &CommitBatch) -> Result<Vec<Vec<bool>>, StoreError> {
        self.inner.violations(batch).await
    }

    async fn flow_progress(&self, flow: &FlowHandle) -> Result<FlowProgress, StoreError> {
        self.inner.flow_progress(flow).await
    }

    async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError> {
        self.inner.ledger_upkeep().await
    }
}

#[async_trait]
impl<S: Store + Inspect> FlowStore for FaultStore<S> {
    async fn prepare(&self, layout: &Layout) -> Result<Vec<FlowHandle>, StoreError> {
        self.inner.prepare(layout).await
    }

    async fn record_completion(&self, flow: &FlowHandle) -> Result<(), StoreError> {
        self.inner.record_completion(flow).await
    }

    async fn completions(&self, pipeline: &str) -> Result<Vec<(String, i64)>, StoreError> {
        self.inner.completions(pipeline).await
    }

    async fn reset_flow(
        &self,
        flow: &FlowHandle,
        table: Option<&str>,
        rows: ResetRows,
        claim: Option<&ClearClaim>,
    ) -> Result<(), StoreError> {
        self.inner.reset_flow(flow, table, rows, claim).await
    }

    async fn clear_interval(
        &self,
        flow: &FlowHandle,
        table: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<u64, StoreError> {
        self.inner.clear_interval(flow, table, from_ms, to_ms).await
    }

    async fn create_views(&self, views: &[crate::TypedView]) -> Result<(), StoreError> {
        self.inner.create_views(views).await
    }

    async fn read_rows(
        &self,
        table: &str,
        after: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<StoredRow>, StoreError> {
        self.inner.read_rows(table, after, limit).await
    }
}

#[async_trait]
impl<S: Store + Inspect> FeedStore for FaultStore<S> {
    async fn read_position(
        &self,
        flow: &FlowHandle,
        table: &str,
    ) -> Result<ReadPosition, StoreError> {
        self.inner.read_position(flow, table).await
    }

    async fn plan_range(
        &self,
        flow: &FlowHandle,
        table: &str,
        at: &ReadPosition,
    ) -> Result<ReadPosition, StoreError> {
        self.inner.plan_range(flow, table, at).await
    }

    async fn read_range(
        &self,
        table: &str,
        at: &ReadPosition,
        limit: usize,
    ) -> Result<Vec<FeedRow>, StoreError> {
        self.inner.read_range(table, at, limit).await
    }

    async fn feed_lag(&self, table: &str, at: &ReadPosition) -> Result<FeedLag, StoreError> {
        self.inner.feed_lag(table, at).await
    }

    async fn file_checkpoint(
        &self,
        flow: &FlowHandle,
    ) -> Result<Option<FileCheckpoint>, StoreError> {
        self.inner.file_checkpoint(flow).await
    }

    async fn save_file_checkpoint(
        &self,
        flow: &FlowHandle,
        at: &FileCheckpoint,
    ) -> Result<(), StoreError> {
        self.inner.save_file_checkpoint(flow, at).await
    }
}

#[async_trait]
impl<S: Store + Inspect> MembershipStore for FaultStore<S> {
    async fn heartbeat(&self, beat: &WorkerBeat) -> Result<(), StoreError> {
        self.inner.heartbeat(beat).await
    }

    async fn leave(&self, pipeline: &str, worker: &str) -> Result<(), StoreError> {
        self.inner.leave(pipeline, worker).await
    }

    async fn workers(
        &self,
        pipeline: &str,
        within: std::time::Duration,
    ) -> Result<Vec<WorkerRecord>, StoreError> {
        self.inner.workers(pipeline, within).await
    }

    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseGrant, StoreError> {
        self.inner.acquire_lease(request).await
    }

    async fn release_lease(
        &self,
        pipeline: &str,
        role: &str,
        holder: &str,
    ) -> Result<(), StoreError> {
        self.inner.release_lease(pipeline, role, holder).await
    }

    async fn leases(&self, pipeline: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.inner.leases(pipeline).await
    }
}

#[async_trait]
impl<S: Store + Inspect> PoolUpdateStore for FaultStore<S> {
    async fn request_pool_update(
        &self,
        pipeline: &str,
        request: &str,
        requested_by: &str,
    ) -> Result<i64, StoreError> {
        self.inner
            .request_pool_update(pipeline, request, requested_by)
            .await
    }

    async fn pool_update(
        &self,
        pipeline: &str,
        id: Option<i64>,
    ) -> Result<Option<PoolUpdate>, StoreError> {
        self.inner.pool_update(pipeline, id).await
    }

    async fn latest_pool_update(&self, pipeline: &str) -> Result<Option<PoolUpdate>, StoreError> {
        self.inner.latest_pool_update(pipeline).await
    }

    async fn drained_for_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        worker: &str,
    ) -> Result<(), StoreError> {
        self.inner
            .drained_for_pool_update(pipeline, id, worker)
            .await
    }

    async fn claim_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        worker: &str,
        stale_after: std::time::Duration,
    ) -> Result<bool, StoreError> {
        self.inner
            .claim_pool_update(pipeline, id, worker, stale_after)
            .await
    }

    async fn finish_pool_update(
        &self,
        pipeline: &str,
        id: i64,
        clearer: &str,
        done: bool,
        message: &str,
    ) -> Result<bool, StoreError> {
        self.inner
            .finish_pool_update(pipeline, id, clearer, done, message)
            .await
    }
}

#[async_trait]
impl<S: Store + Inspect> DrainStore for FaultStore<S> {
    async fn report_drain(
        &self,
        flow: &FlowHandle,
        worker: &str,
        drained: bool,
    ) -> Result<(), StoreError> {
        self.inner.report_drain(flow, worker, drained).await
    }

    async fn withdraw_drain(&self, flow: &FlowHandle, worker: &str) -> Result<(), StoreError> {
        self.inner.withdraw_drain(flow, worker).await
    }

    async fn drain_census(&self, flow: &FlowHandle) -> Result<DrainCensus, StoreError> {
        self.inner.drain_census(flow).await
    }
}

#[async_trait]
impl<S: Store + Inspect> ProgressStore for FaultStore<S> {
    async fn add_bucket_messages(
        &self,
        flow: &FlowHandle,
        messages: &[BucketMessage],
    ) -> Result<(), StoreError> {
        self.inner.add_bucket_messages(flow, messages).await
    }

    async fn bucket_counts(
        &self,
        flow: &FlowHandle,
        from_ms: i64,
    ) -> Result<Vec<BucketCounts>, StoreError> {
        self.inner.bucket_counts(flow, from_ms).await
    }

    async fn prune_buckets(&self, flow: &FlowHandle, before_ms: i64) -> Result<u64, StoreError> {
        self.inner.prune_buckets(flow, before_ms).await
    }

    async fn advance_watermark(
        &self,
        flow: &FlowHandle,
        offer: &WatermarkRecord,
        fenced_by: Option<&str>,
    ) -> Result<Option<WatermarkRecord>, StoreError> {
        self.inner.advance_watermark(flow, offer, fenced_by).await
    }

    async fn watermarks(
        &self,
        pipeline: &str,
    ) -> Result<Vec<(String, WatermarkRecord)>, StoreError> {
        self.inner.watermarks(pipeline).await
    }
}

#[async_trait]
impl<S: Store + Inspect> WindowStore for FaultStore<S> {
    async fn prepare_window_table(&self, windows_table: &str) -> Result<(), StoreError> {
        self.inner.prepare_window_table(windows_table).await
    }

    async fn emit_windows(
        &self,
        flow: &FlowHandle,
        emission: &WindowEmission,
    ) -> Result<WindowsEmitted, StoreError> {
        self.inner.emit_windows(flow, emission).await
    }
}

#[async_trait]
impl<S: Store + Inspect> RunStore for FaultStore<S> {
    async fn begin_run(&self, run: &RunStart) -> Result<RunRecord, StoreError> {
        self.inner.begin_run(run).await
    }

    async fn end_run(&self, run_id: i64, worker: &str, end: &RunEnd) -> Result<bool, StoreError> {
        self.inner.end_run(run_id, worker, end).await
    }

    async fn runs(&self, pipeline: &str, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.runs(pipeline, limit).await
    }

    async fn last_fire(&self, pipeline: &str) -> Result<Option<i64>, StoreError> {
        self.inner.last_fire(pipeline).await
    }
}

#[async_trait]
impl<S: Store + Inspect> OutboxStore for FaultStore<S> {
    async fn take_outbox(
        &self,
        pipeline: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<OutboxLetter>, StoreError> {
        self.inner.take_outbox(pipeline, limit, max_bytes).await
    }

    async fn outbox_published(&self, pipeline: &str, ids: &[i64]) -> Result<(), StoreError> {
        self.inner.outbox_published(pipeline, ids).await
    }

    async fn outbox_refused(&self, pipeline: &str, id: i64, why: &str) -> Result<(), StoreError> {
        self.inner.outbox_refused(pipeline, id, why).await
    }

    async fn outbox_census(&self, pipeline: &str) -> Result<OutboxCensus, StoreError> {
        self.inner.outbox_census(pipeline).await
    }
}

#[async_trait]
impl<S: Store + Inspect> Inspect for FaultStore<S> {
    async fn count_rows(&self, table: &str, flow: Option<&str>) -> Result<u64, StoreError> {
        self.inner.count_rows(table, flow).await
    }

    async fn key_census(&self, table: &str) -> Result<(u64, u64), StoreError> {
        self.inner.key_census(table).await
    }

    async fn tables_with_column(&self, column: &str) -> Result<Vec<String>, StoreError> {
        self.inner.tables_with_column(column).await
    }
}

/// A store whose tables can be counted: every backend, and a [`FaultStore`] around one.
pub trait InspectableStore: Store + Inspect {}

impl<T: Store + Inspect + ?Sized> InspectableStore for T {}
