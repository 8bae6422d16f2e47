//! Each error code is reported with its code, path and line; several errors are all reported.

use std::path::Path;

use sluice_pipeline::{ConfigError, ErrorCode, Source, load, parse};

/// A valid file; tests replace one of its lines to break it. Line numbers are fixed:
const BASE: &str = include_str!("data/base.yaml");

/// BASE with 1-based line `line` replaced by `with` (which may span several lines).
fn edit(line: usize, with: &str) -> String {
    BASE.lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == line { with } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn errors(text: &str) -> Vec<ConfigError> {
    match parse(text, Path::new("p.yaml")) {
        Ok(p) => panic!("expected errors, got {p:?}"),
        Err(e) => e.0,
    }
}

/// Exactly one error, with this code, path and line.
fn one(text: &str, code: ErrorCode, path: &str, line: usize) -> ConfigError {
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let e = errs.into_iter().next().expect("one error");
    assert_eq!(
        (e.code, e.path.as_str(), e.line),
        (code, path, Some(line)),
        "{e}"
    );
    assert!(e.column.is_some(), "{e}");
    e
}

#[test]
fn base_is_valid() {
    parse(BASE, Path::new("p.yaml")).expect("BASE is valid");
}

#[test]
fn unknown_keys() {
    one(
        &edit(2, "mood: continuous"),
        ErrorCode::UnknownKey,
        "mood",
        2,
    );
    let e = one(
        &edit(23, "        max_attempts: 5\n        retries: 3"),
        ErrorCode::UnknownKey,
        "flows[1].source.pubsub.retries",
        24,
    );
    assert_eq!(e.column, Some(9));
    one(
        &edit(22, "        batch: { max_messages: 1000, linger: 50ms }"),
        ErrorCode::UnknownKey,
        "flows[1].source.pubsub.batch.linger",
        22,
    );
    one(
        &edit(13, "    source: { file: { path: a }, kafka: {} }"),
        ErrorCode::UnknownKey,
        "flows[0].source.kafka",
        13,
    );
    // A sub-section that does not go with the target's kind.
    one(
        &edit(5, "    kind: table\n    sink: { path: x }"),
        ErrorCode::UnknownKey,
        "targets[0].sink",
        6,
    );
}

#[test]
fn invalid_duration() {
    let e = one(
        &edit(
            20,
            "        dedup: { by: attribute, attribute: event_id, window: ten minutes }",
        ),
        ErrorCode::InvalidDuration,
        "flows[1].source.pubsub.dedup.window",
        20,
    );
    assert_eq!(e.column, Some(62));
    one(
        &edit(22, "        batch: { max_delay: 50 }"),
        ErrorCode::InvalidDuration,
        "flows[1].source.pubsub.batch.max_delay",
        22,
    );
    one(
        &edit(8, "    window: { size: 0s, group_by: attribute:region }"),
        ErrorCode::InvalidDuration,
        "targets[1].window.size",
        8,
    );
}

#[test]
fn invalid_size() {
    one(
        &edit(
            21,
            "        flow_control: { max_outstanding_bytes: 100 parsecs }",
        ),
        ErrorCode::InvalidSize,
        "flows[1].source.pubsub.flow_control.max_outstanding_bytes",
        21,
    );
    let file = "flows[0].source.file.max_record_bytes";
    for (value, message) in [
        ("lots", "is not a size"),
        ("0", "must be at least 1 byte(s)"),
        ("2GB", "must be at most 1000000000 bytes"),
    ] {
        let e = one(
            &edit(
                13,
                &format!(
                    "    source: {{ file: {{ path: data/*.jsonl, max_record_bytes: {value} }} }}"
                ),
            ),
            ErrorCode::InvalidSize,
            file,
            13,
        );
        assert!(e.message.contains(message), "{value}: {e}");
    }
}

#[test]
fn a_file_source_takes_max_record_bytes() {
    let given = |line: &str| {
        let pipeline = parse(&edit(13, line), Path::new("p.yaml")).expect("valid");
        match &pipeline.flows[0].source {
            Source::File {
                max_record_bytes, ..
            } => *max_record_bytes,
            other => panic!("{other:?}"),
        }
    };
    let default = given("    source: { file: { path: data/*.jsonl } }");
    assert_eq!(default, sluice_pipeline::defaults::FILE_MAX_RECORD_BYTES);
    let set = given("    source: { file: { path: data/*.jsonl, max_record_bytes: 1KiB } }");
    assert_eq!(set, 1024);
}

#[test]
fn invalid_values_and_ranges() {
    let pubsub = "flows[1].source.pubsub";
    one(
        &edit(23, "        max_attempts: 0"),
        ErrorCode::InvalidValue,
        &format!("{pubsub}.max_attempts"),
        23,
    );
    one(
        &edit(24, "        streams: 65"),
        ErrorCode::InvalidValue,
        &format!("{pubsub}.streams"),
        24,
    );
    one(
        &edit(22, "        batch: { max_messages: 0 }"),
        ErrorCode::InvalidValue,
        &format!("{pubsub}.batch.max_messages"),
        22,
    );
    one(
        &edit(21, "        flow_control: { max_outstanding_messages: -1 }"),
        ErrorCode::InvalidValue,
        &format!("{pubsub}.flow_control.max_outstanding_messages"),
        21,
    );
    one(
        &edit(5, "    kind: tabel"),
        ErrorCode::InvalidValue,
        "targets[0].kind",
        5,
    );
    let e = one(
        &edit(24, "        streams: many"),
        ErrorCode::InvalidValue,
        &format!("{pubsub}.streams"),
        24,
    );
    assert_eq!(e.message, "expected an integer");
    let e = one(
        &edit(16, "    depends_on: 5"),
        ErrorCode::InvalidValue,
        "flows[1].depends_on",
        16,
    );
    assert_eq!(e.column, Some(17));
}

#[test]
fn missing_fields() {
    one(
        &edit(19, ""),
        ErrorCode::MissingField,
        "flows[1].source.pubsub.subscription",
        18,
    );
    one(
        &edit(20, "        dedup: { by: attribute, window: 10m }"),
        ErrorCode::MissingField,
        "flows[1].source.pubsub.dedup.attribute",
        20,
    );
    one(&edit(1, ""), ErrorCode::MissingField, "pipeline", 2);
    one(
        &edit(8, ""),
        ErrorCode::MissingField,
        "targets[1].window",
        6,
    );
    one(
        &edit(13, "    source: {}"),
        ErrorCode::MissingField,
        "flows[0].source",
        13,
    );
}

#[test]
fn duplicate_names_and_keys() {
    one(
        &edit(6, "  - name: events"),
        ErrorCode::DuplicateName,
        "targets[1].name",
        6,
    );
    let e = one(
        &edit(14, "  - name: backfill"),
        ErrorCode::DuplicateName,
        "flows[1].name",
        14,
    );
    assert!(e.message.contains("line 10"), "{e}");
    one(
        &edit(12, "    once: true\n    once: false"),
        ErrorCode::DuplicateKey,
        "flows[0].once",
        13,
    );
}

#[test]
fn unknown_targets() {
    one(
        &edit(15, "    target: evnts"),
        ErrorCode::UnknownTarget,
        "flows[1].target",
        15,
    );
    one(
        &edit(13, "    source: { table: nope }"),
        ErrorCode::UnknownTarget,
        "flows[0].source.table",
        13,
    );
}

#[test]
fn unknown_flows() {
    let e = one(
        &edit(16, "    depends_on: backfil"),
        ErrorCode::UnknownFlow,
        "flows[1].depends_on",
        16,
    );
    assert_eq!(e.column, Some(17));
    one(
        &edit(16, "    depends_on: [backfill, nope]"),
        ErrorCode::UnknownFlow,
        "flows[1].depends_on[1]",
        16,
    );
    one(
        &edit(16, "    depends_on:\n      - backfill\n      - nope"),
        ErrorCode::UnknownFlow,
        "flows[1].depends_on[1]",
        18,
    );
}

#[test]
fn invalid_schedules() {
    one(
        &edit(2, "mode: continuous\nschedule: { cron: \"*/15 * * * *\" }"),
        ErrorCode::InvalidSchedule,
        "schedule",
        3,
    );
    one(
        &edit(2, "mode: triggered\nschedule:\n  cron: \"* * *\""),
        ErrorCode::InvalidSchedule,
        "schedule.cron",
        4,
    );
    one(
        &edit(
            2,
            "mode: triggered\nschedule: { cron: \"* * * * *\", every: 5m }",
        ),
        ErrorCode::InvalidSchedule,
        "schedule",
        3,
    );
    one(
        &edit(2, "mode: triggered\nschedule: { timezone: UTC }"),
        ErrorCode::InvalidSchedule,
        "schedule",
        3,
    );
    // The reports: a pattern that is not cron and a zone that is not IANA passed
    // `sluice validate` before schedules were built.
    let e = one(
        &edit(2, "mode: triggered\nschedule:\n  cron: \"a b c d e\""),
        ErrorCode::InvalidSchedule,
        "schedule.cron",
        4,
    );
    assert!(e.message.contains("not a valid cron expression"), "{e}");
    let e = one(
        &edit(
            2,
            "mode: triggered\nschedule:\n  cron: \"@daily\"\n  timezone: Mars/X",
        ),
        ErrorCode::InvalidSchedule,
        "schedule.timezone",
        5,
    );
    assert!(e.message.contains("not an IANA time zone"), "{e}");
    let e = one(
        &edit(
            2,
            "mode: triggered\nschedule:\n  every: 1h\n  start_date: yesterday",
        ),
        ErrorCode::InvalidSchedule,
        "schedule.start_date",
        5,
    );
    assert!(e.message.contains("is not a date"), "{e}");
    let e = one(
        &edit(
            2,
            "mode: triggered\nschedule:\n  every: 1h\n  start_date: 2026-02-01\n  end_date: 2026-01-01",
        ),
        ErrorCode::InvalidSchedule,
        "schedule.end_date",
        6,
    );
    assert!(e.message.contains("before `start_date`"), "{e}");
    let e = one(
        &edit(
            2,
            "mode: triggered\nschedule:\n  every: 1h\n  retry_delay: 1m",
        ),
        ErrorCode::InvalidSchedule,
        "schedule.retry_delay",
        5,
    );
    assert!(e.message.contains("needs `retries`"), "{e}");
    // (This file has no flow reading a table, which `on_update` is refused for too.)
    let found = errors(&edit(
        2,
        "mode: triggered\nschedule:\n  every: 1h\n  on_update: true\n  start_date: 2026-01-01",
    ));
    assert!(
        found.iter().any(|e| e.code == ErrorCode::InvalidSchedule
            && e.path == "schedule.on_update"
            && e.message.contains("not keep to `start_date`")),
        "{found:#?}"
    );
    one(
        &edit(2, "mode: triggered\nschedule:\n  cron: \"@fortnightly\""),
        ErrorCode::InvalidSchedule,
        "schedule.cron",
        4,
    );
    one(
        &edit(
            2,
            "mode: triggered\nschedule:\n  cron: \"@daily\"\n  interval: 7d",
        ),
        ErrorCode::InvalidSchedule,
        "schedule.interval",
        5,
    );
    one(
        &edit(
            2,
            "mode: triggered\nschedule:\n  every: 1h\n  min_interval: 5m",
        ),
        ErrorCode::InvalidSchedule,
        "schedule.min_interval",
        5,
    );
    one(
        &edit(
            2,
            "mode: triggered\nschedule:\n  every: 1h\n  on_update: true",
        ),
        ErrorCode::InvalidSchedule,
        "schedule.on_update",
        5,
    );
    one(
        &edit(
            2,
            "mode: triggered\nschedule:\n  every: 1h\n  max_active_runs: 3",
        ),
        ErrorCode::InvalidSchedule,
        "schedule.max_active_runs",
        5,
    );
    one(
        &edit(2, "mode: triggered\nschedule:\n  every: 1500ms"),
        ErrorCode::InvalidSchedule,
        "schedule.every",
        4,
    );
    for valid in [
        "cron: \"*/5 * * * * *\"",
        "cron: \"@weekly\"\n  timezone: America/New_York",
        "every: 15m\n  semantics: data_interval\n  interval: 7d\n  catchup: true",
        "every: 1h\n  catchup: true\n  max_active_runs: 1",
    ] {
        parse(
            &edit(2, &format!("mode: triggered\nschedule:\n  {valid}")),
            Path::new("p.yaml"),
        )
        .unwrap_or_else(|e| panic!("{valid}: {e}"));
    }
    let p = parse(
        &edit(2, "mode: triggered\nschedule: { cron: \"*/15 * * * *\" }"),
        Path::new("p.yaml"),
    )
    .expect("a cron schedule in triggered mode is valid");
    assert!(p.schedule.is_some());
}

#[test]
fn invalid_identifiers() {
    one(
        &edit(1, "pipeline: Orders"),
        ErrorCode::InvalidIdentifier,
        "pipeline",
        1,
    );
    one(
        &edit(14, "  - name: live-flow"),
        ErrorCode::InvalidIdentifier,
        "flows[1].name",
        14,
    );
    let long = "x".repeat(49);
    one(
        &edit(6, &format!("  - name: {long}")),
        ErrorCode::InvalidIdentifier,
        "targets[1].name",
        6,
    );
}

#[test]
fn syntax_errors() {
    let errs = errors("pipeline: orders\nflows: [\n");
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].code, ErrorCode::Syntax);
    assert!(errs[0].line.is_some());
    let errs = errors("- just\n- a list\n");
    assert_eq!(errs[0].code, ErrorCode::Syntax);
}

#[test]
fn unreadable_file() {
    let missing = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/no-such-file.yaml");
    let err = load(&missing).expect_err("missing file");
    assert_eq!(err.0.len(), 1);
    assert_eq!(err.0[0].code, ErrorCode::Unreadable);
    assert_eq!(err.0[0].line, None);
    assert!(
        err.to_string()
            .starts_with(&format!("{}: UNREADABLE: ", missing.display()))
    );
}

#[test]
fn all_errors_are_reported_in_file_order() {
    let text = edit(1, "pipeline: Orders")
        .replace(
            "    target: events\n    depends_on",
            "    target: evnts\n    depends_on",
        )
        .replace("depends_on: backfill", "depends_on: [nope]")
        .replace("window: 10m", "window: 10x")
        .replace("streams: 16", "streams: 0");
    let errs = errors(&text);
    let got: Vec<(ErrorCode, &str, Option<usize>)> = errs
        .iter()
        .map(|e| (e.code, e.path.as_str(), e.line))
        .collect();
    assert_eq!(
        got,
        vec![
            (ErrorCode::InvalidIdentifier, "pipeline", Some(1)),
            (ErrorCode::UnknownTarget, "flows[1].target", Some(15)),
            (ErrorCode::UnknownFlow, "flows[1].depends_on[0]", Some(16)),
            (
                ErrorCode::InvalidDuration,
                "flows[1].source.pubsub.dedup.window",
                Some(20)
            ),
            (
                ErrorCode::InvalidValue,
                "flows[1].source.pubsub.streams",
                Some(24)
            ),
        ]
    );
    let shown = sluice_pipeline::ConfigErrors(errs).to_string();
    assert_eq!(shown.lines().count(), 5);
    assert!(
        shown.starts_with("p.yaml:1:11: INVALID_IDENTIFIER: pipeline: `Orders`"),
        "{shown}"
    );
}

#[test]
fn two_flows_reading_one_subscription() {
    let text = format!(
        "{BASE}  - name: again\n    target: events\n    source: {{ pubsub: {{ subscription: events-sub }} }}\n"
    );
    let e = one(
        &text,
        ErrorCode::SubscriptionShared,
        "flows[2].source.pubsub.subscription",
        27,
    );
    assert!(e.message.contains("`live` and `again`"), "{e}");
}

#[test]
fn a_tracking_subscription_that_is_a_flows_own_subscription() {
    // The tracking reader acks everything it reads: naming the data's own subscription would
    // ack the data.
    let text = edit(
        24,
        "        streams: 16\n        watermark: { tracking_subscription: events-sub }",
    );
    let e = one(
        &text,
        ErrorCode::InvalidValue,
        "flows[1].source.pubsub.watermark.tracking_subscription",
        25,
    );
    assert!(e.message.contains("acks every message"), "{e}");
}

#[test]
fn a_dead_letter_topic_is_named() {
    let file = edit(2, "mode: continuous\ndead_letter: { topic: orders-dead }");
    let pipeline = parse(&file, Path::new("p.yaml")).expect("valid");
    assert_eq!(pipeline.dead_letter_topic.as_deref(), Some("orders-dead"));
    one(
        &edit(2, "mode: continuous\ndead_letter: {}"),
        ErrorCode::MissingField,
        "dead_letter.topic",
        3,
    );
    for bad in [
        "ab",
        "projects/p/subscriptions/s",
        "1topic",
        "goog-dead",
        "a b c",
    ] {
        one(
            &edit(
                2,
                &format!("mode: continuous\ndead_letter: {{ topic: \"{bad}\" }}"),
            ),
            ErrorCode::InvalidValue,
            "dead_letter.topic",
            3,
        );
    }
    let full = edit(
        2,
        "mode: continuous\ndead_letter: { topic: projects/p/topics/dead-1 }",
    );
    parse(&full, Path::new("p.yaml")).expect("a full path is valid");
    one(
        &edit(2, "mode: continuous\ndead_letter: { topic: t, table: x }"),
        ErrorCode::UnknownKey,
        "dead_letter.table",
        3,
    );
}

#[test]
fn a_sink_path_with_a_url_scheme_is_refused() {
    for folder in ["gs://bucket/events", "s3://bucket/x", "file:///tmp/x"] {
        let e = one(
            &edit(
                5,
                &format!("    kind: sink\n    sink: {{ path: \"{folder}\" }}"),
            ),
            ErrorCode::InvalidValue,
            "targets[0].sink.path",
            6,
        );
        assert!(e.to_string().contains("local folder"), "{e}");
    }
}

/// `on_update` as a condition over the tables read: `any_of` or `all_of`, exactly one, each
/// name a table a flow reads, none twice.
#[test]
fn update_conditions_name_tables_the_flows_read() {
    let file = |on_update: &str| {
        format!(
            "pipeline: exports
mode: triggered
store: sqlite://x.db
schedule:
  every: 1h
  on_update: {on_update}
targets:
  - {{ name: copies, kind: table }}
  - {{ name: people, kind: table }}
flows:
  - {{ name: copies, target: copies, source: {{ table: orders.events }} }}
  - {{ name: people, target: people, source: {{ table: crm.customers }} }}
"
        )
    };
    for valid in [
        "true",
        "{ all_of: [orders.events, crm.customers] }",
        "{ any_of: [crm.customers] }",
    ] {
        let p = parse(&file(valid), Path::new("p.yaml")).unwrap_or_else(|e| panic!("{valid}: {e}"));
        assert!(p.schedule.expect("a schedule").on_update, "{valid}");
    }
    let p = parse(
        &file("{ all_of: [orders.events, crm.customers] }"),
        Path::new("p.yaml"),
    )
    .expect("valid");
    assert_eq!(
        p.schedule.expect("a schedule").update_condition,
        sluice_pipeline::UpdateCondition::AllOf(vec![
            "orders.events".to_owned(),
            "crm.customers".to_owned()
        ])
    );
    one(
        &file("{ all_of: [orders.events, shop.orders] }"),
        ErrorCode::InvalidSchedule,
        "schedule.on_update.all_of[1]",
        6,
    );
    one(
        &file("{ any_of: [orders.events], all_of: [crm.customers] }"),
        ErrorCode::InvalidSchedule,
        "schedule.on_update",
        6,
    );
    one(
        &file("{ any_of: [] }"),
        ErrorCode::InvalidSchedule,
        "schedule.on_update.any_of",
        6,
    );
    one(
        &file("{ any_of: [crm.customers, crm.customers] }"),
        ErrorCode::InvalidSchedule,
        "schedule.on_update.any_of[1]",
        6,
    );
    let wrong = errors(&file("{ anyof: [crm.customers] }"));
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert_eq!(wrong[0].line, Some(6), "{wrong:?}");
    assert!(wrong[0].message.contains("any_of"), "{wrong:?}");
    // With `on_update`, `depends_on_past` is refused.
    one(
        &file("true\n  depends_on_past: true"),
        ErrorCode::InvalidSchedule,
        "schedule.depends_on_past",
        7,
    );
}
