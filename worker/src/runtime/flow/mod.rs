//! A run's flows: each built from the validated pipeline, started by the graph executor once
//! every flow it `depends_on` succeeded, and shown on the board; beside a flow run its watermark
//! tracker, window emission, `foreach_batch` stage client, dead-letter publisher and progress
//! bar. Whatever fails here, nothing is acked without its commit.

mod attempt;
pub(crate) mod board;
pub(crate) mod build;
pub(super) mod dead_letters;
pub(crate) mod decoder;
pub(crate) mod executor;
mod flow_task;
pub(crate) mod outcome;
mod progress;
pub(crate) mod run_context;
mod side_tasks;
pub(crate) mod sinks;
mod stage_client;
pub(super) mod tracking_subscriptions;
pub(crate) mod typed;
pub(super) mod watermarks;
mod windows;
