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

/// Logs the settings of `subscription` (its full path `path`) once, with what sluice does
/// with the ones that change its behaviour.
pub fn log_settings(path: &str, subscription: &Subscription) {
    tracing::info!(subscription = %path, settings = %describe(subscription),
        "subscription settings");
    if subscription.enable_exactly_once_delivery {
        tracing::info!(subscription = %path,
            "exactly-once delivery: acks after commit are confirmed; one not confirmed is \
             counted in sluice_ack_failures_total and its redelivery dropped by the ledger");
    }
    if let Some(policy) = &subscription.dead_letter_policy {
        tracing::info!(subscription = %path, topic = %policy.dead_letter_topic,
            max_delivery_attempts = policy.max_delivery_attempts,
            "dead-letter policy: a message sluice cannot commit after its own attempts is \
             dead-lettered in the store's table and acked, so Pub/Sub forwards to the topic \
             only what sluice gives back (nacked at a drain or past the commit bound)");
    }
    if subscription.enable_message_ordering {
        tracing::info!(subscription = %path,
            "message ordering is on: each ordering key's messages commit in publish order \
             (a key's batches commit one after another in its lane; keys in parallel)");
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
}
