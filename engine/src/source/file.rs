//! A bounded source: JSONL files matched by a glob, read once (SPEC §4, "File sources").
//!
//! Each line is one record `{"id": "...", "data": <JSON, or a base64 string>, "attributes":
//! {...}, "event_time": "RFC 3339" | ms}`; `id` becomes the message id, hence the dedup key.
//!
//! # Guarantees
//!
//! * **Nothing lost.** Every non-blank line reaches the stage: a line that is not a JSON object,
//!   whose `data` string is not base64, that has no `id`, or whose `event_time` cannot be read
//!   is delivered with a [`crate::SourceProblem`] and becomes a dead letter (`undecodable`,
//!   `missing_id`, `bad_timestamp`), keyed by `FILE:LINE` so that re-reading it does not
//!   dead-letter it twice (`file_record.rs`).
//! * **Memory bounded, whatever the lines.** A line longer than
//!   [`FileSource::max_record_bytes`] (default [`DEFAULT_MAX_RECORD_BYTES`]) is passed over in
//!   pieces, never held (`file_lines.rs`), and becomes a `record_too_large` dead letter keyed
//!   `FILE:LINE` like the others, naming its byte offset and length and carrying its first
//!   bytes; the read goes on after it. A chunk of records is delivered once it holds
//!   [`CHUNK_BYTES`](crate::source::file_reader::CHUNK_BYTES), so what is read ahead of the
//!   flow's budget is bounded too.
//! * **Paths are text.** A matched path that is not UTF-8 fails the flow at start, before
//!   anything is read: the checkpoint and the dead letters' keys name files as text, and a
//!   lossy name would stand for two files or compare wrong against the real one
//!   (`file_glob.rs`).
//! * **Exactly once across crashes, whenever they happen.** With [`crate::SkipCommitted`], records
//!   whose key the flow already committed (a row or a dead letter, however long ago) are skipped
//!   before delivery, so a backfill re-read after a crash writes only what it had not; records
//!   in flight at the crash are still caught by the dedup ledger like any redelivery.
//! * **A source that ends.** After the last line of the last file the source closes its
//!   intake; the flow then finishes once everything delivered is committed. A file that cannot
//!   be read (no file matches, permission denied, a read error half-way) fails the flow: at
//!   start as an error, later through [`crate::SourceProgress::failure`]; a failed flow never counts as
//!   complete.
//! * Files are read in path order, one line at a time, within the flow's budget.
//! * **Read once in a pool.** With [`FileSource::in_pool`] (a `once` backfill run by several
//!   replicas), only the holder of the flow's turn (the lease `feed/<flow>`, see
//!   [`crate::ReaderTurn`]) reads; the others wait for it. The holder saves a checkpoint every
//!   [`CHECKPOINT_EVERY`] ([`sluice_store::FileCheckpoint`]: the file and byte offset before
//!   which every record is settled), and whoever takes the turn over (its holder died, or
//!   finished) reads on from there: a crash re-reads what was in flight and at most
//!   [`CHECKPOINT_EVERY`] of commits, which the skip above and the ledger keep from
//!   committing twice, and a replica that gets the turn after the read finished reads nothing
//!   and ends. The checkpoint goes with a reset of the flow.
//!
//! There is no publish time in a file: a record's publish time is its file's modification time,
//! and a record without `event_time` takes that as its event time.
//!
//! A scheduled run with a data interval reads only the records whose event time lies in it
//! ([`FileSource::within`]): the others are left out before delivery and counted in
//! [`SourceProgress::outside_interval`]; a line that is not a record has no event time and is
//! dead-lettered by whichever run reads it first.
//!
//! # What it does not cover
//!
//! A wildcard of the glob does not match a name that is not UTF-8 (the `glob` crate leaves such
//! names out), so such a file is not read and nothing says so; only a path reached through `**`
//! can hold such a name, and that one is refused (above).
//!
//! This file holds the source and its settings; the read itself is `file_reader.rs`, and a
//! pool's reading in turns, with its checkpoint saved, `file_turns.rs`.

use crate::source::bounded::{SkipCommitted, SourceProgress};
use crate::source::turn::ReaderTurn;
use crate::telemetry::Counters;
use sluice_store::{FeedStore, FlowHandle};
use std::sync::Arc;
use std::time::Duration;

/// How often the holder of a pooled read saves its checkpoint (when it moved).
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// The longest line read as a record unless [`FileSource::max_record_bytes`] says otherwise:
/// Pub/Sub's limit for one message (10 MB), so that a file record is no larger than a record
/// of a Pub/Sub flow.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 10_000_000;

/// JSONL files matched by a glob, read once.
pub struct FileSource {
    pub(super) pattern: String,
    pub(super) skip: Option<SkipCommitted>,
    pub(super) progress: Arc<SourceProgress>,
    pub(super) patience: Option<Duration>,
    /// Only records with an event time in `[start, end)` (ms) are read.
    pub(super) within: Option<(i64, i64)>,
    pub(super) pool: Option<FileTurn>,
    pub(super) counters: Option<Counters>,
    pub(super) max_record_bytes: usize,
}

/// What a file read in a pool needs: the flow's turn and where its checkpoint is kept.
#[derive(Clone)]
pub struct FileTurn {
    /// The lease `feed/<flow>`.
    pub turn: ReaderTurn,
    /// Where the checkpoint is kept.
    pub feed: Arc<dyn FeedStore>,
    /// The flow.
    pub flow: FlowHandle,
}

impl FileSource {
    /// A source of the files matching `pattern` (e.g. `data/history/*.jsonl`).
    pub fn new(pattern: impl Into<String>) -> Self {
        Self {
            pattern: pattern.into(),
            skip: None,
            progress: Arc::new(SourceProgress::default()),
            patience: None,
            within: None,
            pool: None,
            counters: None,
            max_record_bytes: bytes_in_memory(DEFAULT_MAX_RECORD_BYTES),
        }
    }

    /// Lines longer than `bytes` (without their `\n`) are not read as records but become
    /// `record_too_large` dead letters, without being held (see the module docs); at least 1.
    pub fn max_record_bytes(mut self, bytes: u64) -> Self {
        self.max_record_bytes = bytes_in_memory(bytes).max(1);
        self
    }

    /// Reads only while this worker holds the flow's turn, from the checkpoint the last holder
    /// saved (see the module docs). Not with [`FileSource::within`]: a run's interval leaves
    /// records out that a checkpoint would pass.
    pub fn in_pool(mut self, turn: FileTurn) -> Self {
        self.pool = Some(turn);
        self
    }

    /// Counts the records read in `sluice_source_records_read_total`.
    pub fn with_counters(mut self, counters: Counters) -> Self {
        self.counters = Some(counters);
        self
    }

    /// Reads only the records whose event time lies in `[start_ms, end_ms)` (a scheduled run's
    /// data interval); see the module docs.
    pub fn within(mut self, start_ms: i64, end_ms: i64) -> Self {
        self.within = Some((start_ms, end_ms));
        self
    }

    /// Skips records the flow has already committed (see the module docs).
    pub fn skip_committed(mut self, skip: SkipCommitted) -> Self {
        self.skip = Some(skip);
        self
    }

    /// Its progress, for a progress bar and for the flow's final state.
    pub fn progress(&self) -> Arc<SourceProgress> {
        self.progress.clone()
    }

    /// Waits for an unavailable store for at most `limit` (a triggered run's `give_up_after`),
    /// then fails (see [`SourceProgress::gave_up`]); default: for ever.
    pub fn giving_up_after(mut self, limit: Option<Duration>) -> Self {
        self.patience = limit;
        self
    }
}

/// A byte count as a size in memory (`usize::MAX` past what the platform addresses).
fn bytes_in_memory(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}
