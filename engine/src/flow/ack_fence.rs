//! A fence on acks: whether this process may still acknowledge what it received.
//!
//! A worker of a pool that may have been counted gone (its heartbeats failed) must not ack: a
//! clear may have deleted rows whose keys it still holds in its memory tier, and an ack of a
//! replayed copy would drop the message for good. The worker's membership decides
//! (`sluice`'s `runtime/pool/liveness.rs`); a Pub/Sub source given a fence
//! ([`crate::PubSubSource::with_ack_fence`]) asks it at every ack and, when it says no, gives
//! the message back (nack) instead, counted in `sluice_acks_withheld_total{subscription}`.
//! The message comes back, to this worker or another, and the ledger decides it again.
//!
//! A source without a fence acks whenever its committer says so (a library job, a worker
//! that is not part of a pool).

/// Whether acks may be sent now.
pub trait AckFence: std::fmt::Debug + Send + Sync + 'static {
    /// `true` while an ack sent now is safe; once it says `false` for an update's fence it
    /// may stay so for good (the update's memory is stale).
    fn acks_allowed(&self) -> bool;
}
