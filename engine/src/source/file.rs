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
//!   dead-letter it twice (`connector/src/file_record.rs`).
//! * **Memory bounded, whatever the lines.** A line longer than
//!   [`FileSource::max_record_bytes`] (default [`DEFAULT_MAX_RECORD_BYTES`]) is passed over in
//!   pieces, never held (`connector/src/file_lines.rs`), and becomes a `record_too_large` dead
//!   letter keyed `FILE:LINE` like the others, naming its byte offset and length and carrying
//!   its first bytes; the read goes on after it. A chunk of records is delivered once it holds
//!   [`CHUNK_BYTES`], so what is read ahead of the flow's budget is bounded too.
//! * **Paths are text.** A matched path that is not UTF-8 fails the flow at start, before
//!   anything is read: the checkpoint and the dead letters' keys name files as text, and a
//!   lossy name would stand for two files or compare wrong against the real one
//!   (`connector/src/file_glob.rs`).
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

use crate::backoff::Backoff;
use crate::flow::budget::Budget;
use crate::flow::delivery::SourceMessage;
use crate::source::SourceError;
use crate::source::bounded::{Deliverer, SkipCommitted, SourceProgress};
use crate::source::file_checkpoint::Checkpoints;
use crate::source::file_glob::{Matched, matching_files};
use crate::source::file_lines::BoundedLines;
use crate::source::file_record::{LongLine, record, too_large};
use crate::source::turn::{ReaderTurn, Turn};
use crate::source::{MessageSource, Received, SourceHandle};
use crate::telemetry::Counters;
use async_trait::async_trait;
use sluice_store::{FeedStore, FileCheckpoint, FlowHandle};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::AsyncSeekExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::source::bounded::CHUNK;

/// How often the holder of a pooled read saves its checkpoint (when it moved).
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// The longest line read as a record unless [`FileSource::max_record_bytes`] says otherwise:
/// Pub/Sub's limit for one message (10 MB), so that a file record is no larger than a record
/// of a Pub/Sub flow.
pub const DEFAULT_MAX_RECORD_BYTES: u64 = 10_000_000;

/// Bytes of records after which a chunk is delivered even if it has fewer than `CHUNK`
/// records: what a read holds ahead of the flow's budget (which bounds what is in flight after
/// delivery), whatever the size of the records.
pub(crate) const CHUNK_BYTES: usize = 16 * 1024 * 1024;

/// JSONL files matched by a glob, read once.
pub struct FileSource {
    pattern: String,
    skip: Option<SkipCommitted>,
    progress: Arc<SourceProgress>,
    /// Only records with an event time in `[start, end)` (ms) are read.
    within: Option<(i64, i64)>,
    pool: Option<FileTurn>,
    counters: Option<Counters>,
    max_record_bytes: usize,
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
}

/// A byte count as a size in memory (`usize::MAX` past what the platform addresses).
fn bytes_in_memory(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

#[async_trait]
impl MessageSource for FileSource {
    async fn start(
        self: Box<Self>,
        intake: mpsc::Sender<Received>,
        budget: Budget,
        stop: CancellationToken,
    ) -> Result<Box<dyn SourceHandle>, SourceError> {
        let (files, total) = matching_files(&self.pattern)?;
        self.progress.bytes_total.store(total, Ordering::Relaxed);
        if self.pool.is_some() && self.within.is_some() {
            return Err(SourceError::File(
                "a file read in a pool keeps a checkpoint, which a data interval would pass \
                 over records it leaves out"
                    .to_owned(),
            ));
        }
        let reader = Reader {
            deliverer: Deliverer {
                skip: self.skip,
                progress: self.progress.clone(),
                intake,
                budget,
                stop: stop.clone(),
            },
            within: self.within,
            counters: self.counters,
            pattern: self.pattern,
            max_record_bytes: self.max_record_bytes,
        };
        let pool = self.pool;
        let task = tokio::spawn(async move {
            match pool {
                None => reader.read_all(&files).await,
                Some(pool) => reader.read_in_turns(&files, &pool).await,
            }
            // Dropping the reader closes the intake: the flow ends once it is all committed.
        });
        Ok(Box::new(crate::source::bounded::Running {
            stop,
            task,
            progress: self.progress,
        }))
    }
}

/// How a read of the files ended.
enum ReadEnd {
    /// Every file read to its end.
    Done,
    /// Stopped, or a file could not be read (the progress says so).
    Stopped,
    /// Another worker holds the turn now.
    Lost,
}

/// Reads files into a [`Deliverer`], keeping the records of the data interval if there is one.
struct Reader {
    deliverer: Deliverer,
    within: Option<(i64, i64)>,
    counters: Option<Counters>,
    pattern: String,
    max_record_bytes: usize,
}

/// Where one file's read starts, and what it reports to.
struct FileRead<'a> {
    offset: i64,
    line: i64,
    checkpoints: Option<&'a Arc<Checkpoints>>,
    turn: Option<&'a Turn>,
}

impl Reader {
    /// Reads every file from its beginning.
    async fn read_all(&self, files: &[Matched]) {
        self.read_from(files, &FileCheckpoint::default(), None, None)
            .await;
    }

    /// Reads in this worker's turns, each from the stored checkpoint, until every file was
    /// read (by this worker or an earlier holder) or the source stops.
    async fn read_in_turns(&self, files: &[Matched], pool: &FileTurn) {
        let stop = self.deliverer.stop.clone();
        let what = format!("files {}", self.pattern);
        loop {
            let Some(turn) = pool.turn.take(&pool.flow, &what, &stop).await else {
                return;
            };
            let Some(from) = self.stored_checkpoint(pool).await else {
                pool.turn.release(&pool.flow).await;
                return;
            };
            if from != FileCheckpoint::default() {
                tracing::info!(flow = %pool.flow.name, path = %from.path, line = from.line,
                    "reading on from the checkpoint an earlier reader saved");
            }
            let checkpoints = Checkpoints::new(from.clone());
            let saver = tokio::spawn(keep_saving(pool.clone(), checkpoints.clone(), from.clone()));
            let end = self
                .read_from(files, &from, Some(&checkpoints), Some(&turn))
                .await;
            if matches!(end, ReadEnd::Done) {
                // The successor starts where this read settled: wait for it to settle.
                tokio::select! {
                    _ = checkpoints.settled() => {}
                    _ = stop.cancelled() => {}
                }
            }
            saver.abort();
            // A save in flight lands before the last one, never after it.
            let _ = saver.await;
            let reached = checkpoints.reached();
            // A reader that lost its turn leaves the checkpoint to its successor.
            if reached != from
                && !matches!(end, ReadEnd::Lost)
                && let Err(error) = pool.feed.save_file_checkpoint(&pool.flow, &reached).await
            {
                tracing::warn!(flow = %pool.flow.name, %error,
                    "cannot save the file checkpoint; the next reader re-reads a little more");
            }
            match end {
                ReadEnd::Lost => {
                    tracing::warn!(flow = %pool.flow.name,
                        "lost the reader's turn; reading on once it is this worker's again");
                }
                ReadEnd::Done | ReadEnd::Stopped => {
                    drop(turn);
                    pool.turn.release(&pool.flow).await;
                    return;
                }
            }
        }
    }

    /// The checkpoint saved for the flow (the beginning if none), asking until the store
    /// answers; `None` once stopped.
    async fn stored_checkpoint(&self, pool: &FileTurn) -> Option<FileCheckpoint> {
        let mut backoff = Backoff::default();
        loop {
            match pool.feed.file_checkpoint(&pool.flow).await {
                Ok(stored) => return Some(stored.unwrap_or_default()),
                Err(error) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(flow = %pool.flow.name, step = backoff.step(), %error,
                        "cannot read the file checkpoint; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.deliverer.stop.cancelled() => return None,
                    }
                }
            }
        }
    }

    /// Reads the files from `from` on (the files before it and its first `offset` bytes are
    /// taken as read).
    async fn read_from(
        &self,
        files: &[Matched],
        from: &FileCheckpoint,
        checkpoints: Option<&Arc<Checkpoints>>,
        turn: Option<&Turn>,
    ) -> ReadEnd {
        let from_path = PathBuf::from(&from.path);
        for file in files {
            let (offset, line) = match file.path.cmp(&from_path) {
                std::cmp::Ordering::Less if !from.path.is_empty() => {
                    self.deliverer
                        .progress
                        .bytes_read
                        .fetch_add(file.len, Ordering::Relaxed);
                    continue;
                }
                std::cmp::Ordering::Equal => (from.offset, from.line),
                _ => (0, 0),
            };
            let read = FileRead {
                offset,
                line,
                checkpoints,
                turn,
            };
            match self.read_file(file, read).await {
                Err(why) => {
                    self.deliverer.progress.fail(why);
                    return ReadEnd::Stopped;
                }
                Ok(ReadEnd::Done) => {}
                Ok(end) => return end,
            }
            if self.deliverer.stop.is_cancelled() {
                return ReadEnd::Stopped;
            }
        }
        ReadEnd::Done
    }

    /// Reads one file to its end (or until stopped, or the turn is lost); `Err` when it
    /// cannot be read.
    async fn read_file(&self, file: &Matched, at: FileRead<'_>) -> Result<ReadEnd, String> {
        let unreadable = |e: std::io::Error| format!("cannot read {}: {e}", file.path.display());
        let mut handle = tokio::fs::File::open(&file.path)
            .await
            .map_err(unreadable)?;
        let start = u64::try_from(at.offset).unwrap_or_default();
        if start > 0 {
            handle
                .seek(std::io::SeekFrom::Start(start))
                .await
                .map_err(unreadable)?;
            self.deliverer
                .progress
                .bytes_read
                .fetch_add(start, Ordering::Relaxed);
        }
        let mut lines = BoundedLines::new(handle, self.max_record_bytes);
        let mut chunk = Vec::with_capacity(CHUNK);
        let mut chunk_bytes = 0;
        let mut line = Vec::new();
        let mut number = usize::try_from(at.line).unwrap_or_default();
        let mut offset = start;
        let mut records = 0u64;
        while let Some(read) = lines.next_line(&mut line).await.map_err(unreadable)? {
            number += 1;
            let line_start = offset;
            offset += read.bytes;
            let progress = &self.deliverer.progress;
            progress.bytes_read.fetch_add(read.bytes, Ordering::Relaxed);
            let message = match read.too_long {
                None => record(&line, &file.text, number, file.modified_ms),
                Some(len) => {
                    let long = LongLine {
                        file: &file.text,
                        number,
                        offset: line_start,
                        len,
                        max: self.max_record_bytes,
                    };
                    Some(too_large(&long, &line, file.modified_ms))
                }
            };
            if let Some(message) = message {
                records += 1;
                if self.in_interval(&message) {
                    chunk_bytes += message.size();
                    chunk.push(message);
                } else {
                    progress.outside_interval.fetch_add(1, Ordering::Relaxed);
                }
            }
            if chunk.len() == CHUNK || chunk_bytes >= CHUNK_BYTES {
                chunk_bytes = 0;
                let end = checkpoint(&file.text, offset, number);
                if !self
                    .deliver(std::mem::take(&mut chunk), &at, end, &mut records)
                    .await
                {
                    return Ok(ReadEnd::Stopped);
                }
                if at.turn.is_some_and(Turn::lost) {
                    return Ok(ReadEnd::Lost);
                }
            }
        }
        let end = checkpoint(&file.text, offset, number);
        if !self.deliver(chunk, &at, end, &mut records).await {
            return Ok(ReadEnd::Stopped);
        }
        Ok(ReadEnd::Done)
    }

    /// Delivers a chunk ending at `end` and counts the records read for it; `false` once
    /// stopped.
    async fn deliver(
        &self,
        chunk: Vec<SourceMessage>,
        at: &FileRead<'_>,
        end: FileCheckpoint,
        records: &mut u64,
    ) -> bool {
        if let Some(counters) = &self.counters {
            counters.records_read(std::mem::take(records));
        }
        self.deliverer
            .deliver(chunk, at.checkpoints.map(|c| (c, end)))
            .await
    }

    /// Whether a record belongs to this read: every record without a data interval; with one,
    /// a record whose event time (or file time) lies in it, and every line that is not a record.
    fn in_interval(&self, message: &SourceMessage) -> bool {
        let Some((start, end)) = self.within else {
            return true;
        };
        if message.problem.is_some() {
            return true;
        }
        let event = message.event_time_ms.unwrap_or(message.publish_time_ms);
        start <= event && event < end
    }
}

/// The checkpoint after a line ending at byte `offset` of `path` (line `number`).
fn checkpoint(path: &str, offset: u64, number: usize) -> FileCheckpoint {
    FileCheckpoint {
        path: path.to_owned(),
        offset: i64::try_from(offset).unwrap_or(i64::MAX),
        line: i64::try_from(number).unwrap_or(i64::MAX),
    }
}

/// Saves the checkpoint every [`CHECKPOINT_EVERY`] while it moves (until aborted).
async fn keep_saving(pool: FileTurn, checkpoints: Arc<Checkpoints>, mut saved: FileCheckpoint) {
    loop {
        tokio::time::sleep(CHECKPOINT_EVERY).await;
        let reached = checkpoints.reached();
        if reached == saved {
            continue;
        }
        match pool.feed.save_file_checkpoint(&pool.flow, &reached).await {
            Ok(()) => saved = reached,
            Err(error) => {
                tracing::debug!(flow = %pool.flow.name, %error,
                    "cannot save the file checkpoint; trying again");
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::Write;

    #[tokio::test]
    async fn a_chunk_of_large_records_ends_at_chunk_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        // Records of 768 KiB of data each (1 MiB of base64), 40 of them: far fewer than CHUNK.
        let data = "x".repeat(1024 * 1024);
        let line = |i: usize| format!("{{\"id\":\"r{i}\",\"data\":\"{data}\"}}\n");
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for i in 0..40 {
            out.write_all(line(i).as_bytes()).unwrap();
        }
        out.flush().unwrap();
        drop(out);
        let source = FileSource::new(path.display().to_string());
        let progress = source.progress();
        let (intake, mut received) = mpsc::channel(1);
        // A budget of one message: the reader waits in its first chunk's delivery until the
        // first record is settled, so what it has read then is that chunk.
        let handle = Box::new(source)
            .start(intake, Budget::new(1, 1 << 40), CancellationToken::new())
            .await
            .unwrap();
        let first = received.recv().await.unwrap();
        let read = progress.bytes_read.load(Ordering::Relaxed);
        let per_record = 768 * 1024;
        let chunk: usize = (0..CHUNK_BYTES.div_ceil(per_record))
            .map(|i| line(i).len())
            .sum();
        assert_eq!(read, chunk as u64, "bytes read for the first chunk");
        drop(first);
        handle.close().await;
    }
}
