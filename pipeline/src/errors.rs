//! Validation errors: one [`ConfigError`] per problem, each with a stable code, the file, the
//! path inside the file and (where known) the line and column.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::locate::{Locator, Spot};

/// The stable code of a [`ConfigError`], printed as SCREAMING_SNAKE (`UNKNOWN_KEY`).
///
/// Codes are part of the command-line contract (`sluice validate`): scripts match on them.
/// New codes are added over time, hence `#[non_exhaustive]`.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorCode {
    /// A key that the file format does not know (or that does not apply in its place).
    UnknownKey,
    /// A duration that is not humane (`10m`, `50ms`, `5s`) or out of range.
    InvalidDuration,
    /// A size that is not humane (`100MiB`, `64KiB`, plain bytes) or out of range.
    InvalidSize,
    /// A value of the wrong type, outside its range, or not one of the allowed words.
    InvalidValue,
    /// A required key is absent.
    MissingField,
    /// Two targets, or two flows, share a name.
    DuplicateName,
    /// The same key appears twice in one YAML mapping.
    DuplicateKey,
    /// A flow's `target` or a `source.table` names no declared target.
    UnknownTarget,
    /// A `depends_on` entry names no flow.
    UnknownFlow,
    /// Flows wait for each other in a cycle (through `depends_on` or data edges).
    DependsOnCycle,
    /// Continuous mode: a `depends_on` predecessor is not a `once` flow.
    DependsOnPredecessorMustBeOnce,
    /// A `depends_on` predecessor writes to a `view` target.
    DependsOnPredecessorWritesToView,
    /// A `once` flow writes to a `foreach_batch` target.
    ForeachBatchCannotBeOnce,
    /// Continuous mode: a `depends_on` predecessor writes to a `foreach_batch` target.
    ForeachBatchPredecessor,
    /// A `schedule:` that is malformed or not allowed (continuous mode).
    InvalidSchedule,
    /// Two flows read one Pub/Sub subscription (their dedup ledgers are separate).
    SubscriptionShared,
    /// A name that is not `[a-z_][a-z0-9_]*` of at most 48 bytes.
    InvalidIdentifier,
    /// A `select:`, `where:` or `expect:` expression that does not parse, names an unknown
    /// column, mixes types, or gives values its column cannot hold.
    InvalidExpression,
    /// A valid file asks for what this version does not run (`sluice run` only).
    NotBuilt,
    /// The file could not be read.
    Unreadable,
    /// The file is not well-formed YAML (or not a mapping at the top).
    Syntax,
}

impl ErrorCode {
    /// The code as printed: `UNKNOWN_KEY`, `INVALID_DURATION`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownKey => "UNKNOWN_KEY",
            Self::InvalidDuration => "INVALID_DURATION",
            Self::InvalidSize => "INVALID_SIZE",
            Self::InvalidValue => "INVALID_VALUE",
            Self::MissingField => "MISSING_FIELD",
            Self::DuplicateName => "DUPLICATE_NAME",
            Self::DuplicateKey => "DUPLICATE_KEY",
            Self::UnknownTarget => "UNKNOWN_TARGET",
            Self::UnknownFlow => "UNKNOWN_FLOW",
            Self::DependsOnCycle => "DEPENDS_ON_CYCLE",
            Self::DependsOnPredecessorMustBeOnce => "DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE",
            Self::DependsOnPredecessorWritesToView => "DEPENDS_ON_PREDECESSOR_WRITES_TO_VIEW",
            Self::ForeachBatchCannotBeOnce => "FOREACH_BATCH_CANNOT_BE_ONCE",
            Self::ForeachBatchPredecessor => "FOREACH_BATCH_PREDECESSOR",
            Self::InvalidSchedule => "INVALID_SCHEDULE",
            Self::SubscriptionShared => "SUBSCRIPTION_SHARED",
            Self::InvalidExpression => "INVALID_EXPRESSION",
            Self::NotBuilt => "NOT_BUILT",
            Self::InvalidIdentifier => "INVALID_IDENTIFIER",
            Self::Unreadable => "UNREADABLE",
            Self::Syntax => "SYNTAX",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem in a pipeline file.
///
/// Displays as one line: `FILE:LINE:COL: CODE: PATH: message`; `LINE:COL` is left out when
/// unknown and `PATH: ` when the problem concerns the whole file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render(self))]
pub struct ConfigError {
    /// What kind of problem.
    pub code: ErrorCode,
    /// The pipeline file.
    pub file: PathBuf,
    /// Where inside the file, e.g. `flows[1].depends_on`; empty for the whole file. A line break
    /// in a key (`"a\nb": 1`) is a space here, so that the error still prints as one line.
    pub path: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// Human-readable explanation (a single line).
    pub message: String,
}

fn render(e: &ConfigError) -> String {
    let mut out = one_line(&e.file.display().to_string());
    if let Some(line) = e.line {
        out.push_str(&format!(":{line}"));
        if let Some(column) = e.column {
            out.push_str(&format!(":{column}"));
        }
    }
    out.push_str(&format!(": {}: ", e.code));
    if !e.path.is_empty() {
        out.push_str(&format!("{}: ", e.path));
    }
    out.push_str(&e.message);
    out
}

impl ConfigError {
    /// Builds an error; line breaks in `path` and `message` become spaces so that it prints as
    /// one line.
    pub fn new(
        code: ErrorCode,
        file: &Path,
        path: impl Into<String>,
        spot: Option<(usize, usize)>,
        message: impl Into<String>,
    ) -> Self {
        let message: String = message.into();
        Self {
            code,
            file: file.to_path_buf(),
            path: one_line(&path.into()),
            line: spot.map(|(line, _)| line),
            column: spot.map(|(_, column)| column),
            message: one_line(&message),
        }
    }
}

/// `text` with each line break replaced by a space (as an error's path and message print).
pub(crate) fn one_line(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

/// Every problem found in a pipeline file (at least one), in file order.
///
/// Displays one error per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render_all(self))]
pub struct ConfigErrors(pub Vec<ConfigError>);

fn render_all(errors: &ConfigErrors) -> String {
    errors
        .0
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

impl ConfigErrors {
    /// The errors, in file order.
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }

    /// Whether some error has this code.
    pub fn has(&self, code: ErrorCode) -> bool {
        self.0.iter().any(|e| e.code == code)
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(error: ConfigError) -> Self {
        Self(vec![error])
    }
}

/// Collects errors while a file is converted and validated, locating each by its path.
pub(crate) struct Collector<'a> {
    file: &'a Path,
    locator: &'a Locator,
    errors: Vec<ConfigError>,
}

impl<'a> Collector<'a> {
    pub(crate) fn new(file: &'a Path, locator: &'a Locator) -> Self {
        Self {
            file,
            locator,
            errors: Vec::new(),
        }
    }

    /// Records an error at `path`, located at that path or its nearest located ancestor.
    pub(crate) fn push(&mut self, code: ErrorCode, path: &str, message: impl Into<String>) {
        let spot = self.locator.locate(path);
        self.push_at(code, path, spot, message);
    }

    /// Records an error at an explicit location.
    pub(crate) fn push_at(
        &mut self,
        code: ErrorCode,
        path: &str,
        spot: Option<Spot>,
        message: impl Into<String>,
    ) {
        let spot = spot.map(|s| (s.line, s.column));
        self.errors
            .push(ConfigError::new(code, self.file, path, spot, message));
    }

    /// How many errors were recorded so far.
    /// The pipeline file the errors are in (relative paths in it are beside it: `paths.rs`).
    pub(crate) fn file(&self) -> &'a Path {
        self.file
    }

    pub(crate) fn len(&self) -> usize {
        self.errors.len()
    }

    /// Whether an error was recorded at `prefix` or under it.
    pub(crate) fn any_under(&self, prefix: &str) -> bool {
        self.errors.iter().any(|e| e.path.starts_with(prefix))
    }

    /// The locator of the file being checked.
    pub(crate) fn locator(&self) -> &Locator {
        self.locator
    }

    /// `Ok(value)` when nothing was recorded, else every error sorted by position.
    pub(crate) fn finish<T>(self, value: T) -> Result<T, ConfigErrors> {
        if self.errors.is_empty() {
            return Ok(value);
        }
        let mut errors = self.errors;
        // Stable: errors at the same spot keep the order in which they were found.
        errors.sort_by_key(|e| (e.line.unwrap_or(usize::MAX), e.column.unwrap_or(0)));
        Err(ConfigErrors(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_one_line_with_and_without_location() {
        let e = ConfigError::new(
            ErrorCode::UnknownFlow,
            Path::new("p.yaml"),
            "flows[1].depends_on",
            Some((12, 17)),
            "no flow named `x`\nsecond line",
        );
        assert_eq!(
            e.to_string(),
            "p.yaml:12:17: UNKNOWN_FLOW: flows[1].depends_on: no flow named `x` second line"
        );
        let e = ConfigError::new(
            ErrorCode::Unreadable,
            Path::new("p.yaml"),
            "",
            None,
            "cannot read",
        );
        assert_eq!(e.to_string(), "p.yaml: UNREADABLE: cannot read");
        let all = ConfigErrors(vec![e.clone(), e]);
        assert_eq!(all.to_string().lines().count(), 2);
    }

    #[test]
    fn codes_are_screaming_snake() {
        assert_eq!(ErrorCode::UnknownKey.to_string(), "UNKNOWN_KEY");
        assert_eq!(ErrorCode::InvalidSchedule.to_string(), "INVALID_SCHEDULE");
        assert_eq!(ErrorCode::DuplicateName.to_string(), "DUPLICATE_NAME");
        assert_eq!(
            ErrorCode::DependsOnPredecessorWritesToView.to_string(),
            "DEPENDS_ON_PREDECESSOR_WRITES_TO_VIEW"
        );
        assert_eq!(
            ErrorCode::ForeachBatchPredecessor.to_string(),
            "FOREACH_BATCH_PREDECESSOR"
        );
    }
}
