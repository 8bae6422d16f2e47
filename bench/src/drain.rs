//! One sluice drain of the benchmarks: a flow as the worker's Pub/Sub flows run it, into a fresh
//! store, timed from its start to its `n`th ack.
//!
//! A drain with [`Progress::Watermark`] runs, beside the flow, what a worker's watermark tracker
//! does for the messages its flow settles outside a commit (duplicates found in memory,
//! redeliveries parked behind a key in flight): every [`TRACKER_TICK`] it stores their reports
//! in the flow's buckets, and only then are they acked. The tracking subscription itself (the
//! reading and the estimate) is not run: the in-process source has none.
//!
//! Guarantee: a drain ends, with its figures once `n` messages are acked, or with
//! [`BenchError::Stalled`] saying how far it got when no message was acked for
//! [`STALL_TIMEOUT`] or the flow ended first (with its error), or with [`BenchError::Store`]
//! when the reports cannot be stored.
//!
//! What it does not cover: a source that delivers fewer than `n` messages stalls (and says so).

use crate::cpu::process_cpu_time;
use crate::error::BenchError;
use crate::stores::{Backend, FreshStore};
use crate::typed::TypedShape;
use sluice_engine::{
    BatchSettings, Budget, CommitThenAck, Counters, DedupSettings, FlowRun, FlowWatermark,
    KeySource, MessageSource, RetrySettings, RunUntil, Snapshot, TRACKER_TICK, TableStage,
};
use sluice_store::{FlowHandle, Layout, LedgerStore, Store, StoreError, table_name};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Give up on a drain that makes no progress for this long.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a drain looks at its acks.
const POLL: Duration = Duration::from_millis(5);

/// What a drain measured.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    /// From the start to the last ack.
    pub(crate) wall: Duration,
    /// This process's CPU time (user + system) meanwhile.
    pub(crate) cpu: Duration,
    /// What the store occupied and wrote (PostgreSQL drains).
    pub(crate) footprint: Option<String>,
}

/// What a commit records besides the rows and the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Nothing: a flow without a watermark.
    None,
    /// Each message id settled toward the flow's watermark (`sluice_watermark_messages`), as a
    /// flow with `event_time` and a tracking subscription commits; and, every tracker tick,
    /// the reports of the messages settled outside a commit, which are acked after them.
    Watermark,
}

impl Progress {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Watermark => " with watermark progress",
        }
    }
}

/// sluice end to end into a fresh store of `backend`, until `n` messages are acked.
pub(crate) async fn sluice_drain(
    source: Box<dyn MessageSource>,
    n: usize,
    backend: Backend,
    postgres_server: &str,
    progress: Progress,
    typed: Option<&TypedShape>,
) -> Result<Measured, BenchError> {
    let fresh = FreshStore::open(backend, postgres_server).await?;
    let (store, postgres) = (fresh.store.clone(), fresh.postgres.clone());
    let counters = Counters::new("bench", "ingest");
    let watermark = (progress == Progress::Watermark).then(FlowWatermark::new);
    if let Some(watermark) = &watermark {
        counters.attach_watermark(watermark.clone());
    }
    let key = KeySource::Attribute {
        name: "key".into(),
        dead_letter_if_missing: false,
    };
    let (run, flow) =
        bench_flow(&store, store.clone(), source, key, counters.clone(), typed).await?;
    let wal_before = match &postgres {
        Some(store) => Some(store.footprint().await.map_err(store_error)?.wal_position),
        None => None,
    };
    let drain = CancellationToken::new();
    let cpu_before = process_cpu_time();
    let started = Instant::now();
    let task = tokio::spawn(run.run(drain.clone()));
    let mut reporter = watermark
        .map(|watermark| report_settled(store.clone(), flow.clone(), watermark, drain.clone()));
    let acked = until_acked(
        &counters,
        n,
        started,
        &task,
        reporter.as_mut(),
        STALL_TIMEOUT,
    )
    .await;
    let cpu = process_cpu_time().saturating_sub(cpu_before);
    drain.cancel();
    let ended = task.await;
    if let Some(reporter) = reporter.filter(|r| !r.is_finished()) {
        let _ = reporter.await;
    }
    let wall = match (acked, ended) {
        (Err(BenchError::Stalled(why)), Ok(Err(error))) => {
            return Err(BenchError::Stalled(format!("{why}: {error}")));
        }
        (acked, _) => acked?,
    };
    let footprint = match (&postgres, wal_before) {
        (Some(store), Some(wal_before)) => {
            let after = store.footprint().await.map_err(store_error)?;
            let commits = store
                .flow_progress(&flow)
                .await
                .map_err(store_error)?
                .batches;
            Some(format!(
                "PostgreSQL after {n} messages: ledger {} rows ({:.2} per message), {} bytes \
                 ({:.0} B per message, indexes included); WAL {:.0} B per message; {commits} \
                 commits ({:.1}/s, {:.0} messages each)",
                after.ledger_rows,
                after.ledger_rows as f64 / n as f64,
                after.ledger_bytes,
                after.ledger_bytes as f64 / n as f64,
                (after.wal_position - wal_before) as f64 / n as f64,
                commits as f64 / wall.as_secs_f64(),
                n as f64 / commits.max(1) as f64,
            ))
        }
        _ => None,
    };
    drop(fresh);
    Ok(Measured {
        wall,
        cpu,
        footprint,
    })
}

fn store_error(error: StoreError) -> BenchError {
    BenchError::Store(error.to_string())
}

/// Waits until `counters` show `n` acks; gives up when none came for `stall`, when the `flow`
/// ended first, or when the `reporter` of settled messages failed.
async fn until_acked<T>(
    counters: &Counters,
    n: usize,
    started: Instant,
    flow: &JoinHandle<T>,
    mut reporter: Option<&mut JoinHandle<Result<(), StoreError>>>,
    stall: Duration,
) -> Result<Duration, BenchError> {
    let mut last = (0, Instant::now());
    loop {
        tokio::time::sleep(POLL).await;
        let snapshot = counters.snapshot();
        if snapshot.acked >= n as u64 {
            return Ok(started.elapsed());
        }
        if flow.is_finished() {
            return Err(BenchError::Stalled(format!(
                "the flow ended with {} of {n} messages acked",
                snapshot.acked
            )));
        }
        if let Some(reporter) = reporter.as_mut().filter(|r| r.is_finished()) {
            return Err(match reporter.await {
                Ok(Err(error)) => BenchError::Store(format!("storing settled reports: {error}")),
                _ => BenchError::Stalled("the reporter of settled messages ended".to_owned()),
            });
        }
        if snapshot.acked != last.0 {
            last = (snapshot.acked, Instant::now());
        } else if last.1.elapsed() > stall {
            return Err(BenchError::Stalled(stalled(&snapshot, n, stall)));
        }
    }
}

fn stalled(snapshot: &Snapshot, n: usize, stall: Duration) -> String {
    format!(
        "sluice acked {} of {n} and no more for {stall:?} ({} received, {} committed, {} \
         duplicates in memory, {} in the ledger, {} nacked)",
        snapshot.acked,
        snapshot.received,
        snapshot.committed,
        snapshot.duplicates_memory,
        snapshot.duplicates_store,
        snapshot.nacked,
    )
}

/// What a worker's watermark tracker does for the messages its flow settled outside a commit:
/// every [`TRACKER_TICK`] until `stop`, then once more, stores their reports in `flow`'s
/// buckets, which acks them. Ends early with the store's error.
fn report_settled(
    store: Arc<dyn Store>,
    flow: FlowHandle,
    watermark: FlowWatermark,
    stop: CancellationToken,
) -> JoinHandle<Result<(), StoreError>> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(TRACKER_TICK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = tokio::select! {
                _ = ticks.tick() => false,
                _ = stop.cancelled() => true,
            };
            watermark.store_settled(&*store, &flow).await?;
            if stopping {
                return Ok(());
            }
        }
    })
}
/// The flow every emulator drain of the benchmarks runs, as the worker's Pub/Sub flows do:
/// budget 10 000 / 100 MiB, dedup by `key` over 10 minutes, batches of up to 1 000 / 50 ms,
/// rows into `bench__events` of `store` (prepared here), committed through `ledger` (the store
/// itself, or a wrapper around it) with the commit bound.
pub(crate) async fn bench_flow(
    store: &Arc<dyn Store>,
    ledger: Arc<dyn LedgerStore>,
    source: Box<dyn MessageSource>,
    key: KeySource,
    counters: Counters,
    typed: Option<&TypedShape>,
) -> Result<(FlowRun, FlowHandle), BenchError> {
    let flow = store
        .prepare(&Layout {
            pipeline: "bench".into(),
            tables: vec!["events".into()],
            typed: typed.iter().map(|t| t.table.clone()).collect(),
            flows: vec!["ingest".into()],
        })
        .await
        .map_err(store_error)?
        .remove(0);
    let window = Duration::from_secs(600);
    let mut committer = CommitThenAck::new(
        ledger,
        flow.clone(),
        Arc::from(table_name("bench", "events").map_err(store_error)?),
        Arc::new(TableStage {
            fields: typed.map(|t| t.fields.clone()),
            ..TableStage::default()
        }),
        RetrySettings {
            max_attempts: 5,
            dedup_window: window,
            // As the worker's Pub/Sub flows: the deadline travels with every commit.
            commit_bound: Some(sluice_engine::commit_bound(window)),
            give_up_after: None,
        },
        CancellationToken::new(),
    );
    if let Some(typed) = typed {
        committer = committer.with_typed(typed.query.clone());
    }
    let run = FlowRun {
        source,
        budget: Budget::new(10_000, 100 << 20),
        dedup: DedupSettings { key, window },
        batch: BatchSettings {
            max_messages: 1_000,
            max_delay: Duration::from_millis(50),
        },
        committer,
        counters,
        until: RunUntil::Drained,
        drain_agreement: None,
    };
    Ok((run, flow))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// No ack for this long counts as stalled here.
    const SHORT_STALL: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_drain_that_stops_acking_says_how_far_it_got() {
        let counters = Counters::new("bench", "stalled");
        let flow = tokio::spawn(std::future::pending::<()>());
        let error = until_acked(&counters, 1, Instant::now(), &flow, None, SHORT_STALL)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, BenchError::Stalled(why) if why.starts_with("sluice acked 0 of 1 ")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_drain_whose_reports_cannot_be_stored_says_so() {
        let counters = Counters::new("bench", "unreported");
        let mut reporter =
            tokio::spawn(async { Err(StoreError::Unavailable("the disk is full".to_owned())) });
        let flow = tokio::spawn(std::future::pending::<()>());
        // The stall bound is the real one: only the reporter's failure ends this early.
        let error = until_acked(
            &counters,
            1,
            Instant::now(),
            &flow,
            Some(&mut reporter),
            STALL_TIMEOUT,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&error, BenchError::Store(why) if why.contains("the disk is full")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_drain_whose_flow_ended_says_so() {
        let counters = Counters::new("bench", "ended");
        let flow = tokio::spawn(async {});
        // The stall bound is the real one: only the flow's end ends this early.
        let error = until_acked(&counters, 1, Instant::now(), &flow, None, STALL_TIMEOUT)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, BenchError::Stalled(why) if why.starts_with("the flow ended with 0 of 1")),
            "{error}"
        );
    }
}
