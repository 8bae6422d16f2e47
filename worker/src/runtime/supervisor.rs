//! The supervisor of a worker process: opens the store, prepares the pipeline's tables, starts the
//! metrics and control endpoints and the pool membership, then runs the flows as *updates*
//! (`updates/update_loop.rs`: the scheduler starts a flow once every flow it `depends_on` has
//! completed): a continuous pipeline's one update until a signal drains it, a triggered pipeline's
//! runs (`runs/timetable.rs`: one, or one at each fire of its schedule). The control API's
//! `StartUpdate` and `ResetFlow` replace the running update with a new one in the same process
//! ([`crate::runtime::updates::request`]); the outcomes returned are the last update's.
//!
//! A once flow that drains records its completion in the store; every replica sharing the store,
//! and every later run, finds it there and leaves the flow IDLE (not re-read), so its dependents
//! start at once.

use crate::runtime::flow::board::FlowBoard;
use crate::runtime::flow::build;
use crate::runtime::flow::executor::{FlowOutcome, MAX_PARALLEL_BOUNDED};
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::pool::liveness::Liveness;
use crate::runtime::pool::membership::{self, Membership};
use crate::runtime::updates::request::{self, UpdateSender};
pub use crate::runtime::updates::update_loop::RunError;
use crate::runtime::updates::update_loop::{Prepared, Updates, read_flows};
use crate::serve::control::{self, ControlService};
use crate::serve::observe;
use sluice_pipeline::{Mode, Pipeline};
use sluice_store::{Layout, Store};
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};

/// Runs a pipeline loaded for a run (`sluice_pipeline::load_for_run`: valid, and nothing in it
/// this version cannot run) to its end.
pub async fn execute(
    pipeline: &Pipeline,
    shutdown: &Shutdown,
) -> Result<Vec<FlowOutcome>, RunError> {
    let layout = build::layout(pipeline);
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
    let (update_requests, requests) = mpsc::channel(request::PENDING_REQUESTS);
    let _control = start_control(
        pipeline,
        &beat.worker,
        &board,
        &readiness,
        shutdown,
        UpdateSender(update_requests),
    )
    .await?;
    let (store, handles, completed) = open_and_prepare(&pipeline.store, &layout, shutdown).await?;
    crate::runtime::flow::watermarks::create_tracking_subscriptions(
        pipeline,
        shutdown.drain.clone(),
    );
    let worker = beat.worker.clone();
    // Beats at once; no update starts before a beat succeeded, so a pool update's clearer
    // that has not seen this worker report its flows stopped waits for it (`updates/pool.rs`).
    let liveness = Liveness::new();
    let membership = Membership::start(store.clone(), store.clone(), beat, liveness.clone());
    let publishing = crate::runtime::flow::dead_letters::start(pipeline, &store, &worker)
        .await
        .map_err(RunError::Invalid)?;
    {
        let (readiness, drain) = (readiness.clone(), shutdown.drain.clone());
        tokio::spawn(async move {
            drain.cancelled().await;
            readiness.set(false);
        });
    }
    let mut updates = Updates::new(Prepared {
        pipeline,
        layout,
        store,
        board,
        readiness,
        slots: Arc::new(Semaphore::new(MAX_PARALLEL_BOUNDED)),
        worker,
        requests,
        handles,
        completed,
        liveness,
    });
    let outcomes = match (&pipeline.schedule, pipeline.mode) {
        (Some(schedule), _) => {
            crate::runtime::runs::timetable::drive(&mut updates, schedule, shutdown).await?
        }
        (None, Mode::Triggered) => {
            crate::runtime::runs::timetable::run_once(&mut updates, shutdown).await?
        }
        (None, Mode::Continuous) => updates.run(shutdown, Default::default()).await?,
    };
    if let Some(publishing) = publishing {
        publishing.finish(&shutdown.give_up).await;
    }
    membership.stop().await;
    drop(observed);
    Ok(outcomes)
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
        access: control::Access::new(&pipeline.name, address, token),
    };
    let stop = tokio_util::sync::CancellationToken::new();
    control::serve(address, service, stop.clone())
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
pub type Opened = (
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
) -> Result<Opened, RunError> {
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
