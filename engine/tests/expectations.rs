//! Expectations on a typed flow, through the whole flow path (`FlowRun`): a real SQLite store
//! and an in-process source (a fake, for its exact tally of acks, nacks and dropped handles,
//! which the emulator cannot give).
//!
//! * `drop`: the violating records are dead letters `expectation:NAME`, every other record a
//!   row, everything acked once.
//! * `fail`: the flow ends with `FlowError::Expectation` naming the expectation and the record;
//!   nothing is committed and nothing acked: every delivery is given back (nacked), none
//!   dropped.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use sluice_engine::{
    BatchSettings, Budget, CommitThenAck, Counters, DedupSettings, Expectation, Expectations,
    FlowError, FlowRun, InProcessSource, JsonFields, KeySource, OnViolation, RetrySettings,
    RunUntil, SourceMessage, TableStage,
};
use sluice_store::{
    ColumnType, FlowHandle, FlowStore, Layout, LedgerStore, Sql, SqliteStore, TypedColumn,
    TypedQuery, TypedTable, table_name,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const ORDERS: usize = 1_000;

/// Order `i`: region `mars` for every 20th from 3.
fn orders() -> InProcessSource {
    InProcessSource::new(
        (0..ORDERS)
            .map(|i| {
                let region = if i % 20 == 3 { "mars" } else { "earth" };
                SourceMessage {
                    message_id: format!("m{i}"),
                    publish_time_ms: 1_000,
                    attributes: BTreeMap::from([("key".to_owned(), format!("o{i}"))]),
                    data: Bytes::from(format!(r#"{{"order_id":"o{i}","region":"{region}"}}"#)),
                    event_time_ms: None,
                    problem: None,
                }
            })
            .collect(),
    )
}

fn column(name: &str) -> TypedColumn {
    TypedColumn {
        name: name.into(),
        ty: ColumnType::Text,
        nullable: true,
    }
}

fn same(sql: &str) -> Sql {
    Sql {
        postgres: sql.into(),
        sqlite: sql.into(),
    }
}

async fn store() -> (tempfile::TempDir, Arc<SqliteStore>, FlowHandle) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.db")).unwrap());
    let flow = store
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["orders".into()],
            typed: vec![TypedTable {
                target: "orders".into(),
                columns: vec![column("order_id"), column("region")],
                keys: Vec::new(),
            }],
            flows: vec!["f".into()],
        })
        .await
        .unwrap()
        .remove(0);
    (dir, store, flow)
}

/// The flow: order_id and region from the payload, `region <> 'mars'` expected.
fn flow(store: &Arc<SqliteStore>, flow: &FlowHandle, on_violation: OnViolation) -> FlowRun {
    let fields = vec![
        ("order_id".to_owned(), ColumnType::Text),
        ("region".to_owned(), ColumnType::Text),
    ];
    let query = TypedQuery {
        fields: fields.clone(),
        select: vec![
            (column("order_id"), same("\"order_id\"")),
            (column("region"), same("\"region\"")),
        ],
        filter: None,
        expectations: vec![("known_region".into(), same("(\"region\" <> 'mars')"))],
        grown: Vec::new(),
        changes: None,
    };
    let window = Duration::from_secs(600);
    let committer = CommitThenAck::new(
        store.clone(),
        flow.clone(),
        Arc::from(table_name("p", "orders").unwrap()),
        Arc::new(TableStage {
            fields: Some(Arc::new(JsonFields::new(fields))),
            ..TableStage::default()
        }),
        RetrySettings {
            max_attempts: 3,
            dedup_window: window,
            commit_bound: None,
            give_up_after: None,
        },
        CancellationToken::new(),
    )
    .with_typed(Arc::new(query))
    .with_expectations(Expectations::new(
        "p",
        "f",
        vec![Expectation {
            name: "known_region".into(),
            on_violation,
        }],
    ));
    FlowRun {
        source: Box::new(orders()),
        budget: Budget::new(2_000, 100 << 20),
        dedup: DedupSettings {
            key: KeySource::Attribute {
                name: "key".into(),
                dead_letter_if_missing: false,
            },
            window,
        },
        batch: BatchSettings {
            max_messages: 100,
            max_delay: Duration::from_millis(5),
        },
        committer,
        counters: Counters::new("p", "f"),
        until: RunUntil::Idle(Duration::from_millis(300)),
        drain_agreement: None,
    }
}

#[tokio::test]
async fn drop_dead_letters_the_violations_and_lands_the_rest() {
    let (_dir, store, handle) = store().await;
    let run = flow(&store, &handle, OnViolation::Drop);
    let end = run.run(CancellationToken::new()).await.unwrap();
    assert_eq!(end.report.rows, (ORDERS - ORDERS / 20) as u64);
    assert_eq!(end.report.dead_letters, (ORDERS / 20) as u64);
    assert_eq!(end.report.acked, ORDERS as u64);
    let progress = store.flow_progress(&handle).await.unwrap();
    assert_eq!(progress.committed, (ORDERS - ORDERS / 20) as u64);
    assert_eq!(progress.dead_lettered, (ORDERS / 20) as u64);
}

#[tokio::test]
async fn fail_stops_the_flow_and_gives_every_delivery_back() {
    let (_dir, store, handle) = store().await;
    let source = orders();
    let tally = source.tally();
    let mut run = flow(&store, &handle, OnViolation::Fail);
    run.source = Box::new(source);
    match run.run(CancellationToken::new()).await {
        Err(FlowError::Expectation(why)) => {
            assert!(why.contains("known_region") && why.contains("m3"), "{why}");
        }
        Err(other) => panic!("expected the flow to fail its expectation, got {other}"),
        Ok(_) => panic!("the flow ended without failing its expectation"),
    }
    assert_eq!(tally.acked.load(Ordering::SeqCst), 0, "nothing acked");
    assert_eq!(tally.dropped.load(Ordering::SeqCst), 0, "no handle dropped");
    assert!(
        tally.nacked.load(Ordering::SeqCst) > 0,
        "the failing batch given back"
    );
    assert_eq!(store.flow_progress(&handle).await.unwrap().committed, 0);
}
