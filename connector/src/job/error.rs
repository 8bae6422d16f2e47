//! Why a job could not start or run: [`JobError`].

use sluice_engine::FlowError;
use sluice_store::StoreError;

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
