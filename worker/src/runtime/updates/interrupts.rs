//! What stops a running update, or ends a wait between runs: a control request (`StartUpdate`,
//! `ResetFlow`) this worker accepted, carried out alone or, while other replicas of the
//! pipeline run, recorded as a pool update (`pool.rs`); a pool update asked for elsewhere, or
//! one this worker missed while the pool counted it gone; or, for a running update, a lapse of
//! this worker's fence (`runtime/pool/liveness.rs`). A request is checked before anything is
//! stopped: a refused one is answered at once and stops nothing.

use crate::runtime::kit::signals::Shutdown;
use crate::runtime::updates::pool::{self, POLL};
use crate::runtime::updates::refresh_error::RefreshError;
use crate::runtime::updates::request::{self, UpdateRequest};
use sluice_pipeline::Pipeline;
use sluice_store::{PoolUpdate, PoolUpdateStore, Store};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// What stops a running update.
pub enum Interrupt {
    /// A control request this worker carries out alone (it is the pipeline's only worker).
    Local(UpdateRequest),
    /// A control request this worker recorded as pool update `id` (other replicas run).
    Asked(UpdateRequest, i64),
    /// Pool update `id`, asked for elsewhere.
    Joined(i64),
    /// This worker's heartbeats failed for long enough that the pool may count it gone: its
    /// flows stop, and a new update starts once it beats again (`runtime/pool/liveness.rs`).
    Fenced,
}

/// What came.
pub enum Came {
    /// A control request.
    Request(UpdateRequest),
    /// Pool update `id` (unfinished, or one this worker missed).
    PoolUpdate(i64),
}

/// Where interrupts come from: the control API's requests, and the pipeline's pool updates.
pub struct Interrupts {
    requests: mpsc::Receiver<UpdateRequest>,
    pool: PoolWatch,
}

impl Interrupts {
    /// The control API's `requests`, and `pipeline`'s pool updates in `store`, watched from now.
    pub fn start(
        requests: mpsc::Receiver<UpdateRequest>,
        store: Arc<dyn PoolUpdateStore>,
        pipeline: &str,
    ) -> Self {
        Self {
            requests,
            pool: PoolWatch::start(store, pipeline),
        }
    }

    /// The next control request, or the next pool update numbered above `handled` (an ended
    /// one: this worker missed it).
    pub async fn next(&mut self, handled: i64) -> Came {
        tokio::select! {
            Some(request) = self.requests.recv() => Came::Request(request),
            update = self.pool.next_after(handled) => Came::PoolUpdate(update.id),
        }
    }
}

/// What `came` asks of `worker`, if anything: a pool update is taken part in; a control
/// request is checked, and a refused one answered at once (`None`); with other replicas
/// running, an accepted one is recorded as a pool update.
pub async fn accept(
    came: Came,
    pipeline: &Pipeline,
    store: &dyn Store,
    worker: &str,
    shutdown: &Shutdown,
) -> Option<Interrupt> {
    let request = match came {
        Came::PoolUpdate(id) => return Some(Interrupt::Joined(id)),
        Came::Request(request) => request,
    };
    let refuse = |request: UpdateRequest, error: RefreshError| {
        tracing::warn!(%error, kind = ?request.kind, "update request refused");
        let _ = request.reply.send(Err(error));
        None
    };
    if shutdown.drain.is_cancelled() {
        let error = RefreshError::Failed("the worker is draining; start a new one instead".into());
        return refuse(request, error);
    }
    if let Err(error) = request::check(pipeline, &request.kind).await {
        return refuse(request, error);
    }
    match request::others_alive(pipeline, store, worker).await {
        Err(error) => refuse(request, error),
        Ok(others) if others.is_empty() => Some(Interrupt::Local(request)),
        Ok(_) => match pool::request(pipeline, store, &request.kind, worker).await {
            Ok(id) => Some(Interrupt::Asked(request, id)),
            Err(error) => refuse(request, error),
        },
    }
}

/// The pipeline's oldest unfinished pool update (else its newest), looked up every [`POLL`].
struct PoolWatch {
    current: watch::Receiver<Option<PoolUpdate>>,
    task: tokio::task::JoinHandle<()>,
}

impl PoolWatch {
    /// Starts watching `pipeline`'s pool updates.
    fn start(store: Arc<dyn PoolUpdateStore>, pipeline: &str) -> Self {
        let (send, current) = watch::channel(None);
        let pipeline = pipeline.to_owned();
        let task = tokio::spawn(async move {
            loop {
                // The oldest unfinished; else the newest, so that a worker that missed one
                // (counted gone while it ran) still learns of it and starts afresh.
                let found = match store.pool_update(&pipeline, None).await {
                    Ok(None) => store.latest_pool_update(&pipeline).await,
                    other => other,
                };
                match found {
                    Ok(update) => {
                        send.send_if_modified(|shown| {
                            let changed = *shown != update;
                            *shown = update;
                            changed
                        });
                    }
                    Err(error) => tracing::debug!(%error, "cannot look for pool updates"),
                }
                tokio::time::sleep(POLL).await;
            }
        });
        Self { current, task }
    }

    /// Waits for an update numbered above `handled` (an ended one: this worker missed it).
    async fn next_after(&mut self, handled: i64) -> PoolUpdate {
        loop {
            if let Some(update) = self.current.borrow_and_update().as_ref()
                && update.id > handled
            {
                return update.clone();
            }
            if self.current.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Drop for PoolWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
