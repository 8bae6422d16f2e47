//! Flows ordered by `depends_on` (SPEC §6), end to end on the real emulator and real stores:
//! the three patterns of Lakeflow's flow-ordering documentation (backfill then live; two
//! backfills in parallel then live; chained backfills), persistent completion across restarts,
//! `reset` of the live flow with `--seek`, `full-refresh`, and a failing flow whose dependents
//! are SKIPPED.
//!
//! Order is read from the rows themselves (`committed_at`), never from timings: no live row may
//! be committed before the last backfill row, and chained backfills may not overlap. Counts are
//! exact: every published or written record once, duplicates none.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    Db, FlowYaml, PgDb, PipelineYaml, PubSub, Workdir, Worker, event, events_with_duplicates,
    eventually, now_ms, sluice_command, unique,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Writes `files` JSONL files under `dir/sub` holding records `{prefix}0..{prefix}{n}` (split
/// evenly), plus `dups` records repeated in a later file, plus the given bad lines in the last
/// file. Returns the glob.
fn history(
    dir: &Path,
    sub: &str,
    prefix: &str,
    n: usize,
    files: usize,
    dups: usize,
    bad: &[&str],
) -> String {
    let folder = dir.join(sub);
    std::fs::create_dir_all(&folder).unwrap();
    let per_file = n.div_ceil(files);
    for f in 0..files {
        let mut text = String::new();
        for i in (f * per_file)..((f + 1) * per_file).min(n) {
            text.push_str(&format!(
                "{{\"id\":\"{prefix}{i}\",\"data\":{{\"n\":{i}}},\"attributes\":{{\"src\":\"file\"}},\"event_time\":{}}}\n",
                1_700_000_000_000_i64 + i as i64
            ));
        }
        if f == files - 1 {
            for i in 0..dups {
                text.push_str(&format!("{{\"id\":\"{prefix}{i}\",\"data\":\"ZHVw\"}}\n"));
            }
            for line in bad {
                text.push_str(line);
                text.push('\n');
            }
        }
        std::fs::write(folder.join(format!("part-{f:02}.jsonl")), text).unwrap();
    }
    folder.join("*.jsonl").display().to_string()
}

/// `sluice ARGS` run to its end in `dir`: exit code, stdout, stderr.
fn sluice(args: &[&str], dir: &Path) -> (i32, String, String) {
    let out = sluice_command(args, Some(dir));
    (out.code, out.stdout, out.stderr)
}

/// Stops a continuous worker with SIGTERM and returns its stdout (the flow outcome lines).
fn stop(worker: Worker) -> String {
    worker.terminate();
    let (logs, out) = (worker.logs(), worker.stdout.clone());
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    std::fs::read_to_string(out).unwrap()
}

/// Waits (at most `within`) until `done` holds for a running `worker`, failing with its logs
/// and `what()` otherwise.
async fn wait_for(
    worker: &Worker,
    within: Duration,
    done: impl FnMut() -> bool,
    what: impl Fn() -> String,
) {
    let held = eventually(within, done).await;
    assert!(held, "{}; logs:\n{}", what(), worker.logs());
}

fn flow_line<'a>(output: &'a str, flow: &str) -> &'a str {
    let prefix = format!("flow {flow}: ");
    output
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no outcome line for {flow} in {output:?}"))
}

/// Pattern 1 (backfill then live on one table), continuous, on SQLite, after its first run:
/// what the tests of a restart, a reset and a full refresh start from.
struct FirstRun {
    pubsub: PubSub,
    topic: String,
    dir: Workdir,
    file: PathBuf,
    store: Db,
    /// A time before every live message: a seek to it replays them all.
    seek_to: i64,
    /// When the backfill's last row was committed.
    backfill_done: i64,
}

impl FirstRun {
    /// Writes the pipeline (8 000 history records in 4 files, 200 of them repeated, 2 lines that
    /// cannot be records; 1 000 live events plus 100 publisher duplicates already published),
    /// runs it until every record is in, stops it, and checks the first run: the backfill
    /// COMPLETED before the first live row, each record once, the two bad lines dead letters.
    async fn run() -> Self {
        let pubsub = PubSub::connect().await;
        let topic = unique("order");
        pubsub.admin.create_topic(&topic).await.unwrap();
        let subscription = format!("{topic}-sub");
        pubsub
            .admin
            .create_replayable_subscription(&subscription, &topic, 10)
            .await
            .unwrap();
        let dir = Workdir::new();
        let glob = history(
            dir.path(),
            "history",
            "h",
            8_000,
            4,
            200,
            &["this is not json", r#"{"data":"bm8gaWQ="}"#],
        );
        let db = dir.db("order");
        let file = PipelineYaml::new("test")
            .mode("continuous")
            .sqlite(&db)
            .pubsub_emulator()
            .target_table("events")
            .flow(FlowYaml::file("events_backfill", "events", &glob).once())
            .flow(
                FlowYaml::pubsub("events_live", "events", &subscription)
                    .depends_on(&["events_backfill"])
                    .dedup_attribute("event_id")
                    .batch(500, "20ms")
                    .streams(2),
            )
            .write(dir.path(), "p.yaml");
        let store = Db(db.clone());
        // The live subscription has its messages before the worker starts: without depends_on
        // the live flow would write at once, beside the backfill.
        let seek_to = now_ms() - 1_000;
        pubsub
            .publish(&topic, events_with_duplicates("live", 1_000, 100))
            .await;
        let mut first = Self {
            pubsub,
            topic,
            dir,
            file,
            store,
            seek_to,
            backfill_done: 0,
        };
        let worker = Worker::start(&first.file, "first");
        let all_in =
            || first.count("events_backfill") == 8_000 && first.count("events_live") == 1_000;
        wait_for(&worker, Duration::from_secs(180), all_in, || first.rows()).await;
        let output = stop(worker);
        assert!(
            flow_line(&output, "events_backfill").contains("COMPLETED"),
            "{output}"
        );
        assert!(
            flow_line(&output, "events_live").contains("STOPPED"),
            "{output}"
        );
        first.backfill_done = first.max_at("events_backfill");
        assert!(
            first.backfill_done <= first.min_at("events_live"),
            "a live row ({}) was committed before the last backfill row ({})",
            first.min_at("events_live"),
            first.backfill_done
        );
        assert_eq!(first.store.rows(), 9_000);
        assert_eq!(first.store.distinct_keys(), 9_000, "each record once");
        // The two lines that are not records are dead letters, with their reasons.
        assert_eq!(first.store.dead_letters(), 2);
        assert_eq!(
            first.store.query(
                "SELECT COUNT(*) FROM test__dead_letter WHERE reason IN ('undecodable', 'missing_id')"
            ),
            2
        );
        first
    }

    fn count(&self, flow: &str) -> i64 {
        self.store.query(&format!(
            "SELECT COUNT(*) FROM test__events WHERE flow = '{flow}'"
        ))
    }

    fn max_at(&self, flow: &str) -> i64 {
        self.store.query(&format!(
            "SELECT COALESCE(MAX(committed_at), 0) FROM test__events WHERE flow = '{flow}'"
        ))
    }

    fn min_at(&self, flow: &str) -> i64 {
        self.store.query(&format!(
            "SELECT COALESCE(MIN(committed_at), 0) FROM test__events WHERE flow = '{flow}'"
        ))
    }

    fn rows(&self) -> String {
        format!(
            "rows: backfill {} live {}",
            self.count("events_backfill"),
            self.count("events_live")
        )
    }

    /// 200 more live events (`live1000..live1200`).
    async fn publish_more(&self) {
        self.pubsub
            .publish(
                &self.topic,
                (1_000..1_200).map(|i| event(&format!("live{i}"))).collect(),
            )
            .await;
    }

    /// Runs the pipeline as worker `name` until the live flow has all 1 200 rows, stops it and
    /// checks that the backfill is as it was: IDLE, not re-read, each record once.
    async fn run_live_to_the_end(&self, name: &str) {
        let worker = Worker::start(&self.file, name);
        let live_complete = || self.count("events_live") == 1_200;
        wait_for(&worker, Duration::from_secs(300), live_complete, || {
            self.rows()
        })
        .await;
        let output = stop(worker);
        assert!(
            flow_line(&output, "events_backfill").contains("IDLE"),
            "{output}"
        );
        assert_eq!(
            self.max_at("events_backfill"),
            self.backfill_done,
            "the backfill was re-read"
        );
        assert_eq!(self.store.rows(), 9_200);
        assert_eq!(self.store.distinct_keys(), 9_200);
    }

    /// `sluice ARGS -c FILE` succeeded.
    fn sluice_ok(&self, args: &[&str]) {
        let mut args = args.to_vec();
        args.extend(["-c", self.file.to_str().unwrap()]);
        let (code, stdout, stderr) = sluice(&args, self.dir.path());
        assert_eq!(code, 0, "{stdout}{stderr}");
    }
}

/// Pattern 1, then a restart: the backfill is IDLE and not re-read, live carries on; then a
/// reset of the live flow without a seek keeps its rows (acked messages do not come back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfill_then_live_then_a_restart_reads_only_what_is_new() {
    let first = FirstRun::run().await;
    first.publish_more().await;
    first.run_live_to_the_end("second").await;
    first.sluice_ok(&["reset", "events_live"]);
    assert_eq!(
        first.count("events_live"),
        1_200,
        "rows that cannot be replayed stay"
    );
}

/// Pattern 1, then a reset of the live flow seeking its subscription back: only the live flow
/// replays, the backfill's rows stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_with_seek_replays_only_the_live_flow() {
    let first = FirstRun::run().await;
    first.publish_more().await;
    let seek = first.seek_to.to_string();
    // Everything published before the seek time was ingested: nothing is dropped.
    first.sluice_ok(&["reset", "events_live", "--seek", &seek, "--drop-unread"]);
    assert_eq!(
        first.count("events_live"),
        0,
        "reset deletes the flow's rows"
    );
    assert_eq!(first.count("events_backfill"), 8_000, "and no other flow's");
    let live_reset_at = now_ms();
    first.run_live_to_the_end("after-reset").await;
    assert!(first.min_at("events_live") >= live_reset_at);
}

/// Pattern 1, then a full refresh with a seek: the chain runs again from the start, in order,
/// each record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_refresh_runs_the_chain_again_in_order() {
    let first = FirstRun::run().await;
    first.publish_more().await;
    let seek = first.seek_to.to_string();
    // Everything published before the seek time was ingested: nothing is dropped.
    first.sluice_ok(&["full-refresh", "--seek", &seek, "--drop-unread"]);
    assert_eq!(first.store.rows(), 0);
    assert_eq!(first.store.dead_letters(), 0);
    let refreshed_at = now_ms();
    let worker = Worker::start(&first.file, "after-refresh");
    let again = || first.count("events_backfill") == 8_000 && first.count("events_live") == 1_200;
    wait_for(&worker, Duration::from_secs(300), again, || first.rows()).await;
    let output = stop(worker);
    assert!(
        flow_line(&output, "events_backfill").contains("COMPLETED"),
        "{output}"
    );
    assert!(
        first.min_at("events_backfill") >= refreshed_at,
        "the backfill ran again"
    );
    assert!(
        first.max_at("events_backfill") <= first.min_at("events_live"),
        "order kept after the refresh"
    );
    assert_eq!(first.store.rows(), 9_200);
    assert_eq!(first.store.distinct_keys(), 9_200);
    assert_eq!(first.store.dead_letters(), 2);
}

/// Patterns 2 and 3 in one triggered run on PostgreSQL, after its first run: two backfills in
/// parallel, then a third chained after both, then the live flow, and a `table` source that
/// copies the target after all its writers (a data edge).
struct ChainRun {
    _database: sluice_store::ScratchDatabase,
    db: PgDb,
    pubsub: PubSub,
    topic: String,
    dir: Workdir,
    file: PathBuf,
    /// Rows the first run wrote.
    rows: i64,
}

impl ChainRun {
    /// Writes the pipeline (`per_backfill` records in each backfill, `live` events plus a tenth
    /// as publisher duplicates already published) and runs it once: each flow starts only after
    /// its predecessors' last row, and the run ends by itself with every record once; the copy
    /// waited for every writer and holds each row once.
    async fn run(per_backfill: usize, live: usize) -> Self {
        let database = sluice_store::ScratchDatabase::create().await.unwrap();
        let db = PgDb(database.url().to_owned());
        let pubsub = PubSub::connect().await;
        let (topic, subs) = pubsub.topic_with("chain", 1).await;
        pubsub
            .publish(&topic, events_with_duplicates("live", live, live / 10))
            .await;
        let dir = Workdir::new();
        let a = history(dir.path(), "a", "a", per_backfill, 2, 0, &[]);
        let b = history(dir.path(), "b", "b", per_backfill, 2, 0, &[]);
        let c = history(dir.path(), "c", "c", per_backfill, 2, 50, &[]);
        let file = PipelineYaml::new("test")
            .mode("triggered")
            .store(database.url())
            .pubsub_emulator()
            .target_table("events")
            .target_table("events_copy")
            .flow(FlowYaml::table("copy", "events_copy", "events"))
            .flow(FlowYaml::file("hist_a", "events", &a).once())
            .flow(FlowYaml::file("hist_b", "events", &b).once())
            .flow(
                FlowYaml::file("hist_c", "events", &c)
                    .once()
                    .depends_on(&["hist_a", "hist_b"]),
            )
            .flow(
                FlowYaml::pubsub("live", "events", &subs[0])
                    .depends_on(&["hist_c"])
                    .dedup_attribute("event_id")
                    .drain_idle("20s")
                    .streams(2),
            )
            .write(dir.path(), "p.yaml");
        let rows = (3 * per_backfill + live) as i64;
        let chain = Self {
            _database: database,
            db,
            pubsub,
            topic,
            dir,
            file,
            rows,
        };
        chain.first_run(per_backfill, live).await;
        chain
    }

    async fn first_run(&self, per_backfill: usize, live: usize) {
        let db = &self.db;
        let worker = Worker::start(&self.file, "triggered");
        let status = worker.wait(Duration::from_secs(240));
        let output = std::fs::read_to_string(self.dir.path().join("triggered.out")).unwrap();
        let logs = std::fs::read_to_string(self.dir.path().join("triggered.err")).unwrap();
        assert!(status.success(), "{output}\n{logs}");
        for flow in ["hist_a", "hist_b", "hist_c", "live"] {
            assert!(flow_line(&output, flow).contains("COMPLETED"), "{output}");
        }
        let at = |agg: &str, flow: &str| {
            db.query(&format!(
                "SELECT (extract(epoch FROM {agg}(committed_at)) * 1000000)::int8 FROM test__events WHERE flow = '{flow}'"
            ))
        };
        let backfills_done = at("max", "hist_a").max(at("max", "hist_b"));
        assert!(
            at("min", "hist_c") >= backfills_done,
            "hist_c started before hist_a and hist_b had finished"
        );
        assert!(
            at("min", "live") >= at("max", "hist_c"),
            "live started before hist_c finished"
        );
        for (flow, n) in [
            ("hist_a", per_backfill),
            ("hist_b", per_backfill),
            ("hist_c", per_backfill),
            ("live", live),
        ] {
            let rows = db.query(&format!(
                "SELECT count(*) FROM test__events WHERE flow = '{flow}'"
            ));
            assert_eq!(rows, n as i64, "{flow}");
        }
        db.assert_exactly_once(self.rows as usize);
        // The copy waited for every writer of `events` (a data edge) and holds each row once.
        assert!(flow_line(&output, "copy").contains("COMPLETED"), "{output}");
        let copied_by_writer = db.text(
            "SELECT string_agg(w || ' ' || n, ', ' ORDER BY w) FROM (SELECT \
             split_part(dedup_key, '/', 1) AS w, count(*) AS n FROM test__events_copy GROUP BY 1) c",
        );
        assert_eq!(
            db.query("SELECT count(*) FROM test__events_copy"),
            self.rows,
            "copied per writer {copied_by_writer:?}; the copy's first commit at {} µs, the writers' \
             last commits: hist_c {}, live {}\n{output}\n{logs}",
            db.query(
                "SELECT (extract(epoch FROM min(committed_at)) * 1000000)::int8 FROM test__events_copy"
            ),
            at("max", "hist_c"),
            at("max", "live"),
        );
        assert_eq!(
            db.query("SELECT count(DISTINCT dedup_key) FROM test__events_copy"),
            self.rows
        );
        let copy_started = db.query(
            "SELECT (extract(epoch FROM min(committed_at)) * 1000000)::int8 FROM test__events_copy",
        );
        assert!(
            copy_started >= at("max", "live"),
            "the copy started before a writer finished"
        );
    }
}

/// Patterns 2 and 3: the first run (see [`ChainRun::run`]); then a seek reset of the live flow
/// is refused, since its subscription does not retain acked messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_then_chained_backfills_then_live() {
    let chain = ChainRun::run(3_000, 1_000).await;
    // Seeking the subscription could not replay the rows a seek reset deletes, so the reset is
    // refused and nothing is touched.
    let (code, stdout, stderr) = sluice(
        &[
            "reset",
            "live",
            "-c",
            chain.file.to_str().unwrap(),
            "--seek",
            "0",
        ],
        chain.dir.path(),
    );
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("does not retain acked messages"),
        "{stderr}"
    );
    chain.db.assert_exactly_once(chain.rows as usize);
}

/// Patterns 2 and 3 run a second time (a smaller first run, see [`ChainRun::run`]): the
/// backfills are IDLE, the live flow drains what is new, and the copy reads the whole table
/// again and writes only the new rows.
///
/// The second run reads a second subscription of the topic, made after the first run, so that
/// it holds just what is new. A restart on the same subscription is
/// `backfill_then_live_then_a_restart_reads_only_what_is_new`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_triggered_run_reads_only_what_is_new() {
    let chain = ChainRun::run(300, 100).await;
    let fresh = format!("{}-second-run", chain.topic);
    chain
        .pubsub
        .admin
        .create_subscription(&fresh, &chain.topic, 10)
        .await
        .unwrap();
    let first = std::fs::read_to_string(&chain.file).unwrap();
    let subscription = format!("{}-sub0", chain.topic);
    assert!(first.contains(&subscription), "{first}");
    std::fs::write(&chain.file, first.replace(&subscription, &fresh)).unwrap();
    chain
        .pubsub
        .publish(
            &chain.topic,
            (1_000..1_200).map(|i| event(&format!("live{i}"))).collect(),
        )
        .await;
    let worker = Worker::start(&chain.file, "triggered-again");
    let status = worker.wait(Duration::from_secs(240));
    let output = std::fs::read_to_string(chain.dir.path().join("triggered-again.out")).unwrap();
    assert!(status.success(), "{output}");
    for flow in ["hist_a", "hist_b", "hist_c"] {
        assert!(flow_line(&output, flow).contains("IDLE"), "{output}");
    }
    assert!(flow_line(&output, "live").contains("COMPLETED"), "{output}");
    let rows = chain.rows + 200;
    chain.db.assert_exactly_once(rows as usize);
    // The copy read the whole table again and wrote only the 200 new rows.
    assert!(flow_line(&output, "copy").contains("rows 200,"), "{output}");
    assert_eq!(
        chain
            .db
            .query("SELECT count(DISTINCT dedup_key) FROM test__events_copy"),
        rows
    );
    assert_eq!(
        chain.db.query("SELECT count(*) FROM test__events_copy"),
        rows
    );
}

/// A flow that cannot read its files fails (after its retries) and its dependents are SKIPPED,
/// never started; an independent flow completes; the run exits 1.
#[test]
fn a_failing_flow_skips_its_dependents() {
    let dir = Workdir::new();
    let good = history(dir.path(), "good", "g", 100, 1, 0, &[]);
    let missing = dir.path().join("missing").join("*.jsonl");
    let db: PathBuf = dir.db("fail");
    let good_file = |name: &str| FlowYaml::file(name, "events", &good).once();
    let file = PipelineYaml::new("test")
        .mode("triggered")
        .sqlite(&db)
        .target_table("events")
        .flow(FlowYaml::file("broken", "events", &missing.display().to_string()).once())
        .flow(good_file("after_broken").depends_on(&["broken"]))
        .flow(good_file("then_this").depends_on(&["after_broken"]))
        .flow(good_file("independent"))
        .write(dir.path(), "p.yaml");
    let (code, stdout, stderr) = sluice(&["run", "-c", file.to_str().unwrap()], dir.path());
    assert_eq!(code, 1, "{stdout}{stderr}");
    let broken = flow_line(&stdout, "broken");
    assert!(
        broken.contains("FAILED") && broken.contains("no file matches"),
        "{stdout}"
    );
    assert!(
        flow_line(&stdout, "after_broken")
            .contains("SKIPPED (predecessor broken did not complete)"),
        "{stdout}"
    );
    assert!(
        flow_line(&stdout, "then_this").contains("SKIPPED"),
        "{stdout}"
    );
    assert!(
        flow_line(&stdout, "independent").contains("COMPLETED"),
        "{stdout}"
    );
    assert_eq!(
        stderr.matches("flow failed; retrying").count(),
        3,
        "{stderr}"
    );
    let store = Db(db);
    let rows = |flow: &str| {
        store.query(&format!(
            "SELECT COUNT(*) FROM test__events WHERE flow = '{flow}'"
        ))
    };
    assert_eq!(rows("independent"), 100);
    assert_eq!(rows("after_broken"), 0, "a skipped flow never starts");
    assert_eq!(rows("then_this"), 0);
    // Completion is recorded only for what completed: the next run re-tries the broken chain
    // and leaves the independent flow IDLE.
    let (code, stdout, _) = sluice(&["run", "-c", file.to_str().unwrap()], dir.path());
    assert_eq!(code, 1);
    assert!(
        flow_line(&stdout, "independent").contains("IDLE"),
        "{stdout}"
    );
    assert!(
        flow_line(&stdout, "after_broken").contains("SKIPPED"),
        "{stdout}"
    );
}
