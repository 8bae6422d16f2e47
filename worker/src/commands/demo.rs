//! `sluice demo`: the quickstart. Starts an emulator (unless `PUBSUB_EMULATOR_HOST` names one),
//! writes a file of order history (with repeated ids and an undecodable line) and publishes a
//! live stream with publisher duplicates, out-of-order event times and a few bad timestamps,
//! then runs a triggered backfill-then-live pipeline (`depends_on`) into SQLite and checks each
//! flow's result against what was written and published.

use crate::runtime::flow::outcome::FlowState;
use crate::runtime::kit::signals;
use crate::runtime::supervisor::execute;
use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use rand::Rng;
use sluice_bench::Emulator;
use sluice_engine::pubsub::{Admin, publish_all};
use sluice_engine::{PubSubConfig, now_ms};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

const PROJECT: &str = "sluice-demo";
/// Event times are shuffled within this many ms (inside the default 10 s watermark band).
const EVENT_TIME_JITTER_MS: i64 = 8_000;
/// How long the triggered run waits on an empty subscription before it calls it drained.
const DRAIN_IDLE: &str = "3s";
/// Messages published with an unparseable timestamp, to show dead letters.
const BAD_TIMESTAMPS: usize = 5;
/// Live orders with a negative amount: the `positive_amount` expectation drops them.
const BAD_AMOUNTS: usize = 5;
const REGIONS: [&str; 3] = ["eu", "us", "apac"];
/// Lines of the history file that are not records (dead letters of the backfill).
const BAD_LINES: usize = 1;

/// Runs the demo; exit 0 when what landed matches what was published.
pub async fn demo(events: usize, dir: &Path) -> ExitCode {
    match demo_inner(events, dir).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("sluice demo: {error}");
            ExitCode::from(1)
        }
    }
}

async fn demo_inner(events: usize, dir: &Path) -> Result<bool, Box<dyn std::error::Error>> {
    let (_emulator, endpoint) = match std::env::var("PUBSUB_EMULATOR_HOST") {
        Ok(host) => (None, format!("http://{host}")),
        Err(_) => {
            println!("starting the Pub/Sub emulator ...");
            let emulator = Emulator::start()?;
            let endpoint = emulator.endpoint();
            (Some(emulator), endpoint)
        }
    };
    println!("emulator at {endpoint}");
    let config = PubSubConfig {
        project: Some(PROJECT.to_owned()),
        endpoint: Some(endpoint.clone()),
    };
    let admin = Admin::connect(&config).await?;
    let run_id: u32 = rand::random();
    let topic = format!("orders-{run_id:08x}");
    let subscription = format!("{topic}-sub");
    admin.create_topic(&topic).await?;
    admin.create_subscription(&subscription, &topic, 30).await?;

    let duplicates = events / 10;
    let mut rng = rand::rng();
    let now = now_ms();
    let mut messages = Vec::with_capacity(events + duplicates + BAD_TIMESTAMPS + BAD_AMOUNTS);
    for i in 0..events {
        let ts = now - rng.random_range(0..EVENT_TIME_JITTER_MS);
        messages.push(event(i, &format!("order-{i}"), &amount(i), &ts.to_string()));
    }
    for _ in 0..duplicates {
        // A publisher retry: same order id, new Pub/Sub message id.
        let i = rng.random_range(0..events.max(1));
        messages.push(event(
            i,
            &format!("order-{i}"),
            &amount(i),
            &now.to_string(),
        ));
    }
    for i in 0..BAD_TIMESTAMPS {
        messages.push(event(i, &format!("broken-{i}"), "1", "not-a-timestamp"));
    }
    for i in 0..BAD_AMOUNTS {
        messages.push(event(i, &format!("refund-{i}"), "-1.50", &now.to_string()));
    }
    let publisher = admin.publisher(&topic).await?;
    let published = Instant::now();
    publish_all(&publisher, messages).await?;
    println!(
        "published {} messages to {topic}: {events} orders, {duplicates} publisher duplicates \
         (same order_id, new message id), {BAD_TIMESTAMPS} with a bad timestamp, {BAD_AMOUNTS} \
         with a negative amount ({:.1}s)",
        events + duplicates + BAD_TIMESTAMPS + BAD_AMOUNTS,
        published.elapsed().as_secs_f64()
    );

    std::fs::create_dir_all(dir)?;
    let history = events / 4;
    let history_dir = dir.join("history");
    std::fs::create_dir_all(&history_dir)?;
    std::fs::write(
        history_dir.join("orders-0001.jsonl"),
        history_file(history, now),
    )?;
    println!(
        "wrote {history} past orders to {} (plus {} repeated ids and {BAD_LINES} line that is not a record)",
        history_dir.join("orders-0001.jsonl").display(),
        history / 10
    );
    let db = dir.join("demo.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let pipeline_file = dir.join("pipeline.yaml");
    std::fs::write(&pipeline_file, pipeline_yaml(&endpoint, &subscription))?;
    println!("pipeline file: {}", pipeline_file.display());
    let pipeline = sluice_pipeline::load_for_run(&pipeline_file).map_err(|e| e.to_string())?;

    let shutdown = signals::install()?;
    let started = Instant::now();
    let outcomes = execute(&pipeline, &shutdown, None).await?;
    let took = started.elapsed().as_secs_f64();
    let mut ok = true;
    for outcome in &outcomes {
        let c = outcome.counters;
        let (rows, dead, what) = if outcome.name == "orders_backfill" {
            (history, BAD_LINES, "reason undecodable")
        } else {
            (
                events,
                BAD_TIMESTAMPS + BAD_AMOUNTS,
                "reasons bad_timestamp, expectation:positive_amount",
            )
        };
        let from_file = outcome.name == "orders_backfill";
        println!("flow {}: {}", outcome.name, outcome.state.name());
        if from_file {
            println!(
                "  records read  {:>7}  (history lines; the {} skipped ones are not read)",
                c.received, outcome.skipped
            );
        } else {
            println!("  received      {:>7}  (redeliveries included)", c.received);
        }
        println!(
            "  rows written  {:>7}  (expected {rows}: one per order)",
            c.committed
        );
        println!(
            "  duplicates    {:>7}  (memory tier {}, store ledger {})",
            c.duplicates_memory + c.duplicates_store,
            c.duplicates_memory,
            c.duplicates_store
        );
        println!(
            "  dead letters  {:>7}  (expected {dead}: {what})",
            c.dead_lettered
        );
        if outcome.skipped > 0 {
            println!(
                "  skipped       {:>7}  (repeated ids already committed, not read again)",
                outcome.skipped
            );
        }
        if !from_file {
            println!(
                "  acked         {:>7}  (every message, after its commit)",
                c.acked
            );
        }
        ok &= outcome.state == FlowState::Completed
            && c.committed == rows as u64
            && c.dead_lettered == dead as u64;
    }
    println!(
        "{took:.1}s in all, including {DRAIN_IDLE} of idle time to decide the subscription is \
         drained; orders_live started only when orders_backfill had completed"
    );
    println!(
        "\nlook inside: sqlite3 -header {} \\\n  'SELECT region, COUNT(*) AS orders, ROUND(SUM(amount), 2) AS amount FROM demo__orders GROUP BY region'",
        db.display()
    );
    println!(
        "             sqlite3 {} 'SELECT dedup_key, reason, error FROM demo__dead_letter'",
        db.display()
    );
    println!(
        "{}",
        if ok {
            "demo: exactly once ✔"
        } else {
            "demo: MISMATCH ✘"
        }
    );
    Ok(ok)
}

/// Order `i`'s amount: 5.00 to 99.99.
fn amount(i: usize) -> String {
    format!("{}.{:02}", 5 + i % 95, i % 100)
}

fn event(i: usize, order_id: &str, amount: &str, ts: &str) -> Message {
    let region = REGIONS[i % REGIONS.len()];
    let body =
        format!("{{\"order_id\":\"{order_id}\",\"amount\":{amount},\"region\":\"{region}\"}}");
    Message::new()
        .set_data(Bytes::from(body))
        .set_attributes([("order_id", order_id.to_owned()), ("ts", ts.to_owned())])
}

/// `n` past orders, one JSON record a line, with every tenth id repeated at the end and one
/// line that is not a record.
fn history_file(n: usize, now: i64) -> String {
    let line = |i: usize| {
        format!(
            "{{\"id\":\"past-{i}\",\"data\":{{\"order_id\":\"past-{i}\",\"amount\":7,\"region\":\"history\"}},\"event_time\":{}}}\n",
            now - 86_400_000 + i as i64
        )
    };
    let mut text: String = (0..n).map(line).collect();
    text.extend((0..n).step_by(10).map(line));
    text.push_str("this line is not a record\n");
    text
}

/// The demo's pipeline file; its store and history paths are beside it (`demo.db`, `history/`).
fn pipeline_yaml(endpoint: &str, subscription: &str) -> String {
    format!(
        "# Written by `sluice demo`. Relative paths are beside this file.
pipeline: demo
mode: triggered
store: sqlite://demo.db
pubsub:
  project: {PROJECT}
  endpoint: {endpoint}
targets:
  - name: orders
    kind: table
    columns:
      - {{ name: order_id, type: text, nullable: false }}
      - {{ name: amount, type: numeric }}
      - {{ name: region, type: text }}
flows:
  - name: orders_backfill
    target: orders
    once: true
    source: {{ file: {{ path: \"history/*.jsonl\" }} }}
    decode: {{ format: json }}
  - name: orders_live
    target: orders
    depends_on: orders_backfill
    source:
      pubsub:
        subscription: {subscription}
        dedup: {{ by: attribute, attribute: order_id, window: 10m }}
        event_time: {{ attribute: ts }}
        batch: {{ max_messages: 1000, max_delay: 50ms }}
        drain_idle: {DRAIN_IDLE}
    decode: {{ format: json }}
    expect:
      - {{ name: positive_amount, check: \"amount > 0\", on_violation: drop }}
"
    )
}
