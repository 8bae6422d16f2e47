//! `view` targets: a named query over one typed table, not stored (SPEC §5, "Views").
//!
//! A view declares its `columns:`; the one flow that writes it is its definition: its source is
//! a typed table of the pipeline and its `select:`/`where:` the view's query. That flow does not
//! run: [`define`] turns it into a [`View`] (the store creates it as a view for people to
//! query), and a flow reading the view is rewritten to read its table with the view's query
//! applied: each view column its expression reads becomes the view's expression for it (cast to
//! the column's type), and the view's `where:` joins the flow's own. The reader then runs as any
//! typed flow over a table: every row of the table once, a record whose view expression fails a
//! dead letter naming the reader's column, a row outside the view counted as filtered.

use crate::columns::ColumnType;
use crate::errors::{Collector, ErrorCode};
use crate::expression::{self, Expression, Substitutes};
use crate::model::{Flow, Pipeline, Selected, Source, TargetKind, View};
use crate::query::envelope_fields;

/// Builds the pipeline's views from the flows that write them, and rewrites the flows that
/// read a view to read its table. Called on a valid model.
pub(crate) fn define(p: &mut Pipeline, c: &mut Collector<'_>) {
    let mut views = Vec::new();
    for (j, target) in p.targets.iter().enumerate() {
        if !matches!(target.kind, TargetKind::View) {
            continue;
        }
        if let Some(view) = view(p, c, j) {
            views.push(view);
        }
    }
    for (i, flow) in p.flows.iter_mut().enumerate() {
        let Source::Table { target } = &flow.source else {
            continue;
        };
        if let Some(view) = views.iter().find(|v| v.name == *target) {
            read_through(c, &p.targets, i, flow, view);
        }
    }
    p.views = views;
}

/// The view of `targets[j]`, from the flow that writes it; `None` after reporting why not.
fn view(p: &Pipeline, c: &mut Collector<'_>, j: usize) -> Option<View> {
    let target = &p.targets[j];
    let writers: Vec<usize> = (0..p.flows.len())
        .filter(|&i| p.flows[i].target == target.name)
        .collect();
    // A view nothing defines yet is valid; `run` refuses it (`capabilities.rs`).
    let &i = writers.first()?;
    for &other in &writers[1..] {
        c.push(
            ErrorCode::InvalidValue,
            &format!("flows[{other}].target"),
            format!(
                "view `{}` is defined by flow `{}`; a view has one query",
                target.name, p.flows[i].name
            ),
        );
    }
    if target.columns.is_empty() {
        c.push(
            ErrorCode::MissingField,
            &format!("targets[{j}].columns"),
            format!("view `{}` declares its `columns:`", target.name),
        );
        return None;
    }
    let flow = &p.flows[i];
    let table = match &flow.source {
        Source::Table { target: read } => p
            .targets
            .iter()
            .find(|t| t.name == *read && matches!(t.kind, TargetKind::Table))
            .filter(|t| !t.columns.is_empty()),
        _ => None,
    };
    let Some(table) = table else {
        c.push(
            ErrorCode::InvalidValue,
            &format!("flows[{i}].source"),
            format!(
                "view `{}` is a query over a typed table of this pipeline (`source: {{ table: \
                 NAME }}`, a table with `columns:`)",
                target.name
            ),
        );
        return None;
    };
    for (key, given) in [
        ("expect", !flow.query.expectations.is_empty()),
        ("depends_on", !flow.depends_on.is_empty()),
        ("once", flow.once),
    ] {
        if given {
            c.push(
                ErrorCode::InvalidValue,
                &format!("flows[{i}].{key}"),
                format!(
                    "flow `{}` defines view `{}`, which is not stored and does not run: `{key}` \
                     belongs to flows that land rows",
                    flow.name, target.name
                ),
            );
        }
    }
    // What the store's view reads: the table's declared columns (sluice's own are stored
    // in another form than a flow's expressions read them).
    let fields: Vec<(String, ColumnType)> = table
        .columns
        .iter()
        .map(|c| (c.name.clone(), c.ty))
        .collect();
    let recompile =
        |c: &mut Collector<'_>, text: &str, at: &str| match expression::compile(text, &fields) {
            Ok(e) => Some(e),
            Err(why) => {
                c.push(
                    ErrorCode::InvalidExpression,
                    at,
                    format!(
                        "{why} (a view reads its table's columns, and no attributes or payload)"
                    ),
                );
                None
            }
        };
    let mut select = Vec::new();
    for selected in &flow.query.select {
        let column = target.columns.iter().find(|c| c.name == selected.column)?;
        let at = format!("flows[{i}].select.{}", column.name);
        let text = &selected.expression.text;
        let typed = if selected.expression.ty == Some(column.ty) {
            text.clone()
        } else {
            format!("CAST(({text}) AS {})", column.ty.keyword())
        };
        let expression = Expression {
            text: text.clone(),
            ..recompile(c, &typed, &at)?
        };
        select.push(Selected {
            column: column.name.clone(),
            expression,
        });
    }
    let filter = match &flow.query.filter {
        Some(e) => Some(recompile(c, &e.text, &format!("flows[{i}].where"))?),
        None => None,
    };
    Some(View {
        name: target.name.clone(),
        table: table.name.clone(),
        select,
        filter,
    })
}

/// Rewrites `flows[i]`, which reads `view`, to read the view's table with its query applied.
fn read_through(
    c: &mut Collector<'_>,
    targets: &[crate::model::Target],
    i: usize,
    flow: &mut Flow,
    view: &View,
) {
    let Some(table) = targets.iter().find(|t| t.name == view.table) else {
        return;
    };
    let writes = targets.iter().find(|t| t.name == flow.target);
    if !writes.is_some_and(|t| matches!(t.kind, TargetKind::Table) && !t.columns.is_empty()) {
        c.push(
            ErrorCode::InvalidValue,
            &format!("flows[{i}].source.table"),
            format!(
                "flow `{}` reads view `{}`; a flow reading a view writes a typed table (a \
                 `table` with `columns:`), whose rows are the view's query applied",
                flow.name, view.name
            ),
        );
        return;
    }
    let substitutes: Substitutes = view
        .select
        .iter()
        .map(|s| (s.column.clone(), s.expression.clone()))
        .collect();
    // What the flow's expressions were compiled over: the view's columns and the envelope.
    let mut fields: Vec<(String, ColumnType)> = flow
        .query
        .fields
        .iter()
        .map(|f| (f.name.clone(), f.ty))
        .collect();
    fields.extend(envelope_fields());
    let through =
        |c: &mut Collector<'_>, e: &Expression, at: &str| match expression::compile_substituted(
            &e.text,
            &fields,
            Some(&substitutes),
        ) {
            Ok(through) => Some(Expression {
                text: e.text.clone(),
                ..through
            }),
            Err(why) => {
                c.push(ErrorCode::InvalidExpression, at, why);
                None
            }
        };
    for selected in &mut flow.query.select {
        let at = format!("flows[{i}].select.{}", selected.column);
        if let Some(e) = through(c, &selected.expression, &at) {
            selected.expression = e;
        }
    }
    if let Some(changes) = &mut flow.query.changes
        && let Some(deletes) = &changes.deletes
    {
        changes.deletes = through(
            c,
            deletes,
            &format!("flows[{i}].apply_changes.apply_as_deletes"),
        );
    }
    let own = match &flow.query.filter {
        Some(e) => through(c, e, &format!("flows[{i}].where")),
        None => None,
    };
    flow.query.filter = match (&view.filter, own) {
        (Some(v), Some(f)) => Some(Expression {
            text: format!("({}) AND ({})", v.text, f.text),
            postgres: format!("(({}) IS TRUE AND ({}) IS TRUE)", v.postgres, f.postgres),
            sqlite: format!("(({}) IS TRUE AND ({}) IS TRUE)", v.sqlite, f.sqlite),
            ty: Some(ColumnType::Boolean),
        }),
        (Some(v), None) => Some(v.clone()),
        (None, own) => own,
    };
    flow.query.fields = table.columns.clone();
    flow.source = Source::Table {
        target: table.name.clone(),
    };
}
