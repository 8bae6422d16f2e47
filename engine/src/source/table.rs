//! A source reading a target table of the same pipeline (`source: { table: X }`) as a feed:
//! what is committed to the table, in commit order, from where the reading flow left off.
//!
//! # Guarantees
//!
//! * **Every committed row once, none skipped.** The reading flow's position
//!   ([`sluice_store::ReadPosition`], see the store's `feed` module) is a planned range of the
//!   table's commits and the last row of it the flow committed; a row committed by a
//!   transaction that finished after a later one began still falls in the range of its own
//!   commit, so writers committing out of order (several batches of a flow at once on
//!   PostgreSQL, several replicas) never make the reader skip it.
//! * **The position commits with the effects.** Each page of the table is one batch of the
//!   reading flow, and that batch's commit moves the position past the page in the same
//!   transaction as its rows and dead letters. A crash anywhere replays only pages that did not
//!   commit; a row is keyed `<writer flow>/<dedup key>` in the reading flow, so the ledger
//!   catches anything a replay brings twice.
//! * **A replay is the same batch.** A range's end is fixed in the store before any of its rows
//!   is read, and a page is the first rows after the position (at most [`PAGE_ROWS`], cut
//!   deterministically to a quarter of the byte budget), so the page a replay reads holds the
//!   same records as the attempt it replaces: a `foreach_batch` handler or a sink gets the same
//!   batch id (derived from the page's keys) with the same records.
//! * **Pages commit in order, one reader at a time.** The flow's batches may commit several at
//!   a time (PostgreSQL), but each waits for the one before it to have committed before it
//!   moves the position (`page.rs`). In a pool, only the holder of the lease `feed/<flow>` reads (one replica at a time;
//!   it changes hands within [`crate::source::turn::TURN_TTL`] of its holder's death), and every position change is
//!   fenced by version, so a reader that lost its turn can never move the position: its pages
//!   are given back and it reads on from the stored position once it holds the lease again.
//! * **Following or catching up.** Following ([`TableSource::follow`], continuous pipelines),
//!   the source polls for new commits and never ends by itself; otherwise it reads up to the
//!   table's commits at its start and ends (triggered runs read what is new since the last
//!   run; once flows read the table as it is).
//! * **The table's watermark travels on.** With [`TableSource::with_watermark`], the
//!   watermark of the table's live writers is read before each range is planned and becomes
//!   the reading flow's own (stored, so flows further down take it over in turn) once the
//!   range is committed: every row committed before the range's end is then in the flow's
//!   target, and any row committed to the table later was late there already. A source that
//!   has caught up hands the watermark it read before finding nothing new on at once.
//! * Event time and attributes carry over from the row; its publish time too.

use crate::backoff::Backoff;
use crate::flow::budget::Budget;
use crate::flow::delivery::{AckHandle, SourceMessage};
use crate::source::SourceError;
use crate::source::bounded::{Deliverer, Running, SkipCommitted, SourceProgress};
use crate::source::page::{PageMark, PageTracker};
use crate::source::turn::{ReaderTurn, Turn};
use crate::source::{MessageSource, Received, SourceHandle};
use crate::telemetry::Counters;
use crate::watermark::FlowWatermark;
use async_trait::async_trait;
use sluice_store::{
    FeedLag, FeedRow, FeedStore, FlowHandle, PositionAdvance, ProgressStore, ReadPosition,
    StoreError, StoredRow, WatermarkRecord,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Rows per page at most (a quarter of the message budget if that is smaller).
pub const PAGE_ROWS: usize = 1_000;
/// How often a following source looks for new commits by default.
pub const DEFAULT_POLL: Duration = Duration::from_millis(100);
/// How often the lag gauges are refreshed while reading.
const LAG_INTERVAL: Duration = Duration::from_secs(1);

/// Where the table's watermark comes from and where the flow's goes.
#[derive(Clone)]
pub struct TableWatermark {
    /// The store holding the writers' watermark records (and the flow's).
    pub store: Arc<dyn ProgressStore>,
    /// The table's live writers: its watermark is the smallest of theirs, none while one of
    /// them has none.
    pub writers: Vec<String>,
    /// The flow's watermark as this worker shows it.
    pub watermark: FlowWatermark,
}

/// Reads a target table as a feed (see the module docs).
pub struct TableSource {
    feed: Arc<dyn FeedStore>,
    flow: FlowHandle,
    table: Arc<str>,
    follow: Option<Duration>,
    turn: Option<ReaderTurn>,
    watermark: Option<TableWatermark>,
    skip: Option<SkipCommitted>,
    counters: Option<Counters>,
    progress: Arc<SourceProgress>,
}

impl TableSource {
    /// A source of the rows of `table` (a full table name, `<pipeline>__<target>`) for `flow`,
    /// which catches up with the table and ends.
    pub fn new(feed: Arc<dyn FeedStore>, flow: FlowHandle, table: impl Into<Arc<str>>) -> Self {
        Self {
            feed,
            flow,
            table: table.into(),
            follow: None,
            turn: None,
            watermark: None,
            skip: None,
            counters: None,
            progress: Arc::new(SourceProgress::default()),
        }
    }

    /// Follows the table, looking for new commits every `poll`, and never ends by itself.
    pub fn follow(mut self, poll: Duration) -> Self {
        self.follow = Some(poll);
        self
    }

    /// Reads only while this worker holds the flow's `feed/<flow>` lease.
    pub fn in_pool(mut self, turn: ReaderTurn) -> Self {
        self.turn = Some(turn);
        self
    }

    /// Takes the table's watermark over as the flow's (see the module docs).
    pub fn with_watermark(mut self, watermark: TableWatermark) -> Self {
        self.watermark = Some(watermark);
        self
    }

    /// Publishes the flow's feed lag gauges on `counters`.
    pub fn with_counters(mut self, counters: Counters) -> Self {
        self.counters = Some(counters);
        self
    }

    /// Skips rows the reading flow committed before it had a position (a flow that read the
    /// table in full before feeds existed; see [`SkipCommitted`]), on its first range only.
    pub fn skip_committed(mut self, skip: SkipCommitted) -> Self {
        self.skip = Some(skip);
        self
    }

    /// Its progress, and the reason it failed if it did.
    pub fn progress(&self) -> Arc<SourceProgress> {
        self.progress.clone()
    }
}

/// A row as a message of the reading flow.
fn message(row: StoredRow) -> SourceMessage {
    let attributes: BTreeMap<String, String> =
        serde_json::from_str::<serde_json::Value>(&row.attributes_json)
            .ok()
            .and_then(|value| match value {
                serde_json::Value::Object(map) => Some(
                    map.into_iter()
                        .map(|(k, v)| match v {
                            serde_json::Value::String(s) => (k, s),
                            other => (k, other.to_string()),
                        })
                        .collect(),
                ),
                _ => None,
            })
            .unwrap_or_default();
    SourceMessage {
        message_id: format!("{}/{}", row.flow, row.dedup_key),
        publish_time_ms: row.publish_time_ms,
        attributes,
        data: row.data,
        event_time_ms: Some(row.event_time_ms),
        problem: None,
    }
}

/// The first rows of a page that fit in `max_bytes` (at least one): the same rows always give
/// the same cut.
fn cut_to_bytes(mut rows: Vec<FeedRow>, max_bytes: usize) -> Vec<FeedRow> {
    let mut total = 0usize;
    let keep = rows
        .iter()
        .position(|r| {
            total = total.saturating_add(r.row.data.len() + r.row.attributes_json.len());
            total > max_bytes
        })
        .map_or(rows.len(), |at| at.max(1));
    rows.truncate(keep);
    rows
}

#[async_trait]
impl MessageSource for TableSource {
    async fn start(
        self: Box<Self>,
        intake: mpsc::Sender<Received>,
        budget: Budget,
        stop: CancellationToken,
    ) -> Result<Box<dyn SourceHandle>, SourceError> {
        let (max_messages, max_bytes) = budget.limits();
        let progress = self.progress.clone();
        let reader = Reader {
            page_rows: PAGE_ROWS.min((max_messages / 4).max(1)),
            page_bytes: (max_bytes / 4).max(1),
            deliverer: Deliverer {
                skip: self.skip.clone(),
                progress: progress.clone(),
                intake,
                budget,
                stop: stop.clone(),
            },
            tracker: PageTracker::new(),
            source: *self,
            keeper: None,
            lag_published: None,
        };
        let task = tokio::spawn(reader.run());
        Ok(Box::new(Running {
            stop,
            task,
            progress,
        }))
    }

    fn paged(&self) -> bool {
        true
    }
}

/// Why a reading epoch ended.
enum Interrupted {
    /// Stopped, caught up (not following), or the flow's run went away: the source ends.
    End,
    /// The position moved, a page was given back or the turn was lost: read the position
    /// again (once holding the turn).
    Restart,
}

/// The reading task.
struct Reader {
    source: TableSource,
    deliverer: Deliverer,
    tracker: Arc<PageTracker>,
    page_rows: usize,
    page_bytes: usize,
    keeper: Option<Turn>,
    lag_published: Option<Instant>,
}

impl Reader {
    async fn run(mut self) {
        loop {
            let interrupted = self.epoch().await;
            // Pages in flight settle (commit, or are given back) before anyone reads on.
            self.settled().await;
            if matches!(interrupted, Interrupted::End) || self.stopped() {
                break;
            }
        }
        self.leave_turn().await;
    }

    fn stopped(&self) -> bool {
        self.deliverer.stop.is_cancelled()
    }

    /// Only the first range can hold rows the flow committed before it had a position (it
    /// read the table in full before feeds existed): checked against its target there only.
    fn skip_in(&mut self, at: &ReadPosition) {
        self.deliverer.skip = if at.range_from.is_empty() {
            self.source.skip.clone()
        } else {
            None
        };
    }

    /// Waits for the pages in flight to settle; the state then.
    async fn settled(&self) -> crate::source::page::PageState {
        self.tracker.settled().await
    }

    /// Reads from the stored position until stopped, caught up (not following), or
    /// interrupted.
    async fn epoch(&mut self) -> Interrupted {
        if !self.take_turn().await {
            return Interrupted::End;
        }
        let (feed, flow, table) = (
            self.source.feed.clone(),
            self.source.flow.clone(),
            self.source.table.clone(),
        );
        let Some(mut at) = self
            .retry("read the position", || feed.read_position(&flow, &table))
            .await
        else {
            return Interrupted::End;
        };
        self.tracker.restart(at.version);
        self.skip_in(&at);
        let mut range_done = at.version == 0;
        let mut planned = false;
        let mut pending_watermark: Option<i64> = None;
        loop {
            if self.stopped() {
                return Interrupted::End;
            }
            if !self.keep_turn() {
                return Interrupted::Restart;
            }
            self.publish_lag(&at, false).await;
            if range_done {
                let state = tokio::select! {
                    state = self.tracker.settled() => state,
                    _ = self.deliverer.stop.cancelled() => return Interrupted::End,
                };
                if state.broken {
                    return Interrupted::Restart;
                }
                // Every page handed over committed: `at` is what the store holds.
                if let Some(watermark) = pending_watermark.take() {
                    self.offer_watermark(watermark).await;
                }
                if self.source.follow.is_none() && planned {
                    return Interrupted::End;
                }
                // Read before the table is looked at: then it holds for every row up to there.
                let watermark = self.table_watermark().await;
                if let Some(poll) = self.source.follow
                    && at.version > 0
                    && !self.has_news(&at).await
                {
                    // Caught up: the table's watermark holds for this flow's rows already.
                    if let Some(watermark) = watermark {
                        self.offer_watermark(watermark).await;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(poll) => {}
                        _ = self.deliverer.stop.cancelled() => return Interrupted::End,
                    }
                    continue;
                }
                let planning = self
                    .retry_or_moved("plan a range", || feed.plan_range(&flow, &table, &at))
                    .await;
                at = match planning {
                    Ok(Some(planned)) => planned,
                    Ok(None) => return Interrupted::End,
                    Err(Moved) => return Interrupted::Restart,
                };
                self.tracker.restart(at.version);
                self.skip_in(&at);
                pending_watermark = watermark;
                planned = true;
                range_done = false;
                continue;
            }
            let limit = self.page_rows;
            let Some(rows) = self
                .retry("read a page", || feed.read_range(&table, &at, limit))
                .await
            else {
                return Interrupted::End;
            };
            let read = rows.len();
            let rows = cut_to_bytes(rows, self.page_bytes);
            range_done = read < limit && rows.len() == read;
            let Some(last) = rows.last().map(|r| r.cursor) else {
                continue;
            };
            let mark = self.tracker.mark(PositionAdvance {
                table: table.clone(),
                expected_version: at.version,
                after: Some(last),
            });
            at.version += 1;
            at.after = Some(last);
            if !self.hand_over(rows, mark).await {
                return Interrupted::End;
            }
        }
    }

    /// Hands a page over whole (a stop waits for the page's end), then its mark.
    async fn hand_over(&self, rows: Vec<FeedRow>, mark: PageMark) -> bool {
        let messages: Vec<SourceMessage> = rows.into_iter().map(|r| message(r.row)).collect();
        let Some(present) = self.deliverer.already_committed(&messages).await else {
            return false;
        };
        let budget = &self.deliverer.budget;
        for (message, present) in messages.into_iter().zip(present) {
            if present {
                self.deliverer
                    .progress
                    .skipped
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Some(permit) = budget.reserve_message().await else {
                return false;
            };
            let permits = budget.reserve_bytes(permit, message.size()).await;
            let received = Received::new(message, Box::new(NoAck), permits);
            if self.deliverer.intake.send(received).await.is_err() {
                return false;
            }
            self.deliverer
                .progress
                .delivered
                .fetch_add(1, Ordering::Relaxed);
        }
        let Some(permit) = budget.reserve_message().await else {
            return false;
        };
        let end = Received::new(
            SourceMessage {
                message_id: String::new(),
                publish_time_ms: 0,
                attributes: BTreeMap::new(),
                data: bytes::Bytes::new(),
                event_time_ms: None,
                problem: None,
            },
            Box::new(NoAck),
            budget.reserve_bytes(permit, 0).await,
        )
        .ending_page(mark);
        self.deliverer.intake.send(end).await.is_ok()
    }

    /// Whether the table has commits after `at` (and refreshes the lag gauges with them); when
    /// the store cannot say, there may be: after a poll's wait (no tight loop while it keeps
    /// failing) the reader plans a range, which waits the store out, rather than take itself
    /// for caught up.
    async fn has_news(&mut self, at: &ReadPosition) -> bool {
        match self.lag(at).await {
            Some(lag) => {
                self.show_lag(lag);
                lag.rows_behind > 0
            }
            None => {
                let poll = self.source.follow.unwrap_or(DEFAULT_POLL);
                tokio::select! {
                    _ = tokio::time::sleep(poll) => {}
                    _ = self.deliverer.stop.cancelled() => {}
                }
                true
            }
        }
    }

    async fn lag(&self, at: &ReadPosition) -> Option<FeedLag> {
        match self.source.feed.feed_lag(&self.source.table, at).await {
            Ok(lag) => Some(lag),
            Err(error) => {
                tracing::warn!(table = %self.source.table, %error, "cannot measure the feed lag");
                None
            }
        }
    }

    fn show_lag(&mut self, lag: FeedLag) {
        self.lag_published = Some(Instant::now());
        if let Some(counters) = &self.source.counters {
            let age_ms = lag.oldest_unread_ms.map_or(0, |oldest| {
                crate::time::now_ms().saturating_sub(oldest).max(0)
            });
            counters.publish_feed_lag(lag.rows_behind, age_ms as f64 / 1000.0);
        }
    }

    /// Refreshes the lag gauges if they are due.
    async fn publish_lag(&mut self, at: &ReadPosition, now: bool) {
        if self.source.counters.is_none()
            || (!now
                && self
                    .lag_published
                    .is_some_and(|t| t.elapsed() < LAG_INTERVAL))
        {
            return;
        }
        if let Some(lag) = self.lag(at).await {
            self.show_lag(lag);
        }
    }

    /// The table's watermark now: the smallest of its live writers' stored ones.
    async fn table_watermark(&self) -> Option<i64> {
        let plan = self.source.watermark.as_ref()?;
        let records = match plan.store.watermarks(&self.source.flow.pipeline).await {
            Ok(records) => records,
            Err(error) => {
                tracing::debug!(%error, "cannot read the table's watermark; trying next range");
                return None;
            }
        };
        plan.writers
            .iter()
            .map(|writer| {
                records
                    .iter()
                    .find(|(flow, _)| flow == writer)
                    .map(|(_, record)| record.watermark_ms)
            })
            .try_fold(i64::MAX, |lowest, w| w.map(|w| lowest.min(w)))
            .filter(|w| *w != i64::MAX)
    }

    /// Makes `watermark_ms` the flow's watermark, here and in the store (only when it moves).
    async fn offer_watermark(&self, watermark_ms: i64) {
        let Some(plan) = &self.source.watermark else {
            return;
        };
        if plan
            .watermark
            .current()
            .is_some_and(|shown| shown >= watermark_ms)
        {
            return;
        }
        plan.watermark.advance(watermark_ms);
        let offer = WatermarkRecord {
            watermark_ms,
            horizon_ms: watermark_ms,
            updated_at_ms: crate::time::now_ms(),
        };
        if let Err(error) = plan
            .store
            .advance_watermark(&self.source.flow, &offer, None)
            .await
        {
            tracing::debug!(%error, "cannot store the flow's watermark; the next range will");
        }
        if let Some(counters) = &self.source.counters {
            counters.publish_watermark();
        }
    }

    /// Waits until this worker holds the flow's turn, then keeps renewing it in the background
    /// (the reader may wait longer than the lease lasts, for budget or for its pages to
    /// commit); `false` once stopped.
    async fn take_turn(&mut self) -> bool {
        let Some(turn) = self.source.turn.clone() else {
            return true;
        };
        let what = format!("table {}", self.source.table);
        self.keeper = turn
            .take(&self.source.flow, &what, &self.deliverer.stop)
            .await;
        self.keeper.is_some()
    }

    /// `false` if another worker has the turn now.
    fn keep_turn(&mut self) -> bool {
        let lost = self.keeper.as_ref().is_some_and(Turn::lost);
        if lost {
            tracing::warn!(flow = %self.source.flow.name,
                "lost the reader's turn; reading on once it is this worker's again");
            self.keeper = None;
        }
        !lost
    }

    async fn leave_turn(&mut self) {
        self.keeper = None;
        if let Some(turn) = &self.source.turn {
            turn.release(&self.source.flow).await;
        }
    }

    /// Asks the store until it answers (an outage is waited out with backoff); `None` when
    /// stopped meanwhile, or on an error retrying cannot mend (the flow fails).
    async fn retry<T, F, Fut>(&self, what: &str, mut ask: F) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        match self.retry_or_moved(what, &mut ask).await {
            Ok(answer) => answer,
            Err(Moved) => {
                self.deliverer.progress.fail(format!(
                    "cannot {what} of table {}: the position moved",
                    self.source.table
                ));
                None
            }
        }
    }

    /// As [`Reader::retry`], telling a moved position apart.
    async fn retry_or_moved<T, F, Fut>(&self, what: &str, mut ask: F) -> Result<Option<T>, Moved>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut backoff = Backoff::default();
        loop {
            let error = match ask().await {
                Ok(answer) => return Ok(Some(answer)),
                Err(StoreError::Moved) => return Err(Moved),
                Err(error) => error,
            };
            if !error.is_transient() {
                self.deliverer.progress.fail(format!(
                    "cannot {what} of table {}: {error}",
                    self.source.table
                ));
                return Ok(None);
            }
            let delay = backoff.next_delay();
            tracing::warn!(table = %self.source.table, step = backoff.step(), %error,
                "cannot {what} of the source table; retrying");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.deliverer.stop.cancelled() => return Ok(None),
            }
        }
    }
}

/// The position moved under the reader.
struct Moved;

/// The ack handle of a table record: a page is found again by its position, not redelivered.
struct NoAck;

impl AckHandle for NoAck {
    fn ack(self: Box<Self>) {}

    fn nack(self: Box<Self>) {}
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn row(bytes: usize) -> FeedRow {
        FeedRow {
            row: StoredRow {
                flow: "f".into(),
                dedup_key: "k".into(),
                message_id: "m".into(),
                publish_time_ms: 0,
                event_time_ms: 0,
                attributes_json: String::new(),
                data: bytes::Bytes::from(vec![0u8; bytes]),
            },
            cursor: (0, 0),
            committed_at_ms: 0,
        }
    }

    #[test]
    fn pages_are_cut_to_the_byte_bound_keeping_at_least_one_row() {
        let rows = || vec![row(40), row(40), row(40)];
        assert_eq!(cut_to_bytes(rows(), 100).len(), 2);
        assert_eq!(cut_to_bytes(rows(), 120).len(), 3);
        assert_eq!(cut_to_bytes(rows(), 10).len(), 1);
        assert_eq!(cut_to_bytes(Vec::new(), 10).len(), 0);
    }
}
