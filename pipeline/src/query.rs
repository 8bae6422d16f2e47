//! A flow as a query over its source (SPEC §5, "Typed tables"): `decode:`, `select:`,
//! `where:` and `expect:` → [`FlowQuery`], and a table target's `columns:` → [`Column`]s.
//!
//! The expressions are compiled here against what they read: `select:` and `where:` the decoded
//! fields (a JSON decode's `fields:`, or else the target's columns, read by name from the
//! payload) and the envelope ([`envelope_fields`]); `expect:` the flow's output, the target's
//! columns as `select:` fills them, and the envelope. Each column of the target takes its
//! `select:` expression, or else the decoded field of its name, or else NULL (which the column
//! must then allow).

use std::collections::{BTreeMap, BTreeSet};

use crate::columns::{Column, ColumnType, RESERVED_PREFIX};
use crate::errors::{Collector, ErrorCode};
use crate::expression::{self, Expression};
use crate::model::{
    Decode, Expectation, FlowQuery, OnViolation, Selected, Source, Target, TargetKind,
};
use crate::raw::{RawColumn, RawDecode, RawExpectation};
use crate::validate::is_identifier;

/// The envelope every flow's expressions may read, beside its decoded fields.
pub fn envelope_fields() -> Vec<(String, ColumnType)> {
    [
        ("_sluice_message_id", ColumnType::Text),
        ("_sluice_publish_time", ColumnType::Timestamp),
        ("_sluice_event_time", ColumnType::Timestamp),
        ("_sluice_attributes", ColumnType::Json),
        ("_sluice_data", ColumnType::Bytes),
    ]
    .map(|(name, ty)| (name.to_owned(), ty))
    .to_vec()
}

/// `targets[i].columns`; `path` is `targets[i].columns`.
pub(crate) fn columns(c: &mut Collector<'_>, raw: Vec<RawColumn>, path: &str) -> Vec<Column> {
    if raw.is_empty() {
        c.push(
            ErrorCode::InvalidValue,
            path,
            "`columns` lists at least one column (leave it out for sluice's envelope table)",
        );
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, column) in raw.into_iter().enumerate() {
        let at = format!("{path}[{i}]");
        let name = column_name(c, column.name, &format!("{at}.name"));
        if !name.is_empty() && !seen.insert(name.clone()) {
            c.push(
                ErrorCode::DuplicateName,
                &format!("{at}.name"),
                format!("column `{name}` is listed twice"),
            );
        }
        let ty = column_type(c, column.ty, &format!("{at}.type"));
        out.push(Column {
            name,
            ty,
            nullable: column.nullable.unwrap_or(true),
        });
    }
    out
}

pub(crate) fn column_name(c: &mut Collector<'_>, name: Option<String>, path: &str) -> String {
    let name = crate::fields::required(c, name, path);
    if name.is_empty() {
        return name;
    }
    if !is_identifier(&name) {
        c.push(
            ErrorCode::InvalidIdentifier,
            path,
            format!("`{name}` is not an identifier: use [a-z_][a-z0-9_]*, at most 48 bytes"),
        );
    } else if name.starts_with(RESERVED_PREFIX) {
        c.push(
            ErrorCode::InvalidIdentifier,
            path,
            format!("`{name}`: names starting with `{RESERVED_PREFIX}` are sluice's own columns"),
        );
    }
    name
}

pub(crate) fn column_type(c: &mut Collector<'_>, ty: Option<String>, path: &str) -> ColumnType {
    let word = crate::fields::required(c, ty, path);
    match ColumnType::from_keyword(&word) {
        Some(ty) => ty,
        None => {
            if !word.is_empty() {
                c.push(
                    ErrorCode::InvalidValue,
                    path,
                    format!(
                        "unknown column type `{word}`; the types are {}",
                        ColumnType::keywords()
                    ),
                );
            }
            ColumnType::Text
        }
    }
}

/// Most expectations a flow may list.
const MOST_EXPECTATIONS: usize = 63;

/// The query parts of `flows[i]`, as the file wrote them.
pub(crate) struct RawQuery {
    pub(crate) decode: Option<RawDecode>,
    pub(crate) select: Option<BTreeMap<String, String>>,
    pub(crate) filter: Option<String>,
    pub(crate) expect: Option<Vec<RawExpectation>>,
}

/// Converts and compiles `flows[i]`'s query; `path` is `flows[i]`, `upstream` the table a
/// `table` source reads (when declared), `target` the flow's target when it is declared
/// (otherwise nothing is compiled: the unknown target is reported).
pub(crate) fn flow_query(
    c: &mut Collector<'_>,
    raw: RawQuery,
    path: &str,
    source: &Source,
    upstream: Option<&Target>,
    target: Option<&Target>,
) -> FlowQuery {
    let decode = raw
        .decode
        .map(|d| crate::payload_decode::decode(c, d, &format!("{path}.decode"), source));
    let asks =
        decode.is_some() || raw.select.is_some() || raw.filter.is_some() || raw.expect.is_some();
    // Nothing is compiled against an unknown target, or fields in error (no second error).
    let Some(target) = target.filter(|_| !c.any_under(&format!("{path}.decode"))) else {
        return FlowQuery {
            decode,
            ..FlowQuery::default()
        };
    };
    let typed = !target.columns.is_empty();
    let table_source = matches!(source, Source::Table { .. } | Source::PipelineTable { .. });
    // A typed table read by a `table` source: its columns are the fields.
    let upstream_columns = upstream
        .filter(|u| !u.columns.is_empty())
        .map(|u| &u.columns);
    if typed && table_source && upstream_columns.is_none() {
        // Typed rows from an envelope table or another pipeline's table are not built
        // (`capabilities.rs`).
        return FlowQuery::default();
    }
    if typed && decode.is_none() && !table_source {
        c.push(
            ErrorCode::MissingField,
            &format!("{path}.decode"),
            format!(
                "target `{}` has typed columns, so this flow decodes its payload: add \
                 `decode: {{ format: json }}`",
                target.name
            ),
        );
    }
    if asks && !typed {
        let pubsub_schema = decode
            .as_ref()
            .is_some_and(|d| d.schema == Some(crate::model::DecodeSchema::PubSub));
        let what = if matches!(target.kind, TargetKind::Table) && pubsub_schema {
            format!(
                "`{}` has no `columns:`, and this reading of the file does not derive them \
                 from the topic's Pub/Sub schema (`sluice` commands do): declare them",
                target.name
            )
        } else if matches!(target.kind, TargetKind::Table) {
            format!("`{}` has no `columns:`", target.name)
        } else {
            format!("`{}` is a {} target", target.name, target.kind.keyword())
        };
        let given = [
            ("decode", decode.is_some()),
            ("select", raw.select.is_some()),
            ("where", raw.filter.is_some()),
            ("expect", raw.expect.is_some()),
        ];
        for (key, _) in given.iter().filter(|(_, given)| *given) {
            c.push(
                ErrorCode::InvalidValue,
                &format!("{path}.{key}"),
                format!(
                    "`{key}` belongs to a flow that lands typed rows, in a table target with \
                     `columns:`; {what}"
                ),
            );
        }
        return FlowQuery {
            decode,
            ..FlowQuery::default()
        };
    }
    let decoded: Vec<Column> = match (&decode, upstream_columns) {
        (
            Some(Decode {
                fields: declared, ..
            }),
            _,
        ) if !declared.is_empty() => declared.clone(),
        (_, Some(columns)) => columns.clone(),
        _ => target
            .columns
            .iter()
            .map(|c| Column {
                nullable: true,
                ..c.clone()
            })
            .collect(),
    };
    let mut fields: Vec<(String, ColumnType)> =
        decoded.iter().map(|f| (f.name.clone(), f.ty)).collect();
    fields.extend(envelope_fields());
    let compile = |c: &mut Collector<'_>, text: &str, at: &str| -> Option<Expression> {
        match expression::compile(text, &fields) {
            Ok(e) => Some(e),
            Err(why) => {
                c.push(ErrorCode::InvalidExpression, at, why);
                None
            }
        }
    };
    let mut select = Vec::new();
    let mut given = raw.select.unwrap_or_default();
    for column in &target.columns {
        let at = format!("{path}.select.{}", column.name);
        let text = given.remove(&column.name);
        let expression = match &text {
            Some(text) => compile(c, text, &at),
            None => match fields.iter().find(|(name, _)| *name == column.name) {
                Some(_) => compile(c, &format!("\"{}\"", column.name), &at),
                // Nothing fills it: NULL (every column is in the output expectations read).
                None if column.nullable => compile(c, "NULL", &at),
                None => {
                    c.push(
                        ErrorCode::MissingField,
                        &format!("{path}.select"),
                        format!(
                            "column `{}` of `{}` is not nullable and neither `select:` nor a \
                             decoded field of that name fills it",
                            column.name, target.name
                        ),
                    );
                    None
                }
            },
        };
        if let Some(expression) = expression {
            if !expression::fits(&expression, column.ty) {
                c.push(
                    ErrorCode::InvalidExpression,
                    &at,
                    format!(
                        "`{}` gives {} values and column `{}` holds {}; CAST it",
                        expression.text,
                        expression.ty.map_or("NULL", ColumnType::keyword),
                        column.name,
                        column.ty.keyword()
                    ),
                );
            }
            select.push(Selected {
                column: column.name.clone(),
                expression,
            });
        }
    }
    for column in given.keys() {
        c.push(
            ErrorCode::InvalidValue,
            &format!("{path}.select.{column}"),
            format!(
                "`{column}` is not a column of `{}` (its columns: {})",
                target.name,
                target
                    .columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    let filter = raw.filter.and_then(|text| {
        let at = format!("{path}.where");
        let e = compile(c, &text, &at)?;
        if !matches!(e.ty, Some(ColumnType::Boolean) | None) {
            c.push(
                ErrorCode::InvalidExpression,
                &at,
                format!(
                    "`where` is a condition; `{text}` gives {} values",
                    e.ty.map_or("NULL", ColumnType::keyword)
                ),
            );
        }
        Some(e)
    });
    // Expectations check the flow's output: the target's columns (as `select:` fills them)
    // and the envelope.
    let mut columns: Vec<(String, ColumnType)> = target
        .columns
        .iter()
        .map(|c| (c.name.clone(), c.ty))
        .collect();
    columns.extend(envelope_fields());
    let compile_over_columns =
        |c: &mut Collector<'_>, text: &str, at: &str| -> Option<Expression> {
            match expression::compile(text, &columns) {
                Ok(e) => Some(e),
                Err(why) => {
                    c.push(ErrorCode::InvalidExpression, at, why);
                    None
                }
            }
        };
    let mut expectations: Vec<Expectation> = Vec::new();
    for (i, raw) in raw.expect.unwrap_or_default().into_iter().enumerate() {
        let at = format!("{path}.expect[{i}]");
        let Some(e) = expectation(c, raw, &at, &compile_over_columns) else {
            continue;
        };
        if expectations.iter().any(|other| other.name == e.name) {
            c.push(
                ErrorCode::DuplicateName,
                &format!("{at}.name"),
                format!("expectation `{}` is listed twice", e.name),
            );
        }
        if i == MOST_EXPECTATIONS {
            // The store counts a record's verdicts as one bit each of a 64-bit integer.
            c.push(
                ErrorCode::InvalidValue,
                &at,
                format!("a flow has at most {MOST_EXPECTATIONS} expectations"),
            );
        }
        expectations.push(e);
    }
    FlowQuery {
        decode,
        fields: decoded,
        select,
        filter,
        expectations,
        changes: None,
    }
}

fn expectation(
    c: &mut Collector<'_>,
    raw: RawExpectation,
    path: &str,
    compile: &dyn Fn(&mut Collector<'_>, &str, &str) -> Option<Expression>,
) -> Option<Expectation> {
    let name = crate::fields::required(c, raw.name, &format!("{path}.name"));
    if !name.is_empty() && !is_identifier(&name) {
        c.push(
            ErrorCode::InvalidIdentifier,
            &format!("{path}.name"),
            format!("`{name}` is not an identifier: use [a-z_][a-z0-9_]*, at most 48 bytes"),
        );
    }
    let on_violation = match raw.on_violation.as_deref() {
        None | Some("warn") => OnViolation::Warn,
        Some("drop") => OnViolation::Drop,
        Some("fail") => OnViolation::Fail,
        Some(other) => {
            c.push(
                ErrorCode::InvalidValue,
                &format!("{path}.on_violation"),
                format!("`{other}`: on_violation is warn, drop or fail"),
            );
            OnViolation::Warn
        }
    };
    let check_at = format!("{path}.check");
    let text = crate::fields::required(c, raw.check, &check_at);
    if text.is_empty() {
        return None;
    }
    let check = compile(c, &text, &check_at)?;
    if !matches!(check.ty, Some(ColumnType::Boolean) | None) {
        c.push(
            ErrorCode::InvalidExpression,
            &check_at,
            format!("an expectation's check is a condition; `{text}` is not"),
        );
    }
    Some(Expectation {
        name,
        check,
        on_violation,
    })
}
