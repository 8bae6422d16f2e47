//! Acks of Pub/Sub deliveries, sent only after their commit (`commit.rs`).
//!
//! # Guarantees
//!
//! * On a subscription with exactly-once delivery enabled the client hands out
//!   [`Handler::ExactlyOnce`] handlers, and the ack is a *confirmed* ack: Pub/Sub answers
//!   whether it took it. One that is not confirmed (the lease expired first, the RPC failed,
//!   the stream shut down) is counted in
//!   `sluice_ack_failures_total{pipeline,flow,subscription,reason}` and
//!   logged; Pub/Sub then delivers the message again and the ledger finds it committed, so
//!   nothing is written twice. A confirmed ack means Pub/Sub will not redeliver it.
//! * On other subscriptions an ack is best effort (the client drops its RPC errors), and the
//!   ledger makes a redelivery harmless, as always.
//! * A nack gives the message back at once in both cases.
//! * A source with an ack fence (`ack_fence.rs`) asks it first: an ack it withholds becomes a
//!   nack, counted in `sluice_acks_withheld_total{pipeline,flow,subscription}`.
//! * Confirmed acks still waiting for Pub/Sub's answer are waited for (up to the flush timeout)
//!   when the source closes, before its streams shut down: a drain's last acks are sent.

use crate::flow::ack_fence::AckFence;
use crate::flow::delivery::AckHandle;
use google_cloud_pubsub::error::AckError;
use google_cloud_pubsub::subscriber::handler::Handler;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

/// The reasons `sluice_ack_failures_total` counts: the lease expired first, the RPC failed,
/// the stream shut down before the ack was sent, the stream shut down with its result unknown.
pub const ACK_FAILURE_REASONS: [&str; 5] = ["lease_expired", "rpc", "shutdown", "unknown", "other"];

/// Confirmed acks sent and not answered yet, for a source's close to wait for.
#[derive(Debug, Default)]
pub(crate) struct PendingAcks {
    count: AtomicUsize,
    idle: Notify,
}

impl PendingAcks {
    /// Waits until every confirmed ack sent so far has its answer.
    pub(crate) async fn settled(&self) {
        loop {
            let idle = self.idle.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    fn done(&self) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }
}

/// The labels of a source's ack metrics: its pipeline and flow (empty when the source was
/// not given them), and its subscription.
#[derive(Debug, Clone, Default)]
pub(crate) struct AckLabels {
    pub(crate) pipeline: String,
    pub(crate) flow: String,
    pub(crate) subscription: String,
}

impl AckLabels {
    fn withheld(&self) -> metrics::Counter {
        metrics::counter!("sluice_acks_withheld_total",
            "pipeline" => self.pipeline.clone(), "flow" => self.flow.clone(),
            "subscription" => self.subscription.clone())
    }

    fn failures(&self, reason: &'static str) -> metrics::Counter {
        metrics::counter!("sluice_ack_failures_total",
            "pipeline" => self.pipeline.clone(), "flow" => self.flow.clone(),
            "subscription" => self.subscription.clone(), "reason" => reason)
    }
}

/// The ack handle of one Pub/Sub delivery.
pub(crate) struct PubSubAck {
    pub(crate) handler: Handler,
    pub(crate) labels: Arc<AckLabels>,
    pub(crate) pending: Arc<PendingAcks>,
    pub(crate) fence: Option<Arc<dyn AckFence>>,
}

impl AckHandle for PubSubAck {
    fn ack(self: Box<Self>) {
        let PubSubAck {
            handler,
            labels,
            pending,
            fence,
        } = *self;
        if fence.is_some_and(|fence| !fence.acks_allowed()) {
            labels.withheld().increment(1);
            handler.nack();
            return;
        }
        match (handler, tokio::runtime::Handle::try_current()) {
            (Handler::ExactlyOnce(handler), Ok(runtime)) => {
                pending.count.fetch_add(1, Ordering::AcqRel);
                runtime.spawn(async move {
                    if let Err(error) = handler.confirmed_ack().await {
                        ack_failed(&labels, &error);
                    }
                    pending.done();
                });
            }
            (handler, _) => handler.ack(),
        }
    }

    fn nack(self: Box<Self>) {
        self.handler.nack();
    }
}

/// Counts and logs an ack Pub/Sub did not confirm.
fn ack_failed(labels: &AckLabels, error: &AckError) {
    let reason = match error {
        AckError::LeaseExpired => "lease_expired",
        AckError::Rpc { .. } => "rpc",
        AckError::ShutdownBeforeAck => "shutdown",
        AckError::Shutdown(_) => "unknown",
        _ => "other",
    };
    labels.failures(reason).increment(1);
    tracing::warn!(subscription = %labels.subscription, reason, %error,
        "Pub/Sub did not confirm an ack; the message comes back and the ledger drops it");
}

/// Makes `sluice_ack_failures_total` exist at 0 for every reason of a source, so that rates
/// and alerts have a series before the first failure.
pub(crate) fn register_ack_failures(labels: &AckLabels) {
    for reason in ACK_FAILURE_REASONS {
        labels.failures(reason).increment(0);
    }
    labels.withheld().increment(0);
}
