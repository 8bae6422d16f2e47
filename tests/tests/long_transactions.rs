//! The commit bound holds for long transactions: it is checked as the transaction commits, not
//! when it starts, and the keys it won are kept for the window from then.
//!
//! Two library jobs of one name share a store (one flow, one ledger) with a 30 s dedup window,
//! each on its own subscription of one topic, so each receives its copy of the one event
//! published (a publisher's duplicate, as far as the ledger can tell). Job `a`'s transaction is
//! held up in its handler for 45 s: on PostgreSQL a test session holds a lock on the handler's
//! table, on SQLite the handler itself takes that long. Job `b` starts 32 s after the publish,
//! past the window from `a`'s start, so its statement would take over a key whose expiry was
//! stamped when `a` began. `a`'s copy is then 45 s old, past its commit bound (24 s): its
//! transaction must roll back and give the copy back; `b`'s commits. The event counts once.
//! (Before the fix both committed: the count was 2.)
//!
//! Real parts: the Pub/Sub emulator, PostgreSQL on 127.0.0.1:5432 (a fresh database) or a
//! SQLite file, the library's `Job` in this process.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_connector::prelude::*;
use sluice_tests::{PubSub, Workdir, event, eventually};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_secs(30);
/// How long job `a`'s transaction is held up.
const HELD: Duration = Duration::from_secs(45);
/// When job `b` starts, after the publish: past the window from `a`'s start.
const B_STARTS: Duration = Duration::from_secs(32);

/// Handler calls of one job, and whether its first call is held up.
#[derive(Default)]
struct Calls {
    count: AtomicUsize,
}

impl Calls {
    fn called(&self) -> usize {
        self.count.fetch_add(1, Ordering::SeqCst)
    }
    fn seen(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

fn job_builder(pubsub: &PubSub, subscription: &str, store: &str) -> sluice_connector::JobBuilder {
    Job::builder(pubsub.config.subscription_path(subscription).unwrap())
        .name("counter")
        .pubsub(pubsub.config.clone())
        .dedup(Dedup::by_attribute("event_id").window(WINDOW))
        .store(store.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_handler_held_past_the_bound_rolls_back_and_the_event_counts_once() {
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let (client, connection) = tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute("CREATE TABLE seen (event_id TEXT PRIMARY KEY, n INT NOT NULL)")
        .await
        .unwrap();
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("longtx", 2).await;

    // The lock the handler will wait for.
    client
        .batch_execute("BEGIN; LOCK TABLE seen IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let handler = |calls: Arc<Calls>| {
        postgres_handler(move |tx, new| {
            let calls = calls.clone();
            Box::pin(async move {
                calls.called();
                for message in new.iter() {
                    tx.execute(
                        "INSERT INTO seen (event_id, n) VALUES ($1, 1)
                         ON CONFLICT (event_id) DO UPDATE SET n = seen.n + 1",
                        &[&message.attribute("event_id").unwrap_or_default()],
                    )
                    .await?;
                }
                Ok(())
            })
        })
    };
    let (a_calls, b_calls) = (Arc::new(Calls::default()), Arc::new(Calls::default()));
    // Both built (their tables prepared) before a's transaction is open: preparing a store's
    // tables waits for transactions that write them.
    let a = job_builder(&pubsub, &subscriptions[0], database.url())
        .build()
        .await
        .unwrap();
    let b = job_builder(&pubsub, &subscriptions[1], database.url())
        .build()
        .await
        .unwrap();
    let (a_stop, b_stop) = (a.stop_token(), b.stop_token());
    let a_run = tokio::spawn(a.run_postgres(handler(a_calls.clone())));
    let published = Instant::now();
    pubsub.publish(&topic, vec![event("e1")]).await;
    assert!(
        eventually(Duration::from_secs(20), || a_calls.seen() > 0).await,
        "job a never got its copy"
    );
    tokio::time::sleep_until(published + B_STARTS).await;
    let b_run = tokio::spawn(b.run_postgres(handler(b_calls.clone())));
    // b's commit waits for a's uncommitted key (a itself waits for the lock): the timing this
    // test is about, seen from the server.
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    // Watched from another session: within the locking transaction, pg_stat_activity would
    // show the snapshot of its first read.
    let (watch, connection) = tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut both_waiting = false;
    while Instant::now() < published + HELD {
        let n: i64 = watch.query_one(waiting, &[]).await.unwrap().get(0);
        both_waiting |= n >= 2;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        both_waiting,
        "b's commit never waited behind a's transaction"
    );
    client.batch_execute("COMMIT").await.unwrap();
    assert!(
        eventually(Duration::from_secs(30), || b_calls.seen() > 0).await,
        "job b's copy never reached its handler"
    );

    let counted = || async {
        client
            .query_opt("SELECT n FROM seen WHERE event_id = 'e1'", &[])
            .await
            .unwrap()
            .map(|row| row.get::<_, i32>(0))
    };
    let mut n = None;
    for _ in 0..200 {
        n = counted().await;
        if n.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Whatever is still in flight settles (a's copy comes back as a duplicate).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let settled = counted().await;
    a_stop.cancel();
    b_stop.cancel();
    let (a_report, b_report) = (a_run.await.unwrap().unwrap(), b_run.await.unwrap().unwrap());
    println!(
        "a: {} calls, {a_report:?}; b: {} calls, {b_report:?}; count {n:?} then {settled:?}",
        a_calls.seen(),
        b_calls.seen()
    );
    assert_eq!(settled, Some(1), "the event counted once");
    assert_eq!(a_report.rows + b_report.rows, 1, "one row committed in all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sqlite_handler_that_runs_past_the_bound_rolls_back_and_the_event_counts_once() {
    let dir = Workdir::new();
    let path = dir.path().join("jobs.db");
    let store = format!("sqlite://{}", path.display());
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("longtx-sqlite", 2).await;
    let (a_calls, b_calls) = (Arc::new(Calls::default()), Arc::new(Calls::default()));
    let handler = |calls: Arc<Calls>, held: Option<Duration>| {
        move |tx: &rusqlite::Transaction<'_>, new: &NewMessages<'_>| {
            if calls.called() == 0
                && let Some(held) = held
            {
                // The first call of job a: work that takes longer than the bound.
                std::thread::sleep(held);
            }
            tx.execute(
                "CREATE TABLE IF NOT EXISTS seen (event_id TEXT PRIMARY KEY, n INT NOT NULL)",
                [],
            )?;
            for message in new.iter() {
                tx.execute(
                    "INSERT INTO seen (event_id, n) VALUES (?1, 1)
                     ON CONFLICT (event_id) DO UPDATE SET n = n + 1",
                    [message.attribute("event_id").unwrap_or_default()],
                )?;
            }
            Ok::<_, HandlerError>(())
        }
    };
    // Both built (their tables prepared) before a's transaction holds the file's write lock.
    let a = job_builder(&pubsub, &subscriptions[0], &store)
        .build()
        .await
        .unwrap();
    let b = job_builder(&pubsub, &subscriptions[1], &store)
        .build()
        .await
        .unwrap();
    let (a_stop, b_stop) = (a.stop_token(), b.stop_token());
    let published = Instant::now();
    let a_run = tokio::spawn(a.run_sqlite(handler(a_calls.clone(), Some(HELD))));
    pubsub.publish(&topic, vec![event("e1")]).await;
    assert!(
        eventually(Duration::from_secs(20), || a_calls.seen() > 0).await,
        "job a never got its copy"
    );
    tokio::time::sleep_until(published + B_STARTS).await;
    let b_run = tokio::spawn(b.run_sqlite(handler(b_calls.clone(), None)));
    // b's first transaction waits for a's write lock (45 s from a's first call), then for its
    // own retries' backoff; what it must not do is count the event twice, however long it
    // takes. (A loaded CI run, 2026-12-05, had no call of b's handler within 60 s of its start;
    // alone it comes about 14 s after: the time is printed to tell the two apart next time.)
    assert!(
        eventually(Duration::from_secs(150), || b_calls.seen() > 0).await,
        "job b's copy never reached its handler"
    );
    println!(
        "b's handler first called {:.1} s after the publish",
        published.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(15)).await;
    a_stop.cancel();
    b_stop.cancel();
    let (a_report, b_report) = (a_run.await.unwrap().unwrap(), b_run.await.unwrap().unwrap());
    let n: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT n FROM seen WHERE event_id = 'e1'", [], |row| {
            row.get(0)
        })
        .unwrap();
    println!(
        "a: {} calls, {a_report:?}; b: {} calls, {b_report:?}; count {n}",
        a_calls.seen(),
        b_calls.seen()
    );
    assert_eq!(n, 1, "the event counted once");
    assert_eq!(a_report.rows + b_report.rows, 1, "one row committed in all");
}
