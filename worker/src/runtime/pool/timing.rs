//! The pool's clock: how often a worker beats, how long a lease lasts and when the pool counts
//! a worker gone. Membership beats by it, self-fencing (`liveness.rs`) closes before the pool
//! may count the worker gone, and every "who is alive" question asks within it.

use std::time::Duration;

/// How often a worker beats, renews its leases and, when it holds `ledger_upkeep`, does upkeep.
pub const BEAT_INTERVAL: Duration = Duration::from_secs(5);
/// How long a lease lasts without renewal: three beats, so one slow store call does not lose it.
pub const LEASE_TTL: Duration = Duration::from_secs(15);
/// Workers heard of within this long count as alive: three missed beats.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(BEAT_INTERVAL.as_secs() * 3);
