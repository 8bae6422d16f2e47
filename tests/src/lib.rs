//! The harness of sluice's end-to-end tests: one real Pub/Sub emulator for the whole run
//! (started by `scripts/test` and named by `SLUICE_TEST_PUBSUB`, or else one per test process;
//! fresh topic and subscription names per test), pipeline files ([`PipelineYaml`] and
//! [`FlowYaml`] build them; [`Workdir::pipeline`] writes the common one-flow case), `sluice`
//! worker processes ([`Worker`]), one-shot `sluice` commands ([`sluice_command`]), and direct
//! reads of the SQLite and PostgreSQL stores ([`Db`], [`PgDb`]).
//!
//! The emulator runs with its stream fix ([`Emulator::start_fixed`]; without it a closed or
//! killed stream held its subscription's messages back for minutes): messages a killed worker
//! held come back after their stream ack deadline, 10 s. Tests that kill or stop a worker keep
//! a second replica's streams open from before the close, as a pool would have, and say so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use google_cloud_pubsub::model::Message;
use sluice_bench::Emulator;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod command;
pub mod metrics;
pub mod pipeline_yaml;
pub mod private_postgres;
pub mod proxy;
pub mod pubsub;
pub mod schema_topics;
pub mod stage_server;
pub mod stores;
pub mod unacked;
pub mod watermarks;
pub mod worker;
pub use command::{COMMAND_TIMEOUT, CommandOutput, sluice_command, sluice_command_within};
pub use metrics::{flow_metric, http_status, labelled_metric, metrics_text};
pub use pipeline_yaml::{FlowYaml, PipelineYaml};
pub use private_postgres::PrivatePostgres;
pub use proxy::FaultProxy;
pub use pubsub::{PubSub, event, events_with_duplicates};
pub use schema_topics::SchemaTopic;
pub use stores::{Db, PgDb};
pub use unacked::{
    UNACKED_READ_WINDOW, unacked_beside_control, unacked_event_ids, unacked_messages,
};
pub use worker::Worker;

/// Project of every test resource.
pub const PROJECT: &str = "sluice-test";

/// Names the endpoint of an emulator shared by every test process of a run
/// (`http://127.0.0.1:PORT`); `scripts/test` starts one and sets it.
pub const SHARED_EMULATOR_VARIABLE: &str = "SLUICE_TEST_PUBSUB";

/// The emulator the tests of this process talk to.
#[derive(Debug)]
pub struct TestEmulator {
    endpoint: String,
    /// Held so that an emulator this process started lives as long as the process.
    _own: Option<Emulator>,
}

impl TestEmulator {
    /// `http://127.0.0.1:PORT`, the value for `pubsub.endpoint`.
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }
}

static EMULATOR: OnceLock<TestEmulator> = OnceLock::new();

/// The run's shared emulator when `SLUICE_TEST_PUBSUB` names one; otherwise this process's own,
/// started on first use and killed by its watchdog when the process exits.
pub fn emulator() -> &'static TestEmulator {
    EMULATOR.get_or_init(|| match std::env::var(SHARED_EMULATOR_VARIABLE) {
        Ok(endpoint) if !endpoint.is_empty() => TestEmulator {
            endpoint,
            _own: None,
        },
        _ => {
            let own = Emulator::start_fixed().expect("start the Pub/Sub emulator");
            TestEmulator {
                endpoint: own.endpoint(),
                _own: Some(own),
            }
        }
    })
}

/// A unique resource name.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// The path of the `sluice` binary built by the same `cargo test` run.
pub fn sluice_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> -> target/<profile>/sluice
    let bin = exe.parent().unwrap().parent().unwrap().join("sluice");
    assert!(
        bin.exists(),
        "{} not built: `cargo build -p sluice` first (./scripts/test does)",
        bin.display()
    );
    bin
}

/// Options for a test pipeline file.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// `mode:`.
    pub mode: &'static str,
    /// The subscription.
    pub subscription: String,
    /// `dedup:` inline map.
    pub dedup: &'static str,
    /// `batch:` inline map.
    pub batch: &'static str,
    /// `drain_idle:`.
    pub drain_idle: &'static str,
    /// `streams:`.
    pub streams: usize,
    /// `store:` URL; `None` for the workdir's SQLite file named by [`Workdir::pipeline`]'s `db`.
    pub store: Option<String>,
    /// `metrics.listen` address, if any.
    pub metrics_listen: Option<String>,
    /// `control:` inline map, if any (`{ listen: ..., token_file: ... }`).
    pub control: Option<String>,
    /// `watermark:` inline map, if any (`{ tracking_subscription: auto, band: 10s }`).
    pub watermark: Option<&'static str>,
}

impl PipelineOptions {
    /// Continuous, dedup by `event_id`, 4 streams.
    pub fn continuous(subscription: &str) -> Self {
        Self {
            mode: "continuous",
            subscription: subscription.to_owned(),
            dedup: "{ by: attribute, attribute: event_id }",
            batch: "{ max_messages: 500, max_delay: 20ms }",
            drain_idle: "3s",
            streams: 4,
            store: None,
            metrics_listen: None,
            control: None,
            watermark: None,
        }
    }

    /// Triggered, drains until idle for 3 s.
    pub fn triggered(subscription: &str) -> Self {
        Self {
            mode: "triggered",
            ..Self::continuous(subscription)
        }
    }
}

/// A temporary folder holding pipeline files and the SQLite store they share.
pub struct Workdir {
    dir: tempfile::TempDir,
}

impl Default for Workdir {
    fn default() -> Self {
        Self::new()
    }
}

impl Workdir {
    /// A new folder.
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `history/events.jsonl` here, one file record `e{t}` per event time `t` (ms), and
    /// returns the glob a file flow reads it with.
    pub fn events_file(&self, events: &[i64]) -> String {
        let history = self.path().join("history");
        std::fs::create_dir_all(&history).unwrap();
        let lines: String = events
            .iter()
            .map(|t| format!("{{\"id\":\"e{t}\",\"event_time\":{t}}}\n"))
            .collect();
        std::fs::write(history.join("events.jsonl"), lines).unwrap();
        history.join("*.jsonl").display().to_string()
    }

    /// The SQLite file of pipelines written by [`Workdir::pipeline`] with this `db` name.
    pub fn db(&self, db: &str) -> PathBuf {
        self.path().join(format!("{db}.db"))
    }

    /// Writes a pipeline `test` with one table `events` and one flow `ingest` from
    /// `options.subscription` (a [`PipelineYaml`]).
    pub fn pipeline(&self, file: &str, db: &str, options: &PipelineOptions) -> PathBuf {
        let store = options
            .store
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", self.db(db).display()));
        let mut pipeline = PipelineYaml::new("test")
            .mode(options.mode)
            .store(&store)
            .pubsub_emulator();
        if let Some(listen) = &options.metrics_listen {
            pipeline = pipeline.metrics(listen);
        }
        if let Some(control) = &options.control {
            pipeline = pipeline.control(control);
        }
        let mut flow = FlowYaml::pubsub("ingest", "events", &options.subscription)
            .setting("dedup", options.dedup)
            .setting("batch", options.batch)
            .drain_idle(options.drain_idle)
            .streams(options.streams);
        if let Some(watermark) = options.watermark {
            flow = flow.setting("watermark", watermark);
        }
        pipeline
            .target_table("events")
            .flow(flow)
            .write(self.path(), file)
    }
}

/// A continuous test pipeline on a fresh PostgreSQL database and a fresh topic with one
/// subscription: what the pool tests share.
pub struct PostgresPipeline {
    /// The database (dropped with this value).
    pub database: sluice_store::ScratchDatabase,
    /// Reads of it.
    pub db: PgDb,
    /// Emulator access.
    pub pubsub: PubSub,
    /// The topic.
    pub topic: String,
    /// Its subscription, which the pipeline reads.
    pub subscription: String,
    /// The folder of the pipeline file and the workers' logs.
    pub dir: Workdir,
    /// The pipeline file.
    pub file: PathBuf,
}

impl PostgresPipeline {
    /// Creates it all; `store_parameters` is appended to the store URL (`?ledger_generation=2s`).
    pub async fn create(prefix: &str, store_parameters: &str) -> Self {
        let database = sluice_store::ScratchDatabase::create().await.unwrap();
        Self::on(database, prefix, store_parameters).await
    }

    /// The same on a database of the caller's (a private server's, say).
    pub async fn on(
        database: sluice_store::ScratchDatabase,
        prefix: &str,
        store_parameters: &str,
    ) -> Self {
        let db = PgDb(database.url().to_owned());
        let pubsub = PubSub::connect().await;
        let (topic, mut subs) = pubsub.topic_with(prefix, 1).await;
        let subscription = subs.remove(0);
        let dir = Workdir::new();
        let file = dir.pipeline(
            "p.yaml",
            "unused",
            &PipelineOptions {
                store: Some(format!("{}{store_parameters}", database.url())),
                ..PipelineOptions::continuous(&subscription)
            },
        );
        Self {
            database,
            db,
            pubsub,
            topic,
            subscription,
            dir,
            file,
        }
    }
}

/// Publishes `messages` to `topic` in the background, `chunk` at a time with `pause` after
/// each: traffic that goes on while a test kills workers.
pub async fn publish_in_chunks(
    topic: &str,
    messages: Vec<Message>,
    chunk: usize,
    pause: Duration,
) -> tokio::task::JoinHandle<()> {
    let pubsub = PubSub::connect().await;
    let topic = topic.to_owned();
    let chunks: Vec<Vec<Message>> = messages.chunks(chunk).map(<[Message]>::to_vec).collect();
    tokio::spawn(async move {
        for chunk in chunks {
            pubsub.publish(&topic, chunk).await;
            tokio::time::sleep(pause).await;
        }
    })
}

/// Sends SIGTERM to every worker, asserts that each drains and exits 0 within a minute, and
/// returns their logs.
pub fn stop_all(workers: Vec<Worker>) -> Vec<String> {
    for worker in &workers {
        worker.terminate();
    }
    workers
        .into_iter()
        .map(|worker| {
            let logs = worker.logs();
            assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
            logs
        })
        .collect()
}

/// The wall clock in ms since the epoch, as the store and the worker take it.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Polls `condition` every 200 ms until it holds or `within` passed; returns whether it held.
pub async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
