//! What the store contract tests share (`store/tests/*_contract.rs`): batches and entries,
//! a test's store on either backend (a real SQLite file or a fresh database on a real
//! PostgreSQL server: 127.0.0.1:5432, or `SLUICE_TEST_POSTGRES`), and the macro that runs each
//! test once per backend. Each contract file uses some of it.
#![allow(dead_code, unused_imports, clippy::unwrap_used, missing_docs)]

pub use bytes::Bytes;
pub use sluice_dedup::DedupKey;
pub use sluice_store::testing::InspectableStore;
pub use sluice_store::{
    BucketCounts, BucketMessage, CommitBatch, Effect, Entry, FlowHandle, Layout, LeaseGrant,
    LeaseRequest, MessageFields, MessageReport, PostgresStore, ResetRows, RunEnd, RunRecord,
    RunStart, RunState, RunTrigger, ScratchDatabase, SqliteStore, StoreError, WatermarkRecord,
    WindowEmission, WindowRows, WindowsEmitted, WorkerBeat, table_name, window_table_name,
};
pub use std::sync::Arc;
pub use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn entry(key: &str, effect: Effect) -> Entry {
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

pub fn row(key: &str) -> Entry {
    entry(key, Effect::row(5))
}

pub fn dead(key: &str) -> Entry {
    entry(
        key,
        Effect::DeadLetter {
            reason: "bad_timestamp".into(),
            error: "nope".into(),
            attempts: 1,
        },
    )
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A batch committed now, with a dedup window of `window_ms`.
pub fn batch_with_window(flow: &FlowHandle, entries: Vec<Entry>, window_ms: i64) -> CommitBatch {
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
        position: None,
        position_gate: None,
        work: None,
        publish_dead_letters: false,
        verdicts: Vec::new(),
        memory_duplicates: 0,
        typed: None,
    }
}

pub fn batch(flow: &FlowHandle, entries: Vec<Entry>) -> CommitBatch {
    batch_with_window(flow, entries, 600_000)
}

pub fn layout(flows: &[&str]) -> Layout {
    Layout {
        pipeline: "p".into(),
        tables: vec!["events".into()],
        typed: Vec::new(),
        flows: flows.iter().map(|f| f.to_string()).collect(),
    }
}

/// Where a test's store lives; reopening gives a second handle on the same state.
pub enum Place {
    Sqlite(tempfile::TempDir),
    Postgres(ScratchDatabase),
}

impl Place {
    pub async fn new(postgres: bool) -> Self {
        if postgres {
            Place::Postgres(ScratchDatabase::create().await.unwrap())
        } else {
            Place::Sqlite(tempfile::tempdir().unwrap())
        }
    }

    pub fn open(&self) -> Arc<dyn InspectableStore> {
        match self {
            Place::Sqlite(dir) => {
                Arc::new(SqliteStore::open(&dir.path().join("nested/state.db")).unwrap())
            }
            Place::Postgres(db) => Arc::new(PostgresStore::open(db.url()).unwrap()),
        }
    }

    /// The rows of a window counts table, `(window_start, window_end, group_key, count)` in
    /// window and group order, and the smallest `emitted_at`, read straight from the database.
    pub async fn window_counts(&self, table: &str) -> (Vec<(i64, i64, String, i64)>, Option<i64>) {
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
    pub async fn indexes(&self, table: &str) -> Vec<String> {
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
    pub async fn texts(
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
    pub async fn window_marks(&self) -> i64 {
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
    pub async fn execute(&self, sql: &str) {
        match self {
            Place::Sqlite(dir) => sqlite_connection(dir).execute_batch(sql).unwrap(),
            Place::Postgres(db) => postgres_client(db).await.batch_execute(sql).await.unwrap(),
        }
    }

    /// Reasons in the dead-letter table, read straight from the database.
    pub async fn dead_letter_reasons(&self) -> Vec<String> {
        let sql = "SELECT reason FROM p__dead_letter";
        self.texts(sql, sql, &[]).await
    }
}

pub fn sqlite_connection(dir: &tempfile::TempDir) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.path().join("nested/state.db")).unwrap()
}

pub async fn postgres_client(db: &ScratchDatabase) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

pub async fn open(postgres: bool) -> (Place, Arc<dyn InspectableStore>, Vec<FlowHandle>) {
    let place = Place::new(postgres).await;
    let store = place.open();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    (place, store, flows)
}

pub fn lease(holder: &str, ttl_ms: u64) -> LeaseRequest {
    LeaseRequest {
        pipeline: "p".into(),
        role: "ledger_upkeep".into(),
        holder: holder.into(),
        ttl: Duration::from_millis(ttl_ms),
    }
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
