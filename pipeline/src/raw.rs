//! The pipeline file as written: serde shapes that mirror SPEC §4 key for key.
//!
//! Every struct denies unknown keys. Almost every key is optional here, even required ones:
//! absence, ranges and humane values are checked in [`crate::convert`] so that all such
//! problems are reported together with their paths, not just the first one serde meets.
//! Durations and sizes stay text ([`Humane`]) for the same reason.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

/// The whole file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Pipeline")]
pub(crate) struct RawPipeline {
    pub(crate) pipeline: Option<String>,
    pub(crate) mode: Option<RawMode>,
    pub(crate) store: Option<String>,
    pub(crate) pubsub: Option<RawPubSubSettings>,
    pub(crate) metrics: Option<RawMetrics>,
    pub(crate) control: Option<RawControl>,
    pub(crate) dead_letter: Option<RawDeadLetter>,
    pub(crate) schedule: Option<RawSchedule>,
    pub(crate) give_up_after: Option<Humane>,
    pub(crate) targets: Option<Vec<RawTarget>>,
    pub(crate) flows: Option<Vec<RawFlow>>,
}

/// `mode:`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "Mode")]
pub(crate) enum RawMode {
    Continuous,
    Triggered,
}

/// `pubsub:`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "PubSubSettings")]
pub(crate) struct RawPubSubSettings {
    pub(crate) project: Option<String>,
    pub(crate) endpoint: Option<String>,
}

/// `metrics:`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Metrics")]
pub(crate) struct RawMetrics {
    pub(crate) listen: Option<String>,
}

/// `control:`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Control")]
pub(crate) struct RawControl {
    pub(crate) listen: Option<String>,
    pub(crate) token_file: Option<String>,
}

/// `dead_letter:`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "DeadLetter")]
pub(crate) struct RawDeadLetter {
    pub(crate) topic: Option<String>,
}

/// `schedule:`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Schedule")]
pub(crate) struct RawSchedule {
    pub(crate) cron: Option<String>,
    pub(crate) every: Option<Humane>,
    pub(crate) timezone: Option<String>,
    pub(crate) semantics: Option<RawSemantics>,
    pub(crate) catchup: Option<bool>,
    pub(crate) interval: Option<Humane>,
    pub(crate) on_update: Option<RawOnUpdate>,
    pub(crate) min_interval: Option<Humane>,
    pub(crate) start_date: Option<String>,
    pub(crate) end_date: Option<String>,
    pub(crate) retries: Option<u32>,
    pub(crate) retry_delay: Option<Humane>,
    pub(crate) max_active_runs: Option<i64>,
    pub(crate) depends_on_past: Option<bool>,
}

/// `schedule.on_update`: `true`, or a condition over the tables read.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "`true`, or `{ any_of: [PIPELINE.TARGET, ...] }`, or `{ all_of: [...] }`"
)]
#[schemars(rename = "OnUpdate")]
pub(crate) enum RawOnUpdate {
    /// `true`: any table of another pipeline a flow reads.
    Any(bool),
    /// `{ any_of: [...] }` or `{ all_of: [...] }`.
    Condition(RawUpdateCondition),
}

/// `schedule.on_update` as a condition: exactly one of the two lists.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "UpdateCondition")]
pub(crate) struct RawUpdateCondition {
    pub(crate) any_of: Option<Vec<String>>,
    pub(crate) all_of: Option<Vec<String>>,
}

/// `schedule.semantics`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "Semantics")]
pub(crate) enum RawSemantics {
    Trigger,
    DataInterval,
}

/// One entry of `targets:`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Target")]
pub(crate) struct RawTarget {
    pub(crate) name: Option<String>,
    pub(crate) kind: Option<RawKind>,
    pub(crate) sink: Option<RawSink>,
    pub(crate) window: Option<RawWindow>,
    pub(crate) foreach_batch: Option<RawForeachBatch>,
    pub(crate) columns: Option<Vec<RawColumn>>,
    /// `keys:` of a table of the latest change per key (`apply_changes.rs`).
    pub(crate) keys: Option<Vec<String>>,
    /// Set by `derived_columns.rs` when `columns` came from a Pub/Sub schema; never read from
    /// the file.
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) columns_follow_schema: bool,
}

/// One entry of `targets[i].columns`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Column")]
pub(crate) struct RawColumn {
    pub(crate) name: Option<String>,
    #[serde(rename = "type")]
    #[schemars(extend("enum" = ["text", "integer", "double", "numeric", "boolean", "timestamp", "date", "json", "bytes"]))]
    pub(crate) ty: Option<String>,
    pub(crate) nullable: Option<bool>,
}

/// `targets[i].kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "Kind")]
pub(crate) enum RawKind {
    Table,
    View,
    Sink,
    Window,
    ForeachBatch,
}

/// `targets[i].sink`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Sink")]
pub(crate) struct RawSink {
    #[schemars(extend("enum" = ["jsonl"]))]
    pub(crate) format: Option<String>,
    pub(crate) path: Option<String>,
}

/// `targets[i].window`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Window")]
pub(crate) struct RawWindow {
    pub(crate) size: Option<Humane>,
    pub(crate) group_by: Option<String>,
    pub(crate) allowed_lateness: Option<Humane>,
    pub(crate) aggregates: Option<std::collections::BTreeMap<String, String>>,
}

/// `targets[i].foreach_batch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ForeachBatch")]
pub(crate) struct RawForeachBatch {
    pub(crate) endpoint: Option<String>,
}

/// One entry of `flows:`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Flow")]
pub(crate) struct RawFlow {
    pub(crate) name: Option<String>,
    pub(crate) target: Option<String>,
    pub(crate) once: Option<bool>,
    pub(crate) depends_on: Option<OneOrMany>,
    pub(crate) source: Option<RawSource>,
    pub(crate) decode: Option<RawDecode>,
    pub(crate) select: Option<BTreeMap<String, String>>,
    #[serde(rename = "where")]
    pub(crate) filter: Option<String>,
    pub(crate) expect: Option<Vec<RawExpectation>>,
    pub(crate) apply_changes: Option<RawApplyChanges>,
}

/// `flows[i].apply_changes` (`apply_changes.rs`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ApplyChanges")]
pub(crate) struct RawApplyChanges {
    pub(crate) sequence_by: Option<String>,
    pub(crate) apply_as_deletes: Option<String>,
    pub(crate) ignore_null_updates: Option<bool>,
    #[schemars(extend("enum" = [1]))]
    pub(crate) stored_as_scd_type: Option<u8>,
}

/// `flows[i].decode`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Decode")]
pub(crate) struct RawDecode {
    #[schemars(extend("enum" = ["json", "avro", "protobuf"]))]
    pub(crate) format: Option<String>,
    pub(crate) schema: Option<String>,
    pub(crate) message: Option<String>,
    pub(crate) fields: Option<BTreeMap<String, String>>,
}

/// One entry of `flows[i].expect`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Expectation")]
pub(crate) struct RawExpectation {
    pub(crate) name: Option<String>,
    pub(crate) check: Option<String>,
    #[schemars(extend("enum" = ["warn", "drop", "fail"]))]
    pub(crate) on_violation: Option<String>,
}

/// `flows[i].source`: exactly one of the three keys (checked later).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Source")]
pub(crate) struct RawSource {
    pub(crate) pubsub: Option<RawPubSub>,
    pub(crate) file: Option<RawFile>,
    pub(crate) table: Option<String>,
}

/// `source.file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "File")]
pub(crate) struct RawFile {
    pub(crate) path: Option<String>,
    pub(crate) max_record_bytes: Option<Humane>,
}

/// `source.pubsub`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "PubSub")]
pub(crate) struct RawPubSub {
    pub(crate) subscription: Option<String>,
    pub(crate) dedup: Option<RawDedup>,
    pub(crate) event_time: Option<RawEventTime>,
    pub(crate) watermark: Option<RawWatermark>,
    pub(crate) flow_control: Option<RawFlowControl>,
    pub(crate) batch: Option<RawBatch>,
    pub(crate) max_attempts: Option<i64>,
    pub(crate) poison: Option<RawPoison>,
    pub(crate) drain_idle: Option<Humane>,
    pub(crate) streams: Option<i64>,
}

/// `source.pubsub.poison`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "Poison")]
pub(crate) enum RawPoison {
    DeadLetter,
    Nack,
}

/// `source.pubsub.dedup`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Dedup")]
pub(crate) struct RawDedup {
    pub(crate) by: Option<RawDedupBy>,
    pub(crate) attribute: Option<String>,
    pub(crate) window: Option<Humane>,
    pub(crate) on_missing: Option<RawOnMissing>,
}

/// `dedup.by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "DedupBy")]
pub(crate) enum RawDedupBy {
    MessageId,
    Attribute,
}

/// `dedup.on_missing`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OnMissing")]
pub(crate) enum RawOnMissing {
    MessageId,
    DeadLetter,
}

/// `source.pubsub.event_time`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "EventTime")]
pub(crate) struct RawEventTime {
    pub(crate) attribute: Option<String>,
    pub(crate) on_bad_timestamp: Option<RawOnBadTimestamp>,
}

/// `event_time.on_bad_timestamp`.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "OnBadTimestamp")]
pub(crate) enum RawOnBadTimestamp {
    DeadLetter,
    PublishTime,
}

/// `source.pubsub.watermark`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Watermark")]
pub(crate) struct RawWatermark {
    pub(crate) tracking_subscription: Option<String>,
    pub(crate) band: Option<Humane>,
}

/// `source.pubsub.flow_control`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "FlowControl")]
pub(crate) struct RawFlowControl {
    pub(crate) max_outstanding_messages: Option<i64>,
    pub(crate) max_outstanding_bytes: Option<Humane>,
}

/// `source.pubsub.batch`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Batch")]
pub(crate) struct RawBatch {
    pub(crate) max_messages: Option<i64>,
    pub(crate) max_delay: Option<Humane>,
}

/// `depends_on:` — one name or a list of names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl JsonSchema for OneOrMany {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "OneOrMany".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "One flow name, or a list of names.",
            "anyOf": [
                { "type": "string" },
                { "type": "array", "items": { "type": "string" } }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OneOrManyVisitor;

        impl<'de> Visitor<'de> for OneOrManyVisitor {
            type Value = OneOrMany;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a flow name or a list of flow names")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany::One(v.to_owned()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OneOrMany, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(OneOrMany::Many(names))
            }
        }

        deserializer.deserialize_any(OneOrManyVisitor)
    }
}

/// A humane duration or size, kept as text until [`crate::humane`] parses it. Accepts a string
/// or a plain number (`max_outstanding_bytes: 1048576`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Humane(pub(crate) String);

impl JsonSchema for Humane {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Humane".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration (`50ms`, `5s`, `10m`, `1h`) or a size (`100MiB`), or a plain number.",
            "type": ["string", "number"]
        })
    }
}

impl<'de> Deserialize<'de> for Humane {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HumaneVisitor;

        impl Visitor<'_> for HumaneVisitor {
            type Value = Humane;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a humane duration or size such as `5s` or `100MiB`")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Humane, E> {
                Ok(Humane(v.to_owned()))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Humane, E> {
                Ok(Humane(v.to_string()))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Humane, E> {
                Ok(Humane(v.to_string()))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Humane, E> {
                Ok(Humane(v.to_string()))
            }
        }

        deserializer.deserialize_any(HumaneVisitor)
    }
}
