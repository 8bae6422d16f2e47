//! Why a benchmark could not finish.

use crate::emulator::EmulatorError;
use sluice_engine::pubsub::SourceError;

/// Why a benchmark could not finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The emulator did not start.
    #[error(transparent)]
    Emulator(#[from] EmulatorError),
    /// Pub/Sub failed.
    #[error(transparent)]
    PubSub(#[from] SourceError),
    /// The store failed.
    #[error("store: {0}")]
    Store(String),
    /// A drain stopped making progress.
    #[error("{0}")]
    Stalled(String),
    /// A benchmark's inputs could not be made.
    #[error("setup: {0}")]
    Setup(String),
}
