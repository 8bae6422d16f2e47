//! A bounded backfill beside a live flow holds the table's watermark back; `depends_on` does
//! not (the scenario that motivates `depends_on` in the flow-ordering documentation
//! of Databricks Lakeflow pipelines). Real emulator, SQLite store.
//!
//! One pipeline, run in two tests (one variant each) on fresh topics: `events_backfill` (once) reads a day of history
//! from a file into `events`, `events_live` reads Pub/Sub (`watermark:`, band 10 s) into the
//! same table, and `per_10s` counts `events` in 10 s windows by region (a window over a
//! `table` source, closed by the table's watermark). Live events are published at 500 msg/s
//! from the start, while the backfill runs and after.
//!
//! * **Without `depends_on`** the live flow commits beside the backfill, but the table has no
//!   watermark until the backfill is done (a bounded writer has none while it runs), so every
//!   live row committed meanwhile waits, committed, for its window.
//! * **With `depends_on: events_backfill`** the live flow starts after the backfill; what was
//!   published meanwhile waits in Pub/Sub, and no live row waits in the table for the backfill.
//!
//! Both tests check, and could fail on: every record in exactly one window count (counts equal
//! what was published and what the file holds), no row committed into a window after it was
//! emitted (the table's watermark never ran ahead), no late row, and the ordering each variant
//! promises. The figures (docs/watermarks.md, "Backfills and the watermark") are printed, never asserted.
#![allow(clippy::unwrap_used, missing_docs)]

use google_cloud_pubsub::model::Message;
use sluice_bench::free_port;
use sluice_engine::pubsub::publish_all;
use sluice_tests::{
    Db, FlowYaml, PipelineYaml, PubSub, Workdir, Worker, eventually, flow_metric, now_ms,
};
use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

const HISTORY: usize = 1_000_000;
const LIVE_PER_SECOND: usize = 500;
const LIVE_SECONDS: u32 = 60;
const WINDOW_MS: i64 = 10_000;
const DAY_MS: i64 = 86_400_000;

/// A day of history, ending an hour ago, four regions.
fn write_history(path: &std::path::Path) {
    let end = now_ms() - 3_600_000;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..HISTORY {
        let event_time = end - DAY_MS + (i as i64 * DAY_MS) / HISTORY as i64;
        writeln!(
            file,
            "{{\"id\":\"h{i}\",\"data\":{{\"n\":{i}}},\"attributes\":{{\"region\":\"r{}\"}},\"event_time\":{event_time}}}",
            i % 4
        )
        .unwrap();
    }
    file.flush().unwrap();
}

/// What one run measured.
#[derive(Debug)]
struct Figures {
    backfill_seconds: f64,
    live_committed_during_backfill: usize,
    live_waiting_max: usize,
    commit_to_window: (f64, f64),
    publish_to_window: (f64, f64),
    all_emitted_seconds: f64,
}

fn p50_max(mut seconds: Vec<f64>) -> (f64, f64) {
    seconds.sort_by(f64::total_cmp);
    (seconds[seconds.len() / 2], *seconds.last().unwrap())
}

/// Runs the pipeline once, with or without `depends_on`, and measures it.
async fn run(pubsub: &PubSub, ordered: bool) -> Figures {
    let (topic, subs) = pubsub
        .topic_with(if ordered { "bfo" } else { "bfb" }, 1)
        .await;
    let dir = Workdir::new();
    let history = dir.path().join("history.jsonl");
    write_history(&history);
    let db_path = dir.db("db");
    let db = Db(db_path.clone());
    let metrics_port = free_port().unwrap();
    let mut live = FlowYaml::pubsub("events_live", "events", &subs[0]);
    if ordered {
        live = live.depends_on(&["events_backfill"]);
    }
    let file = PipelineYaml::new("test")
        .mode("continuous")
        .sqlite(&db_path)
        .pubsub_emulator()
        .metrics(&format!("127.0.0.1:{metrics_port}"))
        .target_table("events")
        .target_window("per_10s", "10s", "attribute:region", "0s")
        .flow(FlowYaml::file("events_backfill", "events", &history.display().to_string()).once())
        .flow(
            live.dedup_attribute("event_id")
                .event_time_attribute("ts")
                .watermark("auto", "10s"),
        )
        .flow(FlowYaml::table("per_10s_counts", "per_10s", "events"))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, if ordered { "ordered" } else { "beside" });
    // The worker creates the tracking subscription at start, before the live flow runs (with
    // `depends_on` that is after the backfill): what is published from now on is tracked.
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;
    // Times count from here: the tracking subscription exists.
    let started = now_ms();
    let publisher = pubsub.admin.publisher(&topic).await.unwrap();
    let mut published: HashMap<String, i64> = HashMap::new();
    let mut expected: HashMap<(i64, String), i64> = HashMap::new();
    let clock = Instant::now();
    for tick in 0..LIVE_SECONDS * 10 {
        let chunk: Vec<Message> = (0..LIVE_PER_SECOND / 10)
            .map(|i| {
                let id = format!("l{}", published.len() + i);
                let ts = now_ms() - rand::random_range(0..5_000);
                let region = format!("r{}", i % 4);
                *expected
                    .entry((ts - ts.rem_euclid(WINDOW_MS), region.clone()))
                    .or_default() += 1;
                Message::new()
                    .set_data(bytes::Bytes::from_static(b"{}"))
                    .set_attributes([("event_id", id), ("ts", ts.to_string()), ("region", region)])
            })
            .collect();
        let at = now_ms();
        for message in &chunk {
            published.insert(message.attributes["event_id"].clone(), at);
        }
        publish_all(&publisher, chunk).await.unwrap();
        tokio::time::sleep_until((clock + Duration::from_millis(100) * (tick + 1)).into()).await;
    }
    let total = (HISTORY + published.len()) as i64;
    let counted = || db.query("SELECT COALESCE(SUM(count), 0) FROM test__per_10s__windows");
    assert!(
        eventually(Duration::from_secs(400), || counted() == total).await,
        "windows counted {} of {total} (rows {}); logs:\n{}",
        counted(),
        db.rows(),
        worker.logs()
    );
    let all_emitted = now_ms();
    let late = flow_metric(metrics_port, "sluice_messages_late_total", "events_live");
    let logs = worker.logs();
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    assert_eq!(db.rows(), total, "each record once");
    assert_eq!(db.distinct_keys(), total);
    assert_eq!(late, Some(0.0), "late live rows");

    // The counts of the live windows equal what was published; the history's add up.
    let conn = rusqlite::Connection::open(&db_path).unwrap();
    let windows: HashMap<(i64, String), (i64, i64)> = conn
        .prepare("SELECT window_start, group_key, count, emitted_at FROM test__per_10s__windows")
        .unwrap()
        .query_map([], |row| {
            Ok(((row.get(0)?, row.get(1)?), (row.get(2)?, row.get(3)?)))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (window, count) in &expected {
        assert_eq!(windows.get(window).map(|w| w.0), Some(*count), "{window:?}");
    }
    let history_windows: i64 = windows
        .iter()
        .filter(|(w, _)| !expected.contains_key(*w))
        .map(|(_, (count, _))| count)
        .sum();
    assert_eq!(history_windows, HISTORY as i64);

    // Every row was committed before its window was emitted: the table's watermark never ran
    // ahead of a row still to come, the backfill's included.
    let rows: Vec<(String, String, i64, i64, String)> = conn
        .prepare(
            "SELECT flow, dedup_key, event_time, committed_at,
                    json_extract(attributes, '$.region') FROM test__events",
        )
        .unwrap()
        .query_map([], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let emitted_at = |event_time: i64, region: &str| {
        windows[&(
            event_time - event_time.rem_euclid(WINDOW_MS),
            region.to_owned(),
        )]
            .1
    };
    for (flow, key, event_time, committed_at, region) in &rows {
        let emitted = emitted_at(*event_time, region);
        assert!(
            *committed_at <= emitted,
            "{flow} row {key} was committed at {committed_at}, after its window was emitted \
             at {emitted}"
        );
    }
    let backfill_done = conn
        .query_row(
            "SELECT c.completed_at FROM sluice_completions c JOIN sluice_flows f
             ON f.flow_id = c.flow_id WHERE f.flow = 'events_backfill'",
            [],
            |row| row.get::<_, i64>(0),
        )
        .unwrap();
    let live: Vec<&(String, String, i64, i64, String)> =
        rows.iter().filter(|r| r.0 == "events_live").collect();
    let live_committed_during_backfill = live.iter().filter(|r| r.3 < backfill_done).count();
    // Live rows committed and waiting for their window, at each commit: the most at once.
    let mut changes: Vec<(i64, i64)> = live
        .iter()
        .flat_map(|r| [(r.3, 1), (emitted_at(r.2, &r.4), -1)])
        .collect();
    changes.sort();
    let live_waiting_max = changes
        .iter()
        .scan(0i64, |waiting, (_, change)| {
            *waiting += change;
            Some(*waiting)
        })
        .max()
        .unwrap() as usize;
    let seconds = |ms: i64| ms as f64 / 1000.0;
    Figures {
        backfill_seconds: seconds(backfill_done - started),
        live_committed_during_backfill,
        live_waiting_max,
        commit_to_window: p50_max(
            live.iter()
                .map(|r| seconds(emitted_at(r.2, &r.4) - r.3))
                .collect(),
        ),
        publish_to_window: p50_max(
            live.iter()
                .map(|r| seconds(emitted_at(r.2, &r.4) - published[&r.1]))
                .collect(),
        ),
        all_emitted_seconds: seconds(all_emitted - started),
    }
}

/// One run's figures as a column of the table in docs/watermarks.md (the two tests print one column each).
fn print_column(what: &str, figures: &Figures) {
    let pair = |(p50, max): (f64, f64)| format!("{p50:.1} / {max:.1}");
    let rows = [
        (
            "backfill done after (s)",
            format!("{:.1}", figures.backfill_seconds),
        ),
        (
            "live rows committed while the backfill ran",
            figures.live_committed_during_backfill.to_string(),
        ),
        (
            "live rows committed and waiting for their window, most at once",
            figures.live_waiting_max.to_string(),
        ),
        (
            "live row committed → its window emitted, p50 / max (s)",
            pair(figures.commit_to_window),
        ),
        (
            "live row published → its window emitted, p50 / max (s)",
            pair(figures.publish_to_window),
        ),
        (
            "every window emitted after (s)",
            format!("{:.1}", figures.all_emitted_seconds),
        ),
    ];
    println!(
        "{what}: backfill of {HISTORY} records beside live at {LIVE_PER_SECOND} msg/s for \
         {LIVE_SECONDS} s (times from the worker's start)"
    );
    println!("| | {what} |");
    println!("|---|---|");
    for (row, value) in rows {
        println!("| {row} | {value} |");
    }
}

/// Without `depends_on`: the live flow committed while the backfill ran, and those rows waited
/// for the table's watermark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_beside_live_holds_the_watermark_back() {
    let pubsub = PubSub::connect().await;
    let beside = run(&pubsub, false).await;
    print_column("backfill beside live", &beside);
    assert!(
        beside.live_committed_during_backfill > 0,
        "the backfill ended before the live flow committed; nothing was measured: {beside:?}"
    );
    assert!(beside.live_waiting_max >= beside.live_committed_during_backfill);
}

/// With `depends_on: events_backfill`: nothing live was committed before the backfill was done,
/// and the live flow's tracking subscription, which its own reader would create only when the
/// flow starts (after the backfill), existed before: the worker creates it at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_that_depends_on_the_backfill_waits_and_no_row_waits_for_its_window() {
    let pubsub = PubSub::connect().await;
    let ordered = run(&pubsub, true).await;
    print_column("live `depends_on` the backfill", &ordered);
    assert_eq!(ordered.live_committed_during_backfill, 0, "{ordered:?}");
    assert!(ordered.backfill_seconds > 0.0, "{ordered:?}");
}
