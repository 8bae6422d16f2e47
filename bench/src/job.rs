//! `sluice bench job`: a library job that upserts a count per customer in its own table (the
//! connector's `upsert_postgres` example's handler, and its SQLite twin) against the flow
//! `sluice run` builds into a plain table, each draining the same backlog on the emulator, in
//! the same run, alternating which goes first. The ratio is the job's rate over the plain
//! flow's; the lines of each example are counted as they are compiled in.

use crate::error::BenchError;
use crate::stores::{Backend, FreshStore, StoreChoice};
use sluice_connector::prelude::*;
use sluice_engine::{CommitThenAck, Counters, FlowRun, PubSubFlow, RunUntil};
use sluice_store::{FlowHandle, Layout, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// `sluice bench job`.
#[derive(Debug, Clone, clap::Args)]
pub struct JobArgs {
    /// Messages per drain.
    #[arg(long, default_value_t = 50_000)]
    pub messages: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Rounds per store (each: the job and the plain flow, alternating order).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// `sqlite`, or `postgres` for both stores.
    #[arg(long, value_enum, default_value_t = StoreChoice::Sqlite)]
    pub store: StoreChoice,
    /// The PostgreSQL server for `--store postgres` (a scratch database is made on it).
    #[arg(long, default_value = sluice_store::DEFAULT_SCRATCH_SERVER)]
    pub postgres: String,
}

/// Customers the backlog's messages belong to.
const CUSTOMERS: usize = 50;

/// The examples and their lines (neither blank nor comment).
const EXAMPLES: [(&str, &str); 3] = [
    (
        "upsert_postgres",
        include_str!("../../connector/examples/upsert_postgres.rs"),
    ),
    (
        "counter_sqlite",
        include_str!("../../connector/examples/counter_sqlite.rs"),
    ),
    (
        "forward",
        include_str!("../../connector/examples/forward.rs"),
    ),
];

/// Runs the benchmark and prints Markdown tables.
pub async fn job(args: JobArgs) -> Result<(), BenchError> {
    println!("# sluice bench job");
    println!(
        "messages {} x {} B, {CUSTOMERS} customers, rounds {}",
        args.messages, args.size, args.rounds
    );
    let (admin, config, _emulator) = crate::emulator_feed::emulator_feed(args.size).await?;
    println!("\n| store | round | plain table msg/s | upsert job msg/s | ratio |");
    println!("|---|---|---|---|---|");
    for backend in args.store.backends() {
        let mut ratios = Vec::new();
        for round in 0..args.rounds {
            let run_id: u32 = rand::random();
            let backlog = |name: &'static str| {
                let admin = &admin;
                async move {
                    crate::throughput::backlog_with(
                        admin,
                        &format!("job-{name}-{run_id}"),
                        args.messages,
                        args.size,
                        |i| vec![("customer", format!("c{}", i % CUSTOMERS))],
                    )
                    .await
                }
            };
            let (plain_sub, job_sub) = (backlog("plain").await?, backlog("upsert").await?);
            let plain = async {
                let store = FreshStore::open(backend, &args.postgres).await?;
                plain_drain(&store, &config, &plain_sub, args.messages).await
            };
            let upsert = async {
                let store = FreshStore::open(backend, &args.postgres).await?;
                job_drain(backend, &store, &config, &job_sub, args.messages).await
            };
            let (plain, upsert) = if round % 2 == 0 {
                let p = plain.await?;
                (p, upsert.await?)
            } else {
                let u = upsert.await?;
                (plain.await?, u)
            };
            let rate = |took: Duration| args.messages as f64 / took.as_secs_f64();
            let ratio = rate(upsert) / rate(plain);
            ratios.push(ratio);
            println!(
                "| {} | {} | {:.0} | {:.0} | {ratio:.2} |",
                backend.name(),
                round + 1,
                rate(plain),
                rate(upsert)
            );
        }
        let mean = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
        println!("| {} | mean | | | **{mean:.2}** |", backend.name());
    }
    println!("\n| example | lines (no blanks, no comments) |\n|---|---|");
    for (name, text) in EXAMPLES {
        let lines = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .count();
        println!("| `{name}` | {lines} |");
    }
    Ok(())
}

/// The flow `sluice run` builds for a Pub/Sub source into a table, until `n` rows committed.
async fn plain_drain(
    store: &FreshStore,
    config: &PubSubConfig,
    subscription: &str,
    n: usize,
) -> Result<Duration, BenchError> {
    let flow = prepare(&*store.store, "plain", vec!["events".to_owned()]).await?;
    let mut settings = PubSubFlow::new(subscription);
    settings.pubsub = config.clone();
    let parts = settings.parts()?;
    let stop = CancellationToken::new();
    let committer = CommitThenAck::new(
        store.store.clone(),
        flow.clone(),
        Arc::from("plain__events"),
        Arc::new(parts.stage),
        parts.retry,
        CancellationToken::new(),
    );
    let run = FlowRun {
        source: Box::new(parts.source),
        budget: parts.budget,
        dedup: parts.dedup,
        batch: parts.batch,
        committer,
        counters: Counters::new("plain", "plain"),
        until: RunUntil::Drained,
        drain_agreement: None,
    };
    let started = Instant::now();
    let running = tokio::spawn(run.run(stop.clone()));
    let took = until_committed(&*store.store, &flow, n, started).await?;
    stop.cancel();
    running
        .await
        .map_err(|e| BenchError::Store(e.to_string()))?
        .map_err(|e| BenchError::Store(e.to_string()))?;
    Ok(took)
}

/// The upsert job on the same backend, until `n` messages committed.
async fn job_drain(
    backend: Backend,
    store: &FreshStore,
    config: &PubSubConfig,
    subscription: &str,
    n: usize,
) -> Result<Duration, BenchError> {
    let bench_error = |e: JobError| BenchError::Store(e.to_string());
    let flow = prepare(&*store.store, "upsert", Vec::new()).await?;
    let job = Job::builder(subscription)
        .name("upsert")
        .pubsub(config.clone())
        .store(store.url())
        .build()
        .await
        .map_err(bench_error)?;
    let stop = job.stop_token();
    let started = Instant::now();
    let running = match backend {
        Backend::Postgres => {
            create_counts(store, "BIGINT").await?;
            tokio::spawn(job.run_postgres(Upsert))
        }
        Backend::Sqlite => {
            create_counts(store, "INTEGER").await?;
            tokio::spawn(job.run_sqlite(upsert_sqlite))
        }
    };
    let took = until_committed(&*store.store, &flow, n, started).await?;
    stop.cancel();
    running
        .await
        .map_err(|e| BenchError::Store(e.to_string()))?
        .map_err(bench_error)?;
    Ok(took)
}

/// The `upsert_postgres` example's handler: the batch's counts per customer, one statement.
struct Upsert;

#[async_trait::async_trait]
impl PostgresHandler for Upsert {
    async fn handle(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        batch: &NewMessages<'_>,
    ) -> Result<(), HandlerError> {
        let (customers, counts) = per_customer(batch);
        tx.execute(
            "INSERT INTO customer_events (customer, events)
             SELECT * FROM unnest($1::text[], $2::int8[])
             ON CONFLICT (customer) DO UPDATE SET events = customer_events.events + excluded.events",
            &[&customers, &counts],
        )
        .await?;
        Ok(())
    }
}

/// Its SQLite twin (a statement per customer: SQLite has no arrays).
fn upsert_sqlite(
    tx: &rusqlite::Transaction<'_>,
    batch: &NewMessages<'_>,
) -> Result<(), HandlerError> {
    let (customers, counts) = per_customer(batch);
    let mut upsert = tx.prepare_cached(
        "INSERT INTO customer_events (customer, events) VALUES (?1, ?2)
         ON CONFLICT (customer) DO UPDATE SET events = events + excluded.events",
    )?;
    for (customer, count) in customers.iter().zip(counts) {
        upsert.execute(rusqlite::params![customer, count])?;
    }
    Ok(())
}

/// The batch's events counted per customer.
fn per_customer<'a>(batch: &NewMessages<'a>) -> (Vec<&'a str>, Vec<i64>) {
    let mut counts = std::collections::BTreeMap::<&str, i64>::new();
    for event in batch.iter() {
        *counts
            .entry(event.attribute("customer").unwrap_or("unknown"))
            .or_default() += 1;
    }
    counts.into_iter().unzip()
}

/// The job's own table.
async fn create_counts(store: &FreshStore, integer: &str) -> Result<(), BenchError> {
    let sql = format!(
        "CREATE TABLE IF NOT EXISTS customer_events (customer TEXT PRIMARY KEY, events {integer} NOT NULL)"
    );
    store
        .execute(&sql)
        .await
        .map_err(|e| BenchError::Store(e.to_string()))
}

async fn prepare(
    store: &dyn Store,
    name: &str,
    tables: Vec<String>,
) -> Result<FlowHandle, BenchError> {
    let layout = Layout {
        pipeline: name.to_owned(),
        tables,
        typed: Vec::new(),
        flows: vec![name.to_owned()],
    };
    let mut handles = store
        .prepare(&layout)
        .await
        .map_err(|e| BenchError::Store(e.to_string()))?;
    handles
        .pop()
        .ok_or_else(|| BenchError::Store("no flow prepared".to_owned()))
}

/// Polls the flow's committed count until `n`; the time since `started` when it got there.
async fn until_committed(
    store: &dyn Store,
    flow: &FlowHandle,
    n: usize,
    started: Instant,
) -> Result<Duration, BenchError> {
    loop {
        let progress = store
            .flow_progress(flow)
            .await
            .map_err(|e| BenchError::Store(e.to_string()))?;
        if progress.committed + progress.duplicates >= n as u64 {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The examples counted are the example files, all of them.
#[cfg(test)]
mod tests {
    #[test]
    fn every_example_is_counted() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../connector/examples");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| {
                e.file_name()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_owned()
            })
            .collect();
        files.sort();
        let mut counted: Vec<&str> = super::EXAMPLES.iter().map(|(name, _)| *name).collect();
        counted.sort_unstable();
        assert_eq!(files, counted);
    }
}
