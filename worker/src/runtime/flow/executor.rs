//! The order in which a run's flows start, and what happens when one fails (SPEC §6).
//!
//! # Guarantees
//!
//! * **A flow starts only after every predecessor completed successfully**: every flow it
//!   `depends_on`, and every flow writing a table it reads (a data edge; in continuous mode
//!   only once-writers, since a live writer never completes). Success is `COMPLETED` in this
//!   run or `IDLE` (a once flow recorded complete earlier, not re-read).
//! * **Failures do not cascade into work.** A flow that fails (cannot be built, its source
//!   cannot start, a file cannot be read) is retried after 1 s, 2 s and 4 s; when the retries
//!   are spent it is `FAILED` and every flow after it is `SKIPPED`, never started.
//! * **Independent flows run in parallel.** Bounded work (once flows, and every flow of a
//!   triggered run) runs at most [`MAX_PARALLEL_BOUNDED`] at a time; the live flows of a
//!   continuous pipeline all run, since none of them ever ends.
//! * **Completion is persistent.** A once flow that drains records its completion in the store
//!   before its dependents are released, so a restart (of this replica or any other) finds it
//!   `IDLE` and resumes at the first flow not completed. A once flow on a subscription drains
//!   only when every replica reading it agrees and a crashed reader's messages have had the
//!   time to come back (`runtime/pool/drain_quorum.rs`).

use crate::runtime::flow::board::{FlowBoard, FlowPhase};
use crate::runtime::flow::build;
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::serve::observe;
use sluice_engine::{Counters, Ended, FlowEnd, Snapshot};
use sluice_pipeline::{Flow, Mode, Pipeline, Source};
use sluice_store::FlowStore;
use sluice_store::{FlowHandle, Store};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// Once flows (and flows of a triggered run) running at once, at most.
pub const MAX_PARALLEL_BOUNDED: usize = 4;

/// Delays before each retry of a failed flow; when they are spent the flow is FAILED.
pub const RETRY_DELAYS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

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
    pub scope: build::RunScope,
}

/// Runs one flow once its predecessors have succeeded, with retries; announces its end on
/// `done` (`Some(success)`).
pub async fn run_flow(
    ctx: &RunContext,
    flow: &Flow,
    handle: FlowHandle,
    predecessors: Vec<(String, watch::Receiver<Option<bool>>)>,
) -> FlowOutcome {
    let outcome = |state| FlowOutcome {
        name: flow.name.clone(),
        state,
        counters: Snapshot::default(),
        skipped: 0,
    };
    for (name, mut rx) in predecessors {
        let succeeded = tokio::select! {
            result = rx.wait_for(Option::is_some) => result.ok().and_then(|v| *v).unwrap_or(false),
            _ = ctx.shutdown.drain.cancelled() => false,
        };
        if !succeeded {
            if ctx.shutdown.drain.is_cancelled() {
                return outcome(FlowState::Skipped("stopped before start".into()));
            }
            let why = format!("predecessor {name} did not complete");
            tracing::info!(flow = %flow.name, predecessor = %name, "flow skipped");
            return outcome(FlowState::Skipped(why));
        }
    }
    let bounded = flow.once || ctx.pipeline.mode == Mode::Triggered;
    let _slot = if bounded {
        tokio::select! {
            slot = ctx.slots.clone().acquire_owned() => slot.ok(),
            _ = ctx.shutdown.drain.cancelled() => None,
        }
    } else {
        None
    };
    let mut retries = RETRY_DELAYS.iter();
    loop {
        if ctx.shutdown.drain.is_cancelled() {
            return outcome(FlowState::Skipped("stopped before start".into()));
        }
        ctx.board.set(&flow.name, FlowPhase::Starting, None);
        let attempt = attempt(ctx, flow, handle.clone()).await;
        let FlowState::Failed(why) = &attempt.state else {
            return attempt;
        };
        let Some(delay) = retries.next() else {
            tracing::error!(flow = %flow.name, error = %why, "flow failed; retries spent");
            return attempt;
        };
        tracing::warn!(flow = %flow.name, error = %why, retry_in_s = delay.as_secs(),
            "flow failed; retrying");
        tokio::select! {
            _ = tokio::time::sleep(*delay) => {}
            _ = ctx.shutdown.drain.cancelled() => return attempt,
        }
    }
}

/// Resolves a sink flow's crash leftovers when the flow itself does not run (IDLE); a failure
/// is logged and left to the next start.
pub async fn recover_sink(ctx: &RunContext, flow: &Flow, handle: &FlowHandle) {
    if let Some(sink) = build::sink_of(&ctx.pipeline, flow)
        && let Err(error) = sink.recover(&*ctx.store, handle).await
    {
        tracing::warn!(flow = %flow.name, %error, "cannot resolve sink files left by a crash");
    }
}

/// One attempt at running a flow.
async fn attempt(ctx: &RunContext, flow: &Flow, handle: FlowHandle) -> FlowOutcome {
    let outcome = |state, counters: Option<&Counters>| FlowOutcome {
        name: flow.name.clone(),
        state,
        counters: counters.map(Counters::snapshot).unwrap_or_default(),
        skipped: 0,
    };
    if let Some(plan) = crate::runtime::flow::windows::table_plan(&ctx.pipeline, flow) {
        return window_over_table(ctx, flow, handle, plan).await;
    }
    let built = match build::build(
        &ctx.pipeline,
        flow,
        ctx.store.clone(),
        handle.clone(),
        &ctx.worker,
        ctx.shutdown.give_up.clone(),
        &ctx.scope,
    ) {
        Ok(built) => built,
        Err(error) => return outcome(FlowState::Failed(error), None),
    };
    let counters = built.counters;
    if let Some(sink) = &built.sink
        && let Err(error) = sink.recover(&*ctx.store, &handle).await
    {
        return outcome(FlowState::Failed(error), None);
    }
    let tracker = built.watermark.map(|plan| {
        crate::runtime::flow::watermarks::start(
            plan,
            ctx.store.clone(),
            handle.clone(),
            &ctx.worker,
        )
    });
    let emitter = match built.windows {
        None => None,
        Some(plan) => {
            match crate::runtime::flow::windows::start(plan, ctx.store.clone(), handle.clone())
                .await
            {
                Ok(emitter) => Some(emitter),
                Err(error) => {
                    if let Some(tracker) = tracker {
                        tracker.finish().await;
                    }
                    return outcome(FlowState::Failed(error), None);
                }
            }
        }
    };
    // STARTING until the source runs (Pub/Sub answered), then RUNNING.
    ctx.board
        .set(&flow.name, FlowPhase::Starting, Some(&counters));
    let (started, source_up) = tokio::sync::oneshot::channel();
    let announce = {
        let (board, name) = (ctx.board.clone(), flow.name.clone());
        tokio::spawn(async move {
            if source_up.await.is_ok() {
                tracing::info!(flow = %name, "flow started");
                board.set(&name, FlowPhase::Running, None);
            }
        })
    };
    let _bar = built
        .progress
        .clone()
        .filter(|_| built.draw_progress)
        .and_then(|progress| crate::runtime::flow::progress::draw(&flow.name, progress));
    let mut run = built.run;
    // A once flow on a subscription drains only when every replica reading it agrees.
    if flow.once
        && let Source::PubSub(source) = &flow.source
    {
        run.drain_agreement = Some(Arc::new(
            crate::runtime::pool::drain_quorum::StoreDrainQuorum::new(
                ctx.store.clone(),
                handle.clone(),
                &ctx.worker,
                source.drain_idle,
            ),
        ));
    }
    let end = run
        .run_notifying(ctx.shutdown.drain.clone(), Some(started))
        .await;
    // It has run (and set RUNNING) if the source started; it must not set it after the end.
    announce.abort();
    let _ = announce.await;
    if let Some(tracker) = tracker {
        tracker.finish().await;
    }
    if let Some(emitter) = emitter {
        let input_ended = flow.once
            && matches!(
                &end,
                Ok(FlowEnd {
                    ended: Ended::Drained,
                    ..
                })
            )
            && built.progress.as_ref().and_then(|p| p.failure()).is_none();
        emitter.finish(input_ended).await;
    }
    let failure = built.progress.as_ref().and_then(|p| p.failure());
    let skipped = built
        .progress
        .as_ref()
        .map_or(0, |p| p.skipped.load(std::sync::atomic::Ordering::Relaxed));
    let outcome = |state, counters: Option<&Counters>| FlowOutcome {
        skipped,
        ..outcome(state, counters)
    };
    match (end, failure) {
        (Err(error), _) => outcome(FlowState::Failed(error.to_string()), Some(&counters)),
        (Ok(_), Some(failure)) => outcome(FlowState::Failed(failure), Some(&counters)),
        (Ok(FlowEnd { report, ended }), None) => {
            tracing::info!(flow = %flow.name, rows = report.rows, duplicates = report.duplicates,
                dead_letters = report.dead_letters, ?ended, "flow finished");
            let state = match ended {
                Ended::Drained => FlowState::Completed,
                Ended::Stopped => FlowState::Stopped,
            };
            if flow.once && state == FlowState::Completed {
                record_completion(&*ctx.store, &handle, &ctx.shutdown).await;
            }
            outcome(state, Some(&counters))
        }
    }
}

/// One attempt at a window over a `table` source (`windows::follow_table`): RUNNING once its
/// counts table exists; COMPLETED after its one emission, or STOPPED by a signal.
async fn window_over_table(
    ctx: &RunContext,
    flow: &Flow,
    handle: FlowHandle,
    plan: crate::runtime::flow::windows::TableWindowPlan,
) -> FlowOutcome {
    let counters = Counters::new(&ctx.pipeline.name, &flow.name);
    ctx.board
        .set(&flow.name, FlowPhase::Starting, Some(&counters));
    let (board, name) = (ctx.board.clone(), flow.name.clone());
    let ended = crate::runtime::flow::windows::follow_table(
        plan,
        ctx.store.clone(),
        handle.clone(),
        &counters,
        ctx.shutdown.drain.clone(),
        move || {
            tracing::info!(flow = %name, "flow started");
            board.set(&name, FlowPhase::Running, None);
        },
    )
    .await;
    let state = match ended {
        Ok(true) => {
            tracing::info!(flow = %flow.name, "windows emitted; flow finished");
            if flow.once {
                record_completion(&*ctx.store, &handle, &ctx.shutdown).await;
            }
            FlowState::Completed
        }
        Ok(false) => FlowState::Stopped,
        Err(error) => FlowState::Failed(error),
    };
    FlowOutcome {
        name: flow.name.clone(),
        state,
        counters: counters.snapshot(),
        skipped: 0,
    }
}

/// Records a once flow's completion, retrying (whatever the error) until it is recorded or the
/// run is stopped (then the flow simply runs again next time: what it committed is skipped or
/// deduplicated).
async fn record_completion(store: &dyn FlowStore, flow: &FlowHandle, shutdown: &Shutdown) {
    let what = format!("record the completion of flow {}", flow.name);
    let recorded = store_retry::until_stored(&what, Retry::Always, &shutdown.drain, || {
        store.record_completion(flow)
    })
    .await;
    if let Err(error) = recorded {
        tracing::warn!(flow = %flow.name, %error,
            "the flow's completion is not recorded (stopped first); it runs again next time");
    }
}

/// Runs every flow of one update to its end (a flow starts once its predecessors succeeded)
/// and returns their outcomes in the pipeline's order.
pub async fn run_update(
    ctx: RunContext,
    handles: Vec<sluice_store::FlowHandle>,
    completed: HashSet<String>,
    readiness: &observe::Readiness,
) -> Vec<FlowOutcome> {
    let pipeline = &ctx.pipeline;
    // One "finished" signal per flow: None while running, Some(success) at the end.
    let mut finished = HashMap::new();
    let mut senders = Vec::new();
    for flow in &pipeline.flows {
        let (tx, rx) = watch::channel(None::<bool>);
        finished.insert(flow.name.clone(), rx);
        senders.push(tx);
    }
    let graph = sluice_pipeline::graph::FlowGraph::new(pipeline);
    let mut tasks = JoinSet::new();
    let mut names = HashMap::new();
    for ((flow, handle), done) in pipeline.flows.iter().zip(handles).zip(senders) {
        let predecessors: Vec<_> = graph
            .waits_for(&flow.name)
            .into_iter()
            .filter_map(|name| {
                let rx = finished.get(name).cloned()?;
                Some((name.to_owned(), rx))
            })
            .collect();
        let already_complete = flow.once && completed.contains(&flow.name);
        let (ctx, flow) = (ctx.clone(), flow.clone());
        let name = flow.name.clone();
        let task = tasks.spawn(async move {
            let outcome = if already_complete {
                tracing::info!(flow = %flow.name, "once flow completed earlier; not re-read");
                // A sink file its last run left behind is still published.
                recover_sink(&ctx, &flow, &handle).await;
                FlowOutcome {
                    name: flow.name.clone(),
                    state: FlowState::Idle,
                    counters: Snapshot::default(),
                    skipped: 0,
                }
            } else {
                run_flow(&ctx, &flow, handle, predecessors).await
            };
            ctx.board.set(&flow.name, outcome.state.phase(), None);
            let _ = done.send(Some(outcome.state.succeeded()));
            outcome
        });
        names.insert(task.id(), name);
    }
    // Ready while the update runs and no flow is still starting (its store and Pub/Sub
    // answered); not ready while one cannot start, or once a drain began.
    let watch_readiness = {
        let (readiness, board, drain) = (
            readiness.clone(),
            ctx.board.clone(),
            ctx.shutdown.drain.clone(),
        );
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(READINESS_INTERVAL);
            loop {
                ticks.tick().await;
                readiness.set(!drain.is_cancelled() && !board.any_starting());
            }
        })
    };
    let mut outcomes = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(outcome) => outcomes.push(outcome),
            Err(error) => {
                tracing::error!(%error, "a flow task panicked");
                outcomes.push(FlowOutcome {
                    name: names.get(&error.id()).cloned().unwrap_or_default(),
                    state: FlowState::Failed(format!("panicked: {error}")),
                    counters: Snapshot::default(),
                    skipped: 0,
                });
            }
        }
    }
    let order: HashMap<_, _> = pipeline
        .flows
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name.clone(), i))
        .collect();
    outcomes.sort_by_key(|o| order.get(&o.name).copied());
    watch_readiness.abort();
    outcomes
}

/// How often readiness follows the flows' states.
const READINESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::sync::Mutex;
    use tokio::time::Instant;
    use tracing_subscriber::layer::SubscriberExt;

    /// One event logged by a flow: when (since the capture began), which flow, what.
    type Logged = (Duration, String, String);

    /// The flows' log lines, timed on tokio's clock. Installed for this thread only, which runs
    /// every task of a `#[tokio::test]`.
    #[derive(Clone)]
    struct Capture {
        origin: Instant,
        events: Arc<Mutex<Vec<Logged>>>,
    }

    impl Capture {
        fn install() -> (Self, tracing::subscriber::DefaultGuard) {
            let capture = Self {
                origin: Instant::now(),
                events: Arc::default(),
            };
            let subscriber = tracing_subscriber::registry().with(capture.clone());
            (capture, tracing::subscriber::set_default(subscriber))
        }

        /// When `flow` logged `message`.
        fn times(&self, flow: &str, message: &str) -> Vec<Duration> {
            let events = self.events.lock().unwrap();
            events
                .iter()
                .filter(|(_, f, m)| f == flow && m == message)
                .map(|(at, _, _)| *at)
                .collect()
        }
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            #[derive(Default)]
            struct Fields {
                flow: String,
                message: String,
            }
            impl tracing::field::Visit for Fields {
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    match field.name() {
                        "flow" => self.flow = format!("{value:?}"),
                        "message" => self.message = format!("{value:?}"),
                        _ => {}
                    }
                }
            }
            let mut fields = Fields::default();
            event.record(&mut fields);
            let at = self.origin.elapsed();
            let mut events = self.events.lock().unwrap();
            events.push((at, fields.flow, fields.message));
        }
    }

    /// A pipeline prepared in a fresh SQLite store under a temporary folder; `{dir}` in its
    /// text is that folder.
    struct Prepared {
        dir: tempfile::TempDir,
        ctx: RunContext,
        handles: Vec<FlowHandle>,
    }

    impl Prepared {
        async fn new(yaml: &str) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let text = yaml.replace("{dir}", &dir.path().display().to_string());
            let pipeline = sluice_pipeline::parse(&text, Path::new("test.yaml")).unwrap();
            let store: Arc<dyn Store> =
                Arc::new(sluice_store::SqliteStore::open(&dir.path().join("db.sqlite")).unwrap());
            let handles = store
                .prepare(&crate::runtime::updates::prepare::layout(&pipeline))
                .await
                .unwrap();
            let board = FlowBoard::new(
                &pipeline.name,
                pipeline.flows.iter().map(|f| (f.name.clone(), f.once)),
            );
            let ctx = RunContext {
                pipeline,
                store,
                shutdown: Shutdown::default(),
                board,
                slots: Arc::new(Semaphore::new(MAX_PARALLEL_BOUNDED)),
                worker: "w".into(),
                scope: build::RunScope::default(),
            };
            Self { dir, ctx, handles }
        }

        /// Writes `input/part.jsonl` with records `r0..r{n}`.
        fn input(&self, n: usize) {
            let folder = self.dir.path().join("input");
            std::fs::create_dir_all(&folder).unwrap();
            let lines: String = (0..n)
                .map(|i| format!("{{\"id\":\"r{i}\",\"data\":{{\"n\":{i}}}}}\n"))
                .collect();
            std::fs::write(folder.join("part.jsonl"), lines).unwrap();
        }

        async fn update(&self) -> Vec<FlowOutcome> {
            let readiness = observe::Readiness::new(&self.ctx.pipeline.name);
            run_update(
                self.ctx.clone(),
                self.handles.clone(),
                HashSet::new(),
                &readiness,
            )
            .await
        }

        async fn rows(&self, target: &str) -> u64 {
            let table = sluice_store::table_name(&self.ctx.pipeline.name, target).unwrap();
            let rows = self
                .ctx
                .store
                .read_rows(&table, None, 1_000_000)
                .await
                .unwrap();
            rows.len() as u64
        }
    }

    /// A once flow whose glob matches no file: it fails at every start.
    fn broken(name: &str) -> String {
        format!(
            "  - name: {name}\n    target: events\n    once: true\n    source: {{ file: {{ path: \"{{dir}}/missing/*.jsonl\" }} }}\n"
        )
    }

    const HEAD: &str = "pipeline: test\nmode: continuous\nstore: sqlite://db.sqlite\n\
        targets:\n  - { name: events, kind: table }\n  - { name: copy, kind: table }\n  - { name: other, kind: table }\nflows:\n";

    fn secs(list: &[u64]) -> Vec<Duration> {
        list.iter().map(|s| Duration::from_secs(*s)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_flow_is_retried_after_1_2_and_4_seconds_then_failed() {
        let run = Prepared::new(&format!("{HEAD}{}", broken("broken"))).await;
        let (log, _guard) = Capture::install();
        let began = Instant::now();
        let outcomes = run.update().await;
        let elapsed = began.elapsed();
        assert!(
            matches!(&outcomes[0].state, FlowState::Failed(why) if why.contains("no file matches")),
            "{outcomes:?}"
        );
        assert!(
            elapsed >= Duration::from_secs(7) && elapsed < Duration::from_secs(8),
            "{elapsed:?}"
        );
        // Attempts at 0, 1, 3 and 7 s: each fails at once, the next comes 1, 2, then 4 s later.
        assert_eq!(
            log.times("broken", "flow failed; retrying"),
            secs(&[0, 1, 3])
        );
        assert_eq!(
            log.times("broken", "flow failed; retries spent"),
            secs(&[7])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn every_flow_after_a_failed_flow_is_skipped_never_started_and_writes_nothing() {
        let flows = format!(
            "{broken}{after}{chained}{reader}{independent}",
            broken = broken("broken"),
            after = "  - name: after\n    target: events\n    once: true\n    depends_on: broken\n    source: { file: { path: \"{dir}/input/*.jsonl\" } }\n",
            chained = "  - name: chained\n    target: events\n    once: true\n    depends_on: after\n    source: { file: { path: \"{dir}/input/*.jsonl\" } }\n",
            // Waits for the once writers of the table it reads (a data edge).
            reader = "  - name: reader\n    target: copy\n    once: true\n    source: { table: events }\n",
            independent = "  - name: independent\n    target: other\n    once: true\n    source: { file: { path: \"{dir}/input/*.jsonl\" } }\n",
        );
        let run = Prepared::new(&format!("{HEAD}{flows}")).await;
        run.input(3);
        let (log, _guard) = Capture::install();
        let outcomes = run.update().await;
        let states: Vec<_> = outcomes
            .iter()
            .map(|o| (o.name.as_str(), o.state.clone()))
            .collect();
        let skipped =
            |after: &str| FlowState::Skipped(format!("predecessor {after} did not complete"));
        assert!(
            matches!(states[0], ("broken", FlowState::Failed(_))),
            "{states:?}"
        );
        assert_eq!(states[1], ("after", skipped("broken")));
        assert_eq!(states[2], ("chained", skipped("after")));
        assert_eq!(states[3], ("reader", skipped("broken")));
        // A failure does not stop flows that do not wait for it.
        assert_eq!(states[4], ("independent", FlowState::Completed));
        assert_eq!(run.rows("other").await, 3);
        assert_eq!(run.rows("events").await, 0);
        assert_eq!(run.rows("copy").await, 0);
        for flow in ["after", "chained", "reader"] {
            assert_eq!(
                log.times(flow, "flow started"),
                Vec::<Duration>::new(),
                "{flow}"
            );
        }
        assert_eq!(log.times("independent", "flow started").len(), 1);
        // Skipped only once the retries were spent.
        let failed_at = log.times("broken", "flow failed; retries spent");
        assert_eq!(failed_at.len(), 1);
        for flow in ["after", "reader"] {
            let at = log.times(flow, "flow skipped");
            assert!(
                at.len() == 1 && at[0] >= failed_at[0],
                "{flow} skipped at {at:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn independent_bounded_flows_run_in_parallel_but_never_more_than_the_slots() {
        let names: Vec<String> = (0..MAX_PARALLEL_BOUNDED + 2)
            .map(|i| format!("b{i}"))
            .collect();
        let flows: String = names.iter().map(|n| broken(n)).collect();
        let run = Prepared::new(&format!("{HEAD}{flows}")).await;
        let (log, _guard) = Capture::install();
        let outcomes = run.update().await;
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o.state, FlowState::Failed(_))),
            "{outcomes:?}"
        );
        // Each flow holds its slot through its 7 s of retries: a full set of slots at once, then
        // the rest.
        let waves = |first: u64, second: u64| {
            let mut times = vec![Duration::from_secs(first); MAX_PARALLEL_BOUNDED];
            times.extend([Duration::from_secs(second); 2]);
            times
        };
        let mut first_tries: Vec<Duration> = names
            .iter()
            .flat_map(|n| log.times(n, "flow failed; retrying").into_iter().take(1))
            .collect();
        first_tries.sort();
        assert_eq!(first_tries, waves(0, 7));
        let mut failed: Vec<Duration> = names
            .iter()
            .flat_map(|n| log.times(n, "flow failed; retries spent"))
            .collect();
        failed.sort();
        assert_eq!(failed, waves(7, 14));
    }
}
