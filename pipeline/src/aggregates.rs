//! A window's aggregates over columns (`window: { aggregates: { total: "sum(cents)" } }`): each
//! is one of `count(*)`, `count(col)`, `sum(col)`, `min(col)`, `max(col)`, `avg(col)`, parsed
//! with `sqlparser` and checked against the typed table the window reads; the store computes
//! them per window and group, in the emission's transaction, into columns of the counts table.

use crate::aggregate::{Aggregate, AggregateFunction};
use crate::columns::ColumnType;
use crate::errors::{Collector, ErrorCode};
use crate::model::{Column, Pipeline, Source, TargetKind};
use crate::validate::is_identifier;
use sqlparser::ast::{Expr, FunctionArg, FunctionArgExpr, FunctionArguments};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;
use std::collections::BTreeMap;

/// The counts table's own columns: an aggregate may not take their names.
const COUNTS_COLUMNS: [&str; 5] = [
    "window_start",
    "window_end",
    "group_key",
    "count",
    "emitted_at",
];

/// `targets[i].window.aggregates`; `path` is that key.
pub(crate) fn aggregates(
    c: &mut Collector<'_>,
    raw: Option<BTreeMap<String, String>>,
    path: &str,
) -> Vec<Aggregate> {
    let mut out = Vec::new();
    for (name, text) in raw.unwrap_or_default() {
        let at = format!("{path}.{name}");
        if !is_identifier(&name) || name.starts_with(crate::columns::RESERVED_PREFIX) {
            c.push(
                ErrorCode::InvalidIdentifier,
                &at,
                format!("`{name}` is not a column name: use [a-z_][a-z0-9_]*, at most 48 bytes"),
            );
            continue;
        }
        if COUNTS_COLUMNS.contains(&name.as_str()) {
            c.push(
                ErrorCode::InvalidValue,
                &at,
                format!(
                    "`{name}` is a column of every counts table ({}); name the aggregate otherwise",
                    COUNTS_COLUMNS.join(", ")
                ),
            );
            continue;
        }
        match parse(&text) {
            Ok((function, column)) => out.push(Aggregate {
                name,
                function,
                column,
            }),
            Err(why) => c.push(ErrorCode::InvalidExpression, &at, why),
        }
    }
    out
}

/// `count(*)`, or `fn(column)`.
fn parse(text: &str) -> Result<(AggregateFunction, Option<String>), String> {
    let expected = || {
        format!(
            "`{text}` is not an aggregate: write count(*), or count, sum, min, max or avg of a \
             column"
        )
    };
    let dialect = PostgreSqlDialect {};
    let mut parser = Parser::new(&dialect)
        .try_with_sql(text)
        .map_err(|_| expected())?;
    let Ok(Expr::Function(function)) = parser.parse_expr() else {
        return Err(expected());
    };
    if parser.peek_token().token != sqlparser::tokenizer::Token::EOF
        || function.filter.is_some()
        || function.over.is_some()
        || !function.within_group.is_empty()
    {
        return Err(expected());
    }
    let name = function.name.to_string().to_lowercase();
    let aggregate = match name.as_str() {
        "count" => AggregateFunction::Count,
        "sum" => AggregateFunction::Sum,
        "min" => AggregateFunction::Min,
        "max" => AggregateFunction::Max,
        "avg" => AggregateFunction::Avg,
        _ => return Err(expected()),
    };
    let FunctionArguments::List(list) = &function.args else {
        return Err(expected());
    };
    if list.duplicate_treatment.is_some() || !list.clauses.is_empty() || list.args.len() != 1 {
        return Err(expected());
    }
    match &list.args[0] {
        FunctionArg::Unnamed(FunctionArgExpr::Wildcard)
            if aggregate == AggregateFunction::Count =>
        {
            Ok((aggregate, None))
        }
        FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(ident))) => {
            Ok((aggregate, Some(ident.value.clone())))
        }
        _ => Err(expected()),
    }
}

/// Why `aggregate` cannot be computed over `columns` (the typed table a window reads), if so;
/// otherwise the type of its result.
pub fn result_type(aggregate: &Aggregate, columns: &[Column]) -> Result<ColumnType, String> {
    use AggregateFunction as F;
    use ColumnType as T;
    let Some(name) = &aggregate.column else {
        return Ok(T::Integer);
    };
    let Some(column) = columns.iter().find(|c| c.name == *name) else {
        return Err(format!(
            "`{name}` is not a column of the table the window reads (its columns: {})",
            columns
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let ty = column.ty;
    let numeric = matches!(ty, T::Integer | T::Numeric | T::Double);
    let ordered = numeric || matches!(ty, T::Text | T::Timestamp | T::Date);
    match aggregate.function {
        F::Count => Ok(T::Integer),
        F::Sum if ty == T::Double => Ok(T::Double),
        F::Sum if numeric => Ok(T::Numeric),
        F::Avg if numeric => Ok(T::Double),
        F::Min | F::Max if ordered => Ok(ty),
        function => Err(format!(
            "`{}` of column `{name}` ({}): {}",
            function.keyword(),
            ty.keyword(),
            if matches!(function, F::Sum | F::Avg) {
                "sum and avg take integer, numeric or double columns"
            } else {
                "min and max take numbers, text, timestamps and dates"
            }
        )),
    }
}

/// Checks each window target against the table its flow reads: a window over a typed table
/// groups by one of its columns (`column:NAME`; typed rows have no attributes) and aggregates
/// its columns; any other window groups by an attribute and has no aggregates.
pub(crate) fn check_windows(p: &Pipeline, c: &mut Collector<'_>) {
    for (j, target) in p.targets.iter().enumerate() {
        let TargetKind::Window {
            group_by,
            aggregates,
            ..
        } = &target.kind
        else {
            continue;
        };
        let at = format!("targets[{j}].window");
        let read = p.flows.iter().find_map(|f| match &f.source {
            Source::Table { target: read } if f.target == target.name => {
                p.targets.iter().find(|t| t.name == *read)
            }
            _ => None,
        });
        match read.filter(|t| !t.columns.is_empty()) {
            Some(typed) => {
                let grouped = TargetKind::group_column(group_by)
                    .map(|name| (name, typed.columns.iter().find(|c| c.name == name)));
                match grouped {
                    // The group key is text, which both stores write alike for these types.
                    Some((_, Some(column)))
                        if matches!(
                            column.ty,
                            ColumnType::Text | ColumnType::Integer | ColumnType::Date
                        ) => {}
                    Some((name, Some(column))) => c.push(
                        ErrorCode::InvalidValue,
                        &format!("{at}.group_by"),
                        format!(
                            "column `{name}` is {}; a window groups by a text, integer or date \
                             column",
                            column.ty.keyword()
                        ),
                    ),
                    Some((column, None)) => c.push(
                        ErrorCode::InvalidValue,
                        &format!("{at}.group_by"),
                        format!("`{column}` is not a column of `{}`", typed.name),
                    ),
                    None => c.push(
                        ErrorCode::InvalidValue,
                        &format!("{at}.group_by"),
                        format!(
                            "window `{}` reads typed table `{}`, whose rows have columns, not \
                             attributes: group by `column:NAME`",
                            target.name, typed.name
                        ),
                    ),
                }
                for aggregate in aggregates {
                    if let Err(why) = result_type(aggregate, &typed.columns) {
                        c.push(
                            ErrorCode::InvalidExpression,
                            &format!("{at}.aggregates.{}", aggregate.name),
                            why,
                        );
                    }
                }
            }
            None => {
                if TargetKind::group_column(group_by).is_some() {
                    c.push(
                        ErrorCode::InvalidValue,
                        &format!("{at}.group_by"),
                        format!(
                            "window `{}` groups by a column; a window groups by columns when its \
                             flow reads a typed table (`source: {{ table: NAME }}`)",
                            target.name
                        ),
                    );
                }
                if let Some(first) = aggregates.first() {
                    c.push(
                        ErrorCode::InvalidValue,
                        &format!("{at}.aggregates.{}", first.name),
                        format!(
                            "window `{}` aggregates columns; a window has columns to aggregate \
                             when its flow reads a typed table (`source: {{ table: NAME }}`)",
                            target.name
                        ),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_five_forms_parse_and_the_rest_do_not() {
        assert_eq!(parse("count(*)"), Ok((AggregateFunction::Count, None)));
        assert_eq!(
            parse("SUM(cents)"),
            Ok((AggregateFunction::Sum, Some("cents".to_owned())))
        );
        assert_eq!(
            parse("avg( amount )"),
            Ok((AggregateFunction::Avg, Some("amount".to_owned())))
        );
        for bad in [
            "sum(*)",
            "sum(a + b)",
            "sum(a, b)",
            "median(a)",
            "sum(a) + 1",
            "count(DISTINCT a)",
            "a",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
