//! A pipeline's `schedule:` as validated: when its runs fire and how they are run
//! ([`crate::timetable`] computes the fires).

use std::time::Duration;

/// `schedule:` (SPEC §7): when a triggered pipeline runs, with Airflow's timetable semantics
/// ([`crate::timetable`] computes the fires).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// When the runs fire.
    pub when: ScheduleWhen,
    /// `timezone` — an IANA name, default `UTC`; cron fields are read on its wall clock.
    pub timezone: String,
    /// `semantics` — default [`ScheduleSemantics::Trigger`].
    pub semantics: ScheduleSemantics,
    /// `catchup` — default false: fires missed while no worker ran are skipped (see
    /// [`crate::timetable::Timetable::next_run`]); true: each is run, in order.
    pub catchup: bool,
    /// `interval` — `data_interval` only: each run covers `[fire − interval, fire)` instead of
    /// `[previous fire, fire)` (a sliding window, e.g. the last 7 days every day).
    pub interval: Option<Duration>,
    /// `on_update` — also run when a table of another pipeline that a flow reads received
    /// committed rows since the last run.
    pub on_update: bool,
    /// Which tables' rows fire such a run (`on_update: true`: any table read; or a condition
    /// over some of them).
    pub update_condition: UpdateCondition,
    /// `min_interval` — runs fired by `on_update` start at most this often (default 1 minute).
    pub min_interval: Duration,
    /// `start_date` (ms since the epoch) — where the schedule begins: no fire before it, and
    /// with `catchup: true` every fire from it on runs once (see [`crate::timetable`]).
    pub start_ms: Option<i64>,
    /// `end_date` (ms since the epoch) — no fire after it (`data_interval`: no interval that
    /// starts after it).
    pub end_ms: Option<i64>,
    /// `retries` — default 0: how many times a failed run runs again (same run, same
    /// interval) before it is recorded failed.
    pub retries: u32,
    /// `retry_delay` — default 5 minutes: the wait before each retry.
    pub retry_delay: Duration,
    /// `depends_on_past` — default false: a fire's run starts only once the run of the fire
    /// before it completed (Airflow's).
    pub depends_on_past: bool,
}

/// Which tables of other pipelines fire an `on_update` run (Airflow's dataset conditions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum UpdateCondition {
    /// `on_update: true`: any table of another pipeline a flow reads got rows it has not read.
    #[default]
    AnyRead,
    /// `on_update: { any_of: [P.T, ...] }`: one of these tables did.
    AnyOf(Vec<String>),
    /// `on_update: { all_of: [P.T, ...] }`: each of these tables did (rows that came to one
    /// wait for the others).
    AllOf(Vec<String>),
}

/// Exactly one of `cron` or `every`.
#[derive(Debug, Clone, PartialEq)]
pub enum ScheduleWhen {
    /// `cron: "*/15 * * * *"`: 5 fields, or 6 with seconds first, or a preset (`@hourly`,
    /// `@daily`, `@weekly`, `@monthly`, `@yearly`); parsed with the `croner` crate.
    Cron(String),
    /// `every: 15m`: fires at every multiple of it since `start_date`, or since the Unix epoch
    /// without one.
    Every(Duration),
}

/// Airflow-style timetable semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScheduleSemantics {
    /// Run at each fire time.
    #[default]
    Trigger,
    /// Each run gets `[previous fire, this fire)`.
    DataInterval,
}
