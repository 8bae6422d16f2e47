//! A flow's SQL expressions (`select:` values, `where:`), checked here and evaluated by the
//! store inside the commit's transaction (DESIGN §8: no expression interpreter of our own).
//!
//! An expression is parsed with `sqlparser` (PostgreSQL's syntax, which Lakeflow users write
//! too), then checked against the fields it may read: every name must be one of them, every
//! operator and function must be in the subset that behaves the same on SQLite and PostgreSQL,
//! and the types must fit (a number compared with text, `AND` over a number, a `where:` that is
//! not boolean are errors here, not surprises in one store). It is then written out once per
//! store: identifiers quoted, casts as PostgreSQL's `CAST(x AS type)` or, on SQLite, as
//! sluice's strict cast functions (`sluice_cast_<type>(x)`, which fail on a value PostgreSQL's
//! cast would refuse, where SQLite's own `CAST` would give 0).
//!
//! Rooms: the type checker (`check.rs`), what both stores read alike (`portable.rs`), the
//! writer for each store (`render.rs`).

mod check;
mod portable;
mod render;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use crate::columns::ColumnType;
use check::Checker;
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;

/// A checked expression and its text for each store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expression {
    /// As the file wrote it.
    pub text: String,
    /// For PostgreSQL.
    pub postgres: String,
    /// For SQLite (with sluice's strict cast functions registered).
    pub sqlite: String,
    /// Its type; `None` when only NULL (or an untyped literal) decides it.
    pub ty: Option<ColumnType>,
}

/// What an expression may read: each field's name and type.
pub type Fields<'a> = &'a [(String, ColumnType)];

/// Columns an expression reads that are written out as other expressions: a view's columns,
/// by name, as the view computes them from its table (for each store).
pub type Substitutes = std::collections::HashMap<String, Expression>;

/// Parses and checks `text` over `fields`.
pub fn compile(text: &str, fields: Fields<'_>) -> Result<Expression, String> {
    compile_substituted(text, fields, None)
}

/// As [`compile`], each field named in `substitutes` written out as its expression there (in
/// parentheses), so that the result reads what those expressions read.
pub fn compile_substituted(
    text: &str,
    fields: Fields<'_>,
    substitutes: Option<&Substitutes>,
) -> Result<Expression, String> {
    let dialect = PostgreSqlDialect {};
    let mut parser = Parser::new(&dialect)
        .try_with_sql(text)
        .map_err(|e| format!("not an SQL expression: {e}"))?;
    let expr = parser
        .parse_expr()
        .map_err(|e| format!("not an SQL expression: {e}"))?;
    let rest = parser.peek_token();
    if rest.token != Token::EOF {
        return Err(format!(
            "not one SQL expression: `{}` follows it",
            rest.token
        ));
    }
    let checker = Checker {
        fields,
        substitutes,
    };
    let ty = checker.ty(&expr)?;
    Ok(Expression {
        text: text.to_owned(),
        postgres: render::render(&expr, Store::Postgres, &checker)?,
        sqlite: render::render(&expr, Store::Sqlite, &checker)?,
        ty: ty.known(),
    })
}

/// Checks that a compiled expression's values fit a column of type `column`.
pub fn fits(expression: &Expression, column: ColumnType) -> bool {
    match expression.ty {
        None => true,
        Some(ty) if ty == column => true,
        // Integers widen; a double or a decimal goes into either of the two.
        Some(ty) => {
            ty.is_number()
                && column.is_number()
                && !(column == ColumnType::Integer && ty != ColumnType::Integer)
        }
    }
}

/// The column type a `CAST(x AS type)` names.
pub(crate) fn cast_type(data_type: &str) -> Result<ColumnType, String> {
    use ColumnType as C;
    let word = data_type.to_lowercase();
    let base = word.split('(').next().unwrap_or("").trim();
    Ok(match base {
        "text" | "varchar" | "character varying" | "string" => C::Text,
        "integer" | "int" | "bigint" | "int8" | "int4" | "smallint" => C::Integer,
        "double" | "double precision" | "float8" | "float" | "real" => C::Double,
        "numeric" | "decimal" => C::Numeric,
        "boolean" | "bool" => C::Boolean,
        "timestamp" | "timestamptz" | "timestamp with time zone" => C::Timestamp,
        "date" => C::Date,
        "json" | "jsonb" => C::Json,
        "bytea" | "bytes" | "blob" => C::Bytes,
        _ => {
            return Err(format!(
                "CAST to `{data_type}`: the types are {}",
                ColumnType::keywords()
            ));
        }
    })
}

/// The store an expression is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    Postgres,
    Sqlite,
}

/// The store's SQL for a column type.
pub fn postgres_type(ty: ColumnType) -> &'static str {
    match ty {
        ColumnType::Text => "TEXT",
        ColumnType::Integer => "BIGINT",
        ColumnType::Double => "DOUBLE PRECISION",
        ColumnType::Numeric => "NUMERIC",
        ColumnType::Boolean => "BOOLEAN",
        ColumnType::Timestamp => "TIMESTAMPTZ",
        ColumnType::Date => "DATE",
        ColumnType::Json => "JSONB",
        ColumnType::Bytes => "BYTEA",
    }
}
