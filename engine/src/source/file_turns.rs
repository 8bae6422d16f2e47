//! A file source read in a pool: one replica at a time reads, holding the flow's turn (the
//! lease `feed/<flow>`), from the checkpoint the last holder saved.
//!
//! Guarantees: the checkpoint passes only settled records, in order (`file_checkpoint.rs`), and
//! is saved every [`CHECKPOINT_EVERY`] while it moves, and once more when a read ends; a reader
//! that lost its turn saves nothing more, leaving the checkpoint to its successor.

use crate::source::file::{CHECKPOINT_EVERY, FileTurn};
use crate::source::file_checkpoint::Checkpoints;
use crate::source::file_glob::Matched;
use crate::source::file_reader::{ReadEnd, Reader};
use sluice_store::FileCheckpoint;
use std::sync::Arc;

impl Reader {
    /// Reads in this worker's turns, each from the stored checkpoint, until every file was
    /// read (by this worker or an earlier holder) or the source stops.
    pub(super) async fn read_in_turns(&self, files: &[Matched], pool: &FileTurn) {
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
        let mut backoff = self.deliverer.backoff();
        loop {
            match pool.feed.file_checkpoint(&pool.flow).await {
                Ok(stored) => return Some(stored.unwrap_or_default()),
                Err(error) => {
                    if self
                        .deliverer
                        .gives_up(&backoff, "read the file checkpoint", &error)
                    {
                        return None;
                    }
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
