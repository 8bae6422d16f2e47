//! What the updates of a pipeline start from: its layout in the store (the table targets and
//! the flows), prepared there, the flows' handles and the once flows recorded complete. Read
//! when the worker starts, and again before an update that follows a clear or a run (a reset
//! on PostgreSQL gives a flow a new id; a once flow may have completed meanwhile).

use sluice_pipeline::{Flow, Pipeline, TargetKind};
use sluice_store::{FlowHandle, FlowStore, Layout, Store, StoreError, table_name};
use std::collections::HashSet;
use std::sync::Arc;

/// The store, opened and prepared for a pipeline.
pub struct Opened {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The pipeline's layout in it.
    pub layout: Layout,
    /// The flows' handles, in file order.
    pub handles: Vec<FlowHandle>,
    /// The once flows recorded complete.
    pub completed: HashSet<String>,
}

/// Opens `pipeline`'s store, prepares its layout and reads which once flows completed: one
/// attempt (the caller retries while the store is unavailable).
pub async fn open(pipeline: &Pipeline) -> Result<Opened, StoreError> {
    let layout = layout(pipeline);
    let store = sluice_store::open(&pipeline.store)?;
    let (handles, completed) = read_flows(&*store, &layout).await?;
    store
        .create_views(&crate::runtime::flow::typed::typed_views(pipeline)?)
        .await?;
    Ok(Opened {
        store,
        layout,
        handles,
        completed,
    })
}

/// What the store prepares for a pipeline: its table targets and its flows.
pub fn layout(pipeline: &Pipeline) -> sluice_store::Layout {
    sluice_store::Layout {
        pipeline: pipeline.name.clone(),
        tables: table_targets(pipeline),
        typed: crate::runtime::flow::typed::typed_tables(pipeline),
        flows: pipeline.flows.iter().map(|f| f.name.clone()).collect(),
    }
}

/// The targets of a pipeline that have a table in the store.
pub fn table_targets(pipeline: &Pipeline) -> Vec<String> {
    pipeline
        .targets
        .iter()
        .filter(|t| has_table(&t.kind))
        .map(|t| t.name.clone())
        .collect()
}

/// The full name of a flow's target table, when its target has one.
pub fn target_table(pipeline: &Pipeline, flow: &Flow) -> Option<String> {
    let has = pipeline
        .targets
        .iter()
        .any(|t| t.name == flow.target && has_table(&t.kind));
    has.then(|| table_name(&pipeline.name, &flow.target).ok())
        .flatten()
}

/// Whether a target has a table in the store: `table` targets, and `foreach_batch` and `sink`
/// targets (a row per record handed over and committed: the record of what they were given).
fn has_table(kind: &TargetKind) -> bool {
    matches!(
        kind,
        TargetKind::Table
            | TargetKind::ForeachBatch { .. }
            | TargetKind::Sink { .. }
            | TargetKind::Window { .. }
    )
}

/// Prepares the layout; returns the flow handles and the once flows recorded complete.
pub async fn read_flows(
    store: &dyn FlowStore,
    layout: &Layout,
) -> Result<(Vec<FlowHandle>, HashSet<String>), StoreError> {
    let handles = store.prepare(layout).await?;
    let completed = store
        .completions(&layout.pipeline)
        .await?
        .into_iter()
        .map(|(flow, _)| flow)
        .collect();
    Ok((handles, completed))
}
