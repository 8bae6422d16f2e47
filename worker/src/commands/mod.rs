//! The commands of the `sluice` binary, one file each; each prints its own output (and owns
//! its output format) and returns the exit code: 0 success, 1 runtime failure, 2 invalid input.

pub mod backfill;
pub mod bench;
pub mod check;
pub mod demo;
pub mod expectations;
pub mod graph;
pub mod init;
pub mod refresh;
pub mod run;
pub mod runs;
pub mod status;
mod status_live;
pub mod text;
pub mod validate;

use crate::runtime::flow::decoder::DecodeSchemas;
use sluice_pipeline::Pipeline;
use std::path::Path;
use std::process::ExitCode;

/// The environment variable whose value, when set, replaces the file's `store:` (a deployment
/// keeps the URL and its password in a secret, not in the pipeline file).
pub const STORE_ENV: &str = "SLUICE_STORE";

/// The environment variable holding the control API's bearer token for the commands that call
/// a running worker's control API (`sluice status`); when it is unset they read the file's
/// `control.token_file`. The worker itself takes its token from `control.token_file` only.
pub const CONTROL_TOKEN_ENV: &str = "SLUICE_CONTROL_TOKEN";

/// The bearer token a command sends to the control API (none when the file sets no
/// `control.listen`): [`CONTROL_TOKEN_ENV`] when set, else
/// the file's `control.token_file` when readable (when not, it says so on stderr and sends
/// none: a worker on loopback answers reads without one). A set but empty or non-UTF-8
/// variable is invalid input (exit 2), never silently ignored; the value is not echoed.
pub fn control_token(pipeline: &Pipeline) -> Result<Option<String>, ExitCode> {
    if pipeline.control_listen.is_none() {
        return Ok(None);
    }
    if let Some(value) = std::env::var_os(CONTROL_TOKEN_ENV) {
        let token = value.to_str().map(str::trim).unwrap_or_default();
        if token.is_empty() {
            eprintln!(
                "{CONTROL_TOKEN_ENV} is set but holds no token: set it to the worker's control \
                 token, or unset it to use the file's control.token_file"
            );
            return Err(ExitCode::from(2));
        }
        return Ok(Some(token.to_owned()));
    }
    let Some(file) = &pipeline.control_token_file else {
        return Ok(None);
    };
    match crate::serve::control::read_token(file) {
        Ok(token) => Ok(Some(token)),
        Err(why) => {
            eprintln!(
                "{why}; calling the control API without a token (or set {CONTROL_TOKEN_ENV})"
            );
            Ok(None)
        }
    }
}

/// Loads the pipeline file, or prints every error (file, path, line, message) and gives the
/// exit code 2 to return. [`STORE_ENV`] replaces its store.
pub fn load_or_exit(path: &Path) -> Result<Pipeline, ExitCode> {
    load(path).map_err(exit_invalid).and_then(store_from_env)
}

/// As [`load_or_exit`], with the checks of what this version runs (`NOT_BUILT` errors) and of
/// every decode's schema file against its flow's fields.
pub fn load_for_run_or_exit(path: &Path) -> Result<Pipeline, ExitCode> {
    sluice_pipeline::load_deriving(path, true, &DecodeSchemas)
        .and_then(|pipeline| with_schema_files_checked(path, pipeline))
        .map_err(exit_invalid)
        .and_then(store_from_env)
}

/// The valid pipeline file at `path`, a table target without `columns:` taking its schema
/// file's (what `sluice validate` checks).
pub fn load(path: &Path) -> Result<Pipeline, sluice_pipeline::ConfigErrors> {
    sluice_pipeline::load_deriving(path, false, &DecodeSchemas)
}

/// `pipeline` if every decode's schema file compiles and fills its flow's fields; else each
/// problem, located at `flows[i].decode.schema` in the file at `path`.
pub fn with_schema_files_checked(
    path: &Path,
    pipeline: Pipeline,
) -> Result<Pipeline, sluice_pipeline::ConfigErrors> {
    let problems = crate::runtime::flow::decoder::schema_file_problems(&pipeline);
    if problems.is_empty() {
        return Ok(pipeline);
    }
    Err(sluice_pipeline::locate_errors(
        path,
        problems
            .into_iter()
            .map(|(i, why)| {
                (
                    sluice_pipeline::ErrorCode::InvalidValue,
                    format!("flows[{i}].decode.schema"),
                    why,
                )
            })
            .collect(),
    ))
}

/// `pipeline` with its Pub/Sub project from Application Default Credentials when it names a
/// subscription by a short name and neither the file nor the environment names a project (a
/// worker on GKE with Workload Identity, or on a VM, needs no `pubsub.project`).
pub async fn with_adc_project(mut pipeline: Pipeline) -> Pipeline {
    let short_names = pipeline.flows.iter().any(|f| match &f.source {
        sluice_pipeline::Source::PubSub(source) => !source.subscription.starts_with("projects/"),
        _ => false,
    });
    if short_names {
        let config = sluice_connector::PubSubConfig {
            project: pipeline.pubsub.project.clone(),
            endpoint: pipeline.pubsub.endpoint.clone(),
        }
        .with_adc_project()
        .await;
        pipeline.pubsub.project = config.project;
    }
    pipeline
}

/// `pipeline` with its store from [`STORE_ENV`] when that is set; an unusable value is invalid
/// input (exit 2), never silently ignored.
fn store_from_env(mut pipeline: Pipeline) -> Result<Pipeline, ExitCode> {
    let Some(value) = std::env::var_os(STORE_ENV) else {
        return Ok(pipeline);
    };
    let url = value.to_str().map(str::trim).unwrap_or_default();
    // The value is not echoed: it may hold a password.
    if url.parse::<sluice_store::StoreUrl>().is_err() {
        eprintln!(
            "{STORE_ENV} is set but is not a store URL: set it to sqlite://PATH or \
             postgres://USER@HOST/DB, or unset it to use the file's store"
        );
        return Err(ExitCode::from(2));
    }
    url.clone_into(&mut pipeline.store);
    Ok(pipeline)
}

fn exit_invalid(errors: sluice_pipeline::ConfigErrors) -> ExitCode {
    eprintln!("{errors}");
    ExitCode::from(2)
}
