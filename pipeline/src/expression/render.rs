//! Writes a checked expression out for one store: identifiers quoted, casts as PostgreSQL's or
//! sluice's strict SQLite functions, and where the two stores would differ (a string literal
//! beside a time, a division, `->>`, `LIKE`), the form that makes them agree.

use super::check::{Checker, Ty};
use super::{ColumnType, Store, cast_type, postgres_type};
use sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, InTarget, Value,
};

/// Writes a checked expression out for one store; `checker` gives the types that decide how
/// (a string literal read as a time, a division, a JSON text).
pub(super) fn render(expr: &Expr, store: Store, checker: &Checker<'_>) -> Result<String, String> {
    let r = |e: &Expr| render(e, store, checker);
    let ty = |e: &Expr| checker.ty(e);
    // `e` as compared with a value of type `other`: a string literal beside a time is written as
    // that time.
    let beside = |e: &Expr, other: Ty| -> Result<String, String> {
        match (literal_text(e), other.known()) {
            (Some(text), Some(time @ (ColumnType::Timestamp | ColumnType::Date))) => {
                time_literal(text, time, store)
            }
            _ => r(e),
        }
    };
    Ok(match expr {
        Expr::Identifier(ident) => match checker
            .substitutes
            .and_then(|s| s.get(ident.value.as_str()))
        {
            Some(substitute) => format!(
                "({})",
                match store {
                    Store::Postgres => &substitute.postgres,
                    Store::Sqlite => &substitute.sqlite,
                }
            ),
            None => format!("\"{}\"", ident.value),
        },
        Expr::Value(value) => match &value.value {
            Value::Number(text, _) => text.clone(),
            Value::SingleQuotedString(text) => format!("'{}'", text.replace('\'', "''")),
            Value::Boolean(true) => "TRUE".to_owned(),
            Value::Boolean(false) => "FALSE".to_owned(),
            Value::Null => "NULL".to_owned(),
            other => return Err(format!("the literal `{other}` is not supported")),
        },
        Expr::Nested(inner) => format!("({})", r(inner)?),
        Expr::IsNull(inner) => format!("({} IS NULL)", r(inner)?),
        Expr::IsNotNull(inner) => format!("({} IS NOT NULL)", r(inner)?),
        Expr::IsTrue(inner) => format!("({} IS TRUE)", r(inner)?),
        Expr::IsFalse(inner) => format!("({} IS FALSE)", r(inner)?),
        Expr::IsNotTrue(inner) => format!("({} IS NOT TRUE)", r(inner)?),
        Expr::IsNotFalse(inner) => format!("({} IS NOT FALSE)", r(inner)?),
        Expr::UnaryOp { op, expr } => format!("({op} {})", r(expr)?),
        Expr::BinaryOp { left, op, right } => {
            use BinaryOperator as B;
            let (lt, rt) = (ty(left)?, ty(right)?);
            match (op, store) {
                (B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq, _) => {
                    format!("({} {op} {})", beside(left, rt)?, beside(right, lt)?)
                }
                // SQLite divides integers when both values are stored as integers, which an
                // integral numeric is: a numeric or double division is done in floats, and a
                // zero divisor fails the record as on PostgreSQL.
                (B::Divide, Store::Sqlite) => {
                    let real = [lt, rt]
                        .iter()
                        .any(|t| matches!(t, Ty::Known(ColumnType::Numeric | ColumnType::Double)));
                    if real {
                        format!(
                            "(CAST({} AS REAL) / sluice_nonzero({}))",
                            r(left)?,
                            r(right)?
                        )
                    } else {
                        format!("({} / sluice_nonzero({}))", r(left)?, r(right)?)
                    }
                }
                (B::Modulo, Store::Sqlite) => {
                    format!("({} % sluice_nonzero({}))", r(left)?, r(right)?)
                }
                // SQLite's `->>` gives a JSON number as a number; PostgreSQL's gives text.
                (B::LongArrow, Store::Sqlite) => {
                    format!("CAST(({} ->> {}) AS TEXT)", r(left)?, r(right)?)
                }
                _ => format!("({} {op} {})", r(left)?, r(right)?),
            }
        }
        Expr::Between {
            expr,
            negated,
            low,
            high,
        } => {
            let t = ty(expr)?;
            format!(
                "({} {}BETWEEN {} AND {})",
                beside(expr, ty(low)?)?,
                if *negated { "NOT " } else { "" },
                beside(low, t)?,
                beside(high, t)?
            )
        }
        Expr::In {
            expr,
            target: InTarget::List(list),
            negated,
            ..
        } => {
            let t = ty(expr)?;
            let items = list
                .iter()
                .map(|item| beside(item, t))
                .collect::<Result<Vec<_>, _>>()?;
            format!(
                "({} {}IN ({}))",
                r(expr)?,
                if *negated { "NOT " } else { "" },
                items.join(", ")
            )
        }
        Expr::Like {
            negated,
            expr,
            pattern,
            ..
        } => format!(
            "({} {}LIKE {}{})",
            r(expr)?,
            if *negated { "NOT " } else { "" },
            r(pattern)?,
            // PostgreSQL's default escape character; SQLite has none unless told.
            if store == Store::Sqlite {
                " ESCAPE '\\'"
            } else {
                ""
            }
        ),
        Expr::Case {
            operand,
            conditions,
            else_result,
            ..
        } => {
            let mut out = "(CASE".to_owned();
            let operand_ty = operand.as_deref().map(ty).transpose()?;
            if let Some(operand) = operand {
                out.push(' ');
                out.push_str(&r(operand)?);
            }
            for when in conditions {
                let condition = match operand_ty {
                    Some(t) => beside(&when.condition, t)?,
                    None => r(&when.condition)?,
                };
                out.push_str(&format!(" WHEN {condition} THEN {}", r(&when.result)?));
            }
            if let Some(other) = else_result {
                out.push_str(&format!(" ELSE {}", r(other)?));
            }
            out.push_str(" END)");
            out
        }
        Expr::Cast {
            expr, data_type, ..
        } => {
            let ty = cast_type(&data_type.to_string())?;
            match store {
                Store::Postgres => format!("CAST({} AS {})", r(expr)?, postgres_type(ty)),
                Store::Sqlite => format!("sluice_cast_{}({})", ty.keyword(), r(expr)?),
            }
        }
        Expr::Substring {
            expr,
            substring_from,
            substring_for,
            ..
        } => {
            let count = |e: &Expr| -> Result<String, String> {
                Ok(match store {
                    // PostgreSQL's `substr` counts in `integer`, not `bigint`.
                    Store::Postgres => format!("CAST({} AS INTEGER)", r(e)?),
                    Store::Sqlite => r(e)?,
                })
            };
            let mut args = vec![r(expr)?];
            for e in [substring_from, substring_for].into_iter().flatten() {
                args.push(count(e)?);
            }
            format!("substr({})", args.join(", "))
        }
        Expr::Function(function) => {
            let name = function.name.to_string().to_lowercase();
            let FunctionArguments::List(list) = &function.args else {
                return Err(format!("`{name}` needs its arguments in parentheses"));
            };
            let mut exprs = Vec::new();
            for arg in &list.args {
                let FunctionArg::Unnamed(FunctionArgExpr::Expr(expr)) = arg else {
                    return Err(format!("`{name}`: only plain arguments are supported"));
                };
                exprs.push(expr);
            }
            let mut args = Vec::new();
            for (i, expr) in exprs.iter().enumerate() {
                let text = match (name.as_str(), i) {
                    ("nullif", 1) => beside(expr, ty(exprs[0])?)?,
                    ("nullif", 0) => beside(expr, ty(exprs[1])?)?,
                    // PostgreSQL's `substr` and `round` count in `integer`, not `bigint`.
                    ("substr", 1 | 2) | ("round", 1) if store == Store::Postgres => {
                        format!("CAST({} AS INTEGER)", r(expr)?)
                    }
                    _ => r(expr)?,
                };
                args.push(text);
            }
            format!("{name}({})", args.join(", "))
        }
        other => return Err(format!("`{other}` is not supported")),
    })
}

fn literal_text(expr: &Expr) -> Option<&str> {
    match expr {
        Expr::Value(value) => match &value.value {
            Value::SingleQuotedString(text) => Some(text),
            _ => None,
        },
        _ => None,
    }
}

/// A string literal read as a timestamp (ISO 8601; without an offset, UTC) or a date, written
/// in each store's form of that type, so that both compare times, not text.
fn time_literal(text: &str, ty: ColumnType, store: Store) -> Result<String, String> {
    let instant = parse_time(text).ok_or_else(|| {
        format!(
            "'{text}' is not a {} (ISO 8601: 2026-12-04, 2026-12-04T10:00:00Z)",
            ty.keyword()
        )
    })?;
    let (canonical, sql_type) = match ty {
        ColumnType::Date => (
            instant.to_zoned(jiff::tz::TimeZone::UTC).date().to_string(),
            "DATE",
        ),
        _ => (
            instant.strftime("%Y-%m-%dT%H:%M:%S.%3fZ").to_string(),
            "TIMESTAMPTZ",
        ),
    };
    Ok(match store {
        Store::Postgres => format!("CAST('{canonical}' AS {sql_type})"),
        Store::Sqlite => format!("'{canonical}'"),
    })
}

/// ISO 8601: with an offset, or without one read as UTC, or a date (midnight UTC).
fn parse_time(text: &str) -> Option<jiff::Timestamp> {
    let text = text.trim();
    if let Ok(instant) = text.parse::<jiff::Timestamp>() {
        return Some(instant);
    }
    if let Ok(civil) = text.parse::<jiff::civil::DateTime>() {
        return civil
            .to_zoned(jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp());
    }
    text.parse::<jiff::civil::Date>()
        .ok()
        .and_then(|d| d.to_zoned(jiff::tz::TimeZone::UTC).ok())
        .map(|z| z.timestamp())
}
