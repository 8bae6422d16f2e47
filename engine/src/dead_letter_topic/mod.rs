//! The publisher of a pipeline's dead-letter topic (`dead_letter.topic`): it moves dead letters
//! from the store's outbox (`sluice_store::OutboxLetter`, written in the transaction that
//! dead-lettered them) to the topic.
//!
//! # Guarantees
//!
//! * **Nothing acked is lost.** A dead letter's message is acked only after its outbox row
//!   committed; the row is marked published only after Pub/Sub confirmed the publish. A topic
//!   that is missing, unreachable or failing makes letters wait (retried with backoff,
//!   logged), never drops them.
//! * **One letter per record, with an id to drop copies by.** Every published message carries
//!   `sluice_dead_letter_id`, unique per pipeline and store and the same for every copy of a
//!   letter. A letter is a record of a flow (its dedup key): the same record dead-lettered
//!   again, after a reset say, is not published again (see `sluice_store::OutboxLetter`). One
//!   replica publishes at a time (the lease `dead_letter_topic`, see [`crate::ReaderTurn`];
//!   advisory, like every lease), and a letter is published again only when an earlier
//!   attempt's outcome is unknown: a publisher died or lost its lease after publishing and
//!   before marking the row (the row counts its publishes before each), or Pub/Sub's answer
//!   was lost. The republishes it can know of are counted
//!   (`sluice_dead_letters_republished_total`): letters whose earlier attempt did not end in
//!   an answer of Pub/Sub's this process saw. A consumer that needs each letter once drops
//!   repeated `sluice_dead_letter_id`s.
//! * **What the topic can never take is kept, and holds up nothing.** A letter over Pub/Sub's
//!   limits (10 MB, 100 attributes with sluice's six, 256-byte keys, 1024-byte values) is not
//!   sent; a letter Pub/Sub answers with INVALID_ARGUMENT when sent alone (a topic schema its
//!   payload does not match, a key Pub/Sub reserves) is not sent again. Either stays in the
//!   outbox marked refused, with why, and is taken no more, so the letters behind it go out;
//!   it is counted (`sluice_dead_letter_publish_refused_total`) and remains in the
//!   dead-letter table. A request Pub/Sub refuses fails every letter in it, so each of those
//!   is sent again alone to find which it refuses.
//! * **Only a refusal refuses.** A missing topic, a refused permission, a transient failure
//!   or an unknown outcome never makes a letter refused: it waits and is tried again.
//! * **A stop is bounded.** Once stopped, the publisher publishes what waits for at most
//!   [`FLUSH_GRACE`] and leaves the rest for the next holder.
//!
//! What a published message holds: see `letter.rs`.

mod letter;
mod sender;
#[cfg(test)]
mod tests;

use crate::backoff::Backoff;
use crate::source::turn::ReaderTurn;
use google_cloud_pubsub::client::Publisher;
use letter::{message, over_limits};
use sender::{Failure, LetterSender};
use sluice_store::{OutboxLetter, OutboxStore, StoreError};
use std::collections::HashSet;
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
    /// Letters Pub/Sub confirmed.
    published: Vec<i64>,
    /// Letters the topic can never take, with why.
    refused: Vec<(i64, String)>,
    /// The error of publishes that failed (the letters are taken again later).
    failed: Option<String>,
}

impl DeadLetterTopic {
    /// Publishes letters while `stop` is not cancelled (and, once it is, what waits for up to
    /// [`FLUSH_GRACE`]), holding the pool's turn meanwhile.
    pub async fn run(self, publisher: Publisher, stop: CancellationToken) {
        self.run_with(publisher, stop).await;
    }

    /// [`DeadLetterTopic::run`] with any sender.
    async fn run_with(self, sender: impl LetterSender, stop: CancellationToken) {
        // Letters this process tried and Pub/Sub answered that it took nothing: taking them
        // again is no republish.
        let mut not_taken_before = HashSet::new();
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
                let round = self.round(&sender, &mut not_taken_before);
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
        sender: &impl LetterSender,
        not_taken_before: &mut HashSet<i64>,
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
            .filter(|l| l.earlier_publishes > 0 && !not_taken_before.contains(&l.id))
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
        let mut sending: Vec<&OutboxLetter> = Vec::with_capacity(letters.len());
        let mut messages = Vec::with_capacity(letters.len());
        for letter in &letters {
            let message = message(&self.pipeline, letter);
            match over_limits(&message) {
                Some(why) => round.refused.push((letter.id, why)),
                None => {
                    sending.push(letter);
                    messages.push(message);
                }
            }
        }
        let alone = sending.len() == 1;
        let answers = sender.send(messages).await;
        let mut suspects = Vec::new();
        for (letter, answer) in sending.into_iter().zip(answers) {
            match answer {
                Err(Failure::Invalid(_)) if !alone => suspects.push(letter),
                answer => round.record(letter.id, answer, not_taken_before),
            }
        }
        // A request Pub/Sub refused fails every letter in it: each is sent again alone, and
        // only a letter refused alone is refused for good.
        for letter in suspects {
            let answer = sender
                .send(vec![message(&self.pipeline, letter)])
                .await
                .pop()
                .unwrap_or_else(|| Err(Failure::Unknown("no answer".to_owned())));
            round.record(letter.id, answer, not_taken_before);
        }
        self.outbox
            .outbox_published(&self.pipeline, &round.published)
            .await?;
        metrics::counter!("sluice_dead_letters_published_total",
            "pipeline" => self.pipeline.clone())
        .increment(round.published.len() as u64);
        for (id, why) in &round.refused {
            tracing::error!(topic = %self.topic, letter = id, %why,
                "the topic can never take this dead letter; it stays in the dead-letter table \
                 and the outbox, marked refused, and the letters behind it go on");
            self.outbox.outbox_refused(&self.pipeline, *id, why).await?;
            metrics::counter!("sluice_dead_letter_publish_refused_total",
                "pipeline" => self.pipeline.clone())
            .increment(1);
        }
        Ok(Some(round))
    }
}

impl Round {
    /// Records what became of letter `id` after Pub/Sub's `answer` to a request it was in
    /// (alone, for [`Failure::Invalid`]).
    fn record(
        &mut self,
        id: i64,
        answer: Result<(), Failure>,
        not_taken_before: &mut HashSet<i64>,
    ) {
        match answer {
            Ok(()) => {
                not_taken_before.remove(&id);
                self.published.push(id);
            }
            Err(Failure::Invalid(why)) => {
                self.refused
                    .push((id, format!("Pub/Sub refused it sent alone: {why}")));
            }
            Err(failure @ Failure::NotTaken(_)) => {
                not_taken_before.insert(id);
                self.failed = Some(failure.text().to_owned());
            }
            Err(failure @ Failure::Unknown(_)) => {
                not_taken_before.remove(&id);
                self.failed = Some(failure.text().to_owned());
            }
        }
    }
}
