//! The commands of the `sluice` binary, one file each; each prints its own output (and owns
//! its output format) and returns the exit code: 0 success, 1 runtime failure, 2 invalid input.

pub mod bench;
pub mod demo;
pub mod graph;
pub mod refresh;
pub mod run;
pub mod runs;
pub mod status;
pub mod text;
pub mod validate;

use sluice_pipeline::Pipeline;
use std::path::Path;
use std::process::ExitCode;

/// The environment variable whose value, when set, replaces the file's `store:` (a deployment
/// keeps the URL and its password in a secret, not in the pipeline file).
pub const STORE_ENV: &str = "SLUICE_STORE";

/// Loads the pipeline file, or prints every error (file, path, line, message) and gives the
/// exit code 2 to return. [`STORE_ENV`] replaces its store.
pub fn load_or_exit(path: &Path) -> Result<Pipeline, ExitCode> {
    sluice_pipeline::load(path)
        .map_err(exit_invalid)
        .and_then(store_from_env)
}

/// As [`load_or_exit`], with the checks of what this version runs (`NOT_BUILT` errors).
pub fn load_for_run_or_exit(path: &Path) -> Result<Pipeline, ExitCode> {
    sluice_pipeline::load_for_run(path)
        .map_err(exit_invalid)
        .and_then(store_from_env)
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
