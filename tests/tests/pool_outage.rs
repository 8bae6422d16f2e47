//! PostgreSQL is stopped for 15 seconds in the middle of a run and started again: two workers
//! retry their commits with backoff (acking nothing meanwhile), their heartbeats fail past the
//! self-fence (12 s after the last good one was sent), so each stops its flows and gives back
//! what it held; when the store answers again they start their flows by themselves, and every
//! distinct key lands exactly once, with nothing left unacked.
//!
//! A soak (`#[ignore]`, README "soak"): on the emulator a restarted flow's new streams receive
//! nothing for 2-3 minutes after the old ones closed (ARCHITECTURE.md, "Pub/Sub client facts we
//! build on"), and a nack sent after a stream's lease loop ended is dropped by the client, so that
//! message comes back only when its lease runs out (the client extends leases by at most 60 s):
//! the test waits [`REDELIVERY_SETTLES`] after the last row lands before it stops the workers,
//! then reads the subscription for what is left unacked (240 s); about 7 minutes in all.
//!
//! Real parts: the Pub/Sub emulator and a PostgreSQL server of this test's own (the machine's
//! release, a fresh cluster on a free port), stopped and started with `pg_ctl`, so the tests
//! that run meanwhile keep the machine's server.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    PostgresPipeline, PrivatePostgres, PubSub, Worker, events_with_duplicates, eventually, stop_all,
};
use std::time::Duration;

/// How long the workers keep running after the last row landed, so that a committed message
/// whose ack or nack was lost comes back and is acked: the client's longest lease extension
/// (60 s) and the subscription's ack deadline (10 s), with room to spare.
const REDELIVERY_SETTLES: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a soak of about 7 minutes: run with the README's soak command"]
async fn a_fifteen_second_database_outage_loses_nothing_and_duplicates_nothing() {
    const DISTINCT: usize = 20_000;
    const DUPLICATES: usize = 2_000;
    let server = PrivatePostgres::start();
    let PostgresPipeline {
        database: _database,
        db,
        pubsub,
        topic,
        subscription,
        dir: _dir,
        file,
    } = {
        let database = sluice_store::ScratchDatabase::create_on(&server.admin_url())
            .await
            .unwrap();
        PostgresPipeline::on(database, "outage", "").await
    };
    let mut workers = vec![Worker::start(&file, "a"), Worker::start(&file, "b")];
    let messages = events_with_duplicates("o", DISTINCT, DUPLICATES);
    let publisher = {
        let pubsub = PubSub::connect().await;
        let topic = topic.clone();
        let chunks: Vec<_> = messages.chunks(1_000).map(|c| c.to_vec()).collect();
        tokio::spawn(async move {
            for chunk in chunks {
                pubsub.publish(&topic, chunk).await;
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        })
    };
    assert!(eventually(Duration::from_secs(120), || db.rows() > 2_000).await);

    server.stop();
    assert!(!server.is_ready());
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        workers.iter_mut().all(Worker::is_running),
        "workers survive the outage"
    );
    server.resume();
    publisher.await.unwrap();

    let landed = eventually(Duration::from_secs(600), || db.rows() >= DISTINCT as i64).await;
    assert!(landed, "only {} of {DISTINCT} rows", db.rows());
    tokio::time::sleep(REDELIVERY_SETTLES).await;
    let logs = stop_all(workers);
    db.assert_exactly_once(DISTINCT);
    let all_logs = logs.join("\n");
    assert!(
        all_logs.contains("store unavailable; retrying the commit"),
        "commits were retried during the outage:\n{all_logs}"
    );
    assert!(all_logs.contains("store reachable again"), "{all_logs}");
    assert!(
        all_logs.contains("heartbeats failed past the fence"),
        "the outage outlasted the self-fence and stopped the flows:\n{all_logs}"
    );
    let left = sluice_tests::unacked_messages(&pubsub, &subscription, 0).await;
    assert!(
        left.is_empty(),
        "{} messages left unacked (their rows are stored: exactly once held): {:?}",
        left.len(),
        left.iter().take(20).collect::<Vec<_>>()
    );
}
