//! What a scheduler has to run, from the schedule's state in the store (read at once: the
//! newest runs, the live workers, the last fire recorded): first a run its runner left
//! unfinished, then the timetable's next fire. Pure: `next_run.rs` reads the state and acts.
//!
//! A fire's run left `running` or `queued` is this scheduler's to finish (its runner lost the
//! lease, or died), the oldest first, with the same id and interval. A manual or update run of
//! a live worker is that worker's (another replica runs it now, and the next run's start waits
//! for it, `record.rs`); one of a worker gone is abandoned: nobody will ask for it again, so it
//! is recorded failed. The schedule counts as served since the oldest worker alive started.
//! Without a schedule ([`abandoned`]), every run a worker gone left unfinished is recorded
//! failed by the next run of the pipeline.

use crate::runtime::runs::record::RunAsk;
use sluice_pipeline::timetable::{DataInterval, NextRun, Timetable};
use sluice_store::{RunRecord, RunState, WorkerRecord};

/// Runs looked at for one a runner left unfinished.
pub const UNFINISHED_LOOKBACK: usize = 50;

/// The schedule's state in the store.
pub struct ScheduleState {
    /// The newest [`UNFINISHED_LOOKBACK`] runs, newest first.
    pub runs: Vec<RunRecord>,
    /// The workers of the pipeline alive now.
    pub alive: Vec<WorkerRecord>,
    /// The last fire recorded.
    pub last_fire: Option<i64>,
}

/// What is due.
#[derive(Debug)]
pub enum Due {
    /// A fire's run its runner did not end: finished by this scheduler first, as what it
    /// asked (the same fire, interval and trigger).
    Unfinished {
        /// The run.
        run: RunRecord,
        /// What it runs.
        ask: RunAsk,
    },
    /// A manual or update run of a worker gone: recorded failed, not run.
    Abandoned(RunRecord),
    /// Nothing left over: the timetable's next run, and when the newest run started.
    Next {
        /// Now, at a time, or never.
        run: NextRun,
        /// The newest run's start (store clock), if there is a run.
        newest_start: Option<i64>,
        /// The start of `me`'s newest run (store clock), if it made one.
        newest_own_start: Option<i64>,
    },
}

/// For a pipeline without a schedule (no scheduler will finish any run): the oldest run left
/// `running` or `queued` by a worker gone, of any trigger, to record failed before `me` runs.
pub fn abandoned(state: ScheduleState, me: &str) -> Option<RunRecord> {
    let ScheduleState { runs, alive, .. } = state;
    runs.into_iter()
        .filter(|run| matches!(run.state, RunState::Running | RunState::Queued))
        .filter(|run| run.worker != me && !alive.iter().any(|w| w.worker == run.worker))
        .min_by_key(|run| run.run_id)
}

/// What `me` (a worker id) has to run at `now_ms`, by `timetable`, given `state`.
pub fn due(state: ScheduleState, timetable: &Timetable, me: &str, now_ms: i64) -> Due {
    let ScheduleState {
        runs,
        alive,
        last_fire,
    } = state;
    // A fire's run is this scheduler's to finish (its runner lost the lease); a manual or
    // update run of a live worker is that worker's.
    let running_elsewhere = |run: &RunRecord| {
        !run.trigger.is_fire() && run.worker != me && alive.iter().any(|w| w.worker == run.worker)
    };
    let unfinished = |run: &RunRecord| matches!(run.state, RunState::Running | RunState::Queued);
    let newest_start = runs.first().map(|r| r.started_at_ms);
    let newest_own_start = runs
        .iter()
        .find(|r| r.worker == me)
        .map(|r| r.started_at_ms);
    let oldest_unfinished = runs
        .into_iter()
        .filter(|run| unfinished(run) && !running_elsewhere(run))
        .min_by_key(|run| run.run_id);
    match oldest_unfinished {
        Some(run) if run.trigger.is_fire() => {
            let ask = RunAsk {
                fire_ms: run.fire_ms,
                interval: run
                    .interval
                    .map(|(start_ms, end_ms)| DataInterval { start_ms, end_ms }),
                trigger: run.trigger,
            };
            Due::Unfinished { run, ask }
        }
        Some(run) => Due::Abandoned(run),
        None => {
            let up_since = alive
                .iter()
                .map(|w| w.started_at_ms)
                .min()
                .unwrap_or(now_ms);
            Due::Next {
                run: timetable.next_run(last_fire, now_ms, up_since),
                newest_start,
                newest_own_start,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sluice_store::RunTrigger;

    fn run(run_id: i64, trigger: RunTrigger, state: RunState, worker: &str) -> RunRecord {
        RunRecord {
            run_id,
            fire_ms: run_id * 1_000,
            interval: None,
            trigger,
            state,
            worker: worker.to_owned(),
            started_at_ms: run_id * 1_000 + 5,
            ended_at_ms: None,
            rows: Vec::new(),
            error: None,
        }
    }

    fn alive(worker: &str, started_at_ms: i64) -> WorkerRecord {
        WorkerRecord {
            worker: worker.to_owned(),
            host: "h".to_owned(),
            pid: 1,
            started_at_ms,
            last_beat_ms: started_at_ms,
            schedule: None,
        }
    }

    fn hourly() -> Timetable {
        let yaml = "pipeline: p\nmode: triggered\nstore: sqlite://s.db\nschedule: { cron: \"0 * * * *\" }\n\
            targets:\n  - { name: t, kind: table }\n\
            flows:\n  - { name: f, target: t, source: { file: { path: \"in/*.jsonl\" } } }\n";
        let pipeline = sluice_pipeline::parse(yaml, std::path::Path::new("p.yaml")).unwrap();
        Timetable::new(pipeline.schedule.as_ref().unwrap()).unwrap()
    }

    fn state(runs: Vec<RunRecord>, alive: Vec<WorkerRecord>) -> ScheduleState {
        ScheduleState {
            runs,
            alive,
            last_fire: None,
        }
    }

    #[test]
    fn the_oldest_fire_left_running_is_finished_first_whoever_ran_it() {
        let runs = vec![
            run(3, RunTrigger::Schedule, RunState::Running, "b"),
            run(2, RunTrigger::Catchup, RunState::Queued, "b"),
            run(1, RunTrigger::Schedule, RunState::Completed, "a"),
        ];
        let due = due(state(runs, vec![alive("b", 0)]), &hourly(), "a", 10_000);
        assert!(
            matches!(due, Due::Unfinished { run, ask } if run.run_id == 2 && ask.fire_ms == 2_000)
        );
    }

    #[test]
    fn without_a_schedule_the_oldest_run_of_a_worker_gone_is_abandoned() {
        let runs = vec![
            run(5, RunTrigger::Manual, RunState::Running, "live"),
            run(4, RunTrigger::Manual, RunState::Queued, "gone"),
            run(3, RunTrigger::Backfill, RunState::Running, "gone"),
            run(2, RunTrigger::Manual, RunState::Failed, "gone"),
        ];
        let found = abandoned(state(runs.clone(), vec![alive("live", 0)]), "me");
        assert_eq!(found.map(|r| r.run_id), Some(3));
        let only_live = vec![runs[0].clone()];
        assert!(abandoned(state(only_live, vec![alive("live", 0)]), "me").is_none());
    }

    #[test]
    fn a_live_workers_manual_run_is_its_own_and_a_gone_workers_is_abandoned() {
        let manual = |worker| run(4, RunTrigger::Manual, RunState::Running, worker);
        let timetable = hourly();
        let live = due(
            state(vec![manual("b")], vec![alive("b", 0)]),
            &timetable,
            "a",
            0,
        );
        assert!(matches!(live, Due::Next { .. }), "{live:?}");
        let gone = due(state(vec![manual("b")], Vec::new()), &timetable, "a", 0);
        assert!(matches!(gone, Due::Abandoned(r) if r.worker == "b"));
        let mine = due(
            state(vec![manual("a")], vec![alive("a", 0)]),
            &timetable,
            "a",
            0,
        );
        assert!(matches!(mine, Due::Abandoned(r) if r.worker == "a"));
    }

    #[test]
    fn with_nothing_left_over_the_timetable_says_what_comes_next() {
        let runs = vec![run(7, RunTrigger::Schedule, RunState::Completed, "a")];
        let now = 1_700_000_000_000;
        let timetable = hourly();
        let alive_since = vec![alive("a", now - 10), alive("b", now - 20)];
        let due = due(state(runs, alive_since), &timetable, "a", now);
        let expected = timetable.next_run(None, now, now - 20);
        assert!(
            matches!(due, Due::Next { run, newest_start: Some(7_005), .. } if run == expected),
            "{due:?}"
        );
    }
}
