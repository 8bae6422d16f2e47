//! The tracking reader dies holding what it was handed (issue 19, hole 6): two workers share a
//! PostgreSQL store at 200 msg/s; the holder of the flow's `watermark/ingest` lease is
//! SIGKILLed; the other takes the lease, seeks the tracking subscription back to the stored
//! horizon (so what the dead reader was handed and had not stored comes back at once) and goes
//! on. No row is late: every row committed after a sample of the stored watermark has an event
//! time of at least that sample, and every event is there once.
//!
//! Real: the emulator, two `sluice` workers, PostgreSQL on 127.0.0.1:5432 (a fresh database).
//! The emulator hands a killed stream's messages back after their ack deadline, so the test
//! waits for them.
#![allow(clippy::unwrap_used, missing_docs)]

use google_cloud_pubsub::model::Message;
use sluice_engine::pubsub::publish_all;
use sluice_tests::watermarks::{WatermarkHistory, WatermarkedPipeline, rows_behind, timed_event};
use sluice_tests::{PgDb, PubSub, Workdir, Worker, emulator, eventually, now_ms};
use std::time::{Duration, Instant};

fn holder(db: &PgDb) -> String {
    db.text(
        "SELECT COALESCE(MAX(holder), '') FROM sluice_leases
         WHERE pipeline = 'test' AND role = 'watermark/ingest' AND expires_at > now()",
    )
}

fn watermark(db: &PgDb) -> i64 {
    db.query(
        "SELECT COALESCE(MAX(w.watermark_ms), 0)::int8 FROM sluice_watermarks w
         JOIN sluice_flows f ON f.flow_id = w.flow_id WHERE f.flow = 'ingest'",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_tracking_reader_leaves_nothing_late() {
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let db = PgDb(database.url().to_owned());
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("wmhand", 1).await;
    let dir = Workdir::new();
    let file = dir.path().join("p.yaml");
    let yaml = WatermarkedPipeline {
        store: database.url().to_owned(),
        endpoint: emulator().endpoint(),
        metrics_port: None,
        subscription: &subs[0],
        target: "{ name: events, kind: table }",
    }
    .yaml();
    std::fs::write(&file, yaml).unwrap();
    let mut workers = vec![Worker::start(&file, "w0")];
    assert!(
        eventually(Duration::from_secs(60), || !holder(&db).is_empty()).await,
        "nobody reads the tracking subscription; logs:\n{}",
        workers[0].logs()
    );
    workers.push(Worker::start(&file, "w1"));
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;

    let history = {
        let db = PgDb(db.0.clone());
        WatermarkHistory::start(Duration::from_millis(200), move || watermark(&db))
    };
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let started = Instant::now();
    let mut sent = 0usize;
    let mut killed = None;
    let mut at_kill = 0;
    for tick in 0..400u32 {
        if tick == 150 {
            let reader = holder(&db);
            let index = workers
                .iter()
                .position(|w| reader.contains(&w.pid().to_string()))
                .unwrap_or_else(|| panic!("holder {reader:?} is none of the workers"));
            let worker = workers.remove(index);
            at_kill = watermark(&db);
            worker.kill9();
            killed = Some(reader);
        }
        let chunk: Vec<Message> = (0..20)
            .map(|i| {
                timed_event(
                    &format!("e{}", sent + i),
                    now_ms() - rand::random_range(0..5_000),
                )
            })
            .collect();
        sent += chunk.len();
        publish_all(&publisher, chunk).await.unwrap();
        tokio::time::sleep_until((started + Duration::from_millis(100) * (tick + 1)).into()).await;
    }
    let survivor = &workers[0];
    let rows = || db.query("SELECT count(DISTINCT dedup_key)::int8 FROM test__events");
    assert!(
        eventually(Duration::from_secs(420), || rows() == sent as i64).await,
        "rows {} of {sent}; survivor logs:\n{}",
        rows(),
        survivor.logs()
    );
    // The new reader moves the watermark on (a frozen one would pass this test trivially).
    assert!(
        eventually(Duration::from_secs(240), || watermark(&db)
            > at_kill + 20_000)
        .await,
        "the watermark stayed at {} after the handover (at the kill: {at_kill}); logs:\n{}",
        watermark(&db),
        survivor.logs()
    );
    let new_reader = holder(&db);
    let samples = history.finish();
    let (behind, first_behind) = rows_behind(&samples, |when, w| {
        db.query(&format!(
            "SELECT count(*)::int8 FROM test__events
             WHERE committed_at > to_timestamp({when} / 1000.0)
               AND event_time < to_timestamp({w} / 1000.0)"
        ))
    });
    println!(
        "{sent} events; reader {killed:?} killed, {new_reader:?} took over; {} samples, \
         watermark {} → {}",
        samples.len(),
        samples.first().map_or(0, |s| s.1),
        samples.last().map_or(0, |s| s.1)
    );
    assert_ne!(Some(new_reader.clone()), killed, "the lease did not move");
    assert_eq!(
        behind,
        0,
        "rows late after the handover: {first_behind:?}; at the kill {at_kill}; the rows \
         committed longest after their event time (publish, event, committed): {}; survivor \
         logs:\n{}",
        db.text(
            "SELECT string_agg(row, ', ') FROM (SELECT concat_ws(' ',
                 (extract(epoch FROM publish_time) * 1000)::int8,
                 (extract(epoch FROM event_time) * 1000)::int8,
                 (extract(epoch FROM committed_at) * 1000)::int8) AS row
             FROM test__events ORDER BY committed_at - event_time DESC LIMIT 30) late"
        ),
        survivor.logs()
    );
    assert!(
        survivor
            .logs()
            .contains("reading the tracking subscription")
    );
}
