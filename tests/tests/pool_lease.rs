//! The single-holder role of a pool moves when its holder dies: two workers share a PostgreSQL
//! store whose ledger generations last 2 s; the holder of the `ledger_upkeep` lease is
//! SIGKILLed; the other takes the lease within the bound (lease life 15 s + one 5 s beat) and
//! goes on creating and dropping generations, while ingestion goes on.
//!
//! Real parts: the Pub/Sub emulator and PostgreSQL on 127.0.0.1:5432 (a fresh database).
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{PgDb, PostgresPipeline, Worker, event, eventually};
use std::time::{Duration, Instant};

/// Lease life plus one beat (worker/src/runtime/pool/membership.rs), and room for a loaded machine.
const TAKEOVER_BOUND: Duration = Duration::from_secs(20);
const SLACK: Duration = Duration::from_secs(10);

fn holder(db: &PgDb) -> String {
    db.text(
        "SELECT holder FROM sluice_leases
         WHERE pipeline = 'test' AND role = 'ledger_upkeep' AND expires_at > now()",
    )
}

/// Oldest and newest attached ledger generations.
fn generations(db: &PgDb) -> (i64, i64) {
    let range = db.text(
        "SELECT min(g) || ' ' || max(g) FROM (
             SELECT substring(c.relname FROM 16)::int8 AS g
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'sluice_ledger'::regclass) AS attached",
    );
    let mut parts = range.split(' ').map(|p| p.parse::<i64>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_lease_holder_is_replaced_within_the_bound_and_upkeep_goes_on() {
    let PostgresPipeline {
        database: _database,
        db,
        pubsub,
        topic,
        subscription: _,
        dir: _dir,
        file,
    } = PostgresPipeline::create("lease", "?ledger_generation=2s").await;
    let mut workers = vec![Worker::start(&file, "a"), Worker::start(&file, "b")];
    assert!(
        eventually(Duration::from_secs(60), || !holder(&db).is_empty()).await,
        "nobody took the lease; logs:\n{}",
        workers[0].logs()
    );
    let first = holder(&db);
    let index = workers
        .iter()
        .position(|w| first.contains(&format!("-{}-", w.pid())))
        .unwrap_or_else(|| panic!("holder {first} is none of the workers"));
    pubsub
        .publish(
            &topic,
            (0..500).map(|i| event(&format!("before{i}"))).collect(),
        )
        .await;
    assert!(eventually(Duration::from_secs(120), || db.rows() == 500).await);

    let killed_at = Instant::now();
    workers.remove(index).kill9();
    let moved = eventually(TAKEOVER_BOUND + SLACK, || {
        let now = holder(&db);
        !now.is_empty() && now != first
    })
    .await;
    let took = killed_at.elapsed();
    assert!(moved, "the lease did not move within {took:?}");
    let survivor = &workers[0];
    assert!(
        holder(&db).contains(&format!("-{}-", survivor.pid())),
        "the survivor holds the lease"
    );
    assert!(survivor.logs().contains("took the lease"));

    // Upkeep goes on under the new holder: the window of attached generations moves forward
    // (old ones dropped, new ones created), and ingestion continues. A commit also creates a
    // missing generation, so only the oldest moving shows the upkeep's drops. The first drop
    // may come late: in a fresh-clone CI run (2026-12-05) the newest had moved after a fixed
    // 12 s wait and the oldest not yet. Not diagnosed; a suspect is a holder killed inside
    // `DETACH PARTITION ... CONCURRENTLY`, whose server session runs the statement to its end
    // with the drop lock held. A failure prints the survivor's log to tell.
    let (oldest, newest) = generations(&db);
    pubsub
        .publish(
            &topic,
            (0..500).map(|i| event(&format!("after{i}"))).collect(),
        )
        .await;
    let upkeep_seen = Instant::now();
    let moved_on = eventually(Duration::from_secs(90), || {
        let (oldest_later, newest_later) = generations(&db);
        oldest_later > oldest && newest_later > newest
    })
    .await;
    let (oldest_later, newest_later) = generations(&db);
    assert!(
        moved_on,
        "generations {oldest}..{newest} then {oldest_later}..{newest_later}; survivor:\n{}",
        workers[0].logs()
    );
    eprintln!(
        "the oldest generation was dropped {:?} after the takeover was seen",
        upkeep_seen.elapsed()
    );
    assert!(eventually(Duration::from_secs(120), || db.rows() == 1_000).await);
    assert_eq!(db.distinct_keys(), 1_000);
    eprintln!("lease moved {took:?} after the kill (bound {TAKEOVER_BOUND:?})");
    let survivor = workers.remove(0);
    survivor.terminate();
    assert!(survivor.wait(Duration::from_secs(60)).success());
}
