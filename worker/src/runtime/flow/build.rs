//! From a validated pipeline's flow to a runnable [`FlowRun`]: a Pub/Sub flow, a file backfill
//! (JSONL files by glob) or a read of another target's table, all committing through the same
//! ledger.

use crate::runtime::flow::run_context::RunContext;
use sluice_engine::defaults;
use sluice_engine::pubsub::FlowIntent;
use sluice_engine::{
    AckFence, BatchSettings, Budget, CommitThenAck, Counters, DEFAULT_POLL, DedupSettings,
    Expectations, FileSource, FileTurn, FlowRun, FlowWatermark, JsonlSink, KeySource,
    MessageSource, PubSubConfig, PubSubFlow, PublishedBefore, ReaderTurn, RetrySettings, RunUntil,
    SkipCommitted, SourceProgress, Stage, TableSource, TableStage, TableWatermark,
};
use sluice_pipeline::{
    DedupBy, Flow, Mode, OnBadTimestamp, OnMissingKey, Pipeline, Poison, Source, TargetKind,
};
use sluice_store::{FlowHandle, Store, table_name};
use std::sync::Arc;
use std::time::Duration;

/// Settings of a file or table flow, which has no `pubsub:` section to take them from: the
/// defaults of every flow (the library's too, `sluice_engine::defaults`).
const FILE_BATCH: BatchSettings = BatchSettings {
    max_messages: defaults::BATCH_MAX_MESSAGES,
    max_delay: defaults::BATCH_MAX_DELAY,
};

/// A flow ready to run.
pub struct BuiltFlow {
    /// The run.
    pub run: FlowRun,
    /// Its counters (shared with the run).
    pub counters: Counters,
    /// A bounded flow's progress (files, tables): consulted for a read failure.
    pub progress: Option<Arc<SourceProgress>>,
    /// Whether a progress bar is worth drawing (file flows: their size is known).
    pub draw_progress: bool,
    /// A sink flow's file writer: its crash leftovers are resolved before the run.
    pub sink: Option<Arc<JsonlSink>>,
}

/// How one flow reads: its source and the settings that go with it.
struct Plan {
    source: Box<dyn MessageSource>,
    dedup: DedupSettings,
    batch: BatchSettings,
    budget: Budget,
    stage: TableStage,
    max_attempts: u32,
    /// What a delivery may wait for its commit; `None` where a nack would drop the record.
    commit_bound: Option<Duration>,
    until: RunUntil,
    progress: Option<Arc<SourceProgress>>,
    draw_progress: bool,
}

fn pubsub_plan(
    pipeline: &Pipeline,
    flow: &Flow,
    settings: &sluice_pipeline::PubSubSource,
    acks: Option<&Arc<dyn AckFence>>,
) -> Result<Plan, String> {
    // The same assembly a library job uses (`sluice_engine::PubSubFlow`), every setting from
    // the file.
    let key = match &settings.dedup.by {
        DedupBy::MessageId => KeySource::MessageId,
        DedupBy::Attribute(name) => KeySource::Attribute {
            name: name.clone(),
            dead_letter_if_missing: settings.dedup.on_missing == OnMissingKey::DeadLetter,
        },
    };
    let mut flow_settings = PubSubFlow::new(&settings.subscription);
    flow_settings.pubsub = PubSubConfig {
        project: pipeline.pubsub.project.clone(),
        endpoint: pipeline.pubsub.endpoint.clone(),
    };
    flow_settings.streams = settings.streams;
    flow_settings.dedup = DedupSettings {
        key,
        window: settings.dedup.window,
    };
    flow_settings.batch = BatchSettings {
        max_messages: settings.batch.max_messages.max(1),
        max_delay: settings.batch.max_delay,
    };
    flow_settings.max_outstanding = (
        settings.flow_control.max_outstanding_messages.max(1),
        settings.flow_control.max_outstanding_bytes.max(1),
    );
    flow_settings.max_attempts = settings.max_attempts.max(1);
    if let Some(event_time) = &settings.event_time {
        flow_settings.event_time_attribute = Some(event_time.attribute.clone());
        flow_settings.bad_timestamp_uses_publish_time =
            event_time.on_bad_timestamp == OnBadTimestamp::PublishTime;
    }
    flow_settings.intent = FlowIntent {
        dedup_by_message_id: settings.dedup.by == DedupBy::MessageId,
        poison_nack: settings.poison == Poison::Nack,
    };
    let parts = flow_settings.parts().map_err(|e| e.to_string())?;
    let until = if pipeline.mode == Mode::Triggered || flow.once {
        RunUntil::Idle(settings.drain_idle)
    } else {
        RunUntil::Drained
    };
    let mut source = parts
        .source
        .giving_up_after(pipeline.give_up_after)
        .labelled(&pipeline.name, &flow.name);
    if let Some(fence) = acks {
        source = source.with_ack_fence(fence.clone());
    }
    Ok(Plan {
        source: Box::new(source),
        dedup: parts.dedup,
        batch: parts.batch,
        budget: parts.budget,
        stage: parts.stage,
        max_attempts: parts.retry.max_attempts,
        commit_bound: parts.retry.commit_bound,
        until,
        progress: None,
        draw_progress: false,
    })
}

/// A bounded source: its settings are fixed, since it has no `pubsub:` section.
fn bounded_plan(
    source: Box<dyn MessageSource>,
    progress: Arc<SourceProgress>,
    draw_progress: bool,
) -> Plan {
    Plan {
        source,
        dedup: DedupSettings {
            key: KeySource::MessageId,
            window: defaults::DEDUP_WINDOW,
        },
        batch: FILE_BATCH,
        budget: Budget::new(
            defaults::MAX_OUTSTANDING_MESSAGES,
            defaults::MAX_OUTSTANDING_BYTES,
        ),
        stage: TableStage::default(),
        max_attempts: defaults::MAX_ATTEMPTS,
        // A bounded record is found again by re-reading, not redelivered: a nack would lose
        // it for this run.
        commit_bound: None,
        until: RunUntil::Exhausted,
        progress: Some(progress),
        draw_progress,
    }
}

/// The full name of the table a flow reads, when it reads one: a target of its own pipeline
/// or of another in the same store.
pub fn read_table(pipeline: &Pipeline, flow: &Flow) -> Option<String> {
    match &flow.source {
        Source::Table { target } => table_name(&pipeline.name, target).ok(),
        Source::PipelineTable {
            pipeline: other,
            target,
        } => table_name(other, target).ok(),
        Source::PubSub(_) | Source::File { .. } => None,
    }
}

/// A flow reading a table: it follows the table in a continuous pipeline (unless `once`) and
/// catches up with it otherwise; one replica at a time reads it (this worker, `worker`, when it
/// holds the flow's turn); a table of this pipeline with live writers hands their watermark
/// down (`read`: its target name; `None` for another pipeline's table, which hands none).
fn table_source(
    pipeline: &Pipeline,
    flow: &Flow,
    read: Option<&str>,
    store: &Arc<dyn Store>,
    handle: &FlowHandle,
    worker: &str,
    counters: &Counters,
) -> Result<TableSource, String> {
    let table =
        read_table(pipeline, flow).ok_or_else(|| format!("flow {} reads no table", flow.name))?;
    let mut source = TableSource::new(store.clone(), handle.clone(), table.as_str())
        .in_pool(ReaderTurn {
            pool: store.clone(),
            holder: worker.to_owned(),
        })
        .with_counters(counters.clone())
        .giving_up_after(pipeline.give_up_after);
    if follows(pipeline, flow) {
        source = source.follow(DEFAULT_POLL);
    }
    let Some(read) = read else {
        return Ok(source);
    };
    let writers: Vec<String> = pipeline
        .live_writers(read)
        .into_iter()
        .map(|w| w.name.clone())
        .collect();
    // A table that a file flow writes without end has no watermark to hand down.
    if pipeline.mode == Mode::Continuous
        && !writers.is_empty()
        && pipeline.unbounded_file_writers(read).is_empty()
    {
        let watermark = FlowWatermark::new();
        counters.attach_feed_watermark(watermark.clone());
        source = source.with_watermark(TableWatermark {
            store: store.clone(),
            writers,
            watermark,
        });
    }
    Ok(source)
}

/// Whether a flow reading a table follows it as it grows (a live flow of a continuous
/// pipeline) rather than catching up with it and ending.
pub fn follows(pipeline: &Pipeline, flow: &Flow) -> bool {
    matches!(
        flow.source,
        Source::Table { .. } | Source::PipelineTable { .. }
    ) && pipeline.mode == Mode::Continuous
        && !flow.once
}

/// Builds the run of one flow of `ctx`'s run (a file flow keeps to the run's data interval, a
/// Pub/Sub flow reads a kept source), writing to `sink` when its target is a `sink`.
pub fn build(
    ctx: &RunContext,
    flow: &Flow,
    handle: FlowHandle,
    sink: Option<Arc<JsonlSink>>,
) -> Result<BuiltFlow, String> {
    let pipeline = &ctx.pipeline;
    let store = ctx.store.clone();
    let worker = &ctx.worker;
    let scope = &ctx.scope;
    let table: Arc<str> = Arc::from(
        table_name(&pipeline.name, &flow.target)
            .map_err(|e| e.to_string())?
            .as_str(),
    );
    let skip = SkipCommitted {
        store: store.clone(),
        flow: handle.clone(),
        table: table.clone(),
    };
    let counters = Counters::new(&pipeline.name, &flow.name);
    let mut plan = match &flow.source {
        Source::PubSub(settings) => {
            let mut plan = pubsub_plan(pipeline, flow, settings, scope.acks.as_ref())?;
            let kept = scope.kept.as_ref().and_then(|k| k.get(&flow.name));
            if let Some(kept) = kept {
                plan.source = kept.for_run(plan.source);
            }
            // A scheduled run (one with kept sources) with a data interval reads what was
            // published before its end. A `sluice backfill` run drains as before: it cannot
            // read a past interval again, and would hand the same live messages back (a
            // delivery attempt each) at every interval of its range.
            if let (Some(interval), Some(_)) = (scope.interval, scope.kept.as_ref()) {
                plan.source = Box::new(PublishedBefore::new(
                    plan.source,
                    interval.end_ms,
                    kept.cloned(),
                    &pipeline.name,
                    &flow.name,
                ));
            }
            plan
        }
        Source::File {
            path,
            max_record_bytes,
        } => {
            let mut source = FileSource::new(path.clone())
                .max_record_bytes(*max_record_bytes)
                .skip_committed(skip)
                .with_counters(counters.clone())
                .giving_up_after(pipeline.give_up_after);
            if let Some(interval) = scope.interval {
                source = source.within(interval.start_ms, interval.end_ms);
            } else if flow.once {
                // A backfill is read once in a pool: by the turn's holder, from its checkpoint.
                source = source.in_pool(FileTurn {
                    turn: ReaderTurn {
                        pool: store.clone(),
                        holder: worker.to_owned(),
                    },
                    feed: store.clone(),
                    flow: handle.clone(),
                });
            }
            let progress = source.progress();
            bounded_plan(Box::new(source), progress, true)
        }
        Source::Table { .. } | Source::PipelineTable { .. } => {
            let own = match &flow.source {
                Source::Table { target } => Some(target.as_str()),
                _ => None,
            };
            let source = table_source(pipeline, flow, own, &store, &handle, worker, &counters)?
                .skip_committed(skip);
            let progress = source.progress();
            let mut plan = bounded_plan(Box::new(source), progress, false);
            if follows(pipeline, flow) {
                plan.until = RunUntil::Drained;
            }
            plan
        }
    };
    let window = plan.dedup.window;
    let typed = super::typed::typed_flow(pipeline, flow)?;
    if let Some(typed) = &typed {
        plan.stage.fields = Some(typed.fields.clone());
    }
    let target = pipeline.targets.iter().find(|t| t.name == flow.target);
    let stage: Arc<dyn Stage> = match target.map(|t| &t.kind) {
        Some(TargetKind::ForeachBatch { endpoint }) => {
            Arc::new(crate::runtime::flow::stage_client::grpc_stage(
                &pipeline.name,
                &flow.name,
                endpoint,
                plan.stage,
                ctx.scope.interval,
            )?)
        }
        _ => Arc::new(plan.stage),
    };
    let mut committer = CommitThenAck::new(
        store,
        handle,
        table,
        stage,
        RetrySettings {
            max_attempts: plan.max_attempts,
            dedup_window: window,
            commit_bound: plan.commit_bound,
            give_up_after: pipeline.give_up_after,
        },
        ctx.shutdown.give_up.clone(),
    );
    if let Some(sink) = &sink {
        committer = committer.with_sink(sink.clone());
    }
    if let Some(typed) = typed {
        committer = committer.with_typed_cell(typed.query);
        if !typed.expectations.is_empty() {
            committer = committer.with_expectations(Expectations::new(
                &pipeline.name,
                &flow.name,
                typed.expectations,
            ));
        }
    }
    if pipeline.dead_letter_topic.is_some() {
        committer = committer.publish_dead_letters();
    }
    if let Source::PubSub(settings) = &flow.source
        && settings.poison == Poison::Nack
    {
        committer = committer.hand_poison_back();
    }
    let run = FlowRun {
        source: plan.source,
        budget: plan.budget,
        dedup: plan.dedup,
        batch: plan.batch,
        committer,
        counters: counters.clone(),
        until: plan.until,
        drain_agreement: None,
    };
    Ok(BuiltFlow {
        run,
        counters,
        progress: plan.progress,
        draw_progress: plan.draw_progress,
        sink,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;

    /// A library job's defaults are those a pipeline file gives a Pub/Sub flow: the worker
    /// builds its Pub/Sub flows on the same front door.
    #[test]
    fn every_flows_defaults_are_the_files() {
        use sluice_engine::defaults as engine;
        use sluice_pipeline::defaults as file;
        assert_eq!(engine::DEDUP_WINDOW, file::DEDUP_WINDOW);
        assert_eq!(engine::BATCH_MAX_MESSAGES, file::BATCH_MAX_MESSAGES);
        assert_eq!(engine::BATCH_MAX_DELAY, file::BATCH_MAX_DELAY);
        assert_eq!(
            engine::MAX_OUTSTANDING_MESSAGES,
            file::MAX_OUTSTANDING_MESSAGES
        );
        assert_eq!(engine::MAX_OUTSTANDING_BYTES, file::MAX_OUTSTANDING_BYTES);
        assert_eq!(engine::MAX_ATTEMPTS, file::MAX_ATTEMPTS);
        assert_eq!(engine::STREAMS, file::STREAMS);
        assert_eq!(
            engine::DRAIN_DEADLINE,
            crate::runtime::kit::signals::DRAIN_DEADLINE
        );
    }

    #[test]
    fn spec_examples_window_over_a_table_runs() {
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipeline/tests/data/orders.yaml");
        let pipeline = sluice_pipeline::load_for_run(&example).unwrap();
        let counts = pipeline
            .flows
            .iter()
            .find(|f| f.name == "per_minute_counts")
            .unwrap();
        assert!(crate::runtime::flow::windows::table_plan(&pipeline, counts).is_some());
    }
}
