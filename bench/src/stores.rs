//! The stores a benchmark measures: SQLite in a temporary folder, PostgreSQL in a scratch
//! database dropped afterwards.

use sluice_connector::{rusqlite, tokio_postgres};

/// `--store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreChoice {
    /// SQLite only.
    Sqlite,
    /// PostgreSQL and SQLite.
    Postgres,
}

impl StoreChoice {
    /// The backends measured, SQLite first.
    pub(crate) fn backends(self) -> Vec<Backend> {
        match self {
            StoreChoice::Sqlite => vec![Backend::Sqlite],
            StoreChoice::Postgres => vec![Backend::Sqlite, Backend::Postgres],
        }
    }
}

/// A store a drain commits into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
        }
    }
}

/// A fresh, empty store of one backend, gone when dropped.
pub(crate) struct FreshStore {
    /// The store.
    pub(crate) store: std::sync::Arc<dyn sluice_store::Store>,
    /// The same, as PostgreSQL (for its footprint), on that backend.
    pub(crate) postgres: Option<std::sync::Arc<sluice_store::PostgresStore>>,
    _dir: tempfile::TempDir,
    _scratch: Option<sluice_store::ScratchDatabase>,
    url: String,
}

impl FreshStore {
    /// Its store URL, for what opens its own connection (a library job).
    pub(crate) fn url(&self) -> String {
        self.url.clone()
    }

    /// Runs `sql` on it through a connection of its own.
    pub(crate) async fn execute(&self, sql: &str) -> Result<(), String> {
        match &self._scratch {
            Some(database) => {
                let (client, connection) =
                    tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
                        .await
                        .map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                client.batch_execute(sql).await.map_err(|e| e.to_string())
            }
            None => rusqlite::Connection::open(self._dir.path().join("bench.db"))
                .and_then(|conn| conn.execute_batch(sql))
                .map_err(|e| e.to_string()),
        }
    }

    /// Opens one: a SQLite file in a temporary folder, or a scratch database on
    /// `postgres_server`.
    pub(crate) async fn open(
        backend: Backend,
        postgres_server: &str,
    ) -> Result<Self, crate::BenchError> {
        let store_error = |e: sluice_store::StoreError| crate::BenchError::Store(e.to_string());
        let dir = tempfile::tempdir().map_err(|e| crate::BenchError::Store(e.to_string()))?;
        Ok(match backend {
            Backend::Sqlite => Self {
                store: std::sync::Arc::new(
                    sluice_store::SqliteStore::open(&dir.path().join("bench.db"))
                        .map_err(store_error)?,
                ),
                postgres: None,
                url: format!("sqlite://{}", dir.path().join("bench.db").display()),
                _dir: dir,
                _scratch: None,
            },
            Backend::Postgres => {
                let database = sluice_store::ScratchDatabase::create_on(postgres_server)
                    .await
                    .map_err(store_error)?;
                let store = std::sync::Arc::new(
                    sluice_store::PostgresStore::open(database.url()).map_err(store_error)?,
                );
                Self {
                    store: store.clone(),
                    postgres: Some(store),
                    url: database.url().to_owned(),
                    _dir: dir,
                    _scratch: Some(database),
                }
            }
        })
    }
}
