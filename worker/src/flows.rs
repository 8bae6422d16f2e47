//! From a validated pipeline's flow to a runnable [`FlowRun`]: a Pub/Sub flow, or a file
//! backfill (JSONL files by glob), both committing through the same ledger.

use sluice_connector::{
    BatchSettings, Budget, CommitThenAck, Counters, DedupSettings, FileProgress, FileSource,
    FlowRun, KeySource, MessageSource, PubSubConfig, PubSubSource, RetrySettings, RunUntil,
    SkipCommitted, TableStage,
};
use sluice_pipeline::{
    DedupBy, Flow, Mode, OnBadTimestamp, OnMissingKey, Pipeline, Source, TargetKind,
};
use sluice_store::{FlowHandle, Store, table_name};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Settings of a file flow, which has no `pubsub:` section to take them from.
const FILE_BATCH: BatchSettings = BatchSettings {
    max_messages: 1000,
    max_delay: Duration::from_millis(50),
};
const FILE_MAX_OUTSTANDING_MESSAGES: usize = 10_000;
const FILE_MAX_OUTSTANDING_BYTES: u64 = 100 * 1024 * 1024;
const FILE_MAX_ATTEMPTS: u32 = 5;
const FILE_DEDUP_WINDOW: Duration = Duration::from_secs(600);

/// Why a pipeline cannot be run by this version (it is valid, but uses what is not built yet).
pub fn unsupported(pipeline: &Pipeline) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, flow) in pipeline.flows.iter().enumerate() {
        if matches!(flow.source, Source::Table { .. }) {
            problems.push(format!(
                "flows[{i}].source: flow {:?} reads a table; only Pub/Sub and file sources run in this version",
                flow.name
            ));
        }
        let kind = pipeline
            .targets
            .iter()
            .find(|t| t.name == flow.target)
            .map(|t| &t.kind);
        if !matches!(kind, Some(TargetKind::Table)) {
            problems.push(format!(
                "flows[{i}].target: flow {:?} writes a non-table target; only `table` targets run in this version",
                flow.name
            ));
        }
    }
    problems
}

/// The `table` targets of a pipeline.
pub fn table_targets(pipeline: &Pipeline) -> Vec<String> {
    pipeline
        .targets
        .iter()
        .filter(|t| matches!(t.kind, TargetKind::Table))
        .map(|t| t.name.clone())
        .collect()
}

/// The full name of a flow's target table, when it writes a table.
pub fn target_table(pipeline: &Pipeline, flow: &Flow) -> Option<String> {
    let is_table = pipeline
        .targets
        .iter()
        .any(|t| t.name == flow.target && matches!(t.kind, TargetKind::Table));
    is_table
        .then(|| table_name(&pipeline.name, &flow.target).ok())
        .flatten()
}

/// A flow ready to run.
pub struct BuiltFlow {
    /// The run.
    pub run: FlowRun,
    /// Its counters (shared with the run).
    pub counters: Counters,
    /// A file flow's progress: drawn on a terminal, and consulted for a read failure.
    pub file_progress: Option<Arc<FileProgress>>,
}

/// How one flow reads: its source and the settings that go with it.
struct Plan {
    source: Box<dyn MessageSource>,
    dedup: DedupSettings,
    batch: BatchSettings,
    budget: Budget,
    stage: TableStage,
    max_attempts: u32,
    until: RunUntil,
    file_progress: Option<Arc<FileProgress>>,
}

fn pubsub_plan(
    pipeline: &Pipeline,
    flow: &Flow,
    settings: &sluice_pipeline::PubSubSource,
) -> Result<Plan, String> {
    let config = PubSubConfig {
        project: pipeline.pubsub.project.clone(),
        endpoint: pipeline.pubsub.endpoint.clone(),
    };
    let source = PubSubSource::new(config, &settings.subscription, settings.streams)
        .map_err(|e| e.to_string())?;
    let key = match &settings.dedup.by {
        DedupBy::MessageId => KeySource::MessageId,
        DedupBy::Attribute(name) => KeySource::Attribute {
            name: name.clone(),
            dead_letter_if_missing: settings.dedup.on_missing == OnMissingKey::DeadLetter,
        },
    };
    let stage = TableStage {
        event_time_attribute: settings.event_time.as_ref().map(|e| e.attribute.clone()),
        bad_timestamp_uses_publish_time: settings
            .event_time
            .as_ref()
            .is_some_and(|e| e.on_bad_timestamp == OnBadTimestamp::PublishTime),
    };
    let until = if pipeline.mode == Mode::Triggered || flow.once {
        RunUntil::Idle(settings.drain_idle)
    } else {
        RunUntil::Drained
    };
    Ok(Plan {
        source: Box::new(source),
        dedup: DedupSettings {
            key,
            window: settings.dedup.window,
        },
        batch: BatchSettings {
            max_messages: settings.batch.max_messages,
            max_delay: settings.batch.max_delay,
        },
        budget: Budget::new(
            settings.flow_control.max_outstanding_messages,
            settings.flow_control.max_outstanding_bytes,
        ),
        stage,
        max_attempts: settings.max_attempts,
        until,
        file_progress: None,
    })
}

fn file_plan(pattern: &str, skip: SkipCommitted) -> Plan {
    let source = FileSource::new(pattern).skip_committed(skip);
    let file_progress = Some(source.progress());
    Plan {
        source: Box::new(source),
        dedup: DedupSettings {
            key: KeySource::MessageId,
            window: FILE_DEDUP_WINDOW,
        },
        batch: FILE_BATCH,
        budget: Budget::new(FILE_MAX_OUTSTANDING_MESSAGES, FILE_MAX_OUTSTANDING_BYTES),
        stage: TableStage::default(),
        max_attempts: FILE_MAX_ATTEMPTS,
        until: RunUntil::Exhausted,
        file_progress,
    }
}

/// Builds the run of one flow.
pub fn build(
    pipeline: &Pipeline,
    flow: &Flow,
    store: Arc<dyn Store>,
    handle: FlowHandle,
    give_up: CancellationToken,
) -> Result<BuiltFlow, String> {
    let table: Arc<str> = Arc::from(
        table_name(&pipeline.name, &flow.target)
            .map_err(|e| e.to_string())?
            .as_str(),
    );
    let plan = match &flow.source {
        Source::PubSub(settings) => pubsub_plan(pipeline, flow, settings)?,
        Source::File { path } => file_plan(
            path,
            SkipCommitted {
                store: store.clone(),
                flow: handle.clone(),
                table: table.clone(),
            },
        ),
        Source::Table { target } => {
            return Err(format!(
                "flow {:?} reads table {target:?}; table sources do not run in this version",
                flow.name
            ));
        }
    };
    let counters = Counters::new(&pipeline.name, &flow.name);
    let window = plan.dedup.window;
    let run = FlowRun {
        source: plan.source,
        budget: plan.budget,
        dedup: plan.dedup,
        batch: plan.batch,
        committer: CommitThenAck::new(
            store,
            handle,
            table,
            Arc::new(plan.stage),
            RetrySettings {
                max_attempts: plan.max_attempts,
                dedup_window: window,
            },
            give_up,
        ),
        counters: counters.clone(),
        until: plan.until,
    };
    Ok(BuiltFlow {
        run,
        counters,
        file_progress: plan.file_progress,
    })
}
