//! The dead-letter outbox (`sluice_dead_letter_outbox`): dead letters of a pipeline with a
//! `dead_letter.topic`, waiting to be published there, and the letters published already.
//!
//! # Guarantees
//!
//! * **Recorded before the ack.** A batch with [`crate::CommitBatch::publish_dead_letters`]
//!   writes each new dead letter to the outbox in the same transaction as its dead-letter row
//!   and its ledger key, so a message is acked only once its publish is owed durably, and a
//!   duplicate (a key the ledger already holds) owes nothing.
//! * **One letter per record.** A letter is a record of a flow: its pipeline, flow and dedup
//!   key. The outbox keeps one row per record for good, so the same record dead-lettered
//!   again (a reset or a full refresh re-read it, or it came back after the dedup window) owes
//!   no second letter: it keeps its first letter, its id and its state (waiting, published or
//!   refused).
//! * **Published, then marked.** A publisher takes letters with
//!   [`crate::OutboxStore::take_outbox`], which counts the publish in the row *before* the
//!   publish happens, and marks a letter published only after Pub/Sub confirmed it
//!   ([`crate::OutboxStore::outbox_published`]; its message is dropped then, its record kept).
//!   A publisher that dies in between leaves the letter with `earlier_publishes > 0`: its
//!   successor publishes it again (the only way a letter reaches the topic twice), and says so.
//! * **Refused, kept.** A letter the topic can never take is kept with the reason
//!   ([`crate::OutboxStore::outbox_refused`]) and never taken again, so it holds no place
//!   ahead of later letters; its dead-letter row holds the message in any case.
//!
//! # What it does not cover
//!
//! * A record dead-lettered again with another reason (the flow changed before a reset) is
//!   not published again; the dead-letter table holds its latest reason.
//! * The records of published letters are kept until their pipeline's outbox rows are deleted
//!   by hand: one small row per letter ever published.

use bytes::Bytes;

/// A dead letter waiting for the pipeline's dead-letter topic.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxLetter {
    /// Its number in the outbox: unique per store, growing in commit order of the outbox rows
    /// taken together (not a promise of publish order).
    pub id: i64,
    /// The flow that dead-lettered it.
    pub flow: String,
    /// Its dedup key.
    pub dedup_key: String,
    /// The source message id (file records: the record id).
    pub message_id: String,
    /// Publish time of the source message, ms since the epoch.
    pub publish_time_ms: i64,
    /// The source message's attributes as a JSON object.
    pub attributes_json: String,
    /// The source message's payload.
    pub data: Bytes,
    /// Why it was dead-lettered (`bad_timestamp`, `max_attempts`, ...).
    pub reason: String,
    /// The last error, for people.
    pub error: String,
    /// Processing attempts made.
    pub attempts: u32,
    /// Publishes of this letter started before this one (counted by `take_outbox`): more than
    /// zero means an earlier publisher may have published it already.
    pub earlier_publishes: u32,
}

/// How many letters a pipeline's outbox holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutboxCensus {
    /// Waiting to be published (published ones are not counted).
    pub waiting: u64,
    /// Refused by the topic, kept.
    pub refused: u64,
}
