//! A per-key counter in SQLite, exactly once: each new message adds one to its region's row,
//! in the transaction that records its dedup key.
//!
//! ```text
//! cargo run -p sluice-connector --example counter_sqlite -- \
//!     projects/my-project/subscriptions/events state/counter.db
//! ```

use sluice_connector::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (subscription, path) = (args.next().ok_or("SUBSCRIPTION")?, args.next().ok_or("DB")?);
    let job = Job::builder(subscription)
        .name("region_counts")
        .store(format!("sqlite://{path}"))
        .build()
        .await?;
    job.drain_on_signals();
    // The job's own table, in the same SQLite file as its ledger.
    rusqlite::Connection::open(&path)?.execute(
        "CREATE TABLE IF NOT EXISTS region_counts (region TEXT PRIMARY KEY, n INTEGER)",
        [],
    )?;

    let count = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
        for message in batch.iter() {
            tx.execute(
                "INSERT INTO region_counts (region, n) VALUES (?1, 1)
                 ON CONFLICT (region) DO UPDATE SET n = n + 1",
                [message.attribute("region").unwrap_or("")],
            )?;
        }
        Ok(())
    };
    let report = job.run_sqlite(count).await?;
    println!("{} messages counted", report.rows);
    Ok(())
}
