//! Updates of a running pool: a reset or refresh asked of every replica of a pipeline at once
//! (`sluice_pool_updates`, `sluice_pool_update_drains`).
//!
//! # Guarantees
//!
//! * **One at a time, in order.** Updates are numbered as they are asked for; the one the
//!   replicas take part in is the oldest unfinished ([`crate::PoolUpdateStore::pool_update`] with no
//!   id), so a second request waits for the first.
//! * **One clearer.** [`crate::PoolUpdateStore::claim_pool_update`] is one statement: it moves a
//!   pending update to `clearing` for one caller, or takes a claim over that is older than the
//!   caller's `stale_after` (its clearer died). The caller clears only once it holds the claim
//!   and every live replica reported its flows stopped.
//! * **Ended once, by its clearer.** [`crate::PoolUpdateStore::finish_pool_update`] writes the
//!   outcome of an update that the caller holds the claim of; an ended update is never
//!   rewritten, and a clearer whose claim was taken over cannot end it.
//! * **A clear is fenced by its claim.** A reset made for an update
//!   ([`crate::FlowStore::reset_flow`] with a [`ClearClaim`]) checks, in its own transaction and
//!   holding the update's row against a takeover until it commits, that the update is still
//!   being cleared by that clearer; otherwise nothing is deleted ([`crate::StoreError::ClaimLost`]).
//!   So a clearer paused or cut off past [`crate::PoolUpdateStore::claim_pool_update`]'s `stale_after`,
//!   whose claim another took over, cannot clear under replicas that resumed. Clearer ids are
//!   unique per process (a worker id, or the command line's `cli@host/pid`), so the id is the
//!   fencing token.

/// Where a pool update stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolUpdateState {
    /// Asked for; the replicas are stopping their flows.
    Pending,
    /// `by` clears what it asks (every live replica has stopped its flows).
    Clearing {
        /// The clearer.
        by: String,
        /// When it claimed the clearing, ms since the epoch (store clock).
        claimed_at_ms: i64,
    },
    /// Done: the replicas start their flows again.
    Done,
    /// Failed or withdrawn: nothing was cleared, or the message says what was.
    Failed,
}

impl PoolUpdateState {
    /// Whether the update has ended.
    pub fn ended(&self) -> bool {
        matches!(self, PoolUpdateState::Done | PoolUpdateState::Failed)
    }

    /// The state's name in the store and in `sluice status`.
    pub fn name(&self) -> &'static str {
        match self {
            PoolUpdateState::Pending => "pending",
            PoolUpdateState::Clearing { .. } => "clearing",
            PoolUpdateState::Done => "done",
            PoolUpdateState::Failed => "failed",
        }
    }
}

/// The claim a clear is made under: the update and its clearer (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClearClaim {
    /// The update's number.
    pub update: i64,
    /// The clearer that claimed it.
    pub clearer: String,
}

/// A pool update as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUpdate {
    /// Its number (increasing).
    pub id: i64,
    /// The pipeline.
    pub pipeline: String,
    /// What it asks, as the asker wrote it (the worker's JSON).
    pub request: String,
    /// Who asked (a worker id, or `cli@host/pid`).
    pub requested_by: String,
    /// When, ms since the epoch (store clock).
    pub requested_at_ms: i64,
    /// Where it stands.
    pub state: PoolUpdateState,
    /// The outcome in words, once ended.
    pub message: Option<String>,
    /// The replicas that reported their flows stopped for it.
    pub drained: Vec<String>,
}
