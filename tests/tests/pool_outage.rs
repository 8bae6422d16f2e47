//! PostgreSQL is stopped for 15 seconds in the middle of a run and started again: two workers
//! retry their commits with backoff (acking nothing meanwhile, their Pub/Sub leases extended),
//! recover by themselves, and every distinct key lands exactly once.
//!
//! Real parts: the Pub/Sub emulator and a PostgreSQL server of this test's own (the machine's
//! release, a fresh cluster on a free port), stopped and started with `pg_ctl`, so the tests
//! that run meanwhile keep the machine's server.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    PostgresPipeline, PrivatePostgres, PubSub, Worker, events_with_duplicates, eventually, stop_all,
};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
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
    tokio::time::sleep(Duration::from_secs(20)).await;
    let logs = stop_all(workers);
    db.assert_exactly_once(DISTINCT);
    let all_logs = logs.join("\n");
    assert!(
        all_logs.contains("store unavailable; retrying the commit"),
        "commits were retried during the outage:\n{all_logs}"
    );
    assert!(all_logs.contains("store reachable again"), "{all_logs}");
    let left = sluice_tests::unacked_messages(&pubsub, &subscription, 0).await;
    assert!(left.is_empty(), "{} messages left unacked", left.len());
}
