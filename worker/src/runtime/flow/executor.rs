//! The graph executor: runs the flows of one update, one task each (`flow_task.rs`: a flow
//! starts once its predecessors succeeded, is retried, or is SKIPPED after a failure, SPEC §6;
//! `attempt.rs`: a once flow's completion persists), keeps the worker's readiness while they
//! run, and returns their outcomes in the pipeline's order.
//!
//! # Guarantees
//!
//! * **Independent flows run in parallel.** Bounded work (once flows, and every flow of a
//!   triggered run) runs at most [`MAX_PARALLEL_BOUNDED`] at a time; the live flows of a
//!   continuous pipeline all run, since none of them ever ends.
//! * **Ready only while every released flow runs**: not while one is still starting (its store
//!   or Pub/Sub does not answer), nor once a drain began.

use crate::runtime::flow::flow_task;
use crate::runtime::flow::outcome::{FlowOutcome, FlowState};
use crate::runtime::flow::run_context::RunContext;
use crate::serve::observe;
use sluice_engine::Snapshot;
use std::collections::{HashMap, HashSet};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Once flows (and flows of a triggered run) running at once, at most.
pub const MAX_PARALLEL_BOUNDED: usize = 4;

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
            let outcome = flow_task::run(&ctx, &flow, handle, predecessors, already_complete).await;
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
    use crate::runtime::flow::board::FlowBoard;
    use crate::runtime::flow::run_context::RunScope;
    use crate::runtime::kit::signals::Shutdown;
    use sluice_store::{FlowHandle, Store};
    use std::path::Path;
    use std::sync::Arc;
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio::sync::Semaphore;
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
                scope: RunScope::default(),
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
