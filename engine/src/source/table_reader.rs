//! The reading task of a table source: the position read, ranges planned, pages read and
//! handed over whole, one reader at a time in a pool (see `table.rs` for the guarantees).
//!
//! Guarantee: a page is handed over only after the pages before it, and the next range is
//! planned only once every page handed over committed; a moved position or a lost turn starts
//! the reading again from the stored position once the pages in flight settled.

use crate::flow::budget::Budget;
use crate::flow::delivery::SourceMessage;
use crate::source::SourceError;
use crate::source::bounded::{Deliverer, Running};
use crate::source::page::{PageMark, PageTracker};
use crate::source::table::{DEFAULT_POLL, PAGE_ROWS, TableSource};
use crate::source::table_rows::{NoAck, cut_to_bytes, message};
use crate::source::turn::Turn;
use crate::source::{MessageSource, Received, SourceHandle};
use async_trait::async_trait;
use sluice_store::{FeedLag, FeedRow, PositionAdvance, ReadPosition, StoreError};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How often the lag gauges are refreshed while reading.
const LAG_INTERVAL: Duration = Duration::from_secs(1);

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
                patience: self.patience,
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
        plan.read(&self.source.flow.pipeline).await
    }

    /// Makes `watermark_ms` the flow's watermark, here and in the store (only when it moves).
    async fn offer_watermark(&self, watermark_ms: i64) {
        if let Some(plan) = &self.source.watermark {
            plan.offer(
                &self.source.flow,
                watermark_ms,
                self.source.counters.as_ref(),
            )
            .await;
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
        let mut backoff = self.deliverer.backoff();
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
            let doing = format!("{what} of table {}", self.source.table);
            if self.deliverer.gives_up(&backoff, &doing, &error) {
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
