//! A source kept running across the runs of a scheduled pipeline, so that a run that follows
//! soon after another reads the same streams instead of opening new ones.
//!
//! A Pub/Sub run that ends closes its streams, and what was delivered to them while they
//! closed comes back only after their ack deadline; the emulator as shipped also holds back
//! from a new stream what it dispatched to the closed ones, for the same deadline or much longer
//! (a fault of its jar: docs/architecture-notes.md, "Pub/Sub client facts"). A run that opens new streams soon after the last one closed can then find its
//! subscription idle while messages published before its fire are still held back, and end
//! without them. [`KeptOpen`] starts the real source once and hands each run a view of it:
//!
//! * **Nothing is lost or acked between runs.** What arrives between two runs waits in the
//!   kept source's channel, its leases extended by the client, bounded by the budget it was
//!   started with (what the channel holds keeps its permits), and goes to the next run first.
//!   A message a run's view had taken when the run stopped is kept for the next run too.
//! * **A run ends as before**: its view stops handing over when the run stops (idle, or a
//!   drain) and closes the run's intake; the runner commits and acks what it was given.
//! * [`KeptOpen::close`] stops the real source: what it still holds is nacked, to be
//!   redelivered promptly (a worker that stops, or a schedule whose next fire is far off).

use crate::flow::budget::Budget;
use crate::source::{
    INTAKE_CAPACITY, IdleCheck, MessageSource, Received, SourceError, SourceHandle,
};
use async_trait::async_trait;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

/// A source kept running across runs; clones share it.
#[derive(Clone, Default)]
pub struct KeptOpen {
    open: Arc<Mutex<Option<Open>>>,
}

/// The real source while it runs.
struct Open {
    handle: Box<dyn SourceHandle>,
    intake: mpsc::Receiver<Received>,
    stop: CancellationToken,
    /// Taken from the intake by a run that stopped before it could hand them over.
    kept: VecDeque<Received>,
}

impl KeptOpen {
    /// Nothing open yet: the first run starts the real source.
    pub fn new() -> Self {
        Self::default()
    }

    /// The source of one run: the kept one, or `real` started now if none runs.
    pub fn for_run(&self, real: Box<dyn MessageSource>) -> Box<dyn MessageSource> {
        Box::new(RunView {
            open: self.open.clone(),
            real,
        })
    }

    /// Whether the real source runs.
    pub async fn is_open(&self) -> bool {
        self.open.lock().await.is_some()
    }

    /// Keeps `later` (in the order they were handed over) for the next run, first: they were
    /// handed over before anything the kept source still holds. Nacked when the real source
    /// is not running (closed meanwhile).
    pub async fn keep(&self, later: Vec<Received>) {
        match self.open.lock().await.as_mut() {
            Some(open) => {
                for received in later.into_iter().rev() {
                    open.kept.push_front(received);
                }
            }
            None => {
                for received in later {
                    received.handle.nack();
                }
            }
        }
    }

    /// Stops the real source, nacking what it holds, and waits until it has shut down.
    pub async fn close(&self) {
        let Some(mut open) = self.open.lock().await.take() else {
            return;
        };
        open.stop.cancel();
        open.kept.clear();
        // Nacked as they are dropped; the channel closes once the source's tasks ended.
        while open.intake.recv().await.is_some() {}
        open.handle.close().await;
    }
}

/// One run's view of a kept source.
struct RunView {
    open: Arc<Mutex<Option<Open>>>,
    real: Box<dyn MessageSource>,
}

#[async_trait]
impl MessageSource for RunView {
    async fn start(
        self: Box<Self>,
        intake: mpsc::Sender<Received>,
        budget: Budget,
        stop: CancellationToken,
    ) -> Result<Box<dyn SourceHandle>, SourceError> {
        let mut guard = self.open.clone().lock_owned().await;
        if guard.is_none() {
            let (tx, rx) = mpsc::channel(INTAKE_CAPACITY);
            let source_stop = CancellationToken::new();
            let handle = self.real.start(tx, budget, source_stop.clone()).await?;
            *guard = Some(Open {
                handle,
                intake: rx,
                stop: source_stop,
                kept: VecDeque::new(),
            });
        }
        let ordered = guard.as_ref().is_some_and(|open| open.handle.ordered());
        let idle_check = guard.as_mut().and_then(|open| open.handle.idle_check());
        let forwarder = tokio::spawn(async move {
            let Some(open) = guard.as_mut() else {
                return;
            };
            hand_over(open, &intake, &stop).await;
            // Dropping `intake` here closes the run's channel: the run ends once it settled
            // what it was given; the guard goes with the task, for the next run.
        });
        Ok(Box::new(ViewHandle {
            forwarder,
            ordered,
            idle_check,
        }))
    }
}

/// Hands the kept source's messages to one run's intake until the run stops or the source ends.
async fn hand_over(open: &mut Open, intake: &mpsc::Sender<Received>, stop: &CancellationToken) {
    loop {
        let next = match open.kept.pop_front() {
            Some(kept) => kept,
            None => tokio::select! {
                biased;
                () = stop.cancelled() => return,
                next = open.intake.recv() => match next {
                    Some(next) => next,
                    None => return,
                },
            },
        };
        if stop.is_cancelled() {
            open.kept.push_front(next);
            return;
        }
        if let Err(refused) = intake.send(next).await {
            // The run stopped reading: kept for the next one.
            open.kept.push_front(refused.0);
            return;
        }
    }
}

/// A run's view, running.
struct ViewHandle {
    forwarder: tokio::task::JoinHandle<()>,
    ordered: bool,
    /// The kept source's, asked by each run that ends when idle.
    idle_check: Option<Box<dyn IdleCheck>>,
}

#[async_trait]
impl SourceHandle for ViewHandle {
    fn ordered(&self) -> bool {
        self.ordered
    }

    fn idle_check(&mut self) -> Option<Box<dyn IdleCheck>> {
        self.idle_check.take()
    }

    async fn close(self: Box<Self>) {
        // The view ends when its run stops; the kept source goes on.
        let _ = self.forwarder.await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::source::inprocess::InProcessSource;

    /// Two runs over one kept source: the second gets what the first did not take, and the
    /// source was started once.
    #[tokio::test]
    async fn runs_share_one_source_and_nothing_is_left_behind() {
        let kept = KeptOpen::new();
        let mut seen = Vec::new();
        for run in 0..2 {
            let source = kept.for_run(Box::new(InProcessSource::generated(10, 8, |i| {
                i.to_string()
            })));
            let (tx, mut rx) = mpsc::channel(4);
            let stop = CancellationToken::new();
            let handle = source
                .start(tx, Budget::new(100, u64::MAX), stop.clone())
                .await
                .unwrap();
            // The first run takes 4 messages, then stops; the second takes the rest.
            let until = if run == 0 { 4 } else { 10 };
            while seen.len() < until {
                let received = rx.recv().await.unwrap();
                seen.push(received.message.message_id.clone());
                received.handle.ack();
            }
            stop.cancel();
            while let Some(received) = rx.recv().await {
                seen.push(received.message.message_id.clone());
                received.handle.ack();
            }
            handle.close().await;
            assert!(kept.is_open().await);
        }
        assert_eq!(seen.len(), 10, "started once: {seen:?}");
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 10, "every message once: {seen:?}");
        kept.close().await;
        assert!(!kept.is_open().await);
    }

    /// A source whose running handle asks its service before it counts as idle.
    struct Asking;
    struct AskingHandle;
    struct NoAnswer;

    #[async_trait]
    impl IdleCheck for NoAnswer {
        async fn confirm_idle(&mut self) -> Result<bool, SourceError> {
            Ok(false)
        }
        fn messages_came(&mut self) {}
    }

    #[async_trait]
    impl SourceHandle for AskingHandle {
        async fn close(self: Box<Self>) {}
        fn idle_check(&mut self) -> Option<Box<dyn IdleCheck>> {
            Some(Box::new(NoAnswer))
        }
    }

    #[async_trait]
    impl MessageSource for Asking {
        async fn start(
            self: Box<Self>,
            _intake: mpsc::Sender<Received>,
            _budget: Budget,
            _stop: CancellationToken,
        ) -> Result<Box<dyn SourceHandle>, SourceError> {
            Ok(Box::new(AskingHandle))
        }
    }

    /// Each run's view asks what the kept source asks before it counts as idle (a scheduled
    /// run must not take a Pub/Sub outage for an empty subscription).
    #[tokio::test]
    async fn each_run_asks_the_kept_sources_idle_check() {
        let kept = KeptOpen::new();
        for _ in 0..2 {
            let stop = CancellationToken::new();
            let (tx, _rx) = mpsc::channel(4);
            let mut handle = kept
                .for_run(Box::new(Asking))
                .start(tx, Budget::new(100, u64::MAX), stop.clone())
                .await
                .unwrap();
            let mut check = handle.idle_check().expect("the kept source's check");
            assert!(!check.confirm_idle().await.unwrap());
            stop.cancel();
            handle.close().await;
        }
        kept.close().await;
    }
}
