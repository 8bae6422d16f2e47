//! From a validated pipeline's flow to a runnable [`FlowRun`].

use sluice_connector::{
    BatchSettings, Budget, CommitThenAck, Counters, DedupSettings, FlowRun, KeySource,
    PubSubConfig, PubSubSource, RetrySettings, RunUntil, TableStage,
};
use sluice_pipeline::{
    DedupBy, Flow, Mode, OnBadTimestamp, OnMissingKey, Pipeline, Source, TargetKind,
};
use sluice_store::{FlowHandle, Store, table_name};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Why a pipeline cannot be run by this version (it is valid, but uses what is not built yet).
pub fn unsupported(pipeline: &Pipeline) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, flow) in pipeline.flows.iter().enumerate() {
        if !matches!(flow.source, Source::PubSub(_)) {
            problems.push(format!(
                "flows[{i}].source: flow {:?} reads a file or table; only Pub/Sub sources run in this version",
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

/// Builds the run of one Pub/Sub flow.
pub fn build(
    pipeline: &Pipeline,
    flow: &Flow,
    store: Arc<dyn Store>,
    handle: FlowHandle,
    give_up: CancellationToken,
) -> Result<(FlowRun, Counters), String> {
    let Source::PubSub(settings) = &flow.source else {
        return Err(format!("flow {:?} has no Pub/Sub source", flow.name));
    };
    let config = PubSubConfig {
        project: pipeline.pubsub.project.clone(),
        endpoint: pipeline.pubsub.endpoint.clone(),
    };
    let source = PubSubSource::new(config, &settings.subscription, settings.streams)
        .map_err(|e| e.to_string())?;
    let table = table_name(&pipeline.name, &flow.target).map_err(|e| e.to_string())?;
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
    let counters = Counters::new(&pipeline.name, &flow.name);
    let until = if pipeline.mode == Mode::Triggered || flow.once {
        RunUntil::Idle(settings.drain_idle)
    } else {
        RunUntil::Drained
    };
    let run = FlowRun {
        source: Box::new(source),
        budget: Budget::new(
            settings.flow_control.max_outstanding_messages,
            settings.flow_control.max_outstanding_bytes,
        ),
        dedup: DedupSettings {
            key,
            window: settings.dedup.window,
        },
        batch: BatchSettings {
            max_messages: settings.batch.max_messages,
            max_delay: settings.batch.max_delay,
        },
        committer: CommitThenAck::new(
            store,
            handle,
            Arc::from(table),
            Arc::new(stage),
            RetrySettings {
                max_attempts: settings.max_attempts,
                dedup_window: settings.dedup.window,
            },
            give_up,
        ),
        counters: counters.clone(),
        until,
    };
    Ok((run, counters))
}
