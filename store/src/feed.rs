//! A target table read as a feed: every committed row delivered once to a reading flow, in
//! commit order, with the flow's position committed in the same transaction as its effects.
//!
//! # The position
//!
//! A reading flow's [`ReadPosition`] is a *range* of the table's commits planned in advance
//! (`range_from`, `range_to`: two points of the table's commit history) and how far into that
//! range the flow has committed (`after`, a row's place in the range's order). A row belongs to
//! exactly one range: the one whose start it was committed after and whose end it was committed
//! before. The points are chosen so that this holds even when writers commit out of order:
//!
//! * **SQLite**: one write transaction at a time (also across processes sharing the file), so
//!   a counter taken inside the writer's transaction (`sluice_table_seqs`) numbers rows in
//!   commit order; a point is a counter value, and a range is `(from, to]`.
//! * **PostgreSQL**: transactions commit concurrently and in any order, so a number taken inside
//!   one (an identity, a sequence, `max(id)`) can be committed after a larger one was read: a
//!   reader keeping "the highest id seen" skips it. Each row records its writer's transaction
//!   id (`writer_xid`), a point is a snapshot (`pg_current_snapshot()`), and a range holds the
//!   rows whose writer is visible in `to` and not in `from`: exactly the transactions that
//!   committed between the two snapshots, whatever their ids. Within a range rows are ordered
//!   by `(writer_xid, seq)`.
//!
//! Because a range's end is fixed before any of its rows is read ([`FeedStore::plan_range`])
//! and rows of committed transactions never change, a page read from a position always holds
//! the same rows: a replay after a crash reads the same pages as the attempt it replaces.
//!
//! # Fencing
//!
//! Every change of a position names the version it changes ([`PositionAdvance::expected_version`],
//! [`FeedStore::plan_range`]'s `at`) and is refused with [`crate::StoreError::Moved`] if the
//! stored version differs: a reader that lost its turn to another replica, or whose flow was
//! reset meanwhile, can never move the position, and the transaction that tried writes nothing.

use crate::StoredRow;
use std::sync::Arc;

/// A place in a range's order: SQLite `(seq, 0)`, PostgreSQL `(writer_xid, seq)`.
pub type RangeCursor = (i64, i64);

/// Where a flow reading a table stands (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadPosition {
    /// Changes made to this position so far; 0: none recorded (read from the beginning).
    pub version: i64,
    /// Start of the current range, exclusive; empty: the table's beginning.
    pub range_from: String,
    /// End of the current range, inclusive; empty only at version 0.
    pub range_to: String,
    /// The last row of the range the flow committed; `None`: none yet.
    pub after: Option<RangeCursor>,
}

/// A position change committed with a reading flow's batch: the page it read is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionAdvance {
    /// The table read (full name).
    pub table: Arc<str>,
    /// The version this change applies to; the stored one becomes `expected_version + 1`.
    pub expected_version: i64,
    /// The last row of the page, now committed; `None`: the batch is a part of a page (split
    /// to find a failing record) and only checks that the position is still at
    /// `expected_version`, changing nothing (the page's last part moves it).
    pub after: Option<RangeCursor>,
}

/// Orders the commits of a reading flow's pages when several are in flight at once: a page's
/// transaction does its work, then waits here for the page before it to have committed before
/// it moves the position and commits (so the pages' work overlaps, their position changes do
/// not). `wait(version)` returns once the position reached `version` (`true`), or once a page
/// before it was given back (`false`: this one cannot commit either, and writes nothing).
#[async_trait::async_trait]
pub trait PositionGate: Send + Sync + std::fmt::Debug {
    /// Waits until the position is at `version`, or cannot get there.
    async fn wait(&self, version: i64) -> bool;
}

/// How far a file flow's read is known committed: every record of the files before `path`
/// (in path order) and of `path` before byte `offset` (line `line`, 1-based, starts there) was
/// committed, dead-lettered or found present. Kept in `sluice_read_positions` under the source
/// [`FILE_SOURCE`] and deleted with the flow's reset, like a table position. Unlike a table
/// position it is not written in the commit's transaction: it trails the commits (a reader
/// that takes over re-reads what committed after it, and skips it as committed), so it bounds
/// re-reading and guarantees nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FileCheckpoint {
    /// The file the read stands in.
    pub path: String,
    /// The byte offset in it where the first record not known committed starts.
    pub offset: i64,
    /// That record's line number, minus one (lines before it).
    pub line: i64,
}

/// The `source` a file flow's checkpoint is kept under (a table source is a full table name,
/// which always holds `__`).
pub const FILE_SOURCE: &str = "file";

/// A row read from a feed, with its place in the range.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedRow {
    /// The row.
    pub row: StoredRow,
    /// Its place in the range's order.
    pub cursor: RangeCursor,
    /// When its writer committed it, ms since the epoch (store clock).
    pub committed_at_ms: i64,
}

/// How far a reading flow is behind its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FeedLag {
    /// Committed rows of the table the flow has not committed yet.
    pub rows_behind: u64,
    /// Commit time of the oldest of them, ms since the epoch; `None` when there is none.
    pub oldest_unread_ms: Option<i64>,
}
