//! `sluice bench chain`: a flow fed by a table, against the ingest it follows, on each store,
//! in one run and without the emulator (an in-process source, 10 % duplicate keys):
//!
//! 1. **Rate.** The same backlog drained by the ingest flow alone (the baseline: source ->
//!    `events`) and by the chain (the ingest flow plus a flow following `events` into
//!    `copies`, both running); the chain's time ends when the last record is in `copies`.
//!    Rounds alternate which runs first; each reports the chain's rate as a ratio to the
//!    baseline's. With `--emulator` the backlogs are on a Pub/Sub emulator, as a deployed
//!    chain is fed (the source is then the bottleneck, as it is in production); without, the
//!    in-process source drives each store at its saturation, where the chain does twice the
//!    store's work of the ingest alone.
//! 2. **Downstream lag** at a steady rate (`--lag-rate`, 5 000 msg/s by default): for every
//!    record, its commit time in `copies` minus its commit time in `events`, as each store
//!    records them (the committing batch's time), p50 and p99.

use crate::BenchError;
use crate::emulator_feed::{STREAMS, emulator_feed};
use crate::stores::{Backend, FreshStore, StoreChoice};
use crate::typed::TypedShape;
use sluice_engine::pubsub::Admin;
use sluice_engine::{
    BatchSettings, Budget, CommitThenAck, Counters, DEFAULT_POLL, DedupSettings, FlowRun,
    InProcessSource, KeySource, MessageSource, PubSubConfig, PubSubSource, RetrySettings, RunUntil,
    TableSource, TableStage,
};
use sluice_store::{FlowHandle, Layout, ReadPosition, Store, table_name};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Give up on a measurement that takes longer than this.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Options of `sluice bench chain`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChainArgs {
    /// Messages per rate measurement.
    #[arg(long, default_value_t = 200_000)]
    pub messages: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Rounds of the rate pair (baseline then chain in odd rounds, chain then baseline in even
    /// ones).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Messages per second of the lag measurement.
    #[arg(long, default_value_t = 5_000.0)]
    pub lag_rate: f64,
    /// Seconds the lag measurement publishes for.
    #[arg(long, default_value_t = 20)]
    pub lag_seconds: u64,
    /// Stores to measure: `sqlite`, or `postgres` (measures PostgreSQL and SQLite side by side).
    #[arg(long, value_enum, default_value_t = StoreChoice::Sqlite)]
    pub store: StoreChoice,
    /// Administrative URL of the PostgreSQL server that holds the scratch databases.
    #[arg(long, default_value = sluice_store::DEFAULT_SCRATCH_SERVER)]
    pub postgres: String,
    /// Feed the rate measurement from Pub/Sub backlogs on an emulator (started here, or
    /// `PUBSUB_EMULATOR_HOST`; 16 streams), as a deployed chain is fed, instead of the
    /// in-process source (which measures the stores at saturation).
    #[arg(long)]
    pub emulator: bool,
    /// Typed tables: the ingest decodes JSON orders into 5 columns (`sluice bench typed`'s
    /// shape) and the follower is a typed flow over them (a `select:` and a `where:`) into a
    /// typed table of 3 columns.
    #[arg(long)]
    pub typed: bool,
}

/// Where the rate measurement's messages come from.
enum Feed {
    InProcess,
    Emulator {
        admin: Admin,
        config: PubSubConfig,
        run_id: u32,
        _emulator: Option<crate::Emulator>,
    },
}

impl Feed {
    async fn open(args: &ChainArgs) -> Result<Self, BenchError> {
        if !args.emulator {
            return Ok(Feed::InProcess);
        }
        let (admin, config, emulator) = emulator_feed(args.size).await?;
        Ok(Feed::Emulator {
            admin,
            config,
            run_id: rand::random(),
            _emulator: emulator,
        })
    }

    /// A source of `n` messages: generated, or a fresh backlog on the emulator (every key
    /// distinct there: the ledger sees only redeliveries).
    async fn source(
        &self,
        name: &str,
        n: usize,
        size: usize,
        typed: bool,
    ) -> Result<(Box<dyn MessageSource>, u64), BenchError> {
        match self {
            Feed::InProcess if typed => Ok((Box::new(crate::typed::orders(n)), distinct(n))),
            Feed::InProcess => Ok((
                Box::new(InProcessSource::generated(n, size, key_of)),
                distinct(n),
            )),
            Feed::Emulator {
                admin,
                config,
                run_id,
                ..
            } => {
                let name = format!("{name}-{run_id}");
                let subscription = if typed {
                    crate::throughput::backlog_of(admin, &name, n, |i| {
                        let (key, json) = crate::typed::order_json(i);
                        google_cloud_pubsub::model::Message::new()
                            .set_data(bytes::Bytes::from(json))
                            .set_attributes([("key", key)])
                    })
                    .await?
                } else {
                    crate::throughput::backlog(admin, &name, n, size).await?
                };
                let wanted = if typed { distinct(n) } else { n as u64 };
                let source = PubSubSource::new(config.clone(), &subscription, STREAMS)?;
                Ok((Box::new(source), wanted))
            }
        }
    }
}

/// Every tenth message repeats an earlier key, as a publisher retry would.
fn key_of(i: usize) -> String {
    if i % 10 == 9 {
        format!("k{}", i / 10)
    } else {
        format!("k{i}")
    }
}

fn distinct(n: usize) -> u64 {
    (0..n).filter(|i| i % 10 != 9).count() as u64
}

/// Runs the benchmark and prints Markdown tables.
pub async fn chain(args: ChainArgs) -> Result<(), BenchError> {
    println!("# sluice bench chain");
    println!(
        "messages {} x {} B (10 % duplicate keys), rounds {}, lag at {:.0} msg/s for {} s{}",
        args.messages,
        args.size,
        args.rounds,
        args.lag_rate,
        args.lag_seconds,
        if args.typed {
            "; typed: JSON orders into 5 columns, then a select + where into 3"
        } else {
            ""
        }
    );
    let feed = Feed::open(&args).await?;
    for backend in args.store.backends() {
        println!();
        println!(
            "| {} round | ingest only msg/s | ingest -> table -> table msg/s | ratio |",
            backend.name()
        );
        println!("|---|---|---|---|");
        let mut ratios = Vec::new();
        for round in 1..=args.rounds {
            let mut baseline = Duration::ZERO;
            let mut chained = Duration::ZERO;
            let chain_first = round % 2 == 0;
            for chain in [chain_first, !chain_first] {
                let name = format!(
                    "chain-{}-{round}-{}",
                    backend.name().to_lowercase(),
                    if chain { "chain" } else { "ingest" }
                );
                let (source, wanted) = feed
                    .source(&name, args.messages, args.size, args.typed)
                    .await?;
                let took = drain(
                    backend,
                    &args.postgres,
                    source,
                    args.messages,
                    wanted,
                    Shape {
                        chain,
                        typed: args.typed,
                    },
                )
                .await?;
                if chain {
                    chained = took.wall;
                } else {
                    baseline = took.wall;
                }
            }
            let (base_rate, chain_rate) = (
                args.messages as f64 / baseline.as_secs_f64(),
                args.messages as f64 / chained.as_secs_f64(),
            );
            ratios.push(chain_rate / base_rate);
            println!(
                "| {round} | {base_rate:.0} | {chain_rate:.0} | {:.2} |",
                chain_rate / base_rate
            );
        }
        let mean = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
        println!(
            "\nmean ratio chain / ingest only on {}: {mean:.2}",
            backend.name()
        );
        let n = (args.lag_rate * args.lag_seconds as f64) as usize;
        let source: Box<dyn MessageSource> = if args.typed {
            Box::new(crate::typed::orders(n).with_rate(args.lag_rate))
        } else {
            Box::new(InProcessSource::generated(n, args.size, key_of).with_rate(args.lag_rate))
        };
        let shape = Shape {
            chain: true,
            typed: args.typed,
        };
        let measured = drain(backend, &args.postgres, source, n, distinct(n), shape).await?;
        let mut lags = measured.lags_ms;
        lags.sort_unstable();
        let at = |q: f64| lags.get(((lags.len() as f64 - 1.0) * q) as usize).copied();
        println!(
            "\ndownstream lag on {} at {:.0} msg/s ({} records): p50 {} ms, p99 {} ms, max {} ms",
            backend.name(),
            args.lag_rate,
            lags.len(),
            at(0.5).unwrap_or_default(),
            at(0.99).unwrap_or_default(),
            lags.last().copied().unwrap_or_default()
        );
    }
    Ok(())
}

/// One drain's result.
struct Drained {
    wall: Duration,
    /// For a chain: each record's commit-to-commit lag, ms.
    lags_ms: Vec<i64>,
}

/// What a drain runs: the ingest alone or the chain; envelope or typed tables.
#[derive(Debug, Clone, Copy)]
struct Shape {
    chain: bool,
    typed: bool,
}

/// Drains `source` (`n` messages, `wanted` distinct keys) into a fresh store: the ingest flow
/// alone, or with a flow following its table (`shape.chain`); ends when the last message is
/// acked, or for a chain when the last record is in the last table.
async fn drain(
    backend: Backend,
    postgres_server: &str,
    source: Box<dyn MessageSource>,
    n: usize,
    wanted: u64,
    shape: Shape,
) -> Result<Drained, BenchError> {
    let chain = shape.chain;
    let store_error = |e: sluice_store::StoreError| BenchError::Store(e.to_string());
    let fresh = FreshStore::open(backend, postgres_server).await?;
    let store = fresh.store.clone();
    let (events_shape, copies_shape) = if shape.typed {
        (
            Some(crate::typed::orders_shape()),
            Some(crate::typed::silver_shape()),
        )
    } else {
        (None, None)
    };
    let flows = store
        .prepare(&Layout {
            pipeline: "bench".into(),
            tables: vec!["events".into(), "copies".into()],
            typed: events_shape
                .iter()
                .chain(&copies_shape)
                .map(|t| t.table.clone())
                .collect(),
            flows: vec!["ingest".into(), "copy".into(), "probe".into()],
        })
        .await
        .map_err(store_error)?;
    let events = table_name("bench", "events").map_err(store_error)?;
    let copies = table_name("bench", "copies").map_err(store_error)?;
    let stop = CancellationToken::new();
    let ingest_counters = Counters::new("bench", "ingest");
    let copy_counters = Counters::new("bench", "copy");
    let started = Instant::now();
    let mut runs = vec![tokio::spawn(
        flow_run(
            source,
            KeySource::Attribute {
                name: "key".into(),
                dead_letter_if_missing: false,
            },
            &store,
            &flows[0],
            &events,
            ingest_counters.clone(),
            events_shape.as_ref(),
        )
        .run(stop.clone()),
    )];
    if chain {
        let follower =
            TableSource::new(store.clone(), flows[1].clone(), events.as_str()).follow(DEFAULT_POLL);
        runs.push(tokio::spawn(
            flow_run(
                Box::new(follower),
                KeySource::MessageId,
                &store,
                &flows[1],
                &copies,
                copy_counters.clone(),
                copies_shape.as_ref(),
            )
            .run(stop.clone()),
        ));
    }
    let finished = loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let done = if chain {
            copy_counters.snapshot().committed >= wanted
        } else {
            ingest_counters.snapshot().acked >= n as u64
        };
        if done {
            break Ok(started.elapsed());
        }
        if started.elapsed() > TIMEOUT {
            break Err(BenchError::Stalled(format!(
                "ingest committed {}, copy {} of {wanted}",
                ingest_counters.snapshot().committed,
                copy_counters.snapshot().committed
            )));
        }
    };
    stop.cancel();
    for run in runs {
        let _ = run.await;
    }
    let wall = finished?;
    let lags_ms = if chain {
        lags(&*store, &flows[2], &events, &copies).await?
    } else {
        Vec::new()
    };
    drop(fresh);
    Ok(Drained { wall, lags_ms })
}

/// A flow's run as the worker builds one for a table target (batches of 1 000 or 50 ms), keyed
/// as given: the ingest by its `key` attribute, the copy by message id (`<flow>/<key>`), as
/// the worker keys a flow reading a table; a typed flow with its decoder and query.
fn flow_run(
    source: Box<dyn MessageSource>,
    key: KeySource,
    store: &Arc<dyn Store>,
    flow: &FlowHandle,
    table: &str,
    counters: Counters,
    typed: Option<&TypedShape>,
) -> FlowRun {
    let mut committer = CommitThenAck::new(
        store.clone(),
        flow.clone(),
        Arc::from(table),
        Arc::new(TableStage {
            fields: typed.map(|t| t.fields.clone()),
            ..TableStage::default()
        }),
        RetrySettings {
            max_attempts: 5,
            dedup_window: Duration::from_secs(600),
            commit_bound: None,
            give_up_after: None,
        },
        CancellationToken::new(),
    );
    if let Some(typed) = typed {
        committer = committer.with_typed(typed.query.clone());
    }
    FlowRun {
        source,
        budget: Budget::new(10_000, 100 << 20),
        dedup: DedupSettings {
            key,
            window: Duration::from_secs(600),
        },
        batch: BatchSettings {
            max_messages: 1_000,
            max_delay: Duration::from_millis(50),
        },
        committer,
        counters,
        until: RunUntil::Drained,
        drain_agreement: None,
    }
}

/// Every record's commit time in `copies` minus its commit time in `events`, ms, read through
/// the store's own feed reads by a flow (`probe`) that commits nothing.
async fn lags(
    store: &dyn Store,
    probe: &FlowHandle,
    events: &str,
    copies: &str,
) -> Result<Vec<i64>, BenchError> {
    let upstream: HashMap<String, i64> = commit_times(store, probe, events)
        .await?
        .into_iter()
        .map(|(flow, key, at)| (format!("{flow}/{key}"), at))
        .collect();
    Ok(commit_times(store, probe, copies)
        .await?
        .into_iter()
        .filter_map(|(_, key, at)| upstream.get(&key).map(|before| at - before))
        .collect())
}

/// `(flow, dedup key, commit time)` of every row of `table`.
async fn commit_times(
    store: &dyn Store,
    probe: &FlowHandle,
    table: &str,
) -> Result<Vec<(String, String, i64)>, BenchError> {
    let store_error = |e: sluice_store::StoreError| BenchError::Store(e.to_string());
    let mut at: ReadPosition = store
        .plan_range(
            probe,
            table,
            &store
                .read_position(probe, table)
                .await
                .map_err(store_error)?,
        )
        .await
        .map_err(store_error)?;
    let mut rows = Vec::new();
    loop {
        let page = store
            .read_range(table, &at, 10_000)
            .await
            .map_err(store_error)?;
        let Some(last) = page.last() else {
            return Ok(rows);
        };
        at.after = Some(last.cursor);
        rows.extend(
            page.into_iter()
                .map(|r| (r.row.flow, r.row.dedup_key, r.committed_at_ms)),
        );
    }
}
