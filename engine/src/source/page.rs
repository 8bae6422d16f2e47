//! Pages of a table source ([`crate::TableSource`]): the position change a page's batch commits,
//! and what the source learns of its pages' fate.
//!
//! A page's records are followed by its [`PageMark`]; the batcher closes the batch there (so
//! a batch is exactly one page), and the batch carries the mark to its commit, where the store
//! records the page done in the same transaction. Settling the batch committed tells the
//! source's [`PageTracker`]; dropping it uncommitted (given back, refused because the position
//! moved, abandoned at shutdown) tells it the pages after it can no longer commit: the source
//! then waits for every page in flight to settle and reads on from the stored position.
//!
//! Pages may commit several at a time (as many as the store takes): each commit's transaction
//! does its work, then waits on the tracker ([`sluice_store::PositionGate`]) for the page
//! before it to have committed, and only then moves the position and commits; if a page before
//! it was given back, it writes nothing.

use sluice_store::PositionAdvance;
use std::sync::Arc;
use tokio::sync::watch;

/// The pages of one source in flight, and the version the committed ones reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PageState {
    /// Pages handed over and not settled yet.
    pub(crate) outstanding: usize,
    /// The position version after the last page committed.
    pub(crate) committed_version: i64,
    /// A page was dropped uncommitted since the last [`PageTracker::restart`].
    pub(crate) broken: bool,
}

/// Shared by a table source and the marks of its pages.
#[derive(Debug)]
pub(crate) struct PageTracker {
    state: watch::Sender<PageState>,
}

impl PageTracker {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: watch::Sender::new(PageState::default()),
        })
    }

    /// A mark for a page about to be handed over.
    pub(crate) fn mark(self: &Arc<Self>, advance: PositionAdvance) -> PageMark {
        self.state.send_modify(|s| s.outstanding += 1);
        PageMark {
            advance,
            tracker: self.clone(),
            settled: false,
        }
    }

    /// Waits until no page is in flight; returns the state then.
    pub(crate) async fn settled(&self) -> PageState {
        let mut state = self.state.subscribe();
        match state.wait_for(|s| s.outstanding == 0).await {
            Ok(state) => *state,
            // Unreachable while `self` holds the sender.
            Err(_) => *self.state.borrow(),
        }
    }

    /// Starts again from a position read from the store at `version` (no page in flight).
    pub(crate) fn restart(&self, version: i64) {
        self.state.send_modify(|s| {
            s.broken = false;
            s.committed_version = version;
        });
    }
}

#[async_trait::async_trait]
impl sluice_store::PositionGate for PageTracker {
    /// Until the pages before `version`'s committed, or one of them was given back.
    async fn wait(&self, version: i64) -> bool {
        let mut state = self.state.subscribe();
        let reached = state
            .wait_for(|s| s.committed_version >= version || s.broken)
            .await
            .map(|s| s.committed_version >= version);
        reached.unwrap_or(false)
    }
}

/// The position change of one page, travelling with its batch.
#[derive(Debug)]
pub(crate) struct PageMark {
    advance: PositionAdvance,
    tracker: Arc<PageTracker>,
    settled: bool,
}

impl PageMark {
    pub(crate) fn advance(&self) -> &PositionAdvance {
        &self.advance
    }

    /// What the page's commit waits for before it moves the position.
    pub(crate) fn gate(&self) -> Arc<PageTracker> {
        self.tracker.clone()
    }

    /// The page's batch committed (its position change with it).
    pub(crate) fn committed(mut self) {
        self.settled = true;
        let version = self.advance.expected_version + 1;
        self.tracker.state.send_modify(|s| {
            s.outstanding -= 1;
            s.committed_version = s.committed_version.max(version);
        });
    }
}

impl Drop for PageMark {
    fn drop(&mut self) {
        if !self.settled {
            self.tracker.state.send_modify(|s| {
                s.outstanding -= 1;
                s.broken = true;
            });
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn advance(version: i64) -> PositionAdvance {
        PositionAdvance {
            table: Arc::from("p__t"),
            expected_version: version,
            after: Some((version, 0)),
        }
    }

    #[tokio::test]
    async fn committed_pages_move_the_version_and_a_dropped_one_breaks_the_run() {
        let tracker = PageTracker::new();
        tracker.restart(3);
        let (first, second) = (tracker.mark(advance(3)), tracker.mark(advance(4)));
        first.committed();
        assert_eq!(tracker.state.borrow().outstanding, 1);
        second.committed();
        let state = tracker.settled().await;
        assert_eq!((state.committed_version, state.broken), (5, false));
        drop(tracker.mark(advance(5)));
        let state = tracker.settled().await;
        assert_eq!((state.committed_version, state.broken), (5, true));
        tracker.restart(5);
        assert!(!tracker.settled().await.broken);
    }
}
