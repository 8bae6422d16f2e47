//! The pool of workers of one pipeline, kept in its store alone: heartbeats and single-holder
//! leases, self-fencing (a worker that cannot renew its membership stops acking before the pool
//! counts it gone), and when a once Pub/Sub flow read by several replicas is drained.

pub(super) mod drain_quorum;
pub(crate) mod identity;
pub(super) mod liveness;
pub(crate) mod membership;
pub(crate) mod timing;
