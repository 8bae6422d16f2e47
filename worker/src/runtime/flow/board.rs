//! The board of a run's flows: each flow's phase (SPEC §6: QUEUED, STARTING, RUNNING, then how
//! it ended) and its live counters, written by the scheduler and read by the control API,
//! readiness and `sluice_flow_state{state}`.

use sluice_engine::Counters;
use sluice_proto::v1::FlowStatus;
use std::sync::{Arc, Mutex};

/// Where a flow is in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowPhase {
    /// Waiting for its predecessors (or for a slot).
    Queued,
    /// Its source is not running yet (Pub/Sub not answering), or between retries of a start.
    Starting,
    /// Receiving.
    Running,
    /// Ran to its end (drained).
    Completed,
    /// Stopped by a signal or an update.
    Stopped,
    /// A once flow recorded complete earlier: not re-read.
    Idle,
    /// Not started: a predecessor failed, or the run stopped first.
    Skipped,
    /// Could not run, retries included.
    Failed,
}

impl FlowPhase {
    /// Every phase, in the order a flow goes through them, then how it ended.
    pub const ALL: [FlowPhase; 8] = [
        FlowPhase::Queued,
        FlowPhase::Starting,
        FlowPhase::Running,
        FlowPhase::Completed,
        FlowPhase::Stopped,
        FlowPhase::Idle,
        FlowPhase::Skipped,
        FlowPhase::Failed,
    ];

    /// The phase's name as SPEC §6, the control API and `sluice_flow_state{state}` spell it.
    pub fn name(self) -> &'static str {
        match self {
            FlowPhase::Queued => "QUEUED",
            FlowPhase::Starting => "STARTING",
            FlowPhase::Running => "RUNNING",
            FlowPhase::Completed => "COMPLETED",
            FlowPhase::Stopped => "STOPPED",
            FlowPhase::Idle => "IDLE",
            FlowPhase::Skipped => "SKIPPED",
            FlowPhase::Failed => "FAILED",
        }
    }
}

/// Sets `sluice_flow_state{pipeline, flow, state}` to 1 for `phase` and 0 for the others.
fn phase_gauge(pipeline: &str, flow: &str, phase: FlowPhase) {
    for candidate in FlowPhase::ALL {
        metrics::gauge!("sluice_flow_state", "pipeline" => pipeline.to_owned(),
            "flow" => flow.to_owned(), "state" => candidate.name())
        .set(if candidate == phase { 1.0 } else { 0.0 });
    }
}

/// The live state of every flow of the run, written by the run and read by the API.
#[derive(Clone, Default)]
pub struct FlowBoard {
    pipeline: Arc<str>,
    flows: Arc<Mutex<Vec<BoardEntry>>>,
}

struct BoardEntry {
    name: String,
    once: bool,
    phase: FlowPhase,
    counters: Option<Counters>,
    /// When the flow last went RUNNING, ms since epoch.
    started_ms: i64,
}

impl FlowBoard {
    /// A board listing `flows` (name, once), all queued.
    pub fn new(pipeline: &str, flows: impl IntoIterator<Item = (String, bool)>) -> Self {
        let entries = flows
            .into_iter()
            .map(|(name, once)| {
                phase_gauge(pipeline, &name, FlowPhase::Queued);
                BoardEntry {
                    name,
                    once,
                    phase: FlowPhase::Queued,
                    counters: None,
                    started_ms: 0,
                }
            })
            .collect();
        Self {
            pipeline: Arc::from(pipeline),
            flows: Arc::new(Mutex::new(entries)),
        }
    }

    /// Puts every flow back to queued with no counters, as a new update starts.
    pub fn restart(&self) {
        if let Ok(mut flows) = self.flows.lock() {
            for entry in flows.iter_mut() {
                phase_gauge(&self.pipeline, &entry.name, FlowPhase::Queued);
                entry.phase = FlowPhase::Queued;
                entry.counters = None;
            }
        }
    }

    /// Whether a flow is starting: its source not running yet (Pub/Sub not answering), or
    /// between the retries of a failed start.
    pub fn any_starting(&self) -> bool {
        self.flows
            .lock()
            .map(|flows| flows.iter().any(|e| e.phase == FlowPhase::Starting))
            .unwrap_or(false)
    }

    /// Records a flow's new state (and its counters once it runs), also as
    /// `sluice_flow_state`.
    pub fn set(&self, flow: &str, phase: FlowPhase, counters: Option<&Counters>) {
        phase_gauge(&self.pipeline, flow, phase);
        if let Ok(mut flows) = self.flows.lock()
            && let Some(entry) = flows.iter_mut().find(|e| e.name == flow)
        {
            entry.phase = phase;
            if phase == FlowPhase::Running {
                entry.started_ms = sluice_engine::now_ms();
            }
            if let Some(counters) = counters {
                entry.counters = Some(counters.clone());
            }
        }
    }

    /// Every flow's status, as the control API reports it.
    pub fn statuses(&self) -> Vec<FlowStatus> {
        let Ok(flows) = self.flows.lock() else {
            return Vec::new();
        };
        flows
            .iter()
            .map(|entry| {
                let snapshot = entry
                    .counters
                    .as_ref()
                    .map(Counters::snapshot)
                    .unwrap_or_default();
                let watermark = entry
                    .counters
                    .as_ref()
                    .and_then(Counters::watermark)
                    .and_then(sluice_engine::FlowWatermark::current);
                FlowStatus {
                    name: entry.name.clone(),
                    state: entry.phase.name().to_owned(),
                    once: entry.once,
                    received: snapshot.received,
                    rows: snapshot.committed,
                    duplicates_memory: snapshot.duplicates_memory,
                    duplicates_store: snapshot.duplicates_store,
                    dead_letters: snapshot.dead_lettered,
                    acked: snapshot.acked,
                    nacked: snapshot.nacked,
                    oldest_unacked_age_seconds: entry
                        .counters
                        .as_ref()
                        .map(|c| c.oldest_unacked_age().as_secs_f64())
                        .unwrap_or_default(),
                    watermark_ms: watermark.unwrap_or_default(),
                    watermark_age_seconds: watermark
                        .map(|w| (sluice_engine::now_ms() - w).max(0) as f64 / 1000.0)
                        .unwrap_or_default(),
                    late: snapshot.late,
                    last_run_started_ms: entry.started_ms,
                }
            })
            .collect()
    }
}
