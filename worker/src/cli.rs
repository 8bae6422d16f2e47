//! The command line of SPEC §3 (the commands built so far): what each command takes; each
//! command itself is a file of `commands/`.

use crate::commands::bench::BenchCommand;
use crate::commands::graph::GraphFormat;
use crate::commands::runs::RunsFormat;
use crate::commands::status::StatusFormat;
use crate::commands::validate::ValidateFormat;
use crate::commands::{self, refresh::Seek};
use crate::logging::LogFormat;
use clap::{Parser, Subcommand};
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

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pipeline: continuous until SIGTERM/SIGINT (then drain), triggered until drained
    /// (once, or at each fire of its schedule until SIGTERM/SIGINT).
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
    /// Run the intervals of a scheduled pipeline that cover [FROM, TO) and have not completed,
    /// oldest first, each recorded `backfill` (beside a running pool, never overlapping its
    /// runs); exit 1 at the first that fails. With --rerun, every ended interval of the range,
    /// each replacing the rows it wrote before.
    Backfill {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// The range's start: 2026-01-01, 2026-01-01T06:00:00 (the schedule's time zone) or
        /// RFC 3339.
        #[arg(long)]
        from: String,
        /// The range's end (exclusive), in the same forms.
        #[arg(long)]
        to: String,
        /// Run the completed intervals too: each run first deletes the rows its flows wrote with
        /// an event time in its interval (and their ledger keys), then reads the interval again,
        /// recorded `rerun`.
        #[arg(long)]
        rerun: bool,
    },
    /// Check a pipeline file; exit 0 when valid, 2 when not.
    Validate {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = ValidateFormat::Text)]
        format: ValidateFormat,
    },
    /// Writes a commented pipeline file to start from (never over an existing file).
    Init {
        /// The file to write.
        #[arg(short = 'o', long = "output", default_value = "pipeline.yaml")]
        output: PathBuf,
        /// The pipeline's name (it prefixes every table).
        #[arg(long, default_value = "shop")]
        name: String,
        /// Where records come from.
        #[arg(long, value_enum, default_value_t = commands::init::InitSource::Pubsub)]
        source: commands::init::InitSource,
        /// Where tables and state are kept.
        #[arg(long, value_enum, default_value_t = commands::init::InitStore::Sqlite)]
        store: commands::init::InitStore,
    },
    /// Prints the pipeline file's JSON Schema, for editors (docs/pipeline.schema.json).
    Schema,
    /// Connects to what the file names (the store, every subscription and topic, the file
    /// sources' files) and reports each problem: exit 0 when all is well, 1 otherwise.
    Check {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
    },
    /// What the store says: flows with their counts and completion, workers alive, leases.
    Status {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
        format: StatusFormat,
    },
    /// The history of a triggered pipeline's runs: fire, interval, trigger, state, rows.
    Runs {
        /// The pipeline file.
        #[arg(short = 'c', long = "config")]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = RunsFormat::Text)]
        format: RunsFormat,
        /// The newest this many runs.
        #[arg(long, default_value_t = 50)]
        limit: usize,
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
    /// Print the completion script of a shell (e.g. `sluice completions bash >
    /// /etc/bash_completion.d/sluice`, or `source <(sluice completions zsh)`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
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
                commands::run::Refresh::All
            } else {
                commands::run::Refresh::Flows(refresh)
            };
            commands::run::run_file(&config, refresh).await
        }
        Command::Graph { config, format } => commands::graph::graph(&config, format).await,
        Command::Backfill {
            config,
            from,
            to,
            rerun,
        } => commands::backfill::backfill_file(&config, &from, &to, rerun).await,
        Command::FullRefresh {
            config,
            seek,
            drop_unread,
        } => {
            let seek = seek.map(|time| Seek { time, drop_unread });
            commands::refresh::full_refresh_file(&config, seek.as_ref()).await
        }
        Command::Reset {
            flow,
            config,
            seek,
            drop_unread,
        } => {
            let seek = seek.map(|time| Seek { time, drop_unread });
            commands::refresh::reset_file(&config, &flow, seek.as_ref()).await
        }
        Command::Validate { config, format } => commands::validate::validate(&config, format),
        Command::Init {
            output,
            name,
            source,
            store,
        } => commands::init::init(&output, &name, source, store),
        Command::Schema => {
            print!("{}", sluice_pipeline::json_schema());
            ExitCode::SUCCESS
        }
        Command::Check { config } => commands::check::check(&config).await,
        Command::Status { config, format } => commands::status::status(&config, format).await,
        Command::Runs {
            config,
            format,
            limit,
        } => commands::runs::runs(&config, format, limit).await,
        Command::Demo { events, dir } => commands::demo::demo(events, &dir).await,
        Command::Bench { which } => commands::bench::bench(which).await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "sluice", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
    }
}
