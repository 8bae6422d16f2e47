//! Event-time tumbling windows in the store: a `window` target's messages are rows of its base
//! table (`<pipeline>__<target>`, the shape of any target table; or, for a window over a
//! `table` source, that table's rows, [`WindowRows::All`]), and its counts are rows of
//! `<pipeline>__<target>__windows`: one per window and group, written once the flow's
//! watermark has passed the window's end plus the allowed lateness.
//!
//! Guarantee: [`crate::Store::emit_windows`] computes the counts of every window that ends at
//! or before `before_ms` and was not emitted yet from the committed rows, writes them and moves
//! the flow's emission mark, all in one transaction; a count row is never written twice
//! (primary key `(window_start, group_key)`, conflicts ignored), so emitting again, from any
//! replica, after any crash, changes nothing. Rows committed later into an emitted window (late
//! messages) stay in the base table and do not change its count.

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
