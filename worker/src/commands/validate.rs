//! `sluice validate -c FILE [--format json]`: checks that a pipeline file is valid (`run` also
//! refuses what this version does not run, `NOT_BUILT`), every decode's schema file included
//! (compiled, and checked to fill its flow's fields). Exit 0 when valid; 2 with every error
//! (code, file, path, line, column, message) when not.

use clap::ValueEnum;
use std::path::Path;
use std::process::ExitCode;

/// Output format of `validate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ValidateFormat {
    /// One line per error.
    Text,
    /// A JSON document.
    Json,
}

/// Checks `config` and prints the verdict in `format`.
pub fn validate(config: &Path, format: ValidateFormat) -> ExitCode {
    let result =
        super::load(config).and_then(|pipeline| super::with_schema_files_checked(config, pipeline));
    match (format, result) {
        (ValidateFormat::Text, Ok(pipeline)) => {
            println!(
                "{}: valid ({} targets, {} flows)",
                config.display(),
                pipeline.targets.len(),
                pipeline.flows.len()
            );
            ExitCode::SUCCESS
        }
        (ValidateFormat::Text, Err(errors)) => {
            eprintln!("{errors}");
            ExitCode::from(2)
        }
        (ValidateFormat::Json, result) => {
            let errors: Vec<_> = result
                .as_ref()
                .err()
                .map(|errors| {
                    errors
                        .iter()
                        .map(|e| {
                            serde_json::json!({
                                "code": e.code.as_str(), "file": e.file, "path": e.path,
                                "line": e.line, "column": e.column, "message": e.message,
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            let valid = errors.is_empty();
            println!(
                "{}",
                serde_json::json!({ "valid": valid, "errors": errors })
            );
            if valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }
    }
}
