//! Checks that relate parts of the file to each other: identifiers, unique names, references
//! from flows to targets and flows, and what the mode allows (SPEC §5, §6).
//!
//! Graph checks of later issues (`DEPENDS_ON_CYCLE`, ...) belong here too.

use std::collections::HashMap;

use crate::errors::{Collector, ErrorCode};
use crate::model::{Mode, Pipeline, Source};

/// Longest identifier, in bytes (table names are `<pipeline>__<target>`).
pub const MAX_IDENTIFIER_LEN: usize = 48;

/// Whether `name` is a valid identifier: `[a-z_][a-z0-9_]*`, at most
/// [`MAX_IDENTIFIER_LEN`] bytes.
pub fn is_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    let Some(first) = bytes.next() else {
        return false;
    };
    name.len() <= MAX_IDENTIFIER_LEN
        && (first.is_ascii_lowercase() || first == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Runs every cross-reference check on a converted pipeline.
pub(crate) fn validate(p: &Pipeline, c: &mut Collector<'_>) {
    identifier(c, &p.name, "pipeline");
    if p.schedule.is_some() && p.mode == Mode::Continuous {
        c.push(
            ErrorCode::InvalidSchedule,
            "schedule",
            "a schedule is only allowed with `mode: triggered`",
        );
    }

    let targets = unique_names(
        c,
        p.targets.iter().map(|t| t.name.as_str()),
        "targets",
        "target",
    );
    let flows = unique_names(c, p.flows.iter().map(|f| f.name.as_str()), "flows", "flow");

    for (i, flow) in p.flows.iter().enumerate() {
        if !flow.target.is_empty() && !targets.contains_key(flow.target.as_str()) {
            c.push(
                ErrorCode::UnknownTarget,
                &format!("flows[{i}].target"),
                format!("no target named `{}`{}", flow.target, known(&targets)),
            );
        }
        if let Source::Table { target } = &flow.source
            && !target.is_empty()
            && !targets.contains_key(target.as_str())
        {
            c.push(
                ErrorCode::UnknownTarget,
                &format!("flows[{i}].source.table"),
                format!("no target named `{target}`{}", known(&targets)),
            );
        }
        for (j, dep) in flow.depends_on.iter().enumerate() {
            if flows.contains_key(dep.as_str()) {
                continue;
            }
            // `depends_on: x` has no index; `depends_on: [x, y]` does.
            let item = format!("flows[{i}].depends_on[{j}]");
            let path = if c.locator().contains(&item) {
                item
            } else {
                format!("flows[{i}].depends_on")
            };
            c.push(
                ErrorCode::UnknownFlow,
                &path,
                format!("no flow named `{dep}`{}", known(&flows)),
            );
        }
    }
}

fn identifier(c: &mut Collector<'_>, name: &str, path: &str) {
    // An empty name was already reported as missing.
    if !name.is_empty() && !is_identifier(name) {
        c.push(
            ErrorCode::InvalidIdentifier,
            path,
            format!(
                "`{name}` is not an identifier: use [a-z_][a-z0-9_]*, at most \
                 {MAX_IDENTIFIER_LEN} bytes"
            ),
        );
    }
}

/// Checks each name of one list (`targets` or `flows`) and returns name → first index.
fn unique_names<'a>(
    c: &mut Collector<'_>,
    names: impl Iterator<Item = &'a str>,
    list: &str,
    what: &str,
) -> HashMap<&'a str, usize> {
    let mut seen: HashMap<&'a str, usize> = HashMap::new();
    for (i, name) in names.enumerate() {
        let path = format!("{list}[{i}].name");
        identifier(c, name, &path);
        if name.is_empty() {
            continue;
        }
        if let Some(first) = seen.get(name) {
            let line = c
                .locator()
                .locate(&format!("{list}[{first}].name"))
                .map(|s| format!(" (line {})", s.line))
                .unwrap_or_default();
            c.push(
                ErrorCode::DuplicateName,
                &path,
                format!("{what} `{name}` is already declared at {list}[{first}]{line}"),
            );
        } else {
            seen.insert(name, i);
        }
    }
    seen
}

/// ` (declared: a, b)` for a helpful message, or nothing when there is nothing declared.
fn known(names: &HashMap<&str, usize>) -> String {
    if names.is_empty() {
        return " (none is declared)".to_owned();
    }
    let mut list: Vec<(&str, usize)> = names.iter().map(|(n, i)| (*n, *i)).collect();
    list.sort_by_key(|(_, i)| *i);
    let list: Vec<&str> = list.into_iter().map(|(n, _)| n).collect();
    format!(" (declared: {})", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_identifier("orders"));
        assert!(is_identifier("_x9"));
        assert!(is_identifier(&"a".repeat(48)));
        assert!(!is_identifier(&"a".repeat(49)));
        assert!(!is_identifier(""));
        assert!(!is_identifier("9a"));
        assert!(!is_identifier("Orders"));
        assert!(!is_identifier("events-live"));
        assert!(!is_identifier("naïve"));
    }
}
