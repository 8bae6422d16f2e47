//! `schedule.on_update`: a scheduled pipeline that reads tables of other pipelines in its
//! store (`source: { table: PIPELINE.TARGET }`) also runs when one of them has committed rows
//! the reading flow has not read, like Airflow's dataset-or-time schedules; such runs start at
//! most once per `min_interval` (a debounce: rows that keep coming make a run every
//! `min_interval`, not one per commit).
//!
//! The check is the reading flow's own feed lag (`FeedStore::feed_lag` past its committed
//! position), so what fires a run is exactly what the run will read; it is polled every
//! [`POLL`] while the scheduler waits for its next fire.

use crate::runtime::flow::build;
use sluice_pipeline::{Pipeline, Source};
use sluice_store::{FlowHandle, Store};
use std::sync::Arc;
use std::time::Duration;

/// How often the tables are looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// The tables of other pipelines a scheduled pipeline reads, with the flows reading them.
pub struct TableUpdates {
    store: Arc<dyn Store>,
    reads: Vec<(FlowHandle, String)>,
    min_interval_ms: i64,
}

impl TableUpdates {
    /// The watch of `pipeline`'s reads of other pipelines' tables (`handles` in flow order),
    /// when its schedule has `on_update: true`.
    pub fn new(pipeline: &Pipeline, handles: &[FlowHandle], store: Arc<dyn Store>) -> Option<Self> {
        let schedule = pipeline.schedule.as_ref().filter(|s| s.on_update)?;
        let reads: Vec<(FlowHandle, String)> = pipeline
            .flows
            .iter()
            .zip(handles)
            .filter(|(flow, _)| matches!(flow.source, Source::PipelineTable { .. }))
            .filter_map(|(flow, handle)| Some((handle.clone(), build::read_table(pipeline, flow)?)))
            .collect();
        Some(Self {
            store,
            reads,
            min_interval_ms: i64::try_from(schedule.min_interval.as_millis()).unwrap_or(i64::MAX),
        })
    }

    /// Returns once a read table has rows its flow has not read and `min_interval` has passed
    /// since the last run started (`last_run_ms`, this worker's clock). A store that does not
    /// answer is asked again at the next poll (logged once).
    pub async fn changed(&self, last_run_ms: Option<i64>) {
        let mut failing = false;
        let mut ticks = tokio::time::interval(POLL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match self.rows_to_read().await {
                Ok(true) => break,
                Ok(false) => failing = false,
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error,
                            "cannot tell whether the tables read grew; asking again");
                    }
                    failing = true;
                }
            }
        }
        if let Some(last) = last_run_ms {
            let wait = last
                .saturating_add(self.min_interval_ms)
                .saturating_sub(sluice_engine::now_ms());
            if wait > 0 {
                tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0))).await;
            }
        }
    }

    async fn rows_to_read(&self) -> Result<bool, sluice_store::StoreError> {
        for (handle, table) in &self.reads {
            let at = self.store.read_position(handle, table).await?;
            if self.store.feed_lag(table, &at).await?.rows_behind > 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
