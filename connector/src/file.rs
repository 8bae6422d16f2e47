//! A bounded source: JSONL files matched by a glob, read once (SPEC §4, "File sources").
//!
//! Each line is one record `{"id": "...", "data": <JSON, or a base64 string>, "attributes":
//! {...}, "event_time": "RFC 3339" | ms}`; `id` becomes the message id, hence the dedup key.
//!
//! # Guarantees
//!
//! * **Nothing lost.** Every non-blank line reaches the stage: a line that is not a JSON object,
//!   whose `data` string is not base64, that has no `id`, or whose `event_time` cannot be read
//!   is delivered with a [`SourceProblem`] and becomes a dead letter (`undecodable`,
//!   `missing_id`, `bad_timestamp`), keyed by `FILE:LINE` so that re-reading it does not
//!   dead-letter it twice.
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

use crate::backoff::Backoff;
use crate::bounded::{Deliverer, SkipCommitted, SourceProgress};
use crate::budget::Budget;
use crate::delivery::{SourceMessage, SourceProblem};
use crate::event_time::parse_event_time;
use crate::file_checkpoint::Checkpoints;
use crate::source::SourceError;
use crate::source::{MessageSource, Received, SourceHandle};
use crate::telemetry::Counters;
use crate::turn::{ReaderTurn, Turn};
use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use serde_json::Value;
use sluice_store::{FeedStore, FileCheckpoint, FlowHandle};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncSeekExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::bounded::CHUNK;

/// How often the holder of a pooled read saves its checkpoint (when it moved).
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(250);

/// JSONL files matched by a glob, read once.
pub struct FileSource {
    pattern: String,
    skip: Option<SkipCommitted>,
    progress: Arc<SourceProgress>,
    /// Only records with an event time in `[start, end)` (ms) are read.
    within: Option<(i64, i64)>,
    pool: Option<FileTurn>,
    counters: Option<Counters>,
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
        }
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

/// A matched file.
struct Matched {
    path: PathBuf,
    modified_ms: i64,
    len: u64,
}

/// The files matching `pattern`, in path order; every one must be a readable file.
fn matching_files(pattern: &str) -> Result<(Vec<Matched>, u64), SourceError> {
    let paths = glob::glob(pattern)
        .map_err(|e| SourceError::File(format!("file source {pattern:?}: bad pattern: {e}")))?;
    let mut files = Vec::new();
    let mut total = 0;
    for path in paths {
        let path = path.map_err(|e| SourceError::File(format!("cannot read {e}")))?;
        let unreadable =
            |e: std::io::Error| SourceError::File(format!("cannot read {}: {e}", path.display()));
        let metadata = std::fs::metadata(&path).map_err(unreadable)?;
        if metadata.is_dir() {
            return Err(SourceError::File(format!(
                "{} matches {pattern:?} but is a directory",
                path.display()
            )));
        }
        // Opening now reports a permission problem before anything is delivered.
        std::fs::File::open(&path).map_err(unreadable)?;
        let modified_ms = metadata
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .unwrap_or_default();
        total += metadata.len();
        files.push(Matched {
            path,
            modified_ms,
            len: metadata.len(),
        });
    }
    if files.is_empty() {
        return Err(SourceError::File(format!("no file matches {pattern:?}")));
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((files, total))
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
        };
        let pool = self.pool;
        let task = tokio::spawn(async move {
            match pool {
                None => reader.read_all(&files).await,
                Some(pool) => reader.read_in_turns(&files, &pool).await,
            }
            // Dropping the reader closes the intake: the flow ends once it is all committed.
        });
        Ok(Box::new(crate::bounded::Running {
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
        let path_text = file.path.to_string_lossy().into_owned();
        let mut lines = BufReader::new(handle);
        let mut chunk = Vec::with_capacity(CHUNK);
        let mut line = Vec::new();
        let mut number = usize::try_from(at.line).unwrap_or_default();
        let mut offset = start;
        let mut records = 0u64;
        loop {
            line.clear();
            let read = lines
                .read_until(b'\n', &mut line)
                .await
                .map_err(unreadable)?;
            if read == 0 {
                break;
            }
            number += 1;
            offset += read as u64;
            let progress = &self.deliverer.progress;
            progress
                .bytes_read
                .fetch_add(read as u64, Ordering::Relaxed);
            if let Some(message) = record(&line, &file.path, number, file.modified_ms) {
                records += 1;
                if self.in_interval(&message) {
                    chunk.push(message);
                } else {
                    progress.outside_interval.fetch_add(1, Ordering::Relaxed);
                }
            }
            if chunk.len() == CHUNK {
                let end = checkpoint(&path_text, offset, number);
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
        let end = checkpoint(&path_text, offset, number);
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

/// One line as a message; `None` for a blank line.
fn record(line: &[u8], file: &Path, number: usize, modified_ms: i64) -> Option<SourceMessage> {
    let text = line.trim_ascii();
    if text.is_empty() {
        return None;
    }
    let message = match parse(text) {
        Ok(parsed) => SourceMessage {
            message_id: parsed.id,
            publish_time_ms: modified_ms,
            attributes: parsed.attributes,
            data: parsed.data,
            event_time_ms: parsed.event_time_ms,
            problem: None,
        },
        // Only a line that is not a record needs its position (its key) and its raw text.
        Err(problem) => {
            let position = format!("{}:{number}", file.display());
            SourceMessage {
                problem: Some(SourceProblem {
                    reason: problem.reason,
                    error: format!("{position}: {}", problem.error),
                }),
                message_id: position,
                publish_time_ms: modified_ms,
                attributes: BTreeMap::new(),
                data: Bytes::copy_from_slice(text),
                event_time_ms: None,
            }
        }
    };
    Some(message)
}

struct Parsed {
    id: String,
    attributes: BTreeMap<String, String>,
    data: Bytes,
    event_time_ms: Option<i64>,
}

fn problem(reason: &'static str, error: impl Into<String>) -> SourceProblem {
    SourceProblem {
        reason,
        error: error.into(),
    }
}

fn parse(text: &[u8]) -> Result<Parsed, SourceProblem> {
    let value: Value = serde_json::from_slice(text)
        .map_err(|e| problem("undecodable", format!("not JSON: {e}")))?;
    let Value::Object(mut record) = value else {
        return Err(problem("undecodable", "a record must be a JSON object"));
    };
    let id = match record.remove("id") {
        Some(Value::String(id)) if !id.is_empty() => id,
        Some(Value::Number(id)) => id.to_string(),
        _ => return Err(problem("missing_id", "the record has no `id`")),
    };
    let attributes = match record.remove("attributes") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(map)) => map
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        Some(_) => return Err(problem("undecodable", "`attributes` must be an object")),
    };
    let data = match record.remove("data") {
        None | Some(Value::Null) => Bytes::new(),
        Some(Value::String(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded.as_bytes())
            .map(Bytes::from)
            .map_err(|e| {
                problem(
                    "undecodable",
                    format!("`data` is a string but not base64: {e}"),
                )
            })?,
        Some(other) => Bytes::from(other.to_string()),
    };
    let event_time_ms = match record.remove("event_time") {
        None | Some(Value::Null) => None,
        Some(Value::Number(ms)) => Some(ms.as_i64().ok_or_else(|| {
            problem(
                "bad_timestamp",
                format!("`event_time` {ms} is not whole milliseconds"),
            )
        })?),
        Some(Value::String(text)) => Some(parse_event_time(&text).ok_or_else(|| {
            problem(
                "bad_timestamp",
                format!("`event_time` {text:?} is neither ms since epoch nor RFC 3339"),
            )
        })?),
        Some(other) => {
            return Err(problem(
                "bad_timestamp",
                format!("`event_time` {other} is neither ms since epoch nor RFC 3339"),
            ));
        }
    };
    Ok(Parsed {
        id,
        attributes,
        data,
        event_time_ms,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn one(line: &str) -> SourceMessage {
        record(line.as_bytes(), Path::new("f.jsonl"), 7, 1_000).unwrap()
    }

    #[test]
    fn records_of_every_shape() {
        let m = one(
            r#"{"id":"a","data":{"x":1},"attributes":{"k":"v","n":2},"event_time":"1970-01-01T00:00:02Z"}"#,
        );
        assert_eq!(m.message_id, "a");
        assert_eq!(&m.data[..], br#"{"x":1}"#);
        assert_eq!(m.attributes["k"], "v");
        assert_eq!(m.attributes["n"], "2");
        assert_eq!(m.event_time_ms, Some(2_000));
        assert_eq!(m.publish_time_ms, 1_000);
        assert!(m.problem.is_none());

        let m = one(r#"{"id": 12, "data": "aGVsbG8=", "event_time": 5}"#);
        assert_eq!((m.message_id.as_str(), &m.data[..]), ("12", &b"hello"[..]));
        assert_eq!(m.event_time_ms, Some(5));

        let m = one(r#"{"id":"b"}"#);
        assert_eq!((m.event_time_ms, m.data.len()), (None, 0));
        assert!(record(b"  \r\n", Path::new("f"), 1, 0).is_none());
    }

    #[test]
    fn bad_lines_become_problems_keyed_by_position() {
        for (line, reason) in [
            ("not json", "undecodable"),
            ("[1,2]", "undecodable"),
            (r#"{"data":"x"}"#, "missing_id"),
            (r#"{"id":"a","data":"%%%"}"#, "undecodable"),
            (r#"{"id":"a","attributes":[1]}"#, "undecodable"),
            (r#"{"id":"a","event_time":"yesterday"}"#, "bad_timestamp"),
            (r#"{"id":"a","event_time":1.5}"#, "bad_timestamp"),
        ] {
            let m = one(line);
            let problem = m.problem.expect(line);
            assert_eq!(problem.reason, reason, "{line}");
            assert!(
                problem.error.starts_with("f.jsonl:7: "),
                "{}",
                problem.error
            );
            assert_eq!(m.message_id, "f.jsonl:7", "{line}");
            assert_eq!(&m.data[..], line.as_bytes());
        }
    }

    #[test]
    fn unreadable_sources_fail_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = dir.path().join("*.jsonl").display().to_string();
        let error = matching_files(&pattern).err().unwrap().to_string();
        assert!(error.contains("no file matches"), "{error}");
        std::fs::create_dir(dir.path().join("d.jsonl")).unwrap();
        let error = matching_files(&pattern).err().unwrap().to_string();
        assert!(error.contains("is a directory"), "{error}");
        std::fs::remove_dir(dir.path().join("d.jsonl")).unwrap();
        std::fs::write(dir.path().join("b.jsonl"), "{}\n").unwrap();
        std::fs::write(dir.path().join("a.jsonl"), "{}\n{}\n").unwrap();
        let (files, total) = matching_files(&pattern).unwrap();
        let names: Vec<_> = files.iter().map(|f| f.path.file_name().unwrap()).collect();
        assert_eq!(names, ["a.jsonl", "b.jsonl"]);
        assert_eq!(total, 9);
    }
}
