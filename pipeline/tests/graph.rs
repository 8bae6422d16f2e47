//! The flow-graph checks of SPEC §6 (each code with its path, line and message) and the
//! renderings of `sluice graph`.

use std::collections::HashMap;
use std::path::Path;

use sluice_pipeline::graph::{EdgeKind, FlowGraph, render_dot, render_mermaid, render_text};
use sluice_pipeline::{ConfigError, ErrorCode, Pipeline, load, parse};

/// Lines 1 to 7 of every file below; `flows` starts with `flows:` on line 8.
fn file(mode: &str, flows: &str) -> String {
    format!(
        "\
pipeline: shop
mode: {mode}
targets:
  - {{ name: events, kind: table }}
  - {{ name: counts, kind: table }}
  - {{ name: recent, kind: view }}
  - {{ name: enrich, kind: foreach_batch, foreach_batch: {{ endpoint: http://127.0.0.1:7001 }} }}
{flows}"
    )
}

fn valid(text: &str) -> Pipeline {
    match parse(text, Path::new("p.yaml")) {
        Ok(p) => p,
        Err(e) => panic!("expected a valid file, got:\n{e}"),
    }
}

fn errors(text: &str) -> Vec<ConfigError> {
    match parse(text, Path::new("p.yaml")) {
        Ok(p) => panic!("expected errors, got {p:?}"),
        Err(e) => e.0,
    }
}

/// Exactly one error, with this code, path and line, whose message contains `says`.
fn one(text: &str, code: ErrorCode, path: &str, line: usize, says: &str) -> ConfigError {
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let e = errs.into_iter().next().expect("one error");
    assert_eq!(
        (e.code, e.path.as_str(), e.line),
        (code, path, Some(line)),
        "{e}"
    );
    assert!(e.column.is_some(), "{e}");
    assert!(e.message.contains(says), "{e}");
    e
}

/// `live_a` is not `once`; `live_b` depends on it (line 12).
const LIVE_PREDECESSOR: &str = "\
flows:
  - name: live_a
    target: events
    source: { pubsub: { subscription: a } }
  - name: live_b
    target: counts
    depends_on: live_a
    source: { pubsub: { subscription: b } }
";

#[test]
fn continuous_mode_rejects_a_live_predecessor() {
    let e = one(
        &file("continuous", LIVE_PREDECESSOR),
        ErrorCode::DependsOnPredecessorMustBeOnce,
        "flows[1].depends_on",
        14,
        "predecessor `live_a` is not a `once` flow",
    );
    assert_eq!(e.column, Some(17));
    assert!(e.message.contains("`mode: triggered` allows"), "{e}");
    assert!(
        e.to_string().starts_with(
            "p.yaml:14:17: DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE: flows[1].depends_on: "
        ),
        "{e}"
    );
}

#[test]
fn triggered_mode_accepts_the_same_graph() {
    let p = valid(&file("triggered", LIVE_PREDECESSOR));
    let g = FlowGraph::new(&p);
    assert_eq!(
        g.predecessors("live_b"),
        vec![("live_a", EdgeKind::DependsOn)]
    );
    assert_eq!(g.waits_for("live_b"), vec!["live_a"]);
}

#[test]
fn cycle_of_three_flows() {
    let flows = "\
flows:
  - name: a
    target: events
    once: true
    depends_on: c
    source: { file: { path: a/*.jsonl } }
  - name: b
    target: events
    once: true
    depends_on: [a]
    source: { file: { path: b/*.jsonl } }
  - name: c
    target: counts
    once: true
    depends_on:
      - b
    source: { file: { path: c/*.jsonl } }
";
    let e = one(
        &file("continuous", flows),
        ErrorCode::DependsOnCycle,
        "flows[0].depends_on",
        12,
        "cycle a -> b -> c -> a: each flow waits for the one before it",
    );
    assert_eq!(e.column, Some(17));
    // Triggered mode allows any predecessor, but not a cycle.
    one(
        &file("triggered", flows),
        ErrorCode::DependsOnCycle,
        "flows[0].depends_on",
        12,
        "cycle a -> b -> c -> a:",
    );
}

#[test]
fn a_flow_depending_on_itself_is_a_cycle_and_nothing_else() {
    // Not `once` in continuous mode either: the cycle is the only error.
    let flows = "\
flows:
  - name: me
    target: events
    depends_on: [me]
    source: { pubsub: { subscription: s } }
";
    let e = one(
        &file("continuous", flows),
        ErrorCode::DependsOnCycle,
        "flows[0].depends_on[0]",
        11,
        "cycle me -> me:",
    );
    assert_eq!(e.column, Some(18));
}

#[test]
fn data_edges_close_cycles_too() {
    // `count` reads `events`, which `replay` writes; `replay` reads `counts`, which `count`
    // writes. Neither is `once`: continuous mode would not wait on these edges, and still the
    // loop is rejected.
    let flows = "\
flows:
  - name: count
    target: counts
    source: { table: events }
  - name: replay
    target: events
    source: { table: counts }
";
    let e = one(
        &file("continuous", flows),
        ErrorCode::DependsOnCycle,
        "flows[0].source.table",
        11,
        "cycle count -> replay -> count:",
    );
    assert_eq!(e.column, Some(22));
    // A flow that reads the table it writes waits for itself.
    one(
        &file(
            "triggered",
            "flows:\n  - name: echo\n    target: events\n    source: { table: events }\n",
        ),
        ErrorCode::DependsOnCycle,
        "flows[0].source.table",
        11,
        "cycle echo -> echo:",
    );
}

#[test]
fn one_error_per_cycle() {
    let flows = "\
flows:
  - name: a
    target: events
    once: true
    depends_on: b
    source: { file: { path: a/*.jsonl } }
  - name: b
    target: events
    once: true
    depends_on: a
    source: { file: { path: b/*.jsonl } }
  - name: c
    target: counts
    once: true
    depends_on: [a, c]
    source: { file: { path: c/*.jsonl } }
";
    let errs = errors(&file("continuous", flows));
    let got: Vec<(ErrorCode, &str, Option<usize>)> = errs
        .iter()
        .map(|e| (e.code, e.path.as_str(), e.line))
        .collect();
    assert_eq!(
        got,
        vec![
            (ErrorCode::DependsOnCycle, "flows[0].depends_on", Some(12)),
            (
                ErrorCode::DependsOnCycle,
                "flows[2].depends_on[1]",
                Some(22)
            ),
        ]
    );
    assert!(
        errs[0].message.starts_with("cycle a -> b -> a:"),
        "{}",
        errs[0]
    );
    assert!(errs[1].message.starts_with("cycle c -> c:"), "{}", errs[1]);
}

#[test]
fn predecessor_writing_to_a_view() {
    let flows = "\
flows:
  - name: fill_recent
    target: recent
    once: true
    source: { file: { path: r/*.jsonl } }
  - name: after
    target: events
    depends_on: [fill_recent]
    source: { pubsub: { subscription: s } }
";
    for mode in ["continuous", "triggered"] {
        one(
            &file(mode, flows),
            ErrorCode::DependsOnPredecessorWritesToView,
            "flows[1].depends_on[0]",
            15,
            "predecessor `fill_recent` writes to `recent`, a view",
        );
    }
}

#[test]
fn foreach_batch_cannot_be_once() {
    let flows = "\
flows:
  - name: enrich_all
    target: enrich
    once: true
    source: { file: { path: e/*.jsonl } }
";
    let e = one(
        &file("triggered", flows),
        ErrorCode::ForeachBatchCannotBeOnce,
        "flows[0].once",
        11,
        "`enrich_all` writes to `enrich`, a foreach_batch target",
    );
    assert_eq!(e.column, Some(11));
}

#[test]
fn foreach_batch_predecessor_in_continuous_mode() {
    let flows = "\
flows:
  - name: enrich_live
    target: enrich
    source: { pubsub: { subscription: e } }
  - name: after
    target: events
    depends_on:
      - enrich_live
    source: { pubsub: { subscription: s } }
";
    let errs = errors(&file("continuous", flows));
    let got: Vec<(ErrorCode, &str, Option<usize>)> = errs
        .iter()
        .map(|e| (e.code, e.path.as_str(), e.line))
        .collect();
    // Not `once` either: both errors, at the same place.
    assert_eq!(
        got,
        vec![
            (
                ErrorCode::DependsOnPredecessorMustBeOnce,
                "flows[1].depends_on[0]",
                Some(15)
            ),
            (
                ErrorCode::ForeachBatchPredecessor,
                "flows[1].depends_on[0]",
                Some(15)
            ),
        ]
    );
    assert!(
        errs[1]
            .message
            .contains("predecessor `enrich_live` writes to `enrich`, a foreach_batch target"),
        "{}",
        errs[1]
    );
    valid(&file("triggered", flows));
}

#[test]
fn unknown_references_are_not_checked_again() {
    let flows = "\
flows:
  - name: live
    target: events
    depends_on: [ghost]
    source: { pubsub: { subscription: s } }
  - name: reader
    target: counts
    source: { table: nowhere }
";
    let errs = errors(&file("continuous", flows));
    let codes: Vec<ErrorCode> = errs.iter().map(|e| e.code).collect();
    assert_eq!(
        codes,
        vec![ErrorCode::UnknownFlow, ErrorCode::UnknownTarget]
    );
}

fn spec_example() -> Pipeline {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/orders.yaml");
    load(&path).expect("the SPEC §4 example is valid")
}

fn states() -> HashMap<String, String> {
    [("events_backfill", "COMPLETED"), ("events_live", "RUNNING")]
        .into_iter()
        .map(|(f, s)| (f.to_owned(), s.to_owned()))
        .collect()
}

#[test]
fn the_spec_example_has_both_kinds_of_edge() {
    let g = FlowGraph::new(&spec_example());
    assert_eq!(
        g.predecessors("per_minute_counts"),
        vec![
            ("events_backfill", EdgeKind::Data),
            ("events_live", EdgeKind::Data)
        ]
    );
    assert_eq!(
        g.successors("events_backfill"),
        vec![
            ("events_live", EdgeKind::DependsOn),
            ("per_minute_counts", EdgeKind::Data)
        ]
    );
    assert_eq!(
        g.topological_order(),
        vec!["events_backfill", "events_live", "per_minute_counts"]
    );
    // Continuous: the live writer of `events` does not hold `per_minute_counts` back.
    assert_eq!(g.waits_for("per_minute_counts"), vec!["events_backfill"]);
}

#[test]
fn renders_text() {
    let g = FlowGraph::new(&spec_example());
    assert_eq!(
        render_text(&g, &states()),
        "\
events_backfill [once -> events]: COMPLETED
events_live [continuous -> events] <- events_backfill (depends_on): RUNNING
per_minute_counts [continuous -> per_minute] <- events_backfill (data), events_live (data)
"
    );
}

#[test]
fn renders_dot() {
    let g = FlowGraph::new(&spec_example());
    assert_eq!(
        render_dot(&g, &states()),
        r#"digraph "orders" {
  rankdir=LR;
  node [shape=box];
  "events_backfill" [label="events_backfill\nonce -> events\nCOMPLETED", shape=ellipse];
  "events_live" [label="events_live\ncontinuous -> events\nRUNNING"];
  "per_minute_counts" [label="per_minute_counts\ncontinuous -> per_minute"];
  "events_backfill" -> "events_live";
  "events_backfill" -> "per_minute_counts" [style=dashed, label="data"];
  "events_live" -> "per_minute_counts" [style=dashed, label="data"];
}
"#
    );
}

#[test]
fn renders_mermaid() {
    let g = FlowGraph::new(&spec_example());
    assert_eq!(
        render_mermaid(&g, &states()),
        r#"flowchart LR
  f0(["events_backfill<br/>once -> events<br/>COMPLETED"])
  f1["events_live<br/>continuous -> events<br/>RUNNING"]
  f2["per_minute_counts<br/>continuous -> per_minute"]
  f0 --> f1
  f0 -.data.-> f2
  f1 -.data.-> f2
"#
    );
    // Without states, and the same every time.
    let plain = render_mermaid(&g, &HashMap::new());
    assert!(!plain.contains("RUNNING"));
    assert_eq!(plain, render_mermaid(&g, &HashMap::new()));
}
