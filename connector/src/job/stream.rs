//! Stream-style jobs: pull a batch ([`JobStream::next_batch`]), look at it, then commit it with
//! your own writes ([`JobBatch::commit_with_postgres`], [`JobBatch::commit_with_sqlite`]) or,
//! for a job whose effect lives elsewhere, record it done ([`JobBatch::settle`]). Either way
//! the batch's messages are acked only after the commit, with the same retries and dead
//! letters as a handler's run.

use super::error::JobError;
use super::handler::{AnyHandler, PostgresHandler, SqliteHandler};
use super::message::Message;
use super::run::{Job, JobReport, give_up_after_drain};
use sluice_engine::CommitThenAck;
use sluice_engine::FlowError;
use sluice_engine::SourceHandle;
use sluice_engine::telemetry::Counters;
use sluice_engine::{Batch, BatchSource};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// Batches of a job, pulled one at a time. Each is acked only once committed: with your writes
/// ([`JobBatch::commit_with_sqlite`], [`JobBatch::commit_with_postgres`]), or recorded done
/// after you put its effect elsewhere ([`JobBatch::settle`]).
///
/// ```no_run
/// # async fn job() -> Result<(), sluice_connector::JobError> {
/// use sluice_connector::prelude::*;
/// let job = Job::builder("projects/p/subscriptions/readings")
///     .store("sqlite://state/readings.db")
///     .event_time_attribute("ts")
///     .watermark(std::time::Duration::from_secs(10))
///     .build()
///     .await?;
/// job.drain_on_signals(); // SIGTERM: no more pulls, the stream ends after what it holds
/// let mut stream = job.stream().await?;
/// while let Some(batch) = stream.next_batch().await {
///     println!("{} messages, watermark {:?}", batch.len(), batch.watermark());
///     batch
///         .commit_with_sqlite(|tx: &rusqlite::Transaction<'_>, new: &NewMessages<'_>| {
///             for reading in new.iter() {
///                 tx.execute(
///                     "INSERT INTO readings (id, body) VALUES (?1, ?2)",
///                     (reading.key(), reading.data()),
///                 )?;
///             }
///             Ok(())
///         })
///         .await?;
/// }
/// stream.close().await;
/// # Ok(()) }
/// ```
pub struct JobStream {
    batches: Option<BatchSource>,
    source: Option<Box<dyn SourceHandle>>,
    committer: CommitThenAck,
    postgres: bool,
    event_time_attribute: Option<String>,
    stop: CancellationToken,
    give_up: CancellationToken,
    tracker: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Job {
    /// Batches to pull and commit one by one ([`JobStream`] has an example).
    ///
    /// # Errors
    /// The subscription cannot be read.
    pub async fn stream(self) -> Result<JobStream, JobError> {
        JobStream::start(self).await
    }
}

impl JobStream {
    async fn start(job: Job) -> Result<Self, JobError> {
        let parts = job.settings.flow.parts().map_err(FlowError::from)?;
        let counters = Counters::new(&job.settings.name, &job.settings.name);
        let give_up = give_up_after_drain(&job.stop);
        let committer = job.committer(&parts, give_up.clone());
        // Before the first message: the batches carry the watermark from the start.
        let mut tracker = job.start_tracker(&counters);
        let started = BatchSource::start(
            Box::new(
                parts
                    .source
                    .labelled(&job.settings.name, &job.settings.name),
            ),
            parts.budget,
            parts.dedup,
            parts.batch,
            counters.clone(),
            job.stop.clone(),
        )
        .await;
        let (batches, source) = match started {
            Ok(started) => started,
            Err(error) => {
                give_up.cancel();
                if let Some((stop, task)) = tracker.take() {
                    stop.cancel();
                    let _ = task.await;
                }
                return Err(FlowError::from(error).into());
            }
        };
        Ok(Self {
            batches: Some(batches),
            source: Some(source),
            committer,
            postgres: job.postgres,
            event_time_attribute: job.settings.flow.event_time_attribute.clone(),
            stop: job.stop,
            give_up,
            tracker,
        })
    }

    /// The next batch; `None` once the job's stop token was cancelled and everything received
    /// was handed out.
    pub async fn next_batch(&mut self) -> Option<JobBatch<'_>> {
        let batch = self.batches.as_mut()?.next_batch().await?;
        Some(JobBatch {
            batch,
            stream: self,
        })
    }

    /// Stops pulling (as the job's stop token does); batches already received still come from
    /// [`JobStream::next_batch`]. They must be committed or settled within
    /// [`sluice_engine::defaults::DRAIN_DEADLINE`] of the drain: a commit still waiting for the store
    /// after that gives its batch back uncommitted (Pub/Sub redelivers it).
    pub fn drain(&self) {
        self.stop.cancel();
    }

    /// Closes the stream once drained: what the client still holds unasked is given back, and
    /// the watermark tracker stops.
    pub async fn close(mut self) {
        self.stop.cancel();
        drop(self.batches.take());
        if let Some(source) = self.source.take() {
            source.close().await;
        }
        if let Some((stop, task)) = self.tracker.take() {
            stop.cancel();
            let _ = task.await;
        }
    }
}

impl Drop for JobStream {
    /// A stream dropped without [`JobStream::close`] stops its tracker and timers; what the
    /// client holds goes back to Pub/Sub when its streams drop.
    fn drop(&mut self) {
        self.stop.cancel();
        self.give_up.cancel();
        if let Some((stop, _)) = &self.tracker {
            stop.cancel();
        }
    }
}

/// One batch of a [`JobStream`]: acked only once committed, nacked if dropped uncommitted.
///
/// A job whose effect lives in another system sends the batch there first, keyed so that a
/// repeat is harmless, then settles it:
///
/// ```no_run
/// # use sluice_connector::prelude::*;
/// # async fn send(_: &str, _: Vec<Vec<u8>>) -> Result<(), std::io::Error> { Ok(()) }
/// # async fn forward(batch: JobBatch<'_>) {
/// let bodies = batch.messages().map(|m| m.data().to_vec()).collect();
/// match send(&batch.id(), bodies).await {
///     Ok(()) => {
///         batch.settle().await;
///     }
///     // Redelivered soon and sent again: perhaps in another batch (another id), so the other
///     // system also drops repeats of a message's own key.
///     Err(_) => batch.abandon(),
/// }
/// # }
/// ```
pub struct JobBatch<'s> {
    batch: Batch,
    stream: &'s JobStream,
}

impl JobBatch<'_> {
    /// Its id, derived from its messages' keys: the same messages batched together again carry
    /// the same id. A redelivery after a crash is not always batched the same way, so a system
    /// outside the store that takes the id as its idempotency key should drop repeats of a
    /// message's key too.
    pub fn id(&self) -> String {
        sluice_engine::batch_id(self.batch.deliveries().iter().map(|d| d.key.as_str()))
    }

    /// Its messages, in receive order, before the commit decides: a copy another replica
    /// committed within the window is still here (the commit finds it a duplicate), and so is
    /// a message the commit will dead-letter (no dedup key, an unreadable event time).
    pub fn messages(&self) -> impl Iterator<Item = Message<'_>> + '_ {
        let attribute = self.stream.event_time_attribute.as_deref();
        self.batch
            .deliveries()
            .iter()
            .map(move |d| Message::of_delivery(d, attribute))
    }

    /// How many messages.
    pub fn len(&self) -> usize {
        self.batch.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// The job's event-time watermark when the batch was formed (a job with a watermark).
    pub fn watermark(&self) -> Option<SystemTime> {
        self.batch
            .watermark_ms()
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// Commits the batch with `handler`'s writes in the PostgreSQL store's transaction, then
    /// acks it (retrying and dead-lettering as a handler's run does).
    ///
    /// ```no_run
    /// # use sluice_connector::prelude::*;
    /// struct Insert;
    ///
    /// #[async_trait::async_trait]
    /// impl PostgresHandler for Insert {
    ///     async fn handle(
    ///         &self,
    ///         tx: &tokio_postgres::Transaction<'_>,
    ///         batch: &NewMessages<'_>,
    ///     ) -> Result<(), HandlerError> {
    ///         for message in batch.iter() {
    ///             tx.execute("INSERT INTO events (id) VALUES ($1)", &[&message.key()]).await?;
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// # async fn commit(batch: JobBatch<'_>) -> Result<(), JobError> {
    /// let report = batch.commit_with_postgres(Insert).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The store is SQLite (the batch is given back).
    pub async fn commit_with_postgres(
        self,
        handler: impl PostgresHandler,
    ) -> Result<JobReport, JobError> {
        if !self.stream.postgres {
            self.batch.abandon();
            return Err(JobError::Invalid("the store is not PostgreSQL".to_owned()));
        }
        let work = Arc::new(AnyHandler::Postgres(Arc::new(handler)));
        Ok(self
            .stream
            .committer
            .process_with(self.batch, Some(work))
            .await)
    }

    /// Commits the batch with `handler`'s writes in the SQLite store's transaction, then acks
    /// it (retrying and dead-lettering as a handler's run does).
    ///
    /// # Errors
    /// The store is PostgreSQL (the batch is given back).
    pub async fn commit_with_sqlite(
        self,
        handler: impl SqliteHandler,
    ) -> Result<JobReport, JobError> {
        if self.stream.postgres {
            self.batch.abandon();
            return Err(JobError::Invalid("the store is not SQLite".to_owned()));
        }
        let work = Arc::new(AnyHandler::Sqlite(Arc::new(handler)));
        Ok(self
            .stream
            .committer
            .process_with(self.batch, Some(work))
            .await)
    }

    /// Records the batch's messages done (their dedup keys, in one transaction) and acks them:
    /// for a job that wrote their effect elsewhere, idempotently, before.
    pub async fn settle(self) -> JobReport {
        let record_only = Arc::new(RecordOnly(self.stream.postgres));
        self.stream
            .committer
            .process_with(self.batch, Some(record_only))
            .await
    }

    /// Gives the batch back to Pub/Sub uncommitted, for prompt redelivery.
    pub fn abandon(self) {
        self.batch.abandon();
    }
}

/// No writes of the caller's: the keys only.
struct RecordOnly(bool);

impl sluice_engine::BatchWork for RecordOnly {
    fn work(&self, _: &Batch, _: &[sluice_store::Effect]) -> sluice_store::TransactionWork {
        if self.0 {
            sluice_store::TransactionWork::Postgres(Arc::new(Nothing))
        } else {
            sluice_store::TransactionWork::Sqlite(Arc::new(Nothing))
        }
    }
}

struct Nothing;

impl sluice_store::SqliteWork for Nothing {
    fn write(
        &self,
        _: &rusqlite::Transaction<'_>,
        _: &[usize],
    ) -> Result<(), sluice_store::WorkError> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl sluice_store::PostgresWork for Nothing {
    async fn write(
        &self,
        _: &tokio_postgres::Transaction<'_>,
        _: &[usize],
    ) -> Result<(), sluice_store::WorkError> {
        Ok(())
    }
}
