//! The timetable on an injected clock (no sleeping): the reference article's paused-and-resumed
//! `@daily` schedule under both semantics and both catchup settings, daylight-saving changes in
//! Europe/Berlin and America/New_York, `every` aligned to the epoch, and a 7-day sliding
//! interval.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_pipeline::timetable::{DataInterval, Fire, FireKind, NextRun, Timetable};
use sluice_pipeline::{Schedule, ScheduleSemantics, ScheduleWhen};
use std::time::Duration;

/// Ms since the epoch of an RFC 3339 instant.
fn at(instant: &str) -> i64 {
    instant.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

/// The instant `ms` as RFC 3339 in UTC (readable assertion failures).
fn utc(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms).unwrap().to_string()
}

fn schedule(
    when: ScheduleWhen,
    zone: &str,
    semantics: ScheduleSemantics,
    catchup: bool,
) -> Schedule {
    Schedule {
        when,
        timezone: zone.to_owned(),
        semantics,
        catchup,
        interval: None,
        on_update: false,
        update_condition: Default::default(),
        depends_on_past: false,
        min_interval: Duration::from_secs(60),
        start_ms: None,
        end_ms: None,
        retries: 0,
        retry_delay: Duration::from_secs(300),
    }
}

/// A timetable from `start` (and to `end`), both RFC 3339.
fn bounded(
    when: ScheduleWhen,
    semantics: ScheduleSemantics,
    catchup: bool,
    start: &str,
    end: Option<&str>,
) -> Timetable {
    Timetable::new(&Schedule {
        start_ms: Some(at(start)),
        end_ms: end.map(at),
        ..schedule(when, "UTC", semantics, catchup)
    })
    .unwrap()
}

/// Every run a scheduler asks for, fired as soon as it is due, from a first start at `now`
/// until `until` (each run taking no time): what a catch-up then live schedule runs.
fn runs_until(
    timetable: &Timetable,
    now: &str,
    until: &str,
) -> Vec<(String, FireKind, Option<DataInterval>)> {
    let (mut now, until) = (at(now), at(until));
    let up_since = now;
    let mut last = None;
    let mut out = Vec::new();
    while now <= until {
        match timetable.next_run(last, now, up_since) {
            NextRun::Now(fire) => {
                out.push((utc(fire.at_ms), fire.kind, fire.interval));
                last = Some(fire.at_ms);
            }
            NextRun::At(at_ms) => now = at_ms,
            NextRun::Never => break,
        }
    }
    out
}

/// `start_date` with catchup, `data_interval`, `@daily`, as Airflow's `CronDataIntervalTimetable`
/// does it: a pipeline first started on 5 January with a start of 1 January runs the intervals
/// of 1, 2, 3 and 4 January at once, in order (the last as a scheduled run, none left behind),
/// then the interval of 5 January at midnight on 6 January; the first interval starts at the
/// start, not before it.
#[test]
fn a_start_date_with_catchup_runs_every_interval_from_it_once_in_order() {
    let timetable = bounded(
        ScheduleWhen::Cron("@daily".into()),
        ScheduleSemantics::DataInterval,
        true,
        "2026-01-01T00:00:00Z",
        None,
    );
    assert_eq!(timetable.first_fire(), Some(at("2026-01-02T00:00:00Z")));
    let runs = runs_until(&timetable, "2026-01-05T10:00:00Z", "2026-01-06T00:00:00Z");
    let day = |d: u32| format!("2026-01-{d:02}T00:00:00Z");
    let expected: Vec<_> = (1..=5)
        .map(|d| {
            let kind = if d < 4 {
                FireKind::Catchup
            } else {
                FireKind::Schedule
            };
            (day(d + 1), kind, interval(&day(d), &day(d + 1)))
        })
        .collect();
    assert_eq!(runs, expected);
}

/// A start that falls between fires: the first interval starts at the first fire after it
/// (Airflow aligns the start to the schedule); with `semantics: trigger` the first fire is the
/// first at or after it; `every` counts its period from the start, not from the epoch.
#[test]
fn a_start_between_fires_is_aligned_to_the_schedule_and_every_counts_from_it() {
    let hourly_intervals = bounded(
        ScheduleWhen::Cron("@hourly".into()),
        ScheduleSemantics::DataInterval,
        true,
        "2026-03-01T10:20:00Z",
        None,
    );
    assert_eq!(
        utc(hourly_intervals.first_fire().unwrap()),
        "2026-03-01T12:00:00Z"
    );
    let hourly_triggers = bounded(
        ScheduleWhen::Cron("@hourly".into()),
        ScheduleSemantics::Trigger,
        true,
        "2026-03-01T11:00:00Z",
        None,
    );
    assert_eq!(
        utc(hourly_triggers.first_fire().unwrap()),
        "2026-03-01T11:00:00Z"
    );
    let every = bounded(
        ScheduleWhen::Every(Duration::from_secs(7)),
        ScheduleSemantics::DataInterval,
        true,
        "2026-03-01T10:00:03Z",
        None,
    );
    assert_eq!(
        fires(&every, "2026-03-01T10:00:00Z", 3),
        [
            "2026-03-01T10:00:03Z",
            "2026-03-01T10:00:10Z",
            "2026-03-01T10:00:17Z"
        ]
    );
    assert_eq!(utc(every.first_fire().unwrap()), "2026-03-01T10:00:10Z");
    assert_eq!(
        every.interval_of(at("2026-03-01T10:00:10Z")),
        interval("2026-03-01T10:00:03Z", "2026-03-01T10:00:10Z")
    );
}

/// Without catchup, a start in the past changes nothing but that no fire comes before it: the
/// latest complete interval runs, as without a start; a start in the future waits for its
/// first fire.
#[test]
fn without_catchup_a_start_only_holds_fires_back_until_it() {
    let past = bounded(
        ScheduleWhen::Cron("@daily".into()),
        ScheduleSemantics::DataInterval,
        false,
        "2026-01-01T00:00:00Z",
        None,
    );
    let runs = runs_until(&past, "2026-01-05T10:00:00Z", "2026-01-05T23:00:00Z");
    assert_eq!(
        runs,
        [(
            "2026-01-05T00:00:00Z".to_owned(),
            FireKind::Schedule,
            interval("2026-01-04T00:00:00Z", "2026-01-05T00:00:00Z")
        )]
    );
    let future = bounded(
        ScheduleWhen::Cron("@daily".into()),
        ScheduleSemantics::DataInterval,
        false,
        "2026-02-01T00:00:00Z",
        None,
    );
    let now = at("2026-01-05T10:00:00Z");
    assert_eq!(
        future.next_run(None, now, now),
        NextRun::At(at("2026-02-02T00:00:00Z"))
    );
}

/// `end_date`: with `data_interval` the last interval is the one that starts at or before it
/// (Airflow restricts the interval's start); with `trigger` the last fire is at or before it;
/// after the last, the timetable says never.
#[test]
fn an_end_date_stops_the_schedule_after_its_last_interval() {
    let intervals = bounded(
        ScheduleWhen::Cron("@daily".into()),
        ScheduleSemantics::DataInterval,
        true,
        "2026-01-01T00:00:00Z",
        Some("2026-01-03T00:00:00Z"),
    );
    let runs = runs_until(&intervals, "2026-01-10T00:00:00Z", "2026-01-20T00:00:00Z");
    let ends: Vec<_> = runs.iter().map(|(fire, _, _)| fire.as_str()).collect();
    assert_eq!(
        ends,
        [
            "2026-01-02T00:00:00Z",
            "2026-01-03T00:00:00Z",
            "2026-01-04T00:00:00Z"
        ]
    );
    let now = at("2026-01-10T00:00:00Z");
    assert_eq!(
        intervals.next_run(Some(at("2026-01-04T00:00:00Z")), now, now),
        NextRun::Never
    );
    let triggers = bounded(
        ScheduleWhen::Cron("@daily".into()),
        ScheduleSemantics::Trigger,
        true,
        "2026-01-01T00:00:00Z",
        Some("2026-01-03T00:00:00Z"),
    );
    let runs = runs_until(&triggers, "2026-01-10T00:00:00Z", "2026-01-20T00:00:00Z");
    let fires: Vec<_> = runs.iter().map(|(fire, _, _)| fire.as_str()).collect();
    assert_eq!(
        fires,
        [
            "2026-01-01T00:00:00Z",
            "2026-01-02T00:00:00Z",
            "2026-01-03T00:00:00Z"
        ]
    );
    let waiting = at("2026-01-02T12:00:00Z");
    assert_eq!(
        triggers.next_run(Some(at("2026-01-02T00:00:00Z")), waiting, waiting),
        NextRun::At(at("2026-01-03T00:00:00Z"))
    );
}

/// A run asked for by hand covers the interval that ended at the latest fire (Airflow's
/// `infer_manual_data_interval` for its data-interval timetables); with `trigger` it has none,
/// nor before a schedule's first fire.
#[test]
fn a_manual_run_covers_the_interval_that_ended_at_the_latest_fire() {
    let now = at("2026-01-05T10:00:00Z");
    let intervals = daily(ScheduleSemantics::DataInterval, false);
    assert_eq!(
        intervals.manual_interval(now),
        interval("2026-01-04T00:00:00Z", "2026-01-05T00:00:00Z")
    );
    assert_eq!(
        daily(ScheduleSemantics::Trigger, false).manual_interval(now),
        None
    );
    let not_yet = bounded(
        ScheduleWhen::Cron("@daily".into()),
        ScheduleSemantics::DataInterval,
        false,
        "2026-02-01T00:00:00Z",
        None,
    );
    assert_eq!(not_yet.manual_interval(now), None);
}

/// A backfill's range: with `data_interval` the fires whose interval starts in it; with
/// `trigger` the fires in it.
#[test]
fn a_backfill_range_covers_the_intervals_that_start_in_it() {
    let intervals = daily(ScheduleSemantics::DataInterval, false);
    let fires = intervals.fires_within(at("2026-01-01T00:00:00Z"), at("2026-01-04T00:00:00Z"), 100);
    let covered: Vec<_> = fires.iter().map(|f| f.interval).collect();
    assert_eq!(
        covered,
        [
            interval("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"),
            interval("2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"),
            interval("2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"),
        ]
    );
    let triggers = daily(ScheduleSemantics::Trigger, false);
    let fires = triggers.fires_within(at("2026-01-01T12:00:00Z"), at("2026-01-04T00:00:00Z"), 100);
    let at_ms: Vec<_> = fires.iter().map(|f| utc(f.at_ms)).collect();
    assert_eq!(at_ms, ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]);
    assert_eq!(
        intervals
            .fires_within(at("2026-01-01T00:00:00Z"), at("2026-02-01T00:00:00Z"), 5)
            .len(),
        5
    );
}

/// A sliding interval far longer than the period (`every: 1m`, `interval: 7d`: 10 080 fires
/// per interval): the first fire is the first whose interval starts at the start, found at
/// once.
#[test]
fn a_start_with_a_long_sliding_interval_finds_its_first_fire() {
    let timetable = Timetable::new(&Schedule {
        interval: Some(Duration::from_secs(7 * 86_400)),
        start_ms: Some(at("2026-01-01T00:00:00Z")),
        catchup: true,
        ..schedule(
            ScheduleWhen::Every(Duration::from_secs(60)),
            "UTC",
            ScheduleSemantics::DataInterval,
            true,
        )
    })
    .unwrap();
    assert_eq!(utc(timetable.first_fire().unwrap()), "2026-01-08T00:00:00Z");
    assert_eq!(
        timetable.interval_of(timetable.first_fire().unwrap()),
        interval("2026-01-01T00:00:00Z", "2026-01-08T00:00:00Z")
    );
}

/// Dates as the file gives them: RFC 3339, or a wall-clock date and time in the schedule's
/// zone (a date alone is its midnight).
#[test]
fn dates_are_read_on_the_schedules_wall_clock() {
    let berlin = sluice_pipeline::timetable::time_zone("Europe/Berlin").unwrap();
    let instant = |text: &str| sluice_pipeline::timetable::instant(text, &berlin);
    assert_eq!(instant("2026-01-01").unwrap(), at("2025-12-31T23:00:00Z"));
    assert_eq!(
        instant("2026-07-01T06:30:00").unwrap(),
        at("2026-07-01T04:30:00Z")
    );
    assert_eq!(
        instant("2026-07-01T06:30:00Z").unwrap(),
        at("2026-07-01T06:30:00Z")
    );
    assert!(instant("yesterday").unwrap_err().contains("is not a date"));
}

fn daily(semantics: ScheduleSemantics, catchup: bool) -> Timetable {
    Timetable::new(&schedule(
        ScheduleWhen::Cron("@daily".into()),
        "UTC",
        semantics,
        catchup,
    ))
    .unwrap()
}

fn cron(pattern: &str, zone: &str) -> Timetable {
    Timetable::new(&schedule(
        ScheduleWhen::Cron(pattern.into()),
        zone,
        ScheduleSemantics::Trigger,
        false,
    ))
    .unwrap()
}

/// The fires after `from`, `n` of them, as UTC text.
fn fires(timetable: &Timetable, from: &str, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cursor = at(from);
    for _ in 0..n {
        cursor = timetable.next_fire_after(cursor).unwrap();
        out.push(utc(cursor));
    }
    out
}

fn interval(start: &str, end: &str) -> Option<DataInterval> {
    Some(DataInterval {
        start_ms: at(start),
        end_ms: at(end),
    })
}

/// The last fire before the pause at 15:00 on 31 January.
const LAST_BEFORE_PAUSE: &str = "2026-01-31T00:00:00Z";
const RESUMED: &str = "2026-02-02T15:00:00Z";

#[test]
fn trigger_without_catchup_skips_the_fires_missed_while_paused() {
    let t = daily(ScheduleSemantics::Trigger, false);
    assert_eq!(
        t.next_run(Some(at(LAST_BEFORE_PAUSE)), at(RESUMED), at(RESUMED)),
        NextRun::At(at("2026-02-03T00:00:00Z")),
        "the fires of 1 and 2 February are skipped; the next is 00:00 on 3 February"
    );
}

#[test]
fn data_interval_without_catchup_runs_the_latest_interval_at_once() {
    let t = daily(ScheduleSemantics::DataInterval, false);
    let resumed = at(RESUMED);
    let NextRun::Now(fire) = t.next_run(Some(at(LAST_BEFORE_PAUSE)), resumed, resumed) else {
        panic!("the 2 February run is due at once");
    };
    assert_eq!(
        fire,
        Fire {
            at_ms: at("2026-02-02T00:00:00Z"),
            interval: interval("2026-02-01T00:00:00Z", "2026-02-02T00:00:00Z"),
            kind: FireKind::Schedule,
        },
        "the fire of 1 February (interval 31 January) is skipped"
    );
    // After it, nothing more is due until 3 February.
    assert_eq!(
        t.next_run(Some(fire.at_ms), resumed + 60_000, resumed),
        NextRun::At(at("2026-02-03T00:00:00Z"))
    );
}

#[test]
fn catchup_runs_every_missed_fire_in_order() {
    for semantics in [ScheduleSemantics::Trigger, ScheduleSemantics::DataInterval] {
        let t = daily(semantics, true);
        let mut last = at(LAST_BEFORE_PAUSE);
        let mut now = at(RESUMED);
        let mut ran = Vec::new();
        loop {
            match t.next_run(Some(last), now, at(RESUMED)) {
                NextRun::Now(fire) => {
                    ran.push((utc(fire.at_ms), fire.kind, fire.interval));
                    last = fire.at_ms;
                    now += 60_000; // each run takes a minute
                }
                NextRun::At(next) => {
                    assert_eq!(utc(next), "2026-02-03T00:00:00Z");
                    break;
                }
                NextRun::Never => panic!("a daily schedule fires again"),
            }
        }
        let data = semantics == ScheduleSemantics::DataInterval;
        assert_eq!(
            ran,
            [
                (
                    "2026-02-01T00:00:00Z".to_owned(),
                    FireKind::Catchup,
                    data.then(|| interval("2026-01-31T00:00:00Z", "2026-02-01T00:00:00Z"))
                        .flatten()
                ),
                (
                    "2026-02-02T00:00:00Z".to_owned(),
                    FireKind::Schedule,
                    data.then(|| interval("2026-02-01T00:00:00Z", "2026-02-02T00:00:00Z"))
                        .flatten()
                ),
            ],
            "{semantics:?}"
        );
    }
}

/// Enabled for the first time at 15:00 on 31 January (Airflow's example of the two cron
/// timetables): the trigger timetable waits for midnight; the data-interval one runs the
/// latest complete interval (30 January) at once.
#[test]
fn a_first_start_waits_or_runs_the_latest_interval() {
    let enabled = at("2026-01-31T15:00:00Z");
    for catchup in [false, true] {
        assert_eq!(
            daily(ScheduleSemantics::Trigger, catchup).next_run(None, enabled, enabled),
            NextRun::At(at("2026-02-01T00:00:00Z"))
        );
        assert_eq!(
            daily(ScheduleSemantics::DataInterval, catchup).next_run(None, enabled, enabled),
            NextRun::Now(Fire {
                at_ms: at("2026-01-31T00:00:00Z"),
                interval: interval("2026-01-30T00:00:00Z", "2026-01-31T00:00:00Z"),
                kind: FireKind::Schedule,
            })
        );
    }
}

/// Fires during a long run are delayed, not missed: the latest runs at once after it (one
/// pending), even with `trigger` and no catchup; with catchup every one of them runs. The
/// same fires while no worker served the schedule (it started after them) are missed.
#[test]
fn fires_during_a_run_are_queued_fires_while_down_are_missed() {
    let t = cron("*/15 * * * *", "UTC");
    let started = at("2026-03-01T10:00:00Z");
    let ended = at("2026-03-01T10:40:00Z");
    assert_eq!(t.fires_between(started, ended, 100), 2);
    assert_eq!(
        t.next_run(Some(started), ended, started),
        NextRun::Now(Fire {
            at_ms: at("2026-03-01T10:30:00Z"),
            interval: None,
            kind: FireKind::Schedule,
        }),
        "served since the run started: the fires during it were delayed"
    );
    assert_eq!(
        t.next_run(Some(started), ended, ended),
        NextRun::At(at("2026-03-01T10:45:00Z")),
        "served only from now: the same fires were missed, and are skipped"
    );
    assert_eq!(
        t.next_run(Some(started), ended, at("2026-03-01T10:20:00Z")),
        NextRun::Now(Fire {
            at_ms: at("2026-03-01T10:30:00Z"),
            interval: None,
            kind: FireKind::Schedule,
        }),
        "a worker took over at 10:20: 10:15 was missed, 10:30 delayed"
    );
    let catchup = Timetable::new(&schedule(
        ScheduleWhen::Cron("*/15 * * * *".into()),
        "UTC",
        ScheduleSemantics::Trigger,
        true,
    ))
    .unwrap();
    assert_eq!(
        catchup.next_run(Some(started), ended, started),
        NextRun::Now(Fire {
            at_ms: at("2026-03-01T10:15:00Z"),
            interval: None,
            kind: FireKind::Catchup,
        })
    );
}

/// Europe/Berlin jumps from 02:00 CET to 03:00 CEST on 29 March 2026: 02:30 does not exist
/// that day and does not fire (not carried to 03:00); on 25 October 02:00-03:00 happens twice
/// and 02:30 fires once, at its first instant (CEST).
#[test]
fn berlin_skips_the_missing_hour_and_fires_the_repeated_one_once() {
    let t = cron("30 2 * * *", "Europe/Berlin");
    assert_eq!(
        fires(&t, "2026-03-27T12:00:00Z", 3),
        [
            "2026-03-28T01:30:00Z", // 02:30 CET
            "2026-03-30T00:30:00Z", // 02:30 CEST: the 29th has none
            "2026-03-31T00:30:00Z",
        ]
    );
    assert_eq!(
        fires(&t, "2026-10-24T12:00:00Z", 2),
        [
            "2026-10-25T00:30:00Z", // the first 02:30 (CEST); not again at 01:30 UTC (CET)
            "2026-10-26T01:30:00Z",
        ]
    );
    // Every 30 minutes through the repeated hour: each wall-clock time once.
    assert_eq!(
        fires(
            &cron("*/30 * * * *", "Europe/Berlin"),
            "2026-10-24T23:45:00Z",
            4
        ),
        [
            "2026-10-25T00:00:00Z", // 02:00 CEST
            "2026-10-25T00:30:00Z", // 02:30 CEST
            "2026-10-25T02:00:00Z", // 03:00 CET (02:00 and 02:30 CET skipped)
            "2026-10-25T02:30:00Z",
        ]
    );
    // Backwards too: at 02:50 of the second pass (01:50 UTC) the latest fire is 02:30 CEST.
    let half_hourly = cron("*/30 * * * *", "Europe/Berlin");
    assert_eq!(
        utc(half_hourly
            .latest_fire_at_or_before(at("2026-10-25T01:50:00Z"))
            .unwrap()),
        "2026-10-25T00:30:00Z",
        "the second pass of 02:30 (01:30 UTC) is not a fire"
    );
}

/// America/New_York: 2026-03-08 02:00 EST jumps to 03:00 EDT; 2026-11-01 02:00 EDT goes back
/// to 01:00 EST.
#[test]
fn new_york_hourly_across_both_changes() {
    let hourly = cron("0 * * * *", "America/New_York");
    assert_eq!(
        fires(&hourly, "2026-03-08T05:30:00Z", 3),
        [
            "2026-03-08T06:00:00Z", // 01:00 EST
            "2026-03-08T07:00:00Z", // 03:00 EDT (02:00 does not exist), once
            "2026-03-08T08:00:00Z", // 04:00 EDT
        ]
    );
    assert_eq!(
        fires(&hourly, "2026-11-01T04:30:00Z", 3),
        [
            "2026-11-01T05:00:00Z", // 01:00 EDT
            "2026-11-01T07:00:00Z", // 02:00 EST (01:00 EST, at 06:00 UTC, is a repeat)
            "2026-11-01T08:00:00Z",
        ]
    );
    assert_eq!(
        fires(
            &cron("30 2 * * *", "America/New_York"),
            "2026-03-07T00:00:00Z",
            2
        ),
        ["2026-03-07T07:30:00Z", "2026-03-09T06:30:00Z"]
    );
}

#[test]
fn every_is_aligned_to_the_epoch_whatever_the_zone() {
    for zone in ["UTC", "Asia/Kolkata"] {
        let t = Timetable::new(&schedule(
            ScheduleWhen::Every(Duration::from_secs(15 * 60)),
            zone,
            ScheduleSemantics::DataInterval,
            false,
        ))
        .unwrap();
        assert_eq!(
            fires(&t, "2026-05-01T10:07:13Z", 3),
            [
                "2026-05-01T10:15:00Z",
                "2026-05-01T10:30:00Z",
                "2026-05-01T10:45:00Z"
            ]
        );
        assert_eq!(
            t.interval_of(at("2026-05-01T10:30:00Z")),
            interval("2026-05-01T10:15:00Z", "2026-05-01T10:30:00Z")
        );
        assert_eq!(
            t.latest_fire_at_or_before(at("2026-05-01T10:30:00Z")),
            Some(at("2026-05-01T10:30:00Z")),
            "a fire at the instant asked about counts"
        );
    }
}

/// `interval: 7d` on a daily schedule: each run covers the 7 days before its fire, overlapping
/// the previous run's; in Europe/Berlin across the March change they are calendar days.
#[test]
fn a_seven_day_sliding_interval() {
    let mut s = schedule(
        ScheduleWhen::Cron("@daily".into()),
        "UTC",
        ScheduleSemantics::DataInterval,
        false,
    );
    s.interval = Some(Duration::from_secs(7 * 86_400));
    let t = Timetable::new(&s).unwrap();
    assert_eq!(
        t.interval_of(at("2026-02-02T00:00:00Z")),
        interval("2026-01-26T00:00:00Z", "2026-02-02T00:00:00Z")
    );
    assert_eq!(
        t.interval_of(at("2026-02-03T00:00:00Z")),
        interval("2026-01-27T00:00:00Z", "2026-02-03T00:00:00Z")
    );
    s.timezone = "Europe/Berlin".into();
    let berlin = Timetable::new(&s).unwrap();
    // Midnight of 1 April (CEST) back to midnight of 25 March (CET): 7 days, 167 hours.
    assert_eq!(
        berlin.interval_of(at("2026-03-31T22:00:00Z")),
        interval("2026-03-24T23:00:00Z", "2026-03-31T22:00:00Z")
    );
}

#[test]
fn a_seconds_field_fires_every_five_seconds() {
    assert_eq!(
        fires(&cron("*/5 * * * * *", "UTC"), "2026-05-01T10:00:01.500Z", 3),
        [
            "2026-05-01T10:00:05Z",
            "2026-05-01T10:00:10Z",
            "2026-05-01T10:00:15Z"
        ]
    );
}

/// Airflow's `@once` and `@continuous` are refused with what to write instead.
#[test]
fn once_and_continuous_presets_name_the_alternative() {
    let once = sluice_pipeline::timetable::parse_cron("@once").unwrap_err();
    assert!(once.contains("without `schedule:`"), "{once}");
    let continuous = sluice_pipeline::timetable::parse_cron("@continuous").unwrap_err();
    assert!(continuous.contains("mode: continuous"), "{continuous}");
}

#[test]
fn bad_patterns_and_zones_say_what_is_wrong() {
    use sluice_pipeline::timetable::{parse_cron, time_zone};
    assert!(
        parse_cron("a b c d e")
            .unwrap_err()
            .contains("not a valid cron")
    );
    assert!(parse_cron("* * *").unwrap_err().contains("3 fields"));
    assert!(
        parse_cron("* * * * * * *")
            .unwrap_err()
            .contains("7 fields")
    );
    assert!(
        parse_cron("@fortnightly")
            .unwrap_err()
            .contains("not a preset")
    );
    assert!(parse_cron("61 * * * *").is_err());
    assert!(parse_cron("0 0 30 2 *").unwrap_err().contains("never fire"));
    parse_cron("0 0 29 2 *").unwrap();
    for preset in ["@hourly", "@daily", "@weekly", "@monthly", "@yearly"] {
        parse_cron(preset).unwrap();
    }
    assert!(
        time_zone("Mars/X")
            .unwrap_err()
            .contains("not an IANA time zone")
    );
    time_zone("Europe/Berlin").unwrap();
}
