//! `sluice full-refresh -c FILE [--seek TIME [--drop-unread]]` and `sluice reset FLOW -c FILE
//! [--seek TIME [--drop-unread]]`: the command-line front of `runtime/updates/refresh.rs` (which
//! states the guarantees). With no worker of the pipeline running, the command clears by itself;
//! with workers running, it asks them for a pool update (`runtime/updates/pool.rs`) and waits until
//! it ended. Exit 0 when done, 2 for invalid input, 1 when the store or Pub/Sub refused or the pool
//! update failed.

use crate::runtime::pool::identity;
use crate::runtime::updates::pool::{self, Part};
use crate::runtime::updates::prepare;
use crate::runtime::updates::refresh::Clearing;
use crate::runtime::updates::refresh_error::RefreshError;
use crate::runtime::updates::request::{self, UpdateKind};
pub use crate::runtime::updates::seek::Seek;
use sluice_pipeline::Pipeline;
use std::path::Path;
use std::process::ExitCode;

/// `sluice full-refresh -c FILE [--seek TIME [--drop-unread]]`.
pub async fn full_refresh_file(path: &Path, seek: Option<&Seek>) -> ExitCode {
    let pipeline = match super::load_or_exit(path) {
        Ok(pipeline) => super::with_adc_project(pipeline).await,
        Err(exit) => return exit,
    };
    let kind = UpdateKind::FullRefresh {
        seek: seek.cloned(),
    };
    report(path, carry_out(&pipeline, kind).await)
}

/// `sluice reset FLOW -c FILE [--seek TIME [--drop-unread]]`.
pub async fn reset_file(path: &Path, flow: &str, seek: Option<&Seek>) -> ExitCode {
    let pipeline = match super::load_or_exit(path) {
        Ok(pipeline) => super::with_adc_project(pipeline).await,
        Err(exit) => return exit,
    };
    let kind = UpdateKind::Reset {
        flow: flow.to_owned(),
        seek: seek.cloned(),
    };
    report(path, carry_out(&pipeline, kind).await)
}

/// Clears what `kind` asks: alone when no worker of the pipeline runs, else as a pool update
/// the running workers carry out.
async fn carry_out(pipeline: &Pipeline, kind: UpdateKind) -> Result<String, RefreshError> {
    request::check(pipeline, &kind).await?;
    let failed = |e: sluice_store::StoreError| RefreshError::Failed(format!("store: {e}"));
    let store = sluice_store::open(&pipeline.store).map_err(failed)?;
    store
        .prepare(&prepare::layout(pipeline))
        .await
        .map_err(failed)?;
    let me = format!("cli-{}", identity::identity(&pipeline.name).worker);
    let running = request::others_alive(pipeline, &*store, &me).await?;
    if running.is_empty() {
        return request::clear(pipeline, &kind, Clearing::default()).await;
    }
    eprintln!(
        "{} worker(s) of pipeline {} are running ({}): asking them to stop their flows for \
         the update; `sluice status` shows its progress",
        running.len(),
        pipeline.name,
        running.join(", ")
    );
    let id = pool::request(pipeline, &*store, &kind, &me).await?;
    let part = Part {
        pipeline,
        store: &store,
        me: &me,
        stopped_flows: false,
        asker: true,
    };
    pool::take_part(&part, id)
        .await
        .map(|done| format!("pool update {id} done: {done}"))
}

fn report(path: &Path, result: Result<String, RefreshError>) -> ExitCode {
    match result {
        Ok(done) => {
            println!("{done}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{}: {error}", path.display());
            error.exit_code()
        }
    }
}
