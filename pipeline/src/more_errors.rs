//! The type errors after the first. Serde stops at its first failure; a user fixing a file
//! wants them all at once. So the file is read again as a tree of plain values, and deserialised
//! from that tree over and over: each failure is recorded at its path and the node at that path
//! taken out, until the tree deserialises, a failure repeats, or [`MAX_ERRORS`] are found.
//!
//! Only a file that parses as YAML gets here (a syntax error has nothing after it to report),
//! and only its type errors (unknown keys, values of the wrong kind): the checks on values
//! (`crate::convert`, `crate::validate`) report all of theirs anyway once the file
//! deserialises.

use serde_json::Value;
use std::path::Path;

use crate::errors::{ConfigError, ErrorCode, one_line};
use crate::locate::Locator;
use crate::raw::RawPipeline;

/// At most this many errors are reported from one file.
const MAX_ERRORS: usize = 50;

/// Every type error of `text` but the one at `first_path` (already reported), each located.
pub(crate) fn after_first(
    text: &str,
    file: &Path,
    locator: &Locator,
    first_path: &str,
) -> Vec<ConfigError> {
    let Ok(mut tree) = serde_saphyr::from_str::<Value>(text) else {
        return Vec::new();
    };
    let mut seen = vec![first_path.to_owned()];
    let mut errors = Vec::new();
    take_out(&mut tree, first_path);
    while errors.len() < MAX_ERRORS {
        let failure = match serde_path_to_error::deserialize::<_, RawPipeline>(&tree) {
            Ok(_) => break,
            Err(failure) => failure,
        };
        let path = crate::decode::render_path(failure.path());
        // Paths are compared as errors print them (line breaks in keys as spaces).
        if seen.contains(&one_line(&path)) {
            break;
        }
        let raw_message = failure.into_inner().to_string();
        // The file's own reading takes a plain number or boolean as text where text is
        // expected (`check: false`, `project: 123`); the tree typed it: not an error.
        if raw_message.ends_with(", expected a string") {
            seen.push(one_line(&path));
            if !as_text(&mut tree, &path) {
                break;
            }
            continue;
        }
        let (code, message) = describe(&raw_message);
        let spot = locator.locate(&path);
        errors.push(ConfigError::new(
            code,
            file,
            path.clone(),
            spot.map(|s| (s.line, s.column)),
            message,
        ));
        seen.push(one_line(&path));
        if !take_out(&mut tree, &path) {
            break;
        }
    }
    errors
}

/// serde's message on a value tree, as the first error's are worded: code and one line.
fn describe(message: &str) -> (ErrorCode, String) {
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (field, expected) = rest.split_once(", expected").unwrap_or((rest, ""));
        let expected: Vec<&str> = expected
            .trim_start_matches(" one of")
            .split(',')
            .map(|e| e.trim().trim_matches('`'))
            .filter(|e| !e.is_empty())
            .collect();
        let message = if expected.is_empty() {
            format!("unknown key {field}; nothing may be given here")
        } else {
            format!(
                "unknown key {field}; expected one of: {}",
                expected.join(", ")
            )
        };
        return (ErrorCode::UnknownKey, message);
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let (variant, expected) = rest.split_once(", expected").unwrap_or((rest, ""));
        let expected = expected
            .trim_start_matches(" one of")
            .replace('`', "")
            .trim()
            .to_owned();
        return (
            ErrorCode::InvalidValue,
            format!("{variant} is not one of: {expected}"),
        );
    }
    (ErrorCode::InvalidValue, crate::decode::plain_words(message))
}

/// The scalar at `path` in `tree` as text, as the file's own reading takes it. Whether it was
/// a number or a boolean.
fn as_text(tree: &mut Value, path: &str) -> bool {
    let Some(node) = node_mut(tree, path) else {
        return false;
    };
    let text = match node {
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => return false,
    };
    *node = Value::String(text);
    true
}

/// The node at `path`, if the tree has one.
fn node_mut<'a>(tree: &'a mut Value, path: &str) -> Option<&'a mut Value> {
    let mut node = tree;
    for step in steps(path) {
        node = match (node, step) {
            (Value::Object(map), Step::Key(key)) => map.get_mut(key)?,
            (Value::Array(items), Step::Index(i)) => items.get_mut(i)?,
            _ => return None,
        };
    }
    Some(node)
}

/// Takes the node at `path` (`flows[1].source.pubsub`) out of `tree`: a key is removed, a list
/// item becomes an empty mapping, or empty text if it was a scalar (so that the items after it
/// keep their places). Whether there was one to take.
fn take_out(tree: &mut Value, path: &str) -> bool {
    let mut steps = steps(path);
    let Some(last) = steps.pop() else {
        return false;
    };
    let mut node = tree;
    for step in steps {
        node = match (node, step) {
            (Value::Object(map), Step::Key(key)) => match map.get_mut(key) {
                Some(next) => next,
                None => return false,
            },
            (Value::Array(items), Step::Index(i)) => match items.get_mut(i) {
                Some(next) => next,
                None => return false,
            },
            _ => return false,
        };
    }
    match (node, last) {
        (Value::Object(map), Step::Key(key)) => map.remove(key).is_some(),
        (Value::Array(items), Step::Index(i)) => match items.get_mut(i) {
            Some(item @ (Value::Object(_) | Value::Array(_) | Value::Null)) => {
                let empty = Value::Object(serde_json::Map::new());
                let changed = *item != empty;
                *item = empty;
                changed
            }
            Some(item) => {
                let empty = Value::String(String::new());
                let changed = *item != empty;
                *item = empty;
                changed
            }
            None => false,
        },
        _ => false,
    }
}

/// One step of a path.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `flows[1].source` → `flows`, `1`, `source`; `targets[0].` (an empty key) → `targets`,
/// `0`, ``; the root (``) → nothing.
fn steps(path: &str) -> Vec<Step<'_>> {
    let mut steps = Vec::new();
    if path.is_empty() {
        return steps;
    }
    for part in path.split('.') {
        let (key, mut indexes) = match part.find('[') {
            Some(at) => (&part[..at], &part[at..]),
            None => (part, ""),
        };
        if !key.is_empty() || indexes.is_empty() {
            steps.push(Step::Key(key));
        }
        while let Some(rest) = indexes.strip_prefix('[') {
            let Some((index, after)) = rest.split_once(']') else {
                break;
            };
            if let Ok(index) = index.parse() {
                steps.push(Step::Index(index));
            }
            indexes = after;
        }
    }
    steps
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        let locator = Locator::new(text);
        after_first(text, Path::new("p.yaml"), &locator, "")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn every_type_error_is_found_once_each() {
        let found = errors(
            "pipeline: p
mood: x
targets: events
flows:
  - name: a
    once: yes please
    source: { pubsub: { subscription: s, streams: many } }
",
        );
        assert_eq!(found.len(), 4, "{found:#?}");
        for expected in [
            "p.yaml:2:7: UNKNOWN_KEY: mood: unknown key `mood`; expected one of: pipeline,",
            "p.yaml:3:10: INVALID_VALUE: targets: expected a list (`- item` lines, or `[a, b]`), \
             found the text `events`",
            "p.yaml:6:11: INVALID_VALUE: flows[0].once: expected true or false, found the text \
             `yes please`",
            "p.yaml:7:51: INVALID_VALUE: flows[0].source.pubsub.streams: expected an integer, \
             found the text `many`",
        ] {
            assert!(
                found.iter().any(|f| f.starts_with(expected)),
                "{expected}: {found:#?}"
            );
        }
    }

    /// Numbers and booleans where text is expected are text to the file's own reading, not
    /// errors; a bad item of a list does not hide the errors after it.
    #[test]
    fn scalars_read_as_text_are_no_errors_and_lists_go_on() {
        let found = errors(
            "pipeline: p
pubsub: { project: 123 }
mood: x
flows:
  - name: a
    depends_on: [b, 2]
    select: { one: 1, yes: true }
    expect: [{ name: e, check: false }]
    once: maybe
",
        );
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found.iter().any(|f| f.contains("UNKNOWN_KEY: mood")),
            "{found:#?}"
        );
        assert!(
            found.iter().any(|f| f.contains("flows[0].once")),
            "{found:#?}"
        );
    }

    #[test]
    fn a_file_that_is_not_yaml_has_nothing_more() {
        assert!(errors("pipeline: [").is_empty());
    }
}
