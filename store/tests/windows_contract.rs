//! The windows role (`WindowStore`): counts per window and group written once, a flow's own
//! rows or a whole table's, every window at the end, resets, size changes and upgrades.
//! Each test runs on both backends (`contract/mod.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;

/// Window size of the window tests, ms.
const WINDOW_MS: i64 = 10_000;

/// A row with an event time and attributes (a JSON object).
fn event(key: &str, event_time_ms: i64, attributes_json: &str) -> Entry {
    let mut entry = entry(key, Effect::row(event_time_ms));
    entry.message.attributes_json = attributes_json.to_owned();
    entry
}

/// An emission of `p__events`' windows, grouped by `group_attribute`, into `windows`.
fn emission(windows: &str, group_attribute: &str, before_ms: i64) -> WindowEmission {
    WindowEmission {
        base_table: "p__events".into(),
        windows_table: windows.into(),
        size_ms: WINDOW_MS,
        group: sluice_store::WindowGroup::Attribute(group_attribute.into()),
        aggregates: Vec::new(),
        before_ms,
        rows: WindowRows::OfTheFlow,
    }
}

/// A count row as the counts table holds it.
fn count(window_start: i64, group: &str, count: i64) -> (i64, i64, String, i64) {
    (
        window_start,
        window_start + WINDOW_MS,
        group.to_owned(),
        count,
    )
}

fn emitted(rows: u64, emitted_before_ms: i64) -> WindowsEmitted {
    WindowsEmitted {
        rows,
        emitted_before_ms,
    }
}

/// A row of group `g` at `event_time_ms`, published at `publish_ms`.
fn event_published(key: &str, event_time_ms: i64, g: &str, publish_ms: i64) -> Entry {
    let mut entry = event(key, event_time_ms, &format!(r#"{{"g":"{g}"}}"#));
    entry.message.publish_time_ms = publish_ms;
    entry
}

/// "Every window" (`before_ms = i64::MAX`: a drained once flow; `i64::MAX` less the allowed
/// lateness: a window over a table with no live writer) emits every window left on both
/// backends, the trailing ones the watermark never passed included, each with its count, for
/// a flow's own rows and for a whole table; a second such emission writes nothing.
async fn emitting_every_window_emits_them_all(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let windows = window_table_name("p", "events").unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    store
        .commit(batch(
            &flows[0],
            vec![
                event("a1", 1_000, r#"{"g":"a"}"#),
                event("a2", 25_000, r#"{"g":"a"}"#),
                event("n1", 95_000, "{}"),
                event("b1", 99_000, r#"{"g":"b"}"#),
                event("b2", 99_999, r#"{"g":"b"}"#),
            ],
        ))
        .await
        .unwrap();
    store
        .commit(batch(&flows[1], vec![event("o1", 45_000, r#"{"g":"a"}"#)]))
        .await
        .unwrap();
    let last_end = i64::MAX - i64::MAX % WINDOW_MS;
    // The watermark passed 30 s while the flow ran...
    assert_eq!(
        store
            .emit_windows(&flows[0], &emission(&windows, "g", 30_000))
            .await
            .unwrap(),
        emitted(2, 30_000)
    );
    // ...then its input ended: every window left is emitted, the last one (90 s) too.
    let all = emission(&windows, "g", i64::MAX);
    assert_eq!(
        store.emit_windows(&flows[0], &all).await.unwrap(),
        emitted(2, last_end)
    );
    assert_eq!(
        store.emit_windows(&flows[0], &all).await.unwrap(),
        emitted(0, last_end)
    );
    let own = vec![
        count(0, "a", 1),
        count(20_000, "a", 1),
        count(90_000, "", 1),
        count(90_000, "b", 2),
    ];
    assert_eq!(place.window_counts(&windows).await.0, own);

    let others = window_table_name("p", "others").unwrap();
    store.prepare_window_table(&others).await.unwrap();
    let whole = WindowEmission {
        rows: WindowRows::All,
        ..emission(&others, "g", i64::MAX - 2_000)
    };
    assert_eq!(
        store.emit_windows(&flows[1], &whole).await.unwrap(),
        emitted(5, last_end)
    );
    assert_eq!(
        place.window_counts(&others).await.0,
        [
            count(0, "a", 1),
            count(20_000, "a", 1),
            count(40_000, "a", 1),
            count(90_000, "", 1),
            count(90_000, "b", 2),
        ]
    );
}

/// A store written before window sizes were recorded: once prepared, its counts table
/// (keyed by `(window_start, group_key)`) is keyed by window start and end, its rows kept, and
/// the flow's mark, which has no size, is taken by the size of its count rows; another size
/// starts again at the oldest row, beside them.
async fn counts_tables_of_an_older_version_are_upgraded(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let live = &flows[0];
    let windows = window_table_name("p", "events").unwrap();
    let without_rowid = if postgres { "" } else { " WITHOUT ROWID" };
    place
        .execute(&format!(
            "CREATE TABLE p__events__windows (
                 window_start BIGINT NOT NULL,
                 window_end   BIGINT NOT NULL,
                 group_key    TEXT NOT NULL,
                 count        BIGINT NOT NULL,
                 emitted_at   BIGINT NOT NULL,
                 PRIMARY KEY (window_start, group_key)
             ){without_rowid};
             INSERT INTO p__events__windows VALUES (0, 10000, 'a', 1, 0);
             INSERT INTO sluice_window_marks (flow_id, emitted_before) VALUES ({}, 10000);",
            live.id
        ))
        .await;
    store
        .commit(batch(
            live,
            vec![
                event("a1", 1_000, r#"{"g":"a"}"#),
                event("a2", 12_000, r#"{"g":"a"}"#),
                event("b1", 16_000, r#"{"g":"b"}"#),
            ],
        ))
        .await
        .unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    assert_eq!(
        store
            .emit_windows(live, &emission(&windows, "g", 20_000))
            .await
            .unwrap(),
        emitted(2, 20_000),
        "on from the old mark"
    );
    let five = WindowEmission {
        size_ms: 5_000,
        ..emission(&windows, "g", 20_000)
    };
    assert_eq!(
        store.emit_windows(live, &five).await.unwrap(),
        emitted(3, 20_000)
    );
    let counted = |rows: &[(i64, i64, &str)]| -> Vec<(i64, i64, String, i64)> {
        rows.iter()
            .map(|(start, end, g)| (*start, *end, g.to_string(), 1))
            .collect()
    };
    assert_eq!(
        place.window_counts(&windows).await.0,
        counted(&[
            (0, 5_000, "a"),
            (0, 10_000, "a"),
            (10_000, 15_000, "a"),
            (10_000, 20_000, "a"),
            (10_000, 20_000, "b"),
            (15_000, 20_000, "b"),
        ])
    );
}

/// Windows that end by `before_ms` are counted per group (a row without the attribute under
/// `""`), once: emitting again writes nothing, a row committed later into an emitted window
/// (late) does not change its count, and the next emission writes only the windows due since.
async fn windows_are_counted_once_per_window_and_group(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let live = &flows[0];
    let windows = window_table_name("p", "events").unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    assert!(
        place
            .indexes("p__events")
            .await
            .contains(&"p__events__by_event_time".to_owned()),
        "emissions read the base table through its (flow, event_time) index"
    );
    assert!(
        store
            .prepare_window_table("x\"; DROP TABLE p__events; --")
            .await
            .is_err()
    );
    store
        .commit(batch(
            live,
            vec![
                event("a1", 1_000, r#"{"g":"a"}"#),
                event("a2", 2_000, r#"{"g":"a","k":"v"}"#),
                event("b1", 3_000, r#"{"g":"b"}"#),
                event("n1", 9_999, r#"{"k":"v"}"#),
                event("b2", 10_000, r#"{"g":"b"}"#),
                event("b3", 15_000, r#"{"g":"b"}"#),
                event("n2", 19_999, "{}"),
                event("a3", 20_000, r#"{"g":"a"}"#),
                event("a4", 29_999, r#"{"g":"a"}"#),
            ],
        ))
        .await
        .unwrap();
    let by_g = |before_ms| emission(&windows, "g", before_ms);
    let before_emission = now_ms();

    assert_eq!(
        store.emit_windows(live, &by_g(25_000)).await.unwrap(),
        emitted(5, 20_000)
    );
    let first = vec![
        count(0, "", 1),
        count(0, "a", 2),
        count(0, "b", 1),
        count(10_000, "", 1),
        count(10_000, "b", 2),
    ];
    let (rows, emitted_at) = place.window_counts(&windows).await;
    assert_eq!(rows, first, "window 20s is not due before 30s");
    let emitted_at = emitted_at.unwrap();
    assert!(
        (before_emission - 60_000..=now_ms() + 60_000).contains(&emitted_at),
        "emitted_at is a wall-clock time in ms: {emitted_at}"
    );

    // Again, or with an earlier time: nothing is due, from this handle or another.
    assert_eq!(
        store.emit_windows(live, &by_g(25_000)).await.unwrap(),
        emitted(0, 20_000)
    );
    assert_eq!(
        place
            .open()
            .emit_windows(live, &by_g(12_000))
            .await
            .unwrap(),
        emitted(0, 20_000)
    );

    // Late: window 10s was emitted; its count stays.
    store
        .commit(batch(live, vec![event("late", 12_000, r#"{"g":"a"}"#)]))
        .await
        .unwrap();
    assert_eq!(
        store.emit_windows(live, &by_g(30_000)).await.unwrap(),
        emitted(1, 30_000)
    );
    let mut all = first;
    all.push(count(20_000, "a", 2));
    assert_eq!(place.window_counts(&windows).await.0, all);
    assert_eq!(
        store.emit_windows(live, &by_g(39_999)).await.unwrap(),
        emitted(0, 30_000),
        "window 30s ends at 40s"
    );
    // A window with no rows writes nothing but is passed.
    assert_eq!(
        store.emit_windows(live, &by_g(40_000)).await.unwrap(),
        emitted(0, 40_000)
    );
    assert_eq!(place.window_counts(&windows).await.0, all);
}

/// A flow's windows count its own rows of the base table only, and start at its own oldest
/// row; a flow with no rows yet emits nothing and has no mark.
async fn windows_count_their_own_flows_rows(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let (live, other) = (&flows[0], &flows[1]);
    let windows = window_table_name("p", "events").unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    let by_g = |before_ms| emission(&windows, "g", before_ms);

    assert_eq!(
        store.emit_windows(live, &by_g(50_000)).await.unwrap(),
        emitted(0, 0)
    );
    store
        .commit(batch(
            other,
            vec![
                event("o1", 1_000, r#"{"g":"a"}"#),
                event("o2", 11_000, r#"{"g":"a"}"#),
                event("o3", 12_000, r#"{"g":"b"}"#),
                event("o4", 21_000, r#"{"g":"a"}"#),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        store.emit_windows(live, &by_g(50_000)).await.unwrap(),
        emitted(0, 0),
        "the other flow's rows are not the live flow's"
    );
    store
        .commit(batch(
            live,
            vec![
                event("l1", 13_000, r#"{"g":"a"}"#),
                event("l2", 25_000, r#"{"g":"a"}"#),
            ],
        ))
        .await
        .unwrap();
    // Below the window of the flow's oldest row: nothing is due yet.
    assert_eq!(
        store.emit_windows(live, &by_g(19_999)).await.unwrap(),
        emitted(0, 10_000)
    );
    assert!(place.window_counts(&windows).await.0.is_empty());
    assert_eq!(
        store.emit_windows(live, &by_g(30_000)).await.unwrap(),
        emitted(2, 30_000)
    );
    assert_eq!(
        place.window_counts(&windows).await.0,
        [count(10_000, "a", 1), count(20_000, "a", 1)]
    );
}

/// A window over a `table` source counts every flow's rows of that table, from the oldest row
/// of any flow, under the mark of the flow that emits (which writes no rows itself).
async fn windows_over_a_table_count_every_flows_rows(postgres: bool) {
    let (place, store, _) = open(postgres).await;
    let flows = store
        .prepare(&layout(&["live", "other", "counts"]))
        .await
        .unwrap();
    let (live, other, counts) = (&flows[0], &flows[1], &flows[2]);
    let windows = window_table_name("p", "per_ten_s").unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    let base = table_name("p", "events").unwrap();
    let before = place.indexes(&base).await;
    assert!(
        !before.iter().any(|i| i.ends_with("__by_event_time_only")),
        "{before:?}"
    );
    let over_table = |before_ms| WindowEmission {
        rows: WindowRows::All,
        ..emission(&windows, "g", before_ms)
    };
    assert_eq!(
        store
            .emit_windows(counts, &over_table(50_000))
            .await
            .unwrap(),
        emitted(0, 0),
        "an empty table has no windows"
    );
    store
        .commit(batch(
            other,
            vec![
                event("o1", 11_000, r#"{"g":"a"}"#),
                event("o2", 21_000, r#"{"g":"b"}"#),
            ],
        ))
        .await
        .unwrap();
    store
        .commit(batch(
            live,
            vec![
                event("l1", 1_000, r#"{"g":"a"}"#),
                event("l2", 12_000, r#"{"g":"a"}"#),
                event("l3", 25_000, r#"{"g":"b"}"#),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        store
            .emit_windows(counts, &over_table(30_000))
            .await
            .unwrap(),
        emitted(3, 30_000),
        "from the live flow's oldest row, both flows' rows"
    );
    assert!(
        place
            .indexes(&base)
            .await
            .contains(&format!("{base}__by_event_time_only")),
        "a table counted whole is read through its event-time index"
    );
    assert_eq!(
        place.window_counts(&windows).await.0,
        [
            count(0, "a", 1),
            count(10_000, "a", 2),
            count(20_000, "b", 2)
        ]
    );
    // The next emission starts at the emitting flow's mark.
    store
        .commit(batch(other, vec![event("o3", 31_000, r#"{"g":"a"}"#)]))
        .await
        .unwrap();
    assert_eq!(
        store
            .emit_windows(counts, &over_table(40_000))
            .await
            .unwrap(),
        emitted(1, 40_000)
    );
    assert_eq!(place.window_counts(&windows).await.0.len(), 4);
}

/// A group attribute whose name has a dot is one attribute (not a path into an object), so is
/// one with quotes and backslashes; windows before the epoch start at their floor.
async fn window_groups_may_have_dots_in_their_name(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let (live, other) = (&flows[0], &flows[1]);
    let windows = window_table_name("p", "events").unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    store
        .commit(batch(
            live,
            vec![
                event("r1", -1, r#"{"geo.region":"us"}"#),
                event("r2", 0, r#"{"geo.region":"eu"}"#),
                event("r3", 5_000, r#"{"geo":{"region":"no"}}"#),
                event("r4", 9_000, r#"{"geo.region":"eu","g":"a"}"#),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        store
            .emit_windows(live, &emission(&windows, "geo.region", 10_000))
            .await
            .unwrap(),
        emitted(3, 10_000)
    );
    assert_eq!(
        place.window_counts(&windows).await.0,
        [count(-10_000, "us", 1), count(0, "", 1), count(0, "eu", 2)]
    );

    // The other flow (its own mark and counts table), by an attribute named `say "hi" \o/`.
    let odd_windows = window_table_name("p", "odd").unwrap();
    store.prepare_window_table(&odd_windows).await.unwrap();
    store
        .commit(batch(
            other,
            vec![
                event("q1", 1_000, r#"{"say \"hi\" \\o/":"x"}"#),
                event("q2", 2_000, r#"{"say \"hi\" \\o/":"x","say":"y"}"#),
                event("q3", 3_000, r#"{"say":{"hi":"z"}}"#),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        store
            .emit_windows(other, &emission(&odd_windows, r#"say "hi" \o/"#, 10_000))
            .await
            .unwrap(),
        emitted(2, 10_000)
    );
    assert_eq!(
        place.window_counts(&odd_windows).await.0,
        [count(0, "", 1), count(0, "x", 2)]
    );
}

/// `reset_flow` forgets the flow's window mark, and its next emission counts the flow's
/// windows again from the rows it has then: each count emitted before the reset is replaced
/// (a late row kept by the reset is now counted), never kept beside a new one or added to, and
/// a window whose rows all went is gone. The other flow's mark and counts stay.
async fn a_reset_counts_the_flows_windows_again(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let (stale, other) = (&flows[0], &flows[1]);
    let windows = window_table_name("p", "events").unwrap();
    // The other flow counts into a table of its own (a counts table holds one flow's windows).
    let other_windows = window_table_name("p", "others").unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    store.prepare_window_table(&other_windows).await.unwrap();
    store
        .commit(batch(
            stale,
            vec![
                event_published("s1", 1_000, "a", 1_000),
                event_published("s2", 11_000, "a", 1_000),
                event_published("s3", 12_000, "b", 5_000),
                event_published("s4", 25_000, "a", 5_000),
            ],
        ))
        .await
        .unwrap();
    store
        .commit(batch(
            other,
            vec![
                event_published("o1", 1_000, "a", 1_000),
                event_published("o2", 11_000, "a", 1_000),
            ],
        ))
        .await
        .unwrap();
    let by_g = |before_ms| emission(&windows, "g", before_ms);
    assert_eq!(
        store.emit_windows(stale, &by_g(30_000)).await.unwrap(),
        emitted(4, 30_000)
    );
    assert_eq!(
        store
            .emit_windows(other, &emission(&other_windows, "g", 20_000))
            .await
            .unwrap(),
        emitted(2, 20_000)
    );
    let others_counted = vec![count(0, "a", 1), count(10_000, "a", 1)];
    // Late into window 0: kept, not counted.
    store
        .commit(batch(
            stale,
            vec![event_published("late", 2_000, "a", 1_000)],
        ))
        .await
        .unwrap();
    assert_eq!(
        store.emit_windows(stale, &by_g(30_000)).await.unwrap(),
        emitted(0, 30_000)
    );
    assert_eq!(place.window_counts(&windows).await.0[0], count(0, "a", 1));

    // Every row kept: the windows are counted again from them, the late row too.
    store
        .reset_flow(stale, Some("p__events"), ResetRows::Keep, None)
        .await
        .unwrap();
    assert_eq!(place.window_marks().await, 1, "the other flow's mark only");
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    let live = &flows[0];
    // A reset that keeps the rows keeps the flow's id (and its ledger keys).
    assert_eq!(live.id, stale.id);
    assert_eq!(
        store.emit_windows(live, &by_g(30_000)).await.unwrap(),
        emitted(4, 30_000)
    );
    assert_eq!(
        place.window_counts(&windows).await.0,
        [
            count(0, "a", 2),
            count(10_000, "a", 1),
            count(10_000, "b", 1),
            count(20_000, "a", 1)
        ]
    );

    // Rows published since 5 s go (s3, s4) and the source gives some again (s3) and a new one:
    // the counts are of the rows now, window 20 s (s4's) is gone, nothing is counted twice.
    store
        .reset_flow(
            live,
            Some("p__events"),
            ResetRows::PublishedSince {
                since_ms: 5_000,
                hold_watermark: false,
            },
            None,
        )
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    let live = &flows[0];
    store
        .commit(batch(
            live,
            vec![
                event_published("s3", 12_000, "b", 5_000),
                event_published("s5", 13_000, "b", 6_000),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        store.emit_windows(live, &by_g(20_000)).await.unwrap(),
        emitted(3, 20_000)
    );
    assert_eq!(
        place.window_counts(&windows).await.0,
        [
            count(0, "a", 2),
            count(10_000, "a", 1),
            count(10_000, "b", 2)
        ]
    );

    // Every row goes and none comes again: no window is left.
    store
        .reset_flow(live, Some("p__events"), ResetRows::All, None)
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    assert_eq!(
        store.emit_windows(&flows[0], &by_g(30_000)).await.unwrap(),
        emitted(0, 0)
    );
    assert!(place.window_counts(&windows).await.0.is_empty());
    assert_eq!(
        store
            .emit_windows(&flows[1], &emission(&other_windows, "g", 10_000))
            .await
            .unwrap(),
        emitted(0, 20_000),
        "the other flow's mark stays"
    );
    assert_eq!(place.window_counts(&other_windows).await.0, others_counted);
}

/// A window size changed between runs (5 s windows emitted, then the file says 10 s): the new
/// size's windows are all emitted, from the flow's oldest row, beside the old size's count rows
/// (told apart by `window_end`), none dropped on a key the two share; back to 5 s, the 5 s
/// windows are counted again from the oldest row, so none is missing or twice.
async fn a_window_size_change_emits_every_window_of_the_new_size(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let live = &flows[0];
    let windows = window_table_name("p", "events").unwrap();
    store.prepare_window_table(&windows).await.unwrap();
    store
        .commit(batch(
            live,
            vec![
                event("a1", 1_000, r#"{"g":"a"}"#),
                event("a2", 6_000, r#"{"g":"a"}"#),
                event("a3", 12_000, r#"{"g":"a"}"#),
                event("a4", 16_000, r#"{"g":"a"}"#),
                event("b1", 17_000, r#"{"g":"b"}"#),
                event("a5", 22_000, r#"{"g":"a"}"#),
                event("a6", 31_000, r#"{"g":"a"}"#),
            ],
        ))
        .await
        .unwrap();
    let sized = |size_ms, before_ms| WindowEmission {
        size_ms,
        ..emission(&windows, "g", before_ms)
    };
    let counted = |rows: &[(i64, i64, &str, i64)]| -> Vec<(i64, i64, String, i64)> {
        rows.iter()
            .map(|(start, end, g, n)| (*start, *end, g.to_string(), *n))
            .collect()
    };
    assert_eq!(
        store
            .emit_windows(live, &sized(5_000, 15_000))
            .await
            .unwrap(),
        emitted(3, 15_000)
    );
    let five = counted(&[
        (0, 5_000, "a", 1),
        (5_000, 10_000, "a", 1),
        (10_000, 15_000, "a", 1),
    ]);
    assert_eq!(place.window_counts(&windows).await.0, five);

    assert_eq!(
        store
            .emit_windows(live, &sized(10_000, 40_000))
            .await
            .unwrap(),
        emitted(5, 40_000),
        "every 10 s window, from the oldest row"
    );
    let ten = counted(&[
        (0, 10_000, "a", 2),
        (10_000, 20_000, "a", 2),
        (10_000, 20_000, "b", 1),
        (20_000, 30_000, "a", 1),
        (30_000, 40_000, "a", 1),
    ]);
    let of_size = |rows: Vec<(i64, i64, String, i64)>, size: i64| -> Vec<_> {
        rows.into_iter().filter(|r| r.1 - r.0 == size).collect()
    };
    let rows = place.window_counts(&windows).await.0;
    assert_eq!(of_size(rows.clone(), 10_000), ten);
    assert_eq!(of_size(rows, 5_000), five, "the 5 s rows stay");

    assert_eq!(
        store
            .emit_windows(live, &sized(5_000, 40_000))
            .await
            .unwrap(),
        emitted(7, 40_000)
    );
    let rows = place.window_counts(&windows).await.0;
    assert_eq!(
        of_size(rows.clone(), 5_000),
        counted(&[
            (0, 5_000, "a", 1),
            (5_000, 10_000, "a", 1),
            (10_000, 15_000, "a", 1),
            (15_000, 20_000, "a", 1),
            (15_000, 20_000, "b", 1),
            (20_000, 25_000, "a", 1),
            (30_000, 35_000, "a", 1),
        ])
    );
    assert_eq!(of_size(rows, 10_000), ten);
}

on_both_backends!(
    emitting_every_window_emits_them_all,
    counts_tables_of_an_older_version_are_upgraded,
    windows_are_counted_once_per_window_and_group,
    windows_count_their_own_flows_rows,
    windows_over_a_table_count_every_flows_rows,
    window_groups_may_have_dots_in_their_name,
    a_reset_counts_the_flows_windows_again,
    a_window_size_change_emits_every_window_of_the_new_size,
);
