//! The validated pipeline model: plain types, every default applied, every name checked.
//!
//! Everything else in sluice reads a pipeline through these types; none of them can be built
//! from a file without passing validation (see [`crate::load`]).

use crate::aggregate::Aggregate;
pub use crate::columns::{Column, ColumnType, RESERVED_PREFIX};
pub use crate::expression::Expression;
pub use crate::schedule::{Schedule, ScheduleSemantics, ScheduleWhen, UpdateCondition};
use std::path::PathBuf;
use std::time::Duration;

/// A whole pipeline file after parsing, defaults and validation.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// `pipeline:` — a validated identifier (`[a-z_][a-z0-9_]*`, at most 48 bytes); scopes all
    /// state in the store and prefixes every table name.
    pub name: String,
    /// `mode:` — default [`Mode::Continuous`].
    pub mode: Mode,
    /// `store:` — default `sqlite://state/<pipeline>.db`; a relative SQLite path is beside the
    /// pipeline file (`crate::paths`).
    pub store: String,
    /// `pubsub:` — project and endpoint.
    pub pubsub: PubSubSettings,
    /// `metrics.listen` — `None` when the section is absent.
    pub metrics_listen: Option<String>,
    /// `control.listen` — `None` when the section is absent.
    pub control_listen: Option<String>,
    /// `control.token_file` — the control API's bearer token: required off loopback; on
    /// loopback, what enables the calls that act (`StartUpdate`, `ResetFlow`, `Drain`).
    pub control_token_file: Option<PathBuf>,
    /// `dead_letter.topic` — short name or `projects/P/topics/T`: every dead letter is also
    /// published there, once committed (`None`: the dead-letter table only).
    pub dead_letter_topic: Option<String>,
    /// `schedule:` — triggered mode only (an `INVALID_SCHEDULE` error in continuous mode).
    pub schedule: Option<Schedule>,
    /// `give_up_after` — triggered mode only: how long a run waits for an unreachable store
    /// or Pub/Sub, each time it waits, before it fails (default [`crate::defaults::GIVE_UP_AFTER`]).
    /// `None` in continuous mode, which waits as long as it takes (an error if given).
    pub give_up_after: Option<std::time::Duration>,
    /// `targets:` in file order.
    pub targets: Vec<Target>,
    /// `flows:` in file order, but for the flows writing a `view`: those define
    /// [`Pipeline::views`] and do not run.
    pub flows: Vec<Flow>,
    /// The `view` targets, each defined by the flow that writes it (`crate::views`).
    pub views: Vec<View>,
}

impl Pipeline {
    /// The flows that write `table` from files without `once` in a continuous pipeline: their
    /// rows have no watermark, so neither has the table, nor any table fed from it.
    pub fn unbounded_file_writers(&self, table: &str) -> Vec<&Flow> {
        self.flows
            .iter()
            .filter(|w| {
                w.target == table
                    && !w.once
                    && self.mode == Mode::Continuous
                    && matches!(w.source, Source::File { .. })
            })
            .collect()
    }

    /// The flows that write `table` without end: live flows (not `once`) reading Pub/Sub or
    /// another table, whose watermarks bound the table's (they close the windows of a window
    /// over it, and travel on to the flows that read it).
    pub fn live_writers(&self, table: &str) -> Vec<&Flow> {
        self.flows
            .iter()
            .filter(|w| {
                w.target == table
                    && !w.once
                    && matches!(w.source, Source::PubSub(_) | Source::Table { .. })
            })
            .collect()
    }
}

/// How a pipeline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Runs until SIGTERM/SIGINT, then drains.
    #[default]
    Continuous,
    /// Runs one update to completion (each flow drains until idle), then exits.
    Triggered,
}

/// The `pubsub:` section.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PubSubSettings {
    /// `pubsub.project` — `None`: taken from the environment (`PUBSUB_PROJECT_ID`,
    /// `GOOGLE_CLOUD_PROJECT`) when subscriptions are given as short names.
    pub project: Option<String>,
    /// `pubsub.endpoint` — e.g. `http://127.0.0.1:8085`; `None`: `PUBSUB_EMULATOR_HOST` if set,
    /// else the real service.
    pub endpoint: Option<String>,
}

/// One entry of `targets:`.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Validated identifier, unique among targets.
    pub name: String,
    /// What the target is.
    pub kind: TargetKind,
    /// A `table` target's typed columns (`columns:`); empty: sluice's envelope table.
    pub columns: Vec<Column>,
    /// Its columns were derived from its writer's Pub/Sub schema (`schema: pubsub` without
    /// `columns:`): a revision that adds a field while the flow runs adds a nullable column.
    pub columns_follow_schema: bool,
    /// `keys:`: a typed table of the latest change per key, written by update flows; empty for
    /// an append table.
    pub keys: Vec<String>,
}

/// The kinds of target of SPEC §4. Only `Table` is written by the ingestion core; the others are
/// parsed and validated so that files using them are accepted, and are built by later work.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetKind {
    /// A SQL table `<pipeline>__<target>` in the store.
    Table,
    /// A view (no storage of its own).
    View,
    /// A sink: `sink: { format: jsonl, path: ... }`.
    Sink {
        /// Output format; only `jsonl` exists.
        format: String,
        /// Output path.
        path: PathBuf,
    },
    /// Event-time tumbling window counts.
    Window {
        /// Window size.
        size: Duration,
        /// e.g. `attribute:region`.
        group_by: String,
        /// Default zero.
        allowed_lateness: Duration,
        /// `aggregates:`, columns of the counts table beside `count` (windows over a typed
        /// table).
        aggregates: Vec<Aggregate>,
    },
    /// Each micro-batch goes to a Stage service.
    ForeachBatch {
        /// `foreach_batch.endpoint`.
        endpoint: String,
    },
}

impl TargetKind {
    /// The `kind:` word of the file: `table`, `view`, `sink`, `window` or `foreach_batch`.
    pub fn keyword(&self) -> &'static str {
        match self {
            Self::Table => "table",
            Self::View => "view",
            Self::Sink { .. } => "sink",
            Self::Window { .. } => "window",
            Self::ForeachBatch { .. } => "foreach_batch",
        }
    }

    /// The column a window's `group_by` names (`column:NAME`), if it is of that form.
    pub fn group_column(group_by: &str) -> Option<&str> {
        group_by
            .strip_prefix("column:")
            .map(str::trim)
            .filter(|name| !name.is_empty())
    }

    /// The attribute a window's `group_by` names (`attribute:NAME`), if it is of that form.
    pub fn group_attribute(group_by: &str) -> Option<&str> {
        group_by
            .strip_prefix("attribute:")
            .map(str::trim)
            .filter(|name| !name.is_empty())
    }
}

/// One entry of `flows:`.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    /// Validated identifier, unique among flows.
    pub name: String,
    /// Name of a declared target.
    pub target: String,
    /// `once: true` — runs to a terminal state (default false).
    pub once: bool,
    /// `depends_on:` — one name or a list in the file; always a list here (possibly empty).
    pub depends_on: Vec<String>,
    /// Where the flow reads.
    pub source: Source,
    /// What it does with each record on the way to its target.
    pub query: FlowQuery,
}

/// A flow as a query over its source: `decode:`, `select:`, `where:`, `expect:` (compiled; see
/// `query.rs`). Empty for a flow that lands sluice's envelope.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlowQuery {
    /// How the payload is decoded into fields.
    pub decode: Option<Decode>,
    /// The decoded fields the expressions read (beside the envelope), in the order a decoder
    /// gives their values: the decode's `fields:`, a typed table source's columns, or else the
    /// target's columns.
    pub fields: Vec<Column>,
    /// Every column of the typed target, with its expression: `select:`'s, or the decoded field
    /// of the column's name, or NULL.
    pub select: Vec<Selected>,
    /// `where:`: records for which it is not true are filtered out (counted, acked, no row).
    pub filter: Option<Expression>,
    /// `expect:`.
    pub expectations: Vec<Expectation>,
    /// `apply_changes:`: the flow applies changes to its keyed target (an update flow).
    pub changes: Option<crate::ApplyChanges>,
}

impl FlowQuery {
    /// Whether the flow lands typed rows.
    pub fn is_typed(&self) -> bool {
        !self.select.is_empty()
    }
}

/// `decode:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decode {
    /// The payload's format.
    pub format: DecodeFormat,
    /// `schema:`, for Avro and Protobuf.
    pub schema: Option<DecodeSchema>,
    /// `message:`, a Protobuf message name.
    pub message: Option<String>,
    /// JSON's declared fields (`fields:`); empty: the target's columns, read by name.
    pub fields: Vec<Column>,
}

/// `decode.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeFormat {
    /// A JSON object per payload.
    Json,
    /// Avro, by a schema.
    Avro,
    /// Protobuf, by a schema.
    Protobuf,
}

/// `decode.schema`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeSchema {
    /// `pubsub`: the topic's schema in Pub/Sub's schema service, every revision.
    PubSub,
    /// A schema file (`.avsc`, `.proto`), as written (relative to the working directory).
    File(std::path::PathBuf),
}

/// One column's value: `select: { column: expression }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The target's column.
    pub column: String,
    /// What fills it.
    pub expression: Expression,
}

/// One entry of `expect:` (Lakeflow's expectations).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// Its name (an identifier), in metrics and dead letters.
    pub name: String,
    /// The condition each record should meet.
    pub check: Expression,
    /// What a violation does.
    pub on_violation: OnViolation,
}

/// `expect[i].on_violation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnViolation {
    /// Counted; the record lands.
    Warn,
    /// Counted; the record is a dead letter (`expectation:NAME`).
    Drop,
    /// The flow stops FAILED; its batch is not acked.
    Fail,
}

/// A flow's source.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// `source: { pubsub: {...} }`.
    PubSub(PubSubSource),
    /// `source: { file: { path: GLOB, max_record_bytes: SIZE } }`.
    File {
        /// A glob of JSONL files.
        path: String,
        /// Lines longer than this (bytes, without the line end) are dead letters
        /// (`record_too_large`), never held in memory.
        max_record_bytes: u64,
    },
    /// `source: { table: TARGET }`.
    Table {
        /// Name of a declared target.
        target: String,
    },
    /// `source: { table: PIPELINE.TARGET }`: a table target of another pipeline in the same
    /// store, read as its rows commit. Its writers run in that pipeline, so it is no data edge
    /// here and hands no watermark down; `schedule.on_update` fires a run when it grows.
    PipelineTable {
        /// The other pipeline's name.
        pipeline: String,
        /// Its target.
        target: String,
    },
}

/// `source.pubsub` with every default applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PubSubSource {
    /// `subscription:` — short name or `projects/P/subscriptions/S`; required.
    pub subscription: String,
    /// `dedup:`.
    pub dedup: DedupSettings,
    /// `event_time:` — `None`: publish time.
    pub event_time: Option<EventTimeSettings>,
    /// `watermark:` — `None`: no watermark estimation for this flow.
    pub watermark: Option<WatermarkSettings>,
    /// `flow_control:`.
    pub flow_control: FlowControl,
    /// `batch:`.
    pub batch: BatchSettings,
    /// `max_attempts:` — default 5, at least 1.
    pub max_attempts: u32,
    /// `poison:` — what becomes of a message that keeps failing; default
    /// [`Poison::DeadLetter`].
    pub poison: Poison,
    /// `drain_idle:` — default 5 s.
    pub drain_idle: Duration,
    /// `streams:` — concurrent StreamingPull streams, default 16, 1..=64.
    pub streams: usize,
}

/// `poison:` — what becomes of a message whose processing fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Poison {
    /// `dead_letter`: after `max_attempts` failed attempts (counted by Pub/Sub's
    /// `delivery_attempt` when the subscription has a dead-letter policy), a row in the
    /// pipeline's dead-letter table, and the message acked.
    #[default]
    DeadLetter,
    /// `nack`: each failure hands the message back to Pub/Sub, whose retry policy and
    /// dead-letter topic take over (it never reaches the dead-letter table).
    Nack,
}

/// `dedup:`.
#[derive(Debug, Clone, PartialEq)]
pub struct DedupSettings {
    /// `dedup.by` — default [`DedupBy::MessageId`].
    pub by: DedupBy,
    /// `dedup.window` — default 10 minutes.
    pub window: Duration,
    /// `dedup.on_missing` — default [`OnMissingKey::MessageId`].
    pub on_missing: OnMissingKey,
}

/// What a message's dedup key is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupBy {
    /// The Pub/Sub message id.
    MessageId,
    /// The value of this attribute (`dedup: { by: attribute, attribute: NAME }`).
    Attribute(String),
}

/// What happens to a message that lacks the dedup attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissingKey {
    /// Fall back to the message id (as Beam does).
    #[default]
    MessageId,
    /// Dead-letter it with reason `missing_dedup_attribute`.
    DeadLetter,
}

/// `event_time:`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventTimeSettings {
    /// `event_time.attribute` — ms since epoch or RFC 3339.
    pub attribute: String,
    /// `event_time.on_bad_timestamp` — default [`OnBadTimestamp::DeadLetter`].
    pub on_bad_timestamp: OnBadTimestamp,
}

/// What happens to a message whose event-time attribute is missing or unparseable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBadTimestamp {
    /// Dead-letter it with reason `bad_timestamp`.
    #[default]
    DeadLetter,
    /// Use the publish time instead.
    PublishTime,
}

/// `flow_control:` — enforced by sluice itself (the emulator ignores the client's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowControl {
    /// Default 10 000.
    pub max_outstanding_messages: usize,
    /// Default 100 MiB.
    pub max_outstanding_bytes: u64,
}

/// `batch:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// Default 1000.
    pub max_messages: usize,
    /// Default 50 ms.
    pub max_delay: Duration,
}

/// `watermark:`.
#[derive(Debug, Clone, PartialEq)]
pub struct WatermarkSettings {
    /// `tracking_subscription` — `auto` (`<subscription>-tracking`) or a subscription name.
    pub tracking_subscription: TrackingSubscription,
    /// `band` — default 10 s.
    pub band: Duration,
}

/// The tracking subscription of a watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackingSubscription {
    /// `auto`: `<subscription>-tracking`, created when missing.
    Auto,
    /// An existing subscription.
    Named(String),
}

/// A `view` target: a named query over one typed table, not stored. The store holds it as a
/// view for people to query; a flow reading it reads the table, the view's query applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The target's name.
    pub name: String,
    /// The typed table it reads (a target of this pipeline).
    pub table: String,
    /// Its columns, each with the expression over the table that computes it (cast to the
    /// column's type where the expression's differs).
    pub select: Vec<Selected>,
    /// Its condition: rows for which it is not true are not in the view.
    pub filter: Option<Expression>,
}
