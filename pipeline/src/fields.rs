//! One value of the file checked on its own, the same way wherever it appears: required and
//! non-empty strings, humane durations and sizes, bounded integers. Each problem is recorded
//! in the [`Collector`] under the value's path, and the default is returned in its place.

use std::time::Duration;

use crate::errors::{Collector, ErrorCode};
use crate::humane;
use crate::raw::Humane;

/// A required string: absent or empty is `MISSING_FIELD` (the returned value is then empty).
pub(crate) fn required(c: &mut Collector<'_>, value: Option<String>, path: &str) -> String {
    match value {
        Some(v) if !v.trim().is_empty() => v,
        Some(_) | None => {
            let key = path.rsplit('.').next().unwrap_or(path);
            // Under a section that is itself absent, the section's own error says it all.
            let parent = path.rsplit_once('.').map_or("", |(p, _)| p);
            if parent.is_empty() || c.locator().contains(parent) {
                c.push(
                    ErrorCode::MissingField,
                    path,
                    format!("`{key}` is required"),
                );
            }
            String::new()
        }
    }
}

/// An optional string that must not be empty when given.
pub(crate) fn non_empty(c: &mut Collector<'_>, value: String, path: &str) -> String {
    if value.trim().is_empty() {
        c.push(ErrorCode::InvalidValue, path, "must not be empty");
    }
    value
}

/// A humane duration, `default` when absent.
pub(crate) fn duration(
    c: &mut Collector<'_>,
    value: Option<Humane>,
    path: &str,
    default: Duration,
) -> Duration {
    match value {
        None => default,
        Some(Humane(text)) => humane::parse_duration(&text).unwrap_or_else(|message| {
            c.push(ErrorCode::InvalidDuration, path, message);
            default
        }),
    }
}

/// A humane duration that must be greater than zero, `default` when absent.
pub(crate) fn positive_duration(
    c: &mut Collector<'_>,
    value: Option<Humane>,
    path: &str,
    default: Duration,
) -> Duration {
    let given = value.is_some();
    let errors_before = c.len();
    let d = duration(c, value, path, default);
    if given && d.is_zero() && c.len() == errors_before {
        c.push(
            ErrorCode::InvalidDuration,
            path,
            "must be greater than zero",
        );
    }
    d
}

/// A humane size in bytes in `min..=max`, `default` when absent.
pub(crate) fn size(
    c: &mut Collector<'_>,
    value: Option<Humane>,
    path: &str,
    default: u64,
    (min, max): (u64, u64),
) -> u64 {
    match value {
        None => default,
        Some(Humane(text)) => match humane::parse_size(&text) {
            Ok(bytes) if (min..=max).contains(&bytes) => bytes,
            Ok(bytes) if bytes < min => {
                c.push(
                    ErrorCode::InvalidSize,
                    path,
                    format!("must be at least {min} byte(s)"),
                );
                default
            }
            Ok(_) => {
                c.push(
                    ErrorCode::InvalidSize,
                    path,
                    format!("must be at most {max} bytes"),
                );
                default
            }
            Err(message) => {
                c.push(ErrorCode::InvalidSize, path, message);
                default
            }
        },
    }
}

/// An integer in `min..=max`, `default` when absent.
pub(crate) fn count<T: TryFrom<i64> + Copy>(
    c: &mut Collector<'_>,
    value: Option<i64>,
    path: &str,
    default: T,
    (min, max): (i64, i64),
) -> T {
    let Some(v) = value else { return default };
    match T::try_from(v) {
        Ok(n) if (min..=max).contains(&v) => n,
        _ => {
            let message = if max == i64::MAX {
                format!("{v} is out of range: must be at least {min}")
            } else {
                format!("{v} is out of range: must be between {min} and {max}")
            };
            c.push(ErrorCode::InvalidValue, path, message);
            default
        }
    }
}
