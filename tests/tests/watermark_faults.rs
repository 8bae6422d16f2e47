//! Event-time watermarks when the world is not kind (issue 19), on the real emulator with a
//! `sluice` worker and SQLite, checked against the rows themselves as in `watermark.rs`: for
//! every sampled `(t, W)`, every in-band row committed after `t` has an event time of at least
//! `W`.
//!
//! 1. **Old events beside live traffic**: 50 msg/s live for two minutes, plus one event 60 s
//!    old (six times the 10 s band) every 5 s, as offline devices send. The old events are
//!    late by definition and counted so, while the watermark keeps moving: all along it trails
//!    the clock by at most the band plus a few seconds. (Before the fix the flow had no
//!    watermark at all: each old event held the horizon for the band.)
//! 2. **The tracking stream silent for 60 s**: the worker reaches Pub/Sub through a TCP proxy
//!    that blackholes every connection for 60 s at 20 msg/s, into a 5 s window target. No row
//!    is late (the watermark holds while the tracking reader's probes cannot come back), and
//!    the window counts add up to what was published. (Before the fix the horizon moved with
//!    the clock over messages nobody had received: 99 rows late.) Fake: the outage, by a
//!    [`sluice_tests::FaultProxy`] between the worker and the emulator.
#![allow(clippy::unwrap_used, missing_docs)]

use google_cloud_pubsub::model::Message;
use sluice_bench::free_port;
use sluice_connector::engine::pubsub::publish_all;
use sluice_tests::watermarks::{WatermarkHistory, WatermarkedPipeline, rows_behind, timed_event};
use sluice_tests::{
    Db, FaultProxy, PubSub, Workdir, Worker, emulator, eventually, flow_metric, now_ms,
};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const BAND_MS: i64 = 10_000;

/// The flow's stored watermark (0: none yet).
fn watermark(db: &Db) -> i64 {
    db.query(
        "SELECT COALESCE(MAX(w.watermark_ms), 0) FROM sluice_watermarks w \
         JOIN sluice_flows f ON f.flow_id = w.flow_id WHERE f.flow = 'ingest'",
    )
}

/// Samples the stored watermark every 100 ms.
fn history(db: &Path) -> WatermarkHistory {
    let db = Db(db.to_owned());
    WatermarkHistory::start(Duration::from_millis(100), move || watermark(&db))
}

/// Every sample is at most the event time of every in-band row (ids not starting with `old`)
/// committed after it. Returns how many rows broke it, and the first one.
fn behind_the_watermark(db: &Db, samples: &[(i64, i64)]) -> (i64, Option<String>) {
    rows_behind(samples, |when, watermark| {
        db.query(&format!(
            "SELECT COUNT(*) FROM test__events WHERE flow = 'ingest' AND committed_at > {when} \
             AND event_time < {watermark} AND dedup_key NOT LIKE '%old%'"
        ))
    })
}

/// A pipeline reading `subscription` into `test__events`, a table, or with `windowed`, a 5 s
/// window target (whose base table has the same name).
fn pipeline(
    dir: &Path,
    endpoint: &str,
    metrics_port: u16,
    subscription: &str,
    windowed: bool,
) -> std::path::PathBuf {
    let file = dir.join("p.yaml");
    let target = if windowed {
        concat!(
            "{ name: events, kind: window, ",
            "window: { size: 5s, group_by: \"attribute:region\", allowed_lateness: 1s } }"
        )
    } else {
        "{ name: events, kind: table }"
    };
    let text = WatermarkedPipeline {
        store: format!("sqlite://{}", dir.join("db").display()),
        endpoint: endpoint.to_owned(),
        metrics_port: Some(metrics_port),
        subscription,
        target,
    }
    .yaml();
    std::fs::write(&file, text).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_events_are_late_while_the_watermark_keeps_moving() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("wmold", 1).await;
    let dir = Workdir::new();
    let db_path = dir.path().join("db");
    let db = Db(db_path.clone());
    let metrics_port = free_port().unwrap();
    let file = pipeline(
        dir.path(),
        &emulator().endpoint(),
        metrics_port,
        &subs[0],
        false,
    );
    let worker = Worker::start(&file, "old");
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;
    let history = history(&db_path);
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let started = Instant::now();
    let (mut live, mut old) = (0usize, 0usize);
    let mut ages = Vec::new();
    for tick in 0..1200u32 {
        let mut chunk: Vec<Message> = (0..5)
            .map(|i| {
                timed_event(
                    &format!("live{}", live + i),
                    now_ms() - rand::random_range(0..5_000),
                )
            })
            .collect();
        live += chunk.len();
        if tick % 50 == 0 {
            chunk.push(timed_event(&format!("old{old}"), now_ms() - 6 * BAND_MS));
            old += 1;
        }
        publish_all(&publisher, chunk).await.unwrap();
        if tick % 10 == 0 {
            let w = watermark(&db);
            ages.push((tick / 10, if w > 0 { (now_ms() - w) / 1000 } else { -1 }));
        }
        tokio::time::sleep_until((started + Duration::from_millis(100) * (tick + 1)).into()).await;
    }
    // While traffic flows: the watermark trails the clock by the band plus a few seconds,
    // from its first value on (10 s in, to leave the start out).
    println!("watermark age each second (s, -1: none): {ages:?}");
    let worst = ages.iter().skip(10).map(|(_, age)| *age).max().unwrap();
    let none = ages.iter().skip(10).filter(|(_, age)| *age < 0).count();
    assert!(
        none == 0 && worst <= (BAND_MS + 8_000) / 1000,
        "over two minutes of traffic the watermark was up to {worst} s old (band {BAND_MS} \
         ms), absent {none} times; ages {ages:?}; logs:\n{}",
        worker.logs()
    );
    let total = (live + old) as i64;
    assert!(
        eventually(Duration::from_secs(120), || db.rows() == total).await,
        "rows {} of {total}",
        db.rows()
    );
    let samples = history.finish();
    let (behind, first) = behind_the_watermark(&db, &samples);
    assert_eq!(behind, 0, "in-band rows late: {first:?}");
    let late = flow_metric(metrics_port, "sluice_messages_late_total", "ingest").unwrap();
    println!(
        "{live} live and {old} old events; {late} counted late; {} samples",
        samples.len()
    );
    assert!(
        late >= (old - 2) as f64,
        "only {late} of {old} old events counted late"
    );
    assert!(
        late <= old as f64,
        "{late} rows late, more than the {old} old events"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_tracking_stream_holds_the_watermark() {
    let upstream: SocketAddr = emulator()
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = FaultProxy::start(upstream);
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("wmquiet", 1).await;
    let dir = Workdir::new();
    let db_path = dir.path().join("db");
    let db = Db(db_path.clone());
    let metrics_port = free_port().unwrap();
    let endpoint = format!("http://{}", proxy.addr());
    let file = pipeline(dir.path(), &endpoint, metrics_port, &subs[0], true);
    let worker = Worker::start(&file, "quiet");
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;
    let history = history(&db_path);
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let started = Instant::now();
    let mut sent = 0usize;
    // 20 msg/s for 100 s; silent from 20 s to 80 s.
    for tick in 0..1000u32 {
        if tick == 200 {
            assert!(
                watermark(&db) > 0,
                "no watermark before the outage; logs:\n{}",
                worker.logs()
            );
            proxy.blackhole();
        }
        if tick == 800 {
            proxy.pass();
        }
        if tick % 5 == 0 {
            let id = format!("live{sent}");
            publish_all(
                &publisher,
                [timed_event(&id, now_ms() - rand::random_range(0..5_000))],
            )
            .await
            .unwrap();
            sent += 1;
        }
        tokio::time::sleep_until((started + Duration::from_millis(100) * (tick + 1)).into()).await;
    }
    // The emulator hands a silent stream's messages back slowly (minutes).
    assert!(
        eventually(Duration::from_secs(400), || db.rows() == sent as i64).await,
        "rows {} of {sent}; logs:\n{}",
        db.rows(),
        worker.logs()
    );
    let samples = history.finish();
    let (behind, first) = behind_the_watermark(&db, &samples);
    let late = flow_metric(metrics_port, "sluice_messages_late_total", "ingest").unwrap();
    println!(
        "{sent} published; {} samples, watermark {} → {}; {late} counted late",
        samples.len(),
        samples.first().map_or(0, |s| s.1),
        samples.last().map_or(0, |s| s.1)
    );
    assert_eq!(behind, 0, "rows late after the outage: {first:?}");
    assert_eq!(late, 0.0);
    // Idle, the watermark passes the last window: the window counts add up to what was sent.
    let counted = || db.query("SELECT COALESCE(SUM(count), 0) FROM test__events__windows");
    assert!(
        eventually(Duration::from_secs(180), || counted() == sent as i64).await,
        "the 5 s windows count {} of {sent}",
        counted()
    );
}
