//! The feeds role (`FeedStore`): a reading flow's position, planned ranges and pages, every
//! committed row once in commit order, fenced position changes; and, on PostgreSQL, commits
//! that land out of transaction-id order. Each test runs on both backends (`contract/mod.rs`)
//! unless it says otherwise.
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;
use sluice_store::{FeedRow, FileCheckpoint, PositionAdvance, ReadPosition};

const TABLE: &str = "p__events";

async fn open_feed(postgres: bool) -> (Place, Arc<dyn InspectableStore>, Vec<FlowHandle>) {
    let place = Place::new(postgres).await;
    let store = place.open();
    let flows = store
        .prepare(&layout(&["live", "other", "reader"]))
        .await
        .unwrap();
    (place, store, flows)
}

fn keys(rows: &[FeedRow]) -> Vec<String> {
    rows.iter()
        .map(|r| format!("{}/{}", r.row.flow, r.row.dedup_key))
        .collect()
}

/// Commits an empty batch of `reader` that records `page` done at `at`; returns the position
/// now stored.
async fn commit_page(
    store: &Arc<dyn InspectableStore>,
    reader: &FlowHandle,
    at: &ReadPosition,
    page: &[FeedRow],
) -> Result<ReadPosition, StoreError> {
    let mut commit = batch(reader, Vec::new());
    commit.position = Some(PositionAdvance {
        table: Arc::from(TABLE),
        expected_version: at.version,
        after: Some(page.last().unwrap().cursor),
    });
    store.commit(commit).await?;
    Ok(ReadPosition {
        version: at.version + 1,
        after: Some(page.last().unwrap().cursor),
        ..at.clone()
    })
}

/// Reads every row after `at` in pages of `limit`, committing each page, planning ranges
/// until one comes back empty; returns the rows and the last position.
async fn drain(
    store: &Arc<dyn InspectableStore>,
    reader: &FlowHandle,
    mut at: ReadPosition,
    limit: usize,
) -> (Vec<FeedRow>, ReadPosition) {
    let mut seen = Vec::new();
    let mut planned_empty = false;
    loop {
        let page = if at.version == 0 {
            Vec::new()
        } else {
            store.read_range(TABLE, &at, limit).await.unwrap()
        };
        if page.len() < limit || at.version == 0 {
            if !page.is_empty() {
                at = commit_page(store, reader, &at, &page).await.unwrap();
                seen.extend(page);
                planned_empty = false;
            }
            if planned_empty {
                return (seen, at);
            }
            at = store.plan_range(reader, TABLE, &at).await.unwrap();
            planned_empty = store.read_range(TABLE, &at, 1).await.unwrap().is_empty();
            continue;
        }
        at = commit_page(store, reader, &at, &page).await.unwrap();
        seen.extend(page);
    }
}

/// Rows are read in commit order, page by page and range by range, each once; a range's pages
/// are the same however often they are read; the position survives a reopen.
async fn every_committed_row_once_in_commit_order(postgres: bool) {
    let (place, store, flows) = open_feed(postgres).await;
    let (live, other, reader) = (&flows[0], &flows[1], &flows[2]);
    assert_eq!(
        store.read_position(reader, TABLE).await.unwrap(),
        ReadPosition::default()
    );
    store
        .commit(batch(live, vec![row("a"), row("b"), dead("c")]))
        .await
        .unwrap();
    store
        .commit(batch(other, vec![row("a"), row("z")]))
        .await
        .unwrap();
    let planned = store
        .plan_range(reader, TABLE, &ReadPosition::default())
        .await
        .unwrap();
    assert_eq!(planned.version, 1);
    // Committed after the range was planned: the next range's.
    store.commit(batch(live, vec![row("d")])).await.unwrap();
    let first = store.read_range(TABLE, &planned, 3).await.unwrap();
    assert_eq!(keys(&first), ["live/a", "live/b", "other/a"]);
    assert_eq!(
        store.read_range(TABLE, &planned, 3).await.unwrap(),
        first,
        "the same position gives the same page"
    );
    assert_eq!(first[0].row.message_id, "m-a");
    assert_eq!(first[0].row.event_time_ms, 5);
    assert!(first[0].committed_at_ms > 1_600_000_000_000);

    let lag = store.feed_lag(TABLE, &planned).await.unwrap();
    assert_eq!(lag.rows_behind, 5, "four in the range, one after it");
    assert!(lag.oldest_unread_ms.is_some());

    let after_first = commit_page(&store, reader, &planned, &first[..2])
        .await
        .unwrap();
    let reopened = place.open();
    assert_eq!(
        reopened.read_position(reader, TABLE).await.unwrap(),
        after_first,
        "the committed position is what a restart reads"
    );
    let (rest, last) = drain(&reopened, reader, after_first, 2).await;
    assert_eq!(keys(&rest), ["other/a", "other/z", "live/d"]);
    let lag = store.feed_lag(TABLE, &last).await.unwrap();
    assert_eq!(lag.rows_behind, 0);
    assert_eq!(lag.oldest_unread_ms, None);
}

/// A position change that names a version no longer stored writes nothing, the batch's rows
/// included: a stale reader cannot move it; a reset of the reader rewinds it to the beginning.
async fn stale_position_changes_are_refused(postgres: bool) {
    let (_place, store, flows) = open_feed(postgres).await;
    let (live, reader) = (&flows[0], &flows[2]);
    store.commit(batch(live, vec![row("a")])).await.unwrap();
    let planned = store
        .plan_range(reader, TABLE, &ReadPosition::default())
        .await
        .unwrap();
    assert!(matches!(
        store
            .plan_range(reader, TABLE, &ReadPosition::default())
            .await,
        Err(StoreError::Moved)
    ));
    let page = store.read_range(TABLE, &planned, 10).await.unwrap();
    let done = commit_page(&store, reader, &planned, &page).await.unwrap();

    // A second reader still at `planned`: its batch, with a row, is refused whole.
    let mut stale = batch(reader, vec![row("copy")]);
    stale.position = Some(PositionAdvance {
        table: Arc::from(TABLE),
        expected_version: planned.version,
        after: Some(page[0].cursor),
    });
    assert!(matches!(store.commit(stale).await, Err(StoreError::Moved)));
    assert_eq!(store.count_rows(TABLE, Some("reader")).await.unwrap(), 0);
    assert!(matches!(
        store.plan_range(reader, TABLE, &planned).await,
        Err(StoreError::Moved)
    ));
    assert_eq!(store.read_position(reader, TABLE).await.unwrap(), done);

    // A part of a page (split to find a failing record) only checks the version: at the
    // stored one its rows commit and the position stays; at an older one nothing is written.
    let part = |version: i64, key: &str| {
        let mut part = batch(reader, vec![row(key)]);
        part.position = Some(PositionAdvance {
            table: Arc::from(TABLE),
            expected_version: version,
            after: None,
        });
        part
    };
    store.commit(part(done.version, "part")).await.unwrap();
    assert_eq!(store.read_position(reader, TABLE).await.unwrap(), done);
    assert!(matches!(
        store.commit(part(planned.version, "stale part")).await,
        Err(StoreError::Moved)
    ));
    assert_eq!(store.count_rows(TABLE, Some("reader")).await.unwrap(), 1);

    store
        .reset_flow(reader, None, ResetRows::All, None)
        .await
        .unwrap();
    assert_eq!(
        store.read_position(reader, TABLE).await.unwrap(),
        ReadPosition::default(),
        "a reset reads the table again from its beginning"
    );
}

/// The gate of a test's pages: the version its committed pages reached.
#[derive(Debug)]
struct TestGate(tokio::sync::watch::Sender<i64>);

#[async_trait::async_trait]
impl sluice_store::PositionGate for TestGate {
    async fn wait(&self, version: i64) -> bool {
        self.0.subscribe().wait_for(|v| *v >= version).await.is_ok()
    }
}

/// PostgreSQL only: a page that waits for the page before it does not hold a connection
/// while it waits. With a pool of one connection, page 2's commit starts first and waits for
/// page 1 inside its transaction; page 1 must still get the connection and commit, then page 2
/// commits. (Before the fix page 2 held the only connection in an open transaction for as long
/// as it waited, so page 1's commit timed out waiting for a connection, again and again.)
#[tokio::test]
async fn postgres_a_page_waiting_for_the_one_before_it_holds_no_connection() {
    let database = ScratchDatabase::create().await.unwrap();
    let store: Arc<dyn InspectableStore> =
        Arc::new(PostgresStore::open(&format!("{}?pool_size=1", database.url())).unwrap());
    let flows = store
        .prepare(&layout(&["live", "other", "reader"]))
        .await
        .unwrap();
    let (live, reader) = (flows[0].clone(), flows[2].clone());
    store
        .commit(batch(&live, vec![row("a"), row("b")]))
        .await
        .unwrap();
    let planned = store
        .plan_range(&reader, TABLE, &ReadPosition::default())
        .await
        .unwrap();
    let rows = store.read_range(TABLE, &planned, 10).await.unwrap();
    assert_eq!(rows.len(), 2);
    let gate = Arc::new(TestGate(tokio::sync::watch::Sender::new(planned.version)));
    let page = |version: i64, row_index: usize, key: &str| {
        let mut page = batch(&reader, vec![row(key)]);
        page.position = Some(PositionAdvance {
            table: Arc::from(TABLE),
            expected_version: version,
            after: Some(rows[row_index].cursor),
        });
        page.position_gate = Some(gate.clone() as Arc<dyn sluice_store::PositionGate>);
        page
    };
    let second = {
        let (store, page) = (store.clone(), page(planned.version + 1, 1, "second"));
        tokio::spawn(async move { store.commit(page).await })
    };
    // The second page's transaction is open and waiting for the first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let mut first = store.commit(page(planned.version, 0, "first")).await;
    while matches!(first, Err(StoreError::Unavailable(_)))
        && started.elapsed() < Duration::from_secs(35)
    {
        first = store.commit(page(planned.version, 0, "first")).await;
    }
    assert!(
        first.is_ok(),
        "the first page never got a connection while the second waited: {first:?}"
    );
    gate.0.send_replace(planned.version + 1);
    let second = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the second page committed once the first had")
        .unwrap();
    assert!(second.is_ok(), "{second:?}");
    assert_eq!(store.count_rows(TABLE, Some("reader")).await.unwrap(), 2);
    let at = store.read_position(&reader, TABLE).await.unwrap();
    assert_eq!(at.version, planned.version + 2);
}

/// PostgreSQL only: transactions commit in another order than their ids. A writer whose
/// commit is held open (a second connection holds its counter rows locked, so its statement
/// has inserted its rows and waits) is overtaken by a later writer; a reader that plans a range
/// meanwhile reads the later writer's rows, and the held writer's rows in its next range, once
/// each. The held rows sort *before* the ones already read, so a reader that kept "the highest
/// row seen" as its position would never read them.
#[tokio::test]
async fn postgres_out_of_order_commits_are_neither_skipped_nor_repeated() {
    let (place, store, flows) = open_feed(true).await;
    let (live, other, reader) = (flows[0].clone(), flows[1].clone(), flows[2].clone());
    let Place::Postgres(db) = &place else {
        unreachable!()
    };
    let locker = postgres_client(db).await;
    locker
        .execute(
            "INSERT INTO sluice_flow_counters
                 SELECT $1, s, 0, 0, 0, 0, now() FROM generate_series(0, 63) AS s",
            &[&live.id],
        )
        .await
        .unwrap();
    locker.batch_execute("BEGIN").await.unwrap();
    locker
        .execute(
            "SELECT 1 FROM sluice_flow_counters WHERE flow_id = $1 FOR UPDATE",
            &[&live.id],
        )
        .await
        .unwrap();
    let held = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .commit(batch(&live, vec![row("held1"), row("held2")]))
                .await
        })
    };
    // Wait until the held commit has taken its transaction id and waits on the lock.
    let observer = postgres_client(db).await;
    loop {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%sluice_ledger%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store
        .commit(batch(&other, vec![row("later")]))
        .await
        .unwrap();
    let (first, at) = drain(&store, &reader, ReadPosition::default(), 10).await;
    assert_eq!(keys(&first), ["other/later"]);
    assert!(!held.is_finished(), "the held commit is still open");

    locker.batch_execute("COMMIT").await.unwrap();
    held.await.unwrap().unwrap();
    let (second, _) = drain(&store, &reader, at, 10).await;
    assert_eq!(keys(&second), ["live/held1", "live/held2"]);
    assert!(
        second.iter().all(|r| r.cursor < first[0].cursor),
        "the held rows sort before the row read first ({:?} vs {:?}): a highest-seen position \
         would skip them",
        second.iter().map(|r| r.cursor).collect::<Vec<_>>(),
        first[0].cursor
    );
}

/// A table created before feeds existed (no feed columns) is brought up to date by `prepare`:
/// its old rows are read first, then new ones.
async fn tables_from_before_feeds_are_upgraded(postgres: bool) {
    let place = Place::new(postgres).await;
    let old_columns = "dedup_key TEXT NOT NULL, message_id TEXT NOT NULL, \
         publish_time {T} NOT NULL, event_time {T} NOT NULL, attributes {J} NOT NULL, \
         data {B} NOT NULL, flow TEXT NOT NULL, committed_at {T} NOT NULL";
    let (t, j, b) = if postgres {
        ("TIMESTAMPTZ", "JSONB", "BYTEA")
    } else {
        ("INTEGER", "TEXT", "BLOB")
    };
    let columns = old_columns
        .replace("{T}", t)
        .replace("{J}", j)
        .replace("{B}", b);
    let now = if postgres { "now()" } else { "1000" };
    let attrs = if postgres { "'{}'::jsonb" } else { "'{}'" };
    let data = if postgres { "'\\x00'::bytea" } else { "x'00'" };
    let store = place.open();
    store.prepare(&layout(&[])).await.unwrap();
    place
        .execute(&format!(
            "DROP TABLE p__events; CREATE TABLE p__events ({columns});
             INSERT INTO p__events VALUES ('old1', 'm1', {now}, {now}, {attrs}, {data}, 'live', {now});
             INSERT INTO p__events VALUES ('old2', 'm2', {now}, {now}, {attrs}, {data}, 'live', {now});"
        ))
        .await;
    let store = place.open();
    let flows = store
        .prepare(&layout(&["live", "other", "reader"]))
        .await
        .unwrap();
    store
        .commit(batch(&flows[0], vec![row("new")]))
        .await
        .unwrap();
    // A row inserted as an older binary sharing the store would, without the feed columns.
    place
        .execute(&format!(
            "INSERT INTO p__events (dedup_key, message_id, publish_time, event_time, attributes,
                 data, flow, committed_at)
             VALUES ('old3', 'm3', {now}, {now}, {attrs}, {data}, 'live', {now});"
        ))
        .await;
    let (seen, _) = drain(&store, &flows[2], ReadPosition::default(), 10).await;
    assert_eq!(
        keys(&seen),
        ["live/old1", "live/old2", "live/new", "live/old3"]
    );
}

/// A file flow's checkpoint: none at first, the last one saved after that, per flow, and gone
/// with the flow's reset (a table position of the same flow is a different source).
async fn file_checkpoints_are_saved_replaced_and_reset(postgres: bool) {
    let (_place, store, flows) = open_feed(postgres).await;
    let reader = &flows[2];
    assert_eq!(store.file_checkpoint(reader).await.unwrap(), None);
    let at = |path: &str, offset: i64, line: i64| FileCheckpoint {
        path: path.into(),
        offset,
        line,
    };
    store
        .save_file_checkpoint(reader, &at("a.jsonl", 120, 4))
        .await
        .unwrap();
    store
        .save_file_checkpoint(reader, &at("b.jsonl", 30, 1))
        .await
        .unwrap();
    assert_eq!(
        store.file_checkpoint(reader).await.unwrap(),
        Some(at("b.jsonl", 30, 1))
    );
    assert_eq!(store.file_checkpoint(&flows[1]).await.unwrap(), None);
    assert_eq!(
        store.read_position(reader, TABLE).await.unwrap(),
        ReadPosition::default()
    );
    store
        .reset_flow(reader, None, ResetRows::All, None)
        .await
        .unwrap();
    let reader = &store
        .prepare(&layout(&["live", "other", "reader"]))
        .await
        .unwrap()[2];
    assert_eq!(store.file_checkpoint(reader).await.unwrap(), None);
}

on_both_backends!(
    file_checkpoints_are_saved_replaced_and_reset,
    every_committed_row_once_in_commit_order,
    stale_position_changes_are_refused,
    tables_from_before_feeds_are_upgraded,
);
