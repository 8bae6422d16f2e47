//! `sink` targets: JSONL files, one per committed batch, without duplicates across crashes.
//!
//! # How a batch becomes a file
//!
//! 1. Inside the batch's store transaction, after the ledger has said which records are new
//!    ([`sluice_store::CommitHook`]), the new records are written to a hidden temporary file
//!    `.<stem>-<flow>-<commit id>.jsonl.tmp` and synced; the transaction also records the commit
//!    id (`sluice_commit_marks`). A failure here rolls the transaction back.
//! 2. After the commit, the file is renamed to `<stem>-<flow>-<commit id>.jsonl` (atomic), and
//!    only then are the messages acked. Until then its writer holds the temporary file locked
//!    (an advisory lock the operating system drops when the process dies). If the store
//!    reports an error after the hook ran, the commit may have landed all the same (a lost
//!    answer): once the batch settles, the writer asks the store
//!    ([`sluice_store::LedgerStore::commit_recorded`], which answers only once that transaction
//!    has ended, even if it is still committing on the server) and publishes or deletes the file.
//!    A rename that fails is retried until it succeeds; the batch is acked only after it.
//! 3. After a crash, [`JsonlSink::recover`] (run before the flow starts, IDLE flows included)
//!    looks at the flow's temporary files that nobody holds locked: one whose commit id is
//!    recorded is published (renamed), one whose commit never happened is deleted; its records
//!    come again and go into a later batch's file. A file another worker holds is left alone.
//!
//! # Guarantees
//!
//! * **Each record in exactly one published file**: a record is in a file only if its key was
//!   new in a committed transaction, and every committed transaction's file is published, by
//!   its writer or by the recovery; duplicates caught by either dedup tier are in no file.
//! * **No partial files**: readers only ever see complete files (rename after sync).
//! * **Same record shape as file sources**: `{"id", "message_id", "publish_time", "event_time",
//!   "attributes", "data"}` with `data` base64, so a sink's output can be read back by a file
//!   source. The target's store table holds the same rows (the record of what was written).

use base64::Engine;
use sluice_store::LedgerStore;
use sluice_store::{CommitHook, Effect, Entry, FlowHandle};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The sink of one flow into one `sink` target.
#[derive(Debug)]
pub struct JsonlSink {
    dir: PathBuf,
    /// `<stem>-<flow>-`: every file of this flow starts with it.
    prefix: String,
    /// Distinguishes this process's commits from every other's.
    process: String,
    next: AtomicU64,
}

impl JsonlSink {
    /// The sink of `flow` writing next to `path` (`out/events.jsonl` → `out/events-<flow>-*.jsonl`).
    pub fn new(path: &Path, flow: &str) -> Self {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sink".to_owned());
        Self {
            dir,
            prefix: format!("{stem}-{flow}-"),
            process: format!("{:016x}", rand::random::<u64>()),
            next: AtomicU64::new(0),
        }
    }

    /// The folder the files go to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The published files of this flow, in name order.
    pub fn files(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&self.prefix) && n.ends_with(".jsonl"))
            })
            .collect();
        files.sort();
        Ok(files)
    }

    /// The file work of one commit attempt of `entries` at `now_ms`.
    pub fn commit(&self, entries: &[Entry], now_ms: i64) -> SinkCommit {
        let id = format!(
            "{now_ms:013}-{}-{:06}",
            self.process,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let name = format!("{}{id}.jsonl", self.prefix);
        SinkCommit {
            temporary: self.dir.join(format!(".{name}.tmp")),
            published: self.dir.join(name),
            id,
            lines: entries.iter().map(line).collect(),
            written: Mutex::new(None),
            held: Mutex::new(None),
        }
    }

    /// Resolves what a crash left behind (see the module docs): returns (published, deleted).
    /// A temporary file another process holds locked (its commit is under way) is left alone;
    /// one that vanished meanwhile was resolved by its writer.
    pub async fn recover(
        &self,
        store: &dyn LedgerStore,
        flow: &FlowHandle,
    ) -> Result<(usize, usize), String> {
        let io = |e: std::io::Error| format!("sink folder {}: {e}", self.dir.display());
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let hidden = format!(".{}", self.prefix);
        let mut leftovers: Vec<(PathBuf, String)> = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some(rest) = name.strip_prefix(&hidden) else {
                continue;
            };
            if let Some(id) = rest.strip_suffix(".jsonl.tmp") {
                leftovers.push((path.clone(), id.to_owned()));
            } else if rest.ends_with(".part") {
                // A publication rewritten from memory that did not finish: its commit's file
                // is published (or will be) under its final name by its writer.
                ignore_missing(std::fs::remove_file(&path)).map_err(io)?;
            }
        }
        let (mut published, mut deleted) = (0, 0);
        for (path, id) in leftovers {
            let file = match std::fs::File::open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(e)),
            };
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => continue,
                Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
            }
            let recorded = store
                .commit_recorded(flow, &id)
                .await
                .map_err(|e| format!("cannot ask the store about sink commit {id}: {e}"))?;
            if recorded {
                let target = self.dir.join(format!("{}{id}.jsonl", self.prefix));
                ignore_missing(std::fs::rename(&path, &target)).map_err(io)?;
                published += 1;
            } else {
                ignore_missing(std::fs::remove_file(&path)).map_err(io)?;
                deleted += 1;
            }
            drop(file);
        }
        if published + deleted > 0 {
            sync_dir(&self.dir).map_err(io)?;
            tracing::info!(flow = %flow.name, published, deleted,
                "sink files left by a crash resolved");
        }
        Ok((published, deleted))
    }

    /// Deletes every published and temporary file of this flow (a reset or full refresh).
    pub fn clear(&self) -> std::io::Result<usize> {
        let hidden = format!(".{}", self.prefix);
        let mut removed = 0;
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let path = entry?.path();
            let ours = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                (n.starts_with(&self.prefix) && n.ends_with(".jsonl"))
                    || (n.starts_with(&hidden) && (n.ends_with(".tmp") || n.ends_with(".part")))
            });
            if ours {
                std::fs::remove_file(&path)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// The file of one commit attempt: written inside the transaction, published after it.
#[derive(Debug)]
pub struct SinkCommit {
    id: String,
    temporary: PathBuf,
    published: PathBuf,
    /// One line per entry; `None` for dead letters (they are not sink records).
    lines: Vec<Option<String>>,
    /// Which entries the ledger let through, once the transaction has run.
    written: Mutex<Option<Vec<bool>>>,
    /// The temporary file, locked while this attempt may still publish it: a recovery running
    /// meanwhile (another worker starting) leaves a locked file alone.
    held: Mutex<Option<std::fs::File>>,
}

impl SinkCommit {
    fn content(&self, written: &[bool]) -> String {
        let mut text = String::new();
        for (line, _) in self.lines.iter().zip(written).filter(|(_, w)| **w) {
            if let Some(line) = line {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// Whether the transaction ran this attempt's work (its commit may then have landed even
    /// if the store reported an error).
    pub fn ran(&self) -> bool {
        lock(&self.written).is_some()
    }

    /// This attempt's commit id.
    pub fn commit_id(&self) -> &str {
        &self.id
    }

    /// After the commit: makes the file visible under its final name, then lets go of it.
    pub fn publish(&self) -> std::io::Result<()> {
        let Some(written) = lock(&self.written).clone() else {
            return Ok(());
        };
        let content = self.content(&written);
        if content.is_empty() {
            return Ok(());
        }
        let renamed = std::fs::rename(&self.temporary, &self.published);
        // Released only now: until the rename, a recovery must not touch the file.
        lock(&self.held).take();
        match renamed {
            Ok(()) => {}
            // Published by a recovery already (its commit is recorded).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.published.exists() => {}
            // Gone without being published (removed by hand): write it again from memory.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let part = self
                    .temporary
                    .with_extension(format!("{:08x}.part", rand::random::<u32>()));
                write_synced(&part, &content)?;
                std::fs::rename(&part, &self.published)?;
            }
            Err(e) => return Err(e),
        }
        sync_dir(self.published.parent().unwrap_or(Path::new(".")))
    }

    /// After a commit known not to have happened: removes the temporary file.
    pub fn discard(&self) {
        lock(&self.held).take();
        if let Err(error) = std::fs::remove_file(&self.temporary)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %self.temporary.display(), %error,
                "cannot remove the file of a sink commit that did not happen; recovery will");
        }
    }

    /// Lets go of the temporary file without deciding (the commit's outcome is unknown): the
    /// next start's recovery decides from the store.
    pub fn release(&self) {
        lock(&self.held).take();
    }
}

/// A mutex's content even if a panic poisoned it (the data here stays consistent).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CommitHook for SinkCommit {
    fn id(&self) -> &str {
        &self.id
    }

    fn before_commit(&self, written: &[bool]) -> Result<(), String> {
        let content = self.content(written);
        if !content.is_empty() {
            let file = write_locked(&self.temporary, &content)
                .map_err(|e| format!("cannot write {}: {e}", self.temporary.display()))?;
            *lock(&self.held) = Some(file);
        }
        *lock(&self.written) = Some(written.to_vec());
        Ok(())
    }
}

/// Creates `path` locked (an exclusive advisory lock, released when the file is dropped or the
/// process dies), writes and syncs it and its folder, and returns it still locked.
fn write_locked(path: &Path, content: &str) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::File::create(path)?;
    file.lock()?;
    file.write_all(content.as_bytes())?;
    file.sync_all()?;
    // The file's name too must survive a crash of the machine once the transaction commits.
    sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    Ok(file)
}

fn write_synced(path: &Path, content: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::File::create(path)?;
    file.write_all(content.as_bytes())?;
    file.sync_all()
}

/// `Ok` also when the file was not there (someone else resolved it first).
fn ignore_missing(result: std::io::Result<()>) -> std::io::Result<()> {
    match result {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// A record's line, or `None` for a dead letter. The attributes are already JSON text (the
/// commit wrote them so): they are spliced in as they are, not parsed again per record.
fn line(entry: &Entry) -> Option<String> {
    let Effect::Row { event_time_ms, .. } = entry.effect else {
        return None;
    };
    let m = &entry.message;
    let text = |value: &str| serde_json::Value::from(value).to_string();
    Some(format!(
        "{{\"id\":{},\"message_id\":{},\"publish_time\":{},\"event_time\":{event_time_ms},\"attributes\":{},\"data\":\"{}\"}}",
        text(entry.key.as_str()),
        text(&m.message_id),
        m.publish_time_ms,
        m.attributes_json,
        base64::engine::general_purpose::STANDARD.encode(&m.data),
    ))
}
