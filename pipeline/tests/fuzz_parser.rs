//! Bounded property-based fuzzing (proptest) of the pipeline file parser, [`parse`].
//!
//! Inputs: arbitrary strings, arbitrary bytes made into lossy UTF-8, soups of YAML tokens and
//! pipeline keys, and mutations of a valid file (lines deleted, duplicated, replaced or
//! re-indented; random keys inserted; random values for known keys; tabs, NUL, CR, BOM),
//! plus deep nesting, very long strings and YAML anchors/aliases (alias bombs included); the
//! same mutations of a typed file, and soups of SQL tokens as its expressions.
//!
//! Properties: `parse` never panics, is deterministic, and every error it returns has a
//! non-empty code, a one-line message, prints as one line, and is located (when it has a line)
//! at a line between 1 and the file's line count + 1, with a column >= 1, in file order.
//!
//! Bound: at most 256 cases per property (fewer for the very large inputs), no failure
//! persistence (nothing is written into the repository); the whole file runs in a few seconds
//! in a debug build. A failure prints the minimal input; `PROPTEST_RNG_SEED` replays a run.
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::Path;

use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::Config;
use sluice_pipeline::{ConfigError, parse};

/// A valid file (shared with `tests/errors.rs`).
const BASE: &str = include_str!("data/base.yaml");

/// Every key the file format knows, at any level.
const KEYS: &[&str] = &[
    "pipeline",
    "mode",
    "store",
    "pubsub",
    "project",
    "endpoint",
    "metrics",
    "listen",
    "control",
    "token_file",
    "schedule",
    "cron",
    "every",
    "timezone",
    "semantics",
    "catchup",
    "targets",
    "name",
    "kind",
    "sink",
    "format",
    "path",
    "window",
    "size",
    "group_by",
    "allowed_lateness",
    "foreach_batch",
    "flows",
    "target",
    "once",
    "depends_on",
    "source",
    "file",
    "max_record_bytes",
    "table",
    "subscription",
    "dedup",
    "by",
    "attribute",
    "on_missing",
    "event_time",
    "on_bad_timestamp",
    "watermark",
    "tracking_subscription",
    "band",
    "flow_control",
    "max_outstanding_messages",
    "max_outstanding_bytes",
    "batch",
    "max_messages",
    "max_delay",
    "max_attempts",
    "drain_idle",
    "streams",
    "columns",
    "type",
    "nullable",
    "decode",
    "fields",
    "select",
    "where",
    "expect",
    "check",
    "on_violation",
];

/// A valid typed file (`columns:`, `decode:`, `select:`, `where:`, `expect:`).
const TYPED: &str = include_str!("data/typed.yaml");

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// Line count as YAML sees it: `\n`, `\r\n` and a lone `\r` each end a line.
fn line_count(text: &str) -> usize {
    let breaks =
        text.matches('\n').count() + text.matches('\r').count() - text.matches("\r\n").count();
    let last_is_open = !(text.is_empty() || text.ends_with(['\n', '\r']));
    breaks + usize::from(last_is_open)
}

fn check_error(text: &str, lines: usize, e: &ConfigError) -> Result<(), TestCaseError> {
    prop_assert!(!e.code.as_str().is_empty(), "empty code: {e:?}");
    prop_assert!(
        !e.message.contains(['\n', '\r']),
        "message spans lines: {e:?}"
    );
    prop_assert!(!e.message.trim().is_empty(), "empty message: {e:?}");
    prop_assert!(
        !e.to_string().contains(['\n', '\r']),
        "does not print as one line: {e:?}"
    );
    prop_assert_eq!(e.file.as_path(), Path::new("p.yaml"));
    if let Some(line) = e.line {
        prop_assert!(
            (1..=lines + 1).contains(&line),
            "line {} outside 1..={} in {:?}: {:?}",
            line,
            lines + 1,
            text,
            e
        );
    }
    if let Some(column) = e.column {
        prop_assert!(e.line.is_some(), "a column without a line: {e:?}");
        prop_assert!(column >= 1, "column 0: {e:?}");
    }
    Ok(())
}

/// Parses `text` and checks every property of the module docs.
fn check(text: &str) -> Result<(), TestCaseError> {
    let result = parse(text, Path::new("p.yaml"));
    let again = parse(text, Path::new("p.yaml"));
    prop_assert_eq!(&result, &again, "parse is not deterministic");
    let Err(errors) = result else {
        return Ok(());
    };
    prop_assert!(!errors.0.is_empty(), "Err without any error");
    let lines = line_count(text);
    for e in &errors {
        check_error(text, lines, e)?;
    }
    let order: Vec<_> = errors
        .iter()
        .map(|e| (e.line.unwrap_or(usize::MAX), e.column.unwrap_or(0)))
        .collect();
    prop_assert!(order.is_sorted(), "errors not in file order: {errors:?}");
    prop_assert_eq!(errors.to_string().lines().count(), errors.0.len());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

/// Values that stress the typed keys: numbers out of range, humane values, YAML oddities.
fn value() -> impl Strategy<Value = String> {
    let fixed = select(vec![
        "",
        "~",
        "null",
        "true",
        "false",
        "yes",
        "0",
        "-1",
        "1",
        "64",
        "65",
        "4294967295",
        "4294967296",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775809",
        "99999999999999999999999999999",
        "1e400",
        "-1e400",
        ".inf",
        "-.inf",
        ".nan",
        "0x7fffffffffffffff",
        "0o777",
        "1.5",
        "10m",
        "0s",
        "0",
        "5",
        "-5s",
        "1h 30m",
        "999999999999999999999h",
        "18446744073709551615s",
        "100MiB",
        "18446744073709551616",
        "99999999999 EiB",
        "1e30 GB",
        "0B",
        "continuous",
        "triggered",
        "table",
        "view",
        "sink",
        "window",
        "foreach_batch",
        "message_id",
        "attribute",
        "dead_letter",
        "publish_time",
        "data_interval",
        "auto",
        "projects/p/subscriptions/s",
        "projects//subscriptions/",
        "a/b/c/d/e",
        "sqlite://x.db",
        "postgres://u@h/db",
        "127.0.0.1:9464",
        ":99999",
        "[]",
        "{}",
        "[a, b, [c]]",
        "{ a: 1, b: [2] }",
        "\"a\\nb\"",
        "\"\\r\\n\\u2028\\x85\"",
        "\"\\0\"",
        "'it''s'",
        "&x value",
        "*x",
        "*nope",
        "!!str 5",
        "!!int x",
        "!!binary aGk=",
        "!custom v",
        "|\n  block\n  text",
        ">-\n  folded",
        "\"unterminated",
        "[unclosed",
        "{ unclosed: 1",
        "# comment only",
        "a: b: c",
        "- x",
        "@reserved",
        "`backtick",
        "%percent",
    ])
    .prop_map(str::to_owned);
    prop_oneof![
        6 => fixed,
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| format!("{n}ms")),
        1 => "[ -~\t]{0,40}",
        1 => any::<String>(),
        1 => (1usize..20_000).prop_map(|n| "x".repeat(n)),
        2 => quoted(),
    ]
}

/// A quoted YAML scalar whose escapes and folded line breaks put control characters and line
/// breaks into the value (`"a\nb"`, `'a` + newline + `b'`).
fn quoted() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => "[a-z_]{1,6}",
        2 => select(vec![
            "\\n", "\\r", "\\t", "\\0", "\\e", "\\a", "\\u2028", "\\u2029", "\\x85", "\\N",
            "\\L", "\\P", "\\_", "\\\"", "\\\\", "\\x7f", "\\U0001F600", " ", "\t", ":", "#",
        ])
        .prop_map(str::to_owned),
    ];
    (prop::collection::vec(piece, 0..8), any::<bool>()).prop_map(|(pieces, double)| {
        let body = pieces.concat();
        if double {
            format!("\"{body}\"")
        } else {
            // Single quotes have no escapes; a line break inside folds into a space.
            format!("'{}'", body.replace('\\', "\n ").replace('\'', "''"))
        }
    })
}

/// A key: usually a known one, sometimes a random or odd one.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(KEYS).prop_map(str::to_owned),
        1 => "[a-z_]{1,12}",
        2 => quoted(),
        1 => select(vec!["\"quoted key\"", "? complex", "<<", "\"a\\nb\"", "''", "~", "1", "[a]", "{a: 1}", "&k name", "*k"])
            .prop_map(str::to_owned),
    ]
}

/// One edit of the base file.
#[derive(Debug, Clone)]
enum Mutation {
    Delete(Index),
    Duplicate(Index),
    Replace(Index, String),
    /// Inserts `key: value` before a line, at the given indentation.
    Insert(Index, usize, String, String),
    /// Gives the key of a `key: value` line another value.
    SetValue(Index, String),
    /// Changes the indentation of a line.
    Indent(Index, usize),
    /// Inserts a character (tab, NUL, CR, BOM, ...) at a byte position of a line.
    InsertChar(Index, Index, char),
    /// Swaps two lines.
    Swap(Index, Index),
    /// Inserts `key: value` after a line, as a sibling of that line's key (same mapping).
    Sibling(Index, String, String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let odd_char = prop_oneof![
        select(vec![
            '\t', '\0', '\r', '\n', '\u{feff}', '\u{85}', '\u{2028}', ' ', ':', '-', '#', '&', '*',
            '!', '|', '>', '{', '}', '[', ']', ',', '"', '\'', '%', '@', '`', '?'
        ]),
        any::<char>(),
    ];
    prop_oneof![
        1 => any::<Index>().prop_map(Mutation::Delete),
        1 => any::<Index>().prop_map(Mutation::Duplicate),
        1 => (any::<Index>(), value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => (any::<Index>(), 0usize..12, key(), value())
            .prop_map(|(i, indent, k, v)| Mutation::Insert(i, indent, k, v)),
        1 => (any::<Index>(), value()).prop_map(|(i, v)| Mutation::SetValue(i, v)),
        1 => (any::<Index>(), 0usize..12).prop_map(|(i, n)| Mutation::Indent(i, n)),
        1 => (any::<Index>(), any::<Index>(), odd_char)
            .prop_map(|(i, at, c)| Mutation::InsertChar(i, at, c)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        3 => (any::<Index>(), key(), value()).prop_map(|(i, k, v)| Mutation::Sibling(i, k, v)),
    ]
}

fn apply(lines: &mut Vec<String>, m: &Mutation) {
    if lines.is_empty() {
        lines.push(String::new());
    }
    let n = lines.len();
    match m {
        Mutation::Delete(i) => {
            lines.remove(i.index(n));
        }
        Mutation::Duplicate(i) => {
            let at = i.index(n);
            let line = lines[at].clone();
            lines.insert(at, line);
        }
        Mutation::Replace(i, v) => lines[i.index(n)] = v.clone(),
        Mutation::Insert(i, indent, k, v) => {
            lines.insert(i.index(n + 1), format!("{}{k}: {v}", " ".repeat(*indent)));
        }
        Mutation::SetValue(i, v) => {
            let line = &mut lines[i.index(n)];
            if let Some(colon) = line.find(": ") {
                line.truncate(colon + 2);
                line.push_str(v);
            } else {
                line.push_str(": ");
                line.push_str(v);
            }
        }
        Mutation::Indent(i, indent) => {
            let line = &mut lines[i.index(n)];
            *line = format!("{}{}", " ".repeat(*indent), line.trim_start());
        }
        Mutation::InsertChar(i, at, c) => {
            let line = &mut lines[i.index(n)];
            let boundaries: Vec<usize> = line
                .char_indices()
                .map(|(b, _)| b)
                .chain([line.len()])
                .collect();
            let at = boundaries[at.index(boundaries.len())];
            line.insert(at, *c);
        }
        Mutation::Swap(a, b) => lines.swap(a.index(n), b.index(n)),
        Mutation::Sibling(i, k, v) => {
            let at = i.index(n);
            let line = &lines[at];
            let indent = line.len() - line.trim_start_matches([' ', '-']).len();
            lines.insert(at + 1, format!("{}{k}: {v}", " ".repeat(indent)));
        }
    }
}

fn mutated_base() -> impl Strategy<Value = String> {
    mutated(BASE)
}

fn mutated(base: &'static str) -> impl Strategy<Value = String> {
    (
        prop::collection::vec(mutation(), 1..6),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(mutations, crlf, trailing_newline)| {
            let mut lines: Vec<String> = base.lines().map(str::to_owned).collect();
            for m in &mutations {
                apply(&mut lines, m);
            }
            let mut text = lines.join(if crlf { "\r\n" } else { "\n" });
            if trailing_newline {
                text.push('\n');
            }
            text
        })
}

/// Soups of YAML punctuation, pipeline keys and values: syntactically near-YAML input that gets
/// further into the parser than random characters do.
fn token_soup() -> impl Strategy<Value = String> {
    let punctuation = select(vec![
        ": ",
        ":",
        "\n",
        "\n  ",
        "\n    ",
        "\n  - ",
        "- ",
        " ",
        "\t",
        "{",
        "}",
        "[",
        "]",
        ", ",
        "\"",
        "'",
        "#",
        "---\n",
        "...\n",
        "? ",
        "&a ",
        "*a",
        "&b ",
        "*b",
        "<<: ",
        "!!str ",
        "!!map ",
        "!!seq ",
        "!t ",
        "|\n",
        ">\n",
        "%YAML 1.2\n",
        "%TAG ! tag:x,2000:\n",
        "\0",
        "\r",
        "\u{feff}",
        "\\",
        "@",
    ])
    .prop_map(str::to_owned);
    let token = prop_oneof![
        3 => punctuation,
        2 => select(KEYS).prop_map(str::to_owned),
        1 => value(),
    ];
    prop::collection::vec(token, 0..80).prop_map(|tokens| tokens.concat())
}

/// Deep nesting of every kind the parser may recurse on.
fn deep() -> impl Strategy<Value = String> {
    (
        0usize..7,
        1usize..3_000,
        select(vec!["", "pipeline: p\n", "flows:\n  - depends_on: "]),
    )
        .prop_map(|(kind, depth, prefix)| {
            let nested = match kind {
                0 => format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
                1 => format!("{}{}", "{a: ".repeat(depth), "}".repeat(depth)),
                2 => "[".repeat(depth),
                3 => (0..depth.min(400))
                    .map(|d| format!("{}a:\n", "  ".repeat(d)))
                    .collect(),
                4 => (0..depth.min(400))
                    .map(|d| format!("{}-\n", "  ".repeat(d)))
                    .collect(),
                5 => format!("{}x", "- ".repeat(depth.min(400))),
                _ => format!("{}x{}", "{? [".repeat(depth), "]: 1}".repeat(depth)),
            };
            format!("{prefix}{nested}\n")
        })
}

/// Anchors and aliases: reuse, merge keys, undefined aliases and exponential alias bombs.
fn aliases() -> impl Strategy<Value = String> {
    prop_oneof![
        // A billion-laughs bomb of `levels` levels of `width` aliases each.
        (1usize..12, 2usize..10, select(vec!["x", "depends_on", "flows", "targets"])).prop_map(
            |(levels, width, key)| {
                let mut text = String::from("a0: &a0 [lol]\n");
                for l in 1..levels {
                    let refs = vec![format!("*a{}", l - 1); width].join(", ");
                    text.push_str(&format!("a{l}: &a{l} [{refs}]\n"));
                }
                text.push_str(&format!("{key}: *a{}\n", levels - 1));
                text
            }
        ),
        // Valid reuse of a whole flow through an alias, and through a merge key.
        Just(format!(
            "{BASE}  - &again {{ name: again, target: events, source: {{ table: events }} }}\n  - *again\n"
        )),
        Just(format!("{BASE}  - <<: *nope\n    name: x\n")),
        Just("base: &b { name: t, kind: table }\ntargets:\n  - <<: *b\n    name: u\n".to_owned()),
        Just("pipeline: &p orders\nflows: [{ name: *p, target: *p, source: { table: *p } }]\ntargets: [{ name: *p, kind: table }]\n".to_owned()),
        Just("pipeline: *p\n".to_owned()),
        Just("&a pipeline: *a\n".to_owned()),
        Just("pipeline: &a [*a]\n".to_owned()),
        // Random placement of anchors and aliases in the base file.
        (prop::collection::vec((any::<Index>(), select(vec!["&a ", "*a", "&b ", "*b ", "<<: *a", "&a [*a]"])), 1..5))
            .prop_map(|edits| {
                let mut lines: Vec<String> = BASE.lines().map(str::to_owned).collect();
                for (i, edit) in edits {
                    let n = lines.len();
                    let line = &mut lines[i.index(n)];
                    match line.find(": ") {
                        Some(colon) => line.insert_str(colon + 2, edit),
                        None => line.push_str(&format!(" {edit}")),
                    }
                }
                lines.join("\n") + "\n"
            }),
    ]
}

/// Very long strings: as a value, a key, a comment, a line, or many lines.
fn long() -> impl Strategy<Value = String> {
    (
        0usize..6,
        100_000usize..1_000_000,
        select(vec!['x', ' ', '\t', '\0', 'é', '\n', '-', '[']),
    )
        .prop_map(|(kind, n, c)| {
            let s: String = std::iter::repeat_n(c, n).collect();
            match kind {
                0 => format!("pipeline: {s}\n"),
                1 => format!("{s}: 1\n"),
                2 => format!("# {s}\npipeline: p\n"),
                3 => format!("pipeline: \"{s}\"\n"),
                4 => BASE.replace("events-sub", &s),
                _ => "a: 1\n".repeat(n / 5),
            }
        })
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_strings(text in any::<String>()) {
        check(&text)?;
    }

    #[test]
    fn arbitrary_bytes_as_lossy_utf8(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        check(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn printable_ascii_with_line_breaks(text in "[ -~\t\r\n]{0,300}") {
        check(&text)?;
    }

    #[test]
    fn token_soups(text in token_soup()) {
        check(&text)?;
    }

    #[test]
    fn token_soups_after_the_base(soup in token_soup(), at in any::<Index>()) {
        let lines: Vec<&str> = BASE.lines().collect();
        let at = at.index(lines.len() + 1);
        let text = format!("{}\n{soup}\n{}", lines[..at].join("\n"), lines[at..].join("\n"));
        check(&text)?;
    }

    #[test]
    fn mutations_of_a_valid_file(text in mutated_base()) {
        check(&text)?;
    }

    #[test]
    fn anchors_and_aliases(text in aliases()) {
        check(&text)?;
    }

    #[test]
    fn mutations_of_a_valid_typed_file(text in mutated(TYPED)) {
        check(&text)?;
    }

    #[test]
    fn arbitrary_expressions(expression in sql_soup(), slot in 0..3usize) {
        // Into `where:`, a `select:` value or an expectation's check, quoted as YAML.
        let quoted = format!("{expression:?}");
        let text = match slot {
            0 => TYPED.replace("\"amount > 0 AND ts >= '2026-01-01'\"", &quoted),
            1 => TYPED.replace("\"CAST(amount * 100 AS integer)\"", &quoted),
            _ => TYPED.replace("\"cents < 100000\"", &quoted),
        };
        check(&text)?;
    }
}

/// Soups of SQL tokens, names of the file's columns and fields, and stray characters.
fn sql_soup() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        select(vec![
            "amount",
            "cents",
            "region",
            "ts",
            "order_id",
            "_sluice_attributes",
            "_sluice_data",
            "CAST",
            "AS",
            "integer",
            "numeric",
            "text",
            "(",
            ")",
            ",",
            "+",
            "-",
            "*",
            "/",
            "%",
            "||",
            "->>",
            "->",
            "::",
            "=",
            "<>",
            "<",
            ">=",
            "AND",
            "OR",
            "NOT",
            "IS",
            "NULL",
            "IN",
            "BETWEEN",
            "LIKE",
            "CASE",
            "WHEN",
            "THEN",
            "ELSE",
            "END",
            "coalesce",
            "upper",
            "round",
            "'eu'",
            "'",
            "\"",
            "1",
            "2.5",
            "1e9",
            "TRUE",
            "SELECT",
            "FROM",
            ";",
            "--",
            "/*",
            "$1",
            "?",
            "now()",
        ])
        .prop_map(str::to_owned),
        "[ -~]{0,4}",
    ];
    prop::collection::vec(token, 0..24).prop_map(|tokens| tokens.join(" "))
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn deep_nesting(text in deep()) {
        check(&text)?;
    }
}

proptest! {
    #![proptest_config(config(12))]

    #[test]
    fn very_long_strings(text in long()) {
        check(&text)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed inputs worth keeping whatever the random ones turn up
// ---------------------------------------------------------------------------------------------

#[test]
fn the_base_file_is_valid() {
    parse(BASE, Path::new("p.yaml")).unwrap();
    parse(TYPED, Path::new("p.yaml")).unwrap();
}

#[test]
fn edge_inputs() {
    for text in [
        "",
        "\n",
        "\0",
        "\t",
        "\r",
        "\u{feff}",
        "---",
        "...",
        "--- \n--- \n",
        "pipeline: orders\n---\npipeline: other\n",
        "pipeline:\tp\n",
        "\tpipeline: p\n",
        "pipeline: p\0\n",
        "pipeline: p\r\rflows: [\r",
        "pipeline: p\u{2028}flows: [\u{2028}",
        "pipeline: p\u{85}flows: [\u{85}",
    ] {
        check(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    }
}

/// Found by `mutations_of_a_valid_file`: a quoted key with an escaped line break, `"\n": `,
/// gave an `UNKNOWN_KEY` whose path was `"\n"`, so the error printed on two lines.
#[test]
fn regression_line_break_in_an_unknown_key_prints_on_one_line() {
    for (text, line) in [
        ("pipeline: orders\n\"\\n\": \n", 2),
        ("\"a\\nb\": 1\n", 1),
        ("pipeline: p\nflows:\n  - \"na\\r\\nme\": x\n", 3),
    ] {
        let errors = parse(text, Path::new("p.yaml")).unwrap_err();
        let shown = errors.to_string();
        assert_eq!(shown.lines().count(), 1, "{text:?}: {shown}");
        assert!(!shown.contains('\r'), "{text:?}: {shown}");
        let e = &errors.0[0];
        assert!(!e.path.contains(['\n', '\r']), "{e:?}");
        assert_eq!(e.code.as_str(), "UNKNOWN_KEY", "{e:?}");
        assert_eq!(e.line, Some(line), "{e:?}");
        check(text).unwrap();
    }
    // The file name is the caller's, but the error must still print as one line.
    let shown = parse("mood: x\n", Path::new("a\nb.yaml"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        shown,
        "a b.yaml:1:1: UNKNOWN_KEY: mood: unknown key `mood`; expected one of: pipeline, mode, store, pubsub, metrics, control, dead_letter, schedule, give_up_after, targets, flows"
    );
}
