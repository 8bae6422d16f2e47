//! `sluice init`: writes a commented pipeline file to start from, for a chosen source (a
//! Pub/Sub subscription, JSONL files, or files then the subscription) and store (SQLite or
//! PostgreSQL). The file is valid as written (a test validates every combination); what to
//! change is marked `CHANGE`. An existing file is never overwritten.

use clap::ValueEnum;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

/// Where the pipeline's records come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InitSource {
    /// A Pub/Sub subscription, read as long as the pipeline runs.
    Pubsub,
    /// JSONL files, read once.
    Files,
    /// JSONL files once (the history), then the subscription (`depends_on`).
    Both,
}

/// Where the pipeline keeps its tables and its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InitStore {
    /// An SQLite file beside the pipeline file: one worker.
    Sqlite,
    /// A PostgreSQL database: a pool of workers.
    Postgres,
}

/// `sluice init`.
pub fn init(file: &Path, name: &str, source: InitSource, store: InitStore) -> ExitCode {
    if !sluice_pipeline::is_identifier(name) {
        eprintln!(
            "--name {name:?}: a pipeline's name is lower-case letters, digits and _, starting \
             with a letter or _ (it prefixes every table name)"
        );
        return ExitCode::from(2);
    }
    let text = scaffold(name, source, store);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)
        .and_then(|mut out| out.write_all(text.as_bytes()));
    if let Err(error) = written {
        eprintln!(
            "cannot write {}: {error} (init never overwrites a file)",
            file.display()
        );
        return ExitCode::from(1);
    }
    let shown = file.display();
    println!("wrote {shown}; next:");
    println!("  1. change what is marked CHANGE (the subscription, the columns, the store)");
    println!("  2. sluice validate -c {shown}   # the file");
    println!("  3. sluice check -c {shown}      # the store, Pub/Sub and files it names");
    println!("  4. sluice run -c {shown}");
    ExitCode::SUCCESS
}

/// The pipeline file's text.
fn scaffold(name: &str, source: InitSource, store: InitStore) -> String {
    let mode = match source {
        InitSource::Files => {
            "# triggered: run, land what is there, exit 0 (a schedule: see docs/SPEC.md §7).
mode: triggered"
        }
        _ => {
            "# continuous: run until SIGTERM, then drain (commit and ack what is in flight).
mode: continuous"
        }
    };
    let store = match store {
        InitStore::Sqlite => format!(
            "# One worker, its tables and state in one file beside this one (created at the first
# run). SLUICE_STORE in the environment replaces it.
store: sqlite://state/{name}.db"
        ),
        InitStore::Postgres => {
            "# A pool of workers shares one database. CHANGE: the server, user and database; keep
# the password out of this file: set SLUICE_STORE=postgres://USER:PASSWORD@HOST/DB instead.
store: postgres://sluice@127.0.0.1:5432/sluice"
                .to_owned()
        }
    };
    let files = "  # History in JSONL files, read once: one record a line,
  # {\"id\": \"o-1\", \"data\": {\"order_id\": \"o-1\", ...}, \"event_time\": 1767225600000}
  - name: orders_history
    target: orders
    once: true
    source: { file: { path: \"data/*.jsonl\" } }   # CHANGE: beside this file, or absolute
    decode: { format: json }
";
    let live = |depends_on: bool| {
        format!(
            "  - name: orders_live
    target: orders{}
    source:
      pubsub:
        subscription: orders-sub       # CHANGE: a short name, or projects/P/subscriptions/S
        # Publishers set order_id: a repeat of it within 10 minutes is not landed again, and
        # a message without it is a dead letter (on_missing: message_id keys it by its id).
        dedup: {{ by: attribute, attribute: order_id, window: 10m, on_missing: dead_letter }}
        event_time: {{ attribute: ts }} # ms since the epoch or RFC 3339; absent: publish time
    decode: {{ format: json }}
",
            if depends_on {
                "\n    depends_on: orders_history      # starts once the history is landed"
            } else {
                ""
            }
        )
    };
    let flows = match source {
        InitSource::Pubsub => live(false),
        InitSource::Files => files.to_owned(),
        InitSource::Both => format!("{files}{}", live(true)),
    };
    let pubsub = if source == InitSource::Files {
        ""
    } else {
        "# Pub/Sub: the project (else PUBSUB_PROJECT_ID, GOOGLE_CLOUD_PROJECT or what Application
# Default Credentials name); an emulator's endpoint (else PUBSUB_EMULATOR_HOST).
# pubsub: { project: my-project, endpoint: http://127.0.0.1:8085 }
"
    };
    format!(
        "# A sluice pipeline, written by `sluice init`. Every key is in docs/pipeline-file.md; relative
# paths are beside this file.
pipeline: {name}
{mode}
{store}
{pubsub}metrics: {{ listen: 127.0.0.1:9464 }}   # /metrics for Prometheus, /healthz, /readyz

targets:
  # A typed table, {name}__orders: sluice adds its own _sluice_* columns (message id, times,
  # dedup key). CHANGE: your payload's fields.
  - name: orders
    kind: table
    columns:
      - {{ name: order_id, type: text, nullable: false }}
      - {{ name: amount, type: numeric }}
      - {{ name: region, type: text }}

flows:
{flows}    # A record that breaks an expectation: warn (count it), drop (a dead letter) or fail.
    expect:
      - {{ name: positive_amount, check: \"amount > 0\", on_violation: drop }}
"
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Every combination parses as a valid pipeline.
    #[test]
    fn every_scaffold_is_valid() {
        for source in InitSource::value_variants() {
            for store in InitStore::value_variants() {
                let text = scaffold("shop", *source, *store);
                let parsed = sluice_pipeline::parse_for_run(&text, Path::new("p.yaml"));
                assert!(parsed.is_ok(), "{source:?} {store:?}: {parsed:?}\n{text}");
            }
        }
    }
}
