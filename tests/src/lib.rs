//! The harness of sluice's end-to-end tests: one real Pub/Sub emulator for the whole run
//! (started by `scripts/test` and named by `SLUICE_TEST_PUBSUB`, or else one per test process;
//! fresh topic and subscription names per test), pipeline files ([`PipelineYaml`] and
//! [`FlowYaml`] build them; [`Workdir::pipeline`] writes the common one-flow case), `sluice`
//! worker processes ([`Worker`]), one-shot `sluice` commands ([`sluice_command`]), and direct
//! reads of the SQLite and PostgreSQL stores ([`Db`], [`PgDb`]).
//!
//! The emulator stalls new streams on a subscription for two to three minutes after any stream
//! on it closed (measured; see ARCHITECTURE.md). Tests that kill or stop a worker and need the
//! rest of the stream delivered keep a second replica's streams open from before the close,
//! and say so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use google_cloud_pubsub::client::Subscriber;
use google_cloud_pubsub::model::Message;
use sluice_bench::Emulator;
use sluice_engine::PubSubConfig;
use sluice_engine::pubsub::{Admin, publish_all};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod command;
pub mod pipeline_yaml;
pub mod private_postgres;
pub mod proxy;
pub mod stage_server;
pub mod unacked;
pub mod watermarks;
pub use command::{COMMAND_TIMEOUT, CommandOutput, sluice_command, sluice_command_within};
pub use pipeline_yaml::{FlowYaml, PipelineYaml};
pub use private_postgres::PrivatePostgres;
pub use proxy::FaultProxy;
pub use unacked::{
    UNACKED_READ_WINDOW, unacked_beside_control, unacked_event_ids, unacked_messages,
};

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
            let own = Emulator::start().expect("start the Pub/Sub emulator");
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

/// Pub/Sub access for a test.
pub struct PubSub {
    /// Endpoint and project.
    pub config: PubSubConfig,
    /// Admin clients.
    pub admin: Admin,
}

impl PubSub {
    /// Connects to the run's emulator.
    pub async fn connect() -> Self {
        let config = PubSubConfig {
            project: Some(PROJECT.to_owned()),
            endpoint: Some(emulator().endpoint()),
        };
        let admin = Admin::connect(&config).await.unwrap();
        Self { config, admin }
    }

    /// A fresh topic and `subscriptions` subscriptions on it (ack deadline 10 s).
    pub async fn topic_with(&self, prefix: &str, subscriptions: usize) -> (String, Vec<String>) {
        let topic = unique(prefix);
        self.admin.create_topic(&topic).await.unwrap();
        let mut subs = Vec::new();
        for i in 0..subscriptions {
            let name = format!("{topic}-sub{i}");
            self.admin
                .create_subscription(&name, &topic, 10)
                .await
                .unwrap();
            subs.push(name);
        }
        (topic, subs)
    }

    /// A fresh topic and one subscription `<topic>-sub` on it with `settings` (ordering,
    /// exactly-once delivery, a dead-letter policy: the ack deadline is 10 s unless set).
    pub async fn topic_with_subscription(
        &self,
        prefix: &str,
        settings: sluice_engine::pubsub::SubscriptionSettings,
    ) -> (String, String) {
        let topic = unique(prefix);
        self.admin.create_topic(&topic).await.unwrap();
        let subscription = format!("{topic}-sub");
        let settings = sluice_engine::pubsub::SubscriptionSettings {
            ack_deadline_seconds: if settings.ack_deadline_seconds == 0 {
                10
            } else {
                settings.ack_deadline_seconds
            },
            ..settings
        };
        self.admin
            .create_subscription_with(&subscription, &topic, &settings)
            .await
            .unwrap();
        (topic, subscription)
    }

    /// Waits until `subscription` exists (a worker creates `<subscription>-tracking` for
    /// `tracking_subscription: auto` as its flow starts); panics after `within`.
    pub async fn wait_until_exists(&self, subscription: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.admin.subscription_exists(subscription).await.unwrap() {
            assert!(Instant::now() < deadline, "{subscription} never appeared");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Publishes and waits; returns the message ids.
    pub async fn publish(&self, topic: &str, messages: Vec<Message>) -> Vec<String> {
        let publisher = self.admin.publisher(topic).await.unwrap();
        publish_all(&publisher, messages).await.unwrap()
    }

    /// A plain client (no sluice) that receives and acks up to `n` messages within `within`;
    /// returns the distinct message ids it got.
    pub fn plain_receiver(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
    ) -> tokio::task::JoinHandle<HashSet<String>> {
        self.plain_client(subscription, n, within, true)
    }

    /// As [`PubSub::plain_receiver`]; with `ack: false` the messages are given back (nacked)
    /// when its stream closes.
    pub fn plain_client(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
        ack: bool,
    ) -> tokio::task::JoinHandle<HashSet<String>> {
        self.plain_client_taking(subscription, n, within, ack, |m| m.message_id.clone())
    }

    /// As [`PubSub::plain_client`], keeping `take(message)` of each distinct message id.
    pub fn plain_client_taking<T: std::hash::Hash + Eq + Send + 'static>(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
        ack: bool,
        take: fn(&google_cloud_pubsub::model::Message) -> T,
    ) -> tokio::task::JoinHandle<HashSet<T>> {
        let (_never, stop) = tokio::sync::watch::channel(false);
        self.plain_client_until(subscription, n, within, ack, take, stop)
    }

    /// As [`PubSub::plain_client_taking`], ending early too once `stop` turns true.
    pub fn plain_client_until<T: std::hash::Hash + Eq + Send + 'static>(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
        ack: bool,
        take: fn(&google_cloud_pubsub::model::Message) -> T,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<HashSet<T>> {
        let (config, subscription) = (self.config.clone(), subscription.to_owned());
        tokio::spawn(async move {
            let mut stream = plain_stream(&config, &subscription).await;
            let token = stream.shutdown_token();
            let mut ids = HashSet::new();
            let mut taken = HashSet::new();
            let mut held = Vec::new();
            let deadline = tokio::time::Instant::now() + within;
            while ids.len() < n {
                let next = tokio::select! {
                    next = tokio::time::timeout_at(deadline, stream.next()) => next,
                    // A dropped sender never stops the read.
                    Ok(_) = stop.wait_for(|stop| *stop) => break,
                };
                match next {
                    Ok(Some(Ok((message, handler)))) => {
                        if ack {
                            handler.ack();
                        } else {
                            held.push(handler);
                        }
                        if ids.insert(message.message_id.clone()) {
                            taken.insert(take(&message));
                        }
                    }
                    _ => break,
                }
            }
            drop(held);
            drop(stream);
            token.shutdown().await;
            taken
        })
    }

    /// Every message delivered on `subscription` (acked), copies included, until `n` distinct
    /// message ids have come and then nothing more for `quiet`, or until `within` passed.
    pub async fn collect_all(
        &self,
        subscription: &str,
        n: usize,
        within: Duration,
        quiet: Duration,
    ) -> Vec<google_cloud_pubsub::model::Message> {
        let mut stream = plain_stream(&self.config, subscription).await;
        let token = stream.shutdown_token();
        let mut messages = Vec::new();
        let mut ids = HashSet::new();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let until = if ids.len() >= n {
                deadline.min(tokio::time::Instant::now() + quiet)
            } else {
                deadline
            };
            match tokio::time::timeout_at(until, stream.next()).await {
                Ok(Some(Ok((message, handler)))) => {
                    handler.ack();
                    ids.insert(message.message_id.clone());
                    messages.push(message);
                }
                _ => break,
            }
        }
        drop(stream);
        token.shutdown().await;
        messages
    }
}

/// One stream of the official client on the emulator's `subscription`, with the same lease
/// extension (and so stream ack deadline) as sluice's streams.
async fn plain_stream(
    config: &PubSubConfig,
    subscription: &str,
) -> google_cloud_pubsub::subscriber::MessageStream {
    let client = Subscriber::builder()
        .with_endpoint(config.endpoint().unwrap())
        .with_credentials(google_cloud_auth::credentials::anonymous::Builder::new().build())
        .build()
        .await
        .unwrap();
    client
        .subscribe(config.subscription_path(subscription).unwrap())
        .set_max_lease_extension(Duration::from_secs(10))
        .build()
}

/// A message keyed by the `event_id` attribute, with a small JSON payload.
pub fn event(event_id: &str) -> Message {
    Message::new()
        .set_data(Bytes::from(format!("{{\"event_id\":\"{event_id}\"}}")))
        .set_attributes([("event_id", event_id.to_owned())])
}

/// `n` distinct events `e0..` plus `dups` re-publishes of random earlier ones (new message ids,
/// same `event_id`), shuffled together.
pub fn events_with_duplicates(prefix: &str, n: usize, dups: usize) -> Vec<Message> {
    use rand::seq::SliceRandom;
    let mut messages: Vec<_> = (0..n).map(|i| event(&format!("{prefix}{i}"))).collect();
    for _ in 0..dups {
        let i = rand::random_range(0..n);
        messages.push(event(&format!("{prefix}{i}")));
    }
    messages.shuffle(&mut rand::rng());
    messages
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

/// A `sluice` worker process.
pub struct Worker {
    child: Child,
    /// Its stdout.
    pub stdout: PathBuf,
    /// Its stderr (logs).
    pub stderr: PathBuf,
}

impl Worker {
    /// Starts `sluice run -c config`, logs into files next to the config.
    pub fn start(config: &Path, name: &str) -> Self {
        Self::spawn(
            &["run", "-c", config.to_str().unwrap()],
            config.parent().unwrap(),
            name,
        )
    }

    /// Starts `sluice ARGS` with its output in `dir/name.{out,err}`.
    pub fn spawn(args: &[&str], dir: &Path, name: &str) -> Self {
        let mut command = Command::new(sluice_bin());
        command.env_remove("PUBSUB_EMULATOR_HOST");
        Self::spawn_command(command, args, dir, name)
    }

    /// Starts `sluice ARGS` in `dir` (its working directory) with `env` set (and no other
    /// Pub/Sub emulator than one `env` names), its output in `dir/name.{out,err}`.
    pub fn spawn_with_env(args: &[&str], env: &[(String, String)], dir: &Path, name: &str) -> Self {
        let mut command = Command::new(sluice_bin());
        command.env_remove("PUBSUB_EMULATOR_HOST").current_dir(dir);
        command.envs(env.iter().map(|(k, v)| (k, v)));
        Self::spawn_command(command, args, dir, name)
    }

    /// Starts the connector's example `example` with `ARGS`, the run's emulator in
    /// `PUBSUB_EMULATOR_HOST` (the examples take Pub/Sub from the environment), its output in
    /// `dir/name.{out,err}`.
    pub fn example(example: &str, args: &[&str], dir: &Path, name: &str) -> Self {
        let bin = sluice_bin()
            .parent()
            .unwrap()
            .join("examples")
            .join(example);
        assert!(
            bin.exists(),
            "{} not built: `cargo build -p sluice-connector --examples` first (./scripts/test does)",
            bin.display()
        );
        let endpoint = emulator().endpoint();
        let host = endpoint.trim_start_matches("http://").to_owned();
        let mut command = Command::new(bin);
        command
            .env("PUBSUB_EMULATOR_HOST", host)
            .env("PUBSUB_PROJECT_ID", PROJECT);
        Self::spawn_command(command, args, dir, name)
    }

    fn spawn_command(mut command: Command, args: &[&str], dir: &Path, name: &str) -> Self {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        let child = command
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// SIGKILL, and reap.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM (a drain).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the exit, at most `within`; kills the process and panics past that.
    pub fn wait(mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "worker did not exit within {within:?}; stderr:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Its stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Its stdout so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Read-only views of a SQLite store.
pub struct Db(pub PathBuf);

impl Db {
    /// Runs a query returning one integer (`COUNT`, `MAX(committed_at)`); 0 while the store or
    /// its table does not exist yet, a panic on any other error (so a broken query can never
    /// pass for an empty table).
    pub fn query(&self, sql: &str) -> i64 {
        if !self.0.exists() {
            return 0;
        }
        let conn = rusqlite::Connection::open(&self.0).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        match conn.query_row(sql, [], |row| row.get(0)) {
            Ok(count) => count,
            Err(error) if error.to_string().contains("no such table") => 0,
            Err(error) => panic!("{sql}: {error}"),
        }
    }

    /// Rows in `test__events`.
    pub fn rows(&self) -> i64 {
        self.query("SELECT COUNT(*) FROM test__events")
    }

    /// Distinct dedup keys in `test__events`.
    pub fn distinct_keys(&self) -> i64 {
        self.query("SELECT COUNT(DISTINCT dedup_key) FROM test__events")
    }

    /// Rows in `test__dead_letter`.
    pub fn dead_letters(&self) -> i64 {
        self.query("SELECT COUNT(*) FROM test__dead_letter")
    }
}

/// Read-only views of a PostgreSQL store, through `psql` (synchronous, so usable in
/// [`eventually`]).
pub struct PgDb(pub String);

impl PgDb {
    /// Runs a query returning one integer; 0 while the table does not exist yet, a panic on any
    /// other error.
    pub fn query(&self, sql: &str) -> i64 {
        let out = Command::new("psql")
            .args([self.0.as_str(), "-AtXqc", sql])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            assert!(stderr.contains("does not exist"), "{sql}: {stderr}");
            return 0;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{sql}: {text}"))
    }

    /// Runs a query returning text; empty while the table does not exist yet, a panic on any
    /// other error.
    pub fn text(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args([self.0.as_str(), "-AtXqc", sql])
            .output()
            .unwrap();
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("does not exist"), "{sql}: {stderr}");
            return String::new();
        }
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Rows in `test__events`.
    pub fn rows(&self) -> i64 {
        self.query("SELECT count(*) FROM test__events")
    }

    /// Distinct dedup keys in `test__events`.
    pub fn distinct_keys(&self) -> i64 {
        self.query("SELECT count(DISTINCT dedup_key) FROM test__events")
    }

    /// Rows in `test__dead_letter`.
    pub fn dead_letters(&self) -> i64 {
        self.query("SELECT count(*) FROM test__dead_letter")
    }

    /// Asserts exactly-once: `distinct` rows, one per key, and no dead letters.
    pub fn assert_exactly_once(&self, distinct: usize) {
        assert_eq!(
            self.rows(),
            distinct as i64,
            "exactly one row per distinct key"
        );
        assert_eq!(self.distinct_keys(), distinct as i64);
        assert_eq!(self.dead_letters(), 0);
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

/// The value of a metric of one flow of pipeline `test` from a worker's `/metrics` on `port`
/// (`None`: not exported, or the worker does not answer).
pub fn flow_metric(port: u16, name: &str, flow: &str) -> Option<f64> {
    let series = format!("{name}{{pipeline=\"test\",flow=\"{flow}\"}} ");
    metrics_text(port)
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
}

/// The value of the first series of metric `name` whose labels contain `label` (such as
/// `outcome="refused"`) from a worker's `/metrics` on `port` (`None`: not exported).
pub fn labelled_metric(port: u16, name: &str, label: &str) -> Option<f64> {
    metrics_text(port).lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.split_once("} ")?;
        labels.contains(label).then(|| value.trim().parse().ok())?
    })
}

/// What a worker's `/metrics` on `port` serves (empty when nothing answers), read with one
/// HTTP/1.0 request from this process: a `curl` process per scrape took hundreds of
/// milliseconds on a loaded machine, too slow for the crash test's aim at a commit.
pub fn metrics_text(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    if stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return String::new();
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response);
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => {
            body.to_owned()
        }
        _ => String::new(),
    }
}

/// The HTTP status `GET http://127.0.0.1:{port}{path}` answers (`000`: no answer).
pub fn http_status(port: u16, path: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
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
