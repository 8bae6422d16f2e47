//! A pool of three worker processes on one subscription and one PostgreSQL store: 60 000
//! distinct events plus 6 000 publisher duplicates, while a random worker is SIGKILLed every
//! few seconds and restarted. Redeliveries of a killed worker's messages reach the others, so
//! only the shared ledger can keep them from landing twice.
//!
//! Real parts: the Pub/Sub emulator and PostgreSQL on 127.0.0.1:5432 (a fresh database, dropped
//! at the end). Emulator stall (see ARCHITECTURE.md): a killed worker's messages come back
//! after their stream's ack deadline (10 s), so the timeouts leave room for that.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    PostgresPipeline, Worker, events_with_duplicates, eventually, publish_in_chunks, stop_all,
};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn three_workers_killed_at_random_land_every_key_exactly_once() {
    const DISTINCT: usize = 60_000;
    const DUPLICATES: usize = 6_000;
    const KILLS: usize = 8;
    let PostgresPipeline {
        database: _database,
        db,
        pubsub,
        topic,
        subscription,
        dir: _dir,
        file,
    } = PostgresPipeline::create("pool", "").await;

    let mut workers: Vec<Worker> = (0..3)
        .map(|i| Worker::start(&file, &format!("w{i}-0")))
        .collect();
    let messages = events_with_duplicates("p", DISTINCT, DUPLICATES);
    let publisher = publish_in_chunks(&topic, messages, 5_000, Duration::from_millis(500)).await;
    for kill in 1..=KILLS {
        tokio::time::sleep(Duration::from_millis(rand::random_range(2_000..5_000))).await;
        let victim = rand::random_range(0..workers.len());
        let name = format!("w{victim}-{kill}");
        let restarted = Worker::start(&file, &name);
        std::mem::replace(&mut workers[victim], restarted).kill9();
    }
    publisher.await.unwrap();

    let landed = eventually(Duration::from_secs(600), || db.rows() >= DISTINCT as i64).await;
    assert!(
        landed,
        "only {} of {DISTINCT} rows; logs of w0:\n{}",
        db.rows(),
        workers[0].logs()
    );
    // One ack deadline (10 s), so the last killed stream's redeliveries are mostly acked as
    // duplicates rather than left for the unacked check (which allows them: their rows exist).
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop_all(workers);
    db.assert_exactly_once(DISTINCT);
    let counted = db.query(
        "SELECT sum(committed)::int8 FROM sluice_flow_counters c
         JOIN sluice_flows f USING (flow_id) WHERE f.pipeline = 'test'",
    );
    assert_eq!(
        counted, DISTINCT as i64,
        "committed counters agree with the rows"
    );
    // A killed stream's messages come back from the emulator after their ack deadline: one
    // handed back after the last worker stopped stays unacked, though its event's row is there (CI saw one
    // of 110 000). What must never be left is a message whose event has no row.
    let left = sluice_tests::unacked_beside_control(&pubsub, &subscription, |m| {
        m.attributes.get("event_id").cloned()
    })
    .await;
    let without_row: Vec<&Option<String>> = left
        .iter()
        .filter(|event| {
            event.as_ref().is_none_or(|event| {
                db.query(&format!(
                    "SELECT count(*) FROM test__events WHERE dedup_key = '{event}'"
                )) == 0
            })
        })
        .collect();
    println!(
        "{} messages left unacked after the workers stopped",
        left.len()
    );
    assert!(
        without_row.is_empty(),
        "unacked messages without their row: {without_row:?}"
    );
}
