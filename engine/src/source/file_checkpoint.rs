//! How far a file read is known committed: the checkpoint a file source saves for the reader
//! that takes over from it (see [`sluice_store::FileCheckpoint`]).
//!
//! # Guarantee
//!
//! [`Checkpoints::reached`] never passes a record that was delivered and not settled: it moves
//! over a chunk only once every record of it was acked (committed, dead-lettered, or acked as a
//! duplicate of a committed key) or skipped as committed before, and over chunks in the order
//! they were read. A nacked record (abandoned at shutdown) stops it for good in this read.

use crate::flow::delivery::AckHandle;
use sluice_store::FileCheckpoint;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::watch;

/// A chunk read and not settled yet.
struct Chunk {
    remaining: usize,
    end: FileCheckpoint,
    broken: bool,
}

#[derive(Default)]
struct State {
    next: u64,
    reached: FileCheckpoint,
    open: BTreeMap<u64, Chunk>,
}

/// The chunks of one read in flight, and the checkpoint the settled ones reach.
pub(crate) struct Checkpoints {
    state: Mutex<State>,
    /// Records delivered and not settled.
    unsettled: watch::Sender<usize>,
}

impl Checkpoints {
    /// A read starting at `from`.
    pub(crate) fn new(from: FileCheckpoint) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                reached: from,
                ..State::default()
            }),
            unsettled: watch::Sender::new(0),
        })
    }

    /// The furthest point before which everything is settled.
    pub(crate) fn reached(&self) -> FileCheckpoint {
        self.lock().reached.clone()
    }

    /// Registers a chunk of `records` deliveries ending at `end`; returns its number.
    pub(crate) fn chunk(&self, records: usize, end: FileCheckpoint) -> u64 {
        let mut state = self.lock();
        let seq = state.next;
        state.next += 1;
        state.open.insert(
            seq,
            Chunk {
                remaining: records,
                end,
                broken: false,
            },
        );
        advance(&mut state);
        drop(state);
        self.unsettled.send_modify(|n| *n += records);
        seq
    }

    /// The ack handle of one record of chunk `seq`.
    pub(crate) fn ack_handle(self: &Arc<Self>, seq: u64) -> Box<dyn AckHandle> {
        Box::new(RecordAck {
            checkpoints: self.clone(),
            seq,
        })
    }

    /// `count` records of chunk `seq` will never be delivered (the read stopped).
    pub(crate) fn abandon(&self, seq: u64, count: usize) {
        self.settle(seq, count, false);
    }

    /// Waits until every record delivered is settled.
    pub(crate) async fn settled(&self) {
        let mut unsettled = self.unsettled.subscribe();
        let _ = unsettled.wait_for(|n| *n == 0).await;
    }

    fn settle(&self, seq: u64, count: usize, acked: bool) {
        let mut state = self.lock();
        if let Some(chunk) = state.open.get_mut(&seq) {
            chunk.remaining = chunk.remaining.saturating_sub(count);
            chunk.broken |= !acked;
        }
        advance(&mut state);
        drop(state);
        self.unsettled.send_modify(|n| *n = n.saturating_sub(count));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Moves the checkpoint over the settled chunks at the front.
fn advance(state: &mut State) {
    while let Some(entry) = state.open.first_entry() {
        let chunk = entry.get();
        if chunk.remaining > 0 || chunk.broken {
            return;
        }
        state.reached = entry.remove().end;
    }
}

/// A delivered record's ack handle: settles it in its chunk.
struct RecordAck {
    checkpoints: Arc<Checkpoints>,
    seq: u64,
}

impl AckHandle for RecordAck {
    fn ack(self: Box<Self>) {
        self.checkpoints.settle(self.seq, 1, true);
    }

    fn nack(self: Box<Self>) {
        self.checkpoints.settle(self.seq, 1, false);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(offset: i64) -> FileCheckpoint {
        FileCheckpoint {
            path: "a.jsonl".into(),
            offset,
            line: offset,
        }
    }

    #[test]
    fn the_checkpoint_passes_only_settled_chunks_in_order() {
        let checkpoints = Checkpoints::new(at(0));
        let first = checkpoints.chunk(2, at(10));
        let second = checkpoints.chunk(1, at(20));
        let empty = checkpoints.chunk(0, at(30));
        let a = checkpoints.ack_handle(first);
        let b = checkpoints.ack_handle(first);
        checkpoints.ack_handle(second).ack();
        assert_eq!(
            checkpoints.reached(),
            at(0),
            "the first chunk is not settled"
        );
        a.ack();
        assert_eq!(checkpoints.reached(), at(0));
        b.ack();
        assert_eq!(
            checkpoints.reached(),
            at(30),
            "then every settled one after it"
        );
        let _ = empty;
        let third = checkpoints.chunk(2, at(40));
        checkpoints.ack_handle(third).nack();
        checkpoints.abandon(third, 1);
        let fourth = checkpoints.chunk(0, at(50));
        let _ = fourth;
        assert_eq!(checkpoints.reached(), at(30), "a nack stops it for good");
    }

    #[tokio::test]
    async fn settled_waits_for_every_delivery() {
        let checkpoints = Checkpoints::new(at(0));
        let seq = checkpoints.chunk(1, at(10));
        let ack = checkpoints.ack_handle(seq);
        let waiter = tokio::spawn({
            let checkpoints = checkpoints.clone();
            async move { checkpoints.settled().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        ack.ack();
        waiter.await.unwrap();
    }
}
