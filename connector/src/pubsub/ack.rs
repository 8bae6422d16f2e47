//! Acks of Pub/Sub deliveries, sent only after their commit (`commit.rs`).
//!
//! # Guarantees
//!
//! * On a subscription with exactly-once delivery enabled the client hands out
//!   [`Handler::ExactlyOnce`] handlers, and the ack is a *confirmed* ack: Pub/Sub answers
//!   whether it took it. One that is not confirmed (the lease expired first, the RPC failed,
//!   the stream shut down) is counted in `sluice_ack_failures_total{subscription,reason}` and
//!   logged; Pub/Sub then delivers the message again and the ledger finds it committed, so
//!   nothing is written twice. A confirmed ack means Pub/Sub will not redeliver it.
//! * On other subscriptions an ack is best effort (the client drops its RPC errors), and the
//!   ledger makes a redelivery harmless, as always.
//! * A nack gives the message back at once in both cases.

use crate::delivery::AckHandle;
use google_cloud_pubsub::error::AckError;
use google_cloud_pubsub::subscriber::handler::Handler;
use std::sync::Arc;

/// The reasons `sluice_ack_failures_total` counts.
pub const ACK_FAILURE_REASONS: [&str; 4] = ["lease_expired", "rpc", "shutdown", "other"];

/// The ack handle of one Pub/Sub delivery.
pub(crate) struct PubSubAck {
    pub(crate) handler: Handler,
    pub(crate) subscription: Arc<str>,
}

impl AckHandle for PubSubAck {
    fn ack(self: Box<Self>) {
        let PubSubAck {
            handler,
            subscription,
        } = *self;
        match (handler, tokio::runtime::Handle::try_current()) {
            (Handler::ExactlyOnce(handler), Ok(runtime)) => {
                runtime.spawn(async move {
                    if let Err(error) = handler.confirmed_ack().await {
                        ack_failed(&subscription, &error);
                    }
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
fn ack_failed(subscription: &str, error: &AckError) {
    let reason = match error {
        AckError::LeaseExpired => "lease_expired",
        AckError::Rpc { .. } => "rpc",
        AckError::ShutdownBeforeAck => "shutdown",
        _ => "other",
    };
    metrics::counter!("sluice_ack_failures_total",
        "subscription" => subscription.to_owned(), "reason" => reason)
    .increment(1);
    tracing::warn!(%subscription, reason, %error,
        "Pub/Sub did not confirm an ack; the message comes back and the ledger drops it");
}

/// Makes `sluice_ack_failures_total` exist at 0 for every reason of `subscription`, so that
/// rates and alerts have a series before the first failure.
pub(crate) fn register_ack_failures(subscription: &str) {
    for reason in ACK_FAILURE_REASONS {
        metrics::counter!("sluice_ack_failures_total",
            "subscription" => subscription.to_owned(), "reason" => reason)
        .increment(0);
    }
}
