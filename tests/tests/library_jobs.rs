//! Library jobs (`sluice_connector::Job`): the connector's examples, run as their own processes
//! against the real emulator, and a job in this process whose handler fails on one message.
//!
//! * `upsert_postgres` on a real PostgreSQL under SIGKILL: 20 000 events of 50 customers plus
//!   2 000 publisher duplicates (same `event_id`, new message id), the process killed five
//!   times while it commits (each kill after the table grew while that life ran alone): every
//!   customer's count in the job's own table is exactly its number of distinct events (a
//!   duplicate applied twice, or an event lost, would show).
//! * `counter_sqlite` and `forward` (stream-style, settled batches) each take a backlog and
//!   drain on SIGTERM: every message counted or forwarded once.
//! * A SQLite job whose handler refuses one message: the others commit, that one is
//!   dead-lettered with the handler's error, and the job's table has no trace of it.
#![allow(clippy::unwrap_used, missing_docs)]

use bytes::Bytes;
use google_cloud_pubsub::model::Message;
use rand::seq::SliceRandom;
use sluice_connector::prelude::*;
use sluice_tests::{Db, PgDb, PubSub, Workdir, Worker, eventually, publish_in_chunks};
use std::path::Path;
use std::time::Duration;

/// Event `i` of customer `i % 50`, keyed by `event_id`.
fn customer_event(i: usize) -> Message {
    Message::new()
        .set_data(Bytes::from(format!("{{\"n\":{i}}}")))
        .set_attributes([
            ("event_id", format!("e{i}")),
            ("customer", format!("c{}", i % 50)),
        ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upsert_example_counts_each_event_once_under_sigkill() {
    const EVENTS: usize = 20_000;
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("upsert", 1).await;
    let subscription = pubsub.config.subscription_path(&subscriptions[0]).unwrap();
    let dir = Workdir::new();
    let mut messages: Vec<Message> = (0..EVENTS).map(customer_event).collect();
    for _ in 0..EVENTS / 10 {
        messages.push(customer_event(rand::random_range(0..EVENTS)));
    }
    messages.shuffle(&mut rand::rng());
    // 220 chunks over about 66 s: the backlog lasts through every life (with 33 s, five lives
    // under load could outlast it now that the emulator gives a killed life's messages back
    // within seconds).
    let publishing = publish_in_chunks(&topic, messages, 100, Duration::from_millis(300)).await;
    let counted = || db.query("SELECT COALESCE(SUM(events), 0) FROM customer_events");
    // Each life connects as `application_name=lifeN`, so the test sees which process is in a
    // transaction.
    let store_of = |name: &str| format!("{}?application_name={name}", database.url());
    let start = |name: &str| {
        let store = store_of(name);
        Worker::example(
            "upsert_postgres",
            &[subscription.as_str(), store.as_str()],
            dir.path(),
            name,
        )
    };
    let sessions = |name: &str, filter: &str| {
        db.query(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}' {filter}"
        ))
    };

    // Each life's successor opens its streams before the life is killed, as a pool's replicas
    // would be. A life is killed when PostgreSQL shows it inside a transaction, after the table
    // grew while it ran alone; watched over one open session every 5 ms (a `psql` per look
    // missed a short commit in the typed tables' crash test once the emulator was fast).
    let (watch, session) = tokio_postgres::connect(database.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(session);
    const KILLS: usize = 5;
    let mut kills = Vec::new();
    let mut job = start("life0");
    let mut alone_from = 0;
    for life in 0..KILLS {
        let name = format!("life{life}");
        assert!(
            eventually(Duration::from_secs(180), || counted() > alone_from).await,
            "{name} committed nothing on its own:\n{}",
            job.logs()
        );
        let successor = format!("life{}", life + 1);
        let next = start(&successor);
        // Connected to the store: its job is built, and its streams open right after.
        assert!(
            eventually(Duration::from_secs(60), || sessions(&successor, "") > 0).await,
            "{successor} never connected:\n{}",
            next.logs()
        );
        tokio::time::sleep(Duration::from_millis(rand::random_range(1_000..2_000))).await;
        // Aimed: killed right after a sighting.
        let aim_until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let seen: i64 = watch
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE application_name = $1 AND xact_start IS NOT NULL",
                    &[&name],
                )
                .await
                .unwrap()
                .get(0);
            if seen > 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < aim_until,
                "{name} was never seen in a transaction"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let at = counted();
        job.kill9();
        kills.push((alone_from, at));
        // A commit the killed process had sent lands first: then only the successor adds.
        tokio::time::sleep(Duration::from_millis(300)).await;
        alone_from = counted();
        job = next;
    }
    publishing.await.unwrap();
    let last = job;
    assert!(
        // The killed streams' messages after their ack deadline, then the backlog on a loaded
        // machine.
        eventually(Duration::from_secs(600), || counted() == EVENTS as i64).await,
        "{} of {EVENTS} counted, {} dead-lettered:\n{}",
        counted(),
        db.query("SELECT COUNT(*) FROM customer_events__dead_letter"),
        last.logs()
    );
    last.terminate();
    assert!(last.wait(Duration::from_secs(60)).success());

    println!("kills (counted when the life ran alone, when it was killed): {kills:?}");
    assert_eq!(kills.len(), KILLS);
    assert!(
        kills
            .iter()
            .all(|(before, at)| before < at && *at < EVENTS as i64),
        "every kill landed after the life committed on its own, before the end: {kills:?}"
    );
    assert_eq!(db.query("SELECT COUNT(*) FROM customer_events"), 50);
    assert_eq!(
        db.query("SELECT COUNT(*) FROM customer_events WHERE events <> 400"),
        0,
        "each customer counts its 400 distinct events: {}",
        db.text("SELECT string_agg(customer || '=' || events, ' ') FROM customer_events")
    );
    assert_eq!(
        db.query("SELECT COUNT(*) FROM customer_events__dead_letter"),
        0
    );
}

/// Publishes `n` messages, `region` attribute `r{i % 10}`.
async fn publish_regions(pubsub: &PubSub, topic: &str, n: usize) {
    let messages = (0..n)
        .map(|i| {
            Message::new()
                .set_data(Bytes::from(format!("m{i}")))
                .set_attributes([("region", format!("r{}", i % 10))])
        })
        .collect();
    pubsub.publish(topic, messages).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_counter_and_forward_examples_take_each_message_once() {
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("examples", 2).await;
    let counter_sub = pubsub.config.subscription_path(&subscriptions[0]).unwrap();
    let forward_sub = pubsub.config.subscription_path(&subscriptions[1]).unwrap();
    publish_regions(&pubsub, &topic, 1_000).await;
    let dir = Workdir::new();
    let counter_db = dir.path().join("counter.db");
    let forward_db = dir.path().join("forward.db");
    let out = dir.path().join("out");
    let counter = Worker::example(
        "counter_sqlite",
        &[&counter_sub, counter_db.to_str().unwrap()],
        dir.path(),
        "counter",
    );
    let forward = Worker::example(
        "forward",
        &[
            &forward_sub,
            forward_db.to_str().unwrap(),
            out.to_str().unwrap(),
        ],
        dir.path(),
        "forward",
    );
    let counts = Db(counter_db.clone());
    let forwarded = || forwarded_lines(&out);
    assert!(
        eventually(Duration::from_secs(120), || {
            counts.query("SELECT COALESCE(SUM(n), 0) FROM region_counts") == 1_000
                && forwarded().len() == 1_000
        })
        .await,
        "counter {}, forward {}:\n{}\n{}",
        counts.query("SELECT COALESCE(SUM(n), 0) FROM region_counts"),
        forwarded().len(),
        counter.logs(),
        forward.logs()
    );
    for job in [counter, forward] {
        job.terminate();
        let exit = job.wait(Duration::from_secs(60));
        assert!(exit.success(), "{exit:?}");
    }
    assert_eq!(
        counts.query("SELECT COUNT(*) FROM region_counts WHERE n <> 100"),
        0,
        "100 a region"
    );
    let mut keys = forwarded();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 1_000, "each message forwarded once");
}

/// The keys of every line the `forward` example wrote.
fn forwarded_lines(out: &Path) -> Vec<String> {
    let Ok(files) = std::fs::read_dir(out) else {
        return Vec::new();
    };
    files
        .flatten()
        .flat_map(|file| {
            std::fs::read_to_string(file.path())
                .unwrap_or_default()
                .lines()
                .map(|line| {
                    let value: serde_json::Value = serde_json::from_str(line).unwrap();
                    value["key"].as_str().unwrap().to_owned()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_refuses_one_message_dead_letters_it_and_keeps_no_trace() {
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("refuse", 1).await;
    let messages = (0..100)
        .map(|i| sluice_tests::event(&format!("e{i}")))
        .collect();
    pubsub.publish(&topic, messages).await;
    let dir = Workdir::new();
    let path = dir.path().join("job.db");
    let job = Job::builder(pubsub.config.subscription_path(&subscriptions[0]).unwrap())
        .name("refusing")
        .pubsub(pubsub.config.clone())
        .dedup(Dedup::by_attribute("event_id"))
        .store(format!("sqlite://{}", path.display()))
        .max_attempts(3)
        .build()
        .await
        .unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("CREATE TABLE seen (event_id TEXT PRIMARY KEY)", [])
        .unwrap();
    let stop = job.stop_token();
    let record = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
        for message in batch.iter() {
            let id = message.attribute("event_id").unwrap_or_default();
            tx.execute("INSERT INTO seen (event_id) VALUES (?1)", [id])?;
            if id == "e13" {
                return Err(HandlerError::rejected("refusing e13"));
            }
        }
        Ok(())
    };
    let running = tokio::spawn(job.run_sqlite(record));
    let db = Db(path.clone());
    assert!(
        eventually(Duration::from_secs(120), || {
            db.query("SELECT COUNT(*) FROM seen") == 99
                && db.query("SELECT COUNT(*) FROM refusing__dead_letter") == 1
        })
        .await,
        "seen {}, dead letters {}",
        db.query("SELECT COUNT(*) FROM seen"),
        db.query("SELECT COUNT(*) FROM refusing__dead_letter")
    );
    stop.cancel();
    let report = running.await.unwrap().unwrap();
    assert_eq!((report.rows, report.dead_letters), (99, 1));
    assert_eq!(
        db.query("SELECT COUNT(*) FROM seen WHERE event_id = 'e13'"),
        0,
        "no trace of the refused message"
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let (key, reason, error): (String, String, String) = conn
        .query_row(
            "SELECT dedup_key, reason, error FROM refusing__dead_letter",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap();
    assert_eq!((key.as_str(), reason.as_str()), ("e13", "max_attempts"));
    assert!(error.contains("refusing e13"), "{error}");
}

/// Stream style with a watermark: batches pulled one by one carry their messages' event times
/// (the `ts` attribute) and, once the tracking subscription has spoken, the job's watermark;
/// each is committed with the job's own writes; a drain hands out what was received, then the
/// stream ends and closes. Every event once in the job's table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_style_job_sees_event_times_and_its_watermark_and_drains() {
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("streamjob", 1).await;
    let dir = Workdir::new();
    let path = dir.path().join("stream.db");
    let job = Job::builder(pubsub.config.subscription_path(&subscriptions[0]).unwrap())
        .name("streamed")
        .pubsub(pubsub.config.clone())
        .dedup(Dedup::by_attribute("event_id"))
        .event_time_attribute("ts")
        .watermark(Duration::from_secs(10))
        .store(format!("sqlite://{}", path.display()))
        .build()
        .await
        .unwrap();
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("CREATE TABLE events (id TEXT PRIMARY KEY, ts INTEGER)", [])
        .unwrap();
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let publishing = tokio::spawn(async move {
        sluice_tests::watermarks::publish_steadily(&publisher, "s", 2, 200).await
    });
    let mut stream = job.stream().await.unwrap();
    let (mut event_times_match, mut watermark_seen, mut committed) = (true, false, 0);
    let mut drained = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        // Drain once everything is in (checked at least each second, since the last batch may
        // come before the publisher's task ends), or at the deadline, so that a stuck job fails
        // with figures.
        let everything_in = publishing.is_finished() && committed >= 400;
        if !drained && (everything_in || tokio::time::Instant::now() >= deadline) {
            println!("draining: everything in {everything_in}");
            stream.drain();
            drained = true;
        }
        let batch = match tokio::time::timeout(Duration::from_secs(1), stream.next_batch()).await {
            Ok(Some(batch)) => batch,
            Ok(None) => break,
            Err(_) => continue,
        };
        for message in batch.messages() {
            let ts: u64 = message.attribute("ts").unwrap().parse().unwrap();
            let event = message
                .event_time()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            event_times_match &= event.as_millis() as u64 == ts;
        }
        watermark_seen |= batch.watermark().is_some();
        let insert = |tx: &rusqlite::Transaction<'_>, batch: &NewMessages<'_>| {
            for message in batch.iter() {
                let ts = message
                    .event_time()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64;
                tx.execute(
                    "INSERT INTO events (id, ts) VALUES (?1, ?2)",
                    rusqlite::params![message.key(), ts],
                )?;
            }
            Ok(())
        };
        committed += batch.commit_with_sqlite(insert).await.unwrap().rows;
    }
    stream.close().await;
    let published = publishing.await.unwrap();
    println!("committed {committed} of {published}; watermark seen {watermark_seen}");
    assert!(drained, "the stream ended only after the drain");
    assert!(
        event_times_match,
        "every message's event time is its ts attribute"
    );
    assert!(watermark_seen, "batches carried the job's watermark");
    assert_eq!(committed as usize, published);
    let db = Db(path);
    assert_eq!(db.query("SELECT COUNT(*) FROM events"), published as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_postgresql_commits_with_a_closure_handler() {
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    db.text("CREATE TABLE orders (id TEXT PRIMARY KEY)");
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("pgclosure", 1).await;
    pubsub
        .publish(&topic, sluice_tests::events_with_duplicates("o", 300, 30))
        .await;
    let job = Job::builder(pubsub.config.subscription_path(&subscriptions[0]).unwrap())
        .name("orders_job")
        .pubsub(pubsub.config.clone())
        .dedup(Dedup::by_attribute("event_id"))
        .store(database.url())
        .build()
        .await
        .unwrap();
    let stop = job.stop_token();
    let mut stream = job.stream().await.unwrap();
    let mut rows = 0;
    while let Some(batch) = stream.next_batch().await {
        let insert = postgres_handler(|tx, new| {
            Box::pin(async move {
                for order in new.iter() {
                    tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&order.key()])
                        .await?;
                }
                Ok(())
            })
        });
        rows += batch.commit_with_postgres(insert).await.unwrap().rows;
        if rows >= 300 {
            stop.cancel(); // drain: the stream ends after what it holds
        }
    }
    stream.close().await;
    assert_eq!(rows, 300);
    assert_eq!(db.query("SELECT COUNT(*) FROM orders"), 300);
}
