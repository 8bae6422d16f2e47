//! Exactly once into your own PostgreSQL table: a count of events per customer, kept with an
//! upsert in the same transaction that records each event's dedup key.
//!
//! ```text
//! cargo run -p sluice-connector --example upsert_postgres -- \
//!     projects/my-project/subscriptions/events postgres://postgres@127.0.0.1/jobs
//! ```
//!
//! Each message carries attributes `event_id` (its identity: a publisher's retry repeats it)
//! and `customer`. Kill it at any moment and start it again: every customer's count equals
//! the number of distinct events published for them.

use sluice_connector::prelude::*;

struct CountPerCustomer;

#[async_trait::async_trait]
impl PostgresHandler for CountPerCustomer {
    async fn handle(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        batch: &NewMessages<'_>,
    ) -> Result<(), HandlerError> {
        // One statement for the batch: its events counted per customer, then added.
        let mut per_customer = std::collections::BTreeMap::<&str, i64>::new();
        for event in batch.iter() {
            *per_customer
                .entry(event.attribute("customer").unwrap_or("unknown"))
                .or_default() += 1;
        }
        let (customers, counts): (Vec<&str>, Vec<i64>) = per_customer.into_iter().unzip();
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (subscription, store) = (
        args.next().ok_or("SUBSCRIPTION")?,
        args.next().ok_or("STORE")?,
    );
    create_table(&store).await?;

    let job = Job::builder(subscription)
        .name("customer_events")
        .dedup(Dedup::by_attribute("event_id"))
        .store(store)
        .build()
        .await?;
    job.drain_on_signals();
    let report = job.run_postgres(CountPerCustomer).await?;
    println!(
        "{} events counted, {} duplicates dropped",
        report.rows, report.duplicates
    );
    Ok(())
}

/// The job's own table (the job owns its schema; sluice only adds its ledger beside it).
async fn create_table(store: &str) -> Result<(), Box<dyn std::error::Error>> {
    let (client, connection) = tokio_postgres::connect(store, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS customer_events (
                 customer TEXT PRIMARY KEY, events BIGINT NOT NULL)",
        )
        .await?;
    Ok(())
}
