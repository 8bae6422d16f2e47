//! Event time from an attribute: milliseconds since the epoch, or RFC 3339.

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

/// Parses an event time (ms since epoch, or RFC 3339) into ms since epoch.
pub fn parse_event_time(value: &str) -> Option<i64> {
    let value = value.trim();
    if let Ok(ms) = value.parse::<i64>() {
        return Some(ms);
    }
    let time = humantime::parse_rfc3339_weak(value).ok()?;
    let since = time.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_millis()).ok()
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
        assert_eq!(parse_event_time(""), None);
    }
}
