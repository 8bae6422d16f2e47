//! Read-only views of a test's store: SQLite through `rusqlite`, PostgreSQL through `psql`
//! (synchronous, so usable in [`crate::eventually`]).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Read-only views of a SQLite store.
pub struct Db(pub PathBuf);

impl Db {
    /// Runs a query returning one integer (`COUNT`, `MAX(committed_at)`); 0 while the store or
    /// its table does not exist yet, a panic on any other error (so a broken query can never
    /// pass for an empty table).
    pub fn query(&self, sql: &str) -> i64 {
        if !self.0.exists() {
            return 0;
        }
        let conn = rusqlite::Connection::open(&self.0).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        match conn.query_row(sql, [], |row| row.get(0)) {
            Ok(count) => count,
            Err(error) if error.to_string().contains("no such table") => 0,
            Err(error) => panic!("{sql}: {error}"),
        }
    }

    /// Runs a query returning one text value (`group_concat(...)`, for a failure's report);
    /// empty while the store or its table does not exist yet or the value is NULL.
    pub fn text(&self, sql: &str) -> String {
        if !self.0.exists() {
            return String::new();
        }
        let conn = rusqlite::Connection::open(&self.0).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        match conn.query_row(sql, [], |row| row.get::<_, Option<String>>(0)) {
            Ok(text) => text.unwrap_or_default(),
            Err(error) if error.to_string().contains("no such table") => String::new(),
            Err(error) => panic!("{sql}: {error}"),
        }
    }

    /// Rows in `test__events`.
    pub fn rows(&self) -> i64 {
        self.query("SELECT COUNT(*) FROM test__events")
    }

    /// Distinct dedup keys in `test__events`.
    pub fn distinct_keys(&self) -> i64 {
        self.query("SELECT COUNT(DISTINCT dedup_key) FROM test__events")
    }

    /// Rows in `test__dead_letter`.
    pub fn dead_letters(&self) -> i64 {
        self.query("SELECT COUNT(*) FROM test__dead_letter")
    }
}

/// Read-only views of a PostgreSQL store, through `psql` (synchronous, so usable in
/// [`crate::eventually`]).
pub struct PgDb(pub String);

impl PgDb {
    /// Runs a query returning one integer; 0 while the table does not exist yet, a panic on any
    /// other error.
    pub fn query(&self, sql: &str) -> i64 {
        let out = Command::new("psql")
            .args([self.0.as_str(), "-AtXqc", sql])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            assert!(stderr.contains("does not exist"), "{sql}: {stderr}");
            return 0;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{sql}: {text}"))
    }

    /// Runs a query returning text; empty while the table does not exist yet, a panic on any
    /// other error.
    pub fn text(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args([self.0.as_str(), "-AtXqc", sql])
            .output()
            .unwrap();
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("does not exist"), "{sql}: {stderr}");
            return String::new();
        }
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Rows in `test__events`.
    pub fn rows(&self) -> i64 {
        self.query("SELECT count(*) FROM test__events")
    }

    /// Distinct dedup keys in `test__events`.
    pub fn distinct_keys(&self) -> i64 {
        self.query("SELECT count(DISTINCT dedup_key) FROM test__events")
    }

    /// Rows in `test__dead_letter`.
    pub fn dead_letters(&self) -> i64 {
        self.query("SELECT count(*) FROM test__dead_letter")
    }

    /// Asserts exactly-once: `distinct` rows, one per key, and no dead letters.
    pub fn assert_exactly_once(&self, distinct: usize) {
        assert_eq!(
            self.rows(),
            distinct as i64,
            "exactly one row per distinct key"
        );
        assert_eq!(self.distinct_keys(), distinct as i64);
        assert_eq!(self.dead_letters(), 0);
    }
}
