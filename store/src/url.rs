//! Store URLs (`sqlite://PATH`, `postgres://...`) and opening a store from one.

use crate::{PostgresStore, SqliteStore, Store, StoreError};
use std::path::PathBuf;
use std::sync::Arc;

/// A parsed `store:` setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite://PATH` (relative paths are relative to the working directory;
    /// `sqlite:///abs/path` for absolute ones).
    Sqlite(PathBuf),
    /// `postgres://...` or `postgresql://...`.
    Postgres(String),
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(StoreError::Config(format!("{url}: no database path")));
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(url.to_owned()));
        }
        Err(StoreError::Config(format!(
            "{url}: unknown store scheme (expected sqlite:// or postgres://)"
        )))
    }
}

/// Opens the store a URL names, creating an SQLite file (and its folder) when missing. A
/// PostgreSQL store connects on first use.
pub fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    match url.parse::<StoreUrl>()? {
        StoreUrl::Sqlite(path) => Ok(Arc::new(SqliteStore::open(&path)?)),
        StoreUrl::Postgres(url) => Ok(Arc::new(PostgresStore::open(&url)?)),
    }
}

/// Opens the store a URL names only when it is there, for the commands that read one
/// (`status`, `runs`, `graph`): they never create a store. An SQLite file that does not exist,
/// or a PostgreSQL database without sluice's tables, is [`StoreError::Config`] naming it and
/// asking whether the pipeline has run; a server that does not answer is the usual error.
pub async fn open_existing(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    match url.parse::<StoreUrl>()? {
        StoreUrl::Sqlite(path) => {
            if !path.is_file() {
                return Err(StoreError::Config(format!(
                    "no store at {}: has this pipeline run? (a relative sqlite:// path is \
                     beside the pipeline file)",
                    path.display()
                )));
            }
            Ok(Arc::new(SqliteStore::open(&path)?))
        }
        StoreUrl::Postgres(url) => {
            let store = PostgresStore::open(&url)?;
            if !store.holds_a_store().await? {
                return Err(StoreError::Config(format!(
                    "no store in {}: it has no sluice tables; has this pipeline run?",
                    store.display_url()
                )));
            }
            Ok(Arc::new(store))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schemes() {
        assert_eq!(
            "sqlite://state/a.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite(PathBuf::from("state/a.db")))
        );
        assert_eq!(
            "sqlite:///tmp/a.db".parse::<StoreUrl>().ok(),
            Some(StoreUrl::Sqlite(PathBuf::from("/tmp/a.db")))
        );
        assert!(matches!(
            "postgres://u@h/db".parse::<StoreUrl>(),
            Ok(StoreUrl::Postgres(_))
        ));
        assert!("mysql://x".parse::<StoreUrl>().is_err());
        assert!("sqlite://".parse::<StoreUrl>().is_err());
    }
}
