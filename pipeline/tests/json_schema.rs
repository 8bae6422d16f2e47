//! The pipeline file's JSON Schema (`docs/pipeline.schema.json`, what editors validate and
//! complete with) is the one generated from the types the file is read into.
#![allow(clippy::unwrap_used)]

use std::path::Path;

fn committed() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/pipeline.schema.json"),
    )
    .unwrap()
}

#[test]
fn the_committed_schema_is_current() {
    assert!(
        committed() == sluice_pipeline::json_schema(),
        "docs/pipeline.schema.json is stale: run `cargo run -- schema > docs/pipeline.schema.json`"
    );
}

/// It names every top-level key the file accepts, refuses others, and carries the choices of
/// keys whose values are words.
#[test]
fn the_schema_knows_the_keys_and_their_choices() {
    let schema: serde_json::Value = serde_json::from_str(&committed()).unwrap();
    let mut keys: Vec<&str> = schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "control",
            "dead_letter",
            "flows",
            "give_up_after",
            "metrics",
            "mode",
            "pipeline",
            "pubsub",
            "schedule",
            "store",
            "targets"
        ]
    );
    assert_eq!(schema["additionalProperties"], false);
    let text = committed();
    for words in [
        "\"protobuf\"",
        "\"timestamp\"",
        "\"fail\"",
        "\"data_interval\"",
    ] {
        assert!(text.contains(words), "{words}");
    }
}
