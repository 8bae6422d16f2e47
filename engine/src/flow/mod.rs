//! A flow's path from a received message to its ack: the budget that bounds what is in flight,
//! keying and batching (`batcher.rs`), the memory tier (`memory_tier.rs`), the batch and how it
//! is settled (`batch.rs`), the first stage (`stage.rs`, `foreach.rs` for a stage service), the
//! commit with its bound and its lanes (`commit.rs`, `commit_bound.rs`, `commit_lanes.rs`), the
//! sink a commit publishes (`sink.rs`), and the run of one flow that puts them together
//! (`runner.rs`). Nothing is acked before the commit that records it returns
//! (`commit.rs` states the protocol; `ack_fence.rs` withholds acks a pool may no longer want).

pub(crate) mod ack_fence;
pub(crate) mod batch;
#[cfg(test)]
mod batch_timing;
pub(crate) mod batcher;
pub(crate) mod budget;
pub(crate) mod commit;
pub(crate) mod commit_bound;
pub(crate) mod commit_lanes;
#[cfg(test)]
mod commit_timing;
pub(crate) mod decode;
pub(crate) mod delivery;
pub(crate) mod event_time;
pub(crate) mod expectations;
pub(crate) mod foreach;
pub(crate) mod memory_tier;
pub(crate) mod query_cell;
pub(crate) mod runner;
pub(crate) mod sink;
pub(crate) mod stage;
pub(crate) mod storable;
