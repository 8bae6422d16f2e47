//! `sluice run -c FILE [--full-refresh | --refresh FLOW,...]`: clears what was asked, runs the
//! pipeline under the supervisor until its flows end (triggered) or a signal drains them
//! (continuous), and prints each flow's outcome. Exit 0 when no flow failed, 1 when one did or
//! the run could not start, 2 for a file that is invalid or asks for what is not built.

use crate::runtime::flow::outcome::{FlowOutcome, FlowState};
use crate::runtime::kit::signals;
use crate::runtime::supervisor::{BackfillRange, RunError, execute};
use crate::runtime::updates::refresh;
use std::path::Path;
use std::process::ExitCode;

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
    let pipeline = match super::load_for_run_or_exit(path) {
        Ok(pipeline) => super::with_adc_project(pipeline).await,
        Err(exit) => return exit,
    };
    let flows = match refresh {
        Refresh::All => pipeline.flows.iter().map(|f| f.name.clone()).collect(),
        Refresh::Flows(flows) => flows,
    };
    if !flows.is_empty() {
        let cleared = refresh::refresh(&pipeline, &flows, None, Default::default()).await;
        let downstream = match cleared {
            Ok((downstream, _)) => downstream,
            Err(error) => {
                eprintln!("{}: {error}", path.display());
                return error.exit_code();
            }
        };
        let cleared: Vec<&str> = flows
            .iter()
            .chain(&downstream)
            .map(String::as_str)
            .collect();
        println!("cleared before the run: {}", cleared.join(", "));
    }
    execute_and_report(path, &pipeline, None).await
}

/// Runs `pipeline` (the intervals of `backfill`, if given) under the supervisor and prints
/// each flow's outcome; the exit code.
pub(super) async fn execute_and_report(
    path: &Path,
    pipeline: &sluice_pipeline::Pipeline,
    backfill: Option<BackfillRange>,
) -> ExitCode {
    let shutdown = match signals::install() {
        Ok(shutdown) => shutdown,
        Err(error) => {
            eprintln!("sluice: cannot install signal handlers: {error}");
            return ExitCode::from(1);
        }
    };
    match execute(pipeline, &shutdown, backfill).await {
        Ok(outcomes) => {
            for outcome in &outcomes {
                let from_pubsub = pipeline.flows.iter().any(|f| {
                    f.name == outcome.name && matches!(f.source, sluice_pipeline::Source::PubSub(_))
                });
                print_outcome(outcome, from_pubsub);
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
        Err(error @ RunError::Invalid(_)) => {
            eprintln!("{}: {error}", path.display());
            ExitCode::from(2)
        }
        Err(RunError::Store(error))
            if shutdown.drain.is_cancelled() && error.is_transient() && backfill.is_none() =>
        {
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

/// One flow's line: what it received (a subscription: redeliveries included, then acked or
/// nacked) or read (files, a table), and what it committed; the duplicates are both tiers', as
/// the store, the log and `/metrics` count them.
fn print_outcome(outcome: &FlowOutcome, from_pubsub: bool) {
    let c = &outcome.counters;
    let state = match &outcome.state {
        FlowState::Idle => "IDLE (completed earlier; not re-read)".to_owned(),
        FlowState::Skipped(why) | FlowState::Failed(why) => {
            format!("{} ({why})", outcome.state.name())
        }
        other => other.name().to_owned(),
    };
    let taken = if from_pubsub {
        format!("received {}", c.received)
    } else {
        format!("read {}", c.received)
    };
    let given_back = if from_pubsub {
        format!(", acked {}, nacked {}", c.acked, c.nacked)
    } else {
        String::new()
    };
    println!(
        "flow {}: {state}; {taken}, rows {}, dead letters {}, duplicates {} (memory {}, store {}){given_back}",
        outcome.name,
        c.committed,
        c.dead_lettered,
        c.duplicates_memory + c.duplicates_store,
        c.duplicates_memory,
        c.duplicates_store,
    );
    if c.filtered > 0 {
        println!(
            "  {}: {} records filtered out by `where` (acked, no row)",
            outcome.name, c.filtered
        );
    }
    if outcome.skipped > 0 {
        println!(
            "  {}: {} records skipped, committed before",
            outcome.name, outcome.skipped
        );
    }
}
