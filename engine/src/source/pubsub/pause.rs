//! Noticing that the whole process was paused (SIGSTOP, a VM frozen, a stall of seconds), so
//! that messages Pub/Sub pushed into a stream's socket meanwhile are not taken for fresh ones.
//!
//! A delivery's age is counted from when sluice reads it off its stream. After a pause, the
//! stream's socket may hold messages the server sent before or during it; they look fresh when
//! read, though their leases lapsed long ago and another replica may have committed their
//! redeliveries (see `commit_bound.rs`). So each source runs a watch: a plain thread that ticks
//! every [`TICK`] and counts a *pause* whenever a tick comes later than the threshold. A stream
//! opened before a pause gives back (nacks) what it reads after it and is reopened, which drops
//! whatever its socket still held.
//!
//! Before the watch's thread has run after a pause, a stream task may already read: it also
//! checks whether the watch is overdue right now, so nothing read in that gap passes either.
//! A stall shorter than the threshold goes unnoticed; the commit margin covers it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How often the watch ticks.
const TICK: Duration = Duration::from_millis(100);

/// Counts pauses of the process (see the module docs). Cheap to clone; the thread ends when
/// the last clone is dropped.
#[derive(Debug, Clone)]
pub(crate) struct PauseWatch {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    origin: Instant,
    threshold: Duration,
    /// Milliseconds from `origin` to the latest tick.
    last_tick_ms: AtomicU64,
    /// Pauses noticed so far.
    pauses: AtomicU64,
}

/// What a stream remembers of the watch when it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Epoch(u64);

impl PauseWatch {
    /// Starts a watch that counts stalls of at least `threshold` as pauses.
    pub(crate) fn start(threshold: Duration) -> Self {
        let inner = Arc::new(Inner {
            origin: Instant::now(),
            threshold: threshold.max(TICK * 5),
            last_tick_ms: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&inner);
        let spawned = std::thread::Builder::new()
            .name("sluice-pause-watch".to_owned())
            .spawn(move || tick_until_dropped(&weak));
        if let Err(error) = spawned {
            // Without the thread every read looks overdue: streams would give everything back.
            // A process that cannot start a thread has worse trouble; say so and carry on with
            // the margin alone.
            tracing::error!(%error, "cannot start the pause watch; relying on the commit margin");
            inner.last_tick_ms.store(u64::MAX, Ordering::SeqCst);
        }
        Self { inner }
    }

    /// The pauses counted so far, for a stream that opens now.
    pub(crate) fn epoch(&self) -> Epoch {
        Epoch(self.inner.pauses.load(Ordering::SeqCst))
    }

    /// Whether the process was paused since `epoch` was taken, or is coming out of a pause
    /// right now (the watch's tick is overdue).
    pub(crate) fn paused_since(&self, epoch: Epoch) -> bool {
        // The tick is read before the count; the thread counts before it ticks, so a fresh
        // tick comes with its count.
        let last = self.inner.last_tick_ms.load(Ordering::SeqCst);
        let pauses = self.inner.pauses.load(Ordering::SeqCst);
        pauses != epoch.0 || self.inner.overdue(last)
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn overdue(&self, last_tick_ms: u64) -> bool {
        if last_tick_ms == u64::MAX {
            return false;
        }
        self.now_ms().saturating_sub(last_tick_ms) >= millis(self.threshold)
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn tick_until_dropped(watch: &Weak<Inner>) {
    loop {
        std::thread::sleep(TICK);
        let Some(inner) = watch.upgrade() else { return };
        let last = inner.last_tick_ms.load(Ordering::SeqCst);
        if inner.overdue(last) {
            inner.pauses.fetch_add(1, Ordering::SeqCst);
        }
        inner.last_tick_ms.store(inner.now_ms(), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_tick_counts_as_a_pause_for_streams_opened_before_it() {
        let watch = PauseWatch::start(Duration::from_millis(500));
        std::thread::sleep(Duration::from_millis(600));
        let epoch = watch.epoch();
        assert!(!watch.paused_since(epoch), "ticking normally");
        // What a pause leaves behind: the latest tick is far in the past.
        watch.inner.last_tick_ms.store(0, Ordering::SeqCst);
        assert!(
            watch.paused_since(epoch),
            "overdue at once, before the thread noticed"
        );
        std::thread::sleep(Duration::from_millis(300));
        assert!(watch.paused_since(epoch), "counted by the thread");
        let after = watch.epoch();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !watch.paused_since(after),
            "a stream opened after it reads on"
        );
    }
}
