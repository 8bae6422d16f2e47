//! A typed flow's query as each of its commits reads it ([`QueryCell`]): fixed for most flows;
//! widened while running for a table whose columns follow the topic's Pub/Sub schema, when a
//! revision met for the first time adds fields (`decode/revisions.rs`).
//!
//! Guarantees:
//! * The query only grows: fields and columns are appended, never changed or removed. The
//!   values a record was decoded with under an earlier query are therefore a prefix of the
//!   current query's fields, and a commit pads them with NULL ([`QueryCell::padded`]).
//! * A column added while running is listed in [`TypedQuery::grown`] until a commit of this
//!   process wrote with it. Each commit's transaction first adds the listed columns its table
//!   lacks (nullable; `sluice_store::typed`), so the column is added by the transaction that
//!   first needs it, on whichever replica meets the revision first; the others find it.

use crate::flow::decode::derive::DerivedColumn;
use sluice_store::{ColumnType, Sql, TypedColumn, TypedQuery, TypedValue};
use std::sync::{Arc, PoisonError, RwLock};

/// How a field added while running fills its column: the store's text of the expression that
/// reads it (the pipeline's compiler writes it, as for a declared column), or why the field
/// cannot be a column (its name).
pub type FieldColumn = Box<dyn Fn(&str, ColumnType) -> Result<Sql, String> + Send + Sync>;

/// A typed flow's query, shared by its decoder (which may widen it) and its committer.
pub struct QueryCell {
    current: RwLock<Arc<TypedQuery>>,
    field_column: Option<FieldColumn>,
}

impl std::fmt::Debug for QueryCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryCell")
            .field("current", &self.current())
            .field("follows_schema", &self.field_column.is_some())
            .finish()
    }
}

impl QueryCell {
    /// A query that never changes.
    pub fn fixed(query: Arc<TypedQuery>) -> Self {
        Self {
            current: RwLock::new(query),
            field_column: None,
        }
    }

    /// A query whose table follows a Pub/Sub schema: a field a new revision adds becomes a
    /// nullable column filled by `field_column`'s expression.
    pub fn following_schema(query: Arc<TypedQuery>, field_column: FieldColumn) -> Self {
        Self {
            current: RwLock::new(query),
            field_column: Some(field_column),
        }
    }

    /// The query now.
    pub fn current(&self) -> Arc<TypedQuery> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Appends those of `columns` not among the query's fields as nullable columns, each filled
    /// by its field; those whose field cannot be a column are left out, and said.
    ///
    /// # Errors
    /// The query does not follow a schema (nothing added), or why some fields were left out.
    pub(crate) fn widen(&self, columns: &[DerivedColumn]) -> Result<(), String> {
        let Some(field_column) = &self.field_column else {
            return Err("the table's columns are declared".to_owned());
        };
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let mut query = TypedQuery::clone(&current);
        let mut left_out = Vec::new();
        for (name, ty, _) in columns {
            if query.fields.iter().any(|(known, _)| known == name) {
                continue;
            }
            let read = match field_column(name, *ty) {
                Ok(read) => read,
                Err(why) => {
                    left_out.push(why);
                    continue;
                }
            };
            let column = TypedColumn {
                name: name.clone(),
                ty: *ty,
                nullable: true,
            };
            query.fields.push((name.clone(), *ty));
            query.select.push((column.clone(), read));
            query.grown.push(column);
        }
        *current = Arc::new(query);
        if left_out.is_empty() {
            Ok(())
        } else {
            Err(left_out.join("; "))
        }
    }

    /// A commit with `query` succeeded: the columns it added exist now, and later commits of
    /// this process need not look for them.
    pub(crate) fn committed(&self, query: &TypedQuery) {
        if query.grown.is_empty() {
            return;
        }
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let mut now = TypedQuery::clone(&current);
        now.grown.retain(|column| !query.grown.contains(column));
        *current = Arc::new(now);
    }

    /// `values` decoded under an earlier query, padded with NULL to `query`'s fields.
    pub(crate) fn padded(query: &TypedQuery, values: &mut Vec<TypedValue>) {
        if values.len() < query.fields.len() {
            values.resize(query.fields.len(), TypedValue::Null);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn query() -> Arc<TypedQuery> {
        let id = TypedColumn {
            name: "id".into(),
            ty: ColumnType::Text,
            nullable: true,
        };
        let read = Sql {
            postgres: "\"id\"".into(),
            sqlite: "\"id\"".into(),
        };
        Arc::new(TypedQuery {
            fields: vec![("id".into(), ColumnType::Text)],
            select: vec![(id, read)],
            filter: None,
            expectations: Vec::new(),
            grown: Vec::new(),
            changes: None,
        })
    }

    fn reads(name: &str, _: ColumnType) -> Result<Sql, String> {
        if name.chars().any(char::is_uppercase) {
            return Err(format!("`{name}` cannot be a column name"));
        }
        Ok(Sql {
            postgres: format!("\"{name}\""),
            sqlite: format!("\"{name}\""),
        })
    }

    #[test]
    fn a_following_query_grows_and_forgets_what_a_commit_added() {
        let cell = QueryCell::following_schema(query(), Box::new(reads));
        let note = ("note".to_owned(), ColumnType::Text, false);
        cell.widen(&[note.clone(), ("id".into(), ColumnType::Text, true)])
            .unwrap();
        let grown = cell.current();
        assert_eq!(grown.fields.len(), 2);
        assert_eq!(grown.grown.len(), 1);
        assert!(
            grown.grown[0].nullable,
            "a column added while running is nullable"
        );
        let mut values = vec![TypedValue::Text("a".into())];
        QueryCell::padded(&grown, &mut values);
        assert_eq!(values, vec![TypedValue::Text("a".into()), TypedValue::Null]);
        cell.committed(&grown);
        assert!(cell.current().grown.is_empty());
        assert_eq!(cell.current().fields.len(), 2);
        assert!(
            cell.widen(&[("Bad".into(), ColumnType::Text, true)])
                .is_err()
        );
        assert_eq!(cell.current().fields.len(), 2, "all or none");
        let fixed = QueryCell::fixed(query());
        assert!(fixed.widen(&[note]).is_err());
    }
}
