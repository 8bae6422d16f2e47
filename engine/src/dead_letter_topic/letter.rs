//! The message published for a dead letter, and the limits of Pub/Sub's that sluice checks
//! before sending one.
//!
//! # Guarantees
//!
//! * A letter's message is its source message's payload and attributes (an attribute named
//!   `sluice_*` is replaced), plus `sluice_dead_letter_id`, `sluice_flow`, `sluice_reason`,
//!   `sluice_attempts`, `sluice_message_id` and `sluice_error` (cut to 1024 bytes on a
//!   character boundary). The same letter always gives the same message.
//!
//! # What it does not cover
//!
//! * [`over_limits`] checks Pub/Sub's documented limits only; what else a topic refuses (a
//!   schema, a reserved attribute key) is learnt from its answer (see `sender.rs`).

use google_cloud_pubsub::model::Message;
use sluice_store::OutboxLetter;
use std::collections::HashMap;

/// Pub/Sub's limits on a message.
pub(super) const MAX_MESSAGE_BYTES: usize = 10_000_000;
const MAX_ATTRIBUTES: usize = 100;
const MAX_ATTRIBUTE_KEY_BYTES: usize = 256;
const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1024;

/// Why Pub/Sub can never take `message`, if it cannot.
pub(super) fn over_limits(message: &Message) -> Option<String> {
    let attribute_bytes: usize = message
        .attributes
        .iter()
        .map(|(key, value)| key.len() + value.len())
        .sum();
    if message.data.len() + attribute_bytes > MAX_MESSAGE_BYTES {
        return Some(format!(
            "{} bytes with its attributes, over Pub/Sub's {MAX_MESSAGE_BYTES}",
            message.data.len() + attribute_bytes
        ));
    }
    if message.attributes.len() > MAX_ATTRIBUTES {
        return Some(format!(
            "{} attributes with sluice's, over Pub/Sub's {MAX_ATTRIBUTES}",
            message.attributes.len()
        ));
    }
    message
        .attributes
        .iter()
        .find(|(key, value)| {
            key.len() > MAX_ATTRIBUTE_KEY_BYTES || value.len() > MAX_ATTRIBUTE_VALUE_BYTES
        })
        .map(|(key, _)| {
            format!(
                "attribute {key:?} is over Pub/Sub's {MAX_ATTRIBUTE_KEY_BYTES}-byte keys or \
                 {MAX_ATTRIBUTE_VALUE_BYTES}-byte values"
            )
        })
}

/// The message published for `letter` (see the module docs).
pub(super) fn message(pipeline: &str, letter: &OutboxLetter) -> Message {
    let original =
        serde_json::from_str::<HashMap<String, serde_json::Value>>(&letter.attributes_json)
            .unwrap_or_else(|error| {
                tracing::warn!(letter = letter.id, %error,
                "a dead letter's attributes are not a JSON object; published without them");
                HashMap::new()
            });
    let mut attributes: HashMap<String, String> = original
        .into_iter()
        .map(|(key, value)| match value {
            serde_json::Value::String(text) => (key, text),
            other => (key, other.to_string()),
        })
        .collect();
    attributes.extend([
        (
            "sluice_dead_letter_id".to_owned(),
            format!("{pipeline}/{}", letter.id),
        ),
        ("sluice_flow".to_owned(), letter.flow.clone()),
        ("sluice_reason".to_owned(), letter.reason.clone()),
        ("sluice_attempts".to_owned(), letter.attempts.to_string()),
        ("sluice_message_id".to_owned(), letter.message_id.clone()),
        (
            "sluice_error".to_owned(),
            cut(&letter.error, MAX_ATTRIBUTE_VALUE_BYTES).to_owned(),
        ),
    ]);
    Message::new()
        .set_data(letter.data.clone())
        .set_attributes(attributes)
}

/// The longest prefix of `text` of at most `limit` bytes that ends on a character boundary.
fn cut(text: &str, limit: usize) -> &str {
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn letter() -> OutboxLetter {
        OutboxLetter {
            id: 7,
            flow: "live".into(),
            dedup_key: "k".into(),
            message_id: "m1".into(),
            publish_time_ms: 0,
            attributes_json: r#"{"region":"eu","n":3}"#.into(),
            data: Bytes::from_static(b"payload"),
            reason: "bad_timestamp".into(),
            error: "é".repeat(600),
            attempts: 1,
            earlier_publishes: 0,
        }
    }

    #[test]
    fn a_letter_keeps_its_message_and_says_why() {
        let m = message("orders", &letter());
        assert_eq!(&m.data[..], b"payload");
        assert_eq!(m.attributes["region"], "eu");
        assert_eq!(m.attributes["n"], "3");
        assert_eq!(m.attributes["sluice_dead_letter_id"], "orders/7");
        assert_eq!(m.attributes["sluice_reason"], "bad_timestamp");
        assert_eq!(m.attributes["sluice_attempts"], "1");
        assert_eq!(m.attributes["sluice_message_id"], "m1");
        let error = &m.attributes["sluice_error"];
        assert!(
            error.len() <= MAX_ATTRIBUTE_VALUE_BYTES
                && error.len() >= MAX_ATTRIBUTE_VALUE_BYTES - 1
        );
    }

    #[test]
    fn a_letter_over_the_limits_is_refused_before_sending() {
        assert_eq!(over_limits(&message("orders", &letter())), None);
        let many = OutboxLetter {
            attributes_json: serde_json::to_string(
                &(0..95)
                    .map(|i| (format!("a{i}"), "v"))
                    .collect::<HashMap<_, _>>(),
            )
            .unwrap(),
            ..letter()
        };
        let why = over_limits(&message("orders", &many)).unwrap();
        assert!(why.contains("101 attributes"), "{why}");
        let large = OutboxLetter {
            data: Bytes::from(vec![0u8; MAX_MESSAGE_BYTES]),
            ..letter()
        };
        assert!(over_limits(&message("orders", &large)).is_some());
        let long_value = OutboxLetter {
            attributes_json: format!(r#"{{"a":"{}"}}"#, "x".repeat(1025)),
            ..letter()
        };
        assert!(over_limits(&message("orders", &long_value)).is_some());
    }
}
