//! How long a Pub/Sub delivery may wait for its commit: the dedup window minus a margin.
//!
//! # Why there is a bound
//!
//! The ledger remembers a committed key for the dedup window `W`, and no longer. A worker that
//! holds a delivery for longer than that (it was paused by SIGSTOP or a long stall, or cut off
//! by a partition, while the lease lapsed and another replica committed the redelivery) would
//! find the other replica's key expired and commit the message a second time. So a delivery
//! received more than `W - margin` ago ([`commit_bound`]) is given back (nacked), never
//! committed.
//!
//! # Why it is enough
//!
//! Say this worker received a copy at `r` and another replica committed a copy of the same key
//! at `c`, which keeps the key until `c + W`.
//! - If the other copy was delivered after `r` (a redelivery after this worker's lease lapsed),
//!   then `c > r`, and this worker commits no later than `r + W - margin < c + W`: the key is
//!   still there and the ledger calls this copy a duplicate.
//! - If this worker commits first, at `t ≤ r + W - margin`, the other copy finds this one's key
//!   until `t + W`, and it too was delivered within `W - margin` of its commit.
//!
//! Two commits of one key less than `W` apart are always caught, and each copy commits within
//! `W - margin` of its receipt, so a duplicate needs a copy that Pub/Sub delivers about `W` after
//! another copy was committed (a publisher's re-publish that late is outside the window by
//! definition; Pub/Sub redelivers an unacked message once its ack deadline passes, seconds).
//!
//! The check is made twice: by the committer before it stages a batch (stale deliveries are
//! nacked, the rest go on), and by the store inside the commit's transaction on its own clock
//! (`CommitBatch::commit_by_ms`), so a pause between the first check and the commit cannot slip
//! through. The margin absorbs what the store's clock conversion and a short undetected stall
//! (below [`pause_threshold`]) can add to a delivery's true age.
//!
//! Messages that Pub/Sub had pushed into a stream's socket while the process was stopped look
//! fresh when they are finally read; the stream tasks detect such a pause (see
//! `pubsub/pause.rs`) and give those messages back too.

use std::time::Duration;

/// The margin never exceeds this: with the default 10-minute window, deliveries older than
/// 9 minutes are given back.
pub const MAX_COMMIT_MARGIN: Duration = Duration::from_secs(60);

/// The share of the window kept as margin, for windows shorter than 5 minutes.
const MARGIN_SHARE: u32 = 5;

/// The margin kept below the dedup window: a fifth of it, at most [`MAX_COMMIT_MARGIN`].
pub fn commit_margin(window: Duration) -> Duration {
    (window / MARGIN_SHARE).min(MAX_COMMIT_MARGIN)
}

/// How long a delivery may wait for its commit with dedup window `window`:
/// `window - commit_margin(window)`.
pub fn commit_bound(window: Duration) -> Duration {
    window.saturating_sub(commit_margin(window))
}

/// A stall of the process at least this long is taken for a pause (see the module docs): half
/// the margin, so a shorter one adds less than the margin to any delivery's age.
pub fn pause_threshold(window: Duration) -> Duration {
    commit_margin(window) / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_for_short_and_default_windows() {
        assert_eq!(
            commit_bound(Duration::from_secs(15)),
            Duration::from_secs(12)
        );
        assert_eq!(
            pause_threshold(Duration::from_secs(15)),
            Duration::from_millis(1_500)
        );
        assert_eq!(
            commit_bound(Duration::from_secs(600)),
            Duration::from_secs(540)
        );
        assert_eq!(
            pause_threshold(Duration::from_secs(600)),
            Duration::from_secs(30)
        );
    }
}
