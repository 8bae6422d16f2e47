//! `schedule.on_update`: a scheduled pipeline that reads tables of other pipelines in its
//! store (`source: { table: PIPELINE.TARGET }`) also runs when one of them has committed rows
//! the reading flow has not read, like Airflow's dataset-or-time schedules; such runs start at
//! most once per `min_interval` (a debounce: rows that keep coming make a run every
//! `min_interval`, not one per commit). A condition narrows it, as Airflow's dataset
//! conditions do: `any_of` a list of those tables, or `all_of` them (each must have rows not
//! read; rows that came to one wait, unread, for the others, or for the next timed fire).
//!
//! The check is the reading flow's own feed lag (`FeedStore::feed_lag` past its committed
//! position), so what fires a run is exactly what the run will read; it is polled every
//! [`POLL`] while the scheduler waits for its next fire.

use crate::runtime::flow::build;
use sluice_pipeline::{Pipeline, Source, UpdateCondition};
use sluice_store::{FlowHandle, Store};
use std::sync::Arc;
use std::time::Duration;

/// How often the tables are looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// The tables of other pipelines a scheduled pipeline watches, with the flows reading them.
pub struct TableUpdates {
    store: Arc<dyn Store>,
    /// Each read: the table as the file names it (`P.T`), the reading flow, the full table.
    reads: Vec<(String, FlowHandle, String)>,
    /// Whether every watched table must have rows to read (`all_of`), or any.
    all: bool,
    min_interval_ms: i64,
}

impl TableUpdates {
    /// The watch of `pipeline`'s reads of other pipelines' tables (`handles` in flow order),
    /// when its schedule has `on_update: true`.
    pub fn new(pipeline: &Pipeline, handles: &[FlowHandle], store: Arc<dyn Store>) -> Option<Self> {
        let schedule = pipeline.schedule.as_ref().filter(|s| s.on_update)?;
        let watched = |name: &String| match &schedule.update_condition {
            UpdateCondition::AnyRead => true,
            UpdateCondition::AnyOf(tables) | UpdateCondition::AllOf(tables) => {
                tables.contains(name)
            }
        };
        let reads: Vec<(String, FlowHandle, String)> = pipeline
            .flows
            .iter()
            .zip(handles)
            .filter_map(|(flow, handle)| {
                let Source::PipelineTable {
                    pipeline: other,
                    target,
                } = &flow.source
                else {
                    return None;
                };
                let name = format!("{other}.{target}");
                if !watched(&name) {
                    return None;
                }
                Some((name, handle.clone(), build::read_table(pipeline, flow)?))
            })
            .collect();
        Some(Self {
            store,
            reads,
            all: matches!(schedule.update_condition, UpdateCondition::AllOf(_)),
            min_interval_ms: i64::try_from(schedule.min_interval.as_millis()).unwrap_or(i64::MAX),
        })
    }

    /// Returns once a watched table (with `all_of`, each) has rows its flow has not read and
    /// `min_interval` has passed since the last run started (`last_run_ms`, this worker's
    /// clock). A store that does not answer is asked again at the next poll (logged once).
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

    /// Whether the condition holds: a watched table has rows a flow reading it has not read
    /// (with `all_of`, every watched table).
    async fn rows_to_read(&self) -> Result<bool, sluice_store::StoreError> {
        let mut grown = std::collections::HashSet::new();
        for (name, handle, table) in &self.reads {
            if grown.contains(name) {
                continue;
            }
            let at = self.store.read_position(handle, table).await?;
            if self.store.feed_lag(table, &at).await?.rows_behind > 0 {
                if !self.all {
                    return Ok(true);
                }
                grown.insert(name.clone());
            }
        }
        let watched: std::collections::HashSet<&String> =
            self.reads.iter().map(|(name, _, _)| name).collect();
        Ok(self.all && !watched.is_empty() && grown.len() == watched.len())
    }
}
