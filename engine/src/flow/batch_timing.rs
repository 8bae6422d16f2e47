//! The batcher's timing on tokio's paused clock: a batch closes when it is full or
//! `max_delay` after its first message, whichever comes first, and an empty intake counts as
//! drained after the idle time only while no key is in flight. The clock is paused, so each
//! test states instants exactly and takes no real time.

use crate::flow::batcher::{BatchSettings, BatchSource, DedupSettings, Idle, KeySource};
use crate::flow::budget::Budget;
use crate::flow::delivery::{AckHandle, SourceMessage};
use crate::source::Received;
use crate::telemetry::Counters;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};

/// Counts the nacks it is given (acks are not expected here).
struct CountedNack(Arc<AtomicUsize>);

impl AckHandle for CountedNack {
    fn ack(self: Box<Self>) {}
    fn nack(self: Box<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Rig {
    intake: mpsc::Sender<Received>,
    budget: Budget,
    nacks: Arc<AtomicUsize>,
}

impl Rig {
    fn new(max_messages: usize, max_delay: Duration) -> (Self, BatchSource) {
        let (intake, receiver) = mpsc::channel(64);
        let batcher = BatchSource::new(
            receiver,
            DedupSettings {
                key: KeySource::MessageId,
                window: Duration::from_secs(600),
            },
            BatchSettings {
                max_messages,
                max_delay,
            },
            Counters::new("test", "batch_timing"),
        );
        let rig = Self {
            intake,
            budget: Budget::new(100, 1 << 20),
            nacks: Arc::new(AtomicUsize::new(0)),
        };
        (rig, batcher)
    }

    async fn send(&self, id: &str) {
        let permit = self.budget.reserve_message().await.expect("budget open");
        let permits = self.budget.reserve_bytes(permit, 1).await;
        let message = SourceMessage {
            message_id: id.to_owned(),
            publish_time_ms: 0,
            attributes: Default::default(),
            data: bytes::Bytes::from_static(b"x"),
            event_time_ms: None,
            problem: None,
        };
        let handle = Box::new(CountedNack(self.nacks.clone()));
        let sent = self.intake.send(Received::new(message, handle, permits));
        assert!(sent.await.is_ok(), "the batcher is gone");
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_closes_max_delay_after_its_first_message() {
    let (rig, mut batcher) = Rig::new(100, Duration::from_millis(50));
    let start = Instant::now();
    rig.send("a").await;
    let late = async {
        sleep(Duration::from_millis(30)).await;
        rig.send("b").await;
        sleep(Duration::from_millis(50)).await;
        rig.send("c").await;
    };
    let (batch, ()) = tokio::join!(batcher.next_batch(), late);
    let batch = batch.expect("a batch");
    // Closed at 50 ms with what came by then; "c" (at 80 ms) starts the next batch.
    assert_eq!(batch.len(), 2);
    assert_eq!(start.elapsed(), Duration::from_millis(80));
    let next = batcher.next_batch().await.expect("the next batch");
    assert_eq!(next.len(), 1);
    assert_eq!(start.elapsed(), Duration::from_millis(130));
    batch.abandon();
    next.abandon();
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_closes_at_once() {
    let (rig, mut batcher) = Rig::new(3, Duration::from_secs(10));
    let start = Instant::now();
    for id in ["a", "b", "c", "d"] {
        rig.send(id).await;
    }
    let batch = batcher.next_batch().await.expect("a batch");
    assert_eq!((batch.len(), start.elapsed()), (3, Duration::ZERO));
    batch.abandon();
    assert_eq!(rig.nacks.load(Ordering::SeqCst), 3, "abandoning nacks");
}

#[tokio::test(start_paused = true)]
async fn an_empty_intake_is_idle_after_the_idle_time_only_with_no_key_in_flight() {
    let idle = Duration::from_millis(200);
    let (rig, mut batcher) = Rig::new(10, Duration::from_millis(5));
    let start = Instant::now();
    assert_eq!(batcher.next_batch_or_idle(idle).await.err(), Some(Idle));
    assert_eq!(start.elapsed(), idle);

    rig.send("a").await;
    let held = batcher
        .next_batch_or_idle(idle)
        .await
        .expect("not idle")
        .expect("a batch");
    // A batch in flight (committing) holds a key: an empty intake is not drained meanwhile.
    let start = Instant::now();
    let waiting = tokio::time::timeout(Duration::from_secs(5), batcher.next_batch_or_idle(idle));
    assert!(waiting.await.is_err(), "idle while a key was in flight");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    held.abandon();
    let start = Instant::now();
    assert_eq!(batcher.next_batch_or_idle(idle).await.err(), Some(Idle));
    assert_eq!(start.elapsed(), idle);
}
