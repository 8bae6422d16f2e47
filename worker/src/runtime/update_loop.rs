//! The update loop of a worker process: runs the pipeline's flows as one update at a time
//! (the scheduler starts each flow when its predecessors succeeded), and carries out the
//! control API's `StartUpdate` and `ResetFlow`: a request accepted while an update runs drains
//! it, clears what was asked and starts a new update in its place; one accepted between runs
//! (a scheduled pipeline waiting for its fire) clears and asks for a run at once.

use crate::runtime::board::FlowBoard;
use crate::runtime::flows::RunScope;
use crate::runtime::refresh::RefreshError;
use crate::runtime::scheduler::{self, FlowOutcome, RunContext};
use crate::runtime::signals::Shutdown;
use crate::runtime::store_retry::{self, Retry};
use crate::runtime::update::{self, Started, UpdateRequest};
use crate::serve::observe;
use sluice_pipeline::Pipeline;
use sluice_store::{FlowStore, Layout, Store, StoreError};
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};

/// Why a run could not happen at all.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A setting the parser accepted is unusable (an address that is not one, a control API
    /// beyond loopback without its token file): invalid input, exit 2.
    #[error("{0}")]
    Invalid(String),
    /// The metrics or control endpoint could not be started (address in use): exit 1.
    #[error("{0}")]
    Endpoint(String),
    /// The store could not be opened or prepared, and retrying is pointless or was stopped.
    #[error("store: {0}")]
    Store(StoreError),
}

/// What ended a wait between runs ([`Updates::serve_requests_until`]).
pub enum Waited<T> {
    /// What was waited for came.
    Came(T),
    /// A control request asked for a run (and what it clears is cleared).
    Requested,
}

/// What a worker has prepared when its updates can start.
pub struct Prepared<'a> {
    /// The pipeline.
    pub pipeline: &'a Pipeline,
    /// Its layout in the store.
    pub layout: Layout,
    /// The store, opened and prepared.
    pub store: Arc<dyn Store>,
    /// The flows' live states.
    pub board: FlowBoard,
    /// The worker's readiness.
    pub readiness: observe::Readiness,
    /// Slots of bounded work.
    pub slots: Arc<Semaphore>,
    /// This worker's id in the pool.
    pub worker: String,
    /// The control API's update requests.
    pub requests: mpsc::Receiver<UpdateRequest>,
    /// The flows' handles, in file order.
    pub handles: Vec<sluice_store::FlowHandle>,
    /// The once flows recorded complete.
    pub completed: HashSet<String>,
}

/// What runs a pipeline's updates in this worker: the store, the flows' handles and board,
/// and the control requests that replace a running update.
pub struct Updates<'a> {
    /// The pipeline.
    pub pipeline: &'a Pipeline,
    layout: Layout,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The flows' live states.
    pub board: FlowBoard,
    readiness: observe::Readiness,
    slots: Arc<Semaphore>,
    /// This worker's id in the pool.
    pub worker: String,
    requests: mpsc::Receiver<UpdateRequest>,
    handles: Vec<sluice_store::FlowHandle>,
    completed: HashSet<String>,
    /// An update ran since the handles and completions were read: read them again first.
    ran: bool,
    number: u64,
}

impl<'a> Updates<'a> {
    /// The updates of a prepared worker.
    pub fn new(prepared: Prepared<'a>) -> Self {
        Self {
            pipeline: prepared.pipeline,
            layout: prepared.layout,
            store: prepared.store,
            board: prepared.board,
            readiness: prepared.readiness,
            slots: prepared.slots,
            worker: prepared.worker,
            requests: prepared.requests,
            handles: prepared.handles,
            completed: prepared.completed,
            ran: false,
            number: 1,
        }
    }

    /// Runs the flows as one update until they end (triggered, once flows) or a signal drains
    /// them; a control request accepted meanwhile drains them, clears what it asks and starts a
    /// new update in its place. `scope` is what the run gives its flows (its data interval,
    /// kept sources). Returns the last update's outcomes.
    pub async fn run(
        &mut self,
        shutdown: &Shutdown,
        scope: RunScope,
    ) -> Result<Vec<FlowOutcome>, RunError> {
        if std::mem::take(&mut self.ran) {
            self.reread(shutdown).await?;
        }
        loop {
            // Each update drains on its own token, so a control request can stop it without
            // stopping the worker; a signal stops both.
            let this_update = Shutdown {
                drain: shutdown.drain.child_token(),
                give_up: shutdown.give_up.child_token(),
            };
            let ctx = RunContext {
                pipeline: self.pipeline.clone(),
                store: self.store.clone(),
                shutdown: this_update.clone(),
                board: self.board.clone(),
                slots: self.slots.clone(),
                worker: self.worker.clone(),
                scope: scope.clone(),
            };
            self.board.restart();
            let readiness = self.readiness.clone();
            let run = scheduler::run_update(
                ctx,
                self.handles.clone(),
                std::mem::take(&mut self.completed),
                &readiness,
            );
            tokio::pin!(run);
            let request = loop {
                tokio::select! {
                    outcomes = &mut run => break Err(outcomes),
                    Some(request) = self.requests.recv() => {
                        if let Some(accepted) =
                            accept(self.pipeline, &*self.store, request, &self.worker, shutdown).await
                        {
                            break Ok(accepted);
                        }
                    }
                }
            };
            let request = match request {
                Ok(request) => request,
                Err(outcomes) => {
                    self.ran = true;
                    return Ok(outcomes);
                }
            };
            tracing::info!(update = self.number, kind = ?request.kind,
                "stopping the running flows for a new update");
            this_update.drain.cancel();
            let give_up = this_update.give_up.clone();
            let deadline = tokio::spawn(async move {
                tokio::time::sleep(crate::runtime::signals::DRAIN_DEADLINE).await;
                give_up.cancel();
            });
            for outcome in run.await {
                tracing::info!(update = self.number, flow = %outcome.name,
                    state = outcome.state.name(), rows = outcome.counters.committed,
                    "flow of the replaced update ended");
            }
            deadline.abort();
            // What kept streams hold predates what the request clears: given back first.
            if let Some(kept) = &scope.kept {
                for source in kept.values() {
                    source.close().await;
                }
            }
            self.clear(request, shutdown).await?;
        }
    }

    /// Marks the worker ready while it waits between runs (it serves and would run the next
    /// fire), unless it drains.
    pub fn ready_between_runs(&self, shutdown: &Shutdown) {
        self.readiness.set(!shutdown.drain.is_cancelled());
    }

    /// Waits for `until` while no update runs (a scheduled pipeline between runs), carrying
    /// out a control request that comes meanwhile (what it asks is cleared): then
    /// [`Waited::Requested`], so that a run starts now.
    pub async fn serve_requests_until<T>(
        &mut self,
        shutdown: &Shutdown,
        until: impl std::future::Future<Output = T>,
    ) -> Result<Waited<T>, RunError> {
        tokio::pin!(until);
        loop {
            tokio::select! {
                came = &mut until => return Ok(Waited::Came(came)),
                Some(request) = self.requests.recv() => {
                    if let Some(accepted) =
                        accept(self.pipeline, &*self.store, request, &self.worker, shutdown).await
                    {
                        self.clear(accepted, shutdown).await?;
                        return Ok(Waited::Requested);
                    }
                }
            }
        }
    }

    /// The flows' handles in file order (read again after each update).
    pub fn handles(&self) -> &[sluice_store::FlowHandle] {
        &self.handles
    }

    /// Clears what an accepted request asks, reads the flows again and answers it.
    async fn clear(&mut self, request: UpdateRequest, shutdown: &Shutdown) -> Result<(), RunError> {
        let cleared = update::clear(self.pipeline, &request.kind, &self.worker).await;
        self.reread(shutdown).await?;
        self.ran = false;
        self.number += 1;
        let _ = request.reply.send(cleared.map(|message| Started {
            message,
            update: self.number,
        }));
        Ok(())
    }

    /// The flow handles and completions again (after a clear, or after a run for the next).
    async fn reread(&mut self, shutdown: &Shutdown) -> Result<(), RunError> {
        (self.handles, self.completed) = reread(&*self.store, &self.layout, shutdown).await?;
        Ok(())
    }
}

/// Checks a control request against the running update; answers a refused one at once.
async fn accept(
    pipeline: &Pipeline,
    store: &dyn Store,
    request: UpdateRequest,
    worker: &str,
    shutdown: &Shutdown,
) -> Option<UpdateRequest> {
    if shutdown.drain.is_cancelled() {
        let _ = request.reply.send(Err(RefreshError::Failed(
            "the worker is draining; start a new one instead".to_owned(),
        )));
        return None;
    }
    match update::check(pipeline, store, &request.kind, worker).await {
        Ok(()) => Some(request),
        Err(error) => {
            tracing::warn!(%error, kind = ?request.kind, "update request refused");
            let _ = request.reply.send(Err(error));
            None
        }
    }
}

/// The flow handles and completions again, after a clear (retrying while the store is
/// unavailable, like the first read).
async fn reread(
    store: &dyn Store,
    layout: &Layout,
    shutdown: &Shutdown,
) -> Result<(Vec<sluice_store::FlowHandle>, HashSet<String>), RunError> {
    store_retry::until_stored(
        "read the flows",
        Retry::WhileUnavailable,
        &shutdown.drain,
        || read_flows(store, layout),
    )
    .await
    .map_err(RunError::Store)
}

/// Prepares the layout; returns the flow handles and the once flows recorded complete.
pub async fn read_flows(
    store: &dyn FlowStore,
    layout: &Layout,
) -> Result<(Vec<sluice_store::FlowHandle>, HashSet<String>), StoreError> {
    let handles = store.prepare(layout).await?;
    let completed = store
        .completions(&layout.pipeline)
        .await?
        .into_iter()
        .map(|(flow, _)| flow)
        .collect();
    Ok((handles, completed))
}
