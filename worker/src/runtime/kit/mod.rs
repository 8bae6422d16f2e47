//! The small kit every room uses: SIGTERM/SIGINT turned into a drain, then a give-up, then an
//! exit, and the one way to wait for the store (backoff until done or drained). Neither acks
//! anything: what they stop or delay is committed or redelivered. And the one way a timing is
//! read from the environment.

pub(crate) mod env_duration;
pub(crate) mod signals;
pub(super) mod store_retry;
