//! The update loop of a worker process: runs the pipeline's flows as one update at a time
//! (the scheduler starts each flow when its predecessors succeeded), and carries out the
//! control API's `StartUpdate` and `ResetFlow`: a request accepted while an update runs drains
//! it, clears what was asked and starts a new update in its place; one accepted between runs
//! (a scheduled pipeline waiting for its fire) clears and asks for a run at once. While other
//! replicas of the pipeline run, a request becomes a pool update (`updates/pool.rs`), and so
//! does one another replica or `sluice reset` asked for: this worker stops its update, takes
//! part until the update ends, and starts a new one; it takes part in an unfinished one before
//! each update it starts. What stops an update comes from `interrupts.rs`.

use crate::runtime::flow::board::FlowBoard;
use crate::runtime::flow::executor;
use crate::runtime::flow::outcome::FlowOutcome;
use crate::runtime::flow::run_context::{RunContext, RunScope};
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::pool::liveness::Liveness;
use crate::runtime::run_error::RunError;
use crate::runtime::updates::interrupts::{self, Interrupt, Interrupts};
use crate::runtime::updates::pool::{self, Part};
use crate::runtime::updates::prepare::read_flows;
use crate::runtime::updates::refresh::Clearing;
use crate::runtime::updates::refresh_error::RefreshError;
use crate::runtime::updates::request::{self, Started, UpdateRequest};
use crate::serve::observe;
use sluice_pipeline::Pipeline;
use sluice_store::{Layout, Store, StoreError};
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};

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
    /// This worker's standing in the pool, renewed by its heartbeats.
    pub liveness: Liveness,
}

/// What runs a pipeline's updates in this worker: the store, the flows' handles and board,
/// and the control requests that replace a running update.
pub struct Updates<'a> {
    pipeline: &'a Pipeline,
    layout: Layout,
    store: Arc<dyn Store>,
    board: FlowBoard,
    readiness: observe::Readiness,
    slots: Arc<Semaphore>,
    worker: String,
    handles: Vec<sluice_store::FlowHandle>,
    completed: HashSet<String>,
    /// An update ran since the handles and completions were read: read them again first.
    ran: bool,
    number: u64,
    /// The control requests and the pipeline's pool updates.
    interrupts: Interrupts,
    /// The last pool update this worker took part in.
    handled: i64,
    /// The first look for an unfinished pool update was made.
    joined: bool,
    /// This worker's standing in the pool: an update starts only while it is live, and stops
    /// when it lapses.
    liveness: Liveness,
    /// The fence epoch the kept sources were opened in.
    kept_epoch: u64,
}

impl<'a> Updates<'a> {
    /// The pipeline.
    pub fn pipeline(&self) -> &'a Pipeline {
        self.pipeline
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// This worker's id in the pool.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// The updates of a prepared worker.
    pub fn new(prepared: Prepared<'a>) -> Self {
        let interrupts = Interrupts::start(
            prepared.requests,
            prepared.store.clone(),
            &prepared.pipeline.name,
        );
        Self {
            pipeline: prepared.pipeline,
            layout: prepared.layout,
            store: prepared.store,
            board: prepared.board,
            readiness: prepared.readiness,
            slots: prepared.slots,
            worker: prepared.worker,
            handles: prepared.handles,
            completed: prepared.completed,
            ran: false,
            number: 1,
            interrupts,
            handled: 0,
            joined: false,
            kept_epoch: prepared.liveness.gate().epoch(),
            liveness: prepared.liveness,
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
            // Beaten first: a clearer that has not seen this worker stop waits for it.
            self.wait_until_live(shutdown).await?;
            self.join_unfinished(shutdown).await?;
            let gate = self.liveness.gate();
            if gate.epoch() != self.kept_epoch {
                // Kept streams opened before a lapse ack through its closed gate: reopened.
                close_kept(&scope).await;
                self.kept_epoch = gate.epoch();
            }
            let scope = RunScope {
                acks: Some(Arc::new(gate)),
                ..scope.clone()
            };
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
            let run = executor::run_update(
                ctx,
                self.handles.clone(),
                std::mem::take(&mut self.completed),
                &readiness,
            );
            tokio::pin!(run);
            let handled = self.handled;
            let interrupt = loop {
                tokio::select! {
                    outcomes = &mut run => break Err(outcomes),
                    came = self.interrupts.next(handled) => {
                        let accepted =
                            interrupts::accept(came, self.pipeline, &*self.store, &self.worker, shutdown)
                                .await;
                        if let Some(accepted) = accepted {
                            break Ok(accepted);
                        }
                    }
                    () = self.liveness.lapsed() => break Ok(Interrupt::Fenced),
                }
            };
            let interrupt = match interrupt {
                Ok(interrupt) => interrupt,
                Err(outcomes) => {
                    self.ran = true;
                    return Ok(outcomes);
                }
            };
            tracing::info!(
                update = self.number,
                "stopping the running flows for a new update"
            );
            this_update.drain.cancel();
            let give_up = this_update.give_up.clone();
            let deadline = tokio::spawn(async move {
                tokio::time::sleep(crate::runtime::kit::signals::DRAIN_DEADLINE).await;
                give_up.cancel();
            });
            for outcome in run.await {
                tracing::info!(update = self.number, flow = %outcome.name,
                    state = outcome.state.name(), rows = outcome.counters.committed,
                    "flow of the replaced update ended");
            }
            deadline.abort();
            // What kept streams hold predates what the request clears: given back first.
            close_kept(&scope).await;
            match interrupt {
                Interrupt::Local(request) => self.clear(request, shutdown).await?,
                Interrupt::Asked(request, id) => {
                    self.take_part(Some(request), id, shutdown).await?;
                }
                Interrupt::Joined(id) => self.take_part(None, id, shutdown).await?,
                Interrupt::Fenced => self.after_lapse(shutdown).await?,
            }
        }
    }

    /// Waits until this worker is live (its heartbeat succeeded within the fence), so no
    /// update starts unseen by the pool (and no run begins unseen: another worker's begin
    /// waits only for runs of workers it sees alive).
    pub(crate) async fn wait_until_live(&self, shutdown: &Shutdown) -> Result<(), RunError> {
        if self.liveness.is_live() {
            return Ok(());
        }
        tracing::info!("waiting for a heartbeat to reach the store before starting flows");
        let patience = store_retry::run_patience(self.pipeline);
        tokio::select! {
            () = self.liveness.restored() => Ok(()),
            _ = shutdown.drain.cancelled() => Err(RunError::Store(StoreError::Unavailable(
                "stopped before a heartbeat reached the store".to_owned(),
            ))),
            () = store_retry::patience_spent(patience) => {
                Err(RunError::Store(StoreError::Unavailable(format!(
                    "no heartbeat reached the store for {}s; gave up (give_up_after)",
                    patience.unwrap_or_default().as_secs()
                ))))
            }
        }
    }

    /// After the flows stopped at a lapse of the fence: once beats succeed again, the flows
    /// are read again (a clear may have happened meanwhile) and a pool update that ended in
    /// the meantime counts as handled (this worker starts afresh anyway).
    async fn after_lapse(&mut self, shutdown: &Shutdown) -> Result<(), RunError> {
        tracing::warn!(
            "heartbeats failed past the fence: flows stopped, acks withheld; they start again \
             with empty memory once the store answers"
        );
        self.wait_until_live(shutdown).await?;
        if let Ok(Some(latest)) = self.store.latest_pool_update(&self.pipeline.name).await
            && latest.state.ended()
        {
            self.handled = self.handled.max(latest.id);
        }
        self.reread(shutdown).await?;
        self.ran = false;
        self.number += 1;
        tracing::info!(
            update = self.number,
            "heartbeats succeed again; starting the flows afresh"
        );
        Ok(())
    }

    /// Takes part in the pipeline's unfinished pool update, if there is one this worker has
    /// not, before it starts flows. The first time, the flows are read again too: this worker
    /// has beaten since it first read them, so an update cleared before that is in the store.
    async fn join_unfinished(&mut self, shutdown: &Shutdown) -> Result<(), RunError> {
        let unfinished = store_retry::until_stored_within(
            "look for a pool update in progress",
            Retry::WhileUnavailable,
            &shutdown.drain,
            store_retry::run_patience(self.pipeline),
            || self.store.pool_update(&self.pipeline.name, None),
        )
        .await
        .map_err(RunError::Store)?;
        match unfinished {
            Some(update) if update.id > self.handled => {
                tracing::info!(
                    update = update.id,
                    "a pool update is in progress; taking part before running flows"
                );
                self.take_part(None, update.id, shutdown).await
            }
            _ if !std::mem::replace(&mut self.joined, true) => {
                // Updates that ended before this worker started are not its to take part in.
                if let Ok(Some(latest)) = self.store.latest_pool_update(&self.pipeline.name).await
                    && latest.state.ended()
                {
                    self.handled = self.handled.max(latest.id);
                }
                self.reread(shutdown).await
            }
            _ => Ok(()),
        }
    }

    /// Takes part in pool update `id` with this worker's flows stopped, until it ends (or the
    /// worker drains); reads the flows again and answers `asked`, the request that this worker
    /// recorded as the update, if it did.
    async fn take_part(
        &mut self,
        asked: Option<UpdateRequest>,
        id: i64,
        shutdown: &Shutdown,
    ) -> Result<(), RunError> {
        let part = Part {
            pipeline: self.pipeline,
            store: &self.store,
            me: &self.worker,
            stopped_flows: true,
            asker: asked.is_some(),
        };
        let outcome = tokio::select! {
            outcome = pool::take_part(&part, id) => outcome,
            _ = shutdown.drain.cancelled() => Err(RefreshError::Failed(
                "the worker is draining; the pool update goes on without it".to_owned(),
            )),
        };
        self.handled = self.handled.max(id);
        self.joined = true;
        match &outcome {
            Ok(message) => tracing::info!(update = id, %message, "pool update done; resuming"),
            Err(error) => tracing::warn!(update = id, %error, "pool update failed; resuming"),
        }
        self.reread(shutdown).await?;
        self.ran = false;
        self.number += 1;
        if let Some(request) = asked {
            let _ = request.reply.send(outcome.map(|message| Started {
                message,
                update: self.number,
            }));
        }
        Ok(())
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
            let handled = self.handled;
            let interrupt = tokio::select! {
                came = &mut until => return Ok(Waited::Came(came)),
                came = self.interrupts.next(handled) => {
                    interrupts::accept(came, self.pipeline, &*self.store, &self.worker, shutdown)
                        .await
                }
            };
            match interrupt {
                None => {}
                Some(Interrupt::Local(request)) => {
                    self.clear(request, shutdown).await?;
                    return Ok(Waited::Requested);
                }
                Some(Interrupt::Asked(request, id)) => {
                    self.take_part(Some(request), id, shutdown).await?;
                    return Ok(Waited::Requested);
                }
                // Another's request: this worker had no flow running, and waits on.
                Some(Interrupt::Joined(id)) => self.take_part(None, id, shutdown).await?,
                // Never raised between runs: no flow runs to stop.
                Some(Interrupt::Fenced) => {}
            }
        }
    }

    /// The flows' handles in file order (read again after each update).
    pub fn handles(&self) -> &[sluice_store::FlowHandle] {
        &self.handles
    }

    /// Clears what an accepted request asks, reads the flows again and answers it.
    async fn clear(&mut self, request: UpdateRequest, shutdown: &Shutdown) -> Result<(), RunError> {
        let cleared = request::clear(
            self.pipeline,
            &request.kind,
            Clearing {
                stopped: std::slice::from_ref(&self.worker),
                claim: None,
            },
        )
        .await;
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
        (self.handles, self.completed) = reread(
            &*self.store,
            &self.layout,
            shutdown,
            store_retry::run_patience(self.pipeline),
        )
        .await?;
        Ok(())
    }
}

/// Stops the scope's kept Pub/Sub sources: what they hold is given back.
async fn close_kept(scope: &RunScope) {
    if let Some(kept) = &scope.kept {
        for source in kept.values() {
            source.close().await;
        }
    }
}

/// The flow handles and completions again, after a clear (retrying while the store is
/// unavailable, like the first read).
async fn reread(
    store: &dyn Store,
    layout: &Layout,
    shutdown: &Shutdown,
    give_up_after: Option<std::time::Duration>,
) -> Result<(Vec<sluice_store::FlowHandle>, HashSet<String>), RunError> {
    store_retry::until_stored_within(
        "read the flows",
        Retry::WhileUnavailable,
        &shutdown.drain,
        give_up_after,
        || read_flows(store, layout),
    )
    .await
    .map_err(RunError::Store)
}
