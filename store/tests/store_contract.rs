//! The store contract, run against both backends: a real SQLite file and a real PostgreSQL
//! server (a fresh database per test on 127.0.0.1:5432, or `SLUICE_TEST_POSTGRES`).
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use sluice_dedup::DedupKey;
use sluice_store::testing::InspectableStore;
use sluice_store::{
    BucketCounts, BucketMessage, CommitBatch, Effect, Entry, FlowHandle, Layout, LeaseGrant,
    LeaseRequest, MessageFields, MessageReport, PostgresStore, ResetRows, ScratchDatabase,
    SqliteStore, StoreError, WatermarkRecord, WindowEmission, WindowRows, WindowsEmitted,
    WorkerBeat, table_name, window_table_name,
};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn entry(key: &str, effect: Effect) -> Entry {
    Entry {
        key: DedupKey::new(key),
        message: MessageFields {
            message_id: format!("m-{key}"),
            publish_time_ms: 1_000,
            attributes_json: r#"{"k":"v"}"#.to_owned(),
            data: Bytes::from_static(b"payload"),
        },
        effect,
    }
}

fn row(key: &str) -> Entry {
    entry(key, Effect::Row { event_time_ms: 5 })
}

fn dead(key: &str) -> Entry {
    entry(
        key,
        Effect::DeadLetter {
            reason: "bad_timestamp".into(),
            error: "nope".into(),
            attempts: 1,
        },
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A batch committed now, with a dedup window of `window_ms`.
fn batch_with_window(flow: &FlowHandle, entries: Vec<Entry>, window_ms: i64) -> CommitBatch {
    let now = now_ms();
    CommitBatch {
        flow: flow.clone(),
        table: Arc::from(table_name("p", "events").unwrap()),
        entries,
        now_ms: now,
        expires_at_ms: now + window_ms,
        hook: None,
        watermark_progress: false,
        commit_by_ms: None,
    }
}

fn batch(flow: &FlowHandle, entries: Vec<Entry>) -> CommitBatch {
    batch_with_window(flow, entries, 600_000)
}

fn layout(flows: &[&str]) -> Layout {
    Layout {
        pipeline: "p".into(),
        tables: vec!["events".into()],
        flows: flows.iter().map(|f| f.to_string()).collect(),
    }
}

/// Where a test's store lives; reopening gives a second handle on the same state.
enum Place {
    Sqlite(tempfile::TempDir),
    Postgres(ScratchDatabase),
}

impl Place {
    async fn new(postgres: bool) -> Self {
        if postgres {
            Place::Postgres(ScratchDatabase::create().await.unwrap())
        } else {
            Place::Sqlite(tempfile::tempdir().unwrap())
        }
    }

    fn open(&self) -> Arc<dyn InspectableStore> {
        match self {
            Place::Sqlite(dir) => {
                Arc::new(SqliteStore::open(&dir.path().join("nested/state.db")).unwrap())
            }
            Place::Postgres(db) => Arc::new(PostgresStore::open(db.url()).unwrap()),
        }
    }

    /// The rows of a window counts table, `(window_start, window_end, group_key, count)` in
    /// window and group order, and the smallest `emitted_at`, read straight from the database.
    async fn window_counts(&self, table: &str) -> (Vec<(i64, i64, String, i64)>, Option<i64>) {
        let sql = format!(
            "SELECT window_start, window_end, group_key, count, emitted_at FROM \"{table}\"
             ORDER BY window_start, window_end, group_key"
        );
        let rows: Vec<((i64, i64, String, i64), i64)> = match self {
            Place::Sqlite(dir) => {
                let conn = sqlite_connection(dir);
                let mut statement = conn.prepare(&sql).unwrap();
                statement
                    .query_map([], |r| {
                        Ok(((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?), r.get(4)?))
                    })
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            }
            Place::Postgres(db) => {
                let client = postgres_client(db).await;
                client
                    .query(&sql, &[])
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| ((r.get(0), r.get(1), r.get(2), r.get(3)), r.get(4)))
                    .collect()
            }
        };
        let emitted_at = rows.iter().map(|(_, at)| *at).min();
        (rows.into_iter().map(|(row, _)| row).collect(), emitted_at)
    }

    /// The names of `table`'s indexes, sorted, read from the database's catalog.
    async fn indexes(&self, table: &str) -> Vec<String> {
        let mut names = self
            .texts(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1",
                "SELECT indexname::text FROM pg_indexes WHERE tablename = $1",
                &[table],
            )
            .await;
        names.sort();
        names
    }

    /// The text column of a query with text parameters, read straight from the database.
    async fn texts(
        &self,
        sqlite_sql: &str,
        postgres_sql: &str,
        parameters: &[&str],
    ) -> Vec<String> {
        match self {
            Place::Sqlite(dir) => {
                let conn = sqlite_connection(dir);
                let mut statement = conn.prepare(sqlite_sql).unwrap();
                statement
                    .query_map(rusqlite::params_from_iter(parameters), |r| r.get(0))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            }
            Place::Postgres(db) => postgres_client(db)
                .await
                .query(
                    postgres_sql,
                    &parameters
                        .iter()
                        .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
                        .collect::<Vec<_>>(),
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect(),
        }
    }

    /// How many flows have a window emission mark, read straight from the database.
    async fn window_marks(&self) -> i64 {
        let sql = "SELECT count(*) FROM sluice_window_marks";
        match self {
            Place::Sqlite(dir) => {
                let conn = sqlite_connection(dir);
                conn.query_row(sql, [], |r| r.get(0)).unwrap()
            }
            Place::Postgres(db) => {
                let client = postgres_client(db).await;
                client.query_one(sql, &[]).await.unwrap().get(0)
            }
        }
    }

    /// Runs `sql` (statements separated by `;`) straight on the database.
    async fn execute(&self, sql: &str) {
        match self {
            Place::Sqlite(dir) => sqlite_connection(dir).execute_batch(sql).unwrap(),
            Place::Postgres(db) => postgres_client(db).await.batch_execute(sql).await.unwrap(),
        }
    }

    /// Reasons in the dead-letter table, read straight from the database.
    async fn dead_letter_reasons(&self) -> Vec<String> {
        let sql = "SELECT reason FROM p__dead_letter";
        self.texts(sql, sql, &[]).await
    }
}

fn sqlite_connection(dir: &tempfile::TempDir) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.path().join("nested/state.db")).unwrap()
}

async fn postgres_client(db: &ScratchDatabase) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

async fn open(postgres: bool) -> (Place, Arc<dyn InspectableStore>, Vec<FlowHandle>) {
    let place = Place::new(postgres).await;
    let store = place.open();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    (place, store, flows)
}

/// Runs each contract test once per backend.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test] async fn $name() { super::$name(false).await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $name() { super::$name(true).await })*
        }
    };
}

on_both_backends!(
    ledger_decides_duplicates_within_and_across_batches,
    ledgers_are_per_flow,
    dead_letters_are_deduplicated_too,
    expired_keys_are_taken_over,
    state_survives_reopen,
    bad_identifiers_are_refused,
    large_batches_stay_exact,
    leases_have_one_holder_and_move_when_they_expire,
    heartbeats_list_live_workers,
    concurrent_commits_of_one_key_write_it_once,
    completions_are_seen_by_every_handle,
    reset_forgets_one_flow_only,
    rows_are_read_in_pages,
    bucket_counts_count_each_message_once,
    a_commit_records_its_messages_settled,
    watermarks_never_move_back,
    a_fenced_watermark_needs_the_readers_lease,
    reset_forgets_buckets_and_watermark,
    windows_are_counted_once_per_window_and_group,
    windows_count_their_own_flows_rows,
    windows_over_a_table_count_every_flows_rows,
    window_groups_may_have_dots_in_their_name,
    a_reset_counts_the_flows_windows_again,
    a_window_size_change_emits_every_window_of_the_new_size,
    a_batch_past_its_commit_deadline_writes_nothing,
    a_reset_keeps_the_ledger_keys_of_the_rows_it_keeps,
    drain_reports_come_with_the_readers_heartbeats,
    emitting_every_window_emits_them_all,
    counts_tables_of_an_older_version_are_upgraded,
);

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

/// Drain reports are per flow and worker, last report wins, come with the reader's latest
/// heartbeat (none once it left the pool), and go when withdrawn or when the flow is reset.
async fn drain_reports_come_with_the_readers_heartbeats(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let beat = |worker: &str| WorkerBeat {
        pipeline: "p".into(),
        worker: worker.into(),
        host: "h".into(),
        pid: 1,
    };
    store.heartbeat(&beat("a")).await.unwrap();
    store.report_drain(&flows[0], "a", false).await.unwrap();
    store.report_drain(&flows[0], "b", false).await.unwrap();
    store.report_drain(&flows[0], "a", true).await.unwrap();
    store.report_drain(&flows[1], "c", false).await.unwrap();
    let census = store.drain_census(&flows[0]).await.unwrap();
    assert!(
        (census.now_ms - now_ms()).abs() < 60_000,
        "store clock {}",
        census.now_ms
    );
    let seen: Vec<(&str, bool, bool)> = census
        .reports
        .iter()
        .map(|r| (r.worker.as_str(), r.drained, r.last_beat_ms.is_some()))
        .collect();
    assert_eq!(seen, [("a", true, true), ("b", false, false)]);
    assert!(census.reports[0].reported_at_ms <= census.now_ms);
    store.withdraw_drain(&flows[0], "a").await.unwrap();
    assert_eq!(
        store.drain_census(&flows[0]).await.unwrap().reports.len(),
        1
    );
    store
        .reset_flow(&flows[1], Some("p__events"), ResetRows::All)
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    assert!(
        store
            .drain_census(&flows[1])
            .await
            .unwrap()
            .reports
            .is_empty()
    );
}

/// A row published at `publish_ms`.
fn row_published(key: &str, publish_ms: i64) -> Entry {
    let mut entry = row(key);
    entry.message.publish_time_ms = publish_ms;
    entry.message.message_id = format!("m-{key}-{publish_ms}");
    entry
}

/// The ledger keeps every key whose row is kept: a reset without a seek keeps all rows, so a
/// committed-but-unacked message redelivered after it is still a duplicate; a reset since T
/// forgets only the keys of the rows it deletes, so a publisher's copy published after T of a
/// key whose original (before T) is kept is still a duplicate, while the replayed messages
/// (published after T) land again, once.
async fn a_reset_keeps_the_ledger_keys_of_the_rows_it_keeps(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    store
        .commit(batch(
            &flows[0],
            vec![
                row_published("old", 1_000),
                row_published("new", 5_000),
                dead("bad"),
            ],
        ))
        .await
        .unwrap();
    store
        .reset_flow(&flows[0], Some("p__events"), ResetRows::Keep)
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    let out = store
        .commit(batch(
            &flows[0],
            vec![
                row_published("old", 1_000),
                row_published("new", 5_000),
                dead("bad"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(
        out.written,
        [false, false, false],
        "nothing was deleted: all kept keys"
    );
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 2);

    store
        .reset_flow(
            &flows[0],
            Some("p__events"),
            ResetRows::PublishedSince(3_000),
        )
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 1);
    let out = store
        .commit(batch(
            &flows[0],
            vec![
                // A publisher's copy of `old`, published after the seek point.
                row_published("old", 6_000),
                // The replay of `new`, whose row the reset deleted.
                row_published("new", 5_000),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(out.written, [false, true]);
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 2);
    assert_eq!(store.key_census("p__events").await.unwrap(), (2, 0));
}

/// A batch that reaches the store after its `commit_by_ms` is refused as `Stale` inside the
/// transaction and leaves nothing behind (no key, no row, no counter); one within it commits.
async fn a_batch_past_its_commit_deadline_writes_nothing(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let late = CommitBatch {
        commit_by_ms: Some(now_ms() - 1_000),
        ..batch(&flows[0], vec![row("a"), dead("b")])
    };
    let refused = store.commit(late).await;
    assert!(matches!(refused, Err(StoreError::Stale)), "{refused:?}");
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 0);
    assert_eq!(store.flow_progress(&flows[0]).await.unwrap().batches, 0);
    let in_time = CommitBatch {
        commit_by_ms: Some(now_ms() + 60_000),
        ..batch(&flows[0], vec![row("a"), dead("b")])
    };
    let out = store.commit(in_time).await.unwrap();
    assert_eq!(
        out.written,
        vec![true, true],
        "the refused batch claimed no key"
    );
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 1);
}

async fn ledger_decides_duplicates_within_and_across_batches(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let out = store
        .commit(batch(&flows[0], vec![row("a"), row("b"), row("a")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true, true, false]);
    let out = store
        .commit(batch(&flows[0], vec![row("b"), row("c")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false, true]);
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 3);
    assert_eq!(store.key_census("p__events").await.unwrap(), (3, 0));
    let progress = store.flow_progress(&flows[0]).await.unwrap();
    assert_eq!(
        (progress.committed, progress.duplicates, progress.batches),
        (3, 2, 2)
    );
}

async fn ledgers_are_per_flow(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    store
        .commit(batch(&flows[0], vec![row("a")]))
        .await
        .unwrap();
    let out = store
        .commit(batch(&flows[1], vec![row("a")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
    assert_eq!(
        store.count_rows("p__events", Some("live")).await.unwrap(),
        1
    );
    assert_eq!(
        store.count_rows("p__events", Some("other")).await.unwrap(),
        1
    );
}

async fn dead_letters_are_deduplicated_too(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    let out = store
        .commit(batch(&flows[0], vec![dead("x")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
    let out = store
        .commit(batch(&flows[0], vec![dead("x"), row("x")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false, false]);
    let progress = store.flow_progress(&flows[0]).await.unwrap();
    assert_eq!((progress.dead_lettered, progress.committed), (1, 0));
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 0);
    assert_eq!(place.dead_letter_reasons().await, vec!["bad_timestamp"]);
}

async fn expired_keys_are_taken_over(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let out = store
        .commit(batch_with_window(&flows[0], vec![row("a"), row("b")], 400))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true, true]);
    // Inside the window: duplicates.
    let out = store
        .commit(batch_with_window(&flows[0], vec![row("a")], 400))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The window has passed: "a" is new again; upkeep then leaves "b" new as well.
    let out = store
        .commit(batch_with_window(&flows[0], vec![row("a")], 400))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
    store.ledger_upkeep().await.unwrap();
    let out = store
        .commit(batch_with_window(&flows[0], vec![row("b")], 400))
        .await
        .unwrap();
    assert_eq!(out.written, vec![true]);
}

async fn state_survives_reopen(postgres: bool) {
    let (place, store, flows) = open(postgres).await;
    store
        .commit(batch(&flows[0], vec![row("a")]))
        .await
        .unwrap();
    drop(store);
    let store = place.open();
    let again = store.prepare(&layout(&["live"])).await.unwrap();
    assert_eq!(again[0].id, flows[0].id);
    let out = store
        .commit(batch(&again[0], vec![row("a")]))
        .await
        .unwrap();
    assert_eq!(out.written, vec![false]);
}

async fn bad_identifiers_are_refused(postgres: bool) {
    let place = Place::new(postgres).await;
    let err = place
        .open()
        .prepare(&Layout {
            pipeline: "p".into(),
            tables: vec!["x\"; drop".into()],
            flows: vec![],
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not a valid identifier"), "{err}");
}

async fn large_batches_stay_exact(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    // 300 entries: k0..k249, then k0..k49 again (duplicates later in the same batch).
    let entries: Vec<_> = (0..250)
        .chain(0..50)
        .map(|i| row(&format!("k{i}")))
        .collect();
    let out = store.commit(batch(&flows[0], entries)).await.unwrap();
    assert_eq!(out.written.iter().filter(|w| **w).count(), 250);
    assert!(out.written[..250].iter().all(|w| *w));
    assert!(out.written[250..].iter().all(|w| !*w));
    assert_eq!(store.key_census("p__events").await.unwrap(), (250, 0));
    let progress = store.flow_progress(&flows[0]).await.unwrap();
    assert_eq!((progress.committed, progress.duplicates), (250, 50));
}

fn lease(holder: &str, ttl_ms: u64) -> LeaseRequest {
    LeaseRequest {
        pipeline: "p".into(),
        role: "ledger_upkeep".into(),
        holder: holder.into(),
        ttl: Duration::from_millis(ttl_ms),
    }
}

async fn leases_have_one_holder_and_move_when_they_expire(postgres: bool) {
    let (_place, store, _flows) = open(postgres).await;
    let grant = store.acquire_lease(&lease("w1", 700)).await.unwrap();
    assert!(
        matches!(grant, LeaseGrant::Held { taken: true, .. }),
        "{grant:?}"
    );
    // Held: another worker is refused, the holder renews without "taking" it again.
    assert_eq!(
        store.acquire_lease(&lease("w2", 700)).await.unwrap(),
        LeaseGrant::HeldBy("w1".into())
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let renewed = store.acquire_lease(&lease("w1", 700)).await.unwrap();
    assert!(
        matches!(renewed, LeaseGrant::Held { taken: false, .. }),
        "{renewed:?}"
    );
    // The holder stops renewing: after the ttl, w2 takes it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let taken = store.acquire_lease(&lease("w2", 700)).await.unwrap();
    assert!(
        matches!(taken, LeaseGrant::Held { taken: true, .. }),
        "{taken:?}"
    );
    assert_eq!(
        store.acquire_lease(&lease("w1", 700)).await.unwrap(),
        LeaseGrant::HeldBy("w2".into())
    );
    // A clean release hands it over at once.
    store
        .release_lease("p", "ledger_upkeep", "w2")
        .await
        .unwrap();
    let back = store.acquire_lease(&lease("w1", 700)).await.unwrap();
    assert!(
        matches!(back, LeaseGrant::Held { taken: true, .. }),
        "{back:?}"
    );
    let leases = store.leases("p").await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].holder, "w1");
}

async fn heartbeats_list_live_workers(postgres: bool) {
    let (_place, store, _flows) = open(postgres).await;
    let beat = |worker: &str| WorkerBeat {
        pipeline: "p".into(),
        worker: worker.into(),
        host: "h".into(),
        pid: 7,
    };
    store.heartbeat(&beat("old")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    store.heartbeat(&beat("new")).await.unwrap();
    let recent = store
        .workers("p", Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(
        recent.iter().map(|w| w.worker.as_str()).collect::<Vec<_>>(),
        vec!["new"]
    );
    let all = store.workers("p", Duration::from_secs(60)).await.unwrap();
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|w| w.last_beat_ms >= w.started_at_ms));
    store.leave("p", "new").await.unwrap();
    let left = store.workers("p", Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        left.iter().map(|w| w.worker.as_str()).collect::<Vec<_>>(),
        vec!["old"]
    );
}

/// Eight committers (separate store handles, as separate replicas would have) race on
/// overlapping keys: each key is written exactly once.
async fn concurrent_commits_of_one_key_write_it_once(postgres: bool) {
    let (place, first, flows) = open(postgres).await;
    let mut tasks = Vec::new();
    for committer in 0..8u64 {
        let store = if committer == 0 {
            first.clone()
        } else {
            place.open()
        };
        let flow = flows[0].clone();
        tasks.push(tokio::spawn(async move {
            let mut written = 0;
            for round in 0..10u64 {
                // Keys overlap heavily between committers and rounds.
                let entries = (0..50)
                    .map(|i| row(&format!("k{}", (i * 7 + round * 13 + committer * 29) % 200)))
                    .collect();
                let out = store.commit(batch(&flow, entries)).await.unwrap();
                written += out.written.iter().filter(|w| **w).count();
            }
            written
        }));
    }
    let mut written = 0;
    for task in tasks {
        written += task.await.unwrap();
    }
    let (distinct, repeated) = first.key_census("p__events").await.unwrap();
    assert_eq!(repeated, 0);
    assert_eq!(written as u64, distinct);
    assert_eq!(first.count_rows("p__events", None).await.unwrap(), distinct);
}

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
        .reset_flow(live, Some("p__events"), ResetRows::PublishedSince(2_000))
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
        .reset_flow(live, Some("p__events"), ResetRows::All)
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
            .reset_flow(live, Some("x\"; DROP"), ResetRows::All)
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

fn bucket(bucket_ms: i64, tracked: u64, processed: u64, min_event_ms: Option<i64>) -> BucketCounts {
    BucketCounts {
        bucket_ms,
        tracked,
        processed,
        min_event_ms,
    }
}

/// The tracking reader's report of message `id`, published in bucket `bucket_ms`.
fn tracked(bucket_ms: i64, id: &str, event_ms: Option<i64>) -> BucketMessage {
    BucketMessage {
        bucket_ms,
        message_id: id.into(),
        report: MessageReport::Tracked { event_ms },
    }
}

/// A worker's report that it settled message `id`, published in bucket `bucket_ms`.
fn settled(bucket_ms: i64, id: &str) -> BucketMessage {
    BucketMessage {
        bucket_ms,
        message_id: id.into(),
        report: MessageReport::Settled,
    }
}

fn mark(watermark_ms: i64, horizon_ms: i64, updated_at_ms: i64) -> WatermarkRecord {
    WatermarkRecord {
        watermark_ms,
        horizon_ms,
        updated_at_ms,
    }
}

/// Reports from the tracking reader and from workers (other handles) combine per message id:
/// a bucket counts its distinct tracked messages and those of them settled, whatever the
/// order of the reports; a redelivery reported again, tracked or settled, counts once; a
/// settled message not tracked (yet) counts nowhere; the smallest event time is over tracked
/// messages. Pruning forgets buckets before a time, for one flow only.
async fn bucket_counts_count_each_message_once(postgres: bool) {
    let (place, tracker, flows) = open(postgres).await;
    let worker = place.open();
    let (live, other) = (&flows[0], &flows[1]);
    assert!(
        tracker
            .bucket_counts(live, i64::MIN)
            .await
            .unwrap()
            .is_empty()
    );
    tracker.add_bucket_messages(live, &[]).await.unwrap();

    // Settled before it is tracked, out of bucket order, one report twice in a call.
    worker
        .add_bucket_messages(
            live,
            &[
                settled(1_000, "b1"),
                settled(0, "a1"),
                settled(3_000, "d1"),
                settled(1_000, "b1"),
            ],
        )
        .await
        .unwrap();
    tracker
        .add_bucket_messages(
            live,
            &[
                tracked(2_000, "c1", Some(2_100)),
                tracked(0, "a1", Some(50)),
                tracked(0, "a2", Some(60)),
                tracked(1_000, "b1", Some(1_500)),
                tracked(1_000, "b2", None),
            ],
        )
        .await
        .unwrap();
    // A redelivery of a1 is settled again by another worker: it still counts once; b2 is
    // settled; the tracking reader is redelivered a2 and b1.
    place
        .open()
        .add_bucket_messages(live, &[settled(0, "a1"), settled(1_000, "b2")])
        .await
        .unwrap();
    tracker
        .add_bucket_messages(
            live,
            &[
                tracked(0, "a2", Some(60)),
                tracked(1_000, "b1", Some(1_500)),
            ],
        )
        .await
        .unwrap();
    tracker
        .add_bucket_messages(other, &[tracked(0, "a1", Some(1)), settled(0, "a1")])
        .await
        .unwrap();

    let all = vec![
        bucket(0, 2, 1, Some(50)),
        bucket(1_000, 2, 2, Some(1_500)),
        bucket(2_000, 1, 0, Some(2_100)),
    ];
    assert_eq!(worker.bucket_counts(live, i64::MIN).await.unwrap(), all);
    assert_eq!(tracker.bucket_counts(live, 0).await.unwrap(), all);
    assert_eq!(
        tracker.bucket_counts(live, 1_000).await.unwrap(),
        all[1..].to_vec()
    );
    assert_eq!(
        tracker.bucket_counts(live, 1_001).await.unwrap(),
        all[2..].to_vec()
    );
    assert!(tracker.bucket_counts(live, 2_001).await.unwrap().is_empty());
    // d1 is tracked at last: bucket 3 000 holds one message, settled.
    tracker
        .add_bucket_messages(live, &[tracked(3_000, "d1", Some(3_300))])
        .await
        .unwrap();
    assert_eq!(
        tracker.bucket_counts(live, 3_000).await.unwrap(),
        [bucket(3_000, 1, 1, Some(3_300))]
    );

    // Buckets 0 and 1 000: a1, a2, b1, b2 (each reported by both sides, one row each).
    assert_eq!(worker.prune_buckets(live, 2_000).await.unwrap(), 4);
    assert_eq!(worker.prune_buckets(live, 2_000).await.unwrap(), 0);
    assert_eq!(
        tracker.bucket_counts(live, i64::MIN).await.unwrap(),
        [
            bucket(2_000, 1, 0, Some(2_100)),
            bucket(3_000, 1, 1, Some(3_300))
        ]
    );
    // The other flow's bucket 0 is its own, and stays.
    assert_eq!(
        tracker.bucket_counts(other, i64::MIN).await.unwrap(),
        [bucket(0, 1, 1, Some(1))]
    );
}

/// A commit of a flow with a watermark records, in its own transaction, every entry's message
/// as settled in its publish-time bucket: rows, dead letters, a second message with a key
/// already in the batch, and duplicates of earlier commits alike (a redelivery committed again
/// counts once); a flow without one records nothing.
async fn a_commit_records_its_messages_settled(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let (live, other) = (&flows[0], &flows[1]);
    let watermarked = |flow: &FlowHandle, entries| CommitBatch {
        watermark_progress: true,
        commit_by_ms: None,
        ..batch(flow, entries)
    };
    let mut late = row("c");
    late.message.publish_time_ms = 2_500;
    let mut repeat = row("a");
    repeat.message.message_id = "m-x".into();
    store
        .add_bucket_messages(
            live,
            &[
                tracked(1_000, "m-a", Some(5)),
                tracked(1_000, "m-b", None),
                tracked(1_000, "m-x", Some(5)),
                tracked(1_000, "m-y", Some(5)),
                tracked(2_000, "m-c", Some(5)),
            ],
        )
        .await
        .unwrap();
    store
        .commit(watermarked(live, vec![row("a"), dead("b"), repeat, late]))
        .await
        .unwrap();
    // A redelivery of a, committed again: a duplicate, settled again, still counted once.
    store
        .commit(watermarked(live, vec![row("a")]))
        .await
        .unwrap();
    assert_eq!(
        store.bucket_counts(live, i64::MIN).await.unwrap(),
        [bucket(1_000, 4, 3, Some(5)), bucket(2_000, 1, 1, Some(5))],
        "m-y is still in flight"
    );
    // Without a watermark, nothing is recorded.
    store
        .add_bucket_messages(other, &[tracked(1_000, "m-a", Some(5))])
        .await
        .unwrap();
    store.commit(batch(other, vec![row("a")])).await.unwrap();
    assert_eq!(
        store.bucket_counts(other, i64::MIN).await.unwrap(),
        [bucket(1_000, 1, 0, Some(5))]
    );
}

/// A fenced offer is taken only from the holder of the flow's `watermark/<flow>` lease, while
/// it holds it: never from another worker, nor after the holder released it, nor from a
/// holder of another flow's lease; an unfenced offer is always taken.
async fn a_fenced_watermark_needs_the_readers_lease(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let (live, other) = (&flows[0], &flows[1]);
    let lease = |role: &str, holder: &str| LeaseRequest {
        pipeline: "p".into(),
        role: role.into(),
        holder: holder.into(),
        ttl: Duration::from_secs(30),
    };
    assert_eq!(
        store
            .advance_watermark(live, &mark(100, 100, 1), Some("w1"))
            .await
            .unwrap(),
        None,
        "nobody holds the lease"
    );
    assert!(matches!(
        store
            .acquire_lease(&lease("watermark/live", "w1"))
            .await
            .unwrap(),
        LeaseGrant::Held { .. }
    ));
    assert!(matches!(
        store
            .acquire_lease(&lease("watermark/other", "w2"))
            .await
            .unwrap(),
        LeaseGrant::Held { .. }
    ));
    assert_eq!(
        store
            .advance_watermark(live, &mark(100, 100, 1), Some("w2"))
            .await
            .unwrap(),
        None,
        "w2 holds another flow's lease"
    );
    assert_eq!(
        store
            .advance_watermark(live, &mark(100, 100, 1), Some("w1"))
            .await
            .unwrap(),
        Some(mark(100, 100, 1))
    );
    store
        .release_lease("p", "watermark/live", "w1")
        .await
        .unwrap();
    assert_eq!(
        store
            .advance_watermark(live, &mark(200, 200, 2), Some("w1"))
            .await
            .unwrap(),
        None,
        "released"
    );
    assert_eq!(
        store
            .advance_watermark(other, &mark(300, 300, 3), Some("w2"))
            .await
            .unwrap(),
        Some(mark(300, 300, 3))
    );
    assert_eq!(
        store
            .advance_watermark(live, &mark(200, 200, 2), None)
            .await
            .unwrap(),
        Some(mark(200, 200, 2))
    );
    let stored = store.watermarks("p").await.unwrap();
    assert_eq!(
        stored,
        [
            ("live".to_owned(), mark(200, 200, 2)),
            ("other".to_owned(), mark(300, 300, 3))
        ]
    );
}

/// A watermark record only moves forward, field by field; what `advance_watermark` returns is
/// what any handle then reads; `watermarks` lists the pipeline's flows that have a record, by
/// name, and no other pipeline's.
async fn watermarks_never_move_back(postgres: bool) {
    let (place, store, _) = open(postgres).await;
    let flows = store
        .prepare(&layout(&["live", "other", "beta", "alpha"]))
        .await
        .unwrap();
    let (live, beta, alpha) = (&flows[0], &flows[2], &flows[3]);
    let elsewhere = store
        .prepare(&Layout {
            pipeline: "q".into(),
            tables: vec![],
            flows: vec!["live".into()],
        })
        .await
        .unwrap();
    assert!(store.watermarks("p").await.unwrap().is_empty());

    assert_eq!(
        store
            .advance_watermark(live, &mark(100, 200, 10), None)
            .await
            .unwrap(),
        Some(mark(100, 200, 10))
    );
    // An older view cannot move the watermark back, but its larger horizon counts.
    let stored = store
        .advance_watermark(live, &mark(50, 300, 5), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, mark(100, 300, 10));
    let again = place.open();
    assert_eq!(
        again
            .advance_watermark(live, &mark(100, 300, 10), None)
            .await
            .unwrap(),
        Some(stored)
    );
    assert_eq!(
        again.watermarks("p").await.unwrap(),
        [("live".to_owned(), stored)]
    );

    store
        .advance_watermark(beta, &mark(7, 8, 9), None)
        .await
        .unwrap();
    store
        .advance_watermark(alpha, &mark(1, 2, 3), None)
        .await
        .unwrap();
    store
        .advance_watermark(&elsewhere[0], &mark(5, 5, 5), None)
        .await
        .unwrap();
    let moved = store
        .advance_watermark(live, &mark(150, 250, 20), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(moved, mark(150, 300, 20));
    assert_eq!(
        again.watermarks("p").await.unwrap(),
        [
            ("alpha".to_owned(), mark(1, 2, 3)),
            ("beta".to_owned(), mark(7, 8, 9)),
            ("live".to_owned(), moved),
        ],
        "flows with a record, by name; `other` has none"
    );
    assert_eq!(
        again.watermarks("q").await.unwrap(),
        [("live".to_owned(), mark(5, 5, 5))]
    );
    assert!(again.watermarks("none").await.unwrap().is_empty());
}

/// `reset_flow` forgets the flow's buckets and watermark, so it starts from nothing (a smaller
/// watermark is stored as offered); the other flow's stay.
async fn reset_forgets_buckets_and_watermark(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let (stale, other) = (&flows[0], &flows[1]);
    for flow in [stale, other] {
        store
            .add_bucket_messages(
                flow,
                &[
                    tracked(0, "a", Some(5)),
                    tracked(0, "b", Some(6)),
                    settled(0, "a"),
                    tracked(1_000, "c", None),
                    settled(1_000, "c"),
                ],
            )
            .await
            .unwrap();
        store
            .advance_watermark(flow, &mark(500, 600, 700), None)
            .await
            .unwrap();
    }

    store
        .reset_flow(stale, Some("p__events"), ResetRows::All)
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    let live = &flows[0];

    assert!(
        store
            .bucket_counts(live, i64::MIN)
            .await
            .unwrap()
            .is_empty()
    );
    // Not even the handle taken before the reset finds them.
    assert!(
        store
            .bucket_counts(stale, i64::MIN)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.watermarks("p").await.unwrap(),
        [("other".to_owned(), mark(500, 600, 700))]
    );
    assert_eq!(
        store.bucket_counts(other, i64::MIN).await.unwrap(),
        [bucket(0, 2, 1, Some(5)), bucket(1_000, 1, 1, None)]
    );
    // A fresh start: the reset flow's first record is what it offers.
    assert_eq!(
        store
            .advance_watermark(live, &mark(10, 20, 30), None)
            .await
            .unwrap(),
        Some(mark(10, 20, 30))
    );
    store
        .add_bucket_messages(live, &[tracked(0, "a", Some(9))])
        .await
        .unwrap();
    assert_eq!(
        store.bucket_counts(live, i64::MIN).await.unwrap(),
        [bucket(0, 1, 0, Some(9))]
    );
}

/// Window size of the window tests, ms.
const WINDOW_MS: i64 = 10_000;

/// A row with an event time and attributes (a JSON object).
fn event(key: &str, event_time_ms: i64, attributes_json: &str) -> Entry {
    let mut entry = entry(key, Effect::Row { event_time_ms });
    entry.message.attributes_json = attributes_json.to_owned();
    entry
}

/// An emission of `p__events`' windows, grouped by `group_attribute`, into `windows`.
fn emission(windows: &str, group_attribute: &str, before_ms: i64) -> WindowEmission {
    WindowEmission {
        base_table: "p__events".into(),
        windows_table: windows.into(),
        size_ms: WINDOW_MS,
        group_attribute: group_attribute.into(),
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

/// A row of group `g` at `event_time_ms`, published at `publish_ms`.
fn event_published(key: &str, event_time_ms: i64, g: &str, publish_ms: i64) -> Entry {
    let mut entry = event(key, event_time_ms, &format!(r#"{{"g":"{g}"}}"#));
    entry.message.publish_time_ms = publish_ms;
    entry
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
        .reset_flow(stale, Some("p__events"), ResetRows::Keep)
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
        .reset_flow(live, Some("p__events"), ResetRows::PublishedSince(5_000))
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
        .reset_flow(live, Some("p__events"), ResetRows::All)
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
