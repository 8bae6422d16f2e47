//! Checks every decoder shares, so that a time, a date or a decimal lands the same whatever the
//! payload's format: times in the years 0000 to 9999 (both stores hold them alike), dates as
//! `YYYY-MM-DD`, decimals as their digits.

use crate::flow::event_time::parse_event_time;
use sluice_store::TypedValue;

/// 0000-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z, ms since the epoch.
const MIN_TIMESTAMP_MS: i64 = -62_167_219_200_000;
const MAX_TIMESTAMP_MS: i64 = 253_402_300_799_999;

/// An instant in ms since the epoch, if the stores can hold it.
pub(super) fn timestamp(ms: i64) -> Result<TypedValue, String> {
    if (MIN_TIMESTAMP_MS..=MAX_TIMESTAMP_MS).contains(&ms) {
        Ok(TypedValue::Timestamp(ms))
    } else {
        Err(format!("{ms} ms is not a time in the years 0000 to 9999"))
    }
}

/// An ISO 8601 time written out (a number in a string is not taken for milliseconds).
pub(super) fn timestamp_from_text(text: &str) -> Result<TypedValue, String> {
    let bad = || format!("{text:?} is not an ISO 8601 time");
    if text.trim().parse::<i64>().is_ok() {
        return Err(bad());
    }
    timestamp(parse_event_time(text).ok_or_else(bad)?)
}

/// A `YYYY-MM-DD` date.
pub(super) fn date_from_text(text: &str) -> Result<TypedValue, String> {
    let date = chrono::NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d")
        .map_err(|_| format!("{text:?} is not a date YYYY-MM-DD"))?;
    Ok(TypedValue::Date(date.format("%Y-%m-%d").to_string()))
}

/// A date as days since 1970-01-01 (Avro's `date`).
pub(super) fn date_from_days(days: i64) -> Result<TypedValue, String> {
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).ok_or("no epoch")?;
    let date = chrono::Days::new(days.unsigned_abs());
    let day = if days >= 0 {
        epoch.checked_add_days(date)
    } else {
        epoch.checked_sub_days(date)
    };
    match day {
        Some(day) if (0..=9999).contains(&chrono::Datelike::year(&day)) => {
            Ok(TypedValue::Date(day.format("%Y-%m-%d").to_string()))
        }
        _ => Err(format!(
            "{days} days is not a date in the years 0000 to 9999"
        )),
    }
}

/// A decimal written as text (`-12.30`): digits with an optional sign and fraction.
pub(super) fn numeric_from_text(text: &str) -> Result<TypedValue, String> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, "0"));
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if all_digits(whole) && all_digits(fraction) {
        Ok(TypedValue::Numeric(text.to_owned()))
    } else {
        Err(format!("{text:?} is not a decimal number"))
    }
}

/// An unscaled integer's digits and a scale as a decimal (`1230`, 2 -> `12.30`).
pub(super) fn numeric_from_unscaled(unscaled: &str, scale: usize) -> TypedValue {
    let (sign, digits) = match unscaled.strip_prefix('-') {
        Some(digits) => ("-", digits),
        None => ("", unscaled),
    };
    if scale == 0 {
        return TypedValue::Numeric(format!("{sign}{digits}"));
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    TypedValue::Numeric(format!("{sign}{whole}.{fraction}"))
}

/// A float's digits as a decimal (its shortest exact form), if it is finite.
pub(super) fn numeric_from_float(x: f64) -> Result<TypedValue, String> {
    if x.is_finite() {
        Ok(TypedValue::Numeric(x.to_string()))
    } else {
        Err(format!("{x} is not a finite number"))
    }
}

/// A 32-bit float's digits as a decimal, as it is written (`0.1`, not the double nearest it).
pub(super) fn numeric_from_f32(x: f32) -> Result<TypedValue, String> {
    if x.is_finite() {
        Ok(TypedValue::Numeric(x.to_string()))
    } else {
        Err(format!("{x} is not a finite number"))
    }
}

/// A finite double.
pub(super) fn double(x: f64) -> Result<TypedValue, String> {
    if x.is_finite() {
        Ok(TypedValue::Double(x))
    } else {
        Err(format!("{x} is not a finite double"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn decimals_keep_their_digits() {
        let n = |s: &str| TypedValue::Numeric(s.to_owned());
        assert_eq!(numeric_from_unscaled("1230", 2), n("12.30"));
        assert_eq!(numeric_from_unscaled("-5", 3), n("-0.005"));
        assert_eq!(numeric_from_unscaled("42", 0), n("42"));
        assert_eq!(numeric_from_text("-12.30").unwrap(), n("-12.30"));
        assert!(numeric_from_text("1e5").is_err());
        assert!(numeric_from_text("12.").is_err());
        assert!(numeric_from_float(f64::NAN).is_err());
    }

    #[test]
    fn dates_and_times_stay_in_range() {
        assert_eq!(
            date_from_days(20_426).unwrap(),
            TypedValue::Date("2025-12-04".into())
        );
        assert_eq!(
            date_from_days(-1).unwrap(),
            TypedValue::Date("1969-12-31".into())
        );
        assert!(date_from_days(4_000_000).is_err());
        assert!(timestamp(MAX_TIMESTAMP_MS + 1).is_err());
        assert!(timestamp_from_text("1700000000000").is_err());
    }
}
