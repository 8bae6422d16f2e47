//! Whether Pub/Sub answers for a subscription. Asked before a source starts (waited for with
//! backoff, for at most a triggered run's `give_up_after`) and again each time a run that ends
//! when idle has had no message for its idle period: guarantee, an outage is never taken for a
//! drained subscription; such a run waits for an answer, and fails once `give_up_after` has
//! passed since the first question that went unanswered with no message since.

use super::{Admin, PubSubConfig};
use crate::backoff::Backoff;
use crate::source::{IdleCheck, SourceError};
use async_trait::async_trait;
use google_cloud_pubsub::model::Subscription;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long one "does the subscription exist" question may take before it counts as a failure.
const QUESTION_TIMEOUT: Duration = Duration::from_secs(3);

/// The questions about one subscription, and since when they go unanswered.
#[derive(Debug, Clone)]
pub(super) struct Reachability {
    config: PubSubConfig,
    subscription: String,
    give_up_after: Option<Duration>,
    unanswered_since: Option<Instant>,
}

impl Reachability {
    pub(super) fn new(
        config: PubSubConfig,
        subscription: String,
        give_up_after: Option<Duration>,
    ) -> Self {
        Self {
            config,
            subscription,
            give_up_after,
            unanswered_since: None,
        }
    }

    fn endpoint(&self) -> String {
        self.config
            .endpoint()
            .unwrap_or_else(|| "https://pubsub.googleapis.com".to_owned())
    }

    /// Asks once. `Err(Ok(error))`: no answer (worth asking again); `Err(Err(error))`: an
    /// answer no retry changes (the subscription is missing, or the identity refused).
    async fn ask(&self) -> Result<Subscription, Result<SourceError, SourceError>> {
        let asked = tokio::time::timeout(QUESTION_TIMEOUT, async {
            Admin::connect(&self.config)
                .await?
                .subscription(&self.subscription)
                .await
        });
        match asked.await {
            Ok(Ok(Some(found))) => Ok(found),
            Ok(Ok(None)) => Err(Err(SourceError::Missing(format!(
                "subscription {} does not exist at {}: create it (gcloud pubsub subscriptions \
                 create SUBSCRIPTION --topic TOPIC), or fix the flow's `subscription` or the \
                 pipeline's `pubsub` settings",
                self.subscription,
                self.endpoint()
            )))),
            Ok(Err(refused @ SourceError::Refused(_))) => Err(Err(refused)),
            Ok(Err(error)) => Err(Ok(error)),
            Err(_) => Err(Ok(SourceError::Rpc(format!(
                "no answer from {} within {QUESTION_TIMEOUT:?}",
                self.endpoint()
            )))),
        }
    }

    /// Notes a question that went unanswered: `GaveUp` once the patience is spent.
    fn unanswered(&mut self, error: SourceError) -> Result<SourceError, SourceError> {
        let since = *self.unanswered_since.get_or_insert_with(Instant::now);
        match self.give_up_after {
            Some(limit) if since.elapsed() >= limit => Err(SourceError::GaveUp(format!(
                "Pub/Sub at {} unreachable for {}s, giving up (give_up_after): {error}",
                self.endpoint(),
                limit.as_secs()
            ))),
            _ => Ok(error),
        }
    }

    /// Asks until Pub/Sub answers, retrying with backoff (one log line per step); `None` if
    /// stopped first.
    pub(super) async fn wait(
        &mut self,
        stop: &CancellationToken,
    ) -> Result<Option<Subscription>, SourceError> {
        let mut backoff = Backoff::default();
        loop {
            let error = match self.ask().await {
                Ok(found) => {
                    self.unanswered_since = None;
                    return Ok(Some(found));
                }
                Err(Err(permanent)) => return Err(permanent),
                Err(Ok(error)) => self.unanswered(error)?,
            };
            let delay = backoff.next_delay();
            tracing::warn!(subscription = %self.subscription, step = backoff.step(),
                retry_in_ms = delay.as_millis() as u64, %error,
                "Pub/Sub unreachable; retrying");
            tokio::select! {
                _ = stop.cancelled() => return Ok(None),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}

#[async_trait]
impl IdleCheck for Reachability {
    /// Whether the subscription is idle (`true`: Pub/Sub answered), or Pub/Sub does not answer
    /// (`false`: the run waits on; `GaveUp` past the patience).
    async fn confirm_idle(&mut self) -> Result<bool, SourceError> {
        match self.ask().await {
            Ok(_) => {
                self.unanswered_since = None;
                Ok(true)
            }
            Err(Err(permanent)) => Err(permanent),
            Err(Ok(error)) => {
                let error = self.unanswered(error)?;
                tracing::warn!(subscription = %self.subscription, %error,
                    "no message for the idle period, but Pub/Sub does not answer: the run \
                     waits for it rather than end as drained");
                Ok(false)
            }
        }
    }

    fn messages_came(&mut self) {
        self.unanswered_since = None;
    }
}
