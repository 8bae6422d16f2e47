//! What a worker runs next (`timetable.rs` has the guarantees): a continuous pipeline's one
//! update; a triggered pipeline without a schedule's one manual run; for a schedule, while this
//! worker holds the `scheduler` lease, what is due by the schedule's state (`due.rs`: a run
//! left unfinished, a fire now), else a wait, serving control requests, for the next fire, a
//! table update (`on_update`), the lease, or a request that asks for a run now.
//!
//! Deciding comes first, acting after: the schedule's state is read once per decision (one
//! retry while the store is unavailable), the wait is `between_runs.rs`'s, and the run decided
//! is made by `record.rs`.

use crate::runtime::flow::run_context::{KeptSources, RunScope};
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::kit::store_retry::{self, Retry};
use crate::runtime::pool::timing::ALIVE_WITHIN;
use crate::runtime::run_error::RunError;
use crate::runtime::runs::between_runs::{self, Awaited, Between, Woke};
use crate::runtime::runs::due::{self, Due, ScheduleState, UNFINISHED_LOOKBACK};
use crate::runtime::runs::lease::SchedulerLease;
use crate::runtime::runs::record::{Run, RunAsk};
use crate::runtime::runs::schedule_agreement::{self, AgreementWatch};
use crate::runtime::updates::update_loop::{Updates, Waited};
use sluice_pipeline::Schedule;
use sluice_pipeline::timetable::{Fire, FireKind, NextRun, Timetable};
use sluice_store::RunTrigger;
use std::collections::VecDeque;

/// Fires counted as delayed behind one run, at most (an every-second schedule behind a long
/// run would otherwise be counted one fire at a time).
const DELAYED_COUNT_CAP: u64 = 1_000;

/// What a worker runs.
pub enum Plan {
    /// A continuous pipeline: one update, until a signal.
    Continuous,
    /// A triggered pipeline without a schedule: one run, recorded `manual`.
    Once,
    /// A triggered pipeline with a schedule: a run at each fire, until a signal.
    Scheduled {
        /// Its timetable.
        timetable: Timetable,
        /// The `scheduler` lease: only its holder runs fires.
        lease: SchedulerLease,
        /// The Pub/Sub flows' sources, kept open across runs while fires come soon after
        /// each other.
        kept: KeptSources,
    },
    /// `sluice backfill`: these fires, one after the other, each recorded with `trigger`
    /// (`backfill`, or `rerun` for `--rerun`); then the end.
    Backfill {
        /// The fires left, oldest first.
        fires: VecDeque<Fire>,
        /// How each is recorded.
        trigger: RunTrigger,
    },
}

/// What comes next.
pub enum Next {
    /// A run to make.
    Run(Run),
    /// Nothing more: the last run's outcomes stand when a signal came before anything else
    /// (during that run, or it was the only one), not when it came while this worker waited
    /// for the next run.
    Stop {
        /// Whether the last run's outcomes are the worker's.
        last_outcomes_stand: bool,
    },
}

/// Decides run after run for one worker.
pub struct NextRuns {
    plan: Plan,
    /// A run was decided already (the one run of a pipeline without a schedule).
    decided: bool,
    /// When the last run started (this worker's clock): `on_update` runs wait `min_interval`.
    last_started: Option<i64>,
    /// The start of the last fire's or table update's run: the fires that came while it went
    /// on are counted delayed once it ended.
    delayed_behind: Option<i64>,
    /// This worker's schedule's fingerprint, compared with the other replicas' before a fire.
    schedule: String,
    /// Whether they disagreed at the last look.
    agreement: AgreementWatch,
}

impl NextRuns {
    /// The runs by `plan`, for a worker whose schedule is `schedule` (if any).
    pub fn new(plan: Plan, schedule: Option<&Schedule>) -> Self {
        Self {
            plan,
            decided: false,
            last_started: None,
            delayed_behind: None,
            schedule: schedule
                .map(schedule_agreement::fingerprint)
                .unwrap_or_default(),
            agreement: AgreementWatch::default(),
        }
    }

    /// A backfill's intervals not run yet (`None` for other plans).
    pub fn backfill_left(&self) -> Option<usize> {
        match &self.plan {
            Plan::Backfill { fires, .. } => Some(fires.len()),
            _ => None,
        }
    }

    /// Gives up what the plan holds: the kept sources are closed (what they hold is nacked),
    /// and the lease handed back.
    pub async fn stop(self) {
        if let Plan::Scheduled { lease, kept, .. } = self.plan {
            for source in kept.values() {
                source.close().await;
            }
            lease.stop().await;
        }
    }

    /// The next run to make, when the last one (if any) has ended.
    pub async fn next(
        &mut self,
        updates: &mut Updates<'_>,
        shutdown: &Shutdown,
    ) -> Result<Next, RunError> {
        if let Plan::Backfill { fires, trigger } = &mut self.plan {
            // A signal leaves the intervals not begun in the plan (`backfill_left`).
            let next = (!shutdown.drain.is_cancelled())
                .then(|| fires.pop_front())
                .flatten();
            let Some(fire) = next else {
                return Ok(Next::Stop {
                    last_outcomes_stand: true,
                });
            };
            return Ok(Next::Run(Run::Recorded {
                ask: RunAsk {
                    fire_ms: fire.at_ms,
                    interval: fire.interval,
                    trigger: *trigger,
                },
                scope: RunScope {
                    interval: fire.interval,
                    ..RunScope::default()
                },
                lease: None,
                give_back_kept: false,
            }));
        }
        let Plan::Scheduled {
            timetable,
            lease,
            kept,
        } = &self.plan
        else {
            let recorded = matches!(self.plan, Plan::Once);
            // No scheduler will end a run a worker gone left unfinished: this run does first.
            if recorded && !self.decided {
                let state = read_state(updates, shutdown).await?;
                if let Some(unfinished) = due::abandoned(state, updates.worker()) {
                    return Ok(Next::Run(Run::Abandoned(unfinished)));
                }
            }
            return Ok(self.single_run(recorded));
        };
        if let Some(started) = self.delayed_behind.take() {
            let delayed = timetable.fires_between(started, now_ms(), DELAYED_COUNT_CAP);
            if delayed > 0 {
                metrics::counter!("sluice_schedule_fires_delayed_total",
                    "pipeline" => updates.pipeline().name.clone())
                .increment(delayed);
                tracing::info!(
                    delayed,
                    "fires came while the run went on; they were delayed"
                );
            }
        }
        let scope = |interval| RunScope {
            interval,
            kept: Some(kept.clone()),
            // Each update of the run takes its own fence (`Updates::run`).
            acks: None,
        };
        let mut first = true;
        'decide: loop {
            if shutdown.drain.is_cancelled() {
                return Ok(Next::Stop {
                    last_outcomes_stand: first,
                });
            }
            first = false;
            // The fire to run now; `None`: a run for a table update.
            let fire = 'fire: {
                // What to wait for: the lease (another replica runs the schedule), or the next
                // fire.
                let awaited = if !lease.held() {
                    // Another replica compares (and shows) the schedules.
                    self.agreement.not_holding(&updates.pipeline().name);
                    Awaited::Lease
                } else {
                    let state = read_state(updates, shutdown).await?;
                    if replicas_disagree(&self.schedule, &mut self.agreement, updates, &state) {
                        Awaited::Agreement(schedule_agreement::look_again_at(now_ms()))
                    } else {
                        match due::due(state, timetable, updates.worker(), now_ms()) {
                            Due::Unfinished { run, ask } => {
                                self.last_started = Some(now_ms());
                                tracing::info!(run = run.run_id, fire_ms = run.fire_ms,
                                from = %run.worker, "finishing a run its runner did not end");
                                return Ok(Next::Run(Run::Recorded {
                                    ask,
                                    scope: scope(ask.interval),
                                    lease: Some(lease.watch()),
                                    give_back_kept: false,
                                }));
                            }
                            Due::Abandoned(unfinished) => {
                                self.last_started = Some(now_ms());
                                return Ok(Next::Run(Run::Abandoned(unfinished)));
                            }
                            Due::Next {
                                run,
                                newest_start,
                                newest_own_start,
                            } => {
                                // A restart goes on from the newest run of the pipeline; after
                                // that, from this worker's own run as recorded when that is later
                                // than its decision to run it (recording takes a moment), so that
                                // `min_interval` holds between the starts `sluice runs` shows (to
                                // within the store's clock skew on PostgreSQL).
                                self.last_started = match self.last_started {
                                    None => newest_start,
                                    Some(decided) => Some(decided).max(newest_own_start),
                                };
                                match run {
                                    NextRun::Now(fire) => break 'fire Some(fire),
                                    NextRun::At(at_ms) => Awaited::Fire(Some(at_ms)),
                                    NextRun::Never => Awaited::Fire(None),
                                }
                            }
                        }
                    }
                };
                let between = Between {
                    awaited,
                    lease,
                    kept,
                    last_started: self.last_started,
                };
                let woke = match between_runs::wait(updates, shutdown, between).await? {
                    Waited::Came(woke) => woke,
                    // A run asked for through the control API (what it clears is cleared):
                    // the kept streams' messages predate the clearing, so they are given back
                    // first. It covers the interval that ended at the last fire (Airflow's
                    // manual runs), with `data_interval`.
                    Waited::Requested => {
                        let now = now_ms();
                        self.last_started = Some(now);
                        let interval = timetable.manual_interval(now);
                        return Ok(Next::Run(Run::Recorded {
                            ask: RunAsk {
                                interval,
                                ..asked_now(RunTrigger::Manual)
                            },
                            scope: scope(interval),
                            lease: None,
                            give_back_kept: true,
                        }));
                    }
                };
                if shutdown.drain.is_cancelled() || !lease.held() {
                    continue 'decide;
                }
                // A replica with another schedule may have joined during the wait.
                if matches!(woke, Woke::Fire | Woke::TableUpdate) {
                    let state = read_state(updates, shutdown).await?;
                    if replicas_disagree(&self.schedule, &mut self.agreement, updates, &state) {
                        continue 'decide;
                    }
                }
                match (woke, awaited) {
                    (Woke::Fire, Awaited::Fire(Some(at_ms))) => Some(Fire {
                        at_ms,
                        interval: timetable.interval_of(at_ms),
                        kind: FireKind::Schedule,
                    }),
                    (Woke::TableUpdate, _) => None,
                    _ => continue 'decide,
                }
            };
            let started = now_ms();
            let (ask, lease) = match fire {
                Some(fire) => {
                    let trigger = match fire.kind {
                        FireKind::Schedule => RunTrigger::Schedule,
                        FireKind::Catchup => RunTrigger::Catchup,
                    };
                    let ask = RunAsk {
                        fire_ms: fire.at_ms,
                        interval: fire.interval,
                        trigger,
                    };
                    (ask, Some(lease.watch()))
                }
                None => {
                    let ask = RunAsk {
                        fire_ms: started,
                        interval: None,
                        trigger: RunTrigger::Update,
                    };
                    (ask, None)
                }
            };
            // No fire is waited for while it runs; the fires that come meanwhile are delayed.
            metrics::gauge!("sluice_schedule_next_fire_timestamp_seconds",
                "pipeline" => updates.pipeline().name.clone())
            .set(0.0);
            self.last_started = Some(started);
            self.delayed_behind = Some(started);
            return Ok(Next::Run(Run::Recorded {
                ask,
                scope: scope(ask.interval),
                lease,
                give_back_kept: false,
            }));
        }
    }

    /// The one run of a pipeline without a schedule (`recorded`: a triggered pipeline's, a
    /// `manual` run; else a continuous pipeline's update), then the end.
    fn single_run(&mut self, recorded: bool) -> Next {
        if std::mem::replace(&mut self.decided, true) {
            return Next::Stop {
                last_outcomes_stand: true,
            };
        }
        if !recorded {
            return Next::Run(Run::Update);
        }
        Next::Run(Run::Recorded {
            ask: asked_now(RunTrigger::Manual),
            scope: RunScope::default(),
            lease: None,
            give_back_kept: false,
        })
    }
}

/// Whether a live replica runs another schedule than this worker's (`schedule`; logged and
/// shown by `watch`): then no fire runs.
fn replicas_disagree(
    schedule: &str,
    watch: &mut AgreementWatch,
    updates: &Updates<'_>,
    state: &ScheduleState,
) -> bool {
    let others = schedule_agreement::disagreement(&state.alive, schedule);
    watch.observe(&updates.pipeline().name, updates.worker(), &others);
    !others.is_empty()
}

/// The schedule's state, read at once (retried while the store is unavailable, for at most
/// `give_up_after` without a schedule).
async fn read_state(updates: &Updates<'_>, shutdown: &Shutdown) -> Result<ScheduleState, RunError> {
    let pipeline = &updates.pipeline().name;
    store_retry::until_stored_within(
        "read the schedule's state",
        Retry::WhileUnavailable,
        &shutdown.drain,
        store_retry::run_patience(updates.pipeline()),
        || async {
            let store = updates.store();
            Ok(ScheduleState {
                runs: store.runs(pipeline, UNFINISHED_LOOKBACK).await?,
                alive: store.workers(pipeline, ALIVE_WITHIN).await?,
                last_fire: store.last_fire(pipeline).await?,
            })
        },
    )
    .await
    .map_err(RunError::Store)
}

/// What a run asked for now is.
fn asked_now(trigger: RunTrigger) -> RunAsk {
    RunAsk {
        fire_ms: now_ms(),
        interval: None,
        trigger,
    }
}

fn now_ms() -> i64 {
    sluice_engine::now_ms()
}
