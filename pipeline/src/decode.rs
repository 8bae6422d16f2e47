//! YAML text → [`RawPipeline`], turning the first serde failure into a located [`ConfigError`].
//!
//! `serde-saphyr` reports where each failure happened; `serde_path_to_error` adds the path
//! (`flows[1].source.pubsub.bogus`). Together they give code, path, line and column.

use std::borrow::Cow;
use std::path::Path;

use serde_path_to_error::Segment;
use serde_saphyr::{DefaultMessageFormatter, MessageFormatter};

use crate::errors::{ConfigError, ConfigErrors, ErrorCode};
use crate::locate::{Locator, Spot};
use crate::raw::RawPipeline;

/// Deserialises the file. Repeated keys are reported first (with their full path, from the
/// locator); otherwise the first serde failure and, after a type error, every other type
/// error of the file (`more_errors.rs`).
pub(crate) fn decode(
    text: &str,
    file: &Path,
    locator: &Locator,
) -> Result<RawPipeline, ConfigErrors> {
    let first = match first_failure(text, file, locator) {
        Ok(raw) => return Ok(raw),
        Err(first) => first,
    };
    let mut errors = Vec::new();
    if matches!(first.code, ErrorCode::InvalidValue | ErrorCode::UnknownKey) {
        errors = crate::more_errors::after_first(text, file, locator, &first.path);
    }
    errors.insert(0, first);
    // In file order, as every other list of errors.
    errors.sort_by_key(|e| (e.line.is_none(), e.line, e.column));
    Err(ConfigErrors(errors))
}

/// The file deserialised, or its first serde failure, located.
fn first_failure(text: &str, file: &Path, locator: &Locator) -> Result<RawPipeline, ConfigError> {
    let mut path = String::new();
    let result = serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize::<_, RawPipeline>(de).map_err(|e| {
            path = render_path(e.path());
            e.into_inner()
        })
    });
    let error = match result {
        Ok(raw) => return Ok(raw),
        Err(error) => error,
    };
    let error = original(&error);
    if let serde_saphyr::Error::DuplicateMappingKey { .. } = error
        && let Some((dup_path, spot)) = locator.duplicates().first()
    {
        return Err(duplicate_key(file, dup_path, *spot));
    }
    let (code, path, message) = classify(error, path);
    let spot = match (code, known_location(error)) {
        // serde-saphyr points a missing field at wherever it stopped; the mapping that lacks
        // the key is the better place.
        (ErrorCode::MissingField, _) | (_, None) => locator.locate(&path),
        // A bad value: point at the value itself when the file has it (serde-saphyr sometimes
        // points at its key).
        (ErrorCode::InvalidValue, Some(spot)) if locator.contains(&path) => {
            locator.locate(&path).or(Some(spot))
        }
        (_, Some(spot)) => Some(spot),
    };
    Err(ConfigError::new(
        code,
        file,
        path,
        spot.map(|s| (s.line, s.column)),
        message,
    ))
}

fn duplicate_key(file: &Path, path: &str, spot: Spot) -> ConfigError {
    let key = path.rsplit('.').next().unwrap_or(path);
    ConfigError::new(
        ErrorCode::DuplicateKey,
        file,
        path,
        Some((spot.line, spot.column)),
        format!("key `{key}` appears twice in the same mapping"),
    )
}

/// Strips the wrappers (snippets, alias expansion) around the error that actually happened.
fn original(mut error: &serde_saphyr::Error) -> &serde_saphyr::Error {
    loop {
        error = match error {
            serde_saphyr::Error::WithSnippet { error, .. }
            | serde_saphyr::Error::AliasError { error, .. } => error,
            other => return other,
        };
    }
}

/// Code, path and one-line message of a serde-saphyr error met at `path`.
fn classify(error: &serde_saphyr::Error, path: String) -> (ErrorCode, String, String) {
    use serde_saphyr::Error as E;
    match error {
        E::SerdeUnknownField {
            field, expected, ..
        } => {
            let message = if expected.is_empty() {
                format!("unknown key `{field}`; nothing may be given here")
            } else {
                format!(
                    "unknown key `{field}`; expected one of: {}",
                    expected.join(", ")
                )
            };
            (ErrorCode::UnknownKey, path, message)
        }
        E::SerdeMissingField { field, .. } => {
            let path = if path.is_empty() {
                (*field).to_owned()
            } else {
                format!("{path}.{field}")
            };
            (
                ErrorCode::MissingField,
                path,
                format!("`{field}` is required"),
            )
        }
        E::SerdeUnknownVariant {
            variant, expected, ..
        } => (
            ErrorCode::InvalidValue,
            path,
            format!("`{variant}` is not one of: {}", expected.join(", ")),
        ),
        E::Unexpected { .. } if path.is_empty() => (
            ErrorCode::Syntax,
            path,
            "a pipeline file is a YAML mapping (`pipeline: NAME`, `flows: [...]`, ...)".to_owned(),
        ),
        E::InvalidScalar { ty, .. } => (
            ErrorCode::InvalidValue,
            path,
            format!("expected {}", describe_type(ty)),
        ),
        E::SerdeInvalidType { .. }
        | E::SerdeInvalidValue { .. }
        | E::SerdeInvalidLength { .. }
        | E::InvalidBooleanStrict { .. }
        | E::NullIntoString { .. }
        | E::Unexpected { .. }
        | E::UnexpectedValueForUnit { .. }
        | E::UnexpectedValueForUnitEnumVariant { .. }
        | E::ExternallyTaggedEnumExpectedScalarOrMapping { .. }
        | E::Message { .. } => (ErrorCode::InvalidValue, path, plain_message(error)),
        _ => (ErrorCode::Syntax, path, plain_message(error)),
    }
}

/// `i64` → `an integer`, for messages about scalars of the wrong type.
fn describe_type(ty: &str) -> String {
    match ty {
        "i8" | "i16" | "i32" | "i64" | "i128" | "u8" | "u16" | "u32" | "u64" | "u128" | "isize"
        | "usize" => "an integer".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "bool" => "true or false".to_owned(),
        other => format!("a value of type {other}"),
    }
}

/// The error's text without location suffix or source snippet, on one line.
fn plain_message(error: &serde_saphyr::Error) -> String {
    let text: Cow<'_, str> = DefaultMessageFormatter.format_message(error);
    plain_words(&text)
}

/// A list, as a user writes one.
const A_LIST: &str = "a list (`- item` lines, or `[a, b]`)";
/// A mapping, as a user writes one.
const A_MAPPING: &str = "a mapping (`key: value` lines, or `{ key: value }`)";

/// A serde message on one line, in the file's words: `invalid type: string "x", expected a
/// sequence` becomes `expected a list (...), found the text `x``; the parser's `expected
/// sequence start` becomes `expected a list (...)`.
pub(crate) fn plain_words(message: &str) -> String {
    let message: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if let Some((found, expected)) = message
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.split_once(", expected "))
    {
        return format!("expected {}, found {}", kind(expected), found_words(found));
    }
    if message.contains("sequence start") {
        return format!("expected {A_LIST}");
    }
    if message.contains("mapping start") {
        return format!("expected {A_MAPPING}");
    }
    message
}

/// What serde expected, in the file's words.
fn kind(expected: &str) -> &str {
    match expected.trim() {
        "a sequence" => A_LIST,
        "a map" => A_MAPPING,
        "a boolean" => "true or false",
        "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64" | "usize" => "an integer",
        "f32" | "f64" => "a number",
        struct_name if struct_name.starts_with("struct ") => A_MAPPING,
        other => other,
    }
}

/// What serde found, in the file's words.
fn found_words(found: &str) -> String {
    if let Some(text) = found.strip_prefix("string ") {
        return format!("the text `{}`", text.trim_matches('"'));
    }
    match found {
        "sequence" => "a list".to_owned(),
        "map" => "a mapping".to_owned(),
        "null" => "nothing".to_owned(),
        other => other.replace('`', ""),
    }
}

fn known_location(error: &serde_saphyr::Error) -> Option<Spot> {
    let location = error.location()?;
    let line = usize::try_from(location.line()).ok()?;
    let column = usize::try_from(location.column()).ok()?;
    (line > 0).then_some(Spot {
        line,
        column: column.max(1),
    })
}

/// `flows[1].source.pubsub.bogus`; the root is the empty string.
pub(crate) fn render_path(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    out
}
