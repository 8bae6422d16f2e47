//! `sluice bench throughput`: on one emulator, in one run,
//! 1. the raw rate of the official client (receive + ack, no processing, same stream count),
//! 2. sluice's end-to-end exactly-once rate (dedup, batch, commit, ack-after-commit) into SQLite
//!    and, with `--store postgres`, into PostgreSQL (a scratch database on `--postgres`),
//!    each reported with its ratio to (1);
//! 3. sluice's own capacity without the emulator: an in-process source behind the same seam,
//!    against a baseline of the same source drained by a consumer that acks at once; each store
//!    is drained twice, as a flow without a watermark and as one whose commits also record every
//!    message settled toward its watermark.
//!
//! Each emulator measurement drains a backlog published beforehand to a fresh subscription
//! (fresh names avoid the emulator's stall after a stream closes), after a warm-up drain (the
//! emulator's JIT makes the first run several times slower).

use crate::cpu::process_cpu_time;
use crate::emulator::{Emulator, EmulatorError};
use crate::stores::{Backend, FreshStore, StoreChoice};
use bytes::Bytes;
use google_cloud_pubsub::client::Subscriber;
use google_cloud_pubsub::model::Message;
use sluice_connector::engine::pubsub::{Admin, SourceError, publish_all};
use sluice_connector::engine::{
    BatchSettings, Budget, CommitThenAck, Counters, DedupSettings, FlowRun, FlowWatermark,
    InProcessSource, KeySource, MessageSource, PubSubConfig, PubSubSource, RetrySettings, RunUntil,
    TableStage,
};
use sluice_store::LedgerStore;
use sluice_store::{Layout, table_name};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Project the benchmark's topics live in.
pub(crate) const PROJECT: &str = "sluice-bench";
/// Messages published per publish call group (keeps memory of pending futures bounded).
const PUBLISH_CHUNK: usize = 10_000;
/// Messages drained to warm the emulator up before measuring.
pub(crate) const WARM_UP_MESSAGES: usize = 20_000;
/// Give up on a drain that makes no progress for this long.
const STALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Options of `sluice bench throughput`.
#[derive(Debug, Clone, clap::Args)]
pub struct ThroughputArgs {
    /// Messages per emulator measurement.
    #[arg(long, default_value_t = 100_000)]
    pub messages: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// StreamingPull streams (the same for the raw client and sluice).
    #[arg(long, default_value_t = 16)]
    pub streams: usize,
    /// Messages for the in-process capacity measurement.
    #[arg(long, default_value_t = 1_000_000)]
    pub capacity_messages: usize,
    /// Rounds of the emulator pair (raw then sluice in odd rounds, sluice then raw in even ones);
    /// each round uses fresh subscriptions.
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// Skip the emulator measurements (capacity only).
    #[arg(long)]
    pub capacity_only: bool,
    /// Stores to measure: `sqlite`, or `postgres` (measures PostgreSQL and SQLite side by side).
    #[arg(long, value_enum, default_value_t = StoreChoice::Sqlite)]
    pub store: StoreChoice,
    /// Administrative URL of the PostgreSQL server that holds the scratch databases (one per
    /// drain, dropped after it).
    #[arg(long, default_value = sluice_store::DEFAULT_SCRATCH_SERVER)]
    pub postgres: String,
}

impl ThroughputArgs {
    fn backends(&self) -> Vec<Backend> {
        self.store.backends()
    }
}

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
}

/// Runs the benchmark and prints a Markdown table.
pub async fn throughput(args: ThroughputArgs) -> Result<(), BenchError> {
    println!("# sluice bench throughput");
    println!(
        "messages {} x {} B, streams {}, capacity messages {}",
        args.messages, args.size, args.streams, args.capacity_messages
    );
    if !args.capacity_only {
        emulator_rounds(&args).await?;
    }
    capacity(&args).await
}

/// The emulator a benchmark runs on (`PUBSUB_EMULATOR_HOST`'s, else one of its own, kept
/// while the value lives), warmed up: its client config, admin, and a run id for fresh names.
pub(crate) struct WarmEmulator {
    _own: Option<Emulator>,
    pub(crate) config: PubSubConfig,
    pub(crate) admin: Admin,
    pub(crate) run_id: u32,
}

impl WarmEmulator {
    /// Starts (or finds) the emulator and drains a warm-up backlog of `size`-byte messages
    /// with `streams` streams (its JIT makes the first drain several times slower).
    pub(crate) async fn start(size: usize, streams: usize) -> Result<Self, BenchError> {
        let (own, endpoint) = match std::env::var("PUBSUB_EMULATOR_HOST") {
            Ok(host) => (None, format!("http://{host}")),
            Err(_) => {
                let emulator = Emulator::start()?;
                let endpoint = emulator.endpoint();
                (Some(emulator), endpoint)
            }
        };
        let config = PubSubConfig {
            project: Some(PROJECT.to_owned()),
            endpoint: Some(endpoint),
        };
        let admin = Admin::connect(&config).await?;
        let run_id: u32 = rand::random();
        let warm = backlog(&admin, &format!("warm-{run_id}"), WARM_UP_MESSAGES, size).await?;
        raw_drain(&config, &warm, WARM_UP_MESSAGES, streams).await?;
        Ok(Self {
            _own: own,
            config,
            admin,
            run_id,
        })
    }
}

async fn emulator_rounds(args: &ThroughputArgs) -> Result<(), BenchError> {
    let emulator = WarmEmulator::start(args.size, args.streams).await?;
    let (config, admin, run_id) = (&emulator.config, &emulator.admin, emulator.run_id);
    let backends = args.backends();
    println!();
    let mut header = "| round | raw client msg/s |".to_owned();
    let mut rule = "|---|---|".to_owned();
    for backend in &backends {
        header.push_str(&format!(" sluice → {} msg/s | ratio |", backend.name()));
        rule.push_str("---|---|");
    }
    println!("{header}\n{rule}");
    let mut ratios = vec![Vec::new(); backends.len()];
    for round in 1..=args.rounds {
        // All backlogs are published first; then the drains run one after the other, their
        // order rotating from round to round, so no side always gets the fresher emulator.
        let mut contenders: Vec<Option<Backend>> = vec![None];
        contenders.extend(backends.iter().copied().map(Some));
        let mut subscriptions = Vec::new();
        for contender in &contenders {
            let name = match contender {
                None => format!("raw-{run_id}-{round}"),
                Some(backend) => format!("{}-{run_id}-{round}", backend.name().to_lowercase()),
            };
            subscriptions.push(backlog(admin, &name, args.messages, args.size).await?);
        }
        let mut rates = vec![0.0; contenders.len()];
        let shift = (round - 1) % contenders.len();
        for slot in (0..contenders.len()).map(|i| (i + shift) % contenders.len()) {
            let took = match contenders[slot] {
                None => {
                    raw_drain(config, &subscriptions[slot], args.messages, args.streams).await?
                }
                Some(backend) => {
                    let source =
                        PubSubSource::new(config.clone(), &subscriptions[slot], args.streams)?;
                    sluice_drain(
                        Box::new(source),
                        args.messages,
                        backend,
                        &args.postgres,
                        Progress::None,
                    )
                    .await?
                    .wall
                }
            };
            rates[slot] = rate(args.messages, took);
        }
        let mut line = format!("| {round} | {:.0} |", rates[0]);
        for (i, sluice_rate) in rates[1..].iter().enumerate() {
            let ratio = sluice_rate / rates[0];
            ratios[i].push(ratio);
            line.push_str(&format!(" {sluice_rate:.0} | {ratio:.2} |"));
        }
        println!("{line}");
    }
    println!();
    for (backend, ratios) in backends.iter().zip(&ratios) {
        let mean = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
        println!("mean ratio sluice → {} / raw: {mean:.2}", backend.name());
    }
    Ok(())
}

async fn capacity(args: &ThroughputArgs) -> Result<(), BenchError> {
    let n = args.capacity_messages;
    // Every tenth message repeats an earlier key, as a publisher retry would.
    let key_of = |i: usize| {
        if i % 10 == 9 {
            format!("k{}", i / 10)
        } else {
            format!("k{i}")
        }
    };
    let mut rows = vec![(
        "baseline: receive + ack only".to_owned(),
        ack_only_drain(InProcessSource::generated(n, args.size, key_of)).await,
    )];
    for backend in args.backends() {
        for progress in [Progress::None, Progress::Watermark] {
            let source = Box::new(InProcessSource::generated(n, args.size, key_of));
            rows.push((
                format!(
                    "sluice: dedup + batch + {} commit{} + ack",
                    backend.name(),
                    progress.label()
                ),
                sluice_drain(source, n, backend, &args.postgres, progress).await?,
            ));
        }
    }
    println!();
    println!(
        "| in-process source, {n} messages, 10% duplicates | msg/s | CPU µs/msg (this process) |"
    );
    println!("|---|---|---|");
    let mut notes = Vec::new();
    for (name, m) in rows {
        notes.extend(m.footprint.clone());
        println!(
            "| {name} | {:.0} | {:.2} |",
            rate(n, m.wall),
            m.cpu.as_secs_f64() * 1e6 / n as f64
        );
    }
    for note in notes {
        println!("\n{note}");
    }
    Ok(())
}

#[derive(Debug, Clone)]
pub(crate) struct Measured {
    pub(crate) wall: Duration,
    cpu: Duration,
    /// What the store occupied and wrote (PostgreSQL drains).
    footprint: Option<String>,
}

fn rate(messages: usize, took: Duration) -> f64 {
    messages as f64 / took.as_secs_f64().max(1e-9)
}

/// Creates a topic and subscription and publishes `n` messages of `size` bytes to it; returns
/// the subscription's path.
pub(crate) async fn backlog(
    admin: &Admin,
    name: &str,
    n: usize,
    size: usize,
) -> Result<String, BenchError> {
    backlog_with(admin, name, n, size, |i| vec![("key", format!("k{i}"))]).await
}

/// As [`backlog`], message `i` with `attributes(i)`.
pub(crate) async fn backlog_with(
    admin: &Admin,
    name: &str,
    n: usize,
    size: usize,
    attributes: impl Fn(usize) -> Vec<(&'static str, String)>,
) -> Result<String, BenchError> {
    admin.create_topic(name).await?;
    let subscription = admin
        .create_subscription(&format!("{name}-sub"), name, 60)
        .await?;
    let publisher = admin.publisher(name).await?;
    let payload = Bytes::from(vec![b'x'; size]);
    let mut published = 0;
    while published < n {
        let chunk = (n - published).min(PUBLISH_CHUNK);
        let messages = (published..published + chunk).map(|i| {
            Message::new()
                .set_data(payload.clone())
                .set_attributes(attributes(i))
        });
        publish_all(&publisher, messages).await?;
        published += chunk;
    }
    Ok(subscription)
}

/// The official client alone: `streams` streams, ack every message at once, until `n` acked.
pub(crate) async fn raw_drain(
    config: &PubSubConfig,
    subscription: &str,
    n: usize,
    streams: usize,
) -> Result<Duration, BenchError> {
    let acked = Arc::new(AtomicU64::new(0));
    let done = CancellationToken::new();
    let started = Instant::now();
    let counting = {
        let (acked, done) = (acked.clone(), done.clone());
        move |_: &google_cloud_pubsub::model::Message| {
            if acked.fetch_add(1, Ordering::Relaxed) + 1 >= n as u64 {
                done.cancel();
            }
        }
    };
    let mut reading = tokio::spawn(raw_streams(
        config.clone(),
        subscription.to_owned(),
        streams,
        done.clone(),
        Arc::new(counting),
    ));
    let took = tokio::select! {
        took = wait_for(&acked, n, &done, started) => took,
        built = &mut reading => match built {
            Ok(Err(error)) => Err(error),
            _ => Err(BenchError::Stalled("the raw client's streams ended".to_owned())),
        },
    };
    done.cancel();
    let _ = reading.await;
    took
}

/// The official client alone on `subscription`: `streams` streams, each message acked on
/// receipt and then shown to `on_message`, until `stop`.
pub(crate) async fn raw_streams(
    config: PubSubConfig,
    subscription: String,
    streams: usize,
    stop: CancellationToken,
    on_message: Arc<dyn Fn(&google_cloud_pubsub::model::Message) + Send + Sync>,
) -> Result<(), BenchError> {
    let mut builder = Subscriber::builder().with_grpc_subchannel_count(streams);
    if let Some(endpoint) = config.endpoint() {
        builder = builder
            .with_endpoint(endpoint)
            .with_credentials(google_cloud_auth_anonymous());
    }
    let client = builder
        .build()
        .await
        .map_err(|e| SourceError::Client(e.to_string()))?;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..streams {
        let (client, stop, subscription, on_message) = (
            client.clone(),
            stop.clone(),
            subscription.clone(),
            on_message.clone(),
        );
        tasks.spawn(async move {
            let mut stream = client.subscribe(subscription).build();
            let token = stream.shutdown_token();
            loop {
                let next = tokio::select! {
                    _ = stop.cancelled() => break,
                    next = stream.next() => next,
                };
                let Some(Ok((message, handler))) = next else {
                    break;
                };
                handler.ack();
                on_message(&message);
            }
            drop(stream);
            token.shutdown().await;
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

fn google_cloud_auth_anonymous() -> google_cloud_auth::credentials::Credentials {
    google_cloud_auth::credentials::anonymous::Builder::new().build()
}

/// What a commit records besides the rows and the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Nothing: a flow without a watermark.
    None,
    /// Each message id settled toward the flow's watermark (`sluice_watermark_messages`), as a
    /// flow with `event_time` and a tracking subscription commits.
    Watermark,
}

impl Progress {
    fn label(self) -> &'static str {
        match self {
            Self::None => "",
            Self::Watermark => " with watermark progress",
        }
    }
}

/// sluice end to end into a fresh store of `backend`, until `n` messages are acked.
pub(crate) async fn sluice_drain(
    source: Box<dyn MessageSource>,
    n: usize,
    backend: Backend,
    postgres_server: &str,
    progress: Progress,
) -> Result<Measured, BenchError> {
    let store_error = |e: sluice_store::StoreError| BenchError::Store(e.to_string());
    let fresh = FreshStore::open(backend, postgres_server).await?;
    let (store, postgres) = (fresh.store.clone(), fresh.postgres.clone());
    let counters = Counters::new("bench", "ingest");
    if progress == Progress::Watermark {
        counters.attach_watermark(FlowWatermark::new());
    }
    let key = KeySource::Attribute {
        name: "key".into(),
        dead_letter_if_missing: false,
    };
    let (run, flow) = bench_flow(&store, store.clone(), source, key, counters.clone()).await?;
    let wal_before = match &postgres {
        Some(store) => Some(store.footprint().await.map_err(store_error)?.wal_position),
        None => None,
    };
    let drain = CancellationToken::new();
    let cpu_before = process_cpu_time();
    let started = Instant::now();
    let task = tokio::spawn(run.run(drain.clone()));
    let acked = loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let snapshot = counters.snapshot();
        if snapshot.acked >= n as u64 {
            break Ok(started.elapsed());
        }
        if started.elapsed() > STALL_TIMEOUT * 5 {
            break Err(BenchError::Stalled(format!(
                "sluice acked {} of {n}",
                snapshot.acked
            )));
        }
    };
    let cpu = process_cpu_time().saturating_sub(cpu_before);
    drain.cancel();
    let _ = task.await;
    let wall = acked?;
    let footprint = match (&postgres, wal_before) {
        (Some(store), Some(wal_before)) => {
            let after = store.footprint().await.map_err(store_error)?;
            let commits = store
                .flow_progress(&flow)
                .await
                .map_err(store_error)?
                .batches;
            Some(format!(
                "PostgreSQL after {n} messages: ledger {} rows ({:.2} per message), {} bytes \
                 ({:.0} B per message, indexes included); WAL {:.0} B per message; {commits} \
                 commits ({:.1}/s, {:.0} messages each)",
                after.ledger_rows,
                after.ledger_rows as f64 / n as f64,
                after.ledger_bytes,
                after.ledger_bytes as f64 / n as f64,
                (after.wal_position - wal_before) as f64 / n as f64,
                commits as f64 / wall.as_secs_f64(),
                n as f64 / commits.max(1) as f64,
            ))
        }
        _ => None,
    };
    drop(fresh);
    Ok(Measured {
        wall,
        cpu,
        footprint,
    })
}

/// The flow every emulator drain of the benchmarks runs, as the worker's Pub/Sub flows do:
/// budget 10 000 / 100 MiB, dedup by `key` over 10 minutes, batches of up to 1 000 / 50 ms,
/// rows into `bench__events` of `store` (prepared here), committed through `ledger` (the store
/// itself, or a wrapper around it) with the commit bound.
pub(crate) async fn bench_flow(
    store: &Arc<dyn sluice_store::Store>,
    ledger: Arc<dyn LedgerStore>,
    source: Box<dyn MessageSource>,
    key: KeySource,
    counters: Counters,
) -> Result<(FlowRun, sluice_store::FlowHandle), BenchError> {
    let store_error = |e: sluice_store::StoreError| BenchError::Store(e.to_string());
    let flow = store
        .prepare(&Layout {
            pipeline: "bench".into(),
            tables: vec!["events".into()],
            flows: vec!["ingest".into()],
        })
        .await
        .map_err(store_error)?
        .remove(0);
    let window = Duration::from_secs(600);
    let run = FlowRun {
        source,
        budget: Budget::new(10_000, 100 << 20),
        dedup: DedupSettings { key, window },
        batch: BatchSettings {
            max_messages: 1_000,
            max_delay: Duration::from_millis(50),
        },
        committer: CommitThenAck::new(
            ledger,
            flow.clone(),
            Arc::from(table_name("bench", "events").map_err(store_error)?),
            Arc::new(TableStage::default()),
            RetrySettings {
                max_attempts: 5,
                dedup_window: window,
                // As the worker's Pub/Sub flows: the deadline travels with every commit.
                commit_bound: Some(sluice_connector::engine::commit_bound(window)),
            },
            CancellationToken::new(),
        ),
        counters,
        until: RunUntil::Drained,
        drain_agreement: None,
    };
    Ok((run, flow))
}

/// The channel of the ack-only baseline: the size of a flow's intake channel.
const ACK_ONLY_CHANNEL: usize = 1024;

/// The in-process source drained by a consumer that acks each message at once: what the source
/// and the channel cost without sluice's work.
async fn ack_only_drain(source: InProcessSource) -> Measured {
    let cpu_before = process_cpu_time();
    let started = Instant::now();
    let n = source.len();
    let (tx, mut rx) = tokio::sync::mpsc::channel(ACK_ONLY_CHANNEL);
    let stop = CancellationToken::new();
    let handle = Box::new(source)
        .start(tx, Budget::new(10_000, 100 << 20), stop.clone())
        .await;
    for _ in 0..n {
        let Some(received) = rx.recv().await else {
            break;
        };
        received.handle.ack();
    }
    stop.cancel();
    drop(rx);
    if let Ok(handle) = handle {
        handle.close().await;
    }
    Measured {
        footprint: None,
        wall: started.elapsed(),
        cpu: process_cpu_time().saturating_sub(cpu_before),
    }
}

async fn wait_for(
    acked: &AtomicU64,
    n: usize,
    done: &CancellationToken,
    started: Instant,
) -> Result<Duration, BenchError> {
    let mut last = (0, Instant::now());
    loop {
        tokio::select! {
            _ = done.cancelled() => return Ok(started.elapsed()),
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        let now = acked.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > STALL_TIMEOUT {
            return Err(BenchError::Stalled(format!(
                "raw client acked {now} of {n}"
            )));
        }
    }
}
