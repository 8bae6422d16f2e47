//! Every error code a pipeline file can trigger, through the real binary: `sluice validate` on
//! the fixtures in `tests/data/invalid/<code>.yaml` (one per code, UNREADABLE excepted: its
//! fixture is a path that does not exist) prints `FILE:LINE:COL: CODE: PATH: message` on stderr
//! and exits 2. Also: the JSON report, several problems reported at once, continuous versus
//! triggered predecessors, `sluice run` refusing an invalid graph before anything runs, and
//! `sluice graph` on the backfill-then-live fixture `tests/data/backfill_then_live.yaml`.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{CommandOutput, Workdir, sluice_command_within};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long one `sluice` command may take before the test gives up on it (none waits on
/// anything: a hang means the file was not rejected up front).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The codes of `sluice_pipeline::ErrorCode` that a pipeline file can trigger in `sluice
/// validate`; each needs a row in [`CASES`]. (`NOT_BUILT` is `sluice run`'s: a valid file that
/// asks for what is not built; `pipeline/tests/not_built.rs` and `cli.rs` test it.)
const ALL_CODES: [&str; 19] = [
    "UNKNOWN_KEY",
    "INVALID_DURATION",
    "INVALID_SIZE",
    "INVALID_VALUE",
    "MISSING_FIELD",
    "DUPLICATE_NAME",
    "DUPLICATE_KEY",
    "UNKNOWN_TARGET",
    "UNKNOWN_FLOW",
    "INVALID_SCHEDULE",
    "INVALID_IDENTIFIER",
    "UNREADABLE",
    "SYNTAX",
    "DEPENDS_ON_CYCLE",
    "DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE",
    "DEPENDS_ON_PREDECESSOR_WRITES_TO_VIEW",
    "FOREACH_BATCH_CANNOT_BE_ONCE",
    "FOREACH_BATCH_PREDECESSOR",
    "SUBSCRIPTION_SHARED",
];

/// What `sluice validate` must say about the fixture `invalid/<code in lower case>.yaml`.
struct Case {
    code: &'static str,
    /// 1-based line and column; `None` for a problem of the whole file.
    at: Option<(usize, usize)>,
    /// The path inside the file; empty for the whole file.
    path: &'static str,
    /// A fragment of the message.
    says: &'static str,
    /// Other codes reported at the same place and path (the fixture cannot avoid them).
    along_with: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        code: "UNKNOWN_KEY",
        at: Some((13, 9)),
        path: "flows[0].source.pubsub.dedupe",
        says: "unknown key `dedupe`; expected one of: subscription, dedup,",
        along_with: &[],
    },
    Case {
        code: "INVALID_DURATION",
        at: Some((13, 62)),
        path: "flows[0].source.pubsub.dedup.window",
        says: "`ten minutes` is not a duration",
        along_with: &[],
    },
    Case {
        code: "INVALID_SIZE",
        at: Some((15, 34)),
        path: "flows[0].source.pubsub.flow_control.max_outstanding_bytes",
        says: "`100 parsecs` is not a size",
        along_with: &[],
    },
    Case {
        code: "INVALID_VALUE",
        at: Some((7, 11)),
        path: "targets[0].kind",
        says: "`tabel` is not one of: table, view, sink, window, foreach_batch",
        along_with: &[],
    },
    Case {
        code: "MISSING_FIELD",
        // The mapping that lacks the key: `pubsub:`.
        at: Some((11, 7)),
        path: "flows[0].source.pubsub.subscription",
        says: "`subscription` is required",
        along_with: &[],
    },
    Case {
        code: "DUPLICATE_NAME",
        at: Some((11, 11)),
        path: "flows[1].name",
        says: "flow `events_live` is already declared at flows[0] (line 8)",
        along_with: &[],
    },
    Case {
        code: "DUPLICATE_KEY",
        // The second `once`.
        at: Some((11, 5)),
        path: "flows[0].once",
        says: "key `once` appears twice in the same mapping",
        along_with: &[],
    },
    Case {
        code: "UNKNOWN_TARGET",
        at: Some((9, 13)),
        path: "flows[0].target",
        says: "no target named `evnts` (declared: events)",
        along_with: &[],
    },
    Case {
        code: "UNKNOWN_FLOW",
        at: Some((14, 17)),
        path: "flows[1].depends_on",
        says: "no flow named `events_backfil`",
        along_with: &[],
    },
    Case {
        code: "INVALID_SCHEDULE",
        at: Some((4, 1)),
        path: "schedule",
        says: "a schedule is only allowed with `mode: triggered`",
        along_with: &[],
    },
    Case {
        code: "INVALID_IDENTIFIER",
        at: Some((8, 11)),
        path: "flows[0].name",
        says: "`events-live` is not an identifier",
        along_with: &[],
    },
    Case {
        code: "UNREADABLE",
        at: None,
        path: "",
        says: "cannot read the pipeline file",
        along_with: &[],
    },
    Case {
        code: "SYNTAX",
        // The `[` that is never closed.
        at: Some((7, 8)),
        path: "flows",
        says: "unclosed bracket",
        along_with: &[],
    },
    Case {
        code: "DEPENDS_ON_CYCLE",
        at: Some((10, 17)),
        path: "flows[0].depends_on",
        says: "cycle a -> b -> c -> a: ",
        along_with: &[],
    },
    Case {
        code: "DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE",
        at: Some((14, 17)),
        path: "flows[1].depends_on",
        says: "predecessor `events_live` is not a `once` flow",
        along_with: &[],
    },
    Case {
        code: "DEPENDS_ON_PREDECESSOR_WRITES_TO_VIEW",
        at: Some((15, 18)),
        path: "flows[1].depends_on[0]",
        says: "predecessor `recent_fill` writes to `recent`, a view",
        along_with: &[],
    },
    Case {
        code: "FOREACH_BATCH_CANNOT_BE_ONCE",
        at: Some((12, 11)),
        path: "flows[0].once",
        says: "`enrich_all` writes to `enrich`, a foreach_batch target",
        along_with: &[],
    },
    Case {
        code: "FOREACH_BATCH_PREDECESSOR",
        at: Some((17, 9)),
        path: "flows[1].depends_on[0]",
        says: "predecessor `enrich_live` writes to `enrich`, a foreach_batch target",
        // A foreach_batch writer cannot be `once` (FOREACH_BATCH_CANNOT_BE_ONCE), so in
        // continuous mode it is always a live predecessor too.
        along_with: &["DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE"],
    },
    Case {
        code: "SUBSCRIPTION_SHARED",
        at: Some((17, 23)),
        path: "flows[1].source.pubsub.subscription",
        says: "flows `events_live` and `audit_live` both read subscription \
               `projects/demo/subscriptions/events-sub`",
        along_with: &[],
    },
];

/// The codes whose fixtures are only wrong as a graph: the file itself is well-formed.
const GRAPH_CODES: [&str; 5] = [
    "DEPENDS_ON_CYCLE",
    "DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE",
    "DEPENDS_ON_PREDECESSOR_WRITES_TO_VIEW",
    "FOREACH_BATCH_CANNOT_BE_ONCE",
    "FOREACH_BATCH_PREDECESSOR",
];

/// The fixture with five problems that are all reported together.
const SEVERAL_PROBLEMS: &str = "several_problems.yaml";

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data")
}

fn fixture(code: &str) -> PathBuf {
    data()
        .join("invalid")
        .join(format!("{}.yaml", code.to_lowercase()))
}

fn case(code: &str) -> &'static Case {
    CASES.iter().find(|c| c.code == code).unwrap()
}

/// Runs `sluice ARGS` in `cwd`; panics past [`COMMAND_TIMEOUT`].
fn sluice(args: &[&str], cwd: &Path) -> CommandOutput {
    sluice_command_within(args, Some(cwd), COMMAND_TIMEOUT)
}

/// `sluice validate -c FILE [--format json]` in a scratch folder.
fn validate(file: &Path, json: bool) -> CommandOutput {
    let dir = Workdir::new();
    let mut args = vec!["validate", "-c", file.to_str().unwrap()];
    if json {
        args.extend(["--format", "json"]);
    }
    sluice(&args, dir.path())
}

/// The start of the stderr line for `code` at `at` and `path` in `file`.
fn prefix(file: &Path, at: Option<(usize, usize)>, code: &str, path: &str) -> String {
    let mut out = file.display().to_string();
    if let Some((line, column)) = at {
        out.push_str(&format!(":{line}:{column}"));
    }
    out.push_str(&format!(": {code}: "));
    if !path.is_empty() {
        out.push_str(&format!("{path}: "));
    }
    out
}

/// What is wrong with `sluice validate` on the fixture of `case`; empty when all is right.
fn check(case: &Case) -> Vec<String> {
    let file = fixture(case.code);
    let mut wrong = Vec::new();
    let out = validate(&file, false);
    if out.code != 2 {
        wrong.push(format!("exit code {:?}, expected 2", out.code));
    }
    if !out.stdout.is_empty() {
        wrong.push(format!("stdout is not empty: {:?}", out.stdout));
    }
    let lines = out.stderr.lines().collect::<Vec<_>>();
    if lines.len() != 1 + case.along_with.len() {
        wrong.push(format!(
            "{} error lines, expected {}",
            lines.len(),
            1 + case.along_with.len()
        ));
    }
    let main = prefix(&file, case.at, case.code, case.path);
    match lines.iter().find(|l| l.starts_with(&main)) {
        Some(line) if !line.contains(case.says) => {
            wrong.push(format!("the message does not say {:?}", case.says));
        }
        Some(_) => {}
        None => wrong.push(format!("no line starts with {main:?}")),
    }
    for other in case.along_with {
        let expected = prefix(&file, case.at, other, case.path);
        if !lines.iter().any(|l| l.starts_with(&expected)) {
            wrong.push(format!("no line starts with {expected:?}"));
        }
    }
    if wrong.is_empty() {
        return wrong;
    }
    vec![format!(
        "{}: {}\n  stderr: {}",
        case.code,
        wrong.join("; "),
        out.stderr.trim_end().replace('\n', "\n          ")
    )]
}

#[test]
fn the_table_covers_every_code_and_every_fixture() {
    let mut covered: Vec<&str> = CASES.iter().map(|c| c.code).collect();
    covered.sort_unstable();
    let mut all = ALL_CODES.to_vec();
    all.sort_unstable();
    assert_eq!(covered, all, "one row per code, no more");
    // Each fixture states its code on its first line; UNREADABLE's must not exist.
    for case in CASES {
        let file = fixture(case.code);
        if case.code == "UNREADABLE" {
            assert!(!file.exists(), "{} must not exist", file.display());
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let first = text.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("# {}: ", case.code)),
            "{}: first line {first:?}",
            file.display()
        );
    }
    // No fixture without a test.
    for entry in std::fs::read_dir(data().join("invalid")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let known = name == SEVERAL_PROBLEMS
            || CASES
                .iter()
                .any(|c| format!("{}.yaml", c.code.to_lowercase()) == name);
        assert!(known, "tests/data/invalid/{name} is used by no test");
    }
}

#[test]
fn validate_reports_each_code_with_its_file_line_column_and_path() {
    let wrong: Vec<String> = CASES.iter().flat_map(check).collect();
    assert!(
        wrong.is_empty(),
        "{} of {} codes are not reported as expected:\n{}",
        wrong.len(),
        CASES.len(),
        wrong.join("\n")
    );
}

/// `sluice validate --format json` on `code`'s fixture: one error, as in [`CASES`].
fn check_json(code: &str) {
    let case = case(code);
    let file = fixture(code);
    let out = validate(&file, true);
    assert_eq!(out.code, 2, "{}{}", out.stdout, out.stderr);
    assert_eq!(
        out.stdout.lines().count(),
        1,
        "one JSON document: {}",
        out.stdout
    );
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["valid"], false, "{report}");
    let errors = report["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{report}");
    let e = &errors[0];
    let (line, column) = case.at.unwrap();
    assert_eq!(e["code"], code, "{e}");
    assert_eq!(e["path"], case.path, "{e}");
    assert_eq!(e["line"], line, "{e}");
    assert_eq!(e["column"], column, "{e}");
    assert_eq!(e["file"], file.to_str().unwrap(), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains(case.says),
        "{e}: should say {:?}",
        case.says
    );
}

#[test]
fn validate_json_reports_a_cycle() {
    check_json("DEPENDS_ON_CYCLE");
}

#[test]
fn validate_json_reports_an_unknown_key() {
    check_json("UNKNOWN_KEY");
}

#[test]
fn validate_json_of_a_valid_file() {
    let out = validate(&data().join("backfill_then_live.yaml"), true);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report, serde_json::json!({ "valid": true, "errors": [] }));
}

#[test]
fn several_problems_are_reported_at_once_in_file_order() {
    let file = data().join("invalid").join(SEVERAL_PROBLEMS);
    let out = validate(&file, false);
    assert_eq!(out.code, 2, "{}", out.stderr);
    let expected = [
        (4, 11, "INVALID_IDENTIFIER", "pipeline", "`Orders`"),
        (15, 13, "UNKNOWN_TARGET", "flows[1].target", "`evnts`"),
        (
            16,
            17,
            "UNKNOWN_FLOW",
            "flows[1].depends_on",
            "`events_backfil`",
        ),
        (
            20,
            62,
            "INVALID_DURATION",
            "flows[1].source.pubsub.dedup.window",
            "`10x`",
        ),
        (
            23,
            17,
            "DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE",
            "flows[2].depends_on",
            "`events_live`",
        ),
    ];
    let lines = out.stderr.lines().collect::<Vec<_>>();
    assert_eq!(
        lines.len(),
        expected.len(),
        "one line each:\n{}",
        out.stderr
    );
    for (got, (line, column, code, path, names)) in lines.iter().zip(expected) {
        let start = prefix(&file, Some((line, column)), code, path);
        assert!(
            got.starts_with(&start) && got.contains(names),
            "expected {start:?}... naming {names}, got {got:?}"
        );
    }
}

#[test]
fn validate_checks_a_file_sources_max_record_bytes() {
    let dir = Workdir::new();
    let file = dir.path().join("p.yaml");
    let flow = |name: &str, size: &str| {
        format!(
            "  - name: {name}\n    target: events\n    once: true\n    source: {{ file: {{ path: \
             \"in/*.jsonl\", max_record_bytes: {size} }} }}\n"
        )
    };
    let text = format!(
        "pipeline: orders\nmode: triggered\ntargets:\n  - {{ name: events, kind: table }}\n\
         flows:\n{}{}{}",
        flow("small", "1KiB"),
        flow("none", "0"),
        flow("huge", "2GB"),
    );
    std::fs::write(&file, text).unwrap();
    let out = validate(&file, false);
    assert_eq!(out.code, 2, "{}", out.stderr);
    let lines = out.stderr.lines().collect::<Vec<_>>();
    let expected = [
        (13, 61, "flows[1]", "must be at least 1 byte(s)"),
        (17, 61, "flows[2]", "must be at most 1000000000 bytes"),
    ];
    assert_eq!(lines.len(), expected.len(), "{}", out.stderr);
    for (got, (line, column, flow, says)) in lines.iter().zip(expected) {
        let path = format!("{flow}.source.file.max_record_bytes");
        let start = prefix(&file, Some((line, column)), "INVALID_SIZE", &path);
        assert!(
            got.starts_with(&start) && got.ends_with(says),
            "expected {start:?}...{says:?}, got {got:?}"
        );
    }
}

#[test]
fn a_live_predecessor_is_rejected_in_continuous_mode_and_accepted_in_triggered_mode() {
    let continuous = fixture("DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE");
    let text = std::fs::read_to_string(&continuous).unwrap();
    assert!(text.contains("\nmode: continuous\n"), "{text}");
    let out = validate(&continuous, false);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE: flows[1].depends_on: "),
        "{}",
        out.stderr
    );

    let dir = Workdir::new();
    let triggered = dir.path().join("triggered.yaml");
    std::fs::write(
        &triggered,
        text.replace("\nmode: continuous\n", "\nmode: triggered\n"),
    )
    .unwrap();
    let out = validate(&triggered, false);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!("{}: valid (2 targets, 2 flows)\n", triggered.display())
    );
    assert_eq!(out.stderr, "");
}

#[test]
fn run_refuses_an_invalid_graph_before_anything_runs() {
    for code in GRAPH_CODES {
        let file = fixture(code);
        let expected = validate(&file, false);
        assert_eq!(expected.code, 2, "{}", expected.stderr);
        // The store is `sqlite://state/orders.db`, relative to the working directory: running
        // anything would create `state/` there.
        let cwd = Workdir::new();
        let out = sluice(&["run", "-c", file.to_str().unwrap()], cwd.path());
        assert_eq!(out.code, 2, "{code}: {}", out.stderr);
        assert_eq!(
            out.stderr, expected.stderr,
            "{code}: the errors of `validate`"
        );
        assert_eq!(out.stdout, "", "{code}");
        let left: Vec<_> = std::fs::read_dir(cwd.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{code}: created {left:?}");
    }
}

#[test]
fn graph_draws_backfill_then_live_in_every_format_without_creating_the_store() {
    let file = data().join("backfill_then_live.yaml");
    let expected = [
        (
            "text",
            "\
events_backfill [once -> events]
events_live [continuous -> events] <- events_backfill (depends_on)
",
        ),
        (
            "dot",
            r#"digraph "orders" {
  rankdir=LR;
  node [shape=box];
  "events_backfill" [label="events_backfill\nonce -> events", shape=ellipse];
  "events_live" [label="events_live\ncontinuous -> events"];
  "events_backfill" -> "events_live";
}
"#,
        ),
        (
            "mermaid",
            r#"flowchart LR
  f0(["events_backfill<br/>once -> events"])
  f1["events_live<br/>continuous -> events"]
  f0 --> f1
"#,
        ),
    ];
    let cwd = Workdir::new();
    for (format, drawing) in expected {
        let out = sluice(
            &["graph", "-c", file.to_str().unwrap(), "--format", format],
            cwd.path(),
        );
        assert_eq!(out.code, 0, "{format}: {}", out.stderr);
        assert_eq!(out.stdout, drawing, "{format}");
        assert!(
            !cwd.path().join("state").exists(),
            "{format}: drawing created the store's folder"
        );
    }
    // Text is the default.
    let out = sluice(&["graph", "-c", file.to_str().unwrap()], cwd.path());
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, expected[0].1);
    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "graph created {left:?}");
}
