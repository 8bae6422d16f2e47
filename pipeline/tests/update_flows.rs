//! Update flows (`keys:` on a table target, `apply_changes:` on the flows writing it): what
//! parses, and each mistake refused with its code, path and line.

use std::path::Path;

use sluice_pipeline::{ConfigError, ErrorCode, parse};

/// A keyed `customers` table written by a flow decoding JSON changes; `{keys}`,
/// `{changes}` and the `name` column's nullability are replaced by each case.
fn file(keys: &str, changes: &str, name_nullable: bool) -> String {
    format!(
        "pipeline: crm
store: sqlite://x.db
targets:
  - name: customers
    kind: table
    columns:
      - {{ name: id, type: text, nullable: false }}
      - {{ name: version, type: integer, nullable: false }}
      - {{ name: name, type: text, nullable: {name_nullable} }}
    keys: {keys}
flows:
  - name: changes
    target: customers
    source: {{ pubsub: {{ subscription: crm-changes }} }}
    decode:
      format: json
      fields: {{ id: text, version: integer, name: text, op: text }}
    apply_changes: {changes}
"
    )
}

fn errors(text: &str) -> Vec<ConfigError> {
    match parse(text, Path::new("p.yaml")) {
        Ok(p) => panic!("expected errors, got {p:?}"),
        Err(e) => e.0,
    }
}

#[test]
fn a_keyed_table_and_its_update_flow_parse() {
    let text = file(
        "[id]",
        "{ sequence_by: version, apply_as_deletes: \"op = 'D'\", ignore_null_updates: false, \
         stored_as_scd_type: 1 }",
        true,
    );
    let p = parse(&text, Path::new("p.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.targets[0].keys, ["id"]);
    let changes = p.flows[0].query.changes.as_ref().expect("an update flow");
    assert_eq!(changes.sequence_by, "version");
    assert!(!changes.ignore_null_updates);
    assert_eq!(
        changes.deletes.as_ref().map(|d| d.text.as_str()),
        Some("op = 'D'")
    );
}

#[test]
fn each_mistake_is_refused_where_it_is() {
    let cases: [(String, ErrorCode, &str, usize); 11] = [
        (
            file(
                "[id]",
                "{ sequence_by: version, ignore_null_updates: true }",
                true,
            ),
            ErrorCode::InvalidValue,
            "flows[0].apply_changes.ignore_null_updates",
            18,
        ),
        (
            file("[id]", "null", true).replace("    apply_changes: null\n", ""),
            ErrorCode::MissingField,
            "flows[0].apply_changes",
            12,
        ),
        (
            file("[nope]", "{ sequence_by: version }", true),
            ErrorCode::InvalidValue,
            "targets[0].keys[0]",
            10,
        ),
        (
            file("[name]", "{ sequence_by: version }", true),
            ErrorCode::InvalidValue,
            "targets[0].keys[0]",
            10,
        ),
        (
            file("[id, id]", "{ sequence_by: version }", true),
            ErrorCode::DuplicateName,
            "targets[0].keys[1]",
            10,
        ),
        (
            file("[id]", "{ sequence_by: name }", true),
            ErrorCode::InvalidValue,
            "flows[0].apply_changes.sequence_by",
            18,
        ),
        (
            file("[id]", "{ sequence_by: id }", true),
            ErrorCode::InvalidValue,
            "flows[0].apply_changes.sequence_by",
            18,
        ),
        (
            file(
                "[id]",
                "{ sequence_by: version, apply_as_deletes: \"op\" }",
                true,
            ),
            ErrorCode::InvalidExpression,
            "flows[0].apply_changes.apply_as_deletes",
            18,
        ),
        (
            file(
                "[id]",
                "{ sequence_by: version, apply_as_deletes: \"op = 'D'\" }",
                false,
            ),
            ErrorCode::InvalidValue,
            "flows[0].apply_changes.apply_as_deletes",
            18,
        ),
        (
            file(
                "[id]",
                "{ sequence_by: version, stored_as_scd_type: 2 }",
                true,
            ),
            ErrorCode::InvalidValue,
            "flows[0].apply_changes.stored_as_scd_type",
            18,
        ),
        (
            file(
                "[id]",
                "{ sequence_by: version, apply_as_truncates: \"op = 'T'\" }",
                true,
            ),
            ErrorCode::UnknownKey,
            "flows[0].apply_changes.apply_as_truncates",
            18,
        ),
    ];
    for (text, code, path, line) in cases {
        let errs = errors(&text);
        assert_eq!(errs.len(), 1, "{path}: {errs:#?}");
        let e = &errs[0];
        assert_eq!(
            (e.code, e.path.as_str(), e.line),
            (code, path, Some(line)),
            "{e}"
        );
    }
    // Two flows into one keyed table order its changes by one column.
    let two = file("[id]", "{ sequence_by: version }", true)
        + "  - name: more
    target: customers
    source: { pubsub: { subscription: more } }
    decode: { format: json, fields: { id: text, version: integer, name: text } }
    apply_changes: { sequence_by: name }
";
    let errs = errors(&two.replace("nullable: true }", "nullable: false }"));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "flows[1].apply_changes.sequence_by");
    // `apply_changes` without `keys:` on the target.
    let unkeyed = file("[id]", "{ sequence_by: version }", true).replace("    keys: [id]\n", "");
    let errs = errors(&unkeyed);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "flows[0].apply_changes");
}
