//! Event time from an attribute: milliseconds since the epoch, or RFC 3339 with any offset
//! (parsed with `chrono`, the date-time crate the schedules use too). Pub/Sub messages, file
//! records and the tracking reader all go through [`parse_event_time`].

/// Why an event-time attribute could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventTimeError {
    /// The attribute is absent.
    #[error("attribute {0:?} is missing")]
    Missing(String),
    /// The value is neither an integer of milliseconds nor an RFC 3339 timestamp.
    #[error("attribute {name:?} = {value:?} is neither ms since epoch nor RFC 3339")]
    Unparseable {
        /// Attribute name.
        name: String,
        /// Its value.
        value: String,
    },
}

/// Parses an event time into ms since the epoch: an integer of milliseconds, or an RFC 3339
/// timestamp with any UTC offset (`2026-12-01T10:00:00+02:00`, `...Z`, fractions of a second,
/// `t`/`z` in either case, a space for the `T`). A timestamp without an offset is read as UTC,
/// as before. Times before 1970 give negative milliseconds.
pub fn parse_event_time(value: &str) -> Option<i64> {
    let value = value.trim();
    if let Ok(ms) = value.parse::<i64>() {
        return Some(ms);
    }
    if let Ok(time) = chrono::DateTime::parse_from_rfc3339(value) {
        return Some(time.timestamp_millis());
    }
    // No offset: UTC. The `T` may be lower case here too, as with an offset.
    [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%dt%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S%.f",
    ]
    .iter()
    .find_map(|format| chrono::NaiveDateTime::parse_from_str(value, format).ok())
    .map(|time| time.and_utc().timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ms_and_rfc3339() {
        assert_eq!(parse_event_time("1700000000123"), Some(1_700_000_000_123));
        assert_eq!(parse_event_time("1970-01-01T00:00:01.5Z"), Some(1_500));
        assert_eq!(
            parse_event_time("2023-11-14T22:13:20Z"),
            Some(1_700_000_000_000)
        );
        assert_eq!(parse_event_time("yesterday"), None);
        assert_eq!(parse_event_time("2026-13-01T00:00:00Z"), None);
        assert_eq!(parse_event_time(""), None);
    }

    #[test]
    fn parses_rfc3339_offsets_and_times_before_the_epoch() {
        // The same instant written in UTC, with a positive and with a negative offset.
        let utc = parse_event_time("2026-12-01T08:00:00Z");
        assert_eq!(utc, Some(1_796_112_000_000));
        assert_eq!(parse_event_time("2026-12-01T10:00:00+02:00"), utc);
        assert_eq!(parse_event_time("2026-12-01T03:30:00.000-04:30"), utc);
        assert_eq!(parse_event_time("2026-12-01t08:00:00z"), utc);
        assert_eq!(parse_event_time("1969-12-31T23:59:59Z"), Some(-1_000));
        // Forms accepted before, kept: no offset (read as UTC), a space for the `T`.
        assert_eq!(parse_event_time("2026-12-01T08:00:00"), utc);
        assert_eq!(parse_event_time("2026-12-01t08:00:00"), utc);
        assert_eq!(
            parse_event_time("2026-12-01 08:00:00.25Z"),
            utc.map(|t| t + 250)
        );
    }
}
