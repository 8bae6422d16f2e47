//! The command line of SPEC §3 (the commands built so far).

use crate::logging::LogFormat;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exactly-once ingestion from Google Cloud Pub/Sub.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// More detailed logs.
    #[arg(short, long, global = true)]
    pub verbose: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output format of `validate` and `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// One line per error.
    Text,
    /// A JSON document.
    Json,
}

/// Output format of `graph`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// One line per flow, in start order.
    Text,
    /// Graphviz.
    Dot,
    /// A Mermaid flowchart.
    Mermaid,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pipeline: continuous until SIGTERM/SIGINT (then drain), triggered until drained.
    Run {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// First clear every flow (completion, ledger, rows), as `sluice full-refresh` does.
        #[arg(long)]
        full_refresh: bool,
        /// First clear these flows only (comma-separated), as `sluice reset` does.
        #[arg(long, value_delimiter = ',', conflicts_with = "full_refresh")]
        refresh: Vec<String>,
    },
    /// Check a pipeline file; exit 0 when valid, 2 when not.
    Validate {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// What the store says: flows with their counts and completion, workers alive, leases.
    Status {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
        format: OutputFormat,
    },
    /// Draw the flow graph: data edges and depends_on edges, with states from the store.
    Graph {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = GraphFormat::Text)]
        format: GraphFormat,
    },
    /// Clear completion, ledger, rows and dead letters of every flow: the next run starts the
    /// chain from the beginning, in order.
    FullRefresh {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// Also seek every Pub/Sub flow's subscription to this time (RFC 3339 or ms since
        /// epoch), so live flows replay from there.
        #[arg(long)]
        seek: Option<String>,
        /// Accept that the seek drops messages published before its time that no worker
        /// ingested yet (a seek marks them acknowledged); required with --seek.
        #[arg(long, requires = "seek")]
        drop_unread: bool,
    },
    /// Clear one flow (ledger, counters, completion, rows); upstream once flows stay drained.
    Reset {
        /// The flow.
        flow: String,
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// Seek the flow's subscription to this time (RFC 3339 or ms since epoch).
        #[arg(long)]
        seek: Option<String>,
        /// Accept that the seek drops messages published before its time that no worker
        /// ingested yet (a seek marks them acknowledged); required with --seek.
        #[arg(long, requires = "seek")]
        drop_unread: bool,
    },
    /// The quickstart: emulator, sample stream with duplicates, exactly-once ingestion.
    Demo {
        /// Messages to publish (distinct events; 10% more are re-published duplicates).
        #[arg(long, default_value_t = 20_000)]
        events: usize,
        /// Where the demo keeps its pipeline file and SQLite store.
        #[arg(long, default_value = "state/demo")]
        dir: PathBuf,
    },
    /// Benchmarks (see BENCHMARKS.md).
    Bench {
        /// Which benchmark.
        #[command(subcommand)]
        which: BenchCommand,
    },
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Raw client vs sluice end to end on one emulator, and sluice's own capacity.
    Throughput(sluice_bench::ThroughputArgs),
    /// sluice's watermark estimator and a Beam-style baseline on the same simulated streams.
    Watermark(sluice_bench::WatermarkArgs),
}

/// Runs a command; maps its outcome to the exit code.
pub async fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Run {
            config,
            full_refresh,
            refresh,
        } => {
            let refresh = if full_refresh {
                crate::run::Refresh::All
            } else {
                crate::run::Refresh::Flows(refresh)
            };
            crate::run::run_file(&config, refresh).await
        }
        Command::Graph { config, format } => crate::graph::graph(&config, format).await,
        Command::FullRefresh {
            config,
            seek,
            drop_unread,
        } => {
            let seek = seek.map(|time| crate::refresh::Seek { time, drop_unread });
            crate::refresh::full_refresh_file(&config, seek.as_ref()).await
        }
        Command::Reset {
            flow,
            config,
            seek,
            drop_unread,
        } => {
            let seek = seek.map(|time| crate::refresh::Seek { time, drop_unread });
            crate::refresh::reset_file(&config, &flow, seek.as_ref()).await
        }
        Command::Validate { config, format } => validate(&config, format),
        Command::Status { config, format } => crate::status::status(&config, format).await,
        Command::Demo { events, dir } => crate::demo::demo(events, &dir).await,
        Command::Bench {
            which: BenchCommand::Watermark(args),
        } => {
            sluice_bench::watermark(&args);
            ExitCode::SUCCESS
        }
        Command::Bench {
            which: BenchCommand::Throughput(args),
        } => match sluice_bench::throughput(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("sluice bench: {error}");
                ExitCode::from(1)
            }
        },
    }
}

fn validate(config: &std::path::Path, format: OutputFormat) -> ExitCode {
    let result = sluice_pipeline::load(config);
    match (format, result) {
        (OutputFormat::Text, Ok(pipeline)) => {
            println!(
                "{}: valid ({} targets, {} flows)",
                config.display(),
                pipeline.targets.len(),
                pipeline.flows.len()
            );
            ExitCode::SUCCESS
        }
        (OutputFormat::Text, Err(errors)) => {
            eprintln!("{errors}");
            ExitCode::from(2)
        }
        (OutputFormat::Json, result) => {
            let errors: Vec<_> = result
                .as_ref()
                .err()
                .map(|errors| {
                    errors
                        .iter()
                        .map(|e| {
                            serde_json::json!({
                                "code": e.code.as_str(), "file": e.file, "path": e.path,
                                "line": e.line, "column": e.column, "message": e.message,
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            let valid = errors.is_empty();
            println!(
                "{}",
                serde_json::json!({ "valid": valid, "errors": errors })
            );
            if valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }
    }
}
