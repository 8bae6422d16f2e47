//! A table target without `columns:`, written by a flow that decodes Avro or Protobuf by a
//! schema file or by the topic's Pub/Sub schema, takes its columns from the schema: one per
//! top-level field, of the type its values land as, nullable (SPEC §5, "Typed tables"). With
//! `schema: pubsub` they are the fields of every revision the schema service holds, oldest
//! first, and the target is marked ([`crate::Target::columns_follow_schema`]) so that a
//! revision committed while the flow runs adds its new fields as columns.
//!
//! This crate neither compiles schemas nor reaches Pub/Sub: the caller does, through
//! [`SchemaColumns`] (the worker's is the engine's compiler, the one its decoders use).
//! Guarantees:
//! - the derived columns are filled in before anything is checked, so the rest of the file
//!   (`select:`, `where:`, expectations, views, downstream flows) is checked against them as
//!   if they were declared;
//! - a schema that gives no columns, a field that cannot be a column name, a schema file that
//!   cannot be compiled, or a schema service that cannot be read, is an error located at the
//!   flow's `decode.schema` (a Pub/Sub revision that does not compile or changes a field's
//!   type adds no column: the caller leaves it out, as a running flow refuses it);
//! - without a caller that derives columns, nothing is derived and such a target is refused
//!   as before (declare its `columns:`).

use crate::columns::RESERVED_PREFIX;
use crate::errors::{Collector, ErrorCode};
use crate::model::{Column, DecodeFormat};
use crate::raw::{RawColumn, RawKind, RawPipeline};
use crate::validate::{MAX_IDENTIFIER_LEN, is_identifier};
use std::path::Path;

/// Where a `schema: pubsub` decode's schema is found: the flow's subscription, through the
/// file's `pubsub:` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubSubSchemaOf {
    /// `pubsub.project`.
    pub project: Option<String>,
    /// `pubsub.endpoint`.
    pub endpoint: Option<String>,
    /// The flow's `source.pubsub.subscription`, as written.
    pub subscription: String,
}

/// Compiles a decode's schema file and says the columns it gives.
pub trait SchemaColumns {
    /// The columns of the schema in `file` (`message` names a Protobuf message), or why
    /// there are none.
    ///
    /// # Errors
    /// The schema does not compile, or gives no columns.
    fn columns(
        &self,
        format: DecodeFormat,
        file: &Path,
        message: Option<&str>,
    ) -> Result<Vec<Column>, String>;

    /// The columns of every revision of the schema of the topic `of` names (`message` names a
    /// Protobuf message), or why there are none. A caller that does not reach Pub/Sub says so.
    ///
    /// # Errors
    /// The schema service cannot be read, a revision does not compile, or revisions disagree.
    fn pubsub_columns(
        &self,
        _format: DecodeFormat,
        _of: &PubSubSchemaOf,
        _message: Option<&str>,
    ) -> Result<Vec<Column>, String> {
        Err("this command does not read Pub/Sub schemas: declare the columns".to_owned())
    }
}

/// Fills in the `columns:` of each table target without them that a flow writes by a schema
/// file (the first such flow's, in file order).
pub(crate) fn derive(raw: &mut RawPipeline, c: &mut Collector<'_>, schemas: &dyn SchemaColumns) {
    let settings = raw.pubsub.as_ref();
    let (project, endpoint) = (
        settings.and_then(|p| p.project.clone()),
        settings.and_then(|p| p.endpoint.clone()),
    );
    let (Some(flows), Some(targets)) = (&raw.flows, &mut raw.targets) else {
        return;
    };
    for (i, flow) in flows.iter().enumerate() {
        let Some(decode) = &flow.decode else {
            continue;
        };
        let format = match decode.format.as_deref() {
            Some("avro") => DecodeFormat::Avro,
            Some("protobuf") => DecodeFormat::Protobuf,
            _ => continue,
        };
        let Some(given) = decode.schema.as_deref() else {
            continue;
        };
        let Some(target) = targets.iter_mut().find(|t| {
            t.name.is_some()
                && t.name == flow.target
                && t.columns.is_none()
                && t.kind == Some(RawKind::Table)
        }) else {
            continue;
        };
        let from_pubsub = given == "pubsub";
        let derived = if from_pubsub {
            // A flow without a Pub/Sub subscription is refused where its source is checked.
            let Some(subscription) = flow
                .source
                .as_ref()
                .and_then(|s| s.pubsub.as_ref())
                .and_then(|p| p.subscription.clone())
            else {
                continue;
            };
            let of = PubSubSchemaOf {
                project: project.clone(),
                endpoint: endpoint.clone(),
                subscription,
            };
            schemas.pubsub_columns(format, &of, decode.message.as_deref())
        } else {
            let file = crate::paths::beside(c.file(), given);
            // An unreadable file or a wrong extension is reported where `decode:` is checked.
            if std::fs::metadata(&file).is_err() {
                continue;
            }
            schemas.columns(format, &file, decode.message.as_deref())
        };
        let what = if from_pubsub {
            "the topic's Pub/Sub schema".to_owned()
        } else {
            format!("schema file `{given}`")
        };
        let derived = derived.and_then(|columns| {
            let unfit: Vec<&str> = columns
                .iter()
                .map(|c| c.name.as_str())
                .filter(|name| !is_identifier(name) || name.starts_with(RESERVED_PREFIX))
                .collect();
            if unfit.is_empty() {
                Ok(columns)
            } else {
                Err(format!(
                    "field(s) {} cannot be column names (lowercase letters, digits and `_`, \
                         at most {MAX_IDENTIFIER_LEN} bytes, not starting with \
                         `{RESERVED_PREFIX}`), so the columns cannot be derived: declare \
                         `columns:` (a column reads the field of its name)",
                    unfit.join(", ")
                ))
            }
        });
        match derived {
            Ok(columns) if !columns.is_empty() => {
                target.columns_follow_schema = from_pubsub;
                target.columns = Some(
                    columns
                        .into_iter()
                        .map(|column| RawColumn {
                            name: Some(column.name),
                            ty: Some(column.ty.keyword().to_owned()),
                            // Every derived column is nullable, so that a field added to the
                            // schema later is a column added at the next start.
                            nullable: Some(true),
                        })
                        .collect(),
                );
            }
            Ok(_) => c.push(
                ErrorCode::InvalidValue,
                &format!("flows[{i}].decode.schema"),
                format!(
                    "{what} has no fields to derive the columns of target `{}` from: declare \
                     its `columns:`",
                    target.name.as_deref().unwrap_or_default()
                ),
            ),
            Err(why) => c.push(
                ErrorCode::InvalidValue,
                &format!("flows[{i}].decode.schema"),
                format!(
                    "target `{}` has no `columns:`, so they come from {what}: {why}",
                    target.name.as_deref().unwrap_or_default()
                ),
            ),
        }
    }
}
