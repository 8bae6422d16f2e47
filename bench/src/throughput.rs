//! `sluice bench throughput`: on one emulator, in one run,
//! 1. the raw rate of the official client (receive + ack, no processing, same stream count),
//! 2. sluice's end-to-end exactly-once rate (dedup, batch, commit, ack-after-commit) into SQLite
//!    and, with `--store postgres`, into PostgreSQL (a scratch database on `--postgres`),
//!    each reported with its ratio to (1);
//! 3. sluice's own capacity without the emulator: an in-process source behind the same seam,
//!    against a baseline of the same source drained by a consumer that acks at once; each store
//!    is drained twice, as a flow without a watermark and as one whose commits also record every
//!    message settled toward its watermark (and whose duplicates are acked once their reports
//!    are stored, `drain.rs`).
//!
//! Each emulator measurement drains a backlog published beforehand to a fresh subscription
//! (fresh names avoid the emulator's stall after a stream closes), after a warm-up drain (the
//! emulator's JIT makes the first run several times slower).

use crate::cpu::process_cpu_time;
use crate::drain::{Measured, Progress, STALL_TIMEOUT, sluice_drain};
use crate::emulator::Emulator;
use crate::error::BenchError;
use crate::stores::{Backend, StoreChoice};
use bytes::Bytes;
use google_cloud_pubsub::client::Subscriber;
use google_cloud_pubsub::model::Message;
use sluice_engine::pubsub::{Admin, SourceError, publish_all};
use sluice_engine::{
    Budget, InProcessSource, MessageSource, PubSubConfig, PubSubSource, TRACKER_TICK,
};
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
    /// Messages for the in-process capacity measurement (at least 1: a rate needs one).
    #[arg(long, default_value_t = 1_000_000,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
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
                        None,
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
    let mut rows = vec![(
        "baseline: receive + ack only".to_owned(),
        ack_only_drain(InProcessSource::generated(n, args.size, capacity_key)).await,
    )];
    for backend in args.backends() {
        for progress in [Progress::None, Progress::Watermark] {
            let source = Box::new(InProcessSource::generated(n, args.size, capacity_key));
            rows.push((
                format!(
                    "sluice: dedup + batch + {} commit{} + ack",
                    backend.name(),
                    progress.label()
                ),
                sluice_drain(source, n, backend, &args.postgres, progress, None).await?,
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
    println!(
        "\nWith watermark progress, a duplicate found in memory is acked once its report is \
         stored, at the next tracker tick ({} ms, as a worker's tracker does): a drain of a \
         few seconds mostly measures that wait.",
        TRACKER_TICK.as_millis()
    );
    Ok(())
}

/// The dedup key of message `i` of the capacity source: message `10j + 9` carries message `j`'s
/// key, as a publisher retry would (a duplicate unless `j` itself ends in 9: 9 % of the messages).
fn capacity_key(i: usize) -> String {
    if i % 10 == 9 {
        format!("k{}", i / 10)
    } else {
        format!("k{i}")
    }
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
    let payload = Bytes::from(vec![b'x'; size]);
    backlog_of(admin, name, n, |i| {
        Message::new()
            .set_data(payload.clone())
            .set_attributes(attributes(i))
    })
    .await
}

/// A topic `name` with a subscription holding `n` messages, message `i` being `message(i)`.
pub(crate) async fn backlog_of(
    admin: &Admin,
    name: &str,
    n: usize,
    message: impl Fn(usize) -> Message,
) -> Result<String, BenchError> {
    admin.create_topic(name).await?;
    let subscription = admin
        .create_subscription(&format!("{name}-sub"), name, 60)
        .await?;
    let publisher = admin.publisher(name).await?;
    let mut published = 0;
    while published < n {
        let chunk = (n - published).min(PUBLISH_CHUNK);
        let messages = (published..published + chunk).map(&message);
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A drain that stopped says so itself after [`STALL_TIMEOUT`]; this bounds one that would
    /// not even do that.
    const STUCK: Duration = STALL_TIMEOUT.saturating_mul(2);

    /// Small capacity runs finish on both stores, with and without watermark progress, and
    /// every message is acked once: the duplicates too (with progress, after their reports).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_capacity_drains_ack_every_message() {
        for backend in StoreChoice::Postgres.backends() {
            for n in [1, 10, 2000] {
                for progress in [Progress::None, Progress::Watermark] {
                    let source = InProcessSource::generated(n, 100, capacity_key);
                    let tally = source.tally();
                    let drained = tokio::time::timeout(
                        STUCK,
                        sluice_drain(
                            Box::new(source),
                            n,
                            backend,
                            sluice_store::DEFAULT_SCRATCH_SERVER,
                            progress,
                            None,
                        ),
                    )
                    .await;
                    let acked = tally.acked.load(Ordering::Relaxed);
                    let nacked = tally.nacked.load(Ordering::Relaxed);
                    assert!(
                        matches!(drained, Ok(Ok(_))) && acked == n as u64 && nacked == 0,
                        "{} {n} messages, {progress:?}: acked {acked}, nacked {nacked}, drain \
                         {drained:?}",
                        backend.name()
                    );
                }
            }
        }
    }
}
