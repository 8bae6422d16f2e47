//! The publisher of a pipeline's dead-letter topic (`dead_letter.topic`): it moves dead letters
//! from the store's outbox (`sluice_store::OutboxLetter`, written in the transaction that
//! dead-lettered them) to the topic.
//!
//! # Guarantees
//!
//! * **Nothing acked is lost.** A dead letter's message is acked only after its outbox row
//!   committed; the row is removed only after Pub/Sub confirmed the publish. A topic that is
//!   missing, unreachable or refusing makes letters wait (retried with backoff, logged), never
//!   drops them.
//! * **Each letter at least once, with an id to drop copies by.** Every published message
//!   carries `sluice_dead_letter_id`, unique per pipeline and store. One replica publishes at a
//!   time (the lease `dead_letter_topic`, see [`crate::turn`]; advisory, like every lease), and
//!   a letter is published again only when an earlier attempt's outcome is unknown: a
//!   publisher died after publishing and before removing the row (the row counts its
//!   publishes before each), or Pub/Sub's answer was lost. The republishes it can know of are
//!   counted (`sluice_dead_letters_republished_total`): letters whose earlier attempt did not
//!   end in a refusal this process saw. A consumer that needs each letter once drops repeated
//!   `sluice_dead_letter_id`s.
//! * **What the topic can never take is kept.** A letter over Pub/Sub's limits (10 MB, 100
//!   attributes with sluice's six, 256-byte keys, 1024-byte values) is not sent: it stays in
//!   the outbox marked refused, is counted (`sluice_dead_letter_publish_refused_total`), and
//!   remains in the dead-letter table.
//! * **A stop is bounded.** Once stopped, the publisher publishes what waits for at most
//!   [`FLUSH_GRACE`] and leaves the rest for the next holder.
//!
//! Each published message is the source message's payload and attributes (an attribute named
//! `sluice_*` is replaced), plus `sluice_dead_letter_id`, `sluice_flow`, `sluice_reason`,
//! `sluice_attempts`, `sluice_message_id` and `sluice_error` (cut to 1024 bytes).

use crate::backoff::Backoff;
use crate::pubsub::publish_refused;
use crate::turn::ReaderTurn;
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::model::Message;
use sluice_store::{OutboxLetter, OutboxStore, StoreError};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The lease one replica holds to publish (per pipeline).
pub const PUBLISHER_ROLE: &str = "dead_letter_topic";
/// Letters taken from the outbox per round, at most.
const PAGE: usize = 100;
/// Payload bytes taken per round, at most (one letter always, however large).
const PAGE_BYTES: usize = 32 << 20;
/// How often an empty outbox is looked at again.
const POLL: Duration = Duration::from_millis(250);
/// How long a stopping publisher keeps publishing what waits.
pub const FLUSH_GRACE: Duration = Duration::from_secs(10);
/// Pub/Sub's limits on a message.
const MAX_MESSAGE_BYTES: usize = 10_000_000;
const MAX_ATTRIBUTES: usize = 100;
const MAX_ATTRIBUTE_KEY_BYTES: usize = 256;
const MAX_ATTRIBUTE_VALUE_BYTES: usize = 1024;

/// Where the letters go and who publishes them.
pub struct DeadLetterTopic {
    /// The store holding the outbox.
    pub outbox: Arc<dyn OutboxStore>,
    /// The pool's turns.
    pub turn: ReaderTurn,
    /// The pipeline whose letters these are.
    pub pipeline: String,
    /// The topic's full path (`projects/P/topics/T`), for the log.
    pub topic: String,
}

/// What became of one round's letters.
#[derive(Debug, Default, PartialEq, Eq)]
struct Round {
    published: Vec<i64>,
    /// Letters over Pub/Sub's limits, with why.
    refused: Vec<(i64, String)>,
    /// The error of publishes that failed (the letters are taken again later).
    failed: Option<String>,
}

impl DeadLetterTopic {
    /// Publishes letters while `stop` is not cancelled (and, once it is, what waits for up to
    /// [`FLUSH_GRACE`]), holding the pool's turn meanwhile.
    pub async fn run(self, publisher: Publisher, stop: CancellationToken) {
        // Letters this process tried and Pub/Sub refused outright: taking them again is no
        // republish.
        let mut refused_before = HashSet::new();
        let mut flush_until: Option<Instant> = None;
        'turns: loop {
            let Some(turn) = self
                .turn
                .take_role(&self.pipeline, PUBLISHER_ROLE, "dead-letter topic", &stop)
                .await
            else {
                return;
            };
            let mut backoff = Backoff::default();
            loop {
                if turn.lost() {
                    continue 'turns;
                }
                if stop.is_cancelled() && flush_until.is_none() {
                    flush_until = Some(Instant::now() + FLUSH_GRACE);
                }
                let round = self.round(&publisher, &mut refused_before);
                let outcome = match flush_until {
                    None => Some(round.await),
                    Some(until) => tokio::time::timeout_at(until, round).await.ok(),
                };
                let delay = match outcome {
                    None => break 'turns,
                    Some(Ok(Some(round))) if round.failed.is_none() => {
                        backoff = Backoff::default();
                        continue;
                    }
                    Some(Ok(Some(round))) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(topic = %self.topic,
                            error = round.failed.as_deref().unwrap_or(""), retry_in = ?delay,
                            "cannot publish dead letters; they wait in the outbox");
                        delay
                    }
                    Some(Ok(None)) if flush_until.is_some() => break 'turns,
                    Some(Ok(None)) => POLL,
                    Some(Err(error)) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(%error, retry_in = ?delay,
                            "cannot read the dead-letter outbox; retrying");
                        delay
                    }
                };
                let wake = match flush_until {
                    Some(until) => until.min(Instant::now() + delay),
                    None => Instant::now() + delay,
                };
                tokio::select! {
                    _ = tokio::time::sleep_until(wake) => {}
                    _ = stop.cancelled(), if flush_until.is_none() => {}
                }
                if flush_until.is_some_and(|until| Instant::now() >= until) {
                    break 'turns;
                }
            }
        }
        self.turn.release_role(&self.pipeline, PUBLISHER_ROLE).await;
    }

    /// Publishes one page of letters; `None` when none waits.
    async fn round(
        &self,
        publisher: &Publisher,
        refused_before: &mut HashSet<i64>,
    ) -> Result<Option<Round>, StoreError> {
        let letters = self
            .outbox
            .take_outbox(&self.pipeline, PAGE, PAGE_BYTES)
            .await?;
        if letters.is_empty() {
            return Ok(None);
        }
        let again = letters
            .iter()
            .filter(|l| l.earlier_publishes > 0 && !refused_before.contains(&l.id))
            .count();
        if again > 0 {
            tracing::warn!(topic = %self.topic, letters = again,
                "publishing dead letters again whose earlier publish may have landed (a \
                 publisher stopped before recording it, or Pub/Sub's answer was lost); they \
                 carry the same sluice_dead_letter_id");
            metrics::counter!("sluice_dead_letters_republished_total",
                "pipeline" => self.pipeline.clone())
            .increment(again as u64);
        }
        let mut round = Round::default();
        let mut sending = Vec::with_capacity(letters.len());
        for letter in &letters {
            let message = message(&self.pipeline, letter);
            match over_limits(&message) {
                Some(why) => round.refused.push((letter.id, why)),
                None => sending.push((letter.id, publisher.publish(message))),
            }
        }
        let (ids, pending): (Vec<i64>, Vec<_>) = sending.into_iter().unzip();
        let results = futures::future::join_all(pending).await;
        for (id, result) in ids.into_iter().zip(results) {
            match result {
                Ok(_) => {
                    refused_before.remove(&id);
                    round.published.push(id);
                }
                Err(error) => {
                    if publish_refused(&error) {
                        refused_before.insert(id);
                    } else {
                        refused_before.remove(&id);
                    }
                    round.failed = Some(error.to_string());
                }
            }
        }
        self.outbox
            .outbox_published(&self.pipeline, &round.published)
            .await?;
        metrics::counter!("sluice_dead_letters_published_total",
            "pipeline" => self.pipeline.clone())
        .increment(round.published.len() as u64);
        for (id, why) in &round.refused {
            tracing::error!(topic = %self.topic, letter = id, %why,
                "a dead letter is over Pub/Sub's limits; it stays in the dead-letter table and \
                 the outbox, marked refused");
            self.outbox.outbox_refused(&self.pipeline, *id, why).await?;
            metrics::counter!("sluice_dead_letter_publish_refused_total",
                "pipeline" => self.pipeline.clone())
            .increment(1);
        }
        Ok(Some(round))
    }
}

/// Why Pub/Sub can never take `message`, if it cannot.
fn over_limits(message: &Message) -> Option<String> {
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
fn message(pipeline: &str, letter: &OutboxLetter) -> Message {
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
