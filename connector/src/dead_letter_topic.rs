//! The publisher of a pipeline's dead-letter topic (`dead_letter.topic`): it moves dead letters
//! from the store's outbox (`sluice_store::OutboxLetter`, written in the transaction that
//! dead-lettered them) to the topic.
//!
//! # Guarantees
//!
//! * **Nothing acked is lost.** A dead letter's message is acked only after its outbox row
//!   committed; the row is removed only after Pub/Sub confirmed the publish. A topic that is
//!   missing or unreachable makes letters wait (retried with backoff, logged), never drops them.
//! * **Once, unless a publisher dies mid-publish.** One replica publishes at a time (the lease
//!   `dead_letter_topic`, see [`crate::turn`]). A letter is published again only when the one
//!   before may have published it and died before removing the row (the row counts its
//!   publishes before each): such republishes are counted
//!   (`sluice_dead_letters_republished_total`) and carry the same `sluice_dead_letter_id`, by
//!   which a consumer can drop them.
//! * **Refusals are kept.** A letter the topic can never take (InvalidArgument: too large, too
//!   many attributes) stays in the outbox marked refused, is counted
//!   (`sluice_dead_letter_publish_refused_total`), and remains in the dead-letter table.
//!
//! Each published message is the source message's payload and attributes, plus
//! `sluice_dead_letter_id`, `sluice_flow`, `sluice_reason`, `sluice_attempts`,
//! `sluice_message_id` and `sluice_error` (cut to Pub/Sub's 1024-byte value limit).

use crate::backoff::Backoff;
use crate::turn::ReaderTurn;
use google_cloud_gax::error::rpc::Code;
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::error::PublishError;
use google_cloud_pubsub::model::Message;
use sluice_store::{OutboxLetter, OutboxStore, StoreError};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The lease one replica holds to publish (per pipeline).
pub const PUBLISHER_ROLE: &str = "dead_letter_topic";
/// Letters taken from the outbox per round.
const PAGE: usize = 100;
/// How often an empty outbox is looked at again.
const POLL: Duration = Duration::from_millis(250);
/// How long a stopping publisher keeps publishing what waits.
const FLUSH_GRACE: Duration = Duration::from_secs(10);
/// Pub/Sub's limit on an attribute value, in bytes.
const ATTRIBUTE_VALUE_LIMIT: usize = 1024;

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
    refused: Vec<(i64, String)>,
    /// Publishes that failed for a reason that may pass (the letter is taken again later).
    failed: Option<String>,
}

impl DeadLetterTopic {
    /// Publishes letters while `stop` is not cancelled (and, once it is, what waits for up to
    /// [`FLUSH_GRACE`]), holding the pool's turn meanwhile.
    pub async fn run(self, publisher: Publisher, stop: CancellationToken) {
        let never = CancellationToken::new();
        'turns: loop {
            let Some(turn) = self
                .turn
                .take_role(&self.pipeline, PUBLISHER_ROLE, "dead-letter topic", &stop)
                .await
            else {
                return;
            };
            let mut backoff = Backoff::default();
            let mut flush_until = None;
            loop {
                if turn.lost() {
                    continue 'turns;
                }
                if stop.is_cancelled() {
                    let until = *flush_until
                        .get_or_insert_with(|| tokio::time::Instant::now() + FLUSH_GRACE);
                    if tokio::time::Instant::now() >= until {
                        break 'turns;
                    }
                }
                match self.round(&publisher).await {
                    Ok(Some(round)) if round.failed.is_none() => backoff = Backoff::default(),
                    Ok(Some(round)) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(topic = %self.topic, error = round.failed.as_deref().unwrap_or(""),
                            retry_in = ?delay, "cannot publish dead letters; they wait in the outbox");
                        pause(delay, if flush_until.is_some() { &never } else { &stop }).await;
                    }
                    Ok(None) if stop.is_cancelled() => break 'turns,
                    Ok(None) => pause(POLL, &stop).await,
                    Err(error) => {
                        let delay = backoff.next_delay();
                        tracing::warn!(%error, retry_in = ?delay,
                            "cannot read the dead-letter outbox; retrying");
                        pause(delay, if flush_until.is_some() { &never } else { &stop }).await;
                    }
                }
            }
        }
        self.turn.release_role(&self.pipeline, PUBLISHER_ROLE).await;
    }

    /// Publishes one page of letters; `None` when none waits.
    async fn round(&self, publisher: &Publisher) -> Result<Option<Round>, StoreError> {
        let letters = self.outbox.take_outbox(&self.pipeline, PAGE).await?;
        if letters.is_empty() {
            return Ok(None);
        }
        let again = letters.iter().filter(|l| l.earlier_publishes > 0).count();
        if again > 0 {
            tracing::warn!(topic = %self.topic, letters = again,
                "publishing dead letters again whose earlier publish may have landed (a \
                 publisher stopped before recording it); they carry the same sluice_dead_letter_id");
            metrics::counter!("sluice_dead_letters_republished_total",
                "pipeline" => self.pipeline.clone())
            .increment(again as u64);
        }
        let pending: Vec<_> = letters
            .iter()
            .map(|letter| publisher.publish(message(&self.pipeline, letter)))
            .collect();
        let results = futures::future::join_all(pending).await;
        let mut round = Round::default();
        let mut suspects = Vec::new();
        for (letter, result) in letters.iter().zip(results) {
            match result {
                Ok(_) => round.published.push(letter.id),
                Err(error) if refused(&error) => suspects.push(letter),
                Err(error) => round.failed = Some(error.to_string()),
            }
        }
        // A refusal may be a batch's, for one letter of it: each suspect is tried alone.
        for letter in suspects {
            match publisher.publish(message(&self.pipeline, letter)).await {
                Ok(_) => round.published.push(letter.id),
                Err(error) if refused(&error) => round.refused.push((letter.id, error.to_string())),
                Err(error) => round.failed = Some(error.to_string()),
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
                "the dead-letter topic refused a letter; it stays in the dead-letter table and \
                 the outbox, marked refused");
            self.outbox.outbox_refused(&self.pipeline, *id, why).await?;
            metrics::counter!("sluice_dead_letter_publish_refused_total",
                "pipeline" => self.pipeline.clone())
            .increment(1);
        }
        Ok(Some(round))
    }
}

/// Sleeps `delay`, or less if `stop` is cancelled.
async fn pause(delay: Duration, stop: &CancellationToken) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = stop.cancelled() => {}
    }
}

/// A publish error that no retry can mend.
fn refused(error: &PublishError) -> bool {
    match error {
        PublishError::Rpc(error) => error
            .status()
            .is_some_and(|s| s.code == Code::InvalidArgument),
        _ => false,
    }
}

/// The message published for `letter` (see the module docs).
fn message(pipeline: &str, letter: &OutboxLetter) -> Message {
    let mut attributes: HashMap<String, String> =
        serde_json::from_str::<HashMap<String, serde_json::Value>>(&letter.attributes_json)
            .unwrap_or_default()
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
            cut(&letter.error, ATTRIBUTE_VALUE_LIMIT).to_owned(),
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
        assert!(error.len() <= ATTRIBUTE_VALUE_LIMIT && error.len() >= ATTRIBUTE_VALUE_LIMIT - 1);
    }
}
