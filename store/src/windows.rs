//! Event-time tumbling windows in the store: a `window` target's messages are rows of its base
//! table (`<pipeline>__<target>`, the shape of any target table; or, for a window over a
//! `table` source, that table's rows, [`WindowRows::All`]), and its counts are rows of
//! `<pipeline>__<target>__windows`: one per window and group, written once the flow's
//! watermark has passed the window's end plus the allowed lateness. A counts table holds the
//! windows of the one flow that writes it.
//!
//! # Guarantees
//!
//! - **Once.** [`crate::WindowStore::emit_windows`] computes the counts of every window that ends
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
//! - **A reset counts again.** [`crate::FlowStore::reset_flow`] forgets the mark. The next
//!   emission, finding no mark of its size, deletes the count rows of that size, then counts
//!   every window from the rows the flow has then, in the same transaction: a window emitted
//!   before the reset is replaced, never counted twice or mixed with its old count, and a
//!   window whose rows all went is gone. Until that emission, the table shows the counts from
//!   before the reset.
//!
//! A store from before sizes were recorded is brought up to date by
//! [`crate::WindowStore::prepare_window_table`] (counts tables rekeyed, rows kept); a mark without a
//! size is taken by the size its count rows have.

use crate::StoreError;
use crate::schema::check_table;

/// One emission of a flow's windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowEmission {
    /// The base table (`<pipeline>__<target>`) the counts come from.
    pub base_table: String,
    /// The counts table (`<pipeline>__<target>__windows`, see [`crate::window_table_name`]).
    pub windows_table: String,
    /// Window size, ms (positive).
    pub size_ms: i64,
    /// What a row's group is.
    pub group: WindowGroup,
    /// Columns of the counts table computed beside `count` (a window over a typed table).
    pub aggregates: Vec<WindowAggregate>,
    /// Windows ending at or before this (event time, ms since epoch) are emitted.
    pub before_ms: i64,
    /// Whose rows are counted: only the emitting flow's (a window target's own base table),
    /// or every flow's (a window over a `table` source, whose base table is that table).
    pub rows: WindowRows,
}

/// What a row's group is, as text (a row without it is in the group `""`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowGroup {
    /// The value of this attribute (an envelope table's rows).
    Attribute(String),
    /// The value of this column (a typed table's rows), cast to text.
    Column(String),
}

/// One aggregate of a window over a typed table: a column of the counts table, computed per
/// window and group from a column of the rows (or from the rows: `count(*)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowAggregate {
    /// The counts table's column (a validated identifier).
    pub name: String,
    /// What it computes.
    pub function: WindowFunction,
    /// The column of the rows it reads (a validated identifier); `None`: every row.
    pub column: Option<String>,
    /// The type of its result, which its column has.
    pub ty: crate::ColumnType,
}

/// An aggregate's function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowFunction {
    /// Rows, or non-NULL values.
    Count,
    /// Sum.
    Sum,
    /// Least value.
    Min,
    /// Greatest value.
    Max,
    /// Mean.
    Avg,
}

impl WindowAggregate {
    /// Its SQL over the emission's inner relation, where its column is `_sluice_a<i>`.
    pub(crate) fn sql(&self, i: usize) -> String {
        let input = match &self.column {
            Some(_) => format!("_sluice_a{i}"),
            None => "*".to_owned(),
        };
        let function = match self.function {
            WindowFunction::Count => "count",
            WindowFunction::Sum => "sum",
            WindowFunction::Min => "min",
            WindowFunction::Max => "max",
            WindowFunction::Avg => "avg",
        };
        format!("{function}({input})")
    }
}

/// The inner relation's columns an emission's aggregates read: `, "col" AS _sluice_a<i>`.
pub(crate) fn aggregate_inputs(aggregates: &[WindowAggregate]) -> String {
    aggregates
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            a.column
                .as_ref()
                .map(|c| format!(", \"{c}\" AS _sluice_a{i}"))
        })
        .collect()
}

/// The counts table's aggregate columns as an insert names them and as the select computes
/// them: `(", \"total\"", ", sum(_sluice_a0)")`.
pub(crate) fn aggregate_outputs(aggregates: &[WindowAggregate]) -> (String, String) {
    let names = aggregates
        .iter()
        .map(|a| format!(", \"{}\"", a.name))
        .collect();
    let values = aggregates
        .iter()
        .enumerate()
        .map(|(i, a)| format!(", {}", a.sql(i)))
        .collect();
    (names, values)
}

/// Refusing an aggregate whose column in the counts table holds another type (the file
/// changed what it computes): the emission writes nothing.
pub(crate) fn changed_aggregate(
    windows: &str,
    aggregate: &WindowAggregate,
    found: &str,
) -> StoreError {
    StoreError::Config(format!(
        "counts table {windows}: column {:?} is {found}, and aggregate {:?} now gives {}; \
         nothing was emitted (drop the column, or name the aggregate otherwise)",
        aggregate.name,
        aggregate.name,
        crate::typed::keyword(aggregate.ty)
    ))
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

/// The primary key of a counts table: a window is its start and its end, so windows of two
/// sizes (the file's size changed) never share a key.
pub(crate) const COUNTS_KEY: &str = "window_start, window_end, group_key";

/// What one emission does, decided from the flow's mark (or its oldest row) and `before_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Count the windows starting in `[start, end)` (both multiples of the size), then move
    /// the mark to `end`.
    Emit {
        /// The first window not emitted yet.
        start: i64,
        /// The end of the last window that ends by `before_ms`.
        end: i64,
    },
    /// No window is due: write nothing and return this.
    Nothing(WindowsEmitted),
}

/// Checks what `emission` names and divides by, before anything is spliced into SQL.
pub(crate) fn check_emission(emission: &WindowEmission) -> Result<(), StoreError> {
    check_table(&emission.base_table)?;
    check_table(&emission.windows_table)?;
    let names = emission
        .aggregates
        .iter()
        .flat_map(|a| std::iter::once(&a.name).chain(a.column.as_ref()))
        .chain(match &emission.group {
            WindowGroup::Column(column) => Some(column),
            WindowGroup::Attribute(_) => None,
        });
    for name in names {
        if !crate::schema::is_identifier(name) {
            return Err(StoreError::Config(format!(
                "window column {name:?} is not an identifier"
            )));
        }
    }
    if emission.size_ms <= 0 {
        return Err(StoreError::Config(format!(
            "window size {} ms is not positive",
            emission.size_ms
        )));
    }
    Ok(())
}

/// The start of the window holding `ms`: `ms` floored to a multiple of `size_ms` (towards
/// minus infinity, so for times before the epoch too). `size_ms` is positive.
pub(crate) fn window_start(ms: i64, size_ms: i64) -> Result<i64, StoreError> {
    ms.checked_sub(ms.rem_euclid(size_ms)).ok_or_else(|| {
        StoreError::Rejected(format!("{ms} ms has no window of {size_ms} ms in range"))
    })
}

/// The mark an emission of `size_ms` windows goes on from, given the flow's stored mark
/// (`emitted_before`, and the size it was moved with; `None` for a mark written before sizes
/// were recorded) and the size of the counts table's newest row, asked only for such a mark.
///
/// A mark of another size is none: the emission starts again at the flow's oldest row, so the
/// new size's windows cover every row. A mark without a size is taken if it is a window
/// boundary of `size_ms` and no count row says another size was emitted.
pub(crate) fn mark_of_size(
    stored: Option<(i64, Option<i64>)>,
    size_ms: i64,
    newest_row_size_ms: Option<i64>,
) -> Option<i64> {
    match stored? {
        (mark, Some(size)) => (size == size_ms).then_some(mark),
        (mark, None) => (mark.rem_euclid(size_ms) == 0
            && newest_row_size_ms.is_none_or(|size| size == size_ms))
        .then_some(mark),
    }
}

/// What an emission does, given the flow's `mark` and, needed only without one, the event
/// time of its `oldest` row. A checked `emission` (see [`check_emission`]).
pub(crate) fn plan(
    emission: &WindowEmission,
    mark: Option<i64>,
    oldest: Option<i64>,
) -> Result<Plan, StoreError> {
    let start = match (mark, oldest) {
        (Some(mark), _) => mark,
        (None, Some(oldest)) => window_start(oldest, emission.size_ms)?,
        (None, None) => {
            return Ok(Plan::Nothing(WindowsEmitted {
                rows: 0,
                emitted_before_ms: 0,
            }));
        }
    };
    let end = window_start(emission.before_ms, emission.size_ms)?;
    if end <= start {
        return Ok(Plan::Nothing(WindowsEmitted {
            rows: 0,
            emitted_before_ms: start,
        }));
    }
    Ok(Plan::Emit { start, end })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An emission of the flow's own rows of `p__w` into `p__w__windows`, grouped by `g`.
    pub(crate) fn emission(size_ms: i64, before_ms: i64) -> WindowEmission {
        WindowEmission {
            base_table: "p__w".into(),
            windows_table: "p__w__windows".into(),
            size_ms,
            group: WindowGroup::Attribute("g".into()),
            aggregates: Vec::new(),
            before_ms,
            rows: WindowRows::OfTheFlow,
        }
    }

    #[test]
    fn window_starts_floor_towards_minus_infinity() {
        assert_eq!(window_start(0, 10).ok(), Some(0));
        assert_eq!(window_start(19, 10).ok(), Some(10));
        assert_eq!(window_start(-1, 10).ok(), Some(-10));
        assert_eq!(window_start(-10, 10).ok(), Some(-10));
        assert_eq!(window_start(-11, 10).ok(), Some(-20));
        assert!(window_start(i64::MIN, 10).is_err());
    }

    #[test]
    fn plans_start_at_the_mark_or_the_oldest_rows_window() {
        let nothing = |emitted_before_ms| {
            Plan::Nothing(WindowsEmitted {
                rows: 0,
                emitted_before_ms,
            })
        };
        let e = emission(10, 35);
        assert_eq!(plan(&e, None, None).ok(), Some(nothing(0)));
        assert_eq!(
            plan(&e, None, Some(-3)).ok(),
            Some(Plan::Emit {
                start: -10,
                end: 30
            })
        );
        assert_eq!(
            plan(&e, Some(20), Some(-3)).ok(),
            Some(Plan::Emit { start: 20, end: 30 })
        );
        assert_eq!(plan(&e, Some(30), None).ok(), Some(nothing(30)));
        assert_eq!(plan(&e, None, Some(31)).ok(), Some(nothing(30)));
        assert!(check_emission(&emission(0, 35)).is_err());
        let mut spliced = emission(10, 35);
        spliced.windows_table = "p__w\"; DROP TABLE x; --".into();
        assert!(check_emission(&spliced).is_err());
    }

    #[test]
    fn a_mark_is_of_the_size_it_was_moved_with() {
        assert_eq!(mark_of_size(None, 10, None), None);
        assert_eq!(mark_of_size(Some((30, Some(10))), 10, None), Some(30));
        assert_eq!(mark_of_size(Some((30, Some(5))), 10, None), None);
        // Marks without a size: taken if on a boundary and no count row says otherwise.
        assert_eq!(mark_of_size(Some((30, None)), 10, None), Some(30));
        assert_eq!(mark_of_size(Some((30, None)), 10, Some(10)), Some(30));
        assert_eq!(mark_of_size(Some((30, None)), 10, Some(5)), None);
        assert_eq!(mark_of_size(Some((15, None)), 10, None), None);
    }
}
