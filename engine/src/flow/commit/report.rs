//! What a commit is configured with and what it reports: a flow's retry settings, the caller's
//! own writes in a commit ([`BatchWork`]), and the counts of a committed batch.
//!
//! Guarantee: a committed batch is counted from the store's answer (an entry the ledger found
//! duplicate counts as a duplicate, never as a row or a dead letter), and only then settled
//! (acked).

use crate::flow::batch::Batch;
use sluice_store::Effect;
use std::time::Duration;

/// Retry settings of a flow.
#[derive(Debug, Clone, Copy)]
pub struct RetrySettings {
    /// Attempts before a failing message is dead-lettered (at least 1).
    pub max_attempts: u32,
    /// Ledger keys written now expire after this (the dedup window).
    pub dedup_window: Duration,
    /// A delivery received longer ago than this is given back (nacked) instead of committed:
    /// `commit_bound` of the dedup window for sources that redeliver (Pub/Sub);
    /// `None` for sources where a nack would drop the record (files, tables).
    pub commit_bound: Option<Duration>,
    /// How long one batch's commit is retried while the store or stage is unavailable before
    /// the flow stops failed (a triggered run's `give_up_after`); `None`: for ever.
    pub give_up_after: Option<Duration>,
}

/// What became of one batch, or of a run (`sluice_connector::JobReport`); reports add up.
///
/// ```
/// let mut total = sluice_engine::CommitReport::default();
/// total += sluice_engine::CommitReport::default();
/// assert_eq!(total.rows, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommitReport {
    /// Target rows written.
    pub rows: u64,
    /// Dead-letter rows written.
    pub dead_letters: u64,
    /// Entries the ledger found duplicate.
    pub duplicates: u64,
    /// Messages acked, redeliveries parked behind the batch's messages included (for a flow
    /// with a watermark, those parked are acked once their reports are stored, a tick later).
    pub acked: u64,
    /// Messages nacked because the caller gave up.
    pub abandoned: u64,
}

impl std::ops::AddAssign for CommitReport {
    fn add_assign(&mut self, other: Self) {
        self.rows += other.rows;
        self.dead_letters += other.dead_letters;
        self.duplicates += other.duplicates;
        self.acked += other.acked;
        self.abandoned += other.abandoned;
    }
}

/// The caller's own writes for a batch, done in its commit's transaction (a library job's
/// handler): given the batch and its staged effects, the work the store runs.
pub trait BatchWork: Send + Sync {
    /// The work the store runs in the commit of `batch`, whose staged effects are `effects`.
    fn work(&self, batch: &Batch, effects: &[Effect]) -> sluice_store::TransactionWork;
}

/// (rows, dead letters, duplicates) written by a committed batch, from which entries were dead
/// letters and which the ledger accepted.
fn count_written(dead: &[Option<String>], written: &[bool]) -> (u64, u64, u64) {
    let (mut rows, mut dead_letters, mut duplicates) = (0, 0, 0);
    for (reason, &is_new) in dead.iter().zip(written) {
        match (is_new, reason.is_some()) {
            (false, _) => duplicates += 1,
            (true, true) => dead_letters += 1,
            (true, false) => rows += 1,
        }
    }
    (rows, dead_letters, duplicates)
}

/// Counts a batch whose commit landed (rows, duplicates, rows below the watermark, dead letters
/// by reason), then settles it (acks); what became of it. `dead[i]` is entry `i`'s dead-letter
/// reason, `row_event_times[i]` its row's event time (kept for a flow with a watermark), and
/// `written[i]` whether the ledger took it.
pub(super) fn count_and_settle(
    batch: Batch,
    dead: &[Option<String>],
    row_event_times: &[Option<i64>],
    written: &[bool],
    filtered: u64,
) -> CommitReport {
    let (rows, dead_letters, duplicates) = count_written(dead, written);
    // Rows a typed flow's `where:` left out: new keys, acked, no row.
    let rows = rows.saturating_sub(filtered);
    if filtered > 0 {
        batch.counters().filtered(filtered);
    }
    batch.counters().committed(rows, duplicates);
    // Late: below the watermark as it is once the commit has landed.
    let late_rows = batch.watermark_ms().map_or(0, |watermark| {
        row_event_times
            .iter()
            .zip(written)
            .filter(|(event, written)| **written && event.is_some_and(|e| e < watermark))
            .count()
    });
    if late_rows > 0 {
        tracing::debug!(late_rows, "rows committed below the watermark");
        batch.counters().late(late_rows as u64);
    }
    for (reason, _) in dead.iter().zip(written).filter(|(_, written)| **written) {
        if let Some(reason) = reason {
            batch.counters().dead_lettered(reason, 1);
        }
    }
    let acked = batch.settle_recorded(written);
    CommitReport {
        rows,
        dead_letters,
        duplicates,
        acked,
        abandoned: 0,
    }
}
