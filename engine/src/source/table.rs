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
//!
//! This file holds the source and its settings; the reading task is `table_reader.rs`, the
//! rows as messages `table_rows.rs`, the watermark taken over `table_watermark.rs`.

use crate::source::bounded::{SkipCommitted, SourceProgress};
use crate::source::table_watermark::TableWatermark;
use crate::source::turn::ReaderTurn;
use crate::telemetry::Counters;
use sluice_store::{FeedStore, FlowHandle};
use std::sync::Arc;
use std::time::Duration;

/// Rows per page at most (a quarter of the message budget if that is smaller).
pub const PAGE_ROWS: usize = 1_000;
/// How often a following source looks for new commits by default.
pub const DEFAULT_POLL: Duration = Duration::from_millis(100);

/// Reads a target table as a feed (see the module docs).
pub struct TableSource {
    pub(super) feed: Arc<dyn FeedStore>,
    pub(super) flow: FlowHandle,
    pub(super) table: Arc<str>,
    pub(super) follow: Option<Duration>,
    pub(super) turn: Option<ReaderTurn>,
    pub(super) watermark: Option<TableWatermark>,
    pub(super) skip: Option<SkipCommitted>,
    pub(super) counters: Option<Counters>,
    pub(super) progress: Arc<SourceProgress>,
    pub(super) patience: Option<Duration>,
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
            patience: None,
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

    /// Waits for an unavailable store for at most `limit` (a triggered run's `give_up_after`),
    /// then fails (see [`SourceProgress::gave_up`]); default: for ever.
    pub fn giving_up_after(mut self, limit: Option<Duration>) -> Self {
        self.patience = limit;
        self
    }
}
