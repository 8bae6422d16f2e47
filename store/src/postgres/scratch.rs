//! Throwaway databases: each test, and each `sluice bench --store postgres` run, gets a fresh
//! database on a real server, dropped (with its connections) when the guard goes. The shipped
//! binary has it (feature `scratch`) for that benchmark only; the test doubles (`FaultStore`,
//! `Inspect`, feature `testing`) it does not.

use crate::StoreError;
use std::time::{SystemTime, UNIX_EPOCH};

/// Environment variable naming the server's administrative URL for tests.
pub const SCRATCH_SERVER_VAR: &str = "SLUICE_TEST_POSTGRES";
/// Administrative URL used when [`SCRATCH_SERVER_VAR`] is unset: the local server with trust
/// authentication that CI starts.
pub const DEFAULT_SCRATCH_SERVER: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database created for one test and dropped when this guard is dropped.
#[derive(Debug)]
pub struct ScratchDatabase {
    admin_url: String,
    name: String,
    url: String,
}

impl ScratchDatabase {
    /// Creates `sluice_scratch_<unique>` on the server [`SCRATCH_SERVER_VAR`] names (default
    /// [`DEFAULT_SCRATCH_SERVER`]).
    pub async fn create() -> Result<Self, StoreError> {
        let admin_url =
            std::env::var(SCRATCH_SERVER_VAR).unwrap_or_else(|_| DEFAULT_SCRATCH_SERVER.to_owned());
        Self::create_on(&admin_url).await
    }

    /// Creates `sluice_scratch_<unique>` on the server `admin_url` connects to (as a user that
    /// may create databases).
    pub async fn create_on(admin_url: &str) -> Result<Self, StoreError> {
        let admin_url = admin_url.to_owned();
        let unique = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let name = format!(
            "sluice_scratch_{}_{unique:x}_{:x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let admin = admin(&admin_url).await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await?;
        let (base, query) = match admin_url.split_once('?') {
            Some((base, query)) => (base, format!("?{query}")),
            None => (admin_url.as_str(), String::new()),
        };
        let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
        let url = format!("{server}/{name}{query}");
        Ok(Self {
            admin_url,
            name,
            url,
        })
    }

    /// URL of the scratch database (no sluice parameters; append `?...` or `&...` as needed).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

async fn admin(url: &str) -> Result<tokio_postgres::Client, StoreError> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        // Drop may run inside or outside a runtime: use a thread with its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            runtime.block_on(async {
                admin(&admin_url)
                    .await?
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await?;
                Ok::<_, StoreError>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop scratch database {}: {dropped:?}", self.name);
        }
    }
}
