//! The read of a file source: the matched files in path order from a starting point, each line
//! a record (or a dead-letter problem), delivered in chunks within the flow's budget, the
//! records outside a run's data interval left out.
//!
//! Guarantees: every non-blank line from the starting point on is delivered or counted outside
//! the interval, in order; a chunk is delivered at [`CHUNK`] records or [`CHUNK_BYTES`], so what
//! is read ahead of the budget is bounded; with checkpoints, each chunk carries the position
//! after its last line.

use crate::flow::budget::Budget;
use crate::flow::delivery::SourceMessage;
use crate::source::SourceError;
use crate::source::bounded::{CHUNK, Deliverer};
use crate::source::file::FileSource;
use crate::source::file_checkpoint::Checkpoints;
use crate::source::file_glob::{Matched, matching_files};
use crate::source::file_lines::BoundedLines;
use crate::source::file_record::{LongLine, record, too_large};
use crate::source::turn::Turn;
use crate::source::{MessageSource, Received, SourceHandle};
use crate::telemetry::Counters;
use async_trait::async_trait;
use sluice_store::FileCheckpoint;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::AsyncSeekExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Bytes of records after which a chunk is delivered even if it has fewer than `CHUNK`
/// records: what a read holds ahead of the flow's budget (which bounds what is in flight after
/// delivery), whatever the size of the records.
pub(crate) const CHUNK_BYTES: usize = 16 * 1024 * 1024;

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
                patience: self.patience,
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
pub(super) enum ReadEnd {
    /// Every file read to its end.
    Done,
    /// Stopped, or a file could not be read (the progress says so).
    Stopped,
    /// Another worker holds the turn now.
    Lost,
}

/// Reads files into a [`Deliverer`], keeping the records of the data interval if there is one.
pub(super) struct Reader {
    pub(super) deliverer: Deliverer,
    within: Option<(i64, i64)>,
    counters: Option<Counters>,
    pub(super) pattern: String,
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

    /// Reads the files from `from` on (the files before it and its first `offset` bytes are
    /// taken as read).
    pub(super) async fn read_from(
        &self,
        files: &[Matched],
        from: &FileCheckpoint,
        checkpoints: Option<&Arc<Checkpoints>>,
        turn: Option<&Turn>,
    ) -> ReadEnd {
        let from_path = PathBuf::from(&from.path);
        // A checkpoint written under a relative glob (before globs were resolved beside the
        // pipeline file) cannot be placed among absolute paths: every file is read again, and
        // the ledger drops what was committed, rather than skipping files unread.
        let comparable = files
            .first()
            .is_none_or(|f| f.path.is_absolute() == from_path.is_absolute());
        if !comparable && !from.path.is_empty() {
            tracing::warn!(checkpoint = %from.path,
                "a file checkpoint of another form than the files' paths: reading every file again");
        }
        let from_path = if comparable {
            from_path
        } else {
            PathBuf::new()
        };
        for file in files {
            let (offset, line) = match file.path.cmp(&from_path) {
                std::cmp::Ordering::Less if !from_path.as_os_str().is_empty() => {
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
