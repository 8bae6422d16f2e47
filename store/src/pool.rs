//! What replicas of one pipeline tell each other through the store: who is alive (heartbeats)
//! and who holds each role that must have a single holder (leases).
//!
//! # Guarantees
//!
//! A lease has at most one holder at any instant of the store's clock: [`crate::MembershipStore::acquire_lease`]
//! grants it only when it is free, expired, or already held by the same holder, in one atomic
//! statement. A holder that stops renewing loses the lease when its time runs out, so a role
//! moves to another replica at most [`LeaseRequest::ttl`] after its holder died, plus the taker's
//! renewal interval. The PostgreSQL backend reads time from the database server, so replicas'
//! clocks need not agree; SQLite (one host) reads the host's clock.
//!
//! Holding a lease is advisory: a holder that was paused longer than the lease (a stopped VM)
//! may briefly believe it still holds it. Roles are chosen so that two holders for a moment
//! waste work but never break exactly-once (the dedup ledger alone decides that).

use std::time::Duration;

/// A worker's heartbeat: it is alive and serving `pipeline`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerBeat {
    /// Pipeline name.
    pub pipeline: String,
    /// This worker's id, unique per process start (`<host>-<pid>-<random>`).
    pub worker: String,
    /// Host name, for people.
    pub host: String,
    /// Process id, for people.
    pub pid: u32,
    /// The schedule this worker fires by, as a fingerprint (`None`: no schedule): a pool's
    /// scheduler fires only while every live replica's agrees with its own.
    pub schedule: Option<String>,
}

/// A worker as the store last heard of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRecord {
    /// Worker id.
    pub worker: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// First heartbeat, ms since epoch (store clock).
    pub started_at_ms: i64,
    /// Latest heartbeat, ms since epoch (store clock).
    pub last_beat_ms: i64,
    /// Its schedule's fingerprint ([`WorkerBeat::schedule`]).
    pub schedule: Option<String>,
}

/// A request to take or renew a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    /// Pipeline name.
    pub pipeline: String,
    /// Role name (`ledger_upkeep`, `tracking_reader`, `scheduler`).
    pub role: String,
    /// Worker id asking.
    pub holder: String,
    /// How long the lease lasts from now unless renewed.
    pub ttl: Duration,
}

/// A lease as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Role name.
    pub role: String,
    /// Worker id holding it (possibly expired).
    pub holder: String,
    /// When it runs out, ms since epoch (store clock).
    pub expires_at_ms: i64,
    /// When the current holder took it, ms since epoch (store clock).
    pub acquired_at_ms: i64,
}

/// What [`crate::MembershipStore::acquire_lease`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseGrant {
    /// The asker holds the lease until `expires_at_ms` (store clock). `taken` is true when it
    /// was not the holder before this call.
    Held {
        /// Whether the lease changed hands with this call.
        taken: bool,
        /// Expiry, ms since epoch.
        expires_at_ms: i64,
    },
    /// Someone else holds it.
    HeldBy(String),
}

/// What one round of ledger upkeep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LedgerUpkeep {
    /// Expired keys deleted row by row (SQLite).
    pub keys_removed: u64,
    /// Ledger generations (partitions) created ahead of time (PostgreSQL).
    pub generations_created: u64,
    /// Ledger generations dropped whole once no window could still need them (PostgreSQL).
    pub generations_dropped: u64,
}
