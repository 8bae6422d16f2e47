//! What a subscription's settings mean to sluice, said once when a flow's source starts (the
//! settings as Pub/Sub reports them, and the ones sluice treats in a way the user may not
//! expect).

use google_cloud_pubsub::model::Subscription;

/// The settings of `subscription` in one line, as logged at start.
pub fn describe(subscription: &Subscription) -> String {
    let retention = subscription
        .message_retention_duration
        .as_ref()
        .map_or_else(|| "default".to_owned(), |d| format!("{}s", d.seconds()));
    let dead_letter = subscription.dead_letter_policy.as_ref().map_or_else(
        || "none".to_owned(),
        |p| {
            format!(
                "{} after {} attempts",
                p.dead_letter_topic, p.max_delivery_attempts
            )
        },
    );
    let filter = if subscription.filter.is_empty() {
        "none".to_owned()
    } else {
        format!("{:?}", subscription.filter)
    };
    format!(
        "ack deadline {}s, message ordering {}, exactly-once delivery {}, filter {filter}, \
         dead-letter policy {dead_letter}, retention {retention} (acked kept: {})",
        subscription.ack_deadline_seconds,
        on_off(subscription.enable_message_ordering),
        on_off(subscription.enable_exactly_once_delivery),
        subscription.retain_acked_messages,
    )
}

fn on_off(enabled: bool) -> &'static str {
    if enabled { "on" } else { "off" }
}

/// What the flow reading a subscription does with its messages: what the checks at start
/// weigh the subscription's settings against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowIntent {
    /// Duplicates are found by message id (`dedup.by: message_id`).
    pub dedup_by_message_id: bool,
    /// A message that fails is handed back to Pub/Sub (`poison: nack`).
    pub poison_nack: bool,
}

/// Settings that work against what the flow does, each said as a warning.
pub fn concerns(subscription: &Subscription, intent: &FlowIntent) -> Vec<&'static str> {
    let mut concerns = Vec::new();
    if intent.poison_nack && subscription.dead_letter_policy.is_none() {
        concerns.push(
            "poison: nack on a subscription without a dead-letter policy: a message that always \
             fails comes back for ever (the retry policy only spaces its deliveries), and holds \
             its ordering key back on an ordered subscription; give the subscription a \
             dead-letter policy, or use poison: dead_letter",
        );
    }
    if intent.dedup_by_message_id {
        concerns.push(
            "dedup.by: message_id drops Pub/Sub's redeliveries, not a publisher's retries: a \
             publish retried after a lost reply (the official clients retry by default) is a \
             new message with a new id; if your publishers retry, dedup by an attribute they \
             set once per event (dedup: { by: attribute, attribute: NAME })",
        );
    }
    concerns
}

/// Logs the settings of `subscription` (its full path `path`) once, with what sluice does
/// with the ones that change its behaviour, and the [`concerns`] of the flow's `intent`.
pub fn log_settings(path: &str, subscription: &Subscription, intent: &FlowIntent) {
    tracing::info!(subscription = %path, settings = %describe(subscription),
        "subscription settings");
    if subscription.enable_exactly_once_delivery {
        tracing::info!(subscription = %path,
            "exactly-once delivery: acks after commit are confirmed; one not confirmed is \
             counted in sluice_ack_failures_total and its redelivery dropped by the ledger");
    }
    if let Some(policy) = &subscription.dead_letter_policy {
        if intent.poison_nack {
            tracing::info!(subscription = %path, topic = %policy.dead_letter_topic,
                max_delivery_attempts = policy.max_delivery_attempts,
                "dead-letter policy with poison: nack: a message that fails is handed back at \
                 once, and Pub/Sub forwards it to the topic after its delivery attempts");
        } else {
            tracing::info!(subscription = %path, topic = %policy.dead_letter_topic,
                max_delivery_attempts = policy.max_delivery_attempts,
                "dead-letter policy: a message sluice cannot commit after its own attempts is \
                 dead-lettered in the store's table and acked, so Pub/Sub forwards to the topic \
                 only what sluice gives back (nacked at a drain or past the commit bound)");
        }
    }
    if subscription.enable_message_ordering {
        tracing::info!(subscription = %path,
            "message ordering is on: each ordering key's messages commit in publish order \
             (a key's batches commit one after another in its lane; keys in parallel)");
    }
    for concern in concerns(subscription, intent) {
        tracing::warn!(subscription = %path, "{concern}");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use google_cloud_pubsub::model::DeadLetterPolicy;

    #[test]
    fn settings_in_one_line() {
        let subscription = Subscription::new()
            .set_ack_deadline_seconds(10)
            .set_enable_exactly_once_delivery(true)
            .set_filter("attributes.kind = \"a\"")
            .set_dead_letter_policy(
                DeadLetterPolicy::new()
                    .set_dead_letter_topic("projects/p/topics/dlq")
                    .set_max_delivery_attempts(5),
            );
        let line = describe(&subscription);
        assert!(line.contains("ack deadline 10s"), "{line}");
        assert!(line.contains("exactly-once delivery on"), "{line}");
        assert!(line.contains("message ordering off"), "{line}");
        assert!(
            line.contains("projects/p/topics/dlq after 5 attempts"),
            "{line}"
        );
        assert!(
            line.contains(r#"filter "attributes.kind = \"a\"""#),
            "{line}"
        );
    }

    #[test]
    fn concerns_weigh_the_settings_against_the_flow() {
        let bare = Subscription::new();
        let with_policy = Subscription::new().set_dead_letter_policy(
            DeadLetterPolicy::new()
                .set_dead_letter_topic("projects/p/topics/dlq")
                .set_max_delivery_attempts(5),
        );
        let nack = FlowIntent {
            poison_nack: true,
            ..FlowIntent::default()
        };
        assert!(concerns(&bare, &FlowIntent::default()).is_empty());
        assert!(concerns(&bare, &nack)[0].contains("without a dead-letter policy"));
        assert!(concerns(&with_policy, &nack).is_empty());
        let by_id = FlowIntent {
            dedup_by_message_id: true,
            ..FlowIntent::default()
        };
        assert!(concerns(&with_policy, &by_id)[0].contains("not a publisher's retries"));
    }
}
