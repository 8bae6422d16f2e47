//! Updates: a run of the pipeline's flows in `depends_on` order inside a worker process, and
//! how the control API's `StartUpdate` and `ResetFlow` replace the running update with a new
//! one.
//!
//! # Guarantees
//!
//! * **Nothing is cleared under a running flow.** A request is checked first (known flows, a seek
//!   the subscription can replay); a refused request leaves the running update alone. With other
//!   workers of the pipeline alive it becomes a pool update they all stop their flows for
//!   (`runtime/updates/pool.rs`). An accepted one stops every flow of the update the way a drain
//!   does (what was received is committed and acked, or nacked after
//!   [`crate::runtime::kit::signals::DRAIN_DEADLINE`] if the store stays down), and only then
//!   clears the flows asked for, exactly as `sluice full-refresh` and `sluice reset` do.
//! * **The new update starts from fresh state.** Flow handles and completions are read again
//!   from the store (a reset on PostgreSQL gives the flow a new id), and every flow starts with
//!   an empty dedup cache, so no key remembered from before the reset can drop a record.
//! * A signal or `Drain` ends the worker as always; a request that arrives during a drain is
//!   refused.

use crate::runtime::pool::timing::ALIVE_WITHIN;
use crate::runtime::updates::refresh::{self, Clearing};
use crate::runtime::updates::refresh_error::RefreshError;
use crate::runtime::updates::seek::{self, Seek};
use sluice_pipeline::Pipeline;
use sluice_store::MembershipStore;
use tokio::sync::{mpsc, oneshot};

/// Requests waiting for the run loop, at most (a caller beyond that waits to be queued).
pub const PENDING_REQUESTS: usize = 4;

/// What a new update clears before it starts (recorded as JSON for a pool update).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum UpdateKind {
    /// `StartUpdate { full_refresh: true }` (no seek) or `sluice full-refresh`: every flow.
    FullRefresh {
        /// The seek of every Pub/Sub flow's subscription, if asked.
        seek: Option<Seek>,
    },
    /// `StartUpdate { refresh_flows }`: these flows (none: just run the chain again).
    Refresh(Vec<String>),
    /// `ResetFlow { flow, seek }`: one flow, its subscription seeked when asked.
    Reset {
        /// The flow.
        flow: String,
        /// The seek, if asked.
        seek: Option<Seek>,
    },
}

/// A new update was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// What was cleared, in words.
    pub message: String,
    /// The update's number in this worker (the first is 1).
    pub update: u64,
}

/// A request to the run loop, answered once the new update has started (or was refused).
#[derive(Debug)]
pub struct UpdateRequest {
    /// What to clear.
    pub kind: UpdateKind,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Result<Started, RefreshError>>,
}

/// The control API's end of the channel to the run loop.
#[derive(Debug, Clone)]
pub struct UpdateSender(pub mpsc::Sender<UpdateRequest>);

impl UpdateSender {
    /// Asks for a new update and waits until it has started or was refused.
    pub async fn request(&self, kind: UpdateKind) -> Result<Started, RefreshError> {
        let (reply, answer) = oneshot::channel();
        let gone = || RefreshError::Failed("the worker is shutting down".to_owned());
        self.0
            .send(UpdateRequest { kind, reply })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// Checks a request before anything is stopped: the flows exist and a seek can be replayed.
pub async fn check(pipeline: &Pipeline, kind: &UpdateKind) -> Result<(), RefreshError> {
    let named: &[String] = match kind {
        UpdateKind::FullRefresh { .. } => &[],
        UpdateKind::Refresh(flows) => flows,
        UpdateKind::Reset { flow, .. } => std::slice::from_ref(flow),
    };
    for name in named {
        if !pipeline.flows.iter().any(|f| &f.name == name) {
            let declared: Vec<&str> = pipeline.flows.iter().map(|f| f.name.as_str()).collect();
            return Err(RefreshError::Invalid(format!(
                "no flow named `{name}` (declared: {})",
                declared.join(", ")
            )));
        }
    }
    match kind {
        UpdateKind::Reset { flow, seek } => {
            seek::reset_seeks(pipeline, flow, seek.as_ref()).await?;
        }
        UpdateKind::FullRefresh { seek: Some(seek) } => {
            seek::full_refresh_seeks(pipeline, seek).await?;
        }
        UpdateKind::FullRefresh { seek: None } | UpdateKind::Refresh(_) => {}
    }
    Ok(())
}

/// The other live workers of the pipeline (heartbeat within [`ALIVE_WITHIN`]): with any, a
/// request becomes a pool update (`runtime/updates/pool.rs`).
pub async fn others_alive(
    pipeline: &Pipeline,
    store: &dyn MembershipStore,
    me: &str,
) -> Result<Vec<String>, RefreshError> {
    Ok(store
        .workers(&pipeline.name, ALIVE_WITHIN)
        .await
        .map_err(|e| RefreshError::Failed(format!("store: {e}")))?
        .into_iter()
        .map(|w| w.worker)
        .filter(|w| w != me)
        .collect())
}

/// Clears what the request asks for; the flows of the previous update have stopped, in this
/// worker and in every worker of `clearing.stopped` (their heartbeats do not refuse the
/// clear), under `clearing.claim` for a pool update.
pub async fn clear(
    pipeline: &Pipeline,
    kind: &UpdateKind,
    clearing: Clearing<'_>,
) -> Result<String, RefreshError> {
    match kind {
        UpdateKind::FullRefresh { seek } => {
            refresh::full_refresh(pipeline, seek.as_ref(), clearing).await
        }
        UpdateKind::Refresh(names) if names.is_empty() => {
            Ok("nothing cleared; the chain runs again".to_owned())
        }
        UpdateKind::Refresh(names) => {
            let (downstream, _) = refresh::refresh(pipeline, names, None, clearing).await?;
            let cleared: Vec<&String> = names.iter().chain(&downstream).collect();
            Ok(format!(
                "cleared: {}",
                cleared
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
        UpdateKind::Reset { flow, seek } => {
            refresh::reset(pipeline, flow, seek.as_ref(), clearing).await
        }
    }
}
