//! From a `postgres://` URL to a connection pool: sluice's own URL parameters, TLS and pool
//! limits.
//!
//! The URL is libpq's (`postgres://user:password@host:port/db?sslmode=require`), as parsed by
//! `tokio-postgres`, plus three parameters that sluice reads and removes before that:
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `pool_size` | 8 | connections per worker process |
//! | `sslrootcert` | the system's roots | a PEM file of CA certificates that server certificates must chain to |
//! | `ledger_generation` | `10m` | width of a ledger partition; read only when the database is first prepared (see `ledger.rs`) |
//!
//! `sslmode=disable|prefer|require`: with `prefer` and `require` the server certificate is
//! verified against the roots and the host name, like libpq's `verify-full` (libpq's `require`
//! skips verification; sluice never sends a ledger over an unverified channel), so `prefer`
//! fails rather than falls back when the server offers a certificate that does not verify.
//! Without `sslmode` the connection is plain (libpq would try unverified TLS first, which
//! protects against nothing an attacker on the path cannot undo).

use crate::StoreError;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Connections per worker process unless `pool_size` says otherwise: enough for the commits of
/// several flows in parallel plus coordination, few enough that a pool of workers stays far
/// below PostgreSQL's default `max_connections` (100).
pub(crate) const DEFAULT_POOL_SIZE: usize = 8;
/// Width of a ledger generation unless `ledger_generation` says otherwise: the default dedup
/// window, so each key is written to two generations (see `ledger.rs`).
pub(crate) const DEFAULT_GENERATION: Duration = Duration::from_secs(600);
/// How long opening one connection may take before the attempt counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller waits for a free pooled connection before the store counts as unavailable.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// Settings of a PostgreSQL store beyond what the URL's libpq part says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresOptions {
    /// Connections per process (URL `pool_size`, default 8).
    pub pool_size: usize,
    /// PEM file of trusted CA certificates (URL `sslrootcert`; default: the system's roots).
    pub root_certificates: Option<String>,
    /// Width of a ledger generation (URL `ledger_generation`, default 10 minutes). Applies only
    /// when the database is prepared for the first time; later the stored value wins, so that
    /// every replica numbers generations alike.
    pub ledger_generation: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_size: DEFAULT_POOL_SIZE,
            root_certificates: None,
            ledger_generation: DEFAULT_GENERATION,
        }
    }
}

/// Splits sluice's own parameters off `url`; returns the libpq part and the options.
pub(crate) fn split_url(url: &str) -> Result<(String, PostgresOptions), StoreError> {
    let mut options = PostgresOptions::default();
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), options));
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "pool_size" => {
                options.pool_size = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(url, "pool_size must be a positive integer"))?;
            }
            "sslrootcert" => options.root_certificates = Some(value.to_owned()),
            "ledger_generation" => {
                options.ledger_generation = humantime::parse_duration(value)
                    .ok()
                    .filter(|d| *d >= Duration::from_secs(1))
                    .ok_or_else(|| {
                        bad(url, "ledger_generation must be a duration of 1s or more")
                    })?;
            }
            _ => kept.push(pair),
        }
    }
    let libpq = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((libpq, options))
}

fn bad(url: &str, why: &str) -> StoreError {
    StoreError::Config(format!("{}: {why}", redact(url)))
}

/// `url` with its password replaced, for messages.
pub(crate) fn redact(url: &str) -> String {
    redact_password_parameters(&redact_userinfo(url))
}

/// `scheme://user:***@host...`: the password is everything between the user's `:` and the
/// last `@` before the query (a password may hold an unescaped `@`).
fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let before_query = rest.find('?').unwrap_or(rest.len());
    match rest[..before_query].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{}", &rest[at + 1..]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// `password=***` for a `password` parameter, in a URL's query (`?password=...&...`) or in a
/// key-value connection string (`host=h password=...`).
fn redact_password_parameters(text: &str) -> String {
    const KEY: &str = "password=";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = rest.to_ascii_lowercase().find(KEY) {
        let at_boundary =
            found == 0 || matches!(rest.as_bytes()[found - 1], b'?' | b'&' | b' ' | b'\t');
        let value_start = found + KEY.len();
        out.push_str(&rest[..value_start]);
        let value_end = rest[value_start..]
            .find(['&', ' ', '\t'])
            .map_or(rest.len(), |end| value_start + end);
        if at_boundary {
            out.push_str("***");
        } else {
            out.push_str(&rest[value_start..value_end]);
        }
        rest = &rest[value_end..];
    }
    out.push_str(rest);
    out
}

/// Every sluice session commits synchronously: a commit that returned (and whose messages are
/// then acked) is on the server's disk, even where the database or server default is `off`.
/// And it reads times in UTC, writes dates as ISO 8601 and reads string literals as the SQL
/// standard does, whatever the server's defaults: a typed flow's expressions (and a window's
/// group of a date column) compute as on SQLite.
const DURABILITY_OPTION: &str = "-c synchronous_commit=on -c TimeZone=UTC -c DateStyle=ISO \
     -c standard_conforming_strings=on";

/// Session settings when the URL gives no `options` of its own: the durability setting, plus
/// quiet notices (upkeep's `DROP TABLE IF EXISTS`), custom plans (the commit statement takes its
/// batch as arrays: a generic plan would guess ten rows per array and may join a thousand-row
/// batch in nested loops) and no JIT (the statement's estimated cost crosses `jit_above_cost`,
/// and compiling it took 60 of a commit's 90 ms under auto_explain).
const SESSION_OPTIONS: &str = "-c synchronous_commit=on -c TimeZone=UTC -c DateStyle=ISO \
     -c standard_conforming_strings=on -c client_min_messages=warning \
     -c plan_cache_mode=force_custom_plan -c jit=off";

/// Builds the pool; no connection is opened until first use.
pub(crate) fn pool(libpq_url: &str, options: &PostgresOptions) -> Result<Pool, StoreError> {
    pool_of(libpq_url, options, options.pool_size)
}

/// A pool of `size` connections to the URL's database (see [`pool`]).
pub(crate) fn pool_of(
    libpq_url: &str,
    options: &PostgresOptions,
    size: usize,
) -> Result<Pool, StoreError> {
    let mut config = tokio_postgres::Config::from_str(libpq_url)
        .map_err(|e| StoreError::Config(format!("{}: {e}", redact(libpq_url))))?;
    if !libpq_url.contains("sslmode=") {
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_options().is_none() {
        config.options(SESSION_OPTIONS);
    } else if let Some(given) = config.get_options() {
        // The URL's own options come first; sluice's durability setting is appended, so it wins.
        let options = format!("{given} {DURABILITY_OPTION}");
        config.options(&options);
    }
    if config.get_application_name().is_none() {
        config.application_name("sluice");
    }
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(options)?);
    let manager = Manager::from_config(config, tls, manager_config);
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(|e| StoreError::Config(format!("connection pool: {e}")))
}

/// Client TLS settings: the `sslrootcert` file if given, else the system's roots.
fn tls_config(options: &PostgresOptions) -> Result<rustls::ClientConfig, StoreError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match &options.root_certificates {
        Some(path) => {
            let certificates = CertificateDer::pem_file_iter(path)
                .map_err(|e| StoreError::Config(format!("sslrootcert {path}: {e}")))?;
            for certificate in certificates {
                let certificate = certificate
                    .map_err(|e| StoreError::Config(format!("sslrootcert {path}: {e}")))?;
                roots
                    .add(certificate)
                    .map_err(|e| StoreError::Config(format!("sslrootcert {path}: {e}")))?;
            }
        }
        None => {
            // Unreadable system certificates leave TLS impossible but plain connections fine.
            for certificate in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(certificate);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Config(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sluice_parameters_are_split_off() {
        let (libpq, options) = split_url(
            "postgres://u:pw@h/db?sslmode=require&pool_size=3&ledger_generation=2s&sslrootcert=/ca.pem",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(libpq, "postgres://u:pw@h/db?sslmode=require");
        assert_eq!(options.pool_size, 3);
        assert_eq!(options.ledger_generation, Duration::from_secs(2));
        assert_eq!(options.root_certificates.as_deref(), Some("/ca.pem"));
        assert!(split_url("postgres://h/db?pool_size=0").is_err());
        assert!(split_url("postgres://h/db?ledger_generation=5ms").is_err());
        assert_eq!(
            split_url("postgres://h/db").map(|(u, _)| u).ok().as_deref(),
            Some("postgres://h/db")
        );
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        // An unescaped `@` in the password, a password in the query, a key-value string.
        assert_eq!(redact("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
        assert_eq!(
            redact("postgres://h/db?user=u&password=secret&sslmode=require"),
            "postgres://h/db?user=u&password=***&sslmode=require"
        );
        assert_eq!(
            redact("postgres://u@h/db?Password=secret"),
            "postgres://u@h/db?Password=***"
        );
        assert_eq!(
            redact("host=h user=u password=secret dbname=d"),
            "host=h user=u password=*** dbname=d"
        );
        assert_eq!(
            redact("postgres://h/db?oldpassword=x"),
            "postgres://h/db?oldpassword=x"
        );
    }
}
