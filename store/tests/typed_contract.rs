//! Typed tables (`crate::typed`): rows written through a flow's query (select, where) in the
//! commit's transaction, a record whose query fails named with its column and nothing written,
//! declared columns added or a changed type refused at prepare, and a reset of typed rows.
//! Each test runs on both backends (`contract/mod.rs`); the expressions are compiled by the
//! pipeline file's own compiler, as `sluice run` compiles them.
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;
use sluice_store::{ColumnType, Sql, TypedColumn, TypedQuery, TypedTable, TypedValue};

fn column(name: &str, ty: ColumnType, nullable: bool) -> TypedColumn {
    TypedColumn {
        name: name.into(),
        ty,
        nullable,
    }
}

fn columns() -> Vec<TypedColumn> {
    vec![
        column("order_id", ColumnType::Text, false),
        column("cents", ColumnType::Integer, true),
        column("region", ColumnType::Text, true),
        column("ts", ColumnType::Timestamp, true),
    ]
}

fn typed_layout(columns: Vec<TypedColumn>) -> Layout {
    Layout {
        pipeline: "p".into(),
        tables: vec!["orders".into()],
        typed: vec![TypedTable {
            target: "orders".into(),
            columns,
            keys: Vec::new(),
        }],
        flows: vec!["load".into()],
    }
}

/// The decoded fields, and `select:` / `where:` compiled as the pipeline file compiles them.
fn query(select: &[(&str, &str)], filter: Option<&str>) -> TypedQuery {
    use sluice_pipeline::ColumnType as P;
    let fields = [
        ("order_id", ColumnType::Text, P::Text),
        ("amount", ColumnType::Numeric, P::Numeric),
        ("region", ColumnType::Text, P::Text),
        ("ts", ColumnType::Timestamp, P::Timestamp),
    ];
    let mut visible: Vec<(String, P)> =
        fields.iter().map(|(n, _, p)| (n.to_string(), *p)).collect();
    visible.extend(sluice_pipeline::query::envelope_fields());
    let sql = |text: &str| {
        let e = sluice_pipeline::expression::compile(text, &visible).unwrap();
        Sql {
            postgres: e.postgres,
            sqlite: e.sqlite,
        }
    };
    let declared = columns();
    TypedQuery {
        fields: fields.iter().map(|(n, t, _)| (n.to_string(), *t)).collect(),
        select: select
            .iter()
            .map(|(name, text)| {
                let c = declared.iter().find(|c| c.name == *name).unwrap().clone();
                (c, sql(text))
            })
            .collect(),
        filter: filter.map(sql),
        expectations: Vec::new(),
        grown: Vec::new(),
        changes: None,
    }
}

/// `query` with expectations (name, check), compiled over its output: the table's columns
/// and the envelope.
fn expecting(mut q: TypedQuery, checks: &[(&str, &str)]) -> TypedQuery {
    use sluice_pipeline::ColumnType as P;
    let mut visible: Vec<(String, P)> = [
        ("order_id", P::Text),
        ("cents", P::Integer),
        ("region", P::Text),
        ("ts", P::Timestamp),
    ]
    .iter()
    .map(|(n, t)| (n.to_string(), *t))
    .collect();
    visible.extend(sluice_pipeline::query::envelope_fields());
    q.expectations = checks
        .iter()
        .map(|(name, text)| {
            let e = sluice_pipeline::expression::compile(text, &visible).unwrap();
            (
                name.to_string(),
                Sql {
                    postgres: e.postgres,
                    sqlite: e.sqlite,
                },
            )
        })
        .collect();
    q
}

fn order(key: &str, amount: &str, region: &str) -> Entry {
    entry(
        key,
        Effect::Row {
            event_time_ms: 5,
            values: vec![
                TypedValue::Text(key.into()),
                TypedValue::Numeric(amount.into()),
                TypedValue::Text(region.into()),
                TypedValue::Timestamp(1_796_378_400_000),
            ],
        },
    )
}

async fn typed_open(postgres: bool) -> (Place, Arc<dyn InspectableStore>, FlowHandle) {
    let place = Place::new(postgres).await;
    let store = place.open();
    let mut flows = store.prepare(&typed_layout(columns())).await.unwrap();
    (place, store, flows.remove(0))
}

fn typed_batch(flow: &FlowHandle, entries: Vec<Entry>, query: &TypedQuery) -> CommitBatch {
    let mut batch = batch(flow, entries);
    batch.table = Arc::from(table_name("p", "orders").unwrap());
    batch.typed = Some(Arc::new(query.clone()));
    batch
}

/// `order_id|cents|region|ts` of every row, ts in UTC ISO 8601, in key order.
async fn rows(place: &Place) -> Vec<String> {
    place
        .texts(
            "SELECT order_id || '|' || COALESCE(cents, '') || '|' || COALESCE(region, '') || '|'
                 || COALESCE(ts, '') FROM p__orders ORDER BY _sluice_dedup_key",
            "SELECT order_id || '|' || COALESCE(cents::text, '') || '|' || COALESCE(region, '')
                 || '|' || COALESCE(to_char(ts AT TIME ZONE 'UTC',
                                            'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), '')
             FROM p__orders ORDER BY _sluice_dedup_key",
            &[],
        )
        .await
}

/// Each new row is its query's values; `where:` leaves a row out (counted, its key recorded:
/// a redelivery is a duplicate), and committing the batch again writes nothing.
async fn typed_rows_land_through_the_query(postgres: bool) {
    let (place, store, flow) = typed_open(postgres).await;
    let q = query(
        &[
            ("order_id", "order_id"),
            ("cents", "CAST(amount * 100 AS integer)"),
            ("region", "upper(region)"),
            ("ts", "ts"),
        ],
        Some("amount > 0"),
    );
    let entries = vec![
        order("a", "12.30", "eu"),
        order("b", "0", "us"),
        order("c", "7", "us"),
    ];
    let outcome = store
        .commit(typed_batch(&flow, entries.clone(), &q))
        .await
        .unwrap();
    assert_eq!(outcome.written, vec![true, true, true]);
    assert_eq!(outcome.filtered, 1);
    assert_eq!(
        rows(&place).await,
        vec![
            "a|1230|EU|2026-12-04T10:00:00.000Z",
            "c|700|US|2026-12-04T10:00:00.000Z"
        ]
    );
    assert_eq!(store.flow_progress(&flow).await.unwrap().committed, 2);
    let again = store.commit(typed_batch(&flow, entries, &q)).await.unwrap();
    assert_eq!(again.written, vec![false, false, false]);
    assert_eq!(again.filtered, 0);
    assert_eq!(rows(&place).await.len(), 2);
}

/// A record whose expression fails is named, with its column, and nothing of the batch is
/// written; so is a NULL in a column that is not nullable.
async fn a_failing_record_is_named_and_nothing_is_written(postgres: bool) {
    let (place, store, flow) = typed_open(postgres).await;
    let q = query(
        &[
            ("order_id", "order_id"),
            ("cents", "CAST(region AS integer)"),
        ],
        None,
    );
    let entries = vec![order("a", "1", "12"), order("b", "1", "twelve")];
    match store.commit(typed_batch(&flow, entries, &q)).await {
        Err(StoreError::Record {
            index,
            column,
            error,
        }) => {
            assert_eq!((index, column.as_str()), (1, "cents"), "{error}");
            assert!(error.contains("twelve"), "{error}");
        }
        other => panic!("expected a record error, got {other:?}"),
    }
    assert!(rows(&place).await.is_empty());
    let q = query(&[("order_id", "NULLIF(order_id, 'b')")], None);
    let entries = vec![order("a", "1", "x"), order("b", "1", "y")];
    match store.commit(typed_batch(&flow, entries, &q)).await {
        Err(StoreError::Record { index, column, .. }) => {
            assert_eq!((index, column.as_str()), (1, "order_id"));
        }
        other => panic!("expected a record error, got {other:?}"),
    }
    assert!(rows(&place).await.is_empty());
}

/// At prepare, a new nullable column is added; a changed type, or an envelope table where a
/// typed one is declared (and the other way round), is refused with nothing changed.
async fn declared_columns_grow_and_changes_are_refused(postgres: bool) {
    let (place, store, _) = typed_open(postgres).await;
    let mut grown = columns();
    grown.push(column("note", ColumnType::Text, true));
    store.prepare(&typed_layout(grown)).await.unwrap();
    let names = place
        .texts(
            "SELECT name FROM pragma_table_info('p__orders') WHERE name = 'note'",
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_name = 'p__orders' AND column_name = 'note'",
            &[],
        )
        .await;
    assert_eq!(names, vec!["note"]);
    let mut changed = columns();
    changed[1].ty = ColumnType::Text;
    match store.prepare(&typed_layout(changed)).await {
        Err(StoreError::Config(why)) => assert!(why.contains("`cents`"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    let mut strict = columns();
    strict.push(column("must", ColumnType::Text, false));
    strict.push(column("also", ColumnType::Text, true));
    // Nothing is half-applied: `also` is not added either (SQLite refuses any new NOT NULL
    // column; PostgreSQL one on a table with rows, and this one is empty, so it may add).
    let refused = store.prepare(&typed_layout(strict)).await.is_err();
    assert_eq!(refused, !postgres);
    if refused {
        let also = place
            .texts(
                "SELECT name FROM pragma_table_info('p__orders') WHERE name = 'also'",
                "SELECT column_name::text FROM information_schema.columns
                 WHERE table_name = 'p__orders' AND column_name = 'also'",
                &[],
            )
            .await;
        assert!(also.is_empty());
    }
    let mut envelope = typed_layout(columns());
    envelope.typed.clear();
    match store.prepare(&envelope).await {
        Err(StoreError::Config(why)) => assert!(why.contains("typed columns"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A column the query gained while running (`TypedQuery::grown`: a new schema revision's field)
/// is added by the first commit that writes with it, on its own or with another at once; a
/// grown column whose type differs from the table's is refused and nothing is written; a
/// record that fails in such a commit is named.
async fn a_column_grown_while_running_is_added_by_the_commit(postgres: bool) {
    let (place, store, flow) = typed_open(postgres).await;
    let note_column = || {
        place.texts(
            "SELECT name FROM pragma_table_info('p__orders') WHERE name = 'note'",
            "SELECT column_name::text FROM information_schema.columns
             WHERE table_name = 'p__orders' AND column_name = 'note'",
            &[],
        )
    };
    assert!(note_column().await.is_empty());
    let mut q = query(&[("order_id", "order_id"), ("region", "region")], None);
    let note = column("note", ColumnType::Text, true);
    q.fields.push(("note".into(), ColumnType::Text));
    q.select.push((
        note.clone(),
        Sql {
            postgres: "\"note\"".into(),
            sqlite: "\"note\"".into(),
        },
    ));
    q.grown.push(note);
    let noted = |key: &str| {
        let mut entry = order(key, "1", "eu");
        if let Effect::Row { values, .. } = &mut entry.effect {
            values.push(TypedValue::Text(format!("n-{key}")));
        }
        entry
    };
    let (first, second) = tokio::join!(
        store.commit(typed_batch(&flow, vec![noted("a"), noted("b")], &q)),
        store.commit(typed_batch(&flow, vec![noted("c")], &q)),
    );
    first.unwrap();
    second.unwrap();
    assert_eq!(note_column().await, vec!["note"]);
    let notes = place
        .texts(
            "SELECT order_id || '=' || note FROM p__orders ORDER BY order_id",
            "SELECT order_id || '=' || note FROM p__orders ORDER BY order_id",
            &[],
        )
        .await;
    assert_eq!(notes, vec!["a=n-a", "b=n-b", "c=n-c"]);
    let mut changed = q.clone();
    let region = changed
        .select
        .iter_mut()
        .find(|(c, _)| c.name == "region")
        .unwrap();
    region.0.ty = ColumnType::Integer;
    changed.grown = vec![region.0.clone()];
    match store
        .commit(typed_batch(&flow, vec![noted("d")], &changed))
        .await
    {
        Err(StoreError::Config(why)) => assert!(why.contains("`region`"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        rows(&place).await.len(),
        3,
        "nothing of the refused batch is written"
    );
    // A record that fails its query in a commit that adds a column is named as in any other
    // (on PostgreSQL such a commit is an explicit transaction, which the failure aborts).
    let mut failing = query(
        &[
            ("order_id", "order_id"),
            ("cents", "CAST(region AS integer)"),
        ],
        None,
    );
    failing.fields.push(("note".into(), ColumnType::Text));
    failing.select.push(q.select.last().unwrap().clone());
    failing.grown = q.grown.clone();
    match store
        .commit(typed_batch(&flow, vec![noted("e")], &failing))
        .await
    {
        Err(StoreError::Record { column, .. }) => assert_eq!(column, "cents"),
        other => panic!("expected a record error, got {other:?}"),
    }
}

/// A reset deletes the flow's typed rows and frees their keys; `keys_present` reads a typed
/// table's own column names.
async fn a_reset_clears_typed_rows(postgres: bool) {
    let (place, store, flow) = typed_open(postgres).await;
    let q = query(&[("order_id", "order_id")], None);
    store
        .commit(typed_batch(&flow, vec![order("a", "1", "x")], &q))
        .await
        .unwrap();
    let table = table_name("p", "orders").unwrap();
    let present = store
        .keys_present(&flow, &table, &["a".into(), "b".into()])
        .await
        .unwrap();
    assert_eq!(present, vec![true, false]);
    store
        .reset_flow(&flow, Some(&table), ResetRows::All, None)
        .await
        .unwrap();
    assert!(rows(&place).await.is_empty());
    let flow = store
        .prepare(&typed_layout(columns()))
        .await
        .unwrap()
        .remove(0);
    let again = store
        .commit(typed_batch(&flow, vec![order("a", "1", "x")], &q))
        .await
        .unwrap();
    assert_eq!(again.written, vec![true]);
}

/// Each row's expectations, evaluated without writing: false is a violation, NULL is not; a
/// dead letter violates nothing; a check that fails on a record names it.
async fn expectations_are_evaluated_per_record(postgres: bool) {
    let (place, store, flow) = typed_open(postgres).await;
    let output = [
        ("order_id", "order_id"),
        ("cents", "CAST(amount * 100 AS integer)"),
        ("region", "upper(region)"),
    ];
    // Checks read the output: `region` as `select` fills it (upper case).
    let q = expecting(
        query(&output, None),
        &[
            ("positive", "cents > 0"),
            ("known", "region IN ('EU', 'US')"),
            ("nullable", "NULLIF(region, 'EU') = 'US'"),
        ],
    );
    let entries = vec![
        order("a", "1", "eu"),
        order("b", "0", "mars"),
        dead("c"),
        order("d", "2", "us"),
    ];
    let violations = store
        .violations(&typed_batch(&flow, entries, &q))
        .await
        .unwrap();
    assert_eq!(
        violations,
        vec![
            vec![false, false, false],
            vec![true, true, true],
            vec![],
            vec![false, false, false],
        ]
    );
    assert!(rows(&place).await.is_empty(), "nothing written");
    // A record `where:` leaves out is no output row: no verdict.
    let q = expecting(
        query(&output, Some("amount > 0")),
        &[("known", "region IN ('EU', 'US')")],
    );
    let entries = vec![order("a", "1", "mars"), order("b", "0", "mars")];
    let violations = store
        .violations(&typed_batch(&flow, entries, &q))
        .await
        .unwrap();
    assert_eq!(violations, vec![vec![true], vec![]]);
    let q = expecting(
        query(&output, None),
        &[
            ("fine", "cents > 0"),
            ("cast", "CAST(region AS integer) > 0"),
        ],
    );
    let entries = vec![order("a", "1", "12"), order("b", "1", "twelve")];
    match store.violations(&typed_batch(&flow, entries, &q)).await {
        Err(StoreError::Record { index, column, .. }) => {
            assert_eq!((index, column.as_str()), (1, "expect:cast"));
        }
        other => panic!("expected a record error, got {other:?}"),
    }
}

/// The verdicts a batch carries are counted in its commit's transaction, per expectation, for
/// the entries whose key is new: a duplicate, or the same batch committed again, adds nothing;
/// an entry without a verdict (a dead letter) is not counted.
async fn expectation_counts_are_kept_with_the_commit(postgres: bool) {
    let (_place, store, flow) = typed_open(postgres).await;
    let q = expecting(
        query(
            &[
                ("order_id", "order_id"),
                ("cents", "CAST(amount * 100 AS integer)"),
            ],
            None,
        ),
        &[("positive", "cents > 0"), ("small", "cents < 500")],
    );
    let entries = vec![
        order("a", "1", "eu"),
        order("b", "0", "eu"),
        dead("c"),
        order("d", "9", "eu"),
        order("a", "1", "eu"),
    ];
    let mut batch = typed_batch(&flow, entries, &q);
    batch.verdicts = vec![
        vec![false, false],
        vec![true, false],
        vec![],
        vec![false, true],
        vec![false, false],
    ];
    store.commit(batch.clone()).await.unwrap();
    let counts = |c: Vec<sluice_store::ExpectationCount>| -> Vec<(String, u64, u64)> {
        c.into_iter()
            .map(|c| (c.expectation, c.passed, c.violated))
            .collect()
    };
    let expected = vec![("positive".to_owned(), 2, 1), ("small".to_owned(), 2, 1)];
    assert_eq!(
        counts(store.expectation_counts(&flow).await.unwrap()),
        expected
    );
    store.commit(batch).await.unwrap();
    assert_eq!(
        counts(store.expectation_counts(&flow).await.unwrap()),
        expected
    );
}

/// A typed table read as a feed: every row once, in commit order, its declared columns as
/// one JSON object in `data` whose values read back as the stored ones (times and dates in
/// ISO 8601, numbers as numbers, bytes in base64, json nested), its envelope under the usual
/// names, no attributes.
async fn a_typed_table_reads_as_a_feed_of_json_objects(postgres: bool) {
    use sluice_pipeline::ColumnType as P;
    use sluice_store::ReadPosition;
    let every: [(&str, ColumnType, P); 9] = [
        ("t", ColumnType::Text, P::Text),
        ("i", ColumnType::Integer, P::Integer),
        ("d", ColumnType::Double, P::Double),
        ("n", ColumnType::Numeric, P::Numeric),
        ("b", ColumnType::Boolean, P::Boolean),
        ("ts", ColumnType::Timestamp, P::Timestamp),
        ("day", ColumnType::Date, P::Date),
        ("j", ColumnType::Json, P::Json),
        ("raw", ColumnType::Bytes, P::Bytes),
    ];
    let place = Place::new(postgres).await;
    let store = place.open();
    let table_columns: Vec<TypedColumn> =
        every.iter().map(|(n, t, _)| column(n, *t, true)).collect();
    let mut layout = typed_layout(table_columns.clone());
    layout.flows.push("reader".into());
    let mut flows = store.prepare(&layout).await.unwrap();
    let (flow, reader) = (flows.remove(0), flows.remove(0));
    let visible: Vec<(String, P)> = every.iter().map(|(n, _, p)| (n.to_string(), *p)).collect();
    let q = TypedQuery {
        fields: every.iter().map(|(n, t, _)| (n.to_string(), *t)).collect(),
        select: table_columns
            .iter()
            .map(|c| {
                let e = sluice_pipeline::expression::compile(&format!("\"{}\"", c.name), &visible)
                    .unwrap();
                (
                    c.clone(),
                    Sql {
                        postgres: e.postgres,
                        sqlite: e.sqlite,
                    },
                )
            })
            .collect(),
        filter: None,
        expectations: Vec::new(),
        grown: Vec::new(),
        changes: None,
    };
    let full = vec![
        TypedValue::Text("it's \"quoted\"".into()),
        TypedValue::Integer(-42),
        TypedValue::Double(0.1 + 0.2),
        TypedValue::Numeric("12.5".into()),
        TypedValue::Boolean(true),
        TypedValue::Timestamp(1_796_378_400_123),
        TypedValue::Date("2026-12-04".into()),
        TypedValue::Json(r#"{"a":[1,"x"]}"#.into()),
        TypedValue::Bytes(bytes::Bytes::from_static(b"\x00\xffbytes")),
    ];
    let empty = vec![TypedValue::Null; 9];
    let entries = [("a", full), ("b", empty)]
        .into_iter()
        .map(|(key, values)| {
            entry(
                key,
                Effect::Row {
                    event_time_ms: 7_000,
                    values,
                },
            )
        })
        .collect();
    store.commit(typed_batch(&flow, entries, &q)).await.unwrap();
    let table = table_name("p", "orders").unwrap();
    let at = store
        .plan_range(&reader, &table, &ReadPosition::default())
        .await
        .unwrap();
    let rows = store.read_range(&table, &at, 10).await.unwrap();
    let lag = store
        .feed_lag(&table, &ReadPosition::default())
        .await
        .unwrap();
    assert_eq!(lag.rows_behind, 2);
    assert_eq!(rows.len(), 2);
    let first = &rows[0].row;
    assert_eq!(
        (
            first.flow.as_str(),
            first.dedup_key.as_str(),
            first.message_id.as_str()
        ),
        ("load", "a", "m-a")
    );
    assert_eq!((first.publish_time_ms, first.event_time_ms), (1_000, 7_000));
    assert_eq!(first.attributes_json, "{}");
    let object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&first.data).unwrap();
    let ts: jiff::Timestamp = object["ts"].as_str().unwrap().parse().unwrap();
    assert_eq!(ts.as_millisecond(), 1_796_378_400_123);
    assert_eq!(object["t"], "it's \"quoted\"");
    assert_eq!(object["i"], -42);
    assert_eq!(object["d"].as_f64(), Some(0.1 + 0.2));
    assert_eq!(object["n"].as_f64(), Some(12.5));
    assert_eq!(object["b"], true);
    assert_eq!(object["day"], "2026-12-04");
    assert_eq!(object["j"], serde_json::json!({"a": [1, "x"]}));
    assert_eq!(object["raw"], "AP9ieXRlcw==");
    let second: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&rows[1].row.data).unwrap();
    assert!(
        second.values().all(serde_json::Value::is_null),
        "{second:?}"
    );
}

/// A window over a typed table groups by a column and aggregates columns: per window and
/// group, `count`, `sum`, `min`, `max` and `avg` of the rows' values, in columns of the counts
/// table added by the first emission that needs them; a NULL group value is the group `""`.
async fn a_window_over_a_typed_table_aggregates_its_columns(postgres: bool) {
    use sluice_store::{WindowAggregate, WindowEmission, WindowFunction, WindowGroup, WindowRows};
    let (place, store, flow) = typed_open(postgres).await;
    let q = query(
        &[
            ("order_id", "order_id"),
            ("cents", "CAST(amount * 100 AS integer)"),
            ("region", "region"),
        ],
        None,
    );
    let at = |key: &str, amount: &str, region: &str, event_time_ms: i64| {
        let mut entry = order(key, amount, region);
        if let Effect::Row {
            event_time_ms: t, ..
        } = &mut entry.effect
        {
            *t = event_time_ms;
        }
        entry
    };
    let mut nameless = order("e", "4", "");
    if let Effect::Row {
        values,
        event_time_ms,
    } = &mut nameless.effect
    {
        values[2] = TypedValue::Null;
        *event_time_ms = 3_000;
    }
    store
        .commit(typed_batch(
            &flow,
            vec![
                at("a", "1", "eu", 1_000),
                at("b", "2.5", "eu", 2_000),
                at("c", "10", "us", 9_000),
                at("d", "7", "eu", 12_000),
                nameless,
            ],
            &q,
        ))
        .await
        .unwrap();
    let windows = sluice_store::window_table_name("p", "gold").unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    let aggregate = |name: &str, function, column: Option<&str>, ty| WindowAggregate {
        name: name.into(),
        function,
        column: column.map(str::to_owned),
        ty,
    };
    let emission = WindowEmission {
        base_table: table_name("p", "orders").unwrap(),
        windows_table: windows.clone(),
        size_ms: 10_000,
        group: WindowGroup::Column("region".into()),
        aggregates: vec![
            aggregate(
                "total",
                WindowFunction::Sum,
                Some("cents"),
                ColumnType::Numeric,
            ),
            aggregate(
                "least",
                WindowFunction::Min,
                Some("cents"),
                ColumnType::Integer,
            ),
            aggregate(
                "most",
                WindowFunction::Max,
                Some("cents"),
                ColumnType::Integer,
            ),
            aggregate(
                "mean",
                WindowFunction::Avg,
                Some("cents"),
                ColumnType::Double,
            ),
            aggregate(
                "ids",
                WindowFunction::Count,
                Some("order_id"),
                ColumnType::Integer,
            ),
        ],
        before_ms: i64::MAX,
        rows: WindowRows::All,
    };
    let emitted = store.emit_windows(&flow, &emission).await.unwrap();
    assert_eq!(emitted.rows, 4);
    // Another window whose counts table has the aggregate's column in another type (the file
    // changed what the aggregate computes): refused, naming the column, nothing emitted.
    let mut layout = typed_layout(columns());
    layout.flows.push("other".into());
    let other = store.prepare(&layout).await.unwrap().remove(1);
    let changed = sluice_store::window_table_name("p", "silver").unwrap();
    store.prepare_window_table(&changed).await.unwrap();
    place
        .execute("ALTER TABLE p__silver__windows ADD COLUMN total TEXT")
        .await;
    let refused = store
        .emit_windows(
            &other,
            &WindowEmission {
                windows_table: changed,
                ..emission.clone()
            },
        )
        .await;
    assert!(
        matches!(&refused, Err(StoreError::Config(why)) if why.contains("\"total\"")),
        "{refused:?}"
    );
    let counts = place
        .texts(
            "SELECT window_start || '|' || group_key || '|' || count || '|' || total || '|'
                 || least || '|' || most || '|' || mean || '|' || ids
             FROM p__gold__windows ORDER BY window_start, group_key",
            "SELECT window_start || '|' || group_key || '|' || count || '|' || total || '|'
                 || least || '|' || most || '|' || mean || '|' || ids
             FROM p__gold__windows ORDER BY window_start, group_key",
            &[],
        )
        .await;
    assert_eq!(
        counts,
        vec![
            "0||1|400|400|400|400.0|1",
            "0|eu|2|350|100|250|175.0|2",
            "0|us|1|1000|1000|1000|1000.0|1",
            "10000|eu|1|700|700|700|700.0|1",
        ]
        .into_iter()
        .map(|row| if postgres {
            row.replace(".0|", "|")
        } else {
            row.to_owned()
        })
        .collect::<Vec<_>>()
    );
}

/// A window's sum past 64 bits: exact on PostgreSQL (numeric), refused on SQLite as a
/// misconfiguration (the window flow fails rather than retries the same overflow forever).
async fn a_window_sum_past_64_bits_is_exact_or_refused(postgres: bool) {
    use sluice_store::{WindowAggregate, WindowEmission, WindowFunction, WindowGroup, WindowRows};
    let (place, store, flow) = typed_open(postgres).await;
    let q = query(
        &[
            ("order_id", "order_id"),
            ("cents", "CAST(amount * 100 AS integer)"),
            ("region", "region"),
        ],
        None,
    );
    // Three orders of 4e18 cents: 1.2e19 together, past i64::MAX (about 9.2e18).
    let big = ["a", "b", "c"]
        .map(|key| order(key, "40000000000000000", "eu"))
        .to_vec();
    store.commit(typed_batch(&flow, big, &q)).await.unwrap();
    let windows = sluice_store::window_table_name("p", "gold").unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    let emission = WindowEmission {
        base_table: table_name("p", "orders").unwrap(),
        windows_table: windows,
        size_ms: 10_000,
        group: WindowGroup::Column("region".into()),
        aggregates: vec![WindowAggregate {
            name: "total".into(),
            function: WindowFunction::Sum,
            column: Some("cents".into()),
            ty: ColumnType::Numeric,
        }],
        before_ms: i64::MAX,
        rows: WindowRows::All,
    };
    let emitted = store.emit_windows(&flow, &emission).await;
    if postgres {
        assert_eq!(emitted.unwrap().rows, 1);
        let total = place
            .texts(
                "SELECT CAST(total AS TEXT) FROM p__gold__windows",
                "SELECT CAST(total AS TEXT) FROM p__gold__windows",
                &[],
            )
            .await;
        assert_eq!(total, vec!["12000000000000000000"]);
    } else {
        assert!(
            matches!(&emitted, Err(StoreError::Config(why)) if why.contains("64-bit")),
            "{emitted:?}"
        );
    }
}

on_both_backends!(
    a_column_grown_while_running_is_added_by_the_commit,
    a_window_sum_past_64_bits_is_exact_or_refused,
    expectations_are_evaluated_per_record,
    typed_rows_land_through_the_query,
    a_failing_record_is_named_and_nothing_is_written,
    declared_columns_grow_and_changes_are_refused,
    a_reset_clears_typed_rows,
    a_typed_table_reads_as_a_feed_of_json_objects,
    a_window_over_a_typed_table_aggregates_its_columns,
    expectation_counts_are_kept_with_the_commit,
);
