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
//!
//! There is no publish time in a file: a record's publish time is its file's modification time,
//! and a record without `event_time` takes that as its event time.
//!
//! A scheduled run with a data interval reads only the records whose event time lies in it
//! ([`FileSource::within`]): the others are left out before delivery and counted in
//! [`SourceProgress::outside_interval`]; a line that is not a record has no event time and is
//! dead-lettered by whichever run reads it first.

use crate::bounded::{Deliverer, SkipCommitted, SourceProgress};
use crate::budget::Budget;
use crate::delivery::{SourceMessage, SourceProblem};
use crate::event_time::parse_event_time;
use crate::source::SourceError;
use crate::source::{MessageSource, Received, SourceHandle};
use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::bounded::CHUNK;

/// JSONL files matched by a glob, read once.
pub struct FileSource {
    pattern: String,
    skip: Option<SkipCommitted>,
    progress: Arc<SourceProgress>,
    /// Only records with an event time in `[start, end)` (ms) are read.
    within: Option<(i64, i64)>,
}

impl FileSource {
    /// A source of the files matching `pattern` (e.g. `data/history/*.jsonl`).
    pub fn new(pattern: impl Into<String>) -> Self {
        Self {
            pattern: pattern.into(),
            skip: None,
            progress: Arc::new(SourceProgress::default()),
            within: None,
        }
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
        files.push(Matched { path, modified_ms });
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
        let reader = Reader {
            deliverer: Deliverer {
                skip: self.skip,
                progress: self.progress.clone(),
                intake,
                budget,
                stop: stop.clone(),
            },
            within: self.within,
        };
        let task = tokio::spawn(async move {
            for file in files {
                if let Err(why) = reader.read_file(&file).await {
                    reader.deliverer.progress.fail(why);
                    return;
                }
                if reader.deliverer.stop.is_cancelled() {
                    return;
                }
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

/// Reads files into a [`Deliverer`], keeping the records of the data interval if there is one.
struct Reader {
    deliverer: Deliverer,
    within: Option<(i64, i64)>,
}

impl Reader {
    /// Reads one file to its end (or until stopped); `Err` when it cannot be read.
    async fn read_file(&self, file: &Matched) -> Result<(), String> {
        let unreadable = |e: std::io::Error| format!("cannot read {}: {e}", file.path.display());
        let handle = tokio::fs::File::open(&file.path)
            .await
            .map_err(unreadable)?;
        let mut lines = BufReader::new(handle);
        let mut chunk = Vec::with_capacity(CHUNK);
        let mut line = Vec::new();
        let mut number = 0usize;
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
            let progress = &self.deliverer.progress;
            progress
                .bytes_read
                .fetch_add(read as u64, Ordering::Relaxed);
            if let Some(message) = record(&line, &file.path, number, file.modified_ms) {
                if self.in_interval(&message) {
                    chunk.push(message);
                } else {
                    progress.outside_interval.fetch_add(1, Ordering::Relaxed);
                }
            }
            if chunk.len() == CHUNK && !self.deliverer.deliver(std::mem::take(&mut chunk)).await {
                return Ok(());
            }
        }
        self.deliverer.deliver(chunk).await;
        Ok(())
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
