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
//! 3. **The probe publisher alone cut off for 40 s** (`SLUICE_PROBE_ENDPOINT` sends the probes
//!    through a [`sluice_tests::FaultProxy`], blackholed; the flow and the tracking stream reach
//!    the emulator directly) at 2 msg/s: rows keep being committed, the probes are waited for
//!    (`sluice_watermark_probes_outstanding` shows them), the watermark never passes the last
//!    moment a probe came back, no row is late, and once the proxy passes again the watermark
//!    moves on. The client retries a publish that fails in transit (a deadline, a lost
//!    connection) for 10 minutes before it reports an error, past the horizon's 5-minute
//!    give-up, so no error whose outcome is unknown reaches the reader here: that case is
//!    checked on the horizon (`watermark/tests/held_back_backlog.rs`). Fake: the cut, by the
//!    proxy on the probes' path only.
#![allow(clippy::unwrap_used, missing_docs)]

use google_cloud_pubsub::model::Message;
use sluice_bench::free_port;
use sluice_engine::pubsub::publish_all;
use sluice_tests::watermarks::{
    IN_BAND, WatermarkHistory, WatermarkedPipeline, out_of_band, rows_behind, timed_event,
};
use sluice_tests::{
    Db, FaultProxy, PubSub, Workdir, Worker, emulator, eventually, flow_metric, labelled_metric,
    now_ms,
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
             AND event_time < {watermark} AND dedup_key NOT LIKE '%old%' AND {IN_BAND}"
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
    // Live events the publisher sent more than the band after stamping them are late too.
    let outside = out_of_band(&db, "test__events") - old as i64;
    assert!(
        late <= (old as i64 + outside.max(0)) as f64,
        "{late} rows late, more than the {old} old events and {outside} live ones outside the band"
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
    // The emulator hands a silent stream's messages back after their ack deadline.
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
    let outside = out_of_band(&db, "test__events");
    assert!(
        late <= outside as f64,
        "{late} counted late, {outside} outside the band"
    );
    // Idle, the watermark passes the last window: the window counts add up to what was sent.
    let counted = || db.query("SELECT COALESCE(SUM(count), 0) FROM test__events__windows");
    assert!(
        eventually(Duration::from_secs(180), || counted() == sent as i64).await,
        "the 5 s windows count {} of {sent}",
        counted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_probe_publisher_holds_the_watermark_and_never_puts_it_ahead() {
    let upstream: SocketAddr = emulator()
        .endpoint()
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let probes = FaultProxy::start(upstream);
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("wmprobes", 1).await;
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
    let worker = Worker::spawn_with_env(
        &["run", "-c", file.to_str().unwrap()],
        &[(
            "SLUICE_PROBE_ENDPOINT".to_owned(),
            format!("http://{}", probes.addr()),
        )],
        dir.path(),
        "probes",
    );
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;
    let history = history(&db_path);
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let outstanding = || {
        flow_metric(
            metrics_port,
            "sluice_watermark_probes_outstanding",
            "ingest",
        )
        .unwrap_or(0.0)
    };
    let started = Instant::now();
    let mut sent = 0usize;
    let (mut cut_at, mut rows_at_cut, mut sent_at_cut, mut passed_at) = (0, 0, 0, 0);
    let mut during = Vec::new();
    // When (tick) the watermark first passed the end of the cut minus the band.
    let mut moved_at = None;
    // 2 msg/s for 80 s; the probes cut off from 20 s to 60 s.
    for tick in 0..800u32 {
        if tick == 200 {
            assert!(
                watermark(&db) > 0 && probes.accepted() > 0,
                "before the cut: watermark {}, connections through the probes' proxy {}; \
                 logs:\n{}",
                watermark(&db),
                probes.accepted(),
                worker.logs()
            );
            probes.blackhole();
            cut_at = now_ms();
            rows_at_cut = db.rows();
            sent_at_cut = sent;
        }
        if (200..600).contains(&tick) && tick % 50 == 0 {
            during.push((watermark(&db), outstanding()));
        }
        if tick == 599 {
            during.push((watermark(&db), outstanding()));
            let (rows, sent_during) = (db.rows(), (sent - sent_at_cut) as i64);
            assert!(
                rows > rows_at_cut + sent_during / 2,
                "the flow stopped with the probes: {rows_at_cut} rows at the cut, {rows} at its \
                 end, {sent_during} published during it"
            );
            probes.pass();
            passed_at = now_ms();
        }
        if tick >= 600 && tick % 10 == 0 && moved_at.is_none() {
            moved_at = (watermark(&db) > passed_at - BAND_MS).then_some(tick);
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
    let failures = |outcome: &str| {
        labelled_metric(
            metrics_port,
            "sluice_watermark_probe_failures_total",
            &format!("outcome=\"{outcome}\""),
        )
    };
    println!(
        "cut at {cut_at}: (watermark, probes outstanding) every 5 s of the cut: {during:?}; \
         probe publish failures reported: refused {:?}, unknown {:?}",
        failures("refused"),
        failures("unknown")
    );
    // The fault landed on the probes: they piled up unanswered.
    let waited = during.iter().map(|(_, o)| *o).fold(0.0, f64::max);
    assert!(
        waited >= 20.0,
        "at most {waited} probes waited for during a 40 s cut: {during:?}"
    );
    // No probe came back: the watermark held at most where the last one left it.
    let highest = during.iter().map(|(w, _)| *w).max().unwrap();
    assert!(
        highest <= cut_at - BAND_MS,
        "the watermark reached {highest} during the cut, past the cut ({cut_at}) minus the band"
    );
    assert!(
        eventually(Duration::from_secs(120), || db.rows() == sent as i64).await,
        "rows {} of {sent}; logs:\n{}",
        db.rows(),
        worker.logs()
    );
    // The probes go through again (those held by the proxy, or retried by the client): the
    // watermark moves on past the end of the cut.
    let moved = eventually(Duration::from_secs(400), || {
        watermark(&db) > passed_at - BAND_MS
    })
    .await;
    println!(
        "the watermark passed the end of the cut minus the band {} after it",
        moved_at.map_or(
            format!("{} s", (now_ms() - passed_at) / 1000),
            |tick| format!("within {} s", (tick - 599) / 10 + 1)
        )
    );
    assert!(
        moved,
        "the watermark {} never moved past the end of the cut ({passed_at}); logs:\n{}",
        watermark(&db),
        worker.logs()
    );
    let samples = history.finish();
    let (behind, first) = behind_the_watermark(&db, &samples);
    let late = flow_metric(metrics_port, "sluice_messages_late_total", "ingest").unwrap();
    println!(
        "{sent} published; {} samples; {late} counted late",
        samples.len()
    );
    assert_eq!(behind, 0, "rows late: {first:?}");
    let outside = out_of_band(&db, "test__events");
    assert!(
        late <= outside as f64,
        "{late} counted late, {outside} outside the band"
    );
}
