//! What a job's handler is given and returns: the batch's new messages ([`NewMessages`],
//! [`Message`]) on the store's open transaction, and a [`HandlerError`] that rolls it back.

use futures::future::BoxFuture;
use sluice_engine::Batch;
use sluice_engine::BatchWork;
use sluice_store::{Effect, PostgresWork, SqliteWork, TransactionWork, WorkError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// A handler failed; the transaction is rolled back (the dedup keys too), nothing is acked.
///
/// ```
/// use sluice_connector::prelude::*;
///
/// let check = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
///     for message in batch.iter() {
///         let amount: i64 = std::str::from_utf8(message.data())
///             .ok()
///             .and_then(|text| text.parse().ok())
///             // This message is at fault: dead-lettered after its attempts, the rest commit.
///             .ok_or_else(|| HandlerError::rejected("the payload is not an amount"))?;
///         // A database error: `?` decides (a constraint is the data's fault, a lock is not).
///         tx.execute(
///             "INSERT INTO amounts (key, amount) VALUES (?1, ?2)",
///             (message.key(), amount),
///         )?;
///     }
///     Ok(())
/// };
/// # let _: &dyn SqliteHandler = &check;
/// ```
///
/// [`HandlerError::rejected`]: the data is at fault; a batch of several is retried one message
/// at a time to find the culprit, which is dead-lettered with this error after its
/// `max_attempts`. [`HandlerError::transient`]: the same batch is retried with backoff for as
/// long as it takes, nothing charged. `?` on a database error classifies it as the store
/// classifies its own: only a refusal of the data (PostgreSQL SQLSTATE classes 22 and 23;
/// SQLite's constraint, too-big and type-mismatch errors) is rejected; anything else (a lost
/// connection, a lock timeout, a serialization failure, a missing table, a full disk) is
/// transient, so a message is never dead-lettered for the database's trouble.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    message: String,
    transient: bool,
}

impl HandlerError {
    /// The batch's data made the handler fail.
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let error = HandlerError::rejected("no customer 42");
    /// assert!(!error.is_transient());
    /// ```
    pub fn rejected(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: false,
        }
    }

    /// Retrying the same batch later may work.
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// assert!(HandlerError::transient("lock timeout").is_transient());
    /// ```
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            transient: true,
        }
    }

    /// Whether it is [`HandlerError::transient`].
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// assert!(!HandlerError::rejected("bad row").is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

impl From<sluice_store::StoreError> for HandlerError {
    fn from(error: sluice_store::StoreError) -> Self {
        match error {
            sluice_store::StoreError::Rejected(message) => Self::rejected(message),
            other => Self::transient(other.to_string()),
        }
    }
}

impl From<rusqlite::Error> for HandlerError {
    fn from(error: rusqlite::Error) -> Self {
        sluice_store::StoreError::from(error).into()
    }
}

impl From<tokio_postgres::Error> for HandlerError {
    fn from(error: tokio_postgres::Error) -> Self {
        sluice_store::StoreError::from(error).into()
    }
}

impl From<HandlerError> for WorkError {
    fn from(error: HandlerError) -> Self {
        if error.transient {
            WorkError::transient(error.message)
        } else {
            WorkError::rejected(error.message)
        }
    }
}

/// One message of a batch, as a handler sees it.
///
/// ```
/// use sluice_connector::prelude::*;
/// use std::time::UNIX_EPOCH;
///
/// let store = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
///     for message in batch.iter() {
///         let event_ms = message
///             .event_time()
///             .duration_since(UNIX_EPOCH)
///             .map_or(0, |t| t.as_millis() as i64);
///         let attributes = message.attributes().len();
///         tx.execute(
///             "INSERT INTO events (key, pubsub_id, body, event_ms, region, attributes)
///              VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
///             (
///                 message.key(),
///                 message.id(),
///                 message.data(),
///                 event_ms,
///                 message.attribute("region"),
///                 attributes,
///             ),
///         )?;
///     }
///     Ok::<_, HandlerError>(())
/// };
/// # let _: &dyn SqliteHandler = &store;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    key: &'a str,
    id: &'a str,
    data: &'a [u8],
    attributes: &'a BTreeMap<String, String>,
    publish_time_ms: i64,
    event_time_ms: i64,
}

impl<'a> Message<'a> {
    fn of_owned(owned: &'a Owned) -> Self {
        Self {
            key: &owned.key,
            id: &owned.id,
            data: &owned.data,
            attributes: &owned.attributes,
            publish_time_ms: owned.publish_time_ms,
            event_time_ms: owned.event_time_ms,
        }
    }

    /// A received message, its event time read from `event_time_attribute` when it has a
    /// readable one, else its publish time.
    pub(crate) fn of_delivery(
        delivery: &'a sluice_engine::Delivery,
        event_time_attribute: Option<&str>,
    ) -> Self {
        let message = &delivery.message;
        let event_time_ms = message
            .event_time_ms
            .or_else(|| {
                let value = message.attributes.get(event_time_attribute?)?;
                sluice_engine::parse_event_time(value)
            })
            .unwrap_or(message.publish_time_ms);
        Self {
            key: delivery.key.as_str(),
            id: &message.message_id,
            data: &message.data,
            attributes: &message.attributes,
            publish_time_ms: message.publish_time_ms,
            event_time_ms,
        }
    }

    /// Its dedup key (the message id, or the dedup attribute's value).
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// Its Pub/Sub message id.
    pub fn id(&self) -> &'a str {
        self.id
    }

    /// Its payload.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Its attributes.
    pub fn attributes(&self) -> &'a BTreeMap<String, String> {
        self.attributes
    }

    /// One attribute.
    pub fn attribute(&self, name: &str) -> Option<&'a str> {
        self.attributes.get(name).map(String::as_str)
    }

    /// When Pub/Sub received it.
    pub fn publish_time(&self) -> SystemTime {
        system_time(self.publish_time_ms)
    }

    /// Its event time: the job's event-time attribute, else its publish time.
    pub fn event_time(&self) -> SystemTime {
        system_time(self.event_time_ms)
    }
}

/// The new messages of a batch: those whose dedup key the ledger had not seen within the
/// window (never a duplicate, never one that is dead-lettered), in receive order.
///
/// ```
/// use sluice_connector::prelude::*;
///
/// let audit = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
///     let watermark_ms = batch
///         .watermark()
///         .and_then(|w| w.duration_since(std::time::UNIX_EPOCH).ok())
///         .map(|w| w.as_millis() as i64);
///     tx.execute(
///         "INSERT INTO batches (id, messages, watermark_ms) VALUES (?1, ?2, ?3)",
///         (batch.batch_id(), batch.len() as i64, watermark_ms),
///     )?;
///     Ok::<_, HandlerError>(())
/// };
/// # let _: &dyn SqliteHandler = &audit;
/// ```
#[derive(Debug)]
pub struct NewMessages<'a> {
    all: &'a [Owned],
    new: &'a [usize],
    batch_id: &'a str,
    watermark_ms: Option<i64>,
}

impl<'a> NewMessages<'a> {
    /// Them, in receive order.
    pub fn iter(&self) -> impl Iterator<Item = Message<'a>> + '_ {
        self.new.iter().map(|i| Message::of_owned(&self.all[*i]))
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.new.len()
    }

    /// Whether there are none (a handler is not called then).
    pub fn is_empty(&self) -> bool {
        self.new.is_empty()
    }

    /// The batch's id: the same for the same keys, so a batch given again after a crash (the
    /// same messages batched together again) has the same id.
    pub fn batch_id(&self) -> &'a str {
        self.batch_id
    }

    /// The flow's event-time watermark when the batch was formed (a job with a watermark).
    pub fn watermark(&self) -> Option<SystemTime> {
        self.watermark_ms.map(system_time)
    }
}

/// A message kept for the handler, owned (the work may run on another thread).
#[derive(Debug)]
pub(crate) struct Owned {
    key: String,
    id: String,
    data: bytes::Bytes,
    attributes: BTreeMap<String, String>,
    publish_time_ms: i64,
    event_time_ms: i64,
}

/// What a handler is given about one batch.
struct Snapshot {
    messages: Vec<Owned>,
    batch_id: String,
    watermark_ms: Option<i64>,
}

impl Snapshot {
    fn of(batch: &Batch, effects: &[Effect]) -> Self {
        let messages = batch
            .deliveries()
            .iter()
            .zip(effects)
            .map(|(delivery, effect)| Owned {
                key: delivery.key.as_str().to_owned(),
                id: delivery.message.message_id.clone(),
                data: delivery.message.data.clone(),
                attributes: delivery.message.attributes.clone(),
                publish_time_ms: delivery.message.publish_time_ms,
                event_time_ms: match effect {
                    Effect::Row { event_time_ms } => *event_time_ms,
                    Effect::DeadLetter { .. } => delivery.message.publish_time_ms,
                },
            })
            .collect();
        Self {
            messages,
            batch_id: sluice_engine::batch_id(batch.deliveries().iter().map(|d| d.key.as_str())),
            watermark_ms: batch.watermark_ms(),
        }
    }

    fn view<'a>(&'a self, new: &'a [usize]) -> NewMessages<'a> {
        NewMessages {
            all: &self.messages,
            new,
            batch_id: &self.batch_id,
            watermark_ms: self.watermark_ms,
        }
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

fn system_time(ms: i64) -> SystemTime {
    match u64::try_from(ms) {
        Ok(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        Err(_) => UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// `?` on a database error blames the data only for a refusal of the data: a missing
    /// table, a busy database or a lost connection is retried, never dead-lettered.
    #[test]
    fn database_errors_blame_the_data_only_when_it_is_refused() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY)", [])
            .unwrap();
        conn.execute("INSERT INTO t VALUES ('a')", []).unwrap();
        let duplicate = conn.execute("INSERT INTO t VALUES ('a')", []).unwrap_err();
        assert!(!HandlerError::from(duplicate).is_transient());
        let missing = conn
            .execute("INSERT INTO nowhere VALUES (1)", [])
            .unwrap_err();
        assert!(HandlerError::from(missing).is_transient());
        assert!(
            HandlerError::from(sluice_store::StoreError::Unavailable("gone".into())).is_transient()
        );
    }

    /// A panicking handler fails its attempt (rejected), and the writer thread lives on.
    #[test]
    fn a_panic_is_the_handlers_failure() {
        let error = panicked(Box::new("boom"));
        assert!(!error.is_transient());
        assert!(error.to_string().contains("boom"));
    }
}
