//! The benchmark harness behind `sluice bench`, and the Pub/Sub emulator launcher that the demo,
//! the benchmarks and the integration tests share.
//!
//! Benchmarks report ratios against a baseline measured in the same run, on the same emulator,
//! because these machines are noisy; absolute figures are printed for context only.

mod chain;
mod cpu;
mod drain;
pub mod emulator;
mod emulator_feed;
mod emulator_fix;
mod error;
mod job;
mod latency;
mod latency_plot;
mod latency_points;
mod latency_samples;
mod stores;
mod throughput;
mod typed;
mod watermark;

pub use chain::{ChainArgs, chain};
pub use emulator::{Emulator, EmulatorError, free_port};
pub use error::BenchError;
pub use job::{JobArgs, job};
pub use latency::{LatencyArgs, latency};
pub use stores::StoreChoice;
pub use throughput::{ThroughputArgs, throughput};
pub use typed::{TypedArgs, typed};
pub use watermark::{WatermarkArgs, watermark};
