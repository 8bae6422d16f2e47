//! Event-time watermarks on the real emulator (SQLite store), checked against the rows
//! themselves: the watermark history is sampled from the store while the worker runs, and for
//! every sample `(t, W)` every row committed after `t` must have an event time of at least `W`
//! (SPEC §2.4: no committed message is late, the watermark never passes data still to come).
//!
//! 1. Live, shuffled: 2 000 msg/s for 15 s with event times up to 8 s before their publish
//!    (band 10 s): no row late, `sluice_messages_late_total` 0, each record once; then, all
//!    committed and idle, the watermark trails the clock by about the band (plus the tracking
//!    stream's 2 s quiet allowance) within twice the band.
//! 2. Backlog: the worker stops; 3 600 messages with event times spread over the last hour are
//!    published to a second topic, whose tracking subscription (named, made by the test) exists
//!    already; the worker restarts with a second flow, `backlog`, on that topic. Its watermark
//!    holds below every uncommitted message until it is committed, no row is late, and then it
//!    moves on; `ingest`, idle since before the restart, gets its watermark moving again with
//!    no new message (its reader's probes). (The backlog flow is new at the restart rather
//!    than restarted: the emulator trickles a subscription's backlog to new streams for
//!    minutes after a stream of it closed, a stall that Pub/Sub itself does not have,
//!    ARCHITECTURE.md, "Pub/Sub client facts we build on". A flow
//!    that had a watermark already past an hour ago would find such messages late by
//!    definition: the watermark never goes back.)
#![allow(clippy::unwrap_used, missing_docs)]

use google_cloud_pubsub::model::Message;
use sluice_bench::free_port;
use sluice_engine::pubsub::publish_all;
use sluice_tests::watermarks::{WatermarkHistory, WatermarkedPipeline, timed_event};
use sluice_tests::{
    Db, FlowYaml, PipelineYaml, PubSub, Workdir, Worker, emulator, eventually, flow_metric, now_ms,
    sluice_command,
};
use std::time::{Duration, Instant};

/// Samples the stored watermark of `flow` every 100 ms.
fn history(db: &std::path::Path, flow: &'static str) -> WatermarkHistory {
    let db = Db(db.to_owned());
    WatermarkHistory::start(Duration::from_millis(100), move || watermark(&db, flow))
}

/// The flow's stored watermark (0: none yet).
fn watermark(db: &Db, flow: &str) -> i64 {
    db.query(&format!(
        "SELECT COALESCE(MAX(w.watermark_ms), 0) FROM sluice_watermarks w \
         JOIN sluice_flows f ON f.flow_id = w.flow_id WHERE f.flow = '{flow}'"
    ))
}

/// Rows of `flow`.
fn rows(db: &Db, flow: &str) -> i64 {
    db.query(&format!(
        "SELECT COUNT(*) FROM test__events WHERE flow = '{flow}'"
    ))
}

/// Every sample of `flow` is at most the event time of every row of it committed after the
/// sample, and the samples never decrease. Returns the number of samples checked.
fn assert_never_ahead(db: &Db, flow: &str, samples: &[(i64, i64)]) -> usize {
    for pair in samples.windows(2) {
        assert!(pair[1].1 >= pair[0].1, "the watermark went back: {pair:?}");
    }
    for (when, watermark) in samples {
        let oldest_after = db.query(&format!(
            "SELECT COALESCE(MIN(event_time), 9223372036854775807) FROM test__events \
             WHERE flow = '{flow}' AND committed_at > {when}"
        ));
        assert!(
            oldest_after >= *watermark,
            "a row with event time {oldest_after} was committed after the watermark was \
             {watermark} (sampled at {when})"
        );
    }
    samples.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shuffled_live_then_idle_then_backlog_never_late() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("wm", 1).await;
    let (old_topic, old_subs) = pubsub.topic_with("wmold", 1).await;
    let dir = Workdir::new();
    let db_path = dir.db("db");
    let db = Db(db_path.clone());
    let metrics_port = free_port().unwrap();
    let old_tracking = format!("{}-tracked-by-test", old_subs[0]);
    pubsub
        .admin
        .create_subscription(&old_tracking, &old_topic, 10)
        .await
        .unwrap();
    let file = dir.path().join("p.yaml");
    let pipeline = WatermarkedPipeline {
        store: format!("sqlite://{}", db_path.display()),
        endpoint: emulator().endpoint(),
        metrics_port: Some(metrics_port),
        subscription: &subs[0],
        target: "{ name: events, kind: table }",
    }
    .yaml();
    std::fs::write(&file, &pipeline).unwrap();
    let worker = Worker::start(&file, "first");
    // The tracking subscription sees what is published after it exists.
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;
    let live_history = history(&db_path, "ingest");
    let backlog_history = history(&db_path, "backlog");

    // 1. Live: 2 000 msg/s for 15 s, event times shuffled up to 8 s back.
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let started = Instant::now();
    let mut sent = 0usize;
    for tick in 0..150u32 {
        let chunk: Vec<Message> = (0..200)
            .map(|i| {
                let id = format!("live{}", sent + i);
                timed_event(&id, now_ms() - rand::random_range(0..8_000))
            })
            .collect();
        sent += chunk.len();
        publish_all(&publisher, chunk).await.unwrap();
        let due = started + Duration::from_millis(100) * (tick + 1);
        tokio::time::sleep_until(due.into()).await;
    }
    let last_publish = now_ms();
    assert!(
        eventually(Duration::from_secs(180), || rows(&db, "ingest") == 30_000).await,
        "rows {}; logs:\n{}",
        db.rows(),
        worker.logs()
    );
    assert_eq!(db.distinct_keys(), 30_000);
    // Idle (everything published is committed): within twice the band, the watermark is
    // within the band plus the 2 s quiet allowance (and 1 s of scheduling slack) of the clock.
    let idle_deadline = now_ms() + 20_000;
    let idle_ok = eventually(Duration::from_secs(40), || {
        now_ms() <= idle_deadline && watermark(&db, "ingest") >= now_ms() - 13_000
    })
    .await;
    assert!(
        idle_ok,
        "watermark {} at {} (last publish {last_publish})",
        watermark(&db, "ingest"),
        now_ms()
    );
    assert_eq!(
        flow_metric(metrics_port, "sluice_messages_late_total", "ingest"),
        Some(0.0)
    );
    let gauge = flow_metric(metrics_port, "sluice_watermark_timestamp_seconds", "ingest").unwrap();
    assert!(gauge * 1000.0 >= (last_publish - 30_000) as f64, "{gauge}");

    // `sluice status` (from the store: this worker has no control API) shows it too.
    let out = sluice_command(
        &["status", "-c", file.to_str().unwrap(), "--format", "json"],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let status: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let shown = status["flows"][0]["watermark_ms"].as_i64().unwrap();
    assert!(shown > 0 && shown <= watermark(&db, "ingest"), "{status}");
    assert!(
        status["flows"][0]["watermark_age_seconds"]
            .as_f64()
            .unwrap()
            < 60.0
    );
    let text = sluice_command(&["status", "-c", file.to_str().unwrap()], None).stdout;
    assert!(text.contains("WATERMARK AGE"), "{text}");

    // 2. Backlog: stop, publish an hour of event times, restart.
    let ingest_before_restart = watermark(&db, "ingest");
    worker.terminate();
    let logs = worker.logs();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    let hour_ago = now_ms() - 3_600_000;
    let backlog: Vec<Message> = (0..3_600)
        .map(|i| {
            timed_event(
                &format!("old{i}"),
                hour_ago + rand::random_range(0..3_600_000),
            )
        })
        .collect();
    std::fs::write(
        &file,
        format!(
            "{pipeline}  - name: backlog
    target: events
    source:
      pubsub:
        subscription: {}
        dedup: {{ by: attribute, attribute: event_id }}
        event_time: {{ attribute: ts }}
        watermark: {{ tracking_subscription: {old_tracking}, band: 10s }}
",
            old_subs[0]
        ),
    )
    .unwrap();
    let old_publisher = pubsub.admin.publisher(&old_topic).await.unwrap();
    publish_all(&old_publisher, backlog).await.unwrap();
    let worker = Worker::start(&file, "second");
    assert!(
        eventually(Duration::from_secs(400), || db.rows() == 33_600).await,
        "rows {}; logs:\n{}",
        db.rows(),
        worker.logs()
    );
    assert_eq!(db.distinct_keys(), 33_600);
    // Once the backlog is committed the watermark moves past it.
    let oldest_backlog =
        db.query("SELECT MIN(event_time) FROM test__events WHERE flow = 'backlog'");
    assert!(oldest_backlog >= hour_ago);
    assert!(
        eventually(Duration::from_secs(30), || watermark(&db, "backlog")
            > oldest_backlog)
        .await,
        "the backlog's watermark never moved past it: {}; logs:\n{}",
        watermark(&db, "backlog"),
        worker.logs()
    );
    // The restart found `ingest` idle: its probes move its watermark on all the same (issue
    // 19: without them it had no horizon until its next message). 30 s on: more than the
    // first worker's last ticks could have moved it, and no freshness bound, which a loaded
    // machine would make flaky.
    assert!(
        eventually(Duration::from_secs(240), || {
            watermark(&db, "ingest") > ingest_before_restart + 30_000
        })
        .await,
        "idle after the restart, the watermark of ingest stayed at {} (before: \
         {ingest_before_restart}, now {}); logs:\n{}",
        watermark(&db, "ingest"),
        now_ms(),
        worker.logs()
    );
    let late: Vec<_> = ["ingest", "backlog"]
        .into_iter()
        .map(|flow| {
            (
                flow,
                flow_metric(metrics_port, "sluice_messages_late_total", flow),
            )
        })
        .collect();
    let logs = worker.logs();
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    let checked = assert_never_ahead(&db, "ingest", &live_history.finish());
    assert!(checked > 100, "only {checked} watermark samples of ingest");
    let checked = assert_never_ahead(&db, "backlog", &backlog_history.finish());
    assert!(checked > 10, "only {checked} watermark samples of backlog");
    for (flow, late) in late {
        assert_eq!(late, Some(0.0), "late rows of {flow}");
    }
}

/// A `window` target: 5 s tumbling counts by `region`, emitted when the watermark passes a
/// window's end plus 2 s of allowed lateness. The emitted counts equal the counts computed from
/// what was published (a message without `region` counts under ""); a message published
/// afterwards into an emitted window is kept in the base table, counted late, and leaves the
/// window's count as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_counts_equal_what_was_published() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("win", 1).await;
    let dir = Workdir::new();
    let db_path = dir.db("db");
    let db = Db(db_path.clone());
    let metrics_port = free_port().unwrap();
    let file = PipelineYaml::new("test")
        .mode("continuous")
        .sqlite(&db_path)
        .pubsub_emulator()
        .metrics(&format!("127.0.0.1:{metrics_port}"))
        .target_window("per5s", "5s", "attribute:region", "2s")
        .flow(
            FlowYaml::pubsub("counts", "per5s", &subs[0])
                .dedup_attribute("event_id")
                .event_time_attribute("ts")
                .watermark("auto", "10s"),
        )
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "w");
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;

    // 2 000 messages over 10 s, event times up to 8 s back, four regions and some without.
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let mut expected: std::collections::BTreeMap<(i64, String), i64> = Default::default();
    let started = Instant::now();
    for tick in 0..20u32 {
        let chunk: Vec<Message> = (0..100)
            .map(|i| {
                let n = tick as usize * 100 + i;
                let ts = now_ms() - rand::random_range(0..8_000);
                let region = (!n.is_multiple_of(25)).then(|| format!("r{}", n % 4));
                *expected
                    .entry((
                        ts - ts.rem_euclid(5_000),
                        region.clone().unwrap_or_default(),
                    ))
                    .or_default() += 1;
                let mut attributes = vec![
                    ("event_id".to_owned(), format!("w{n}")),
                    ("ts".to_owned(), ts.to_string()),
                ];
                if let Some(region) = region {
                    attributes.push(("region".to_owned(), region));
                }
                Message::new()
                    .set_data(bytes::Bytes::from_static(b"{}"))
                    .set_attributes(attributes)
            })
            .collect();
        publish_all(&publisher, chunk).await.unwrap();
        tokio::time::sleep_until((started + Duration::from_millis(500) * (tick + 1)).into()).await;
    }
    let windows_sum = || db.query("SELECT COALESCE(SUM(count), 0) FROM test__per5s__windows");
    assert!(
        eventually(Duration::from_secs(120), || windows_sum() == 2_000).await,
        "emitted {} of 2000 (base table {}); logs:\n{}",
        windows_sum(),
        db.query("SELECT COUNT(*) FROM test__per5s"),
        worker.logs()
    );
    let emitted = || {
        let conn = rusqlite::Connection::open(&db_path).unwrap();
        let mut statement = conn
            .prepare(
                "SELECT window_start, window_end, group_key, count FROM test__per5s__windows \
                 ORDER BY window_start, group_key",
            )
            .unwrap();
        statement
            .query_map([], |row| {
                let (start, end): (i64, i64) = (row.get(0)?, row.get(1)?);
                assert_eq!(end - start, 5_000);
                Ok(((start, row.get::<_, String>(2)?), row.get::<_, i64>(3)?))
            })
            .unwrap()
            .collect::<Result<std::collections::BTreeMap<_, _>, _>>()
            .unwrap()
    };
    assert_eq!(emitted(), expected);
    assert_eq!(db.query("SELECT COUNT(*) FROM test__per5s"), 2_000);
    // Emissions read the base table through its (flow, event_time) index.
    assert_eq!(
        db.query("SELECT COUNT(*) FROM sqlite_master WHERE name = 'test__per5s__by_event_time'"),
        1
    );

    // A message for the first window, long closed: kept, counted late, the count unchanged.
    let (&(first_window, _), _) = expected.iter().next().unwrap();
    publish_all(
        &publisher,
        vec![timed_event("late0", first_window + 1).set_attributes([
            ("event_id", "late0".to_owned()),
            ("ts", (first_window + 1).to_string()),
            ("region", "r0".to_owned()),
        ])],
    )
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(60), || {
            flow_metric(metrics_port, "sluice_messages_late_total", "counts") == Some(1.0)
        })
        .await,
        "late {:?}; logs:\n{}",
        flow_metric(metrics_port, "sluice_messages_late_total", "counts"),
        worker.logs()
    );
    assert_eq!(db.query("SELECT COUNT(*) FROM test__per5s"), 2_001);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(emitted(), expected, "an emitted window changed");
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());
}
