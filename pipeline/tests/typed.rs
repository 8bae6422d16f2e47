//! Typed tables in the pipeline file: `columns:`, `decode:`, `select:`, `where:`, `expect:`.
//! A valid typed pipeline compiles its expressions for both stores; each key's bad forms are
//! refused with their code, path and line; what `run` cannot do yet is `NOT_BUILT`.

use std::path::Path;

use sluice_pipeline::{ColumnType, ConfigError, ErrorCode, parse, parse_for_run};

/// A valid typed pipeline; tests replace one of its lines. Line numbers are fixed:
const TYPED: &str = "\
pipeline: shop
targets:
  - name: orders
    kind: table
    columns:
      - { name: order_id, type: text, nullable: false }
      - { name: amount, type: numeric }
      - { name: cents, type: integer }
      - { name: region, type: text }
      - { name: ts, type: timestamp }
flows:
  - name: live
    target: orders
    source: { pubsub: { subscription: orders-sub } }
    decode: { format: json }
    select:
      cents: \"CAST(amount * 100 AS integer)\"
      region: \"upper(region)\"
    where: \"amount > 0\"
";

fn edit(line: usize, with: &str) -> String {
    TYPED
        .lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == line { with } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Exactly one error, with this code, path and line; its message.
fn one(text: &str, code: ErrorCode, path: &str, line: usize) -> String {
    let errs: Vec<ConfigError> = match parse(text, Path::new("p.yaml")) {
        Ok(p) => panic!("expected errors, got {p:?}"),
        Err(e) => e.0,
    };
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let e = errs.into_iter().next().expect("one error");
    assert_eq!(
        (e.code, e.path.as_str(), e.line),
        (code, path, Some(line)),
        "{e}"
    );
    e.message
}

#[test]
fn a_typed_flow_compiles_for_both_stores() {
    let p = parse(TYPED, Path::new("p.yaml")).expect("valid");
    assert_eq!(p.targets[0].columns.len(), 5);
    assert_eq!(p.targets[0].columns[1].ty, ColumnType::Numeric);
    assert!(!p.targets[0].columns[0].nullable);
    let q = &p.flows[0].query;
    assert!(q.is_typed());
    // Every column: the two selected, the other three from the fields of their names.
    let filled: Vec<&str> = q.select.iter().map(|s| s.column.as_str()).collect();
    assert_eq!(filled, ["order_id", "amount", "cents", "region", "ts"]);
    let cents = &q.select[2].expression;
    assert_eq!(cents.postgres, "CAST((\"amount\" * 100) AS BIGINT)");
    assert_eq!(cents.sqlite, "sluice_cast_integer((\"amount\" * 100))");
    assert_eq!(
        q.filter.as_ref().map(|f| f.postgres.as_str()),
        Some("(\"amount\" > 0)")
    );
    parse_for_run(TYPED, Path::new("p.yaml")).expect("runs");
}

#[test]
fn bad_columns_are_refused_where_they_are() {
    one(
        &edit(7, "      - { name: amount, type: money }"),
        ErrorCode::InvalidValue,
        "targets[0].columns[1].type",
        7,
    );
    one(
        &edit(7, "      - { name: _sluice_flow, type: text }"),
        ErrorCode::InvalidIdentifier,
        "targets[0].columns[1].name",
        7,
    );
    one(
        &edit(7, "      - { name: order_id, type: text }"),
        ErrorCode::DuplicateName,
        "targets[0].columns[1].name",
        7,
    );
    one(
        &edit(7, "      - { name: amount, type: numeric, unique: true }"),
        ErrorCode::UnknownKey,
        "targets[0].columns[1].unique",
        7,
    );
}

#[test]
fn bad_expressions_are_refused_with_their_line() {
    let why = one(
        &edit(17, "      cents: \"CAST(amountt * 100 AS integer)\""),
        ErrorCode::InvalidExpression,
        "flows[0].select.cents",
        17,
    );
    assert!(why.contains("unknown column `amountt`"), "{why}");
    let why = one(
        &edit(18, "      region: \"region > 3\""),
        ErrorCode::InvalidExpression,
        "flows[0].select.region",
        18,
    );
    assert!(why.contains("do not mix"), "{why}");
    let why = one(
        &edit(17, "      cents: \"amount * 100\""),
        ErrorCode::InvalidExpression,
        "flows[0].select.cents",
        17,
    );
    assert!(why.contains("CAST it"), "{why}");
    let why = one(
        &edit(19, "    where: \"amount\""),
        ErrorCode::InvalidExpression,
        "flows[0].where",
        19,
    );
    assert!(why.contains("condition"), "{why}");
    one(
        &edit(19, "    where: \"now() > ts\""),
        ErrorCode::InvalidExpression,
        "flows[0].where",
        19,
    );
    let why = one(
        &edit(18, "      colour: \"upper(region)\""),
        ErrorCode::InvalidValue,
        "flows[0].select.colour",
        18,
    );
    assert!(why.contains("not a column of `orders`"), "{why}");
}

#[test]
fn decode_needs_a_typed_table_and_a_known_format() {
    one(
        &edit(15, "    decode: { format: xml }"),
        ErrorCode::InvalidValue,
        "flows[0].decode.format",
        15,
    );
    one(
        &edit(15, "    decode: { format: json, schema: pubsub }"),
        ErrorCode::UnknownKey,
        "flows[0].decode.schema",
        15,
    );
    one(
        &edit(
            15,
            "    decode: { format: json, fields: { amount: money } }",
        ),
        ErrorCode::InvalidValue,
        "flows[0].decode.fields.amount",
        15,
    );
    // A typed table's flow decodes.
    let text = TYPED.replace("    decode: { format: json }\n", "");
    let errs = parse(&text, Path::new("p.yaml"))
        .expect_err("needs decode")
        .0;
    assert!(
        errs.iter()
            .any(|e| e.code == ErrorCode::MissingField && e.path == "flows[0].decode"),
        "{errs:#?}"
    );
    // Columns belong to tables; select to typed tables.
    let untyped = TYPED.replace(
        "    columns:\n      - { name: order_id, type: text, nullable: false }\n      - { name: amount, type: numeric }\n      - { name: cents, type: integer }\n      - { name: region, type: text }\n      - { name: ts, type: timestamp }\n",
        "",
    );
    let errs = parse(&untyped, Path::new("p.yaml")).expect_err("untyped").0;
    for key in ["decode", "select", "where"] {
        assert!(
            errs.iter()
                .any(|e| e.code == ErrorCode::InvalidValue && e.path == format!("flows[0].{key}")),
            "{key}: {errs:#?}"
        );
    }
}

#[test]
fn avro_and_protobuf_name_their_schema() {
    use sluice_pipeline::{DecodeFormat, DecodeSchema};
    let text = edit(15, "    decode: { format: avro, schema: pubsub }");
    let p = parse_for_run(&text, Path::new("p.yaml")).expect("runs");
    let decode = p.flows[0].query.decode.as_ref().expect("decode");
    assert_eq!(
        (decode.format, decode.schema.as_ref()),
        (DecodeFormat::Avro, Some(&DecodeSchema::PubSub))
    );
    let schema = std::env::temp_dir().join(format!("typed-{}.proto", std::process::id()));
    std::fs::write(&schema, "syntax = \"proto3\";").expect("schema file");
    let file = |rest: &str| {
        edit(
            15,
            &format!(
                "    decode: {{ format: protobuf, schema: \"{}\"{rest} }}",
                schema.display()
            ),
        )
    };
    parse_for_run(&file(", message: shop.Order"), Path::new("p.yaml")).expect("runs");
    let why = one(
        &file(""),
        ErrorCode::MissingField,
        "flows[0].decode.message",
        15,
    );
    assert!(why.contains("name the payload's with `message:`"), "{why}");
    std::fs::remove_file(&schema).ok();
    for (decode, code, path, says) in [
        (
            "    decode: { format: avro }",
            ErrorCode::MissingField,
            "flows[0].decode.schema",
            "names its schema",
        ),
        (
            "    decode: { format: avro, schema: orders.proto }",
            ErrorCode::InvalidValue,
            "flows[0].decode.schema",
            "ends in `.avsc`",
        ),
        (
            "    decode: { format: avro, schema: /no/such/orders.avsc }",
            ErrorCode::Unreadable,
            "flows[0].decode.schema",
            "schema file `/no/such/orders.avsc`",
        ),
        (
            "    decode: { format: json, schema: pubsub }",
            ErrorCode::UnknownKey,
            "flows[0].decode.schema",
            "plain JSON needs no `schema`",
        ),
    ] {
        let why = one(&edit(15, decode), code, path, 15);
        assert!(why.contains(says), "{decode}: {why}");
    }
    // The topic's schema is for a Pub/Sub source.
    let file_flow = edit(
        14,
        "    source: { file: { path: \"in/*.jsonl\" } }\n    decode: { format: avro, schema: pubsub }",
    )
    .replace("    decode: { format: json }\n", "");
    let errs = parse(&file_flow, Path::new("p.yaml"))
        .expect_err("pubsub schema")
        .0;
    assert!(
        errs.iter()
            .any(|e| e.path == "flows[0].decode.schema" && e.message.contains("Pub/Sub source")),
        "{errs:#?}"
    );
}

#[test]
fn expectations_are_checked_like_expressions() {
    let with = |expect: &str| {
        edit(
            19,
            &format!("    where: \"amount > 0\"\n    expect: [{expect}]"),
        )
    };
    let p = parse_for_run(
        &with("{ name: positive, check: \"amount > 0\", on_violation: drop }"),
        Path::new("p.yaml"),
    )
    .expect("runs");
    assert_eq!(p.flows[0].query.expectations[0].name, "positive");
    let why = one(
        &with("{ name: positive, check: \"amount\", on_violation: drop }"),
        ErrorCode::InvalidExpression,
        "flows[0].expect[0].check",
        20,
    );
    assert!(why.contains("condition"), "{why}");
    one(
        &with("{ name: positive, check: \"amount > 0\", on_violation: explode }"),
        ErrorCode::InvalidValue,
        "flows[0].expect[0].on_violation",
        20,
    );
    one(
        &with("{ name: Positive, check: \"amount > 0\" }"),
        ErrorCode::InvalidIdentifier,
        "flows[0].expect[0].name",
        20,
    );
}

/// `TYPED` with a silver table filled from `orders` by a `table` source (its expressions read
/// the upstream's columns), then `extra` appended (more targets or flows).
fn chained(silver_flow: &str, extra: &str) -> String {
    let targets_end = TYPED.find("flows:").expect("flows");
    format!(
        "{}  - name: silver\n    kind: table\n    columns:\n      \
         - {{ name: order_id, type: text, nullable: false }}\n      \
         - {{ name: cents, type: integer }}\n{extra}{}{silver_flow}",
        &TYPED[..targets_end],
        &TYPED[targets_end..]
    )
}

#[test]
fn a_typed_table_source_reads_the_upstream_columns() {
    let text = chained(
        "  - name: clean\n    target: silver\n    source: { table: orders }\n    \
         select: { cents: \"CAST(amount * 100 AS integer)\" }\n    where: \"region = 'EU'\"\n",
        "",
    );
    let p = parse_for_run(&text, Path::new("p.yaml")).expect("runs");
    let clean = &p.flows[1];
    let fields: Vec<&str> = clean.query.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(fields, ["order_id", "amount", "cents", "region", "ts"]);
    assert!(clean.query.is_typed() && clean.query.filter.is_some());
    // A column the upstream lacks is unknown to its expressions.
    let text = chained(
        "  - name: clean\n    target: silver\n    source: { table: orders }\n    \
         where: \"colour = 'red'\"\n",
        "",
    );
    let errs = parse(&text, Path::new("p.yaml"))
        .expect_err("unknown column")
        .0;
    assert!(
        errs.iter()
            .any(|e| e.code == ErrorCode::InvalidExpression && e.path == "flows[1].where"),
        "{errs:#?}"
    );
}

#[test]
fn typed_rows_from_an_envelope_table_or_a_window_over_typed_rows_are_not_built() {
    let envelope = "  - name: raw\n    kind: table\n";
    let text = chained(
        "  - name: clean\n    target: silver\n    source: { table: raw }\n",
        envelope,
    );
    parse(&text, Path::new("p.yaml")).expect("valid");
    let errs = parse_for_run(&text, Path::new("p.yaml"))
        .expect_err("not built")
        .0;
    assert!(
        errs.iter()
            .any(|e| e.code == ErrorCode::NotBuilt && e.path == "flows[1].source"),
        "{errs:#?}"
    );
}

/// `TYPED` with a window `gold` over the typed `orders` (group `group_by`, aggregates
/// `aggregates`, a YAML map), and the Pub/Sub flow given a watermark so that `run` can close it.
fn windowed(group_by: &str, aggregates: &str) -> String {
    let targets_end = TYPED.find("flows:").expect("flows");
    format!(
        "{}  - name: gold\n    kind: window\n    window: {{ size: 1m, group_by: \"{group_by}\", \
         aggregates: {aggregates} }}\n{}  - name: totals\n    target: gold\n    \
         source: {{ table: orders }}\n",
        &TYPED[..targets_end],
        &TYPED[targets_end..].replace(
            "{ pubsub: { subscription: orders-sub } }",
            "{ pubsub: { subscription: orders-sub, watermark: { tracking_subscription: auto } } }"
        )
    )
}

#[test]
fn a_window_over_a_typed_table_groups_by_a_column_and_aggregates_columns() {
    let text = windowed(
        "column:region",
        "{ total: \"sum(cents)\", biggest: \"max(amount)\", orders: \"count(*)\" }",
    );
    let p = parse_for_run(&text, Path::new("p.yaml")).expect("runs");
    let sluice_pipeline::TargetKind::Window { aggregates, .. } = &p.targets[1].kind else {
        panic!("a window");
    };
    assert_eq!(aggregates.len(), 3);
    let refused = |group_by: &str, aggregates: &str, code: ErrorCode, path: &str| {
        let errs = parse(&windowed(group_by, aggregates), Path::new("p.yaml"))
            .expect_err("refused")
            .0;
        assert!(
            errs.iter()
                .any(|e| e.code == code && e.path == path && e.line.is_some()),
            "{group_by} {aggregates}: {errs:#?}"
        );
    };
    // Typed rows have no attributes; a column must be the table's; sums take numbers.
    refused(
        "attribute:region",
        "{}",
        ErrorCode::InvalidValue,
        "targets[1].window.group_by",
    );
    refused(
        "column:colour",
        "{}",
        ErrorCode::InvalidValue,
        "targets[1].window.group_by",
    );
    refused(
        "column:ts",
        "{}",
        ErrorCode::InvalidValue,
        "targets[1].window.group_by",
    );
    refused(
        "column:region",
        "{ total: \"sum(region)\" }",
        ErrorCode::InvalidExpression,
        "targets[1].window.aggregates.total",
    );
    refused(
        "column:region",
        "{ total: \"sum(cents) + 1\" }",
        ErrorCode::InvalidExpression,
        "targets[1].window.aggregates.total",
    );
    refused(
        "column:region",
        "{ count: \"count(*)\" }",
        ErrorCode::InvalidValue,
        "targets[1].window.aggregates.count",
    );
}

/// `TYPED` with a view `big` over `orders` (its query: `view_flow`'s keys) and a silver table
/// reading it.
fn with_view(view_flow: &str) -> String {
    let targets_end = TYPED.find("flows:").expect("flows");
    format!(
        "{}  - name: big\n    kind: view\n    columns:\n      \
         - {{ name: order_id, type: text }}\n      - {{ name: euros, type: numeric }}\n  \
         - name: silver\n    kind: table\n    columns:\n      \
         - {{ name: order_id, type: text }}\n      - {{ name: cents, type: integer }}\n{}  \
         - name: big_orders\n    target: big\n{view_flow}  - name: from_view\n    \
         target: silver\n    source: {{ table: big }}\n    \
         select: {{ cents: \"CAST(euros * 100 AS integer)\" }}\n    where: \"order_id <> 'x'\"\n",
        &TYPED[..targets_end],
        &TYPED[targets_end..]
    )
}

#[test]
fn a_view_is_a_query_its_readers_apply_to_its_table() {
    let text = with_view(
        "    source: { table: orders }\n    select: { euros: \"amount\" }\n    \
         where: \"amount > 10\"\n",
    );
    let p = parse_for_run(&text, Path::new("p.yaml")).expect("runs");
    assert_eq!(p.views.len(), 1);
    assert_eq!(
        (p.views[0].name.as_str(), p.views[0].table.as_str()),
        ("big", "orders")
    );
    // The view's flow does not run; its reader reads `orders`, the view's query applied.
    let names: Vec<&str> = p.flows.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["live", "from_view"]);
    let reader = &p.flows[1];
    assert_eq!(
        reader.source,
        sluice_pipeline::Source::Table {
            target: "orders".into()
        }
    );
    let cents = &reader
        .query
        .select
        .iter()
        .find(|s| s.column == "cents")
        .expect("cents");
    assert!(
        cents.expression.postgres.contains("\"amount\""),
        "{cents:?}"
    );
    let filter = reader.query.filter.as_ref().expect("a filter");
    assert!(
        filter.postgres.contains("\"amount\" > 10") && filter.postgres.contains("<> 'x'"),
        "{filter:?}"
    );
    let fields: Vec<&str> = reader
        .query
        .fields
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(fields, ["order_id", "amount", "cents", "region", "ts"]);
}

#[test]
fn a_view_reads_one_typed_table_and_lands_nothing() {
    let refused = |view_flow: &str, code: ErrorCode, path: &str| {
        let errs = parse(&with_view(view_flow), Path::new("p.yaml"))
            .expect_err("refused")
            .0;
        assert!(
            errs.iter()
                .any(|e| e.code == code && e.path == path && e.line.is_some()),
            "{view_flow}: {errs:#?}"
        );
    };
    refused(
        "    source: { pubsub: { subscription: other } }\n    decode: { format: json }\n",
        ErrorCode::InvalidValue,
        "flows[1].source",
    );
    refused(
        "    source: { table: orders }\n    expect:\n      - { name: e, check: \"euros > 0\" }\n",
        ErrorCode::InvalidValue,
        "flows[1].expect",
    );
    refused(
        "    source: { table: orders }\n    select: { order_id: \"_sluice_attributes ->> 'k'\" }\n",
        ErrorCode::InvalidExpression,
        "flows[1].select.order_id",
    );
}
