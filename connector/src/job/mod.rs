//! The front door for custom streaming jobs: [`Job::builder`], then a handler that writes into
//! your own tables inside the transaction that records the batch's dedup keys
//! ([`Job::run_postgres`], [`Job::run_sqlite`]), or batches you pull and commit yourself
//! ([`Job::stream`]). See the crate docs for the tutorial and complete examples.
//!
//! # Guarantees
//!
//! * **Your rows, exactly once.** A batch's new messages reach the handler with the store's open
//!   transaction; sluice adds their dedup keys and the batch's dead letters to that same
//!   transaction, commits it, and only then acks the messages. A crash anywhere before the
//!   commit leaves none of your writes and none of the keys; after it, the redelivered copies
//!   are duplicates your handler never sees. Within the dedup window (default 10 minutes), for
//!   every replica sharing the store.
//! * **The worker's behaviour.** The same committer as `sluice run`: a handler error rolls the
//!   transaction back and is retried with backoff; a batch of several is split to find the
//!   message at fault, which is dead-lettered (`<name>__dead_letter`, with the handler's error)
//!   after `max_attempts`; a transient error or an unreachable store is retried for as long as
//!   it takes, leases extended, nothing acked; a stop drains: nothing more is pulled, what was
//!   received is committed and acked.
//! * **Bounded memory**: at most the flow-control bounds are held between receipt and ack.

mod handler;
mod stream;

pub use handler::{
    HandlerError, Message, NewMessages, PostgresHandler, SqliteHandler, postgres_handler,
};
pub use stream::{JobBatch, JobStream};

use handler::AnyHandler;
use sluice_engine::defaults;
use sluice_engine::{
    BatchSettings, CommitReport, CommitThenAck, Counters, DedupSettings, FlowError, FlowParts,
    FlowRun, FlowWatermark, KeySource, PubSubConfig, PubSubFlow, RunUntil, TrackerSettings,
    WatermarkTracker,
};
use sluice_store::{FlowHandle, Layout, Store, StoreError, StoreUrl};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How a job recognises copies of one message.
///
/// ```
/// # use sluice_connector::prelude::*;
/// use std::time::Duration;
/// // A publisher's retry carries a new message id but the same `order_id`.
/// let by_order = Dedup::by_attribute("order_id").window(Duration::from_secs(3600));
/// // Only Pub/Sub's own redeliveries, over the default 10 minutes.
/// let by_id = Dedup::by_message_id();
/// assert_ne!(by_order, by_id);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dedup {
    key: KeySource,
    window: Duration,
}

impl Dedup {
    /// By Pub/Sub message id (a publisher's retry with a new id is a new message).
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let dedup = Dedup::by_message_id();
    /// ```
    pub fn by_message_id() -> Self {
        Self {
            key: KeySource::MessageId,
            window: defaults::DEDUP_WINDOW,
        }
    }

    /// By the value of attribute `name`; a message without it is keyed by its message id.
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let dedup = Dedup::by_attribute("event_id").window(std::time::Duration::from_secs(3600));
    /// ```
    pub fn by_attribute(name: impl Into<String>) -> Self {
        Self {
            key: KeySource::Attribute {
                name: name.into(),
                dead_letter_if_missing: false,
            },
            window: defaults::DEDUP_WINDOW,
        }
    }

    /// As [`Dedup::by_attribute`], a message without it dead-lettered (`missing_dedup_attribute`).
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let strict = Dedup::by_attribute_or_dead_letter("event_id");
    /// ```
    pub fn by_attribute_or_dead_letter(name: impl Into<String>) -> Self {
        Self {
            key: KeySource::Attribute {
                name: name.into(),
                dead_letter_if_missing: true,
            },
            window: defaults::DEDUP_WINDOW,
        }
    }

    /// Keys are remembered this long (default 10 minutes).
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let day = Dedup::by_message_id().window(std::time::Duration::from_secs(86_400));
    /// ```
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }
}

/// Why a job could not start or run.
///
/// ```
/// # async fn job() {
/// use sluice_connector::prelude::*;
/// match Job::builder("projects/p/subscriptions/s").name("Not An Identifier").build().await {
///     Err(JobError::Invalid(why)) => eprintln!("bad setting: {why}"),
///     Err(other) => eprintln!("cannot start: {other}"),
///     Ok(_) => unreachable!("the name is refused"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// A setting is unusable (a name that is not an identifier, a store URL of no known
    /// scheme, a handler for the other store).
    #[error("{0}")]
    Invalid(String),
    /// The store could not be opened or prepared.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The subscription could not be read.
    #[error(transparent)]
    Flow(#[from] FlowError),
}

/// A job's settings, each with the default `sluice run` gives a Pub/Sub flow
/// ([`defaults`]). Every knob, set:
///
/// ```no_run
/// # async fn job() -> Result<(), sluice_connector::JobError> {
/// use sluice_connector::prelude::*;
/// use std::time::Duration;
/// let job = Job::builder("projects/my-project/subscriptions/orders")
///     .name("orders_counts")
///     .pubsub(PubSubConfig::default())
///     .dedup(Dedup::by_attribute("order_id").window(Duration::from_secs(1800)))
///     .store("postgres://jobs@db.internal/jobs")
///     .event_time_attribute("ts")
///     .bad_timestamp_uses_publish_time()
///     .watermark(Duration::from_secs(30))
///     .batch(500, Duration::from_millis(20))
///     .flow_control(20_000, 256 * 1024 * 1024)
///     .max_attempts(3)
///     .streams(4)
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct JobBuilder {
    /// The flow's settings, each defaulting as a pipeline file's Pub/Sub flow does.
    flow: PubSubFlow,
    name: String,
    dedup: Dedup,
    store: Option<String>,
    watermark_band: Option<Duration>,
}

impl JobBuilder {
    /// A job reading `subscription` (`projects/P/subscriptions/S`, or a short name with the
    /// project from [`PubSubConfig`]).
    pub fn new(subscription: impl Into<String>) -> Self {
        Self {
            flow: PubSubFlow::new(subscription),
            name: "job".to_owned(),
            dedup: Dedup::by_message_id(),
            store: None,
            watermark_band: None,
        }
    }

    /// The job's name (an identifier, default `job`): its ledger and dead letters are kept
    /// under it in the store, so two jobs sharing a store need two names.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Where Pub/Sub is (default: `PUBSUB_EMULATOR_HOST` if set, else the real service with
    /// Application Default Credentials; the project, when neither this config nor the
    /// environment names one, is the one those credentials name).
    pub fn pubsub(mut self, config: PubSubConfig) -> Self {
        self.flow.pubsub = config;
        self
    }

    /// How copies are recognised (default: by message id, 10 minutes).
    pub fn dedup(mut self, dedup: Dedup) -> Self {
        self.flow.dedup = DedupSettings {
            key: dedup.key.clone(),
            window: dedup.window,
        };
        self.dedup = dedup;
        self
    }

    /// The store: `sqlite://PATH` or `postgres://...` (default `sqlite://state/<name>.db`).
    pub fn store(mut self, url: impl Into<String>) -> Self {
        self.store = Some(url.into());
        self
    }

    /// Take event times from this attribute (ms since the epoch or RFC 3339; a bad one is
    /// dead-lettered); default: the publish time.
    pub fn event_time_attribute(mut self, name: impl Into<String>) -> Self {
        self.flow.event_time_attribute = Some(name.into());
        self
    }

    /// A message whose event-time attribute cannot be read takes its publish time instead of
    /// being dead-lettered (`on_bad_timestamp: publish_time`).
    pub fn bad_timestamp_uses_publish_time(mut self) -> Self {
        self.flow.bad_timestamp_uses_publish_time = true;
        self
    }

    /// Keep an event-time watermark, with this band (event times trail publish times by at
    /// most it), through the tracking subscription `<subscription>-tracking`, created if
    /// missing; [`NewMessages::watermark`] shows it.
    pub fn watermark(mut self, band: Duration) -> Self {
        self.watermark_band = Some(band);
        self
    }

    /// Batches of at most `max_messages`, waiting at most `max_delay` to fill (default 1000,
    /// 50 ms).
    pub fn batch(mut self, max_messages: usize, max_delay: Duration) -> Self {
        self.flow.batch = BatchSettings {
            max_messages: max_messages.max(1),
            max_delay,
        };
        self
    }

    /// Hold at most this many messages and bytes between receipt and ack (default 10 000,
    /// 100 MiB).
    pub fn flow_control(mut self, max_messages: usize, max_bytes: u64) -> Self {
        self.flow.max_outstanding = (max_messages.max(1), max_bytes.max(1));
        self
    }

    /// Dead-letter a message after this many failed attempts (default 5).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.flow.max_attempts = attempts.max(1);
        self
    }

    /// Streaming-pull streams (default 16).
    pub fn streams(mut self, streams: usize) -> Self {
        self.flow.streams = streams.max(1);
        self
    }

    /// The store URL this job uses.
    fn store_url(&self) -> String {
        self.store
            .clone()
            .unwrap_or_else(|| format!("sqlite://state/{}.db", self.name))
    }

    /// Opens the store and prepares the job's state there.
    ///
    /// # Errors
    /// The name is not an identifier, the store URL is unknown, or the store cannot be
    /// prepared.
    pub async fn build(mut self) -> Result<Job, JobError> {
        if !sluice_store::is_identifier(&self.name) {
            return Err(JobError::Invalid(format!(
                "job name {:?}: an identifier ([a-z_][a-z0-9_]*) is needed",
                self.name
            )));
        }
        // A short subscription name with no project anywhere takes ADC's.
        if !self.flow.subscription.starts_with("projects/") {
            self.flow.pubsub = self.flow.pubsub.clone().with_adc_project().await;
        }
        let url = self.store_url();
        let kind = url.parse::<StoreUrl>()?;
        let store = sluice_store::open(&url)?;
        let flow = store
            .prepare(&Layout {
                pipeline: self.name.clone(),
                tables: Vec::new(),
                flows: vec![self.name.clone()],
            })
            .await?
            .remove(0);
        Ok(Job {
            settings: self,
            store,
            postgres: matches!(kind, StoreUrl::Postgres(_)),
            flow,
            stop: CancellationToken::new(),
        })
    }
}

/// A job ready to run: its store is open and prepared. Run it with a handler
/// ([`Job::run_postgres`], [`Job::run_sqlite`]) or pull its batches ([`Job::stream`]).
///
/// ```no_run
/// # async fn job() -> Result<(), sluice_connector::JobError> {
/// use sluice_connector::prelude::*;
/// let job = Job::builder("projects/my-project/subscriptions/clicks")
///     .store("sqlite://state/clicks.db")
///     .build()
///     .await?;
/// job.drain_on_signals();
/// let report = job
///     .run_sqlite(|tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
///         for click in batch.iter() {
///             tx.execute(
///                 "INSERT INTO clicks (id, body) VALUES (?1, ?2)",
///                 (click.key(), click.data()),
///             )?;
///         }
///         Ok(())
///     })
///     .await?;
/// println!("{} clicks, {} copies the ledger caught", report.rows, report.duplicates);
/// # Ok(()) }
/// ```
pub struct Job {
    settings: JobBuilder,
    store: Arc<dyn Store>,
    postgres: bool,
    flow: FlowHandle,
    stop: CancellationToken,
}

/// What a job's run, or one batch's commit, did: rows written (the messages your handler
/// saw), copies the ledger found duplicate, dead letters, acks. Copies the memory tier caught
/// before a batch formed are acked at once and counted only in the metrics
/// (`sluice_messages_duplicate_total{layer="memory"}`), not here.
///
/// ```
/// # use sluice_connector::prelude::*;
/// fn log(report: &JobReport) {
///     println!(
///         "{} new, {} ledger duplicates, {} dead-lettered, {} acked",
///         report.rows, report.duplicates, report.dead_letters, report.acked
///     );
/// }
/// log(&JobReport::default());
/// ```
pub type JobReport = CommitReport;

impl Job {
    /// A job's settings, to build it with ([`JobBuilder`] shows every knob).
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let builder = Job::builder("projects/my-project/subscriptions/orders").name("orders");
    /// ```
    pub fn builder(subscription: impl Into<String>) -> JobBuilder {
        JobBuilder::new(subscription)
    }

    /// Cancel this to drain the job: it stops pulling, commits and acks what it received,
    /// then its run returns.
    ///
    /// ```no_run
    /// # async fn job() -> Result<(), sluice_connector::JobError> {
    /// use sluice_connector::prelude::*;
    /// let job = Job::builder("projects/p/subscriptions/s").build().await?;
    /// let stop = job.stop_token();
    /// tokio::spawn(async move {
    ///     tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
    ///     stop.cancel(); // an hour's work, then drain
    /// });
    /// # Ok(()) }
    /// ```
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Drains the job at the first SIGINT or SIGTERM (a deployment's stop), as `sluice run`'s
    /// first signal does (its give-up at a second signal and exit at a third are not here: the
    /// job's run returns once the drain is done). Unix only.
    ///
    /// ```no_run
    /// # async fn job() -> Result<(), sluice_connector::JobError> {
    /// use sluice_connector::prelude::*;
    /// let job = Job::builder("projects/p/subscriptions/s").build().await?;
    /// job.drain_on_signals();
    /// # Ok(()) }
    /// ```
    #[cfg(unix)]
    pub fn drain_on_signals(&self) {
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let terminate = async {
                use tokio::signal::unix::{SignalKind, signal};
                match signal(SignalKind::terminate()) {
                    Ok(mut terminate) => {
                        terminate.recv().await;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot watch for SIGTERM; only SIGINT drains");
                        std::future::pending::<()>().await;
                    }
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = terminate => {}
            }
            stop.cancel();
        });
    }

    /// Runs `handler` on every batch's new messages, in the PostgreSQL store's transaction,
    /// until [`Job::stop_token`] is cancelled.
    ///
    /// See [`PostgresHandler`] for a handler.
    ///
    /// # Errors
    /// The store is SQLite, or the subscription cannot be read.
    pub async fn run_postgres(self, handler: impl PostgresHandler) -> Result<JobReport, JobError> {
        if !self.postgres {
            return Err(JobError::Invalid(
                "run_postgres needs a postgres:// store; use run_sqlite".to_owned(),
            ));
        }
        self.run(AnyHandler::Postgres(Arc::new(handler))).await
    }

    /// Runs `handler` on every batch's new messages, in the SQLite store's transaction, until
    /// [`Job::stop_token`] is cancelled.
    ///
    /// See [`Job`] for a run with a closure.
    ///
    /// # Errors
    /// The store is PostgreSQL, or the subscription cannot be read.
    pub async fn run_sqlite(self, handler: impl SqliteHandler) -> Result<JobReport, JobError> {
        if self.postgres {
            return Err(JobError::Invalid(
                "run_sqlite needs a sqlite:// store; use run_postgres".to_owned(),
            ));
        }
        self.run(AnyHandler::Sqlite(Arc::new(handler))).await
    }

    /// Batches to pull and commit one by one ([`JobStream`] has an example).
    ///
    /// # Errors
    /// The subscription cannot be read.
    pub async fn stream(self) -> Result<JobStream, JobError> {
        JobStream::start(self).await
    }

    async fn run(self, handler: AnyHandler) -> Result<JobReport, JobError> {
        let parts = self.settings.flow.parts().map_err(FlowError::from)?;
        let counters = Counters::new(&self.settings.name, &self.settings.name);
        let give_up = give_up_after_drain(&self.stop);
        let tracker = self.start_tracker(&counters);
        let committer = self
            .committer(&parts, give_up.clone())
            .with_work(Arc::new(handler));
        let run = FlowRun {
            source: Box::new(parts.source),
            budget: parts.budget,
            dedup: parts.dedup,
            batch: parts.batch,
            committer,
            counters,
            until: RunUntil::Drained,
            drain_agreement: None,
        };
        let upkeep = self.keep_ledger();
        let ended = run.run(self.stop.clone()).await;
        upkeep.abort();
        give_up.cancel();
        if let Some((stop, task)) = tracker {
            stop.cancel();
            let _ = task.await;
        }
        Ok(ended?.report)
    }

    /// Keeps the dedup ledger small while the job runs (PostgreSQL drops expired generations
    /// and creates the next; SQLite purges expired keys), as a worker pool's upkeep holder does.
    /// Safe from several replicas at once.
    fn keep_ledger(&self) -> tokio::task::JoinHandle<()> {
        let store = self.store.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(defaults::LEDGER_UPKEEP);
            loop {
                ticks.tick().await;
                if let Err(error) = store.ledger_upkeep().await {
                    tracing::warn!(%error, "ledger upkeep failed; trying again later");
                }
            }
        })
    }

    fn committer(&self, parts: &FlowParts, give_up: CancellationToken) -> CommitThenAck {
        let dead_letter: Arc<str> = Arc::from(format!("{}__dead_letter", self.settings.name));
        CommitThenAck::new(
            self.store.clone(),
            self.flow.clone(),
            dead_letter,
            Arc::new(parts.stage.clone()),
            parts.retry,
            give_up,
        )
    }

    /// Starts the watermark tracker beside the run, when the job keeps a watermark.
    fn start_tracker(
        &self,
        counters: &Counters,
    ) -> Option<(CancellationToken, tokio::task::JoinHandle<()>)> {
        let band = self.settings.watermark_band?;
        let watermark = FlowWatermark::new();
        counters.attach_watermark(watermark.clone());
        let subscription = &self.settings.flow.subscription;
        let settings = TrackerSettings {
            tracking_subscription: format!("{subscription}-tracking"),
            create_from: Some(subscription.clone()),
            event_time_attribute: self.settings.flow.event_time_attribute.clone(),
            bad_timestamp_uses_publish_time: self.settings.flow.bad_timestamp_uses_publish_time,
            band_ms: i64::try_from(band.as_millis()).unwrap_or(i64::MAX),
            base_subscription: subscription.clone(),
            // Unique per process start, as a worker's id is: replicas in containers share pids.
            worker: format!(
                "{}-{}-{:08x}",
                self.settings.name,
                std::process::id(),
                rand::random::<u32>()
            ),
            probe_endpoint: None,
        };
        let tracker = WatermarkTracker::new(
            self.store.clone(),
            self.flow.clone(),
            self.settings.flow.pubsub.clone(),
            settings,
            watermark,
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn(tracker.run(stop.clone()));
        Some((stop, task))
    }
}

/// A token cancelled [`defaults::DRAIN_DEADLINE`] after `stop`: then batches still waiting for
/// an unreachable store are nacked instead of retried. Cancelling the returned token (when the
/// job is over) ends its timer too.
fn give_up_after_drain(stop: &CancellationToken) -> CancellationToken {
    let give_up = CancellationToken::new();
    let (stop, cancel) = (stop.clone(), give_up.clone());
    tokio::spawn(async move {
        tokio::select! {
            () = stop.cancelled() => {}
            // The job is over without a stop.
            () = cancel.cancelled() => return,
        }
        tokio::time::sleep(defaults::DRAIN_DEADLINE).await;
        cancel.cancel();
    });
    give_up
}
