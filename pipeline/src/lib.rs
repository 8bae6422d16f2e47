//! The sluice pipeline file (SPEC §4): parsing, defaults and validation.
//!
//! [`load`] and [`parse`] turn a pipeline file into a [`Pipeline`] or into [`ConfigErrors`].
//! What this crate guarantees:
//!
//! - **Only validated pipelines exist.** A [`Pipeline`] returned here has every default applied
//!   (see the field docs in [`model`]) and passed every check below; nothing else in sluice
//!   needs to re-check it.
//! - **Unknown keys are errors**, everywhere in the file (`UNKNOWN_KEY`); so are repeated keys.
//! - **Names are identifiers.** `pipeline`, target and flow names match `[a-z_][a-z0-9_]*` and are
//!   at most 48 bytes ([`is_identifier`]), so they can be used in table names without quoting;
//!   target names and flow names are unique.
//! - **References resolve.** Every flow's `target`, every `source.table` names a declared target
//!   and every `depends_on` entry names a declared flow.
//! - **The flow graph can run** (SPEC §6; [`graph`] builds it and explains what its edges mean
//!   for scheduling). It has no cycle, counting `depends_on` edges and data edges (a flow reading
//!   `source: { table: X }` waits for every flow whose target is `X`), a flow depending on itself
//!   included (`DEPENDS_ON_CYCLE`, printing the cycle). In continuous mode every `depends_on`
//!   predecessor is a `once` flow (`DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE`) and none writes to a
//!   `foreach_batch` target (`FOREACH_BATCH_PREDECESSOR`); triggered mode allows both. In either
//!   mode no predecessor writes to a `view` (`DEPENDS_ON_PREDECESSOR_WRITES_TO_VIEW`) and no
//!   `once` flow writes to a `foreach_batch` target (`FOREACH_BATCH_CANNOT_BE_ONCE`).
//! - **Values are in range.** Durations and sizes are humane (`10m`, `50ms`, `100MiB`) and
//!   parsed; counts have their documented bounds (`streams` 1..=64, `max_attempts` ≥ 1, ...).
//! - **Every error is located.** Each [`ConfigError`] carries a stable [`ErrorCode`], the file,
//!   the path inside it (`flows[1].depends_on`) and, whenever the file has that place, the line
//!   and column; it prints as one line. Problems found after the file was read (ranges, names,
//!   references) are all reported together; a file that is not well-formed YAML, or whose shape
//!   serde rejects (unknown key, wrong type), stops at its first such problem.
//! - **What cannot run is said before a run.** [`load_for_run`] (what `sluice run` loads) adds
//!   the checks of what this version runs (`NOT_BUILT`, located like every other error);
//!   `sluice validate` accepts such a file, since it is valid.

mod aggregate;
pub mod aggregates;
mod apply_changes;
mod capabilities;
mod columns;
mod convert;
mod decode;
pub mod defaults;
mod derived_columns;
mod errors;
pub mod expression;
mod fields;
pub mod graph;
mod humane;
mod locate;
pub mod model;
mod more_errors;
mod paths;
mod payload_decode;
pub mod query;
mod raw;
mod schedule;
mod schedule_fields;
mod source;
pub mod timetable;
mod update_condition;
mod validate;
mod views;

use std::path::Path;

pub use aggregate::{Aggregate, AggregateFunction};
pub use apply_changes::ApplyChanges;
pub use columns::RESERVED_PREFIX;
pub use derived_columns::{PubSubSchemaOf, SchemaColumns};
pub use errors::{ConfigError, ConfigErrors, ErrorCode};
pub use model::*;
pub use validate::{MAX_IDENTIFIER_LEN, is_identifier};

/// The JSON Schema of the pipeline file (draft 2020-12), generated from the types the file is
/// read into, for editors to validate and complete files with (`sluice schema`;
/// `docs/pipeline.schema.json`, kept current by a test). It says which keys exist and the
/// shape of their values; the checks on values are `sluice validate`'s.
pub fn json_schema() -> String {
    let mut schema = schemars::schema_for!(raw::RawPipeline);
    schema.insert("title".into(), "sluice pipeline file".into());
    serde_json::to_string_pretty(&schema).unwrap_or_default() + "\n"
}

/// Reads, parses and validates the pipeline file at `path`.
///
/// # Errors
/// Every problem found, each located; an unreadable file is one `UNREADABLE` error.
pub fn load(path: &Path) -> Result<Pipeline, ConfigErrors> {
    let text = read(path)?;
    parse(&text, path)
}

/// The file's text, or one `UNREADABLE` error.
fn read(path: &Path) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            ErrorCode::Unreadable,
            path,
            "",
            None,
            format!("cannot read the pipeline file: {e}"),
        )
        .into()
    })
}

/// Like [`load`], and also checks that this version can run everything the file asks for:
/// what `sluice run` loads. A valid file that uses what is not built yet gets located
/// `NOT_BUILT` errors.
///
/// # Errors
/// As [`load`], plus one `NOT_BUILT` error per part this version cannot run.
pub fn load_for_run(path: &Path) -> Result<Pipeline, ConfigErrors> {
    let text = read(path)?;
    parse_with(&text, path, true, None)
}

/// Like [`load`] (`for_run`: [`load_for_run`]), and a table target without `columns:` that a
/// flow fills by decoding with a schema file takes its columns from the schema, which
/// `schemas` compiles (what `sluice validate` and `sluice run` load).
///
/// # Errors
/// As [`load`] or [`load_for_run`], plus a schema that gives no columns, located at the
/// flow's `decode.schema`.
pub fn load_deriving(
    path: &Path,
    for_run: bool,
    schemas: &dyn SchemaColumns,
) -> Result<Pipeline, ConfigErrors> {
    let text = read(path)?;
    parse_with(&text, path, for_run, Some(schemas))
}

/// Problems a caller found in a valid pipeline file (a decode's schema file, which the engine
/// compiles), located like every other error: each `(code, path, message)`, in the file at
/// `file`.
pub fn locate_errors(file: &Path, problems: Vec<(ErrorCode, String, String)>) -> ConfigErrors {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let locator = locate::Locator::new(&text);
    let mut collector = errors::Collector::new(file, &locator);
    for (code, path, message) in problems {
        collector.push(code, &path, message);
    }
    match collector.finish(()) {
        Ok(()) => ConfigErrors(Vec::new()),
        Err(errors) => errors,
    }
}

/// Parses and validates pipeline text; `file` is only used to name the file in errors.
///
/// # Errors
/// Every problem found, each located (see the crate docs for what stops early).
pub fn parse(text: &str, file: &Path) -> Result<Pipeline, ConfigErrors> {
    parse_with(text, file, false, None)
}

/// Like [`parse`], plus the checks of [`load_for_run`].
///
/// # Errors
/// As [`load_for_run`].
pub fn parse_for_run(text: &str, file: &Path) -> Result<Pipeline, ConfigErrors> {
    parse_with(text, file, true, None)
}

fn parse_with(
    text: &str,
    file: &Path,
    for_run: bool,
    schemas: Option<&dyn SchemaColumns>,
) -> Result<Pipeline, ConfigErrors> {
    let locator = locate::Locator::new(text);
    let mut raw = decode::decode(text, file, &locator)?;
    let mut collector = errors::Collector::new(file, &locator);
    if let Some(schemas) = schemas {
        derived_columns::derive(&mut raw, &mut collector, schemas);
    }
    let mut pipeline = convert::convert(raw, &mut collector);
    validate::validate(&pipeline, &mut collector);
    // Views are built from a valid model, and what cannot run is asked only of a valid file:
    // their checks read a consistent model.
    if collector.len() == 0 {
        views::define(&mut pipeline, &mut collector);
    }
    if for_run && collector.len() == 0 {
        capabilities::check(&pipeline, &mut collector);
    }
    // A flow writing a view defines it and does not run: no command sees it as a flow.
    let views: Vec<String> = pipeline.views.iter().map(|v| v.name.clone()).collect();
    pipeline.flows.retain(|f| !views.contains(&f.target));
    collector.finish(pipeline)
}
