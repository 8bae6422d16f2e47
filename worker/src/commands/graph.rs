//! `sluice graph -c FILE [--format text|dot|mermaid]`: the flow graph (depends_on and data
//! edges), with the once flows the store records complete marked `COMPLETED`.
//!
//! The graph is drawn from the file alone when the store cannot be reached within a few
//! seconds: drawing never waits on an outage.

use clap::ValueEnum;
use sluice_pipeline::graph::{FlowGraph, render_dot, render_mermaid, render_text};
use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// How long the store may take to say which once flows completed.
const STORE_TIMEOUT: Duration = Duration::from_secs(3);

/// Output format of `graph`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// One line per flow, in start order.
    Text,
    /// Graphviz.
    Dot,
    /// A Mermaid flowchart.
    Mermaid,
}

/// `sluice graph`.
pub async fn graph(config: &Path, format: GraphFormat) -> ExitCode {
    let pipeline = match super::load_or_exit(config) {
        Ok(pipeline) => pipeline,
        Err(exit) => return exit,
    };
    let states = completed_flows(&pipeline).await;
    let graph = FlowGraph::new(&pipeline);
    let drawn = match format {
        GraphFormat::Text => render_text(&graph, &states),
        GraphFormat::Dot => render_dot(&graph, &states),
        GraphFormat::Mermaid => render_mermaid(&graph, &states),
    };
    print!("{drawn}");
    if !drawn.ends_with('\n') {
        println!();
    }
    ExitCode::SUCCESS
}

/// Once flows recorded complete, as `COMPLETED`; empty when the store cannot tell quickly.
async fn completed_flows(pipeline: &sluice_pipeline::Pipeline) -> HashMap<String, String> {
    // Drawing never creates a store: one that is not there has no states to show.
    let ask = async {
        let store = sluice_store::open_existing(&pipeline.store).await?;
        store.completions(&pipeline.name).await
    };
    match tokio::time::timeout(STORE_TIMEOUT, ask).await {
        Ok(Ok(completed)) => completed
            .into_iter()
            .filter(|(flow, _)| pipeline.flows.iter().any(|f| &f.name == flow && f.once))
            .map(|(flow, _)| (flow, "COMPLETED".to_owned()))
            .collect(),
        Ok(Err(error)) => {
            tracing::debug!(%error, "graph drawn without states: store unavailable");
            HashMap::new()
        }
        Err(_) => HashMap::new(),
    }
}
