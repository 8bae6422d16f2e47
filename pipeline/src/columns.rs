//! Typed columns: a table target's `columns:` and a JSON decode's `fields:` (SPEC §4).
//!
//! A column has one of nine types, each stored with one meaning on both stores (the mapping
//! is the store's; `store/src/typed.rs`). Names are identifiers and may not start with
//! [`RESERVED_PREFIX`], which sluice's own columns of a typed table carry, so a user column can
//! never collide with them.

/// What sluice's own columns of a typed table, and the envelope a flow's expressions read
/// (`_sluice_message_id`, `_sluice_attributes`, ...), start with.
pub const RESERVED_PREFIX: &str = "_sluice_";

/// A column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnType {
    /// UTF-8 text.
    Text,
    /// A 64-bit signed integer.
    Integer,
    /// A 64-bit float.
    Double,
    /// A decimal: exact on PostgreSQL (`NUMERIC`); SQLite's `NUMERIC` affinity keeps integers
    /// exact and other values as 64-bit floats.
    Numeric,
    /// True or false.
    Boolean,
    /// An instant (UTC), millisecond precision.
    Timestamp,
    /// A calendar date.
    Date,
    /// A JSON value.
    Json,
    /// Bytes.
    Bytes,
}

impl ColumnType {
    /// Every type, in the order the file's error messages list them.
    pub const ALL: [ColumnType; 9] = [
        Self::Text,
        Self::Integer,
        Self::Double,
        Self::Numeric,
        Self::Boolean,
        Self::Timestamp,
        Self::Date,
        Self::Json,
        Self::Bytes,
    ];

    /// The word of the file.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Integer => "integer",
            Self::Double => "double",
            Self::Numeric => "numeric",
            Self::Boolean => "boolean",
            Self::Timestamp => "timestamp",
            Self::Date => "date",
            Self::Json => "json",
            Self::Bytes => "bytes",
        }
    }

    /// The type a word of the file names.
    pub fn from_keyword(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.keyword() == word)
    }

    /// Whether values of this type are numbers (they mix in arithmetic and comparisons).
    pub fn is_number(self) -> bool {
        matches!(self, Self::Integer | Self::Double | Self::Numeric)
    }

    /// The file's list of type words, for messages.
    pub fn keywords() -> String {
        Self::ALL.map(Self::keyword).join(", ")
    }
}

/// One typed column (or decoded field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// An identifier, not starting with [`RESERVED_PREFIX`].
    pub name: String,
    /// Its type.
    pub ty: ColumnType,
    /// Whether it may be NULL (default true).
    pub nullable: bool,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_keyword_names_its_type() {
        for ty in ColumnType::ALL {
            assert_eq!(ColumnType::from_keyword(ty.keyword()), Some(ty));
        }
        assert_eq!(ColumnType::from_keyword("varchar"), None);
    }
}
