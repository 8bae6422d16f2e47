//! The example file of SPEC §4 loads into the expected model, and defaults are applied.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_pipeline::*;

fn spec_example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/orders.yaml")
}

#[test]
fn spec_example_loads_into_the_expected_model() {
    let pipeline = load(&spec_example()).expect("the SPEC §4 example is valid");
    // Relative paths are beside the file.
    let folder =
        std::fs::canonicalize(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")).unwrap();
    let beside = |path: &str| folder.join(path);
    let expected = Pipeline {
        name: "orders".into(),
        mode: Mode::Continuous,
        store: format!("sqlite://{}", beside("state/orders.db").display()),
        pubsub: PubSubSettings {
            project: Some("my-project".into()),
            endpoint: Some("http://127.0.0.1:8085".into()),
        },
        metrics_listen: Some("127.0.0.1:9464".into()),
        control_listen: Some("127.0.0.1:50051".into()),
        control_token_file: None,
        dead_letter_topic: None,
        schedule: None,
        give_up_after: None,
        targets: vec![
            Target {
                name: "events".into(),
                kind: TargetKind::Table,
                columns: Vec::new(),
                columns_follow_schema: false,
                keys: Vec::new(),
            },
            Target {
                name: "enrich".into(),
                kind: TargetKind::ForeachBatch {
                    endpoint: "http://127.0.0.1:7001".into(),
                },
                columns: Vec::new(),
                columns_follow_schema: false,
                keys: Vec::new(),
            },
            Target {
                name: "events_export".into(),
                kind: TargetKind::Sink {
                    format: "jsonl".into(),
                    path: beside("out/events.jsonl"),
                },
                columns: Vec::new(),
                columns_follow_schema: false,
                keys: Vec::new(),
            },
            Target {
                name: "per_minute".into(),
                kind: TargetKind::Window {
                    size: Duration::from_secs(60),
                    group_by: "attribute:region".into(),
                    allowed_lateness: Duration::ZERO,
                    aggregates: Vec::new(),
                },
                columns: Vec::new(),
                columns_follow_schema: false,
                keys: Vec::new(),
            },
        ],
        flows: vec![
            Flow {
                name: "events_backfill".into(),
                target: "events".into(),
                once: true,
                depends_on: vec![],
                source: Source::File {
                    path: beside("data/history/*.jsonl").display().to_string(),
                    max_record_bytes: 10_000_000,
                },
                query: Default::default(),
            },
            Flow {
                name: "events_live".into(),
                target: "events".into(),
                once: false,
                depends_on: vec!["events_backfill".into()],
                source: Source::PubSub(PubSubSource {
                    subscription: "events-sub".into(),
                    dedup: DedupSettings {
                        by: DedupBy::Attribute("event_id".into()),
                        window: Duration::from_secs(600),
                        on_missing: OnMissingKey::MessageId,
                    },
                    event_time: Some(EventTimeSettings {
                        attribute: "ts".into(),
                        on_bad_timestamp: OnBadTimestamp::DeadLetter,
                    }),
                    watermark: Some(WatermarkSettings {
                        tracking_subscription: TrackingSubscription::Auto,
                        band: Duration::from_secs(10),
                    }),
                    flow_control: FlowControl {
                        max_outstanding_messages: 10_000,
                        max_outstanding_bytes: 100 * 1024 * 1024,
                    },
                    batch: BatchSettings {
                        max_messages: 1000,
                        max_delay: Duration::from_millis(50),
                    },
                    max_attempts: 5,
                    poison: Poison::DeadLetter,
                    drain_idle: Duration::from_secs(5),
                    streams: 16,
                }),
                query: Default::default(),
            },
            Flow {
                name: "per_minute_counts".into(),
                target: "per_minute".into(),
                once: false,
                depends_on: vec![],
                source: Source::Table {
                    target: "events".into(),
                },
                query: Default::default(),
            },
        ],
        views: Vec::new(),
    };
    assert_eq!(pipeline, expected);
}

#[test]
fn defaults_are_applied() {
    let text = "\
pipeline: shop
targets: [{ name: events, kind: table }]
flows:
  - name: live
    target: events
    source: { pubsub: { subscription: projects/p/subscriptions/s } }
";
    let p = parse(text, Path::new("shop.yaml")).expect("valid");
    assert_eq!(p.mode, Mode::Continuous);
    // Beside the file: here, the working directory.
    let beside = std::fs::canonicalize(".").unwrap().join("state/shop.db");
    assert_eq!(p.store, format!("sqlite://{}", beside.display()));
    assert_eq!(p.pubsub, PubSubSettings::default());
    assert_eq!(p.metrics_listen, None);
    assert_eq!(p.control_listen, None);
    let Source::PubSub(s) = &p.flows[0].source else {
        panic!("a pubsub source")
    };
    assert_eq!(
        *s,
        PubSubSource {
            subscription: "projects/p/subscriptions/s".into(),
            dedup: DedupSettings {
                by: DedupBy::MessageId,
                window: Duration::from_secs(600),
                on_missing: OnMissingKey::MessageId,
            },
            event_time: None,
            watermark: None,
            flow_control: FlowControl {
                max_outstanding_messages: 10_000,
                max_outstanding_bytes: 100 * 1024 * 1024,
            },
            batch: BatchSettings {
                max_messages: 1000,
                max_delay: Duration::from_millis(50),
            },
            max_attempts: 5,
            poison: Poison::DeadLetter,
            drain_idle: Duration::from_secs(5),
            streams: 16,
        }
    );
}

/// `give_up_after`: 5 minutes by default in a triggered pipeline, as given when given, and
/// refused in a continuous one (which waits as long as it takes).
#[test]
fn give_up_after_is_for_triggered_pipelines() {
    let body = "targets: [{ name: events, kind: table }]
flows:
  - { name: live, target: events, source: { pubsub: { subscription: s } } }
";
    let parsed = |head: &str| {
        parse(
            &format!("pipeline: shop\n{head}{body}"),
            Path::new("p.yaml"),
        )
    };
    assert_eq!(parsed("").unwrap().give_up_after, None);
    assert_eq!(
        parsed("mode: triggered\n").unwrap().give_up_after,
        Some(Duration::from_secs(300))
    );
    assert_eq!(
        parsed("mode: triggered\ngive_up_after: 30s\n")
            .unwrap()
            .give_up_after,
        Some(Duration::from_secs(30))
    );
    let refused = parsed("give_up_after: 30s\n").unwrap_err().to_string();
    assert!(
        refused.contains("p.yaml:2:")
            && refused.contains("give_up_after")
            && refused.contains("mode: triggered"),
        "{refused}"
    );
}

#[test]
fn every_optional_section_parses() {
    let text = "\
pipeline: nightly
mode: triggered
store: postgres://sluice@db:5432/sluice
control: { listen: 0.0.0.0:50051, token_file: /run/secrets/token }
schedule: { every: 15m, timezone: Europe/Paris, semantics: data_interval, catchup: true }
targets:
  - { name: raw, kind: table }
  - { name: raw_view, kind: view }
flows:
  - name: a
    target: raw
    once: true
    source: { file: { path: in/*.jsonl } }
  - name: b
    target: raw
    depends_on: [a]
    source:
      pubsub:
        subscription: s
        dedup: { window: 1h, on_missing: dead_letter }
        event_time: { attribute: ts, on_bad_timestamp: publish_time }
        watermark: { tracking_subscription: s-track }
        flow_control: { max_outstanding_bytes: 1048576 }
        streams: 64
";
    let p = parse(text, Path::new("n.yaml")).expect("valid");
    assert_eq!(p.mode, Mode::Triggered);
    assert_eq!(
        p.control_token_file,
        Some(PathBuf::from("/run/secrets/token"))
    );
    assert_eq!(
        p.schedule,
        Some(Schedule {
            when: ScheduleWhen::Every(Duration::from_secs(900)),
            timezone: "Europe/Paris".into(),
            semantics: ScheduleSemantics::DataInterval,
            catchup: true,
            interval: None,
            on_update: false,
            update_condition: Default::default(),
            depends_on_past: false,
            min_interval: Duration::from_secs(60),
            start_ms: None,
            end_ms: None,
            retries: 0,
            retry_delay: Duration::from_secs(300),
        })
    );
    assert_eq!(p.targets[1].kind, TargetKind::View);
    assert_eq!(p.flows[1].depends_on, vec!["a".to_owned()]);
    let Source::PubSub(s) = &p.flows[1].source else {
        panic!("a pubsub source")
    };
    assert_eq!(s.dedup.window, Duration::from_secs(3600));
    assert_eq!(s.dedup.on_missing, OnMissingKey::DeadLetter);
    assert_eq!(
        s.event_time.as_ref().map(|e| e.on_bad_timestamp),
        Some(OnBadTimestamp::PublishTime)
    );
    assert_eq!(
        s.watermark
            .as_ref()
            .map(|w| w.tracking_subscription.clone()),
        Some(TrackingSubscription::Named("s-track".into()))
    );
    assert_eq!(s.flow_control.max_outstanding_bytes, 1_048_576);
    assert_eq!(s.streams, 64);
}
