//! `sluice run`: open the store, prepare the pipeline's tables, run its flows (a flow starts once
//! every flow it `depends_on` has completed), drain on a signal, report. The flows run as an
//! *update*; the control API's `StartUpdate` and `ResetFlow` replace the running update with a
//! new one in the same process ([`crate::update`]), and the outcomes printed are the last
//! update's.
//!
//! A once flow that drains records its completion in the store; every replica sharing the store,
//! and every later run, finds it there and leaves the flow IDLE (not re-read), so its dependents
//! start at once.

use crate::control::{self, ControlService, FlowBoard};
use crate::flows;
use crate::membership::{self, Membership};
use crate::observe;
use crate::refresh::RefreshError;
use crate::scheduler::{self, MAX_PARALLEL_BOUNDED, RunContext};
pub use crate::scheduler::{FlowOutcome, FlowState};
use crate::signals::{self, Shutdown};
use crate::update::{self, Started, UpdateRequest, UpdateSender};
use sluice_connector::{Backoff, Snapshot};
use sluice_pipeline::Pipeline;
use sluice_store::{Layout, Store, StoreError};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;

/// Why a run could not happen at all.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The file is valid but uses features this version cannot run.
    #[error("{0}")]
    Unsupported(String),
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

/// What `run` clears before it starts (`--full-refresh`, `--refresh FLOW,...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refresh {
    /// Every flow.
    All,
    /// These flows (none: a plain run).
    Flows(Vec<String>),
}

/// `sluice run -c FILE`.
pub async fn run_file(path: &Path, refresh: Refresh) -> ExitCode {
    let pipeline = match sluice_pipeline::load(path) {
        Ok(pipeline) => pipeline,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    let flows = match refresh {
        Refresh::All => pipeline.flows.iter().map(|f| f.name.clone()).collect(),
        Refresh::Flows(flows) => flows,
    };
    if !flows.is_empty() {
        if let Err(error) = crate::refresh::refresh(&pipeline, &flows, None, None).await {
            eprintln!("{}: {error}", path.display());
            return error.exit_code();
        }
        println!("cleared before the run: {}", flows.join(", "));
    }
    let shutdown = match signals::install() {
        Ok(shutdown) => shutdown,
        Err(error) => {
            eprintln!("sluice: cannot install signal handlers: {error}");
            return ExitCode::from(1);
        }
    };
    match execute(&pipeline, &shutdown).await {
        Ok(outcomes) => {
            for outcome in &outcomes {
                print_outcome(outcome);
            }
            let failed = outcomes
                .iter()
                .any(|o| matches!(o.state, FlowState::Failed(_)));
            if failed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error @ (RunError::Unsupported(_) | RunError::Invalid(_))) => {
            eprintln!("{}: {error}", path.display());
            ExitCode::from(2)
        }
        Err(RunError::Store(error)) if shutdown.drain.is_cancelled() && error.is_transient() => {
            eprintln!(
                "sluice: stopped before the store could be reached ({error}); nothing was received"
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("sluice: {error}");
            ExitCode::from(1)
        }
    }
}

fn print_outcome(outcome: &FlowOutcome) {
    let c = &outcome.counters;
    let state = match &outcome.state {
        FlowState::Idle => "IDLE (completed earlier; not re-read)".to_owned(),
        FlowState::Skipped(why) | FlowState::Failed(why) => {
            format!("{} ({why})", outcome.state.name())
        }
        other => other.name().to_owned(),
    };
    println!(
        "flow {}: {state}; received {}, rows {}, dead letters {}, duplicates {} (memory {}, store {}), acked {}, nacked {}",
        outcome.name,
        c.received,
        c.committed,
        c.dead_lettered,
        c.duplicates_memory + c.duplicates_store,
        c.duplicates_memory,
        c.duplicates_store,
        c.acked,
        c.nacked
    );
    if outcome.skipped > 0 {
        println!(
            "  {}: {} records skipped, committed before",
            outcome.name, outcome.skipped
        );
    }
}

/// Runs a validated pipeline to its end.
pub async fn execute(
    pipeline: &Pipeline,
    shutdown: &Shutdown,
) -> Result<Vec<FlowOutcome>, RunError> {
    let problems = flows::unsupported(pipeline);
    if !problems.is_empty() {
        return Err(RunError::Unsupported(problems.join("\n")));
    }
    let layout = update::layout(pipeline);
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
    crate::watermarks::create_tracking_subscriptions(pipeline, shutdown.drain.clone());
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
        let run = run_update(ctx, handles, std::mem::take(&mut completed), &readiness);
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
            tokio::time::sleep(crate::signals::DRAIN_DEADLINE).await;
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

/// Runs every flow of one update to its end (a flow starts once its predecessors succeeded)
/// and returns their outcomes in the pipeline's order.
async fn run_update(
    ctx: RunContext,
    handles: Vec<sluice_store::FlowHandle>,
    completed: HashSet<String>,
    readiness: &observe::Readiness,
) -> Vec<FlowOutcome> {
    let pipeline = &ctx.pipeline;
    // One "finished" signal per flow: None while running, Some(success) at the end.
    let mut finished = HashMap::new();
    let mut senders = Vec::new();
    for flow in &pipeline.flows {
        let (tx, rx) = watch::channel(None::<bool>);
        finished.insert(flow.name.clone(), rx);
        senders.push(tx);
    }
    let graph = sluice_pipeline::graph::FlowGraph::new(pipeline);
    let mut tasks = JoinSet::new();
    let mut names = HashMap::new();
    for ((flow, handle), done) in pipeline.flows.iter().zip(handles).zip(senders) {
        let predecessors: Vec<_> = graph
            .waits_for(&flow.name)
            .into_iter()
            .filter_map(|name| {
                let rx = finished.get(name).cloned()?;
                Some((name.to_owned(), rx))
            })
            .collect();
        let already_complete = flow.once && completed.contains(&flow.name);
        let (ctx, flow) = (ctx.clone(), flow.clone());
        let name = flow.name.clone();
        let task = tasks.spawn(async move {
            let outcome = if already_complete {
                tracing::info!(flow = %flow.name, "once flow completed earlier; not re-read");
                // A sink file its last run left behind is still published.
                scheduler::recover_sink(&ctx, &flow, &handle).await;
                FlowOutcome {
                    name: flow.name.clone(),
                    state: FlowState::Idle,
                    counters: Snapshot::default(),
                    skipped: 0,
                }
            } else {
                scheduler::run_flow(&ctx, &flow, handle, predecessors).await
            };
            ctx.board.set(&flow.name, outcome.state.name(), None);
            let _ = done.send(Some(outcome.state.succeeded()));
            outcome
        });
        names.insert(task.id(), name);
    }
    // Ready while the update runs and no flow is still starting (its store and Pub/Sub
    // answered); not ready while one cannot start, or once a drain began.
    let watch_readiness = {
        let (readiness, board, drain) = (
            readiness.clone(),
            ctx.board.clone(),
            ctx.shutdown.drain.clone(),
        );
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(READINESS_INTERVAL);
            loop {
                ticks.tick().await;
                readiness.set(!drain.is_cancelled() && !board.any_starting());
            }
        })
    };
    let mut outcomes = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(outcome) => outcomes.push(outcome),
            Err(error) => {
                tracing::error!(%error, "a flow task panicked");
                outcomes.push(FlowOutcome {
                    name: names.get(&error.id()).cloned().unwrap_or_default(),
                    state: FlowState::Failed(format!("panicked: {error}")),
                    counters: Snapshot::default(),
                    skipped: 0,
                });
            }
        }
    }
    let order: HashMap<_, _> = pipeline
        .flows
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name.clone(), i))
        .collect();
    outcomes.sort_by_key(|o| order.get(&o.name).copied());
    watch_readiness.abort();
    outcomes
}

/// How often readiness follows the flows' states.
const READINESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// The flow handles and completions again, after a clear (retrying while the store is
/// unavailable, like the first read).
async fn reread(
    store: &dyn Store,
    layout: &Layout,
    shutdown: &Shutdown,
) -> Result<(Vec<sluice_store::FlowHandle>, HashSet<String>), RunError> {
    retrying(shutdown, || read_flows(store, layout)).await
}

/// Prepares the layout; returns the flow handles and the once flows recorded complete.
async fn read_flows(
    store: &dyn Store,
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

/// Runs `attempt` until it works, retrying with backoff (logged once per backoff step) while
/// the store is unavailable, until the run is stopped.
async fn retrying<T, F, Fut>(shutdown: &Shutdown, mut attempt: F) -> Result<T, RunError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut backoff = Backoff::default();
    loop {
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(error) if error.is_transient() && !shutdown.drain.is_cancelled() => {
                let delay = backoff.next_delay();
                tracing::warn!(step = backoff.step(), retry_in_ms = delay.as_millis() as u64,
                    %error, "store unavailable; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.drain.cancelled() => {}
                }
            }
            Err(error) => return Err(RunError::Store(error)),
        }
    }
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
    retrying(shutdown, || async {
        let store = sluice_store::open(url)?;
        let (handles, completed) = read_flows(&*store, layout).await?;
        Ok((store, handles, completed))
    })
    .await
}
