//! Humane durations (`10m`, `50ms`, `5s`, `1h 30m`) and sizes (`100MiB`, `64KiB`, `1000`).

use std::time::Duration;

/// Parses a humane duration. A bare number is refused: a unit is always required.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration; write e.g. `5s`, `50ms` or `10m`".to_owned());
    }
    if text.chars().all(|c| c.is_ascii_digit()) && text != "0" {
        return Err(format!(
            "`{text}` has no unit; write e.g. `{text}s` or `{text}ms`"
        ));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration ({e}); write e.g. `5s`, `50ms` or `10m`"))
}

/// Parses a humane size in bytes: a plain integer, or a number with a unit (`KiB`, `MiB`, `GiB`
/// are powers of 1024; `KB`, `MB`, `GB` powers of 1000).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let bad = || format!("`{text}` is not a size; write e.g. `100MiB`, `64KiB` or a byte count");
    if text.is_empty() || !text.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(bad());
    }
    text.parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("ten minutes").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-5s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100MiB"), Ok(100 * 1024 * 1024));
        assert_eq!(parse_size("64KiB"), Ok(64 * 1024));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("1MB"), Ok(1_000_000));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("10 parsecs").is_err());
    }
}
