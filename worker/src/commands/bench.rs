//! `sluice bench throughput|watermark|chain|job|latency|typed`: the benchmarks of BENCHMARKS.md, run from the worker
//! binary (the harness is the `sluice-bench` crate).

use clap::Subcommand;
use std::process::ExitCode;

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Raw client vs sluice end to end on one emulator, and sluice's own capacity.
    Throughput(sluice_bench::ThroughputArgs),
    /// sluice's watermark estimator and a Beam-style baseline on the same simulated streams.
    Watermark(sluice_bench::WatermarkArgs),
    /// A flow following a table against the ingest it follows: rate and downstream lag.
    Chain(sluice_bench::ChainArgs),
    /// A library job upserting into its own table against `sluice run`'s plain table.
    Job(sluice_bench::JobArgs),
    /// Publish-to-commit latency at steady rates, unordered and ordered, against the raw
    /// client's publish-to-receive latency; draws a plot.
    Latency(sluice_bench::LatencyArgs),
    /// What decoding into typed columns and a query cost: a typed JSON flow against the same
    /// messages landed as bytes.
    Typed(sluice_bench::TypedArgs),
}

/// Runs one benchmark; exit 1 when it could not run.
pub async fn bench(which: BenchCommand) -> ExitCode {
    match which {
        BenchCommand::Watermark(args) => {
            sluice_bench::watermark(&args);
            ExitCode::SUCCESS
        }
        BenchCommand::Chain(args) => match sluice_bench::chain(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("sluice bench: {error}");
                ExitCode::from(1)
            }
        },
        BenchCommand::Job(args) => match sluice_bench::job(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("sluice bench: {error}");
                ExitCode::from(1)
            }
        },
        BenchCommand::Latency(args) => match sluice_bench::latency(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("sluice bench: {error}");
                ExitCode::from(1)
            }
        },
        BenchCommand::Typed(args) => match sluice_bench::typed(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("sluice bench: {error}");
                ExitCode::from(1)
            }
        },
        BenchCommand::Throughput(args) => match sluice_bench::throughput(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("sluice bench: {error}");
                ExitCode::from(1)
            }
        },
    }
}
