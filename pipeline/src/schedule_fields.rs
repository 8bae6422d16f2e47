//! The text of a schedule's fields read into what the timetable computes with: a cron
//! pattern (`croner`, with the presets and the refusals of Airflow's `@once` and
//! `@continuous`), an IANA time zone and a date (`start_date`, `end_date`, a backfill's range).
//! Each error says what is wrong in words.

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// Parses a cron pattern as `schedule.cron` takes it.
///
/// # Errors
/// What is wrong with it, in words.
pub fn parse_cron(pattern: &str) -> Result<Cron, String> {
    let trimmed = pattern.trim();
    let preset = trimmed.starts_with('@');
    if preset {
        const PRESETS: [&str; 6] = [
            "@hourly",
            "@daily",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
        ];
        // Airflow's presets that are not times: what sluice offers instead.
        if trimmed.eq_ignore_ascii_case("@once") {
            return Err(
                "`@once` is not a schedule here: a triggered pipeline without `schedule:` \
                 runs once per `sluice run` (start_date and end_date bound a schedule's fires)"
                    .to_owned(),
            );
        }
        if trimmed.eq_ignore_ascii_case("@continuous") {
            return Err(
                "`@continuous` is not a schedule here: use `mode: continuous` (no \
                 schedule), which runs until stopped"
                    .to_owned(),
            );
        }
        if !PRESETS.iter().any(|p| p.eq_ignore_ascii_case(trimmed)) {
            return Err(format!(
                "`{trimmed}` is not a preset; use one of {}",
                PRESETS.join(", ")
            ));
        }
    } else {
        let fields = trimmed.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(format!(
                "`{trimmed}` has {fields} fields; a cron expression has 5 (minute hour \
                 day-of-month month day-of-week) or 6 (seconds first)"
            ));
        }
    }
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(trimmed)
        .map_err(|e| format!("`{trimmed}` is not a valid cron expression: {e}"))?;
    // A pattern no date matches (`0 0 30 2 *`) would leave a worker waiting for ever.
    let since = Timestamp::UNIX_EPOCH.to_zoned(TimeZone::UTC);
    if cron.find_next_occurrence(&since, false).is_err() {
        return Err(format!("`{trimmed}` matches no time: it would never fire"));
    }
    Ok(cron)
}

/// The instant `text` names (`start_date`, `end_date`): RFC 3339 with an offset
/// (`2026-12-01T06:00:00Z`), or a date and time (`2026-12-01T06:00:00`) or a date
/// (`2026-12-01`, midnight) on the wall clock of `zone` (a time a daylight-saving change skips
/// is taken after the gap, one it repeats at its first instant). Ms since the epoch.
///
/// # Errors
/// It names no instant, in words.
pub fn instant(text: &str, zone: &TimeZone) -> Result<i64, String> {
    let text = text.trim();
    if let Ok(instant) = text.parse::<Timestamp>() {
        return Ok(instant.as_millisecond());
    }
    let wall = text
        .parse::<jiff::civil::DateTime>()
        .or_else(|_| {
            text.parse::<jiff::civil::Date>()
                .map(|d| d.to_datetime(jiff::civil::Time::midnight()))
        })
        .map_err(|_| {
            format!(
                "`{text}` is not a date: write 2026-12-01, 2026-12-01T06:00:00 (in the \
                 schedule's time zone) or 2026-12-01T06:00:00Z"
            )
        })?;
    zone.to_ambiguous_zoned(wall)
        .compatible()
        .map(|zoned| zoned.timestamp().as_millisecond())
        .map_err(|e| format!("`{text}` is not a time in the schedule's time zone: {e}"))
}

/// The time zone `name` names (IANA: `UTC`, `Europe/Berlin`, ...).
///
/// # Errors
/// It names none.
pub fn time_zone(name: &str) -> Result<TimeZone, String> {
    TimeZone::get(name).map_err(|_| {
        format!("`{name}` is not an IANA time zone (e.g. UTC, Europe/Berlin, America/New_York)")
    })
}
