//! Where messages come from, and the seam between a source and the rest of a flow.
//!
//! A source pushes [`Received`] messages into a bounded channel, holding a [`Budget`] permit per
//! message; a [`SourceHandle`] stops it. Five sources implement [`MessageSource`]:
//! [`pubsub::PubSubSource`] (streaming pull, the real one), [`FileSource`](crate::FileSource)
//! (JSONL files, with `file_checkpoint.rs` for a pool's reader), [`TableSource`](crate::TableSource)
//! (another target's table, page by page, see `page.rs`), [`KeptOpen`](crate::KeptOpen) (a Pub/Sub
//! source kept running across a schedule's runs; each run reads it through a view of its own,
//! which is what implements the trait) and [`InProcessSource`](crate::InProcessSource) (generated
//! messages, for measuring sluice's own capacity and for faults the emulator cannot produce).
//! [`PublishedBefore`](crate::PublishedBefore) cuts a scheduled run's source at its data
//! interval's end. [`ReaderTurn`](crate::ReaderTurn) lets one replica of a pool read a bounded source at a time;
//! `bounded.rs` skips what a re-read finds committed.
//!
//! [`Budget`]: crate::Budget

pub(crate) mod bounded;
pub(crate) mod file;
pub(crate) mod file_checkpoint;
pub(crate) mod file_glob;
pub(crate) mod file_lines;
pub(crate) mod file_reader;
pub(crate) mod file_record;
mod file_turns;
pub(crate) mod inprocess;
pub(crate) mod kept_open;
pub(crate) mod page;
pub(crate) mod published_before;
pub mod pubsub;
pub(crate) mod table;
mod table_reader;
mod table_rows;
pub(crate) mod table_watermark;
pub(crate) mod turn;

use crate::flow::budget::{Budget, Permits};
use crate::flow::delivery::{AckHandle, SourceMessage};
use async_trait::async_trait;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Messages buffered between a source's tasks and the batcher. Small: the budget, not this
/// channel, bounds what is in flight.
pub(crate) const INTAKE_CAPACITY: usize = 1024;

/// One message and its ack handle, as a source hands it over.
pub struct Received {
    /// The message.
    pub message: SourceMessage,
    /// Its ack handle.
    pub handle: Box<dyn AckHandle>,
    pub(crate) permits: Permits,
    pub(crate) received_at: Instant,
    /// After the records of a table source's page, on its own (its message is empty and never
    /// batched): the page's position change.
    pub(crate) page: Option<crate::source::page::PageMark>,
    /// The Pub/Sub ordering key, if the message has one.
    pub(crate) ordering_key: Option<Arc<str>>,
    /// Deliveries of this message before this one, as Pub/Sub counts them (a subscription with
    /// a dead-letter policy says so in `delivery_attempt`): the attempts it starts with, so a
    /// restart does not reset them.
    pub(crate) earlier_attempts: u32,
}

impl Received {
    /// Bundles a message with its handle and budget permits.
    pub(crate) fn new(
        message: SourceMessage,
        handle: Box<dyn AckHandle>,
        permits: Permits,
    ) -> Self {
        Self {
            message,
            handle,
            permits,
            received_at: crate::time::monotonic_now(),
            page: None,
            ordering_key: None,
            earlier_attempts: 0,
        }
    }

    /// Carries the message's Pub/Sub ordering key.
    pub(crate) fn with_ordering_key(mut self, key: Option<Arc<str>>) -> Self {
        self.ordering_key = key;
        self
    }

    /// Starts its attempt count from Pub/Sub's `delivery_attempt` (1 for a first delivery).
    pub(crate) fn with_delivery_attempt(mut self, attempt: Option<i32>) -> Self {
        self.earlier_attempts = attempt
            .and_then(|n| u32::try_from(n.saturating_sub(1)).ok())
            .unwrap_or(0);
        self
    }

    /// Makes this the end of a page, carrying its mark instead of a record.
    pub(crate) fn ending_page(mut self, page: crate::source::page::PageMark) -> Self {
        self.page = Some(page);
        self
    }
}

/// Why a source could not start: a Pub/Sub client could not be set up or used, or a file
/// source cannot read its files.
///
/// ```
/// use sluice_engine::{PubSubConfig, SourceError};
/// // A short name needs a project from somewhere.
/// let config = PubSubConfig { project: None, endpoint: None };
/// # if std::env::var_os("PUBSUB_PROJECT_ID").is_none()
/// #     && std::env::var_os("GOOGLE_CLOUD_PROJECT").is_none() {
/// assert!(matches!(config.subscription_path("orders"), Err(SourceError::Name(_))));
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// A client could not be built (bad endpoint, no credentials). Not retried.
    #[error("cannot build a Pub/Sub client: {0}")]
    Client(String),
    /// An RPC failed (retried by callers that can).
    #[error("Pub/Sub request failed: {0}")]
    Rpc(String),
    /// A name is not usable (no project for a short subscription name).
    #[error("{0}")]
    Name(String),
    /// A file source cannot read its files (none matches, one is unreadable).
    #[error("{0}")]
    File(String),
    /// Pub/Sub refused the worker's identity (no credentials, or a missing permission, which
    /// the message names). Not retried at start: an operator has to grant it.
    #[error("{0}")]
    Refused(String),
    /// The subscription or topic does not exist (the message says how to create it). Not
    /// retried: an operator has to create it.
    #[error("{0}")]
    Missing(String),
    /// Pub/Sub stayed unreachable for longer than the source was to wait (a triggered run's
    /// `give_up_after`). Not retried.
    #[error("{0}")]
    GaveUp(String),
}

impl SourceError {
    /// Whether starting the source again later may succeed without an operator's change: not
    /// for a missing subscription, a refused identity, or a give-up.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            SourceError::Missing(_) | SourceError::Refused(_) | SourceError::GaveUp(_)
        )
    }
}

/// Something that can be started to deliver messages.
#[async_trait]
pub trait MessageSource: Send + 'static {
    /// Starts delivering into `intake` within `budget` until `stop` is cancelled. Returns once
    /// the source is running (streams opened lazily may still fail later; they retry with
    /// backoff and log). After `stop`, no new message is asked for; messages already handed over
    /// stay valid and must still be acked or nacked, and the intake channel closes once every
    /// task of the source has finished.
    async fn start(
        self: Box<Self>,
        intake: mpsc::Sender<Received>,
        budget: Budget,
        stop: CancellationToken,
    ) -> Result<Box<dyn SourceHandle>, SourceError>;

    /// Whether the source hands over pages (a table source): then each batch is exactly one
    /// page, closed at the page mark that follows its records, whatever the batch
    /// bounds, and a page cut short by a stop is given back whole. Its batches may commit
    /// several at a time, but each moves the source's position from where the one before left
    /// it, so their commits move it in order (see `page.rs`).
    fn paged(&self) -> bool {
        false
    }
}

/// A running source.
#[async_trait]
pub trait SourceHandle: Send {
    /// Waits until the source has shut down, after every handed-over message has been settled
    /// (pending acks flushed).
    async fn close(self: Box<Self>);

    /// Whether the messages of one ordering key must commit in the order they came (a Pub/Sub
    /// subscription with message ordering): the runner then keeps each key's batches in order
    /// (see `runner.rs`).
    fn ordered(&self) -> bool {
        false
    }

    /// What a run that ends when idle asks, after an idle period, before it counts the source
    /// as drained (`None`: nothing to ask, idle is idle). Taken once, by the run.
    fn idle_check(&mut self) -> Option<Box<dyn IdleCheck>> {
        None
    }
}

/// Whether a source with no message for a run's idle period is idle, or cut off from its
/// service (a Pub/Sub outage must not pass for an empty subscription).
#[async_trait]
pub trait IdleCheck: Send {
    /// `true`: idle (its service answered); `false`: cannot tell, its service does not answer
    /// (the run waits on); an error once that has lasted longer than the run was to wait.
    async fn confirm_idle(&mut self) -> Result<bool, SourceError>;

    /// Messages came since the last question: an outage, if there was one, is over.
    fn messages_came(&mut self);
}
