//! The clocks a flow reads: the wall clock (ms since the epoch, what the store compares), and
//! the monotonic clock a delivery's age is measured on.
//!
//! Guarantee: the monotonic clock is the system's (`std::time::Instant::now()`) wherever tokio's
//! clock is not paused, which only a test does; a paused test's clock then governs every age.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, by the wall clock.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// Now on the monotonic clock deliveries are stamped with: tokio's (the system's, unless a test
/// paused it).
pub(crate) fn monotonic_now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// How long ago `since` (from [`monotonic_now`]) was; zero for an instant not yet reached.
pub(crate) fn age(since: Instant) -> Duration {
    monotonic_now().saturating_duration_since(since)
}
