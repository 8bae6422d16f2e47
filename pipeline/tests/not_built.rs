//! What `sluice run` refuses in a valid file (`load_for_run`, `NOT_BUILT`), and what it runs.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_pipeline::{ConfigErrors, ErrorCode, parse, parse_for_run};
use std::path::Path;

fn not_built(yaml: &str) -> Vec<String> {
    parse(yaml, Path::new("p.yaml")).expect("the file is valid");
    match parse_for_run(yaml, Path::new("p.yaml")) {
        Ok(_) => Vec::new(),
        Err(ConfigErrors(errors)) => errors
            .iter()
            .map(|e| {
                assert_eq!(e.code, ErrorCode::NotBuilt, "{e}");
                assert!(e.line.is_some(), "located: {e}");
                e.to_string()
            })
            .collect(),
    }
}

/// A pipeline whose `events` table is written by `writers` (YAML flow entries) and counted by
/// the window flow `counts` (`counts_extra`: more keys of it).
fn window_over_events(writers: &str, counts_extra: &str) -> String {
    format!(
        "pipeline: p\nstore: sqlite://s.db\n\
         targets:\n  - {{ name: events, kind: table }}\n  - name: per_minute\n    kind: window\n    window: {{ size: 1m, group_by: \"attribute:region\" }}\n\
         flows:\n{writers}  - name: counts\n    target: per_minute\n    source: {{ table: events }}\n{counts_extra}"
    )
}

const LIVE_WITH_WATERMARK: &str = "  - name: live\n    target: events\n    source: { pubsub: { subscription: s, watermark: { tracking_subscription: auto } } }\n";
const LIVE_WITHOUT_WATERMARK: &str =
    "  - name: live\n    target: events\n    source: { pubsub: { subscription: s } }\n";
const BACKFILL: &str = "  - name: backfill\n    target: events\n    once: true\n    source: { file: { path: h.jsonl } }\n";

#[test]
fn the_spec_example_runs() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/orders.yaml");
    sluice_pipeline::load_for_run(&example).unwrap();
}

#[test]
fn a_window_over_a_table_needs_every_live_writers_watermark() {
    let both = format!("{BACKFILL}{LIVE_WITH_WATERMARK}");
    assert_eq!(
        not_built(&window_over_events(&both, "")),
        Vec::<String>::new()
    );
    let found = not_built(&window_over_events(LIVE_WITHOUT_WATERMARK, ""));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("flows[1].source") && found[0].contains("live writer \"live\""),
        "{found:?}"
    );
}

#[test]
fn a_window_over_a_table_refuses_unbounded_file_writers_and_endless_once_flows() {
    let file_live =
        "  - name: files\n    target: events\n    source: { file: { path: h.jsonl } }\n";
    let found = not_built(&window_over_events(file_live, ""));
    assert!(
        found.len() == 1 && found[0].contains("(files)"),
        "{found:?}"
    );
    let found = not_built(&window_over_events(LIVE_WITH_WATERMARK, "    once: true\n"));
    assert!(
        found.len() == 1 && found[0].contains("flows[1].once"),
        "{found:?}"
    );
    // In a triggered pipeline every flow is bounded, and waited for.
    let triggered = window_over_events(file_live, "").replace("store:", "mode: triggered\nstore:");
    assert_eq!(not_built(&triggered), Vec::<String>::new());
}

#[test]
fn windows_without_a_watermark_do_not_run() {
    let file = "pipeline: p\nstore: sqlite://s.db\n\
        targets:\n  - name: w\n    kind: window\n    window: { size: 1m, group_by: \"attribute:region\" }\n\
        flows:\n  - { name: b, target: w, source: { pubsub: { subscription: s2 } } }\n";
    let found = not_built(file);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("flows[0].target") && found[0].contains("watermark"),
        "{found:?}"
    );
}

#[test]
fn tables_read_while_live_flows_write_them_run_in_chains() {
    // bronze <- Pub/Sub (live); silver <- bronze (live, follows); copy <- bronze (once, reads
    // what is there); export <- silver (live).
    let file = "pipeline: p\nstore: sqlite://s.db\n\
        targets:\n  - { name: bronze, kind: table }\n  - { name: silver, kind: table }\n  - { name: copy, kind: table }\n  - { name: export, kind: foreach_batch, foreach_batch: { endpoint: \"http://127.0.0.1:1\" } }\n\
        flows:\n  - { name: live, target: bronze, source: { pubsub: { subscription: s } } }\n  - { name: refine, target: silver, source: { table: bronze } }\n  - { name: c, target: copy, once: true, source: { table: bronze } }\n  - { name: out, target: export, source: { table: silver } }\n";
    let found = not_built(file);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_window_down_a_chain_needs_a_watermark_at_its_head() {
    let chain = |watermark: &str| {
        format!(
            "pipeline: p\nstore: sqlite://s.db\n\
             targets:\n  - {{ name: bronze, kind: table }}\n  - {{ name: silver, kind: table }}\n  - name: w\n    kind: window\n    window: {{ size: 1m, group_by: \"attribute:region\" }}\n\
             flows:\n  - {{ name: live, target: bronze, source: {{ pubsub: {{ subscription: s{watermark} }} }} }}\n  - {{ name: refine, target: silver, source: {{ table: bronze }} }}\n  - {{ name: counts, target: w, source: {{ table: silver }} }}\n"
        )
    };
    let found = not_built(&chain(""));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("flows[2].source") && found[0].contains("\"refine\""),
        "{found:?}"
    );
    let found = not_built(&chain(", watermark: { tracking_subscription: auto }"));
    assert!(found.is_empty(), "{found:?}");
    // A file flow writing bronze without end: bronze has no watermark, nor has silver.
    let with_files = chain(", watermark: { tracking_subscription: auto }").replace(
        "flows:\n",
        "flows:\n  - { name: files, target: bronze, source: { file: { path: \"in/*.jsonl\" } } }\n",
    );
    let found = not_built(&with_files);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("\"refine\""), "{found:?}");
}

#[test]
fn an_invalid_file_gets_no_not_built_errors() {
    // The checks of what runs read a consistent model: only a valid file gets them.
    let file = "pipeline: p\nstore: sqlite://s.db\ntargets:\n  - { name: v, kind: view }\n\
        flows:\n  - { name: a, target: v, source: { pubsub: { subscription: s } } }\n  - { name: a, target: v, source: { pubsub: { subscription: t } } }\n";
    let errors = parse_for_run(file, Path::new("p.yaml")).unwrap_err();
    assert!(errors.has(ErrorCode::DuplicateName), "{errors}");
    assert!(!errors.has(ErrorCode::NotBuilt), "{errors}");
}

/// A window closes with its writers' watermarks; another pipeline's table hands none down.
/// A scheduled export of another pipeline's table, fired by its updates, runs.
#[test]
fn another_pipelines_table_runs_but_feeds_no_window() {
    let window = "pipeline: p\nmode: triggered\nstore: sqlite://s.db\n\
        targets:\n  - name: per_minute\n    kind: window\n    window: { size: 1m, group_by: \"attribute:region\" }\n\
        flows:\n  - { name: counts, target: per_minute, source: { table: orders.events } }\n";
    let found = not_built(window);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("flows[0].target"), "{found:?}");
    let export = "pipeline: p\nmode: triggered\nstore: sqlite://s.db\n\
        schedule: { cron: \"@hourly\", on_update: true, min_interval: 5m }\n\
        targets:\n  - { name: copies, kind: table }\n\
        flows:\n  - { name: export, target: copies, source: { table: orders.events } }\n";
    assert!(not_built(export).is_empty());
}
