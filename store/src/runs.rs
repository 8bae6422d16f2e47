//! The runs of a triggered pipeline (`sluice_runs`): what fired them, their data interval,
//! how they ended and what each flow wrote.
//!
//! # Guarantees
//!
//! * **A fire is run once.** A run of a schedule's fire (trigger `schedule` or `catchup`) is
//!   recorded under its fire time, at most once per pipeline: [`crate::RunStore::begin_run`]
//!   of a fire recorded already returns that run instead of a new one, so a replica that takes
//!   the scheduler over from one that died mid-run finishes the same run (same id, same
//!   interval) and one that finds it ended does not run it again. Manual runs and runs fired
//!   by a table's update have no fire time of their own and are recorded each time.
//! * **An interval is run once.** A fire's run, or a backfill's, whose data interval another
//!   run completed (of any trigger, a manual run of that interval included; for a timetable
//!   without intervals, whose fire another fire's or backfill's run completed) is not run:
//!   [`crate::RunStore::begin_run`] records it `completed` at once, with no rows (no flow
//!   listed; a queued one too, when the other completed while it waited, and a fire's run left
//!   unfinished by a runner gone), and returns it so. Decided in the begin's transaction, so
//!   a backfill and the scheduler never both run an interval. A manual run, and a rerun
//!   (`sluice backfill --rerun`, which replaces what a completed interval wrote), are run as
//!   asked.
//! * **One run at a time in a pool, in the order asked.** [`crate::RunStore::begin_run`]
//!   starts nothing while another worker whose heartbeat is within [`RunStart::alive_within`]
//!   has a run `running`, or `queued` before it (a manual run asked of a replica that is not
//!   the scheduler, say): it records the run `queued` and returns it, and the caller asks again
//!   with [`RunStart::queued_as`] until it starts. The check and the write are one transaction,
//!   serialized per pipeline. A run left `running` or `queued` by a worker that died holds
//!   nothing back (its fire is taken by the next scheduler, a manual run recorded failed).
//! * **An ended run stays ended.** [`crate::RunStore::end_run`] records an end only for a
//!   running run, by the worker that runs it now: a replica that lost a run to another cannot
//!   overwrite how the other ended it.
//! * **The schedule survives restarts.** The latest fire recorded
//!   ([`crate::RunStore::last_fire`]) is where a restarted scheduler continues from.

/// Why a run ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunTrigger {
    /// A fire of the schedule, on time (or queued behind another run).
    Schedule,
    /// A fire missed while no worker ran, run because of `catchup: true`.
    Catchup,
    /// A table the pipeline reads received rows (`on_update: true`).
    Update,
    /// Asked for: `sluice run` of a pipeline without a schedule, or the control API.
    Manual,
    /// An interval run by `sluice backfill`.
    Backfill,
    /// An interval run again by `sluice backfill --rerun`, after its rows were cleared (run
    /// whether or not another run completed it).
    Rerun,
}

impl RunTrigger {
    /// The name stored and shown (`schedule`, `catchup`, `update`, `manual`, `backfill`,
    /// `rerun`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Schedule => "schedule",
            Self::Catchup => "catchup",
            Self::Update => "update",
            Self::Manual => "manual",
            Self::Backfill => "backfill",
            Self::Rerun => "rerun",
        }
    }

    /// The trigger a stored name stands for.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Schedule,
            Self::Catchup,
            Self::Update,
            Self::Manual,
            Self::Backfill,
            Self::Rerun,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }

    /// Whether the run is one of the schedule's fires (recorded once per fire time).
    pub fn is_fire(self) -> bool {
        matches!(self, Self::Schedule | Self::Catchup)
    }
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// Asked for and waiting for another worker's run to end.
    Queued,
    /// Started and not ended (a run whose runner died stays so until another finishes it).
    Running,
    /// Every flow succeeded.
    Completed,
    /// A flow failed, or its runner stopped before its end and nobody can finish it (a manual
    /// run).
    Failed,
    /// Stopped by a signal before its end (a manual run; a fire's run is left running for the
    /// next scheduler to finish).
    Stopped,
}

impl RunState {
    /// The name stored and shown.
    pub fn name(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
        }
    }

    /// The state a stored name stands for.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Queued,
            Self::Running,
            Self::Completed,
            Self::Failed,
            Self::Stopped,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }
}

/// A run about to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStart {
    /// Pipeline name.
    pub pipeline: String,
    /// The fire it runs, ms since the epoch (for every trigger: when it was asked for).
    pub fire_ms: i64,
    /// Its data interval `[start, end)`, ms, if it has one.
    pub interval: Option<(i64, i64)>,
    /// Why it runs.
    pub trigger: RunTrigger,
    /// The worker running it.
    pub worker: String,
    /// Another worker's run in progress holds this one back while that worker's heartbeat is
    /// within this (the pool's "alive").
    pub alive_within: std::time::Duration,
    /// The run this one was queued as (a `begin_run` that returned it `queued`); `None` the
    /// first time.
    pub queued_as: Option<i64>,
}

/// What [`crate::RunStore::begin_run`] does with a run, given the run it found for it
/// (`mine`: its fire's, or the one it was queued as), whether another live worker's run
/// holds it back, and whether another run completed its interval. Both backends decide with
/// this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Begin {
    /// Return `mine` as it is (its fire's run ended: not run again).
    Ended,
    /// Record a new run, `running` or `queued`.
    Insert(RunState),
    /// Make `mine` the asker's, `running` or `queued` (a queued run that may start, a fire's
    /// run taken over from a runner that lost it).
    Take(RunState),
    /// Record the run completed at once, with no rows, not run: another run completed its
    /// interval (`mine` if there is one, else a new record).
    Done,
}

impl Begin {
    /// The decision (see the module docs).
    pub(crate) fn decide(mine: Option<RunState>, held_back: bool, interval_done: bool) -> Begin {
        let wanted = if held_back {
            RunState::Queued
        } else {
            RunState::Running
        };
        match mine {
            // Its interval completed by another run while it was left unfinished (a backfill
            // ran it after its runner died): not run again.
            None | Some(RunState::Queued | RunState::Running) if interval_done => Begin::Done,
            // A fire's run goes on under whoever runs it now, held back or not.
            Some(RunState::Running) => Begin::Take(RunState::Running),
            None => Begin::Insert(wanted),
            Some(RunState::Queued) => Begin::Take(wanted),
            Some(_) => Begin::Ended,
        }
    }
}

/// Whether a run of this trigger is not run when another run completed its interval: a
/// schedule's fires and a backfill's intervals (a manual run is run as asked).
pub(crate) fn once_per_interval(trigger: RunTrigger) -> bool {
    trigger.is_fire() || trigger == RunTrigger::Backfill
}

/// A run as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    /// Its id, growing with each run of the store.
    pub run_id: i64,
    /// The fire it runs, ms since the epoch.
    pub fire_ms: i64,
    /// Its data interval `[start, end)`, ms.
    pub interval: Option<(i64, i64)>,
    /// Why it runs.
    pub trigger: RunTrigger,
    /// Where it is.
    pub state: RunState,
    /// The worker that runs (or ran) it last.
    pub worker: String,
    /// When it started, ms (store clock).
    pub started_at_ms: i64,
    /// When it ended, ms (store clock).
    pub ended_at_ms: Option<i64>,
    /// Rows each flow committed in it, by flow name.
    pub rows: Vec<(String, u64)>,
    /// Why it failed.
    pub error: Option<String>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnd {
    /// `Completed`, `Failed` or `Stopped`.
    pub state: RunState,
    /// Rows each flow committed in it.
    pub rows: Vec<(String, u64)>,
    /// Why it failed.
    pub error: Option<String>,
}

/// Rows per flow as stored: a JSON object, flow name → rows (so SQL can read it too).
pub(crate) fn rows_to_json(rows: &[(String, u64)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = rows
        .iter()
        .map(|(flow, n)| (flow.clone(), serde_json::Value::from(*n)))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// Rows per flow from their stored JSON (nothing from text that is not such an object).
pub(crate) fn rows_from_json(text: &str) -> Vec<(String, u64)> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .filter_map(|(flow, n)| n.as_u64().map(|n| (flow, n)))
            .collect(),
        _ => Vec::new(),
    }
}
