//! Paths in a pipeline file mean what they say from any working directory: a relative SQLite
//! store, a file source's glob and a sink's folder are beside the file, and the commands that
//! read a store (`status`, `runs`, `graph`) never create one.
//!
//! Real: the `sluice` binary on a real SQLite file; no Pub/Sub (a file flow and a sink).
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{Workdir, sluice_command};
use std::path::Path;

const PIPELINE: &str = "\
pipeline: paths
mode: triggered
store: sqlite://state/paths.db
targets:
  - { name: events, kind: table }
  - { name: export, kind: sink, sink: { format: jsonl, path: out } }
flows:
  - name: history
    target: events
    once: true
    source: { file: { path: \"in/*.jsonl\" } }
  - name: exporting
    target: export
    source: { table: events }
";

fn records(folder: &Path, n: usize) {
    std::fs::create_dir_all(folder).unwrap();
    let text: String = (0..n)
        .map(|i| format!("{{\"id\":\"r{i}\",\"data\":{{\"n\":{i}}}}}\n"))
        .collect();
    std::fs::write(folder.join("a.jsonl"), text).unwrap();
}

/// Files that exist under `dir`, relative to it, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, at: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, found);
            } else {
                found.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut found = Vec::new();
    walk(dir, dir, &mut found);
    found.sort();
    found
}

/// A pipeline run from another folder reads its files, keeps its store and writes its sink
/// beside the pipeline file; `status` and `runs` from a third folder read that store and show
/// the run; nothing appears in the folders the commands ran from.
#[test]
fn relative_paths_are_beside_the_pipeline_file_from_any_working_directory() {
    let dir = Workdir::new();
    let project = dir.path().join("project");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    records(&project.join("in"), 30);
    let file = project.join("pipeline.yaml");
    std::fs::write(&file, PIPELINE).unwrap();
    let file = file.to_str().unwrap();

    let run = sluice_command(&["run", "-c", file], Some(&elsewhere));
    assert_eq!(run.code, 0, "{}", run.all());
    assert!(
        project.join("state/paths.db").is_file(),
        "the store is beside the file: {:?}",
        tree(dir.path())
    );
    // A sink's `path` is its files' prefix: `out-<flow>-...jsonl` beside the pipeline file.
    let exported: usize = std::fs::read_dir(&project)
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|f| f.file_name().unwrap().to_str().unwrap().starts_with("out-"))
        .map(|f| std::fs::read_to_string(f).unwrap().lines().count())
        .sum();
    assert_eq!(exported, 30, "the sink wrote beside the file");

    let status = sluice_command(
        &["status", "-c", file, "--format", "json"],
        Some(dir.path()),
    );
    assert_eq!(status.code, 0, "{}", status.all());
    let report: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    let history = report["flows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["flow"] == "history")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(history["rows"], 30, "{report}");
    assert_eq!(history["state"], "COMPLETED", "{report}");
    let runs = sluice_command(&["runs", "-c", file], Some(dir.path()));
    assert_eq!(runs.code, 0, "{}", runs.all());
    assert!(runs.stdout.contains("completed"), "{}", runs.stdout);

    assert!(tree(&elsewhere).is_empty(), "{:?}", tree(&elsewhere));
    assert!(!dir.path().join("state").exists(), "{:?}", tree(dir.path()));
}

/// `status`, `runs` and `graph` on a pipeline that never ran say so and create nothing: no
/// store beside the file, and no folder for a store whose folder does not exist.
#[test]
fn commands_that_read_a_store_never_create_one() {
    let dir = Workdir::new();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, PIPELINE).unwrap();
    let missing_folder = dir.path().join("nonexistent/dir");
    let elsewhere = dir.path().join("elsewhere.yaml");
    std::fs::write(
        &elsewhere,
        PIPELINE.replace(
            "sqlite://state/paths.db",
            &format!("sqlite://{}/x.db", missing_folder.display()),
        ),
    )
    .unwrap();
    for file in [&file, &elsewhere] {
        let file = file.to_str().unwrap();
        for command in ["status", "runs"] {
            let out = sluice_command(&[command, "-c", file], Some(dir.path()));
            assert_eq!(out.code, 1, "{command}: {}", out.all());
            assert!(
                out.stderr.contains("no store at") && out.stderr.contains("has this pipeline run?"),
                "{command}: {}",
                out.all()
            );
        }
        let graph = sluice_command(&["graph", "-c", file], Some(dir.path()));
        assert_eq!(graph.code, 0, "{}", graph.all());
    }
    assert_eq!(
        tree(dir.path()),
        vec!["elsewhere.yaml".to_owned(), "pipeline.yaml".to_owned()],
        "a read command created something"
    );
}
