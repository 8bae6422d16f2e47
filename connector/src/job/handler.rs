//! A job's handlers: what writes a batch's effects in the store's transaction
//! ([`SqliteHandler`], [`PostgresHandler`], [`postgres_handler`]), and how a handler becomes the
//! work the store runs in a commit.
//!
//! Guarantee: a handler runs inside the transaction that records the batch's dedup keys, and is
//! not called for a batch with no new message; a handler's panic is its failure (rejected), and
//! never takes the store's writer thread with it.

use super::handler_error::HandlerError;
use super::message::{NewMessages, Snapshot};
use futures::future::BoxFuture;
use sluice_engine::Batch;
use sluice_engine::BatchWork;
use sluice_store::{Effect, PostgresWork, SqliteWork, TransactionWork, WorkError};
use std::sync::Arc;

/// A job's handler on a SQLite store: writes the effects of the batch's new messages with
/// `tx`, the transaction that also records their dedup keys. Runs on the store's writer
/// thread: keep it to database work.
///
/// A closure `Fn(&rusqlite::Transaction<'_>, &NewMessages<'_>) -> Result<(), HandlerError>`
/// is one:
///
/// ```
/// use sluice_connector::prelude::*;
///
/// let count = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
///     for message in batch.iter() {
///         tx.execute(
///             "INSERT INTO counts (key, n) VALUES (?1, 1)
///              ON CONFLICT (key) DO UPDATE SET n = n + 1",
///             [message.attribute("region").unwrap_or("")],
///         )?;
///     }
///     Ok::<_, HandlerError>(())
/// };
/// # let _: &dyn SqliteHandler = &count;
/// ```
pub trait SqliteHandler: Send + Sync + 'static {
    /// Writes what `batch`'s messages do, with `tx`.
    fn handle(
        &self,
        tx: &rusqlite::Transaction<'_>,
        batch: &NewMessages<'_>,
    ) -> Result<(), HandlerError>;
}

impl<F> SqliteHandler for F
where
    F: Fn(&rusqlite::Transaction<'_>, &NewMessages<'_>) -> Result<(), HandlerError>
        + Send
        + Sync
        + 'static,
{
    fn handle(
        &self,
        tx: &rusqlite::Transaction<'_>,
        batch: &NewMessages<'_>,
    ) -> Result<(), HandlerError> {
        self(tx, batch)
    }
}

/// A job's handler on a PostgreSQL store: writes the effects of the batch's new messages with
/// `tx`, the transaction that also records their dedup keys.
///
/// ```
/// use sluice_connector::prelude::*;
///
/// struct Upsert;
///
/// #[async_trait::async_trait]
/// impl PostgresHandler for Upsert {
///     async fn handle(
///         &self,
///         tx: &tokio_postgres::Transaction<'_>,
///         batch: &NewMessages<'_>,
///     ) -> Result<(), HandlerError> {
///         for message in batch.iter() {
///             tx.execute(
///                 "INSERT INTO orders (id, body) VALUES ($1, $2)
///                  ON CONFLICT (id) DO UPDATE SET body = excluded.body",
///                 &[&message.key(), &message.data()],
///             )
///             .await?;
///         }
///         Ok(())
///     }
/// }
/// ```
#[async_trait::async_trait]
pub trait PostgresHandler: Send + Sync + 'static {
    /// Writes what `batch`'s messages do, with `tx`.
    async fn handle(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        batch: &NewMessages<'_>,
    ) -> Result<(), HandlerError>;
}

/// A [`PostgresHandler`] from a closure that returns its writes as a boxed future, for a job
/// that would rather not name a type (the closure form of [`SqliteHandler`], which PostgreSQL's
/// async transaction needs the box for).
///
/// ```no_run
/// use sluice_connector::prelude::*;
///
/// # async fn job() -> Result<(), JobError> {
/// let job = Job::builder("projects/p/subscriptions/orders")
///     .store("postgres://jobs@db/jobs")
///     .build()
///     .await?;
/// let mut stream = job.stream().await?;
/// while let Some(batch) = stream.next_batch().await {
///     let insert = postgres_handler(|tx, new| {
///         Box::pin(async move {
///             for order in new.iter() {
///                 tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&order.key()])
///                     .await?;
///             }
///             Ok(())
///         })
///     });
///     batch.commit_with_postgres(insert).await?;
/// }
/// # Ok(()) }
/// ```
pub fn postgres_handler<F>(write: F) -> impl PostgresHandler
where
    F: for<'a> Fn(
            &'a tokio_postgres::Transaction<'a>,
            &'a NewMessages<'a>,
        ) -> BoxFuture<'a, Result<(), HandlerError>>
        + Send
        + Sync
        + 'static,
{
    PostgresFn(write)
}

/// [`postgres_handler`]'s handler.
struct PostgresFn<F>(F);

#[async_trait::async_trait]
impl<F> PostgresHandler for PostgresFn<F>
where
    F: for<'a> Fn(
            &'a tokio_postgres::Transaction<'a>,
            &'a NewMessages<'a>,
        ) -> BoxFuture<'a, Result<(), HandlerError>>
        + Send
        + Sync
        + 'static,
{
    async fn handle(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        batch: &NewMessages<'_>,
    ) -> Result<(), HandlerError> {
        (self.0)(tx, batch).await
    }
}

/// A handler, on whichever backend it is for.
#[derive(Clone)]
pub(crate) enum AnyHandler {
    Sqlite(Arc<dyn SqliteHandler>),
    Postgres(Arc<dyn PostgresHandler>),
}

impl BatchWork for AnyHandler {
    fn work(&self, batch: &Batch, effects: &[Effect]) -> TransactionWork {
        let snapshot = Snapshot::of(batch, effects);
        match self {
            AnyHandler::Sqlite(handler) => TransactionWork::Sqlite(Arc::new(OnSqlite {
                handler: handler.clone(),
                snapshot,
            })),
            AnyHandler::Postgres(handler) => TransactionWork::Postgres(Arc::new(OnPostgres {
                handler: handler.clone(),
                snapshot,
            })),
        }
    }
}

struct OnSqlite {
    handler: Arc<dyn SqliteHandler>,
    snapshot: Snapshot,
}

impl SqliteWork for OnSqlite {
    fn write(&self, tx: &rusqlite::Transaction<'_>, new: &[usize]) -> Result<(), WorkError> {
        if new.is_empty() {
            return Ok(());
        }
        // A panic must not take the store's writer thread with it: it is the handler's failure.
        let view = self.snapshot.view(new);
        let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.handler.handle(tx, &view)
        }));
        Ok(handled.map_err(panicked)??)
    }
}

struct OnPostgres {
    handler: Arc<dyn PostgresHandler>,
    snapshot: Snapshot,
}

#[async_trait::async_trait]
impl PostgresWork for OnPostgres {
    async fn write(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        new: &[usize],
    ) -> Result<(), WorkError> {
        if new.is_empty() {
            return Ok(());
        }
        use futures::FutureExt;
        let view = self.snapshot.view(new);
        let handled = std::panic::AssertUnwindSafe(self.handler.handle(tx, &view))
            .catch_unwind()
            .await;
        Ok(handled.map_err(panicked)??)
    }
}

/// A handler's panic, as the handler's failure (the data's: a panic is not expected to pass).
fn panicked(payload: Box<dyn std::any::Any + Send>) -> HandlerError {
    let why = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    HandlerError::rejected(format!("the handler panicked: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panicking handler fails its attempt (rejected), and the writer thread lives on.
    #[test]
    fn a_panic_is_the_handlers_failure() {
        let error = panicked(Box::new("boom"));
        assert!(!error.is_transient());
        assert!(error.to_string().contains("boom"));
    }
}
