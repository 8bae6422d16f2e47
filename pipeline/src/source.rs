//! `flows[i]` and its `source:` (Pub/Sub, file, table) → [`Flow`], with every default of
//! `source.pubsub` and `source.file` applied and each value checked on its own.

use crate::defaults::{
    BATCH_MAX_DELAY, BATCH_MAX_MESSAGES, DEDUP_WINDOW, DRAIN_IDLE, FILE_MAX_RECORD_BYTES,
    FILE_MAX_RECORD_BYTES_CEILING, MAX_ATTEMPTS, MAX_OUTSTANDING_BYTES, MAX_OUTSTANDING_MESSAGES,
    MAX_STREAMS, STREAMS, WATERMARK_BAND,
};
use crate::errors::{Collector, ErrorCode};
use crate::fields::{count, duration, non_empty, positive_duration, required, size};
use crate::model::{
    BatchSettings, DedupBy, DedupSettings, EventTimeSettings, Flow, FlowControl, OnBadTimestamp,
    OnMissingKey, Poison, PubSubSource, Source, Target, TrackingSubscription, WatermarkSettings,
};
use crate::paths;
use crate::query::RawQuery;
use crate::raw::{
    OneOrMany, RawDedup, RawDedupBy, RawEventTime, RawFlow, RawOnBadTimestamp, RawOnMissing,
    RawPoison, RawPubSub, RawSource, RawWatermark,
};

/// Converts `flows[i]`; `path` is `flows[i]`.
pub(crate) fn flow(c: &mut Collector<'_>, raw: RawFlow, path: &str, targets: &[Target]) -> Flow {
    let name = required(c, raw.name, &format!("{path}.name"));
    let target = required(c, raw.target, &format!("{path}.target"));
    let depends_on = match raw.depends_on {
        None => Vec::new(),
        Some(OneOrMany::One(name)) => vec![name],
        Some(OneOrMany::Many(names)) => names,
    };
    let source = match raw.source {
        Some(s) => source(c, s, &format!("{path}.source")),
        None => {
            c.push(
                ErrorCode::MissingField,
                &format!("{path}.source"),
                "`source` is required: { pubsub: {...} }, { file: { path } } or { table: NAME } \
                 (PIPELINE.NAME for another pipeline's)",
            );
            Source::Table {
                target: String::new(),
            }
        }
    };
    // A table source's expressions read the upstream table's columns.
    let upstream = match &source {
        Source::Table { target } => targets.iter().find(|t| t.name == *target),
        _ => None,
    };
    let target_of_query = targets
        .iter()
        .position(|t| t.name == target)
        .filter(|i| !c.any_under(&format!("targets[{i}].columns")))
        .map(|i| &targets[i]);
    let mut query = crate::query::flow_query(
        c,
        RawQuery {
            decode: raw.decode,
            select: raw.select,
            filter: raw.filter,
            expect: raw.expect,
        },
        path,
        &source,
        upstream,
        // A target whose columns are in error is not compiled against (no second error).
        target_of_query,
    );
    query.changes =
        crate::apply_changes::apply_changes(c, raw.apply_changes, path, &query, target_of_query);
    Flow {
        name,
        target,
        once: raw.once.unwrap_or(false),
        depends_on,
        source,
        query,
    }
}

fn source(c: &mut Collector<'_>, raw: RawSource, path: &str) -> Source {
    let given = [
        raw.pubsub.is_some(),
        raw.file.is_some(),
        raw.table.is_some(),
    ];
    match given.iter().filter(|g| **g).count() {
        0 => c.push(
            ErrorCode::MissingField,
            path,
            "a source needs one of `pubsub`, `file` or `table`",
        ),
        1 => {}
        _ => c.push(
            ErrorCode::InvalidValue,
            path,
            "a source has exactly one of `pubsub`, `file` or `table`",
        ),
    }
    if let Some(pubsub) = raw.pubsub {
        Source::PubSub(pubsub_source(c, pubsub, &format!("{path}.pubsub")))
    } else if let Some(file) = raw.file {
        Source::File {
            path: paths::glob_beside(
                c.file(),
                required(c, file.path, &format!("{path}.file.path")),
            ),
            max_record_bytes: size(
                c,
                file.max_record_bytes,
                &format!("{path}.file.max_record_bytes"),
                FILE_MAX_RECORD_BYTES,
                (1, FILE_MAX_RECORD_BYTES_CEILING),
            ),
        }
    } else {
        let table = raw
            .table
            .map(|t| non_empty(c, t, &format!("{path}.table")))
            .unwrap_or_default();
        match table.split_once('.') {
            Some((pipeline, target)) => Source::PipelineTable {
                pipeline: pipeline.to_owned(),
                target: target.to_owned(),
            },
            None => Source::Table { target: table },
        }
    }
}

fn pubsub_source(c: &mut Collector<'_>, raw: RawPubSub, path: &str) -> PubSubSource {
    let subscription = required(c, raw.subscription, &format!("{path}.subscription"));
    check_subscription(c, &subscription, &format!("{path}.subscription"));
    let flow_control = raw.flow_control.unwrap_or_default();
    let batch = raw.batch.unwrap_or_default();
    PubSubSource {
        dedup: dedup(c, raw.dedup.unwrap_or_default(), &format!("{path}.dedup")),
        event_time: raw
            .event_time
            .map(|e| event_time(c, e, &format!("{path}.event_time"))),
        watermark: raw
            .watermark
            .map(|w| watermark(c, w, &format!("{path}.watermark"))),
        flow_control: FlowControl {
            max_outstanding_messages: count(
                c,
                flow_control.max_outstanding_messages,
                &format!("{path}.flow_control.max_outstanding_messages"),
                MAX_OUTSTANDING_MESSAGES,
                (1, i64::MAX),
            ),
            max_outstanding_bytes: size(
                c,
                flow_control.max_outstanding_bytes,
                &format!("{path}.flow_control.max_outstanding_bytes"),
                MAX_OUTSTANDING_BYTES,
                (1, u64::MAX),
            ),
        },
        batch: BatchSettings {
            max_messages: count(
                c,
                batch.max_messages,
                &format!("{path}.batch.max_messages"),
                BATCH_MAX_MESSAGES,
                (1, i64::MAX),
            ),
            max_delay: duration(
                c,
                batch.max_delay,
                &format!("{path}.batch.max_delay"),
                BATCH_MAX_DELAY,
            ),
        },
        max_attempts: count(
            c,
            raw.max_attempts,
            &format!("{path}.max_attempts"),
            MAX_ATTEMPTS,
            (1, i64::from(u32::MAX)),
        ),
        poison: match raw.poison {
            None | Some(RawPoison::DeadLetter) => Poison::DeadLetter,
            Some(RawPoison::Nack) => Poison::Nack,
        },
        drain_idle: positive_duration(c, raw.drain_idle, &format!("{path}.drain_idle"), DRAIN_IDLE),
        streams: count(
            c,
            raw.streams,
            &format!("{path}.streams"),
            STREAMS,
            (1, MAX_STREAMS),
        ),
        subscription,
    }
}

/// A short name, or the full `projects/P/subscriptions/S`.
fn check_subscription(c: &mut Collector<'_>, name: &str, path: &str) {
    if !name.contains('/') {
        return;
    }
    let parts: Vec<&str> = name.split('/').collect();
    let full = matches!(parts.as_slice(), ["projects", p, "subscriptions", s] if !p.is_empty() && !s.is_empty());
    if !full {
        c.push(
            ErrorCode::InvalidValue,
            path,
            format!("`{name}` is neither a short name nor projects/PROJECT/subscriptions/NAME"),
        );
    }
}

fn dedup(c: &mut Collector<'_>, raw: RawDedup, path: &str) -> DedupSettings {
    let attribute_path = format!("{path}.attribute");
    let by = match raw.by {
        Some(RawDedupBy::Attribute) => {
            if raw.attribute.is_none() {
                c.push(
                    ErrorCode::MissingField,
                    &attribute_path,
                    "`dedup: { by: attribute }` needs `attribute: NAME`",
                );
            }
            DedupBy::Attribute(
                raw.attribute
                    .map(|a| non_empty(c, a, &attribute_path))
                    .unwrap_or_default(),
            )
        }
        None | Some(RawDedupBy::MessageId) => {
            if raw.attribute.is_some() {
                c.push(
                    ErrorCode::InvalidValue,
                    &attribute_path,
                    "`attribute` only applies with `by: attribute`",
                );
            }
            DedupBy::MessageId
        }
    };
    DedupSettings {
        by,
        window: positive_duration(c, raw.window, &format!("{path}.window"), DEDUP_WINDOW),
        on_missing: match raw.on_missing {
            None | Some(RawOnMissing::MessageId) => OnMissingKey::MessageId,
            Some(RawOnMissing::DeadLetter) => OnMissingKey::DeadLetter,
        },
    }
}

fn event_time(c: &mut Collector<'_>, raw: RawEventTime, path: &str) -> EventTimeSettings {
    EventTimeSettings {
        attribute: required(c, raw.attribute, &format!("{path}.attribute")),
        on_bad_timestamp: match raw.on_bad_timestamp {
            None | Some(RawOnBadTimestamp::DeadLetter) => OnBadTimestamp::DeadLetter,
            Some(RawOnBadTimestamp::PublishTime) => OnBadTimestamp::PublishTime,
        },
    }
}

fn watermark(c: &mut Collector<'_>, raw: RawWatermark, path: &str) -> WatermarkSettings {
    let tracking_subscription = match raw.tracking_subscription {
        None => TrackingSubscription::Auto,
        Some(name) if name == "auto" => TrackingSubscription::Auto,
        Some(name) => {
            let at = format!("{path}.tracking_subscription");
            let name = non_empty(c, name, &at);
            check_subscription(c, &name, &at);
            TrackingSubscription::Named(name)
        }
    };
    WatermarkSettings {
        tracking_subscription,
        band: duration(c, raw.band, &format!("{path}.band"), WATERMARK_BAND),
    }
}
