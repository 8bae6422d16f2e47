//! The flows role (`FlowStore`): completions every handle sees, a reset of one flow only, and
//! reading a table in pages.
//! Each test runs on both backends (`contract/mod.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;

/// A once flow's completion, recorded through one handle, is what another handle (another
/// replica) reads; recording again is harmless.
async fn completions_are_seen_by_every_handle(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    assert!(store.completions("p").await.unwrap().is_empty());
    store.record_completion(&flows[1]).await.unwrap();
    store.record_completion(&flows[1]).await.unwrap();
    let other = place.open();
    let seen = other.completions("p").await.unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "other");
    assert!(
        seen[0].1 > 1_600_000_000_000,
        "a wall-clock time in ms: {}",
        seen[0].1
    );
    assert!(other.completions("q").await.unwrap().is_empty());
}

/// `reset_flow` forgets one flow (ledger, rows, dead letters, counters, completion) and leaves
/// the other flow of the same table alone; `keys_present` sees rows and dead letters of the
/// flow asked about, beyond any ledger window.
async fn reset_forgets_one_flow_only(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let (live, other) = (&flows[0], &flows[1]);
    store
        .commit(batch(live, vec![row("a"), row("b"), dead("c")]))
        .await
        .unwrap();
    store
        .commit(batch(other, vec![row("a"), row("z")]))
        .await
        .unwrap();
    store.record_completion(live).await.unwrap();
    store.record_completion(other).await.unwrap();
    let keys: Vec<String> = ["a", "b", "c", "z"].map(String::from).to_vec();
    assert_eq!(
        store.keys_present(live, "p__events", &keys).await.unwrap(),
        [true, true, true, false]
    );

    // Rows published before the seek point stay (the subscription cannot give them again);
    // the ledger, counters and completion go all the same.
    store
        .reset_flow(
            live,
            Some("p__events"),
            ResetRows::PublishedSince {
                since_ms: 2_000,
                hold_watermark: false,
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        store.count_rows("p__events", Some("live")).await.unwrap(),
        2
    );
    assert_eq!(place.dead_letter_reasons().await.len(), 1);
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    let live = &flows[0];
    assert_eq!(store.flow_progress(live).await.unwrap().committed, 0);
    store.record_completion(live).await.unwrap();

    store
        .reset_flow(live, Some("p__events"), ResetRows::All, None)
        .await
        .unwrap();
    // Handles taken before a reset are stale: prepare again, as a worker does at start.
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    let (live, other) = (&flows[0], &flows[1]);

    assert_eq!(
        store.count_rows("p__events", Some("live")).await.unwrap(),
        0
    );
    assert_eq!(
        store.count_rows("p__events", Some("other")).await.unwrap(),
        2
    );
    assert!(place.dead_letter_reasons().await.is_empty());
    assert_eq!(
        store.keys_present(live, "p__events", &keys).await.unwrap(),
        [false; 4]
    );
    assert_eq!(
        store.keys_present(other, "p__events", &keys).await.unwrap(),
        [true, false, false, true]
    );
    let progress = store.flow_progress(live).await.unwrap();
    assert_eq!(
        (progress.committed, progress.dead_lettered, progress.batches),
        (0, 0, 0)
    );
    assert_eq!(store.flow_progress(other).await.unwrap().committed, 2);
    let completed: Vec<String> = store
        .completions("p")
        .await
        .unwrap()
        .into_iter()
        .map(|(flow, _)| flow)
        .collect();
    assert_eq!(completed, ["other"]);
    // The ledger forgot the live flow's keys: they are new again, once.
    let outcome = store
        .commit(batch(live, vec![row("a"), row("b"), row("a")]))
        .await
        .unwrap();
    assert_eq!(outcome.written, [true, true, false]);
    // A bad table name is refused, not spliced.
    assert!(
        store
            .reset_flow(live, Some("x\"; DROP"), ResetRows::All, None)
            .await
            .is_err()
    );
}

/// `read_rows` pages through a table in `(flow, dedup_key, message_id)` order, every row once,
/// with what the row holds.
async fn rows_are_read_in_pages(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let keys: Vec<String> = (0..25).map(|i| format!("k{i:02}")).collect();
    let entries = keys.iter().map(|k| row(k)).collect();
    store.commit(batch(&flows[0], entries)).await.unwrap();
    store
        .commit(batch(&flows[1], vec![row("k00"), dead("zz")]))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .read_rows("p__events", cursor.as_ref(), 7)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 7);
        cursor = page.last().map(sluice_store::RowCursor::from);
        seen.extend(page);
    }
    let order: Vec<(String, String)> = seen
        .iter()
        .map(|r| (r.flow.clone(), r.dedup_key.clone()))
        .collect();
    let mut expected: Vec<(String, String)> = keys
        .iter()
        .map(|k| ("live".to_owned(), k.clone()))
        .collect();
    expected.push(("other".to_owned(), "k00".to_owned()));
    assert_eq!(
        order, expected,
        "every row once, in order; dead letters are not rows"
    );
    let first = &seen[0];
    assert_eq!(first.message_id, "m-k00");
    assert_eq!(first.publish_time_ms, 1_000);
    assert_eq!(first.event_time_ms, 5);
    // PostgreSQL gives its JSONB text form back (`{"k": "v"}`).
    assert_eq!(first.attributes_json.replace(' ', ""), r#"{"k":"v"}"#);
    assert_eq!(&first.data[..], b"payload");
}

/// Every table of the store's own that holds state under a `flow_id` is one a reset clears
/// (`RESET_CLEARS`), clears on its own terms (`RESET_CLEARS_APART`) or keeps on purpose
/// (`RESET_KEEPS`); and after a reset of a flow that committed, none of the tables it clears
/// holds a row of it. A new per-flow table that no list names fails here.
async fn a_reset_clears_every_table_that_holds_flow_state(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let tables = store.tables_with_column("flow_id").await.unwrap();
    assert!(tables.len() >= 8, "{tables:?}");
    let named: Vec<&str> = sluice_store::RESET_CLEARS
        .iter()
        .chain(&sluice_store::RESET_CLEARS_APART)
        .chain(&sluice_store::RESET_KEEPS)
        .copied()
        .collect();
    let unnamed: Vec<&String> = tables
        .iter()
        .filter(|t| !named.contains(&t.as_str()))
        .collect();
    assert!(
        unnamed.is_empty(),
        "per-flow tables no reset list names: {unnamed:?}"
    );
    for cleared in sluice_store::RESET_CLEARS {
        assert!(
            tables.iter().any(|t| t == cleared),
            "{cleared} is not in the schema"
        );
    }

    let live = &flows[0];
    store
        .commit(batch(live, vec![row("a"), dead("b")]))
        .await
        .unwrap();
    store.record_completion(live).await.unwrap();
    store
        .reset_flow(live, Some("p__events"), ResetRows::All, None)
        .await
        .unwrap();
    assert!(store.completions("p").await.unwrap().is_empty());
    assert_eq!(store.flow_progress(live).await.unwrap().committed, 0);
}

/// `clear_interval` deletes exactly the flow's rows whose event time lies in `[from, to)` and
/// their ledger keys: those keys are new again, the others (outside the interval, another
/// flow's, a dead letter's) stay duplicates.
async fn clearing_an_interval_frees_exactly_its_rows(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let (flow, other) = (&flows[0], &flows[1]);
    let at = |key: &str, event_ms: i64| entry(key, Effect::row(event_ms));
    let five = || {
        vec![
            at("a", 1_000),
            at("b", 2_000),
            at("c", 2_999),
            at("d", 3_000),
            dead("e"),
        ]
    };
    store.commit(batch(flow, five())).await.unwrap();
    store
        .commit(batch(other, vec![at("b", 2_000)]))
        .await
        .unwrap();
    let cleared = store
        .clear_interval(flow, "p__events", 2_000, 3_000)
        .await
        .unwrap();
    assert_eq!(cleared, 2);
    let sql = "SELECT flow || ':' || dedup_key FROM p__events ORDER BY 1";
    assert_eq!(
        place.texts(sql, sql, &[]).await,
        vec!["live:a", "live:d", "other:b"]
    );
    let again = store.commit(batch(flow, five())).await.unwrap();
    assert_eq!(again.written, vec![false, true, true, false, false]);
    let other_again = store
        .commit(batch(other, vec![at("b", 2_000)]))
        .await
        .unwrap();
    assert_eq!(other_again.written, vec![false], "another flow's key stays");
}

on_both_backends!(
    clearing_an_interval_frees_exactly_its_rows,
    completions_are_seen_by_every_handle,
    reset_forgets_one_flow_only,
    rows_are_read_in_pages,
    a_reset_clears_every_table_that_holds_flow_state,
);
