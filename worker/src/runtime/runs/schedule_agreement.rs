//! One timetable per pool: the scheduler fires only while every live replica of the pipeline
//! runs the schedule it runs.
//!
//! Each worker's heartbeat carries its schedule's [`fingerprint`]. A schedule changed in the
//! pipeline file reaches a running pool through a rollout (the Helm chart restarts the pods
//! when the file changes), during which old and new replicas run side by side; a lease moving
//! between them would mix two timetables. So the lease holder first compares
//! ([`disagreement`]): while a live replica runs another schedule, no fire runs, the
//! disagreement is logged once (naming the replicas) and shown as
//! `sluice_schedule_disagreement` 1, and the holder looks again every [`LOOK_AGAIN`]. Once the
//! old replicas are gone (or restarted with the new file) the pool fires by the one schedule,
//! going on from the last fire recorded. Guarantee: no fire is run by a worker while another
//! live replica's schedule differs from its own, as of their heartbeats read when the worker
//! decided to run it (a decision made before a wait is checked again when the wait ends).
//! A `sluice backfill` beats without its schedule: it runs the intervals it was asked for.

use sluice_pipeline::Schedule;
use sluice_store::WorkerRecord;
use std::time::Duration;

/// How often a scheduler that found the replicas disagreeing looks again.
pub const LOOK_AGAIN: Duration = Duration::from_secs(5);

/// When a scheduler that found the replicas disagreeing at `now_ms` looks again.
pub fn look_again_at(now_ms: i64) -> i64 {
    now_ms.saturating_add(i64::try_from(LOOK_AGAIN.as_millis()).unwrap_or(0))
}

/// The schedule as validated, in one line (`every: 60s` and `every: 1m` give one; a cron
/// preset and its five fields do not, nor does a binary whose schedule model changed).
pub fn fingerprint(schedule: &Schedule) -> String {
    format!("{schedule:?}")
}

/// The live replicas whose heartbeat carries another schedule than `own` (one that carries
/// none fires nothing: a `sluice backfill` beats without its schedule, and is not counted).
pub fn disagreement<'a>(alive: &'a [WorkerRecord], own: &str) -> Vec<&'a WorkerRecord> {
    alive
        .iter()
        .filter(|w| w.schedule.as_deref().is_some_and(|theirs| theirs != own))
        .collect()
}

/// Logs a disagreement once per episode, and its end; shows it as a gauge.
#[derive(Debug, Default)]
pub struct AgreementWatch {
    disagreeing: bool,
}

impl AgreementWatch {
    /// This worker does not hold the scheduler lease: it shows no disagreement (the holder
    /// does) and forgets the episode without a word.
    pub fn not_holding(&mut self, pipeline: &str) {
        if self.disagreeing {
            metrics::gauge!("sluice_schedule_disagreement", "pipeline" => pipeline.to_owned())
                .set(0.0);
        }
        self.disagreeing = false;
    }

    /// Records what the last look found (`others`: the replicas that disagree).
    pub fn observe(&mut self, pipeline: &str, own_worker: &str, others: &[&WorkerRecord]) {
        let disagreeing = !others.is_empty();
        metrics::gauge!("sluice_schedule_disagreement", "pipeline" => pipeline.to_owned())
            .set(if disagreeing { 1.0 } else { 0.0 });
        if disagreeing && !self.disagreeing {
            let names: Vec<&str> = others.iter().map(|w| w.worker.as_str()).collect();
            tracing::error!(worker = own_worker, others = ?names,
                "replicas of this pipeline run different schedules (a pipeline file changed \
                 while the pool ran): no fire runs until every live replica runs one schedule; \
                 finish the rollout, or restart every replica with the same pipeline file");
        } else if !disagreeing && self.disagreeing {
            tracing::info!("the replicas run one schedule again; firing");
        }
        self.disagreeing = disagreeing;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn alive(worker: &str, schedule: Option<&str>) -> WorkerRecord {
        WorkerRecord {
            worker: worker.to_owned(),
            host: "h".to_owned(),
            pid: 1,
            started_at_ms: 0,
            last_beat_ms: 0,
            schedule: schedule.map(str::to_owned),
        }
    }

    #[test]
    fn only_live_replicas_with_another_schedule_disagree() {
        let alive = [
            alive("me", Some("a")),
            alive("same", Some("a")),
            alive("backfill", None),
            alive("old", Some("b")),
        ];
        let others: Vec<&str> = disagreement(&alive, "a")
            .iter()
            .map(|w| w.worker.as_str())
            .collect();
        assert_eq!(others, ["old"]);
        assert!(disagreement(&alive[..3], "a").is_empty());
    }

    #[test]
    fn the_fingerprint_is_of_the_validated_schedule() {
        let file = |every: &str| {
            let text = format!(
                "pipeline: p\nmode: triggered\nstore: sqlite://x.db\nschedule: {{ every: {every} }}\n\
                 targets: [{{ name: t, kind: table }}]\n\
                 flows: [{{ name: f, target: t, source: {{ file: {{ path: \"x.jsonl\" }} }} }}]\n"
            );
            let pipeline = sluice_pipeline::parse(&text, std::path::Path::new("p.yaml")).unwrap();
            fingerprint(pipeline.schedule.as_ref().unwrap())
        };
        assert_eq!(
            file("60s"),
            file("1m"),
            "written differently, the same schedule"
        );
        assert_ne!(file("60s"), file("2m"));
    }
}
