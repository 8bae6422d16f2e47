//! Flows fed by a table (`source: { table: X }`) end to end, on the real emulator and a real
//! gRPC Stage server (in this test):
//!
//! * the two foreachBatch orderings of the Lakeflow reference, written as sluice pipelines and
//!   run as written: the triggered chain (once backfill -> table -> export -> audit, the audit
//!   `depends_on` the export) and the continuous one (once backfill -> table -> live export);
//!   each record is handed to each stage once, and the audit only after the export;
//! * a continuous bronze -> silver -> foreach_batch chain following a live Pub/Sub flow: every
//!   record once at every stage;
//! * triggered runs read only what is new: a second run over N old rows and M new ones reads
//!   M (the rows read, from the run's own summary, not only the rows written).
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::stage_server::{StageCall, stage_server};
use sluice_tests::{
    Db, FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, events_with_duplicates, eventually,
    flow_metric, sluice_command,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// `n` JSONL records `{prefix}{i}` in one file under `dir/sub`; their glob.
fn backfill_files(dir: &Path, sub: &str, prefix: &str, n: usize) -> String {
    let folder = dir.join(sub);
    std::fs::create_dir_all(&folder).unwrap();
    let text: String = (0..n)
        .map(|i| {
            format!(
                "{{\"id\":\"{prefix}{i}\",\"data\":{{\"n\":{i}}},\"event_time\":{}}}\n",
                1_700_000_000_000_i64 + i as i64
            )
        })
        .collect();
    std::fs::write(folder.join("part-0.jsonl"), text).unwrap();
    folder.join("*.jsonl").display().to_string()
}

fn stage_target(stage: SocketAddr) -> String {
    format!("{{ endpoint: \"http://{stage}\" }}")
}

/// How often each key reached `flow`'s stage, checking every call's batch id is the one
/// derived from its keys.
fn times_seen(calls: &[StageCall], flow: &str) -> HashMap<String, usize> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for call in calls.iter().filter(|c| c.flow == flow) {
        assert_eq!(
            call.batch_id,
            sluice_engine::batch_id(call.keys.iter().map(String::as_str)),
            "the batch id is the one derived from its keys"
        );
        for key in &call.keys {
            *seen.entry(key.clone()).or_default() += 1;
        }
    }
    seen
}

fn assert_each_once(seen: &HashMap<String, usize>, expected: usize, what: &str) {
    assert_eq!(seen.len(), expected, "{what}: distinct records");
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "{what}: records sent twice: {repeated:?}"
    );
}

/// The reference's triggered example: `events_backfill` (once) fills `ordered_events`;
/// `export_events` and `audit_events` both read it into foreach_batch sinks, the audit after
/// the export (`depends_on`). A second update has nothing new to hand over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_triggered_foreach_batch_chain_runs_as_written() {
    let (stage, recorder) = stage_server().await;
    let dir = Workdir::new();
    let db = dir.db("chain");
    let glob = backfill_files(dir.path(), "historical", "h", 1_200);
    let file = PipelineYaml::new("chain")
        .mode("triggered")
        .sqlite(&db)
        .target_table("ordered_events")
        .target("events_export_sink", "foreach_batch", &stage_target(stage))
        .target("events_audit_sink", "foreach_batch", &stage_target(stage))
        .flow(FlowYaml::file("events_backfill", "ordered_events", &glob).once())
        .flow(
            FlowYaml::table("export_events", "events_export_sink", "ordered_events")
                .depends_on(&["events_backfill"]),
        )
        .flow(
            FlowYaml::table("audit_events", "events_audit_sink", "ordered_events")
                .depends_on(&["export_events"]),
        )
        .write(dir.path(), "p.yaml");
    let run = sluice_command(
        &["run", "--config", file.to_str().unwrap()],
        Some(dir.path()),
    );
    assert_eq!(run.code, 0, "{run:?}");

    let calls = recorder.calls();
    assert_each_once(&times_seen(&calls, "export_events"), 1_200, "export");
    assert_each_once(&times_seen(&calls, "audit_events"), 1_200, "audit");
    let last_export = calls
        .iter()
        .rposition(|c| c.flow == "export_events")
        .unwrap();
    let first_audit = calls.iter().position(|c| c.flow == "audit_events").unwrap();
    assert!(
        last_export < first_audit,
        "the audit starts after the export ended"
    );

    // Nothing new: the next update hands nothing over.
    let again = sluice_command(
        &["run", "--config", file.to_str().unwrap()],
        Some(dir.path()),
    );
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(recorder.calls().len(), calls.len(), "{}", again.stdout);
    let store = Db(db);
    assert_eq!(
        store.query("SELECT COUNT(*) FROM chain__events_export_sink"),
        1_200
    );
    assert_eq!(
        store.query("SELECT COUNT(*) FROM chain__events_audit_sink"),
        1_200
    );
}

/// The reference's continuous example: `events_backfill` (once) fills `backfilled_events`,
/// then the live `export_events` follows the table into a foreach_batch sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_continuous_foreach_batch_after_a_backfill_runs_as_written() {
    let (stage, recorder) = stage_server().await;
    let dir = Workdir::new();
    let db = dir.db("cont");
    let glob = backfill_files(dir.path(), "historical", "h", 900);
    let file = PipelineYaml::new("cont")
        .sqlite(&db)
        .target_table("backfilled_events")
        .target("events_export_sink", "foreach_batch", &stage_target(stage))
        .flow(FlowYaml::file("events_backfill", "backfilled_events", &glob).once())
        .flow(
            FlowYaml::table("export_events", "events_export_sink", "backfilled_events")
                .depends_on(&["events_backfill"]),
        )
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "worker");
    let exported = || times_seen(&recorder.calls(), "export_events").len();
    let done = eventually(Duration::from_secs(120), || exported() == 900).await;
    assert!(done, "exported {}; logs:\n{}", exported(), worker.logs());
    worker.terminate();
    let logs = worker.logs();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    assert_each_once(
        &times_seen(&recorder.calls(), "export_events"),
        900,
        "export",
    );
}

/// A continuous chain: a live Pub/Sub flow writes `bronze`, `refine` follows it into `silver`,
/// `export` follows `silver` into a foreach_batch stage; records published with duplicates
/// reach every stage once each, while the head keeps writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuous_chain_follows_a_live_flow_sqlite() {
    let dir = Workdir::new();
    let db = dir.db("live");
    let url = format!("sqlite://{}", db.display());
    let store = Db(db);
    continuous_chain(dir, &url, &|sql| store.query(sql)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuous_chain_follows_a_live_flow_postgres() {
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let store = PgDb(database.url().to_owned());
    continuous_chain(Workdir::new(), database.url(), &|sql| store.query(sql)).await;
}

async fn continuous_chain(dir: Workdir, store_url: &str, count: &dyn Fn(&str) -> i64) {
    let (stage, recorder) = stage_server().await;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("chain", 1).await;
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let file = PipelineYaml::new("test")
        .store(store_url)
        .metrics(&format!("127.0.0.1:{metrics_port}"))
        .pubsub_emulator()
        .target_table("bronze")
        .target_table("silver")
        .target("export", "foreach_batch", &stage_target(stage))
        .flow(FlowYaml::pubsub("ingest", "bronze", &subs[0]).dedup_attribute("event_id"))
        .flow(FlowYaml::table("refine", "silver", "bronze"))
        .flow(FlowYaml::table("out", "export", "silver"))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "worker");
    for wave in 0..3 {
        pubsub
            .publish(
                &topic,
                events_with_duplicates(&format!("w{wave}-"), 1_000, 100),
            )
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let exported = || times_seen(&recorder.calls(), "out").len();
    let done = eventually(Duration::from_secs(180), || exported() == 3_000).await;
    assert!(done, "exported {}; logs:\n{}", exported(), worker.logs());
    // Caught up: no row behind at either stage, on /metrics and in `sluice status`.
    for flow in ["refine", "out"] {
        let caught_up = eventually(Duration::from_secs(30), || {
            flow_metric(metrics_port, "sluice_feed_rows_behind", flow) == Some(0.0)
                && flow_metric(metrics_port, "sluice_feed_lag_seconds", flow) == Some(0.0)
        })
        .await;
        assert!(
            caught_up,
            "{flow}: {:?}",
            flow_metric(metrics_port, "sluice_feed_rows_behind", flow)
        );
    }
    let status = sluice_command(
        &["status", "--config", file.to_str().unwrap()],
        Some(dir.path()),
    );
    assert_eq!(status.code, 0, "{status:?}");
    let refine = status
        .stdout
        .lines()
        .find(|l| l.starts_with("refine "))
        .unwrap_or_else(|| panic!("{}", status.stdout));
    assert!(
        refine.contains(" 0  ") && refine.contains("0.0s"),
        "{}",
        status.stdout
    );
    worker.terminate();
    let logs = worker.logs();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    for table in ["test__bronze", "test__silver", "test__export"] {
        assert_eq!(
            count(&format!("SELECT COUNT(*) FROM {table}")),
            3_000,
            "{table}"
        );
        assert_eq!(
            count(&format!("SELECT COUNT(DISTINCT dedup_key) FROM {table}")),
            3_000,
            "{table}"
        );
    }
    assert_each_once(&times_seen(&recorder.calls(), "out"), 3_000, "export");
}

/// The first number after `label` in the line of `stdout` that starts with `start`; 0 without
/// such a line.
fn number_after(stdout: &str, start: &str, label: &str) -> u64 {
    let Some(line) = stdout.lines().find(|l| l.trim_start().starts_with(start)) else {
        return 0;
    };
    let after = line.split(label).nth(1).unwrap();
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The rows `flow` read in a run, from its summary: those it read (`read N`: a table flow) and
/// those it skipped as committed before.
fn rows_read(stdout: &str, flow: &str) -> u64 {
    assert!(
        stdout.contains(&format!("flow {flow}:")),
        "no summary of {flow} in:\n{stdout}"
    );
    number_after(stdout, &format!("flow {flow}:"), "; read ")
        + number_after(stdout, &format!("{flow}: "), ": ")
}

/// Triggered updates read a table incrementally: after a first update copied N rows, a
/// second one over N + M rows reads the M new ones only; refreshing the writer resets the
/// reader with it. (The table is loaded from files.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_triggered_update_reads_only_what_is_new() {
    let dir = Workdir::new();
    let db = dir.db("inc");
    let glob = backfill_files(dir.path(), "in", "n", 1_500);
    let file = PipelineYaml::new("inc")
        .mode("triggered")
        .sqlite(&db)
        .target_table("events")
        .target_table("copies")
        .flow(FlowYaml::file("load", "events", &glob))
        .flow(FlowYaml::table("copy", "copies", "events"))
        .write(dir.path(), "p.yaml");
    let run = |expected_new: u64| {
        let run = sluice_command(
            &["run", "--config", file.to_str().unwrap()],
            Some(dir.path()),
        );
        assert_eq!(run.code, 0, "{run:?}");
        assert_eq!(
            rows_read(&run.stdout, "copy"),
            expected_new,
            "{}",
            run.stdout
        );
    };
    run(1_500);
    let more: String = (0..400)
        .map(|i| format!("{{\"id\":\"m{i}\",\"data\":{{\"n\":{i}}}}}\n"))
        .collect();
    std::fs::write(dir.path().join("in/part-1.jsonl"), more).unwrap();
    run(400);
    run(0);
    // Refreshing the writer rewrites its rows as new commits: the reader is reset with it,
    // reads the table again from its start and writes each record once (not 1 900 duplicates
    // caught by its ledger, nor 1 900 rows twice once that ledger forgot them).
    let again = sluice_command(
        &[
            "run",
            "--config",
            file.to_str().unwrap(),
            "--refresh",
            "load",
        ],
        Some(dir.path()),
    );
    assert_eq!(again.code, 0, "{again:?}");
    assert!(
        again.stdout.contains("cleared before the run: load, copy"),
        "{}",
        again.stdout
    );
    assert_eq!(
        number_after(&again.stdout, "flow copy:", "rows "),
        1_900,
        "{}",
        again.stdout
    );
    assert_eq!(
        number_after(&again.stdout, "flow copy:", "duplicates "),
        0,
        "{}",
        again.stdout
    );
    let store = Db(db);
    assert_eq!(store.query("SELECT COUNT(*) FROM inc__copies"), 1_900);
    assert_eq!(
        store.query("SELECT COUNT(DISTINCT dedup_key) FROM inc__copies"),
        1_900
    );
}

/// The table's watermark travels down a chain: `ingest` (Pub/Sub with `watermark:`) writes
/// `bronze`, `refine` follows it into `silver`, and a window over `silver` is closed by the
/// watermark `refine` takes over from `bronze`. Every record lands in exactly one window count,
/// and no row of `silver` was committed after its window was emitted (the handed-down
/// watermark never ran ahead of `refine`'s rows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_down_a_chain_closes_with_the_watermark_handed_down() {
    const WINDOW_MS: i64 = 10_000;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("chain-window", 1).await;
    let dir = Workdir::new();
    let db = dir.db("window");
    let file = PipelineYaml::new("test")
        .sqlite(&db)
        .pubsub_emulator()
        .target_table("bronze")
        .target_table("silver")
        .target_window("per10s", "10s", "attribute:region", "0s")
        .flow(
            FlowYaml::pubsub("ingest", "bronze", &subs[0])
                .dedup_attribute("event_id")
                .event_time_attribute("ts")
                .watermark("auto", "10s"),
        )
        .flow(FlowYaml::table("refine", "silver", "bronze"))
        .flow(FlowYaml::table("counts", "per10s", "silver"))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "worker");
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;
    let mut expected: HashMap<(i64, String), i64> = HashMap::new();
    let mut total = 0;
    for wave in 0..10 {
        let messages: Vec<_> = (0..60)
            .map(|i| {
                let ts = sluice_tests::now_ms() - rand::random_range(0..3_000);
                let region = format!("r{}", i % 3);
                *expected
                    .entry((ts - ts.rem_euclid(WINDOW_MS), region.clone()))
                    .or_default() += 1;
                google_cloud_pubsub::model::Message::new()
                    .set_data(bytes::Bytes::from_static(b"{}"))
                    .set_attributes([
                        ("event_id", format!("e{wave}-{i}")),
                        ("ts", ts.to_string()),
                        ("region", region),
                    ])
            })
            .collect();
        total += messages.len() as i64;
        pubsub.publish(&topic, messages).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let store = Db(db);
    let counted = || store.query("SELECT COALESCE(SUM(count), 0) FROM test__per10s__windows");
    let done = eventually(Duration::from_secs(300), || counted() == total).await;
    assert!(
        done,
        "counted {} of {total}; logs:\n{}",
        counted(),
        worker.logs()
    );
    let logs = worker.logs();
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    for ((start, region), count) in &expected {
        assert_eq!(
            store.query(&format!(
                "SELECT count FROM test__per10s__windows
                 WHERE window_start = {start} AND group_key = '{region}'"
            )),
            *count,
            "window {start} {region}"
        );
    }
    assert_eq!(
        store.query(
            "SELECT COUNT(*) FROM test__silver s JOIN test__per10s__windows w
                 ON w.window_start = s.event_time - (s.event_time % 10000)
                AND w.group_key = json_extract(s.attributes, '$.region')
             WHERE s.committed_at > w.emitted_at"
        ),
        0,
        "rows of silver committed after their window was emitted"
    );
    assert!(
        store.query("SELECT COUNT(*) FROM sluice_watermarks w JOIN sluice_flows f USING (flow_id) WHERE f.flow = 'refine'") == 1,
        "refine stores the watermark it takes over"
    );
}
