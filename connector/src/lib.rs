//! sluice's source connector: Pub/Sub in, deduplicated batches out, acks only after commit.
//!
//! # The message lifecycle
//!
//! ```text
//! received ──► keyed ──► admitted (memory tier) ──► batched ──► staged ──► committed ──► acked
//!                             │                                     │
//!                             ├─ in flight elsewhere: parked ───────┴─► acked with its original
//!                             └─ committed recently: acked at once (a duplicate)
//! ```
//!
//! # Guarantees
//!
//! * **Ack after commit.** A [`Delivery`]'s Pub/Sub handler is acked only by
//!   [`Batch::settle_committed`], which the caller invokes after the transaction holding the
//!   batch's effects has committed ([`CommitThenAck`] does exactly that with a
//!   [`sluice_store::Store`]). Until then the client keeps extending the message's lease.
//!   A batch that is dropped or [`Batch::abandon`]ed is nacked, so Pub/Sub redelivers it promptly.
//! * **No double processing within a worker.** A redelivery that races its original (same dedup
//!   key, original not yet settled) is parked and settled with the original: acked when the
//!   original commits, nacked when it is abandoned. It never reaches a stage.
//! * **Exactly once across workers** comes from the store's ledger: the memory tier only reports
//!   keys the store has already decided, so it never drops a message the store has not seen.
//! * **Never past the dedup window.** A Pub/Sub delivery held longer than the commit bound
//!   (the dedup window minus a margin, [`commit_bound`]) is given back uncommitted, checked by
//!   the committer and again by the store inside the transaction; a stream that lived through a
//!   pause of the process gives back what it reads after it. So a worker paused past the window
//!   cannot commit a message whose other copy the ledger has forgotten.
//! * **Bounded memory.** At most `max_outstanding_messages` messages and `max_outstanding_bytes`
//!   bytes are held between receipt and ack; sources stop pulling at the bound ([`Budget`]).
//!
//! # Using it in your own job
//!
//! See `examples/custom_job.rs`: build a [`PubSubSource`], wrap it in a [`BatchSource`], take
//! [`Batch`]es, run your own first stage, commit through [`CommitThenAck`] (or your own store,
//! then call [`Batch::settle_committed`]).

mod backoff;
mod batch;
mod bounded;
mod budget;
mod commit;
mod commit_bound;
mod delivery;
mod event_time;
mod file;
mod foreach;
mod inprocess;
mod job;
mod kept_open;
mod page;
pub mod pubsub;
mod runner;
mod sink;
mod source;
mod stage;
mod storable;
mod table;
mod telemetry;
mod time;
mod tracking;
mod watermark;

pub use backoff::Backoff;
pub use batch::{Batch, BatchSettings, BatchSource, DedupSettings, Idle, KeySource};
pub use bounded::{SkipCommitted, SourceProgress};
pub use budget::Budget;
pub use commit::{CommitReport, CommitThenAck, RetrySettings};
pub use commit_bound::{MAX_COMMIT_MARGIN, commit_bound, commit_margin, pause_threshold};
pub use delivery::{AckHandle, Delivery, SourceMessage, SourceProblem};
pub use event_time::{EventTimeError, parse_event_time};
pub use file::FileSource;
pub use foreach::{BatchHandler, ForeachBatchStage, StageRecord, StagedBatch, batch_id};
pub use inprocess::{InProcessAck, InProcessSource, InProcessTally, PACE_STEP};
pub use job::{
    Dedup, HandlerError, Job, JobBatch, JobBuilder, JobError, JobParts, JobReport, JobStream,
    Message, NewMessages, PostgresHandler, SqliteHandler, defaults,
};
pub use kept_open::KeptOpen;
/// The SQLite driver a [`SqliteHandler`] is given a transaction of (the same version).
pub use rusqlite;
/// The PostgreSQL driver a [`PostgresHandler`] is given a transaction of (the same version).
pub use tokio_postgres;

/// What a job needs, in one import: `use sluice_connector::prelude::*;`.
pub mod prelude {
    pub use crate::job::{
        Dedup, HandlerError, Job, JobBatch, JobError, JobReport, JobStream, Message, NewMessages,
        PostgresHandler, SqliteHandler,
    };
    pub use crate::pubsub::PubSubConfig;
    pub use crate::{rusqlite, tokio_postgres};
}
pub use pubsub::{PubSubConfig, PubSubSource};
pub use runner::{COMMIT_QUEUE, DrainAgreement, Ended, FlowEnd, FlowError, FlowRun, RunUntil};
pub use sink::{JsonlSink, SinkCommit};
pub use source::{INTAKE_CAPACITY, MessageSource, Received, SourceError, SourceHandle};
pub use stage::{Stage, StageError, TableStage};
pub use storable::UNSTORABLE;
pub use table::{DEFAULT_POLL, PAGE_ROWS, ReaderTurn, TURN_TTL, TableSource, TableWatermark};
pub use telemetry::{COMMIT_ERROR_KINDS, Counters, DEAD_LETTER_REASONS, Snapshot};
pub use time::now_ms;
pub use tracking::{
    LEASE_TTL as TRACKER_LEASE_TTL, TICK as TRACKER_TICK, TrackerSettings, WatermarkTracker,
};
pub use watermark::{FlowWatermark, bucket_of};
