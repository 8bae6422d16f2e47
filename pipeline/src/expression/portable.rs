//! What both stores read alike: plain decimal numbers, the casts both make the same way, and
//! a string literal kept from becoming a time's value where SQLite would store it as text.

use super::ColumnType;
use super::check::{Ty, describe};

/// A value that is a timestamp or a date in one branch and a string literal in another would
/// be stored as that text on SQLite: the literal must be cast.
pub(super) fn literal_beside_time(
    result: Ty,
    branches: impl Iterator<Item = Ty>,
    at: &str,
) -> Result<(), String> {
    let time = matches!(result, Ty::Known(ColumnType::Timestamp | ColumnType::Date));
    let mut branches = branches;
    if time && branches.any(|b| b == Ty::StringLiteral) {
        return Err(format!(
            "{at}: a string literal beside a {}: CAST it AS {}",
            describe(result),
            describe(result)
        ));
    }
    Ok(())
}

/// Whether both stores cast `from` to `to` alike.
pub(super) fn castable(from: Ty, to: ColumnType) -> bool {
    use ColumnType as C;
    match from {
        Ty::Null | Ty::StringLiteral => true,
        Ty::Known(from) if from == to => true,
        Ty::Known(C::Text) => true,
        Ty::Known(from) if from.is_number() => to.is_number() || to == C::Text,
        Ty::Known(C::Timestamp) => matches!(to, C::Date | C::Text),
        Ty::Known(C::Date) => matches!(to, C::Timestamp | C::Text),
        Ty::Known(C::Json) => to == C::Text,
        Ty::Known(_) => false,
    }
}

/// `digits[.digits][e[+-]digits]` (or `.digits`): a number both stores read alike.
pub(super) fn is_plain_number(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    !(whole.is_empty() && fraction.is_empty())
        && digits(whole)
        && digits(fraction)
        && exponent.is_none_or(|e| {
            let e = e.strip_prefix(['+', '-']).unwrap_or(e);
            !e.is_empty() && digits(e)
        })
}
