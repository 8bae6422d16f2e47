//! What every flow of a run shares: the pipeline, the store, the signals, the board, the slots
//! of bounded work, this worker's id, and what the run gives its flows beyond the pipeline
//! (a scheduled run's data interval, the sources kept open between its runs, the update's
//! ack fence).

use crate::runtime::flow::board::FlowBoard;
use crate::runtime::kit::signals::Shutdown;
use sluice_engine::{AckFence, KeptOpen};
use sluice_pipeline::Pipeline;
use sluice_pipeline::timetable::DataInterval;
use sluice_store::Store;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// What every flow of a run shares.
#[derive(Clone)]
pub struct RunContext {
    /// The pipeline.
    pub pipeline: Pipeline,
    /// The store.
    pub store: Arc<dyn Store>,
    /// Signals.
    pub shutdown: Shutdown,
    /// Live states for the control API and `sluice_flow_state`.
    pub board: FlowBoard,
    /// Slots of bounded work.
    pub slots: Arc<Semaphore>,
    /// This worker's id in the pool (lease holder name).
    pub worker: String,
    /// What the run gives its flows: a scheduled run's data interval, kept sources.
    pub scope: RunScope,
}

/// Pub/Sub flows' sources kept running across the runs of a schedule, by flow name
/// (`sluice_engine::KeptOpen`).
pub type KeptSources = Arc<HashMap<String, KeptOpen>>;

/// What a run gives its flows beyond the pipeline: a scheduled run's data interval and the
/// Pub/Sub sources kept open between its runs.
#[derive(Clone, Default)]
pub struct RunScope {
    /// The run's data interval (`semantics: data_interval`): file flows read only the records
    /// whose event time lies in it.
    pub interval: Option<DataInterval>,
    /// Pub/Sub flows' sources kept running across the runs of a schedule; a flow not in it
    /// opens its own.
    pub kept: Option<KeptSources>,
    /// The fence every Pub/Sub ack of the update asks first (`runtime/pool/liveness.rs`); `None`
    /// acks after each commit unasked.
    pub acks: Option<Arc<dyn AckFence>>,
}
