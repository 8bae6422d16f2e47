//! `sluice backfill -c FILE --from T1 --to T2`: runs the intervals of a scheduled pipeline
//! whose runs cover `[T1, T2)` and have not completed (`runtime/runs/backfill.rs`), one after
//! the other, each recorded `backfill` in `sluice runs`, beside a running pool without
//! overlapping its runs. The dates are read as `start_date` is (RFC 3339, or a date or date
//! and time on the schedule's time zone). The backfill serves no metrics or control endpoint
//! (a pool's worker on the same host has them). Exit 0 when every interval completed, 1 when
//! one failed (the later ones are not run) or a signal stopped it before the range's end, 2
//! for a file without a schedule or a bad range.
//!
//! `--rerun` runs every ended interval of the range, completed or not, recorded `rerun`: each
//! run first deletes the rows its flows wrote with an event time in its interval, and their
//! ledger keys (`sluice_store::FlowStore::clear_interval`), then reads the interval again.
//! It is refused (exit 2) where that would not replace what the interval wrote: a schedule
//! without data intervals, a Pub/Sub flow (Pub/Sub keeps no intervals), a flow reading
//! another pipeline's table (read only where it left off), and a flow into a sink, window or
//! `foreach_batch` target (their output is not rows it can delete). `once` flows are not run
//! again, so their rows are not cleared either (`runtime/runs/rerun.rs`).

use crate::runtime::supervisor::BackfillRange;
use sluice_pipeline::{Pipeline, Source, TargetKind, timetable};
use std::path::Path;
use std::process::ExitCode;

/// Why `--rerun` cannot replace what the pipeline's intervals wrote, if it cannot.
fn rerun_refusal(pipeline: &Pipeline) -> Option<String> {
    let schedule = pipeline.schedule.as_ref()?;
    if schedule.semantics != sluice_pipeline::ScheduleSemantics::DataInterval {
        return Some(
            "--rerun replaces what each interval wrote: the schedule needs `semantics: \
             data_interval`"
                .to_owned(),
        );
    }
    pipeline.flows.iter().find_map(|flow| {
        match &flow.source {
            Source::PubSub(_) => {
                return Some(format!(
                    "--rerun: flow `{}` reads Pub/Sub, which keeps no intervals to read again",
                    flow.name
                ));
            }
            Source::PipelineTable { pipeline, target } => {
                return Some(format!(
                    "--rerun: flow `{}` reads table `{pipeline}.{target}` of another pipeline, \
                     which gives a run only the rows it has not read yet, so the interval's \
                     rows would not come back",
                    flow.name
                ));
            }
            Source::File { .. } | Source::Table { .. } => {}
        }
        let target = pipeline.targets.iter().find(|t| t.name == flow.target)?;
        (!matches!(target.kind, TargetKind::Table | TargetKind::View)).then(|| {
            format!(
                "--rerun: flow `{}` writes a {} target, whose output is not rows a rerun can \
                 delete (not built)",
                flow.name,
                target.kind.keyword()
            )
        })
    })
}

/// `sluice backfill -c FILE --from FROM --to TO [--rerun]`.
pub async fn backfill_file(path: &Path, from: &str, to: &str, rerun: bool) -> ExitCode {
    let mut pipeline = match super::load_for_run_or_exit(path) {
        Ok(pipeline) => super::with_adc_project(pipeline).await,
        Err(exit) => return exit,
    };
    let Some(schedule) = &pipeline.schedule else {
        eprintln!(
            "{}: a backfill runs the intervals of a schedule: the pipeline has no `schedule:`",
            path.display()
        );
        return ExitCode::from(2);
    };
    let range = timetable::time_zone(&schedule.timezone).and_then(|zone| {
        let from_ms = timetable::instant(from, &zone).map_err(|e| format!("--from: {e}"))?;
        let to_ms = timetable::instant(to, &zone).map_err(|e| format!("--to: {e}"))?;
        if to_ms <= from_ms {
            return Err(format!("--to ({to}) is not after --from ({from})"));
        }
        Ok(BackfillRange {
            from_ms,
            to_ms,
            rerun,
        })
    });
    if let Some(refusal) = rerun.then(|| rerun_refusal(&pipeline)).flatten() {
        eprintln!("{}: {refusal}", path.display());
        return ExitCode::from(2);
    }
    let range = match range {
        Ok(range) => range,
        Err(error) => {
            eprintln!("sluice backfill: {error}");
            return ExitCode::from(2);
        }
    };
    pipeline.metrics_listen = None;
    pipeline.control_listen = None;
    super::run::execute_and_report(path, &pipeline, Some(range)).await
}
