//! The supervisor of a worker process: starts the metrics and control endpoints, opens the store
//! and prepares the pipeline's tables, starts the pool membership, then runs the flows as
//! *updates* (`updates/update_loop.rs`: the scheduler starts a flow once every flow it
//! `depends_on` has completed), run after run (`runs/timetable.rs`): a continuous pipeline's one
//! update until a signal drains it, a triggered pipeline's one run, or one at each fire of its
//! schedule. Each step is a call into the room that owns it. The control API's
//! `StartUpdate` and `ResetFlow` replace the running update with a new one in the same process
//! ([`crate::runtime::updates::request`]); the outcomes returned are the last update's.
//!
//! A once flow that drains records its completion in the store; every replica sharing the store,
//! and every later run, finds it there and leaves the flow IDLE (not re-read), so its dependents
//! start at once.

use crate::runtime::flow::board::FlowBoard;
use crate::runtime::flow::executor::MAX_PARALLEL_BOUNDED;
use crate::runtime::flow::outcome::FlowOutcome;
use crate::runtime::flow::tracking_subscriptions;
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::pool::identity::identity;
use crate::runtime::pool::liveness::Liveness;
use crate::runtime::pool::membership::Membership;
pub use crate::runtime::run_error::RunError;
pub use crate::runtime::runs::backfill::BackfillRange;
use crate::runtime::updates::prepare;
use crate::runtime::updates::request::{self, UpdateSender};
use crate::runtime::updates::update_loop::{Prepared, Updates};
use crate::serve::control::{ControlApi, ControlSettings};
use crate::serve::observe;
use sluice_pipeline::Pipeline;
use sluice_store::WorkerBeat;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};

/// Runs a pipeline loaded for a run (`sluice_pipeline::load_for_run`: valid, and nothing in it
/// this version cannot run) to its end.
pub async fn execute(
    pipeline: &Pipeline,
    shutdown: &Shutdown,
    backfill: Option<BackfillRange>,
) -> Result<Vec<FlowOutcome>, RunError> {
    let metrics_listen = pipeline
        .metrics_listen
        .as_deref()
        .map(|listen| address("metrics.listen", listen))
        .transpose()?;
    // Read now, reported when the control API starts (after the metrics endpoint's errors).
    let control_listen = pipeline
        .control_listen
        .as_deref()
        .map(|listen| Ok((listen, address("control.listen", listen)?)))
        .transpose();
    let observed = observe::Observed::start(metrics_listen, &pipeline.name)
        .await
        .map_err(RunError::Endpoint)?;
    let readiness = observed.readiness.clone();
    // A backfill fires nothing: it beats without a schedule (`schedule_agreement.rs`).
    let beat = WorkerBeat {
        schedule: pipeline
            .schedule
            .as_ref()
            .filter(|_| backfill.is_none())
            .map(crate::runtime::runs::schedule_agreement::fingerprint),
        ..identity(&pipeline.name)
    };
    let board = FlowBoard::new(
        &pipeline.name,
        pipeline.flows.iter().map(|f| (f.name.clone(), f.once)),
    );
    let (sender, requests) = mpsc::channel(request::PENDING_REQUESTS);
    let _control = ControlApi::start(ControlSettings {
        listen: control_listen?,
        pipeline: &pipeline.name,
        token_file: pipeline.control_token_file.as_deref(),
        worker: &beat.worker,
        board: &board,
        readiness: &readiness,
        shutdown,
        update_requests: UpdateSender(sender),
    })
    .await?;
    // Retried with backoff while the store is unavailable (logged once per backoff step), until
    // it works, the run is stopped, or a triggered run's `give_up_after` has passed.
    let opened = store_retry::until_stored_within(
        "open the store",
        Retry::WhileUnavailable,
        &shutdown.drain,
        pipeline.give_up_after,
        || prepare::open(pipeline),
    )
    .await
    .map_err(RunError::Store)?;
    tracking_subscriptions::create_tracking_subscriptions(pipeline, shutdown.drain.clone());
    let store = opened.store;
    // Beats at once; no update starts before a beat succeeded, so a pool update's clearer
    // that has not seen this worker report its flows stopped waits for it (`updates/pool.rs`).
    let liveness = Liveness::new();
    let membership =
        Membership::start(store.clone(), store.clone(), beat.clone(), liveness.clone());
    let publishing = crate::runtime::flow::dead_letters::start(pipeline, &store, &beat.worker)
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
        layout: opened.layout,
        store,
        board,
        readiness,
        slots: Arc::new(Semaphore::new(MAX_PARALLEL_BOUNDED)),
        worker: beat.worker,
        requests,
        handles: opened.handles,
        completed: opened.completed,
        liveness,
    });
    let outcomes = crate::runtime::runs::timetable::drive(&mut updates, shutdown, backfill).await?;
    if let Some(publishing) = publishing {
        publishing.finish(&shutdown.give_up).await;
    }
    membership.stop().await;
    drop(observed);
    Ok(outcomes)
}

/// A `listen` setting as a socket address (`127.0.0.1:9464`).
fn address(setting: &str, listen: &str) -> Result<SocketAddr, RunError> {
    listen.parse().map_err(|_| {
        RunError::Invalid(format!(
            "{setting}: {listen:?} is not an address like 127.0.0.1:9464"
        ))
    })
}
