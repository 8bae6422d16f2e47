//! A pipeline's typed tables and typed flows as the store and the engine take them: each
//! target's declared columns ([`typed_tables`]), and a flow's decoder and query
//! ([`typed_flow`]), from the validated file (`sluice_pipeline::query` compiled them). The
//! query of a table whose columns follow the topic's Pub/Sub schema grows while running, each
//! new column filled from its field as a declared one would be ([`field_column`]).

use sluice_engine::{Expectation, OnViolation, PayloadDecoder, QueryCell};
use sluice_pipeline::{Column, ColumnType, Flow, Pipeline, TargetKind};
use sluice_store::{ChangeRule, Sql, TypedColumn, TypedQuery, TypedTable, TypedView, table_name};
use std::sync::Arc;

/// A column type as the store names it.
pub fn column_type(ty: ColumnType) -> sluice_store::ColumnType {
    use sluice_store::ColumnType as S;
    match ty {
        ColumnType::Text => S::Text,
        ColumnType::Integer => S::Integer,
        ColumnType::Double => S::Double,
        ColumnType::Numeric => S::Numeric,
        ColumnType::Boolean => S::Boolean,
        ColumnType::Timestamp => S::Timestamp,
        ColumnType::Date => S::Date,
        ColumnType::Json => S::Json,
        ColumnType::Bytes => S::Bytes,
    }
}

/// A store's column type as the pipeline file names it.
pub fn pipeline_column_type(ty: sluice_store::ColumnType) -> ColumnType {
    use sluice_store::ColumnType as S;
    match ty {
        S::Text => ColumnType::Text,
        S::Integer => ColumnType::Integer,
        S::Double => ColumnType::Double,
        S::Numeric => ColumnType::Numeric,
        S::Boolean => ColumnType::Boolean,
        S::Timestamp => ColumnType::Timestamp,
        S::Date => ColumnType::Date,
        S::Json => ColumnType::Json,
        S::Bytes => ColumnType::Bytes,
    }
}

fn column(column: &Column) -> TypedColumn {
    TypedColumn {
        name: column.name.clone(),
        ty: column_type(column.ty),
        nullable: column.nullable,
    }
}

/// The pipeline's table targets with `columns:`.
pub fn typed_tables(pipeline: &Pipeline) -> Vec<TypedTable> {
    pipeline
        .targets
        .iter()
        .filter(|t| matches!(t.kind, TargetKind::Table) && !t.columns.is_empty())
        .map(|t| TypedTable {
            target: t.name.clone(),
            columns: t.columns.iter().map(column).collect(),
            keys: t.keys.clone(),
        })
        .collect()
}

/// The pipeline's views as the store creates them.
pub fn typed_views(pipeline: &Pipeline) -> Result<Vec<TypedView>, sluice_store::StoreError> {
    let mut views = Vec::new();
    for view in &pipeline.views {
        let Some(target) = pipeline.targets.iter().find(|t| t.name == view.name) else {
            continue;
        };
        let columns = selected_columns(target, &view.select);
        views.push(TypedView {
            name: table_name(&pipeline.name, &view.name)?,
            table: table_name(&pipeline.name, &view.table)?,
            columns,
            filter: view.filter.as_ref().map(sql),
        });
    }
    Ok(views)
}

/// Each selected column of `target` with its expression, as the store takes them.
fn selected_columns(
    target: &sluice_pipeline::Target,
    selected: &[sluice_pipeline::Selected],
) -> Vec<(TypedColumn, Sql)> {
    selected
        .iter()
        .filter_map(|selected| {
            let declared = target.columns.iter().find(|c| c.name == selected.column)?;
            Some((column(declared), sql(&selected.expression)))
        })
        .collect()
}

/// An expression as the store takes it.
fn sql(e: &sluice_pipeline::Expression) -> Sql {
    Sql {
        postgres: e.postgres.clone(),
        sqlite: e.sqlite.clone(),
    }
}

/// What a typed flow runs with.
pub struct TypedFlow {
    /// Its payload decoder.
    pub fields: Arc<dyn PayloadDecoder>,
    /// The query the store writes rows with (widened while running when the table follows
    /// the topic's Pub/Sub schema).
    pub query: Arc<QueryCell>,
    /// Its expectations, in the order of the query's checks.
    pub expectations: Vec<Expectation>,
}

/// The fields a typed flow's decoder gives, in order, as the store names their types.
pub fn decoded_fields(flow: &Flow) -> Vec<(String, sluice_store::ColumnType)> {
    flow.query
        .fields
        .iter()
        .map(|f| (f.name.clone(), column_type(f.ty)))
        .collect()
}

/// A typed flow's decoder, query and expectations; `None` for a flow that lands envelope rows;
/// an error when its decoder cannot be made (a schema file that does not fill its fields).
pub fn typed_flow(pipeline: &Pipeline, flow: &Flow) -> Result<Option<TypedFlow>, String> {
    if !flow.query.is_typed() {
        return Ok(None);
    }
    let Some(target) = pipeline.targets.iter().find(|t| t.name == flow.target) else {
        return Ok(None);
    };
    let fields = decoded_fields(flow);
    let select = selected_columns(target, &flow.query.select);
    let filter = flow.query.filter.as_ref().map(sql);
    let expectations = flow
        .query
        .expectations
        .iter()
        .map(|e| Expectation {
            name: e.name.clone(),
            on_violation: match e.on_violation {
                sluice_pipeline::OnViolation::Warn => OnViolation::Warn,
                sluice_pipeline::OnViolation::Drop => OnViolation::Drop,
                sluice_pipeline::OnViolation::Fail => OnViolation::Fail,
            },
        })
        .collect();
    let query = Arc::new(TypedQuery {
        fields: fields.clone(),
        select,
        filter,
        expectations: flow
            .query
            .expectations
            .iter()
            .map(|e| (e.name.clone(), sql(&e.check)))
            .collect(),
        grown: Vec::new(),
        changes: flow.query.changes.as_ref().map(|changes| ChangeRule {
            keys: target.keys.clone(),
            sequence_by: changes.sequence_by.clone(),
            deletes: changes.deletes.as_ref().map(sql),
            ignore_null_updates: changes.ignore_null_updates,
        }),
    });
    let (query, following) = if target.columns_follow_schema {
        let cell = Arc::new(QueryCell::following_schema(query, Box::new(field_column)));
        (cell.clone(), Some(cell))
    } else {
        (Arc::new(QueryCell::fixed(query)), None)
    };
    Ok(Some(TypedFlow {
        fields: super::decoder::decoder(pipeline, flow, fields, following)?,
        query,
        expectations,
    }))
}

/// The expression that fills a column added while running from the field of its name, as a
/// declared column without `select:` is filled; or why the field cannot be a column.
fn field_column(name: &str, ty: sluice_store::ColumnType) -> Result<Sql, String> {
    if !sluice_pipeline::is_identifier(name) || name.starts_with(sluice_pipeline::RESERVED_PREFIX) {
        return Err(format!(
            "`{name}` is not a column name (lowercase letters, digits and `_`, at most {} \
             bytes, not starting with `{}`)",
            sluice_pipeline::MAX_IDENTIFIER_LEN,
            sluice_pipeline::RESERVED_PREFIX
        ));
    }
    let fields = [(name.to_owned(), pipeline_column_type(ty))];
    let expression = sluice_pipeline::expression::compile(&format!("\"{name}\""), &fields)?;
    Ok(sql(&expression))
}
