//! A window's aggregate as the model holds it (parsed and checked in `aggregates.rs`).

/// One of a window's aggregates: `name: "function(column)"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    /// The counts table's column it fills.
    pub name: String,
    /// What it computes.
    pub function: AggregateFunction,
    /// The column it reads; `None`: `count(*)`.
    pub column: Option<String>,
}

/// An aggregate's function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateFunction {
    /// `count`: rows (`*`) or non-NULL values.
    Count,
    /// `sum`.
    Sum,
    /// `min`.
    Min,
    /// `max`.
    Max,
    /// `avg`.
    Avg,
}

impl AggregateFunction {
    /// The word of the file.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Count => "count",
            Self::Sum => "sum",
            Self::Min => "min",
            Self::Max => "max",
            Self::Avg => "avg",
        }
    }
}
