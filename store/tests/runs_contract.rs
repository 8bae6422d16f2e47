//! The runs role (`RunStore`): a schedule's fire recorded once per pipeline, handed to the
//! replica that takes an unfinished run over, left alone once ended; manual runs recorded each
//! time; the history newest first; the last fire. Each test runs on both backends
//! (`contract/mod.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;

fn start(fire_ms: i64, trigger: RunTrigger, worker: &str) -> RunStart {
    RunStart {
        pipeline: "p".into(),
        fire_ms,
        interval: Some((fire_ms - 1_000, fire_ms)),
        trigger,
        worker: worker.into(),
        alive_within: Duration::from_secs(15),
        queued_as: None,
    }
}

/// A heartbeat of `worker` in pipeline `p`: it is alive.
fn beat(worker: &str) -> WorkerBeat {
    WorkerBeat {
        pipeline: "p".into(),
        worker: worker.into(),
        host: "h".into(),
        pid: 1,
        schedule: None,
    }
}

/// A fire begun twice is one run: the second asker (a replica that took the scheduler over)
/// gets it with its id and interval, and only it may end it; once ended it is returned ended,
/// not begun again, and its end is not rewritten.
async fn a_fire_is_one_run_taken_over_until_it_ends(postgres: bool) {
    let (place, store, _) = open(postgres).await;
    let other_replica = place.open();
    let first = store
        .begin_run(&start(60_000, RunTrigger::Schedule, "w1"))
        .await
        .unwrap();
    assert_eq!(first.state, RunState::Running);
    assert_eq!(first.worker, "w1");
    assert_eq!(first.interval, Some((59_000, 60_000)));
    assert!(first.ended_at_ms.is_none());

    let taken = other_replica
        .begin_run(&start(60_000, RunTrigger::Schedule, "w2"))
        .await
        .unwrap();
    assert_eq!(taken.run_id, first.run_id, "the same run, not a second one");
    assert_eq!(taken.worker, "w2");

    let completed = RunEnd {
        state: RunState::Completed,
        rows: vec![("ingest".into(), 7), ("export".into(), 3)],
        error: None,
    };
    let failed = RunEnd {
        state: RunState::Failed,
        rows: Vec::new(),
        error: Some("late".into()),
    };
    assert!(
        !store.end_run(first.run_id, "w1", &failed).await.unwrap(),
        "w1 lost the run to w2: its end is not recorded"
    );
    assert!(
        other_replica
            .end_run(taken.run_id, "w2", &completed)
            .await
            .unwrap()
    );
    assert!(
        !other_replica
            .end_run(taken.run_id, "w2", &failed)
            .await
            .unwrap(),
        "an ended run is never rewritten"
    );
    let again = store
        .begin_run(&start(60_000, RunTrigger::Catchup, "w3"))
        .await
        .unwrap();
    assert_eq!(again.run_id, first.run_id);
    assert_eq!(
        again.state,
        RunState::Completed,
        "an ended fire is not run again"
    );
    assert_eq!(again.worker, "w2");
    assert_eq!(
        again.rows,
        [("export".to_owned(), 3), ("ingest".to_owned(), 7)]
    );
    assert!(again.ended_at_ms.unwrap() >= again.started_at_ms);
    assert_eq!(store.runs("p", 10).await.unwrap().len(), 1);
}

/// Manual and update runs have no fire of their own: each is a run. The history lists the
/// newest first; the last fire counts only the schedule's (`schedule`, `catchup`); another
/// pipeline's runs are its own.
async fn history_and_last_fire(postgres: bool) {
    let (_place, store, _) = open(postgres).await;
    assert_eq!(store.last_fire("p").await.unwrap(), None);
    let mut ids = Vec::new();
    for (fire, trigger) in [
        (10_000, RunTrigger::Catchup),
        (20_000, RunTrigger::Schedule),
        (25_000, RunTrigger::Manual),
        (25_000, RunTrigger::Manual),
        (90_000, RunTrigger::Update),
    ] {
        let run = store.begin_run(&start(fire, trigger, "w1")).await.unwrap();
        let ended = RunEnd {
            state: RunState::Failed,
            rows: Vec::new(),
            error: Some("flow x failed".into()),
        };
        assert!(store.end_run(run.run_id, "w1", &ended).await.unwrap());
        ids.push(run.run_id);
    }
    let mut other = start(99_000, RunTrigger::Schedule, "w9");
    other.pipeline = "q".into();
    store.begin_run(&other).await.unwrap();

    let runs = store.runs("p", 10).await.unwrap();
    let newest_first: Vec<i64> = ids.iter().rev().copied().collect();
    assert_eq!(
        runs.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        newest_first
    );
    assert_eq!(runs[0].trigger, RunTrigger::Update);
    assert_eq!(runs[0].state, RunState::Failed);
    assert_eq!(runs[0].error.as_deref(), Some("flow x failed"));
    assert_eq!(store.runs("p", 2).await.unwrap().len(), 2);
    assert_eq!(store.last_fire("p").await.unwrap(), Some(20_000));
    assert_eq!(store.last_fire("q").await.unwrap(), Some(99_000));
}

/// One run at a time in a pool, in the order asked: while a live worker's run goes on, a fire
/// or another worker's manual run is recorded `queued` and starts only when it may, the oldest
/// queued first; a dead worker's run holds nothing back.
async fn a_live_workers_run_holds_back_the_others_in_order(postgres: bool) {
    let (_place, store, _) = open(postgres).await;
    for worker in ["w1", "w2", "w3"] {
        store.heartbeat(&beat(worker)).await.unwrap();
    }
    // A run left running by a worker that is not alive (no heartbeat) holds nothing back.
    let orphan = store
        .begin_run(&start(5_000, RunTrigger::Manual, "gone"))
        .await
        .unwrap();
    assert_eq!(orphan.state, RunState::Running);
    let manual = store
        .begin_run(&start(10_000, RunTrigger::Manual, "w2"))
        .await
        .unwrap();
    assert_eq!(
        (manual.worker.as_str(), manual.state),
        ("w2", RunState::Running),
        "gone's run does not hold w2 back"
    );
    let fire = store
        .begin_run(&start(20_000, RunTrigger::Schedule, "w1"))
        .await
        .unwrap();
    assert_eq!((fire.worker.as_str(), fire.state), ("w1", RunState::Queued));
    let asked = store
        .begin_run(&start(30_000, RunTrigger::Manual, "w3"))
        .await
        .unwrap();
    assert_eq!(
        (asked.worker.as_str(), asked.state),
        ("w3", RunState::Queued)
    );
    let again = |run: &RunRecord, trigger, worker: &str| {
        let mut start = start(run.fire_ms, trigger, worker);
        start.queued_as = Some(run.run_id);
        start
    };
    let still = store
        .begin_run(&again(&fire, RunTrigger::Schedule, "w1"))
        .await
        .unwrap();
    assert_eq!((still.run_id, still.state), (fire.run_id, RunState::Queued));
    let ended = RunEnd {
        state: RunState::Completed,
        rows: Vec::new(),
        error: None,
    };
    assert!(store.end_run(manual.run_id, "w2", &ended).await.unwrap());
    let later = store
        .begin_run(&again(&asked, RunTrigger::Manual, "w3"))
        .await
        .unwrap();
    assert_eq!(
        later.state,
        RunState::Queued,
        "w3 asked after w1's fire was queued: it waits for it"
    );
    let started = store
        .begin_run(&again(&fire, RunTrigger::Schedule, "w1"))
        .await
        .unwrap();
    assert_eq!(
        (started.run_id, started.state, started.fire_ms),
        (fire.run_id, RunState::Running, 20_000)
    );
    assert!(started.started_at_ms >= fire.started_at_ms);
    assert!(store.end_run(started.run_id, "w1", &ended).await.unwrap());
    let last = store
        .begin_run(&again(&asked, RunTrigger::Manual, "w3"))
        .await
        .unwrap();
    assert_eq!((last.run_id, last.state), (asked.run_id, RunState::Running));
    assert_eq!(
        store.runs("p", 10).await.unwrap().len(),
        4,
        "queued runs are recorded once"
    );
}

/// PostgreSQL: a run that begins once another worker's run has ended is recorded as started
/// after that end, even when its begin waited for the pipeline's run lock meanwhile (a fresh-clone
/// CI run had a fire's `started_at` before the manual run's `ended_at` it waited for: both were
/// the transactions' start times, `now()`).
#[tokio::test]
async fn a_run_begun_after_another_ended_is_recorded_after_its_end() {
    let (place, store, _) = open(true).await;
    let Place::Postgres(db) = &place else {
        unreachable!()
    };
    for worker in ["w1", "w2"] {
        store.heartbeat(&beat(worker)).await.unwrap();
    }
    let manual = store
        .begin_run(&start(10_000, RunTrigger::Manual, "w2"))
        .await
        .unwrap();
    assert_eq!(manual.state, RunState::Running);
    // Hold the pipeline's run lock (the class in `postgres/runs.rs`) so the fire's begin waits.
    let mut locker = postgres_client(db).await;
    let lock = locker.transaction().await.unwrap();
    lock.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext('p'))",
        &[&0x736c_0003_i32],
    )
    .await
    .unwrap();
    let fire = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .begin_run(&start(20_000, RunTrigger::Schedule, "w1"))
                .await
                .unwrap()
        }
    });
    let watcher = postgres_client(db).await;
    let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    let mut waited = false;
    for _ in 0..200 {
        if watcher
            .query_one(waiting, &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 1
        {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waited, "the fire's begin never waited for the run lock");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let ended = RunEnd {
        state: RunState::Completed,
        rows: Vec::new(),
        error: None,
    };
    assert!(store.end_run(manual.run_id, "w2", &ended).await.unwrap());
    lock.commit().await.unwrap();
    let fire = fire.await.unwrap();
    assert_eq!(fire.state, RunState::Running, "the manual run had ended");
    let runs = store.runs("p", 10).await.unwrap();
    let manual = runs.iter().find(|r| r.run_id == manual.run_id).unwrap();
    let manual_end = manual.ended_at_ms.unwrap();
    assert!(
        fire.started_at_ms >= manual_end,
        "the fire is recorded started at {} ms, before the run it waited for ended ({manual_end} ms)",
        fire.started_at_ms
    );
}

/// An interval is run once: a fire whose interval a backfill completed is recorded completed
/// at once, not run, and the reverse; a backfill queued behind a live worker's fire of its
/// interval ends completed, not run, once that fire completed; a failed run does not count,
/// and a manual run of a completed interval is run as asked.
async fn an_interval_completed_by_one_run_is_not_run_by_another(postgres: bool) {
    let (_place, store, _) = open(postgres).await;
    for worker in ["w1", "w2"] {
        store.heartbeat(&beat(worker)).await.unwrap();
    }
    let completed = RunEnd {
        state: RunState::Completed,
        rows: vec![("ingest".into(), 5)],
        error: None,
    };
    // A backfill completes (59 s, 60 s); the scheduler's fire of it is not run.
    let backfill = store
        .begin_run(&start(60_000, RunTrigger::Backfill, "w2"))
        .await
        .unwrap();
    assert_eq!(backfill.state, RunState::Running);
    assert!(
        store
            .end_run(backfill.run_id, "w2", &completed)
            .await
            .unwrap()
    );
    let fire = store
        .begin_run(&start(60_000, RunTrigger::Catchup, "w1"))
        .await
        .unwrap();
    assert_ne!(fire.run_id, backfill.run_id);
    assert_eq!(fire.state, RunState::Completed, "the interval was run");
    assert!(fire.rows.is_empty() && fire.ended_at_ms.is_some());
    assert_eq!(
        store.last_fire("p").await.unwrap(),
        Some(60_000),
        "the fire is recorded"
    );
    // The reverse: a fire completes (69 s, 70 s); a backfill of it is not run.
    let fire = store
        .begin_run(&start(70_000, RunTrigger::Schedule, "w1"))
        .await
        .unwrap();
    assert!(store.end_run(fire.run_id, "w1", &completed).await.unwrap());
    let backfill = store
        .begin_run(&start(70_000, RunTrigger::Backfill, "w2"))
        .await
        .unwrap();
    assert_eq!(backfill.state, RunState::Completed);
    // A backfill queued behind the live scheduler's fire of its interval (79 s, 80 s).
    let fire = store
        .begin_run(&start(80_000, RunTrigger::Schedule, "w1"))
        .await
        .unwrap();
    let queued = store
        .begin_run(&start(80_000, RunTrigger::Backfill, "w2"))
        .await
        .unwrap();
    assert_eq!(queued.state, RunState::Queued);
    assert!(store.end_run(fire.run_id, "w1", &completed).await.unwrap());
    let mut again = start(80_000, RunTrigger::Backfill, "w2");
    again.queued_as = Some(queued.run_id);
    let again = store.begin_run(&again).await.unwrap();
    assert_eq!(
        (again.run_id, again.state),
        (queued.run_id, RunState::Completed),
        "the queued backfill ends without running the interval again"
    );
    // A fire left running by a runner gone (no heartbeat): a backfill runs the interval
    // (nothing holds it back), and the next scheduler's take-over finds it completed.
    let left = store
        .begin_run(&start(85_000, RunTrigger::Schedule, "gone"))
        .await
        .unwrap();
    assert_eq!(left.state, RunState::Running);
    let backfill = store
        .begin_run(&start(85_000, RunTrigger::Backfill, "w2"))
        .await
        .unwrap();
    assert_eq!(backfill.state, RunState::Running);
    assert!(
        store
            .end_run(backfill.run_id, "w2", &completed)
            .await
            .unwrap()
    );
    let taken = store
        .begin_run(&start(85_000, RunTrigger::Schedule, "w1"))
        .await
        .unwrap();
    assert_eq!(
        (taken.run_id, taken.state),
        (left.run_id, RunState::Completed),
        "the fire left running is not run again"
    );
    // A failed run does not count: (89 s, 90 s) is run again by a backfill.
    let failed = store
        .begin_run(&start(90_000, RunTrigger::Schedule, "w1"))
        .await
        .unwrap();
    let failure = RunEnd {
        state: RunState::Failed,
        rows: Vec::new(),
        error: Some("flow x failed".into()),
    };
    assert!(store.end_run(failed.run_id, "w1", &failure).await.unwrap());
    let rerun = store
        .begin_run(&start(90_000, RunTrigger::Backfill, "w2"))
        .await
        .unwrap();
    assert_eq!(rerun.state, RunState::Running);
    assert!(store.end_run(rerun.run_id, "w2", &completed).await.unwrap());
    // A timetable without intervals: a fire's run is one per fire, whoever runs it.
    let mut no_interval = start(95_000, RunTrigger::Backfill, "w2");
    no_interval.interval = None;
    let backfill = store.begin_run(&no_interval).await.unwrap();
    assert_eq!(backfill.state, RunState::Running);
    assert!(
        store
            .end_run(backfill.run_id, "w2", &completed)
            .await
            .unwrap()
    );
    no_interval.trigger = RunTrigger::Schedule;
    no_interval.worker = "w1".into();
    let fire = store.begin_run(&no_interval).await.unwrap();
    assert_eq!(fire.state, RunState::Completed);
    // A manual run is run as asked.
    let manual = store
        .begin_run(&start(90_000, RunTrigger::Manual, "w1"))
        .await
        .unwrap();
    assert_eq!(manual.state, RunState::Running);
}

on_both_backends!(
    an_interval_completed_by_one_run_is_not_run_by_another,
    a_live_workers_run_holds_back_the_others_in_order,
    a_fire_is_one_run_taken_over_until_it_ends,
    history_and_last_fire,
);
