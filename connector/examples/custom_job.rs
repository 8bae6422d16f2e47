//! A custom streaming job that runs its own first stage on sluice's deduplicated batches and
//! commits through sluice's store, so it inherits exactly-once and ack-after-commit.
//!
//! ```text
//! PUBSUB_EMULATOR_HOST=127.0.0.1:8085 cargo run -p sluice-connector --example custom_job -- \
//!     projects/my-project/subscriptions/orders-sub
//! ```
//!
//! The job upper-cases each payload (its "first stage") and writes the result as a row of the
//! table `custom__orders` in `state/custom.db`. Each batch's rows and dedup keys go into one
//! transaction; only after it commits does `settle_committed` ack the batch's messages. A crash
//! anywhere before that leaves the messages unacked: Pub/Sub redelivers them and the ledger
//! drops the ones that did commit. Stop it with Ctrl-C: it drains, then exits.

use bytes::Bytes;
use sluice_connector::{
    BatchSettings, BatchSource, Budget, Counters, DedupSettings, KeySource, PubSubConfig,
    PubSubSource, now_ms,
};
use sluice_store::{CommitBatch, Effect, Entry, Layout, MessageFields, SqliteStore, table_name};
use sluice_store::{FlowStore, LedgerStore};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let subscription = std::env::args()
        .nth(1)
        .ok_or("usage: custom_job projects/P/subscriptions/S")?;
    let store = SqliteStore::open(std::path::Path::new("state/custom.db"))?;
    let flow = store
        .prepare(&Layout {
            pipeline: "custom".into(),
            tables: vec!["orders".into()],
            flows: vec!["uppercase".into()],
        })
        .await?
        .remove(0);
    let table: Arc<str> = Arc::from(table_name("custom", "orders")?);
    let window = Duration::from_secs(600);

    let stop = CancellationToken::new();
    let source = PubSubSource::new(PubSubConfig::default(), &subscription, 4)?;
    let (mut batches, handle) = BatchSource::start(
        Box::new(source),
        Budget::new(10_000, 100 << 20),
        DedupSettings {
            key: KeySource::MessageId,
            window,
        },
        BatchSettings {
            max_messages: 500,
            max_delay: Duration::from_millis(50),
        },
        Counters::new("custom", "uppercase"),
        stop.clone(),
    )
    .await?;
    let ctrl_c = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        ctrl_c.cancel();
    });

    while let Some(batch) = batches.next_batch().await {
        // The job's own first stage: one upper-cased row per message.
        let entries = batch
            .deliveries()
            .iter()
            .map(|d| Entry {
                key: d.key.clone(),
                message: MessageFields {
                    message_id: d.message.message_id.clone(),
                    publish_time_ms: d.message.publish_time_ms,
                    attributes_json: "{}".into(),
                    data: Bytes::from(d.message.data.to_ascii_uppercase()),
                },
                effect: Effect::Row {
                    event_time_ms: d.message.publish_time_ms,
                },
            })
            .collect();
        let now = now_ms();
        let commit = CommitBatch {
            flow: flow.clone(),
            table: table.clone(),
            entries,
            now_ms: now,
            expires_at_ms: now + window.as_millis() as i64,
            hook: None,
            watermark_progress: false,
            commit_by_ms: None,
            position: None,
            position_gate: None,
            work: None,
        };
        match store.commit(commit).await {
            // Committed: now, and only now, ack (duplicates included).
            Ok(outcome) => {
                let new = outcome.written.iter().filter(|w| **w).count();
                println!(
                    "batch {}: {new} new rows, {} duplicates",
                    batch.id,
                    batch.len() - new
                );
                batch.settle_committed();
            }
            // Not committed: give the messages back for redelivery (or retry, as CommitThenAck does).
            Err(error) => {
                eprintln!("batch {}: commit failed ({error}); nacking", batch.id);
                batch.abandon();
            }
        }
    }
    handle.close().await;
    Ok(())
}
