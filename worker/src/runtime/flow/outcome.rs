//! How a flow of an update ended (SPEC §6's states), and what it counted.

use crate::runtime::flow::board::FlowPhase;
use sluice_engine::Snapshot;

/// How one flow ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowState {
    /// Ran to its end: drained (idle for `drain_idle`, or its files read) in a triggered run or
    /// as a once flow.
    Completed,
    /// Stopped by a signal (the normal end of a continuous flow); what it received is committed
    /// and acked.
    Stopped,
    /// A once flow recorded complete in the store (by this worker earlier or by another
    /// replica): not run again. Counts as success for its dependents.
    Idle,
    /// Did not start: a predecessor failed, or the run was stopped first.
    Skipped(String),
    /// Could not run, retries included.
    Failed(String),
}

impl FlowState {
    /// The phase the flow ended in.
    pub fn phase(&self) -> FlowPhase {
        match self {
            FlowState::Completed => FlowPhase::Completed,
            FlowState::Stopped => FlowPhase::Stopped,
            FlowState::Idle => FlowPhase::Idle,
            FlowState::Skipped(_) => FlowPhase::Skipped,
            FlowState::Failed(_) => FlowPhase::Failed,
        }
    }

    /// The state's name as SPEC §6 and `sluice_flow_state{state}` spell it.
    pub fn name(&self) -> &'static str {
        self.phase().name()
    }

    /// Whether dependents may start after it.
    pub fn succeeded(&self) -> bool {
        matches!(self, FlowState::Completed | FlowState::Idle)
    }
}

/// One flow's result.
#[derive(Debug, Clone)]
pub struct FlowOutcome {
    /// Flow name.
    pub name: String,
    /// How it ended.
    pub state: FlowState,
    /// Its counters at the end (of its last attempt).
    pub counters: Snapshot,
    /// Records of a bounded source (files, a table) not delivered because the flow had
    /// committed them before (a re-read after a crash, a repeated id, a table read again).
    pub skipped: u64,
}
