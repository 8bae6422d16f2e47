//! The committer tasks of a flow, and how batches reach them.
//!
//! # Guarantees
//!
//! * **Unordered** (every source but an ordered subscription): as many tasks as the store
//!   commits at once take batches from one queue; batches may commit in any order, and the
//!   ledger keeps each key's effect once whatever the order.
//! * **Ordering keys in order** (a Pub/Sub subscription with message ordering, which delivers
//!   each key's messages in publish order): each batch is split into *lanes* by ordering key
//!   (a key always goes to the same lane; messages without a key spread by dedup key), and each
//!   lane has one task that commits its parts one after another, in receive order. So a later
//!   message of a key never commits before an earlier one (retries, and the singles a failing
//!   batch is split into, are done before the lane's next part), while different keys commit
//!   in parallel in other lanes. A message that fails every attempt is dead-lettered and the
//!   key goes on (dead-letter and continue). A part that is given back (held past the commit
//!   bound; the committer then gives back the whole part) makes the lane give back every later
//!   part holding a message received up to [`REGIVE_GRACE`] after it: Pub/Sub redelivers the
//!   key from the given-back message on, and nothing received before that redelivery may
//!   commit ahead of it.
//!
//! What it does not cover: a give-back is rare (a store stuck for most of the dedup window, or
//! `poison: nack`), and then order holds only for messages sluice reads within
//! [`REGIVE_GRACE`] of it: a message of the key that waited longer in the client's buffer (the
//! flow's budget full) can commit before the given-back one returns. Lanes are fed in turn, so
//! a lane that retries holds the others back once its queue is full. A stream-style library
//! job (`JobStream`) commits its batches in the order its caller commits them, without lanes,
//! and a scheduled run's kept-open source starts each run's lanes afresh.

use crate::flow::batch::Batch;
use crate::flow::commit::{CommitReport, CommitThenAck};
use crate::flow::delivery::Delivery;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How long after a give-back a lane gives back what it received (messages of the key that
/// were already on their way when it was given back).
pub(crate) const REGIVE_GRACE: Duration = Duration::from_secs(2);

/// Where the flow's batches go.
pub(crate) enum Dispatch {
    /// One queue shared by every committer task.
    Shared(mpsc::Sender<Batch>),
    /// One queue per lane.
    Lanes(Vec<mpsc::Sender<Batch>>),
}

impl Dispatch {
    /// Hands a batch over (split into lanes when ordered); `false` once the tasks are gone.
    pub(crate) async fn send(&self, batch: Batch) -> bool {
        match self {
            Dispatch::Shared(queue) => queue.send(batch).await.is_ok(),
            Dispatch::Lanes(lanes) => {
                let parts = batch.into_lanes(lanes.len(), lane_of);
                for (part, lane) in parts.into_iter().zip(lanes) {
                    if !part.is_empty() && lane.send(part).await.is_err() {
                        return false;
                    }
                }
                true
            }
        }
    }
}

/// A delivery's lane number before the modulo: its ordering key's hash, else its dedup key's.
fn lane_of(delivery: &Delivery) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    match &delivery.ordering_key {
        Some(key) => key.hash(&mut hasher),
        None => delivery.key.as_str().hash(&mut hasher),
    }
    // Truncation is fine: only the remainder matters.
    hasher.finish() as usize
}

/// Starts `count` committer tasks (at least one): sharing one queue of `queue` batches, or,
/// `ordered`, one lane each.
pub(crate) fn start(
    committer: Arc<CommitThenAck>,
    count: usize,
    ordered: bool,
    queue: usize,
) -> (Dispatch, JoinSet<CommitReport>) {
    let count = count.max(1);
    let mut tasks = JoinSet::new();
    if ordered {
        let mut lanes = Vec::with_capacity(count);
        for _ in 0..count {
            let (send, parts) = mpsc::channel(queue);
            lanes.push(send);
            tasks.spawn(run_lane(committer.clone(), parts));
        }
        return (Dispatch::Lanes(lanes), tasks);
    }
    let (send, ready) = mpsc::channel(queue + count);
    let ready = Arc::new(Mutex::new(ready));
    for _ in 0..count {
        let (ready, committer) = (ready.clone(), committer.clone());
        tasks.spawn(async move {
            let mut report = CommitReport::default();
            loop {
                // The lock is held only while waiting for the next batch, not while
                // committing it.
                let next = ready.lock().await.recv().await;
                let Some(batch) = next else { break };
                report += committer.process(batch).await;
            }
            report
        });
    }
    (Dispatch::Shared(send), tasks)
}

/// One lane: its parts committed one after another (see the module docs).
async fn run_lane(committer: Arc<CommitThenAck>, mut parts: mpsc::Receiver<Batch>) -> CommitReport {
    let mut report = CommitReport::default();
    let mut regive_before: Option<Instant> = None;
    while let Some(part) = parts.recv().await {
        if let (Some(until), Some(oldest)) = (regive_before, part.oldest_received())
            && oldest <= until.into_std()
        {
            let count = part.len() as u64;
            tracing::warn!(
                batch = part.id,
                count,
                "giving back what came after a given-back message of the same lane, so that \
                 its ordering keys stay in order"
            );
            part.abandon();
            report.abandoned += count;
            continue;
        }
        let done = committer.process(part).await;
        if done.abandoned > 0 {
            regive_before = Some(Instant::now() + REGIVE_GRACE);
        }
        report += done;
    }
    report
}
