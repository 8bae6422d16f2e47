//! An in-process source of generated messages, behind the same seam as Pub/Sub.
//!
//! It exists to measure sluice's own capacity without the emulator in the way (dedup, batching,
//! commit, ack) and to drive tests of faults the emulator cannot produce. Its acks and nacks are
//! counted in an [`InProcessTally`].

use crate::flow::budget::Budget;
use crate::flow::delivery::{AckHandle, SourceMessage};
use crate::source::SourceError;
use crate::source::{MessageSource, Received, SourceHandle};
use async_trait::async_trait;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Messages delivered together by a paced [`InProcessSource`] ([`InProcessSource::with_rate`]).
pub const PACE_STEP: usize = 50;

/// Acks and nacks received by an [`InProcessSource`]'s messages.
#[derive(Debug, Default)]
pub struct InProcessTally {
    /// Messages acked.
    pub acked: AtomicU64,
    /// Messages nacked.
    pub nacked: AtomicU64,
    /// Handles dropped without an ack or a nack (sluice never should: a dropped Pub/Sub handler
    /// is nacked by the client, but it would mean a key left unsettled).
    pub dropped: AtomicU64,
}

/// Delivers a fixed list of messages once each, as fast as the budget allows, then stays open
/// and empty until stopped, as a drained subscription does.
pub struct InProcessSource {
    messages: Vec<SourceMessage>,
    /// How long to wait before delivering each message (missing: no wait).
    gaps: Vec<std::time::Duration>,
    /// Messages per second at most, counted from the start (`None`: as fast as it can).
    rate: Option<f64>,
    tally: Arc<InProcessTally>,
}

impl InProcessSource {
    /// A source that will deliver exactly these messages, in order, once each.
    pub fn new(messages: Vec<SourceMessage>) -> Self {
        Self {
            messages,
            gaps: Vec::new(),
            rate: None,
            tally: Arc::new(InProcessTally::default()),
        }
    }

    /// Delivers at most `per_second` messages a second, in steps of [`PACE_STEP`] messages,
    /// on a clock started with the source (a late step is not made up by a burst beyond it).
    pub fn with_rate(mut self, per_second: f64) -> Self {
        self.rate = Some(per_second).filter(|r| *r > 0.0);
        self
    }

    /// Waits `gaps[i]` before delivering message `i` (for tests of timing: a redelivery that
    /// comes after a window ended).
    pub fn with_gaps(mut self, gaps: Vec<std::time::Duration>) -> Self {
        self.gaps = gaps;
        self
    }

    /// `count` messages with ids `m0..`, `payload_size` bytes each, and an attribute `key`
    /// from `key_of(i)`.
    pub fn generated(count: usize, payload_size: usize, key_of: impl Fn(usize) -> String) -> Self {
        let payload = Bytes::from(vec![b'x'; payload_size]);
        let now = crate::time::now_ms();
        Self::new(
            (0..count)
                .map(|i| SourceMessage {
                    message_id: format!("m{i}"),
                    publish_time_ms: now,
                    attributes: BTreeMap::from([("key".to_owned(), key_of(i))]),
                    data: payload.clone(),
                    event_time_ms: None,
                    problem: None,
                })
                .collect(),
        )
    }

    /// Messages it will deliver.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether it has no message to deliver.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The tally its handles report to.
    pub fn tally(&self) -> Arc<InProcessTally> {
        self.tally.clone()
    }
}

#[async_trait]
impl MessageSource for InProcessSource {
    async fn start(
        self: Box<Self>,
        intake: mpsc::Sender<Received>,
        budget: Budget,
        stop: CancellationToken,
    ) -> Result<Box<dyn SourceHandle>, SourceError> {
        let task_stop = stop.clone();
        let tally = self.tally.clone();
        let task = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            for (i, message) in self.messages.into_iter().enumerate() {
                if let Some(rate) = self.rate
                    && i % PACE_STEP == 0
                {
                    let due = started + std::time::Duration::from_secs_f64(i as f64 / rate);
                    tokio::select! {
                        _ = task_stop.cancelled() => return,
                        _ = tokio::time::sleep_until(due) => {}
                    }
                }
                if let Some(gap) = self.gaps.get(i) {
                    tokio::select! {
                        _ = task_stop.cancelled() => return,
                        _ = tokio::time::sleep(*gap) => {}
                    }
                }
                let permit = tokio::select! {
                    _ = task_stop.cancelled() => return,
                    permit = budget.reserve_message() => permit,
                };
                let Some(permit) = permit else { return };
                let permits = budget.reserve_bytes(permit, message.size()).await;
                let handle = Box::new(InProcessAck {
                    tally: tally.clone(),
                    settled: false,
                });
                if intake
                    .send(Received::new(message, handle, permits))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            // Like a subscription, the source stays open (empty) until it is stopped.
            task_stop.cancelled().await;
        });
        Ok(Box::new(RunningInProcess { stop, task }))
    }
}

struct RunningInProcess {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

#[async_trait]
impl SourceHandle for RunningInProcess {
    async fn close(self: Box<Self>) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The ack handle of an in-process message.
pub struct InProcessAck {
    tally: Arc<InProcessTally>,
    settled: bool,
}

impl AckHandle for InProcessAck {
    fn ack(mut self: Box<Self>) {
        self.settled = true;
        self.tally.acked.fetch_add(1, Ordering::Relaxed);
    }

    fn nack(mut self: Box<Self>) {
        self.settled = true;
        self.tally.nacked.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for InProcessAck {
    fn drop(&mut self) {
        if !self.settled {
            self.tally.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
