//! `window` targets: event-time tumbling window counts per group, emitted beside the flow that
//! feeds them.
//!
//! Two feeds:
//!
//! * **A Pub/Sub flow with `watermark:`** writes its messages to the target's base table
//!   (`<pipeline>__<target>`, like any table target). Every worker running the flow emits, each
//!   [`EMIT_INTERVAL`], the windows whose end plus `allowed_lateness` the flow's watermark has
//!   passed, into `<pipeline>__<target>__windows` ([`sluice_store::WindowStore::emit_windows`]:
//!   computed from the committed rows, one transaction, each count row written once whichever
//!   replica emits).
//! * **A `table` source** ([`TableWindowPlan`], SPEC §4's example): the flow copies nothing; it
//!   counts the rows of the table it reads, whichever flow wrote them, under the **table's
//!   watermark**: the minimum of its writers' watermarks. A bounded writer (a backfill, a
//!   triggered file flow) has none while it runs: the flow graph starts the window flow only
//!   after every bounded writer completed (a data edge), and from then on that writer adds no
//!   row. Every live writer must be a Pub/Sub flow with `watermark:` (`sluice_pipeline::load_for_run`
//!   refuses anything else), whose stored watermark bounds what it will still commit. While any
//!   live writer has no watermark yet, the table has none and nothing is emitted. This is why a
//!   backfill beside a live flow holds the live flow's windows back, and `depends_on` does not
//!   (docs/watermarks.md, "Backfills and the watermark").
//!
//! Why the counts are complete: the watermark never passes an uncommitted message whose event
//! time is within the band (SPEC §2.4), so when it has passed a window's end every such message
//! of the window is in the base table. A message that comes later anyway is *late*: it is kept
//! in the base table and counted in `sluice_messages_late_total` (by the flow that wrote it),
//! and the window's count stays as emitted.

use sluice_engine::{Backoff, Counters, FlowWatermark};
use sluice_pipeline::aggregates::result_type;
use sluice_pipeline::{AggregateFunction, Column, Flow, Mode, Pipeline, Source, TargetKind};
use sluice_store::{
    FlowHandle, Store, WatermarkRecord, WindowAggregate, WindowEmission, WindowFunction,
    WindowGroup, WindowRows, table_name, window_table_name,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often windows are emitted.
pub const EMIT_INTERVAL: Duration = Duration::from_secs(1);

/// What a flow writing a window target needs to emit it.
#[derive(Debug, Clone)]
struct WindowPlan {
    emission: WindowEmission,
    lateness_ms: i64,
    watermark: FlowWatermark,
}

/// The plan of `flow`'s windows, if its target is a `window` (whose checks `sluice_pipeline::load_for_run`
/// made).
fn plan(pipeline: &Pipeline, flow: &Flow, watermark: &FlowWatermark) -> Option<WindowPlan> {
    let window = window_of(pipeline, flow, None)?;
    Some(WindowPlan {
        emission: WindowEmission {
            base_table: table_name(&pipeline.name, &flow.target).ok()?,
            windows_table: window_table_name(&pipeline.name, &flow.target).ok()?,
            size_ms: window.size_ms,
            group: window.group,
            aggregates: window.aggregates,
            before_ms: i64::MIN,
            rows: WindowRows::OfTheFlow,
        },
        lateness_ms: window.lateness_ms,
        watermark: watermark.clone(),
    })
}

/// A window target as the store emits it.
struct Window {
    size_ms: i64,
    group: WindowGroup,
    aggregates: Vec<WindowAggregate>,
    lateness_ms: i64,
}

/// The window target `flow` writes; `read`, the typed columns of the table it reads, if any
/// (its aggregates' result types come from them).
fn window_of(pipeline: &Pipeline, flow: &Flow, read: Option<&[Column]>) -> Option<Window> {
    let target = pipeline.targets.iter().find(|t| t.name == flow.target)?;
    let TargetKind::Window {
        size,
        group_by,
        allowed_lateness,
        aggregates,
    } = &target.kind
    else {
        return None;
    };
    let millis = |d: &Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let group = match TargetKind::group_column(group_by) {
        Some(column) => WindowGroup::Column(column.to_owned()),
        None => WindowGroup::Attribute(TargetKind::group_attribute(group_by)?.to_owned()),
    };
    let aggregates = aggregates
        .iter()
        .map(|a| {
            let ty = result_type(a, read.unwrap_or_default()).ok()?;
            Some(WindowAggregate {
                name: a.name.clone(),
                function: match a.function {
                    AggregateFunction::Count => WindowFunction::Count,
                    AggregateFunction::Sum => WindowFunction::Sum,
                    AggregateFunction::Min => WindowFunction::Min,
                    AggregateFunction::Max => WindowFunction::Max,
                    AggregateFunction::Avg => WindowFunction::Avg,
                },
                column: a.column.clone(),
                ty: super::typed::column_type(ty),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Window {
        size_ms: millis(size).max(1),
        group,
        aggregates,
        lateness_ms: millis(allowed_lateness),
    })
}

/// A window over a `table` source: what the flow counts, and whose watermarks close it.
#[derive(Debug, Clone)]
pub struct TableWindowPlan {
    emission: WindowEmission,
    lateness_ms: i64,
    /// The table's live writers, whose stored watermarks bound the table's.
    live_writers: Vec<String>,
    /// Emit until stopped (live writers in a continuous pipeline), or emit what is due once and
    /// complete (a triggered run, or a table whose writers are all bounded, so done).
    follow: bool,
}

/// The plan of `flow` if it is a window over a `table` source (whose checks
/// `sluice_pipeline::load_for_run` made).
pub fn table_plan(pipeline: &Pipeline, flow: &Flow) -> Option<TableWindowPlan> {
    let Source::Table { target: read } = &flow.source else {
        return None;
    };
    let columns = pipeline
        .targets
        .iter()
        .find(|t| t.name == *read)
        .map(|t| t.columns.as_slice());
    let window = window_of(pipeline, flow, columns)?;
    let live_writers: Vec<String> = pipeline
        .live_writers(read)
        .into_iter()
        .map(|w| w.name.clone())
        .collect();
    Some(TableWindowPlan {
        emission: WindowEmission {
            base_table: table_name(&pipeline.name, read).ok()?,
            windows_table: window_table_name(&pipeline.name, &flow.target).ok()?,
            size_ms: window.size_ms,
            group: window.group,
            aggregates: window.aggregates,
            before_ms: i64::MIN,
            rows: WindowRows::All,
        },
        lateness_ms: window.lateness_ms,
        follow: pipeline.mode == Mode::Continuous && !live_writers.is_empty(),
        live_writers,
    })
}

/// The watermark of a table whose live writers are `live_writers`, from the stored watermark
/// records of the pipeline's flows: the smallest of theirs, `None` while one has none yet, and
/// `i64::MAX` (everything is in) when it has no live writer.
pub fn table_watermark(
    live_writers: &[String],
    records: &[(String, WatermarkRecord)],
) -> Option<i64> {
    live_writers.iter().try_fold(i64::MAX, |lowest, writer| {
        let record = records.iter().find(|(flow, _)| flow == writer)?;
        Some(lowest.min(record.1.watermark_ms))
    })
}

/// Runs a window over a `table` source until `drain` (when it follows live writers) or for one
/// emission: emits the windows the table's watermark has passed, keeps that watermark as the
/// flow's (stored, so `sluice status` shows it, and on `counters`' gauges), and calls
/// `started` once its counts table exists. A store outage is retried; it never fails the flow.
/// Returns whether it ran to its end (`true`) or was stopped.
pub async fn follow_table(
    plan: TableWindowPlan,
    store: Arc<dyn Store>,
    flow: FlowHandle,
    counters: &Counters,
    drain: CancellationToken,
    started: impl FnOnce(),
) -> Result<bool, String> {
    store
        .prepare_window_table(&plan.emission.windows_table)
        .await
        .map_err(|e| format!("cannot create {}: {e}", plan.emission.windows_table))?;
    let watermark = FlowWatermark::new();
    counters.attach_watermark(watermark.clone());
    started();
    let mut backoff = Backoff::default();
    let mut emitted_before = i64::MIN;
    loop {
        match emit_over_table(&plan, &*store, &flow, &watermark, &mut emitted_before).await {
            Ok(()) if !plan.follow => return Ok(true),
            Ok(()) => {
                backoff = Backoff::default();
                counters.publish_watermark();
                tokio::select! {
                    _ = tokio::time::sleep(EMIT_INTERVAL) => {}
                    _ = drain.cancelled() => return Ok(false),
                }
            }
            // A misconfiguration (an aggregate's column of another type) is not retried.
            Err(error @ sluice_store::StoreError::Config(_)) => {
                return Err(format!("cannot emit the windows of {}: {error}", flow.name));
            }
            Err(error) => {
                let delay = backoff.next_delay();
                tracing::warn!(flow = %flow.name, %error, step = backoff.step(),
                    "cannot emit the windows of a table; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = drain.cancelled() => return Ok(false),
                }
            }
        }
    }
}

/// One tick of [`follow_table`]: the table's watermark, stored as the flow's, then the due
/// windows.
async fn emit_over_table(
    plan: &TableWindowPlan,
    store: &dyn Store,
    flow: &FlowHandle,
    watermark: &FlowWatermark,
    emitted_before: &mut i64,
) -> Result<(), sluice_store::StoreError> {
    let records = store.watermarks(&flow.pipeline).await?;
    let Some(table_ms) = table_watermark(&plan.live_writers, &records) else {
        return Ok(());
    };
    // Stored when it moved (first in the store, so a failed write is made again next tick).
    if table_ms != i64::MAX && watermark.current().is_none_or(|shown| shown < table_ms) {
        let now_ms = sluice_engine::now_ms();
        store
            .advance_watermark(
                flow,
                &WatermarkRecord {
                    watermark_ms: table_ms,
                    horizon_ms: table_ms,
                    updated_at_ms: now_ms,
                },
                None,
            )
            .await?;
        watermark.advance(table_ms);
    }
    let before_ms = table_ms.saturating_sub(plan.lateness_ms);
    if before_ms < emitted_before.saturating_add(plan.emission.size_ms) {
        return Ok(());
    }
    let emission = WindowEmission {
        before_ms,
        ..plan.emission.clone()
    };
    let emitted = store.emit_windows(flow, &emission).await?;
    if emitted.rows > 0 {
        tracing::info!(flow = %flow.name, rows = emitted.rows,
            before_ms = emitted.emitted_before_ms, "windows emitted");
    }
    *emitted_before = emitted.emitted_before_ms;
    Ok(())
}

/// A running emitter.
pub struct RunningEmitter {
    stop: CancellationToken,
    /// Set before `stop` when the flow's input has ended (a once flow drained).
    input_ended: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl RunningEmitter {
    /// Stops it after the flow's run ended, with a last emission. `input_ended`: the flow read
    /// all its input (a once flow that drained), so every window is complete and is emitted,
    /// as at the end of a bounded input; otherwise the watermark decides as before.
    pub async fn finish(self, input_ended: bool) {
        self.input_ended.store(input_ended, Ordering::Release);
        self.stop.cancel();
        if let Err(error) = self.task.await {
            tracing::error!(%error, "the window emitter failed");
        }
    }
}

/// When `flow` writes a `window` target: creates its counts table and starts emitting, under
/// the flow's `watermark`.
pub async fn start(
    pipeline: &Pipeline,
    flow: &Flow,
    watermark: &FlowWatermark,
    store: Arc<dyn Store>,
    handle: FlowHandle,
) -> Result<Option<RunningEmitter>, String> {
    let Some(plan) = plan(pipeline, flow, watermark) else {
        return Ok(None);
    };
    store
        .prepare_window_table(&plan.emission.windows_table)
        .await
        .map_err(|e| format!("cannot create {}: {e}", plan.emission.windows_table))?;
    let stop = CancellationToken::new();
    let input_ended = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(emit_until(
        plan,
        store,
        handle,
        stop.clone(),
        input_ended.clone(),
    ));
    Ok(Some(RunningEmitter {
        stop,
        input_ended,
        task,
    }))
}

async fn emit_until(
    plan: WindowPlan,
    store: Arc<dyn Store>,
    flow: FlowHandle,
    stop: CancellationToken,
    input_ended: Arc<AtomicBool>,
) {
    let mut ticks = tokio::time::interval(EMIT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut emitted_before = i64::MIN;
    let mut failing = false;
    loop {
        let stopping = tokio::select! {
            _ = ticks.tick() => false,
            _ = stop.cancelled() => true,
        };
        let due = if stopping && input_ended.load(Ordering::Acquire) {
            Some(i64::MAX)
        } else {
            plan.watermark
                .current()
                .map(|w| w.saturating_sub(plan.lateness_ms))
        };
        if let Some(before_ms) = due
            && before_ms >= emitted_before.saturating_add(plan.emission.size_ms)
        {
            let emission = WindowEmission {
                before_ms,
                ..plan.emission.clone()
            };
            match store.emit_windows(&flow, &emission).await {
                Ok(emitted) => {
                    if emitted.rows > 0 {
                        tracing::info!(flow = %flow.name, rows = emitted.rows,
                            before_ms = emitted.emitted_before_ms, "windows emitted");
                    }
                    if failing {
                        tracing::info!(flow = %flow.name, "emitting windows again");
                    }
                    emitted_before = emitted.emitted_before_ms;
                    failing = false;
                }
                Err(error) if !failing => {
                    tracing::warn!(flow = %flow.name, %error,
                        "cannot emit windows; retrying every second");
                    failing = true;
                }
                Err(_) => {}
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pipeline crate's check of a window target's name (`NOT_BUILT` when its counts
    /// table would not be an identifier) agrees with the store's naming, at the edge.
    #[test]
    fn the_window_name_check_agrees_with_the_stores_counts_table() {
        for len in [39, 40] {
            let target = "w".repeat(len);
            let yaml = format!(
                "pipeline: p\nstore: sqlite://s.db\n\
                 targets:\n  - name: {target}\n    kind: window\n    window: {{ size: 1m, group_by: \"attribute:r\" }}\n\
                 flows:\n  - name: f\n    target: {target}\n    source: {{ pubsub: {{ subscription: s, watermark: {{ tracking_subscription: auto }} }} }}\n"
            );
            let runs =
                sluice_pipeline::parse_for_run(&yaml, std::path::Path::new("p.yaml")).is_ok();
            let named = window_table_name("p", &target).is_ok();
            assert_eq!(
                runs, named,
                "target of {len} bytes: run {runs}, counts table {named}"
            );
            assert_eq!(runs, len == 39);
        }
    }

    fn record(watermark_ms: i64) -> WatermarkRecord {
        WatermarkRecord {
            watermark_ms,
            horizon_ms: watermark_ms,
            updated_at_ms: 0,
        }
    }

    #[test]
    fn a_tables_watermark_is_its_slowest_live_writers() {
        let writers = ["a".to_owned(), "b".to_owned()];
        let records = [
            ("a".to_owned(), record(5_000)),
            ("b".to_owned(), record(3_000)),
            ("c".to_owned(), record(1_000)),
        ];
        assert_eq!(table_watermark(&writers, &records), Some(3_000));
        assert_eq!(
            table_watermark(&writers, &records[..1]),
            None,
            "b has no watermark yet"
        );
        assert_eq!(table_watermark(&[], &records), Some(i64::MAX));
    }

    #[test]
    fn groups_by_an_attribute_or_a_column() {
        assert_eq!(
            TargetKind::group_attribute("attribute:region"),
            Some("region")
        );
        assert_eq!(
            TargetKind::group_attribute("attribute: geo.region "),
            Some("geo.region")
        );
        assert_eq!(TargetKind::group_attribute("attribute:"), None);
        assert_eq!(TargetKind::group_attribute("region"), None);
        assert_eq!(TargetKind::group_column("column: region"), Some("region"));
        assert_eq!(TargetKind::group_column("region"), None);
    }
}
