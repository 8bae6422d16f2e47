//! The engine of sluice: the parts a flow is made of, from a source's message to its ack.
//!
//! `sluice-connector` (the library users embed) and the `sluice` worker build their flows from
//! these parts; they follow the binary, not a semantic version. The guarantees are stated where
//! they are kept:
//!
//! * [`flow`]: a message is acked only after the transaction recording its effect committed
//!   (`flow/commit.rs`), and never committed past its bound (`flow/commit_bound.rs`); each
//!   ordering key commits in publish order (`flow/commit_lanes.rs`).
//! * [`source`]: what a source hands over, and for bounded sources how a re-read or a pool's
//!   successor finds what was already committed.
//! * [`watermark`]: a flow's event-time watermark and the tracking reader that moves it (the
//!   proof of its bound is in `sluice-watermark`).
//! * [`dead_letter_topic`]: every dead letter of a pipeline with a topic reaches it, at least
//!   once.
//!
//! ```text
//! source ──► budget ──► batch (keys, memory tier) ──► stage ──► commit ──► ack
//!   │                                                              │
//!   └─ pubsub, file, table, in-process                             └─ store: rows + ledger keys, one transaction
//! ```

pub mod backoff;
pub mod dead_letter_topic;
pub mod defaults;
pub mod flow;
pub mod parts;
pub mod source;
pub mod telemetry;
pub mod time;
pub mod watermark;

pub use backoff::Backoff;
pub use dead_letter_topic::{DeadLetterTopic, FLUSH_GRACE, PUBLISHER_ROLE};
pub use flow::ack_fence::AckFence;
pub use flow::batch::Batch;
pub use flow::batcher::{BatchSettings, BatchSource, DedupSettings, Idle, KeySource};
pub use flow::budget::Budget;
pub use flow::commit::{BatchWork, CommitReport, CommitThenAck, RetrySettings};
pub use flow::commit_bound::{MAX_COMMIT_MARGIN, commit_bound, commit_margin, pause_threshold};
pub use flow::decode::avro::AvroRecord;
pub use flow::decode::derive::{DerivedColumn, columns_of_revisions};
pub use flow::decode::json::JsonFields;
pub use flow::decode::protobuf::ProtobufMessage;
pub use flow::decode::revisions::{Revision, RevisionsDecoder, SchemaFileDecoder, SchemaRegistry};
pub use flow::decode::schema::{CompiledSchema, Encoding, SchemaFormat};
pub use flow::decode::{
    DELETED_REVISION, ENCODING_ATTRIBUTE, PayloadDecoder, REVISION_ATTRIBUTE, SCHEMA_ATTRIBUTE,
    UNDECODABLE,
};
pub use flow::delivery::{AckHandle, Delivery, SourceMessage, SourceProblem};
pub use flow::event_time::{EventTimeError, parse_event_time};
pub use flow::expectations::{EXPECTATION_REASON, Expectation, Expectations, OnViolation};
pub use flow::foreach::{BatchHandler, ForeachBatchStage, StageRecord, StagedBatch, batch_id};
pub use flow::query_cell::{FieldColumn, QueryCell};
pub use flow::runner::{DrainAgreement, Ended, FlowEnd, FlowError, FlowRun, RunUntil};
pub use flow::sink::{JsonlSink, SinkCommit};
pub use flow::stage::{Stage, StageError, TableStage};
pub use flow::storable::UNSTORABLE;
pub use parts::{FlowParts, PubSubFlow};
pub use source::bounded::{SkipCommitted, SourceProgress};
pub use source::file::{CHECKPOINT_EVERY, DEFAULT_MAX_RECORD_BYTES, FileSource, FileTurn};
pub use source::inprocess::{InProcessAck, InProcessSource, InProcessTally, PACE_STEP};
pub use source::kept_open::KeptOpen;
pub use source::published_before::PublishedBefore;
pub use source::pubsub::{self, PubSubConfig, PubSubSource};
pub use source::table::{DEFAULT_POLL, PAGE_ROWS, TableSource};
pub use source::table_watermark::TableWatermark;
pub use source::turn::{ReaderTurn, TURN_TTL};
pub use source::{IdleCheck, MessageSource, Received, SourceError, SourceHandle};
pub use telemetry::{COMMIT_ERROR_KINDS, Counters, DEAD_LETTER_REASONS, Snapshot};
pub use time::now_ms;
pub use watermark::tracker_settings::TrackerSettings;
pub use watermark::tracking::{
    LEASE_TTL as TRACKER_LEASE_TTL, TICK as TRACKER_TICK, WatermarkTracker,
};
pub use watermark::{FlowWatermark, bucket_of};
