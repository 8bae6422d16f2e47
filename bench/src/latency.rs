//! `sluice bench latency`: publish-to-commit latency at steady publish rates, on one emulator,
//! in one run, beside the official client's publish-to-receive latency as the baseline.
//!
//! For each rate and each subscription kind (unordered; ordered, with `--keys` ordering keys),
//! on a fresh topic and subscription each:
//! 1. **raw client**: the official subscriber (`--streams` streams) acks each message on
//!    receipt; its latency is receipt time minus publish time;
//! 2. **sluice**: a flow (dedup by message id, batches of up to 1000 or 50 ms, the defaults)
//!    commits into a fresh SQLite store and acks after commit; its latency is the moment the
//!    commit returned minus publish time (measured around the store's `commit`).
//!
//! Then ordering's cost in throughput: the same backlog (`--backlog` messages, each with an
//! ordering key) drained from an unordered and an ordered subscription, by each reader.
//!
//! The publisher stamps each message with the wall-clock time at which it handed it to the
//! client (`sent_us`), so both latencies include the client's publish batching (5 ms). The
//! first second of each measurement is left out (streams opening, the emulator's JIT). The
//! latencies are recorded in `latency_samples.rs`.

use crate::drain::{Progress, bench_flow, sluice_drain};
use crate::error::BenchError;
use crate::latency_points::{Percentiles, RatePoint};
use crate::latency_samples::{Samples, Timed, now_us};
use crate::stores::{Backend, FreshStore};
use crate::throughput::{WarmEmulator, raw_drain};
use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use sluice_engine::pubsub::{Admin, SubscriptionSettings};
use sluice_engine::{Counters, FlowRun, KeySource, PubSubConfig, PubSubSource};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Options of `sluice bench latency`.
#[derive(Debug, Clone, clap::Args)]
pub struct LatencyArgs {
    /// Publish rates to measure, messages per second.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000u32, 5_000, 10_000])]
    pub rates: Vec<u32>,
    /// Seconds of publishing per measurement.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// StreamingPull streams (the same for the raw client and sluice).
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// Ordering keys of the ordered measurements (message `i` has key `i mod keys`).
    #[arg(long, default_value_t = 64)]
    pub keys: usize,
    /// Messages of the backlog drained to measure ordering's cost in throughput (0: skip).
    #[arg(long, default_value_t = 50_000)]
    pub backlog: usize,
    /// Where the plot of latency against rate is written (SVG).
    #[arg(long, default_value = "docs/bench-latency.svg")]
    pub plot: PathBuf,
}

/// Who reads a measurement's subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reader {
    Raw,
    Sluice,
}

/// Runs the benchmark, prints a Markdown table and writes the plot.
pub async fn latency(args: LatencyArgs) -> Result<(), BenchError> {
    println!("# sluice bench latency");
    println!(
        "rates {:?} msg/s, {} s each, {} B, streams {}, ordering keys {}",
        args.rates, args.seconds, args.size, args.streams, args.keys
    );
    let emulator = WarmEmulator::start(args.size, args.streams).await?;
    let (config, admin, run_id) = (&emulator.config, &emulator.admin, emulator.run_id);
    println!();
    println!(
        "| msg/s | subscription | raw client p50 / p99 / max ms | sluice p50 / p99 / max ms | \
         p99 ratio | messages measured (raw, sluice) |"
    );
    println!("|---|---|---|---|---|---|");
    let mut points = Vec::new();
    let mut rates = args.rates.clone();
    rates.sort_unstable();
    rates.dedup();
    for &rate in &rates {
        let mut point = RatePoint {
            rate,
            unordered: [Percentiles::default(); 2],
            ordered: [Percentiles::default(); 2],
        };
        for ordered in [false, true] {
            let mut pair = [Percentiles::default(); 2];
            // Which reader goes first alternates from run to run, so neither side always
            // gets the fresher emulator.
            let readers = if (rate / 1000 + u32::from(ordered)) % 2 == 0 {
                [Reader::Raw, Reader::Sluice]
            } else {
                [Reader::Sluice, Reader::Raw]
            };
            for reader in readers {
                let name = format!(
                    "lat-{run_id}-{rate}-{}-{}",
                    if ordered { "ord" } else { "unord" },
                    if reader == Reader::Raw {
                        "raw"
                    } else {
                        "sluice"
                    }
                );
                let measured = measure(admin, config, &args, &name, rate, ordered, reader).await?;
                pair[usize::from(reader == Reader::Sluice)] = measured;
            }
            let [raw, sluice] = pair;
            println!(
                "| {rate} | {} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} / {:.0} | {:.2} | {}, {} |",
                if ordered { "ordered" } else { "unordered" },
                raw.p50,
                raw.p99,
                raw.max,
                sluice.p50,
                sluice.p99,
                sluice.max,
                sluice.p99 / raw.p99.max(1e-9),
                raw.count,
                sluice.count
            );
            if ordered {
                point.ordered = pair;
            } else {
                point.unordered = pair;
            }
        }
        points.push(point);
    }
    println!();
    for point in &points {
        println!(
            "at {} msg/s: ordered / unordered sluice p50 {:.2}, p99 {:.2}",
            point.rate,
            point.ordered[1].p50 / point.unordered[1].p50.max(1e-9),
            point.ordered[1].p99 / point.unordered[1].p99.max(1e-9)
        );
    }
    if args.backlog > 0 {
        ordering_cost(admin, config, &args, run_id).await?;
    }
    crate::latency_plot::draw(&args.plot, &points)
        .map_err(|e| BenchError::Stalled(format!("cannot draw {}: {e}", args.plot.display())))?;
    println!("\nplot: {}", args.plot.display());
    Ok(())
}

/// Ordering's cost in throughput: the same backlog (every message with an ordering key)
/// drained from an unordered and from an ordered subscription, by the raw client and by
/// sluice into SQLite.
async fn ordering_cost(
    admin: &Admin,
    config: &PubSubConfig,
    args: &LatencyArgs,
    run_id: u32,
) -> Result<(), BenchError> {
    println!();
    println!(
        "| backlog of {} messages, {} ordering keys | raw client msg/s | sluice msg/s | sluice / raw |",
        args.backlog, args.keys
    );
    println!("|---|---|---|---|");
    let mut sluice_rates = [0.0; 2];
    for ordered in [false, true] {
        let kind = if ordered { "ordered" } else { "unordered" };
        let mut rates = [0.0; 2];
        for (slot, reader) in [Reader::Raw, Reader::Sluice].into_iter().enumerate() {
            let name = format!("lat-{run_id}-backlog-{kind}-{slot}");
            let subscription = keyed_backlog(admin, &name, args, ordered).await?;
            let took = match reader {
                Reader::Raw => raw_drain(config, &subscription, args.backlog, args.streams).await?,
                Reader::Sluice => {
                    let source = PubSubSource::new(config.clone(), &subscription, args.streams)?;
                    sluice_drain(
                        Box::new(source),
                        args.backlog,
                        Backend::Sqlite,
                        "",
                        Progress::None,
                        None,
                    )
                    .await?
                    .wall
                }
            };
            rates[slot] = args.backlog as f64 / took.as_secs_f64().max(1e-9);
        }
        sluice_rates[usize::from(ordered)] = rates[1];
        println!(
            "| {kind} | {:.0} | {:.0} | {:.2} |",
            rates[0],
            rates[1],
            rates[1] / rates[0].max(1e-9)
        );
    }
    println!(
        "\nsluice ordered / unordered throughput: {:.2}",
        sluice_rates[1] / sluice_rates[0].max(1e-9)
    );
    Ok(())
}

/// A fresh topic `name` and its subscription `<name>-sub` (`ordered` or not); returns the
/// subscription's path.
async fn topic_and_subscription(
    admin: &Admin,
    name: &str,
    ordered: bool,
) -> Result<String, BenchError> {
    admin.create_topic(name).await?;
    Ok(admin
        .create_subscription_with(
            &format!("{name}-sub"),
            name,
            &SubscriptionSettings {
                ack_deadline_seconds: 60,
                message_ordering: ordered,
                ..SubscriptionSettings::default()
            },
        )
        .await?)
}

/// A topic and a subscription (`ordered` or not) holding `args.backlog` messages, message `i`
/// with ordering key `i mod keys`; returns the subscription's path.
async fn keyed_backlog(
    admin: &Admin,
    name: &str,
    args: &LatencyArgs,
    ordered: bool,
) -> Result<String, BenchError> {
    let subscription = topic_and_subscription(admin, name, ordered).await?;
    let publisher = admin.publisher(name).await?;
    let payload = Bytes::from(vec![b'x'; args.size]);
    for start in (0..args.backlog).step_by(10_000) {
        let end = (start + 10_000).min(args.backlog);
        let messages = (start..end).map(|i| {
            Message::new()
                .set_data(payload.clone())
                .set_ordering_key(format!("k{}", i % args.keys.max(1)))
        });
        sluice_engine::pubsub::publish_all(&publisher, messages).await?;
    }
    Ok(subscription)
}

/// Publishes at `rate` for `args.seconds` to a fresh topic read by `reader`; the latencies of
/// every message published after the first second.
async fn measure(
    admin: &Admin,
    config: &PubSubConfig,
    args: &LatencyArgs,
    name: &str,
    rate: u32,
    ordered: bool,
    reader: Reader,
) -> Result<Percentiles, BenchError> {
    let subscription = topic_and_subscription(admin, name, ordered).await?;
    let samples = Samples::default();
    let stop = CancellationToken::new();
    let (reading, store) = match reader {
        Reader::Raw => {
            let recording = samples.clone();
            let streams = crate::throughput::raw_streams(
                config.clone(),
                subscription,
                args.streams,
                stop.clone(),
                Arc::new(move |message: &Message| recording.record_message(message, now_us())),
            );
            (
                tokio::spawn(async move {
                    if let Err(error) = streams.await {
                        eprintln!("sluice bench: the raw client failed: {error}");
                    }
                }),
                None,
            )
        }
        Reader::Sluice => {
            let fresh = FreshStore::open(Backend::Sqlite, "").await?;
            let source = PubSubSource::new(config.clone(), &subscription, args.streams)?;
            let run = sluice_flow(&fresh, Box::new(source), samples.clone()).await?;
            let drain = stop.clone();
            (
                tokio::spawn(async move {
                    if let Err(error) = run.run(drain).await {
                        eprintln!("sluice bench: the flow failed: {error}");
                    }
                }),
                Some(fresh),
            )
        }
    };
    // Let the streams open before the clock starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let published = publish_steadily(admin, name, rate, args, ordered).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while samples.len() < published && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let _ = reading.await;
    drop(store);
    let got = samples.len();
    if got < published {
        return Err(BenchError::Stalled(format!(
            "{name}: {got} of {published} messages arrived"
        )));
    }
    Ok(samples.percentiles(u64::from(rate)))
}

/// Publishes `rate` messages a second for `args.seconds`, in 10 ms steps; returns how many.
async fn publish_steadily(
    admin: &Admin,
    topic: &str,
    rate: u32,
    args: &LatencyArgs,
    ordered: bool,
) -> Result<usize, BenchError> {
    let publisher = admin.publisher(topic).await?;
    let payload = Bytes::from(vec![b'x'; args.size]);
    let total = usize::try_from(u64::from(rate) * args.seconds).unwrap_or(usize::MAX);
    let started = Instant::now();
    let mut sent = 0usize;
    let mut confirmations = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while sent < total {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * f64::from(rate)) as usize).min(total);
        let mut pending = Vec::with_capacity(due.saturating_sub(sent));
        for i in sent..due {
            let mut message = Message::new()
                .set_data(payload.clone())
                .set_attributes([("i", i.to_string()), ("sent_us", now_us().to_string())]);
            if ordered {
                message = message.set_ordering_key(format!("k{}", i % args.keys.max(1)));
            }
            pending.push(publisher.publish(message));
        }
        sent = due;
        confirmations.spawn(futures::future::join_all(pending));
    }
    while let Some(joined) = confirmations.join_next().await {
        let results = joined.map_err(|e| BenchError::Stalled(e.to_string()))?;
        if let Some(Err(error)) = results.into_iter().find(Result::is_err) {
            return Err(BenchError::Stalled(format!("publish failed: {error}")));
        }
    }
    Ok(total)
}

/// A sluice flow from `source` into `fresh`, recording each committed message's latency.
async fn sluice_flow(
    fresh: &FreshStore,
    source: Box<dyn sluice_engine::MessageSource>,
    samples: Samples,
) -> Result<FlowRun, BenchError> {
    let timed = Arc::new(Timed {
        inner: fresh.store.clone(),
        samples,
    });
    let counters = Counters::new("bench", "ingest");
    let (run, _) = bench_flow(
        &fresh.store,
        timed,
        source,
        KeySource::MessageId,
        counters,
        None,
    )
    .await?;
    Ok(run)
}
