//! A scheduled run's Pub/Sub source that stops at the end of the run's data interval: messages
//! published at or after it are left for a later run.
//!
//! Guarantees:
//! * **Nothing published after the end is committed by this run.** Each message's Pub/Sub
//!   publish time is compared with the interval's end; one at or after it is held, unacked, its
//!   lease extended by the client, and never handed to the run. It does not count as activity,
//!   so the run still ends when nothing of its interval came for its idle time.
//! * **Nothing is lost or acked by the cut.** When the run's source closes, what was held (and
//!   what was on its way to the run) goes back: to the front of the kept source's queue for the
//!   next run when the streams are kept open between runs ([`KeptOpen::keep`]), else nacked
//!   before the streams close, to be redelivered (one more delivery attempt, which a
//!   subscription's dead-letter policy counts).
//!
//! Bound: Pub/Sub delivers out of publish order, so a message of the interval that arrives
//! after the run found its source idle is read by the next run, not this one (once, as every
//! message). Held messages take budget permits: a run that holds the whole budget gets
//! nothing more and ends when idle.

use crate::flow::budget::Budget;
use crate::source::kept_open::KeptOpen;
use crate::source::{
    INTAKE_CAPACITY, IdleCheck, MessageSource, Received, SourceError, SourceHandle,
};
use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A source whose run reads only what was published before `end_ms`.
pub struct PublishedBefore {
    inner: Box<dyn MessageSource>,
    end_ms: i64,
    kept: Option<KeptOpen>,
    labels: [(&'static str, String); 2],
}

impl PublishedBefore {
    /// `inner`, cut at `end_ms` (publish time, ms); what is held goes back to `kept` when the
    /// run reads a kept source, else it is nacked. Deferred messages are counted as
    /// `sluice_messages_deferred_total{pipeline, flow}`.
    pub fn new(
        inner: Box<dyn MessageSource>,
        end_ms: i64,
        kept: Option<KeptOpen>,
        pipeline: &str,
        flow: &str,
    ) -> Self {
        Self {
            inner,
            end_ms,
            kept,
            labels: [("pipeline", pipeline.to_owned()), ("flow", flow.to_owned())],
        }
    }
}

#[async_trait]
impl MessageSource for PublishedBefore {
    async fn start(
        self: Box<Self>,
        intake: mpsc::Sender<Received>,
        budget: Budget,
        stop: CancellationToken,
    ) -> Result<Box<dyn SourceHandle>, SourceError> {
        let (tx, mut rx) = mpsc::channel(INTAKE_CAPACITY);
        let mut inner = self.inner.start(tx, budget, stop.clone()).await?;
        let end_ms = self.end_ms;
        let deferred = metrics::counter!("sluice_messages_deferred_total", &self.labels);
        let cut = stop.child_token();
        let forwarding = cut.clone();
        let forwarder = tokio::spawn(async move {
            let mut later = Vec::new();
            loop {
                let next = tokio::select! {
                    biased;
                    () = forwarding.cancelled() => {
                        // What was on its way goes back with what was held.
                        while let Ok(received) = rx.try_recv() {
                            later.push(received);
                        }
                        break;
                    }
                    next = rx.recv() => next,
                };
                let Some(received) = next else { break };
                if received.message.publish_time_ms >= end_ms {
                    deferred.increment(1);
                    later.push(received);
                } else if intake.send(received).await.is_err() {
                    break;
                }
            }
            later
        });
        Ok(Box::new(Cut {
            ordered: inner.ordered(),
            idle_check: inner.idle_check(),
            inner,
            cut,
            forwarder,
            kept: self.kept,
        }))
    }
}

/// A cut source, running.
struct Cut {
    inner: Box<dyn SourceHandle>,
    cut: CancellationToken,
    forwarder: tokio::task::JoinHandle<Vec<Received>>,
    kept: Option<KeptOpen>,
    ordered: bool,
    idle_check: Option<Box<dyn IdleCheck>>,
}

#[async_trait]
impl SourceHandle for Cut {
    fn ordered(&self) -> bool {
        self.ordered
    }

    fn idle_check(&mut self) -> Option<Box<dyn IdleCheck>> {
        self.idle_check.take()
    }

    async fn close(self: Box<Self>) {
        self.cut.cancel();
        let later = self.forwarder.await.unwrap_or_default();
        match self.kept {
            Some(kept) => {
                // The run's view gives the kept source back when it closes.
                self.inner.close().await;
                kept.keep(later).await;
            }
            None => {
                // Nacked while the streams are open, so they come back promptly.
                for received in later {
                    received.handle.nack();
                }
                self.inner.close().await;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::SourceMessage;
    use crate::source::inprocess::InProcessSource;
    use std::sync::atomic::Ordering;

    fn published_at(times: &[i64]) -> InProcessSource {
        InProcessSource::new(
            times
                .iter()
                .map(|&publish_time_ms| SourceMessage {
                    message_id: publish_time_ms.to_string(),
                    publish_time_ms,
                    attributes: Default::default(),
                    data: Default::default(),
                    event_time_ms: None,
                    problem: None,
                })
                .collect(),
        )
    }

    #[tokio::test]
    async fn only_what_was_published_before_the_end_is_handed_over() {
        let source = published_at(&[100, 250, 199, 300, 50]);
        let tally = source.tally();
        let cut = PublishedBefore::new(Box::new(source), 200, None, "p", "f");
        let (tx, mut rx) = mpsc::channel(16);
        let stop = CancellationToken::new();
        let handle = Box::new(cut)
            .start(tx, Budget::new(100, u64::MAX / 2), stop.clone())
            .await
            .unwrap();
        let mut handed = Vec::new();
        for _ in 0..3 {
            let received = rx.recv().await.unwrap();
            handed.push(received.message.publish_time_ms);
            received.handle.ack();
        }
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(200), rx.recv())
                .await
                .is_err(),
            "nothing after the end is handed over"
        );
        stop.cancel();
        drop(rx);
        handle.close().await;
        handed.sort_unstable();
        assert_eq!(handed, [50, 100, 199]);
        assert_eq!(tally.acked.load(Ordering::Relaxed), 3);
        assert_eq!(
            tally.nacked.load(Ordering::Relaxed),
            2,
            "what was held is given back"
        );
    }
}
