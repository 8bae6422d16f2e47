//! Event-time tumbling windows in the store: a `window` target's messages are rows of its base
//! table (`<pipeline>__<target>`, the shape of any target table; or, for a window over a
//! `table` source, that table's rows, [`WindowRows::All`]), and its counts are rows of
//! `<pipeline>__<target>__windows`: one per window and group, written once the flow's
//! watermark has passed the window's end plus the allowed lateness. A counts table holds the
//! windows of the one flow that writes it.
//!
//! # Guarantees
//!
//! - **Once.** [`crate::Store::emit_windows`] computes the counts of every window that ends
//!   at or before `before_ms` and was not emitted yet from the committed rows, writes them and
//!   moves the flow's emission mark, all in one transaction; emitting again, from any replica,
//!   after any crash, starts at the moved mark and changes nothing. Rows committed later into
//!   an emitted window (late messages) stay in the base table and do not change its count.
//! - **Every window, at the end.** `before_ms = i64::MAX` (a drained once flow, a table whose
//!   writers are all done) emits every window left, the last one too, on both backends. The
//!   mark then lies past every window: a row committed after it (by a later run) is late.
//! - **A size change emits the new size.** A count row is keyed by `(window_start,
//!   window_end, group_key)`, and the mark records the window size it was moved with. When
//!   the size changes between runs (5 s windows emitted, then the file says 10 s), the first
//!   emission of the new size starts again at the flow's oldest row: every 10 s window is
//!   emitted, and the 5 s rows stay beside them (`window_end - window_start` tells them
//!   apart). Going back to 5 s counts the 5 s windows again the same way.
//! - **A reset counts again.** [`crate::Store::reset_flow`] forgets the mark. The next
//!   emission, finding no mark of its size, deletes the count rows of that size, then counts
//!   every window from the rows the flow has then, in the same transaction: a window emitted
//!   before the reset is replaced, never counted twice or mixed with its old count, and a
//!   window whose rows all went is gone. Until that emission, the table shows the counts from
//!   before the reset.
//!
//! A store from before sizes were recorded is brought up to date by
//! [`crate::Store::prepare_window_table`] (counts tables rekeyed, rows kept); a mark without a
//! size is taken by the size its count rows have.

/// One emission of a flow's windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowEmission {
    /// The base table (`<pipeline>__<target>`) the counts come from.
    pub base_table: String,
    /// The counts table (`<pipeline>__<target>__windows`, see [`crate::window_table_name`]).
    pub windows_table: String,
    /// Window size, ms (positive).
    pub size_ms: i64,
    /// The attribute whose value is the group (a row without it counts under `""`).
    pub group_attribute: String,
    /// Windows ending at or before this (event time, ms since epoch) are emitted.
    pub before_ms: i64,
    /// Whose rows are counted: only the emitting flow's (a window target's own base table),
    /// or every flow's (a window over a `table` source, whose base table is that table).
    pub rows: WindowRows,
}

/// Whose rows of the base table a window counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WindowRows {
    /// The emitting flow's rows: the flow writes the window target's own base table.
    #[default]
    OfTheFlow,
    /// Every row, whichever flow wrote it: the window reads another target's table.
    All,
}

/// What one emission wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowsEmitted {
    /// Count rows written.
    pub rows: u64,
    /// Every window starting before this has been emitted (the flow's mark after the call).
    pub emitted_before_ms: i64,
}
