//! The supervisor of a worker process: opens the store, prepares the pipeline's tables, starts
//! the metrics and control endpoints and the pool membership, then runs the flows as an
//! *update* (the scheduler starts a flow once every flow it `depends_on` has completed) until
//! they end or a signal drains them. The control API's `StartUpdate` and `ResetFlow` replace the
//! running update with a new one in the same process ([`crate::runtime::update`]); the outcomes returned
//! are the last update's.
//!
//! A once flow that drains records its completion in the store; every replica sharing the store,
//! and every later run, finds it there and leaves the flow IDLE (not re-read), so its dependents
//! start at once.

use crate::runtime::board::FlowBoard;
use crate::runtime::flows;
use crate::runtime::membership::{self, Membership};
use crate::runtime::refresh::RefreshError;
use crate::runtime::scheduler::{self, FlowOutcome, MAX_PARALLEL_BOUNDED, RunContext};
use crate::runtime::signals::Shutdown;
use crate::runtime::store_retry::{self, Retry};
use crate::runtime::update::{self, Started, UpdateRequest, UpdateSender};
use crate::serve::control::{self, ControlService};
use crate::serve::observe;
use sluice_pipeline::Pipeline;
use sluice_store::FlowStore;
use sluice_store::{Layout, Store, StoreError};
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

/// Runs a pipeline loaded for a run (`sluice_pipeline::load_for_run`: valid, and nothing in it
/// this version cannot run) to its end.
pub async fn execute(
    pipeline: &Pipeline,
    shutdown: &Shutdown,
) -> Result<Vec<FlowOutcome>, RunError> {
    let layout = flows::layout(pipeline);
    let metrics_listen = pipeline
        .metrics_listen
        .as_deref()
        .map(|listen| address("metrics.listen", listen))
        .transpose()?;
    let observed = observe::Observed::start(metrics_listen, &pipeline.name)
        .await
        .map_err(RunError::Endpoint)?;
    let readiness = observed.readiness.clone();
    let beat = membership::identity(&pipeline.name);
    let board = FlowBoard::new(
        &pipeline.name,
        pipeline.flows.iter().map(|f| (f.name.clone(), f.once)),
    );
    let (update_requests, mut requests) = mpsc::channel(update::PENDING_REQUESTS);
    let _control = start_control(
        pipeline,
        &beat.worker,
        &board,
        &readiness,
        shutdown,
        UpdateSender(update_requests),
    )
    .await?;
    let (store, mut handles, mut completed) =
        open_and_prepare(&pipeline.store, &layout, shutdown).await?;
    crate::runtime::watermarks::create_tracking_subscriptions(pipeline, shutdown.drain.clone());
    let worker = beat.worker.clone();
    let membership = Membership::start(store.clone(), beat);
    {
        let (readiness, drain) = (readiness.clone(), shutdown.drain.clone());
        tokio::spawn(async move {
            drain.cancelled().await;
            readiness.set(false);
        });
    }
    let slots = Arc::new(Semaphore::new(MAX_PARALLEL_BOUNDED));
    let mut number = 1u64;
    let outcomes = loop {
        // Each update drains on its own token, so a control request can stop it without
        // stopping the worker; a signal stops both.
        let this_update = Shutdown {
            drain: shutdown.drain.child_token(),
            give_up: shutdown.give_up.child_token(),
        };
        let ctx = RunContext {
            pipeline: pipeline.clone(),
            store: store.clone(),
            shutdown: this_update.clone(),
            board: board.clone(),
            slots: slots.clone(),
            worker: worker.clone(),
        };
        board.restart();
        let run = scheduler::run_update(ctx, handles, std::mem::take(&mut completed), &readiness);
        tokio::pin!(run);
        let request = loop {
            tokio::select! {
                outcomes = &mut run => break Err(outcomes),
                Some(request) = requests.recv() => {
                    if let Some(accepted) = accept(pipeline, &*store, request, &worker, shutdown).await {
                        break Ok(accepted);
                    }
                }
            }
        };
        let request = match request {
            Ok(request) => request,
            Err(outcomes) => break outcomes,
        };
        tracing::info!(update = number, kind = ?request.kind,
            "stopping the running flows for a new update");
        this_update.drain.cancel();
        let give_up = this_update.give_up.clone();
        let deadline = tokio::spawn(async move {
            tokio::time::sleep(crate::runtime::signals::DRAIN_DEADLINE).await;
            give_up.cancel();
        });
        for outcome in run.await {
            tracing::info!(update = number, flow = %outcome.name, state = outcome.state.name(),
                rows = outcome.counters.committed, "flow of the replaced update ended");
        }
        deadline.abort();
        let cleared = update::clear(pipeline, &request.kind, &worker).await;
        (handles, completed) = reread(&*store, &layout, shutdown).await?;
        number += 1;
        let _ = request.reply.send(cleared.map(|message| Started {
            message,
            update: number,
        }));
    };
    membership.stop().await;
    drop(observed);
    Ok(outcomes)
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
async fn read_flows(
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

/// Starts the control API when `control.listen` is set; dropping the guard stops it.
async fn start_control(
    pipeline: &Pipeline,
    worker: &str,
    board: &FlowBoard,
    readiness: &observe::Readiness,
    shutdown: &Shutdown,
    updates: UpdateSender,
) -> Result<Option<tokio_util::sync::DropGuard>, RunError> {
    let Some(listen) = &pipeline.control_listen else {
        return Ok(None);
    };
    let address = address("control.listen", listen)?;
    let token = control::token_for(address, pipeline.control_token_file.as_deref())
        .map_err(RunError::Invalid)?;
    let service = ControlService {
        pipeline: pipeline.name.clone(),
        worker: worker.to_owned(),
        board: board.clone(),
        readiness: readiness.clone(),
        drain: shutdown.drain.clone(),
        give_up: shutdown.give_up.clone(),
        updates,
    };
    let stop = tokio_util::sync::CancellationToken::new();
    control::serve(address, token, service, stop.clone())
        .await
        .map_err(|e| RunError::Endpoint(format!("control.listen {listen}: {e}")))?;
    Ok(Some(stop.drop_guard()))
}

/// A `listen` setting as a socket address (`127.0.0.1:9464`).
fn address(setting: &str, listen: &str) -> Result<std::net::SocketAddr, RunError> {
    listen.parse().map_err(|_| {
        RunError::Invalid(format!(
            "{setting}: {listen:?} is not an address like 127.0.0.1:9464"
        ))
    })
}

/// The store, the pipeline's flow handles, and the names of once flows recorded complete.
pub type Prepared = (
    Arc<dyn Store>,
    Vec<sluice_store::FlowHandle>,
    HashSet<String>,
);

/// Opens the store, prepares the layout and reads which once flows completed, retrying with
/// backoff while the store is unavailable (logged once per backoff step), until it works or the
/// run is stopped.
pub async fn open_and_prepare(
    url: &str,
    layout: &Layout,
    shutdown: &Shutdown,
) -> Result<Prepared, RunError> {
    store_retry::until_stored(
        "open the store",
        Retry::WhileUnavailable,
        &shutdown.drain,
        || async {
            let store = sluice_store::open(url)?;
            let (handles, completed) = read_flows(&*store, layout).await?;
            Ok((store, handles, completed))
        },
    )
    .await
    .map_err(RunError::Store)
}
