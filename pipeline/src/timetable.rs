//! When a scheduled pipeline runs: the fires of its `schedule:` and the data interval of each
//! run, with the semantics of Airflow's timetables (SPEC §7). Pure and clock-injected: every
//! function takes the instant it asks about (ms since the Unix epoch), so nothing here sleeps
//! or reads a clock.
//!
//! # Fires
//!
//! * **`cron`** fires at every instant whose wall-clock time in `timezone` matches the pattern
//!   (5 fields, or 6 with seconds first, or a preset: `@hourly`, `@daily`, `@weekly`,
//!   `@monthly`, `@yearly`; parsed by the `croner` crate, Vixie cron's rules, day of month OR
//!   day of week). Around daylight-saving changes each *wall-clock* time fires at most once: a
//!   local time that does not exist (skipped by a jump forward) does not fire, and a local time
//!   that happens twice (a jump back) fires once, at its first instant. (`croner` carries a
//!   fixed time inside a gap to the first instant after it and walks the repeated hour twice;
//!   [`Timetable`] drops both.)
//! * **`every`** fires at every multiple of the period since `start_date`, as Airflow's delta
//!   timetables do, or since the Unix epoch without one: `every: 15m` then fires at :00, :15,
//!   :30 and :45 of every hour of UTC, whatever the time zone.
//!
//! # Start and end ([`Timetable::first_fire`])
//!
//! `start_date` is where the schedule begins, as Airflow's `start_date`: with `semantics:
//! trigger` the first fire is the first at or after it; with `data_interval` it is the first
//! whose data interval starts at or after it (`@daily` from 1 January: the interval [1 January,
//! 2 January), run at midnight on 2 January). No fire comes before the first. `end_date` is
//! where it ends: no fire after it (`data_interval`: no interval that starts after it, as
//! Airflow's `end_date` restricts the interval's start). After the last fire the timetable
//! says [`NextRun::Never`].
//!
//! # Data intervals
//!
//! With `semantics: trigger` (Airflow's `CronTriggerTimetable`) a run has no data interval.
//! With `semantics: data_interval` (`CronDataIntervalTimetable`, `DeltaDataIntervalTimetable`)
//! the run of the fire at `f` covers `[previous fire, f)`, or `[f − interval, f)` with
//! `interval:` (a sliding window, which Airflow needs a custom timetable for; a whole number
//! of days is counted in calendar days of the time zone).
//!
//! # Missed and delayed fires ([`Timetable::next_run`])
//!
//! A fire is *missed* when no worker served the schedule at its time (the pipeline was down),
//! and *delayed* when one did but was busy with a run: the scheduler says since when it has
//! served the schedule (`up_since`). With the last fire run at `last`:
//!
//! | schedule | what runs |
//! |---|---|
//! | `catchup: true` | every fire after `last`, missed or delayed, in order, each at once; then the next one on time |
//! | `trigger`, `catchup: false` | missed fires are skipped; of the delayed ones the latest runs at once (at most one is pending); then the next one on time |
//! | `data_interval`, `catchup: false` | the latest fire at or before now, at once (the latest complete interval), missed or delayed; the earlier ones are skipped |
//!
//! A pipeline that never ran catches up from its first fire with `catchup: true` and a
//! `start_date` (every interval since the start runs once, oldest first); otherwise it starts
//! as with `catchup: false`.
//!
//! These follow Airflow's own timetables, which its documentation illustrates with a `@daily`
//! schedule paused at 15:00 on 31 January and resumed at 15:00 on 2 February: the trigger
//! timetable skips the fires of 1 and 2 February and next runs at 00:00 on 3 February; the
//! data-interval timetable skips the fire of 1 February (interval 31 January) and runs the one
//! of 2 February (interval 1 February) at once. Fires are named here by the instant they fire,
//! midnight for `@daily` (the reference article writes "12:00" for it).

use crate::model::{Schedule, ScheduleSemantics, ScheduleWhen};
pub use crate::schedule_fields::{instant, parse_cron, time_zone};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan, Zoned};

/// How many pattern matches a search looks at before it gives up (each daylight-saving change
/// drops a few; a pattern that matches only non-existent times would otherwise loop).
const SEARCH_LIMIT: usize = 10_000;

/// The ms in a day, for intervals given in whole days.
const DAY_MS: i64 = 86_400_000;

/// A pipeline's schedule, ready to compute fires.
#[derive(Debug, Clone)]
pub struct Timetable {
    when: When,
    zone: TimeZone,
    semantics: ScheduleSemantics,
    catchup: bool,
    interval_ms: Option<i64>,
    /// `every`'s fires are multiples of its period from here (`start_date`, or the epoch).
    anchor_ms: i64,
    /// The first fire (from `start_date`), if the schedule has a start.
    first_fire_ms: Option<i64>,
    end_ms: Option<i64>,
}

#[derive(Debug, Clone)]
enum When {
    Cron(Box<Cron>),
    Every(i64),
}

/// One run a timetable asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fire {
    /// The instant it fires (or fired), ms since the epoch.
    pub at_ms: i64,
    /// Its data interval (`semantics: data_interval`), else `None`.
    pub interval: Option<DataInterval>,
    /// Why it runs.
    pub kind: FireKind,
}

/// `[start, end)`, ms since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataInterval {
    /// Inclusive start.
    pub start_ms: i64,
    /// Exclusive end.
    pub end_ms: i64,
}

impl DataInterval {
    /// Whether `ms` lies in `[start, end)`.
    pub fn contains(&self, ms: i64) -> bool {
        self.start_ms <= ms && ms < self.end_ms
    }
}

/// Why a fire runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireKind {
    /// At its time, or the latest fire run late (after downtime with `data_interval`, or
    /// queued behind a run).
    Schedule,
    /// A missed fire run because of `catchup: true`, with later fires also due.
    Catchup,
}

/// What a scheduler does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextRun {
    /// Run this fire now.
    Now(Fire),
    /// Wait until this instant (ms), then ask again.
    At(i64),
    /// The schedule never fires again.
    Never,
}

impl Timetable {
    /// The timetable of a validated schedule.
    ///
    /// # Errors
    /// The pattern or the zone is invalid (validation reports both, located, first).
    pub fn new(schedule: &Schedule) -> Result<Self, String> {
        let when = match &schedule.when {
            ScheduleWhen::Cron(pattern) => When::Cron(Box::new(parse_cron(pattern)?)),
            ScheduleWhen::Every(period) => {
                let ms = i64::try_from(period.as_millis()).unwrap_or(i64::MAX);
                if ms <= 0 {
                    return Err("`every` must be greater than zero".to_owned());
                }
                When::Every(ms)
            }
        };
        let mut timetable = Self {
            when,
            zone: time_zone(&schedule.timezone)?,
            semantics: schedule.semantics,
            catchup: schedule.catchup,
            interval_ms: schedule
                .interval
                .map(|i| i64::try_from(i.as_millis()).unwrap_or(i64::MAX)),
            anchor_ms: schedule.start_ms.unwrap_or(0),
            first_fire_ms: None,
            end_ms: schedule.end_ms,
        };
        if let Some(start) = schedule.start_ms {
            timetable.first_fire_ms = Some(
                timetable
                    .first_fire_from(start)
                    .ok_or("the schedule never fires after its `start_date`")?,
            );
        }
        Ok(timetable)
    }

    /// The first fire of a schedule with a `start_date` (see the module docs).
    pub fn first_fire(&self) -> Option<i64> {
        self.first_fire_ms
    }

    /// The first fire at or after `start`, whose data interval (if it has one) starts at or
    /// after `start` too.
    fn first_fire_from(&self, start: i64) -> Option<i64> {
        // A sliding interval of length L starts at or after `start` only for fires at or after
        // `start + L`: searched from there, not fire by fire (L may hold thousands of fires).
        let earliest = match (self.semantics, self.interval_ms) {
            (ScheduleSemantics::DataInterval, Some(length)) if length % DAY_MS == 0 => self
                .zoned(start)?
                .checked_add((length / DAY_MS).days())
                .ok()?
                .timestamp()
                .as_millisecond(),
            (ScheduleSemantics::DataInterval, Some(length)) => start.checked_add(length)?,
            _ => start,
        };
        let mut fire = self.next_fire_after(earliest.checked_sub(1)?)?;
        for _ in 0..SEARCH_LIMIT {
            if self.interval_of(fire).is_none_or(|i| i.start_ms >= start) {
                return Some(fire);
            }
            fire = self.next_fire_after(fire)?;
        }
        None
    }

    /// Whether the fire at `fire_ms` comes no later than `end_date` (its data interval's
    /// start, with `data_interval`).
    fn before_end(&self, fire_ms: i64) -> bool {
        let start = self.interval_of(fire_ms).map_or(fire_ms, |i| i.start_ms);
        self.end_ms.is_none_or(|end| start <= end)
    }

    /// `fire_ms`, or the first fire if that comes later.
    fn not_before_start(&self, fire_ms: i64) -> i64 {
        self.first_fire_ms
            .map_or(fire_ms, |first| fire_ms.max(first))
    }

    /// The first fire strictly after `after_ms`.
    pub fn next_fire_after(&self, after_ms: i64) -> Option<i64> {
        match &self.when {
            When::Every(period) => after_ms
                .checked_sub(self.anchor_ms)?
                .div_euclid(*period)
                .checked_add(1)?
                .checked_mul(*period)?
                .checked_add(self.anchor_ms),
            When::Cron(cron) => {
                // Whole seconds: a fire at the second `after_ms` falls in is not after it.
                let mut cursor = self.zoned(after_ms.div_euclid(1000).checked_mul(1000)?)?;
                for _ in 0..SEARCH_LIMIT {
                    let candidate = cron.find_next_occurrence(&cursor, false).ok()?;
                    if self.fires_at(cron, &candidate) {
                        return Some(candidate.timestamp().as_millisecond());
                    }
                    cursor = candidate;
                }
                None
            }
        }
    }

    /// The latest fire at or before `at_ms`.
    pub fn latest_fire_at_or_before(&self, at_ms: i64) -> Option<i64> {
        match &self.when {
            When::Every(period) => at_ms
                .checked_sub(self.anchor_ms)?
                .div_euclid(*period)
                .checked_mul(*period)?
                .checked_add(self.anchor_ms),
            When::Cron(cron) => {
                let mut cursor = self.zoned(at_ms.div_euclid(1000).checked_mul(1000)?)?;
                let mut inclusive = true;
                for _ in 0..SEARCH_LIMIT {
                    let candidate = cron.find_previous_occurrence(&cursor, inclusive).ok()?;
                    if self.fires_at(cron, &candidate) {
                        return Some(candidate.timestamp().as_millisecond());
                    }
                    cursor = candidate;
                    inclusive = false;
                }
                None
            }
        }
    }

    /// The data interval of the run of the fire at `fire_ms` (`None` with `semantics:
    /// trigger`).
    pub fn interval_of(&self, fire_ms: i64) -> Option<DataInterval> {
        if self.semantics != ScheduleSemantics::DataInterval {
            return None;
        }
        let start_ms = match self.interval_ms {
            Some(length) if length % DAY_MS == 0 => {
                // Calendar days of the zone: "the last 7 days" ends and starts at the same
                // wall-clock time across a daylight-saving change.
                let days = length / DAY_MS;
                let end = self.zoned(fire_ms)?;
                end.checked_sub(days.days())
                    .ok()?
                    .timestamp()
                    .as_millisecond()
            }
            Some(length) => fire_ms.checked_sub(length)?,
            None => self.latest_fire_at_or_before(fire_ms.checked_sub(1)?)?,
        };
        Some(DataInterval {
            start_ms,
            end_ms: fire_ms,
        })
    }

    /// What to do at `now_ms`, when the last fire run was `last_fire_ms` (`None`: never ran)
    /// and a worker has served the schedule since `up_since_ms` (fires before it were missed,
    /// fires since delayed; see the module docs for the rules).
    /// Nothing runs before the first fire or after `end_date`.
    pub fn next_run(&self, last_fire_ms: Option<i64>, now_ms: i64, up_since_ms: i64) -> NextRun {
        match self.next_run_from_start(last_fire_ms, now_ms, up_since_ms) {
            NextRun::Now(fire) if !self.before_end(fire.at_ms) => NextRun::Never,
            NextRun::At(at_ms) if !self.before_end(at_ms) => NextRun::Never,
            run => run,
        }
    }

    fn next_run_from_start(
        &self,
        last_fire_ms: Option<i64>,
        now_ms: i64,
        up_since_ms: i64,
    ) -> NextRun {
        let next = match (last_fire_ms, self.first_fire_ms) {
            (Some(last), _) if self.catchup => self.next_fire_after(last),
            (None, Some(first)) if self.catchup => Some(first),
            (last, _) => {
                let up_since_ms = if last.is_some() { up_since_ms } else { now_ms };
                return self.latest_or_next(now_ms, last, up_since_ms);
            }
        };
        let Some(next) = next.map(|next| self.not_before_start(next)) else {
            return NextRun::Never;
        };
        if next > now_ms {
            return NextRun::At(next);
        }
        let more_due = self.next_fire_after(next).is_some_and(|f| f <= now_ms);
        let kind = if more_due {
            FireKind::Catchup
        } else {
            FireKind::Schedule
        };
        NextRun::Now(self.fire(next, kind))
    }

    /// The data interval of a run asked for by hand at `now_ms` (with `data_interval`): the
    /// one that ended at the latest fire, as Airflow's `infer_manual_data_interval` gives it;
    /// `None` with `trigger` (a run at a time, no interval), or before the first fire.
    pub fn manual_interval(&self, now_ms: i64) -> Option<DataInterval> {
        let latest = self
            .latest_fire_at_or_before(now_ms)
            .filter(|latest| self.first_fire_ms.is_none_or(|first| *latest >= first))?;
        self.interval_of(latest)
    }

    /// The fires whose runs cover `[from_ms, to_ms)` (a backfill's range), oldest first, at
    /// most `cap`: with `data_interval` those whose interval starts in it, else those in it.
    pub fn fires_within(&self, from_ms: i64, to_ms: i64, cap: usize) -> Vec<Fire> {
        let mut fires = Vec::new();
        let Some(mut fire) = self.first_fire_from(from_ms) else {
            return fires;
        };
        while fires.len() < cap {
            let covers = self.interval_of(fire).map_or(fire, |i| i.start_ms);
            if covers >= to_ms {
                break;
            }
            fires.push(self.fire(fire, FireKind::Schedule));
            match self.next_fire_after(fire) {
                Some(next) => fire = next,
                None => break,
            }
        }
        fires
    }

    /// How many fires lie in `(after_ms, until_ms]`, counting at most `cap`.
    pub fn fires_between(&self, after_ms: i64, until_ms: i64, cap: u64) -> u64 {
        let mut count = 0;
        let mut at = after_ms;
        while count < cap {
            match self.next_fire_after(at) {
                Some(next) if next <= until_ms => {
                    count += 1;
                    at = next;
                }
                _ => break,
            }
        }
        count
    }

    /// `catchup: false`, or a first start: the latest fire not run yet runs at once if it is
    /// due (`data_interval`: whenever it came; `trigger`: if it was delayed, not missed), else
    /// the next fire is waited for.
    fn latest_or_next(&self, now_ms: i64, last: Option<i64>, up_since_ms: i64) -> NextRun {
        let due = self.latest_fire_at_or_before(now_ms).filter(|latest| {
            last.is_none_or(|last| *latest > last)
                && self.first_fire_ms.is_none_or(|first| *latest >= first)
                && (self.semantics == ScheduleSemantics::DataInterval || *latest >= up_since_ms)
        });
        match due {
            Some(latest) => NextRun::Now(self.fire(latest, FireKind::Schedule)),
            None => self.wait_for_next(now_ms),
        }
    }

    fn wait_for_next(&self, now_ms: i64) -> NextRun {
        self.next_fire_after(now_ms).map_or(NextRun::Never, |next| {
            NextRun::At(self.not_before_start(next))
        })
    }

    fn fire(&self, at_ms: i64, kind: FireKind) -> Fire {
        Fire {
            at_ms,
            interval: self.interval_of(at_ms),
            kind,
        }
    }

    /// Whether the pattern's match `candidate` fires: its wall-clock time matches (not a time
    /// carried past a gap) and it is the first instant of that wall-clock time.
    fn fires_at(&self, cron: &Cron, candidate: &Zoned) -> bool {
        if !cron.is_time_matching(candidate).unwrap_or(false) {
            return false;
        }
        self.zone
            .to_ambiguous_zoned(candidate.datetime())
            .earlier()
            .is_ok_and(|first| first.timestamp() == candidate.timestamp())
    }

    fn zoned(&self, ms: i64) -> Option<Zoned> {
        Some(
            Timestamp::from_millisecond(ms)
                .ok()?
                .to_zoned(self.zone.clone()),
        )
    }
}
