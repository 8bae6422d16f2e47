//! Between the runs of a schedule: the wait for what comes next (the fire's time, a table
//! update (`on_update`), or the `scheduler` lease), during which the worker is ready, serves
//! control requests (one that asks for a run ends the wait: [`Waited::Requested`]) and shows
//! the fire it waits for (`sluice_schedule_next_fire_timestamp_seconds`, 0 for none). The
//! kept streams are given back first unless the fire comes within [`KEEP_OPEN_WITHIN`].

use crate::runtime::flow::run_context::KeptSources;
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::run_error::RunError;
use crate::runtime::runs::lease::SchedulerLease;
use crate::runtime::runs::table_updates::TableUpdates;
use crate::runtime::updates::update_loop::{Updates, Waited};
use std::time::Duration;

/// A Pub/Sub flow's streams stay open between runs when the next fire comes within this long:
/// a run that opens new streams right after the last closed can find the subscription idle
/// while Pub/Sub still holds back what was handed to the closed ones (see
/// `sluice_engine::KeptOpen`); for fires further apart they close, and what they hold goes
/// back to Pub/Sub.
pub const KEEP_OPEN_WITHIN: Duration = Duration::from_secs(60);
/// What is waited for.
#[derive(Debug, Clone, Copy)]
pub enum Awaited {
    /// The lease: another replica runs the schedule.
    Lease,
    /// The fire at this instant (ms), or none (the schedule never fires again), or a table
    /// update, or the loss of the lease.
    Fire(Option<i64>),
    /// The replicas run different schedules: look again at this instant (ms), or on the loss
    /// of the lease (`schedule_agreement.rs`).
    Agreement(i64),
}

/// What ended the wait.
pub enum Woke {
    /// The fire's time came.
    Fire,
    /// A table of another pipeline that a flow reads grew (`on_update`).
    TableUpdate,
    /// The lease was taken or lost, or a signal came.
    Neither,
}

/// A wait between runs.
pub struct Between<'a> {
    /// What is waited for.
    pub awaited: Awaited,
    /// The scheduler lease.
    pub lease: &'a SchedulerLease,
    /// The sources kept open across runs.
    pub kept: &'a KeptSources,
    /// When the last run started (this worker's clock): a table update waits `min_interval`
    /// after it.
    pub last_started: Option<i64>,
}

/// Waits, serving control requests, until what `between` awaits comes, or a signal
/// ([`Woke::Neither`]), or a request asks for a run.
pub async fn wait(
    updates: &mut Updates<'_>,
    shutdown: &Shutdown,
    between: Between<'_>,
) -> Result<Waited<Woke>, RunError> {
    let at_ms = match between.awaited {
        Awaited::Fire(at_ms) => at_ms,
        Awaited::Lease | Awaited::Agreement(_) => None,
    };
    // Kept open only for a fire that comes soon: for another replica's, or one far off, what
    // they hold would be held back all that time.
    let soon = at_ms.is_some_and(|at_ms| {
        at_ms.saturating_sub(sluice_engine::now_ms())
            <= i64::try_from(KEEP_OPEN_WITHIN.as_millis()).unwrap_or(i64::MAX)
    });
    if !soon {
        for source in between.kept.values() {
            source.close().await;
        }
    }
    metrics::gauge!("sluice_schedule_next_fire_timestamp_seconds",
        "pipeline" => updates.pipeline().name.clone())
    .set(at_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
    let table_updates = match between.awaited {
        Awaited::Fire(_) => TableUpdates::new(
            updates.pipeline(),
            updates.handles(),
            updates.store().clone(),
        ),
        Awaited::Lease | Awaited::Agreement(_) => None,
    };
    let (awaited, last_started) = (between.awaited, between.last_started);
    let mut holding = between.lease.watch();
    let drain = shutdown.drain.clone();
    let until = async move {
        let woke = async {
            match awaited {
                Awaited::Lease => {
                    let _ = holding.wait_for(|held| *held).await;
                    return Woke::Neither;
                }
                Awaited::Agreement(again_ms) => {
                    tokio::select! {
                        () = sleep_until_ms(again_ms) => {}
                        _ = holding.wait_for(|held| !*held) => {}
                    }
                    return Woke::Neither;
                }
                Awaited::Fire(_) => {}
            }
            let fire = async {
                match at_ms {
                    Some(at_ms) => sleep_until_ms(at_ms).await,
                    None => std::future::pending().await,
                }
            };
            let grown = async {
                match &table_updates {
                    Some(watch) => watch.changed(last_started).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = fire => Woke::Fire,
                () = grown => Woke::TableUpdate,
                // The lease lost while waiting: the next holder runs the fire.
                _ = holding.wait_for(|held| !*held) => Woke::Neither,
            }
        };
        // A signal ends the wait too.
        tokio::select! {
            woke = woke => woke,
            () = drain.cancelled() => Woke::Neither,
        }
    };
    updates.ready_between_runs(shutdown);
    updates.serve_requests_until(shutdown, until).await
}

/// Sleeps until the wall-clock instant `at_ms` (re-reading the clock, so a clock step or a
/// suspended machine does not make it oversleep by much).
async fn sleep_until_ms(at_ms: i64) {
    loop {
        let left = at_ms.saturating_sub(sluice_engine::now_ms());
        if left <= 0 {
            return;
        }
        let step = Duration::from_millis(u64::try_from(left).unwrap_or(0).min(1_000));
        tokio::time::sleep(step).await;
    }
}
