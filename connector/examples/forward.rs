//! Forwarding to a system outside the store, with the batch id as the idempotency key: each
//! batch is written to `OUT/<batch id>.jsonl` (the "other system"; writing the same batch
//! again replaces the same file), then settled: its dedup keys recorded and its messages acked.
//! Each message reaches the other system at least once and is settled once.
//!
//! ```text
//! cargo run -p sluice-connector --example forward -- \
//!     projects/my-project/subscriptions/events state/forward.db out/
//! ```
//!
//! A crash between the write and the settle gives the messages back: batched together again
//! they carry the same id and replace the same file, batched otherwise they are written again
//! under another id, so the other system drops repeats of a message's key too (as this one's
//! reader would); a message already settled is not handed out again.

use sluice_connector::prelude::*;
use std::io::Write;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let subscription = args.next().ok_or("SUBSCRIPTION")?;
    let (path, out) = (args.next().ok_or("DB")?, args.next().ok_or("OUT")?);
    std::fs::create_dir_all(&out)?;
    let job = Job::builder(subscription)
        .name("forward")
        .store(format!("sqlite://{path}"))
        .build()
        .await?;
    job.drain_on_signals();

    let mut stream = job.stream().await?;
    while let Some(batch) = stream.next_batch().await {
        let file = std::path::Path::new(&out).join(format!("{}.jsonl", batch.id()));
        let mut lines = Vec::new();
        for message in batch.messages() {
            writeln!(
                lines,
                "{{\"key\":{:?},\"data\":{:?}}}",
                message.key(),
                String::from_utf8_lossy(message.data())
            )?;
        }
        std::fs::write(&file, lines)?; // the other system, keyed by the batch id
        batch.settle().await;
    }
    stream.close().await;
    Ok(())
}
