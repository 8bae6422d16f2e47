//! What goes into and comes out of the store.

use bytes::Bytes;
use sluice_dedup::DedupKey;
use std::sync::Arc;

/// The tables and flows a pipeline needs.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Pipeline name (a validated identifier).
    pub pipeline: String,
    /// Names of `table` targets (validated identifiers); each becomes `<pipeline>__<target>`.
    /// Those also in `typed` are created with their columns, the others as envelope tables.
    pub tables: Vec<String>,
    /// The typed table targets among `tables`, with their declared columns.
    pub typed: Vec<crate::TypedTable>,
    /// Names of flows.
    pub flows: Vec<String>,
}

/// A prepared flow: its id in the store and the names it is known by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowHandle {
    /// Row id in `sluice_flows`; scopes the flow's ledger.
    pub id: i64,
    /// Pipeline name.
    pub pipeline: Arc<str>,
    /// Flow name.
    pub name: Arc<str>,
}

/// The Pub/Sub (or file) message an entry came from, as stored in target and dead-letter rows.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageFields {
    /// Pub/Sub message id (for file records: the record id).
    pub message_id: String,
    /// Publish time, milliseconds since the Unix epoch.
    pub publish_time_ms: i64,
    /// Attributes as a JSON object.
    pub attributes_json: String,
    /// Payload.
    pub data: Bytes,
}

/// What an entry's effect is, if its key is new.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// A row in the batch's target table.
    Row {
        /// Event time, milliseconds since the Unix epoch.
        event_time_ms: i64,
        /// For a typed table, the record's decoded fields, in the order of
        /// [`crate::TypedQuery::fields`]; empty for an envelope table.
        values: Vec<crate::TypedValue>,
    },
    /// A row in `<pipeline>__dead_letter`.
    DeadLetter {
        /// Short machine-readable reason (`bad_timestamp`, `max_attempts`, ...).
        reason: String,
        /// The last error, for people.
        error: String,
        /// Attempts made.
        attempts: u32,
    },
}

/// One message's part of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Ledger key.
    pub key: DedupKey,
    /// Source message.
    pub message: MessageFields,
    /// Effect if the key is new.
    pub effect: Effect,
}

/// One transaction's worth of work for one flow.
#[derive(Debug, Clone)]
pub struct CommitBatch {
    /// The flow committing.
    pub flow: FlowHandle,
    /// Full SQL name of the target table (`<pipeline>__<target>`, see [`crate::table_name`]);
    /// not used (need not exist) with [`CommitBatch::work`].
    pub table: Arc<str>,
    /// Entries, in receive order.
    pub entries: Vec<Entry>,
    /// Commit time, ms since epoch (`committed_at`). SQLite decides expiry with it; PostgreSQL
    /// uses its server's clock instead (shared by all replicas) and only the window
    /// `expires_at_ms - now_ms` from here.
    pub now_ms: i64,
    /// Ledger keys written by this batch expire at this time (now + dedup window), ms.
    pub expires_at_ms: i64,
    /// The latest time at which this batch may still commit, ms since the epoch on the
    /// caller's clock (its oldest delivery's receipt plus the commit bound); `None`: no limit.
    /// The store checks it inside the transaction, on its own clock (SQLite: the host's;
    /// PostgreSQL: the server's, converted with a measured offset that can only make the
    /// deadline earlier), and refuses a late batch with [`crate::StoreError::Stale`], so a
    /// pause between the caller's own check and the commit cannot slip through.
    pub commit_by_ms: Option<i64>,
    /// Work to do inside the transaction once the ledger has decided (a sink's file); `None`
    /// for most batches.
    pub hook: Option<Arc<dyn CommitHook>>,
    /// Whether the flow has a watermark: then the same transaction records every entry's
    /// message as settled in its publish-time bucket ([`crate::MessageReport::Settled`]), so a
    /// crash right after the commit cannot lose that report.
    pub watermark_progress: bool,
    /// For a flow reading a table: the page this batch holds is done, recorded in the same
    /// transaction (refused with [`crate::StoreError::Moved`] if the position moved meanwhile).
    pub position: Option<crate::PositionAdvance>,
    /// With `position`, when the flow's pages commit several at a time: what the transaction
    /// waits for before it moves the position (see [`crate::PositionGate`]); `None`: the
    /// caller commits one page at a time. SQLite, which commits one batch at a time, has no use
    /// for it.
    pub position_gate: Option<Arc<dyn crate::PositionGate>>,
    /// The caller's own writes in this transaction (a library job's effects; see
    /// [`crate::TransactionWork`]). With it, the work is the batch's effect: no target rows
    /// are written; dead letters, ledger keys and counters are.
    pub work: Option<crate::TransactionWork>,
    /// For a typed table target: the flow's query, which writes each new row from its values
    /// (see `typed.rs`); `None`: an envelope table.
    pub typed: Option<Arc<crate::TypedQuery>>,
    /// Whether the pipeline publishes its dead letters to a topic (`dead_letter.topic`): then
    /// the same transaction places each new dead letter in the outbox too (see
    /// [`crate::OutboxLetter`]).
    pub publish_dead_letters: bool,
    /// Per entry, which of `typed`'s expectations it violated (in their order), as decided
    /// before the commit; the same transaction counts each entry whose key is new, per
    /// expectation, passed or violated ([`crate::LedgerStore::expectation_counts`]). An entry
    /// with no verdict (an empty list: a dead letter, a record `where:` left out) is not
    /// counted; an empty `verdicts`: nothing is.
    pub verdicts: Vec<Vec<bool>>,
    /// Duplicates the caller's memory tier dropped since its last commit (they never reach
    /// the store): added to the flow's duplicates in the same transaction, so that the
    /// store's count is both tiers' ([`crate::FlowProgress::duplicates`]).
    pub memory_duplicates: u64,
}

/// Work done inside a commit's transaction, after the ledger has said which entries are new
/// and before the transaction commits: a sink writes its file (under a temporary name) here.
///
/// The same transaction records [`CommitHook::id`] in `sluice_commit_marks`, so whoever finds
/// the work's leftovers after a crash can ask [`crate::LedgerStore::commit_recorded`] whether they
/// belong to a committed batch (publish them) or not (discard them). An `Err` rolls the
/// transaction back; the batch is retried like after a store outage.
pub trait CommitHook: Send + Sync + std::fmt::Debug {
    /// Unique id of this commit attempt.
    fn id(&self) -> &str;
    /// Does the work, given which entries are new (`written[i]` for entry `i`).
    fn before_commit(&self, written: &[bool]) -> Result<(), String>;
}

/// Result of a committed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOutcome {
    /// Per entry, in order: `true` if its key was new (its effect applied), `false` if it was a
    /// duplicate.
    pub written: Vec<bool>,
    /// Of the rows with a new key, how many a typed flow's `where:` left out (no row written).
    pub filtered: u64,
}

impl Effect {
    /// A row of an envelope table.
    pub fn row(event_time_ms: i64) -> Self {
        Self::Row {
            event_time_ms,
            values: Vec::new(),
        }
    }
}

/// Counters of a flow, as committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowProgress {
    /// Target rows written.
    pub committed: u64,
    /// Duplicates: entries the ledger found committed, plus those the workers' memory tier
    /// dropped before any commit (recorded with their next commit,
    /// [`crate::CommitBatch::memory_duplicates`]).
    pub duplicates: u64,
    /// Dead-letter rows written.
    pub dead_lettered: u64,
    /// Batches committed.
    pub batches: u64,
}

/// A row of a target table, as a `table` source reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRow {
    /// The flow that wrote it.
    pub flow: String,
    /// Its dedup key.
    pub dedup_key: String,
    /// Pub/Sub message id (file records: the record id).
    pub message_id: String,
    /// Publish time, ms since epoch.
    pub publish_time_ms: i64,
    /// Event time, ms since epoch.
    pub event_time_ms: i64,
    /// Attributes as a JSON object.
    pub attributes_json: String,
    /// Payload.
    pub data: Bytes,
}

/// Where a paged read of a table goes on from: the last row read, in the order
/// `(flow, dedup_key, message_id)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RowCursor {
    /// Flow of the last row read.
    pub flow: String,
    /// Its dedup key.
    pub dedup_key: String,
    /// Its message id.
    pub message_id: String,
}

impl From<&StoredRow> for RowCursor {
    fn from(row: &StoredRow) -> Self {
        Self {
            flow: row.flow.clone(),
            dedup_key: row.dedup_key.clone(),
            message_id: row.message_id.clone(),
        }
    }
}

/// Which of a flow's target rows and dead letters a reset deletes (see
/// [`crate::FlowStore::reset_flow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetRows {
    /// None: the source cannot give them again (acked Pub/Sub messages, no seek).
    Keep,
    /// Every one: the source gives them all again (files, tables).
    All,
    /// Those published at or after `since_ms`: a Pub/Sub subscription seeked to it gives
    /// exactly those again.
    PublishedSince {
        /// The seek's time, ms since the epoch.
        since_ms: i64,
        /// The flow has a watermark: each deleted row is recorded as a message tracked (with
        /// its event time) and not settled, as are the messages from then on that were tracked
        /// and not settled yet, so the watermark holds at the oldest of them until the replay
        /// settles them again, in whatever order Pub/Sub hands the replay to the tracking
        /// subscription.
        hold_watermark: bool,
    },
}
