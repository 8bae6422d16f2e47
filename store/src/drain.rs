//! Draining a once flow together: which workers read it, and whether each found its source
//! empty while holding nothing.
//!
//! A once Pub/Sub flow read by several replicas is complete only when none of them holds a
//! message that could still come back: a replica that died holding messages gives them back to
//! the subscription only when their leases lapse. So each reader reports here when it starts
//! reading ([`crate::DrainStore::report_drain`] with `drained: false`), when it found the
//! subscription empty with nothing in flight (`true`), and again when it received something
//! after that (`false`); a reader that stops cleanly withdraws its report. The reports and the
//! readers' heartbeats, read together on the store's clock ([`crate::DrainStore::drain_census`]), let
//! a reader decide whether the flow may be recorded complete (the worker's rule is in
//! `worker/src/runtime/pool/drain_quorum.rs`).

/// One reader's latest report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainReport {
    /// The worker.
    pub worker: String,
    /// Whether it found the source empty while holding nothing.
    pub drained: bool,
    /// When it reported, ms since the epoch (store clock).
    pub reported_at_ms: i64,
    /// Its latest heartbeat, ms since the epoch (store clock); `None`: it has no heartbeat
    /// (it left the pool, or never beat).
    pub last_beat_ms: Option<i64>,
}

/// Every reader's report on one flow, with the store's clock when they were read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainCensus {
    /// The store's clock, ms since the epoch.
    pub now_ms: i64,
    /// One report per reader.
    pub reports: Vec<DrainReport>,
}
