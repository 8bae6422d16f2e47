//! A job ready to run ([`Job`]): building it (the store opened and prepared), running it with a
//! handler until its stop token drains it, the ledger's upkeep and the watermark tracker beside
//! it. The guarantees are the module's (`job/mod.rs`).

use super::builder::JobBuilder;
use super::error::JobError;
use super::handler::{AnyHandler, PostgresHandler, SqliteHandler};
use sluice_engine::defaults;
use sluice_engine::{
    CommitReport, CommitThenAck, Counters, FlowError, FlowParts, FlowRun, FlowWatermark, RunUntil,
    TrackerSettings, WatermarkTracker,
};
use sluice_store::{FlowHandle, Layout, Store, StoreUrl};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

impl JobBuilder {
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
                typed: Vec::new(),
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
    pub(super) settings: JobBuilder,
    pub(super) store: Arc<dyn Store>,
    pub(super) postgres: bool,
    pub(super) flow: FlowHandle,
    pub(super) stop: CancellationToken,
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

    async fn run(self, handler: AnyHandler) -> Result<JobReport, JobError> {
        let parts = self.settings.flow.parts().map_err(FlowError::from)?;
        let counters = Counters::new(&self.settings.name, &self.settings.name);
        let give_up = give_up_after_drain(&self.stop);
        let tracker = self.start_tracker(&counters);
        let committer = self
            .committer(&parts, give_up.clone())
            .with_work(Arc::new(handler));
        let run = FlowRun {
            source: Box::new(
                parts
                    .source
                    .labelled(&self.settings.name, &self.settings.name),
            ),
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

    pub(super) fn committer(&self, parts: &FlowParts, give_up: CancellationToken) -> CommitThenAck {
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
    pub(super) fn start_tracker(
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
pub(super) fn give_up_after_drain(stop: &CancellationToken) -> CancellationToken {
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
