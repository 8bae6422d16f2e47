//! The worker's metrics on a real Prometheus (Debian's `prometheus` package): a worker ingests a
//! known stream; a Prometheus started on a free port scrapes it every second; its HTTP API then
//! says committed = rows in the target, duplicates = duplicates published, acked = received
//! minus what is still in flight. Every PromQL expression of the shipped dashboard and alert
//! rules runs against that Prometheus without error, and the dashboard's expressions over
//! metrics the worker emits return data. The rules also pass `promtool check rules` and their
//! unit tests (`promtool test rules`).
//!
//! Real parts: the Pub/Sub emulator, a `sluice` process with SQLite, Prometheus, promtool.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_tests::{
    Db, PipelineOptions, PubSub, Workdir, Worker, events_with_duplicates, eventually,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn chart_files() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/sluice/files")
}

/// GET `url` with curl; (HTTP status, body).
fn get(url: &str, query: Option<&str>) -> (u16, String) {
    let mut command = Command::new("curl");
    command.args(["-s", "-o", "-", "-w", "\n%{http_code}", "--get", url]);
    if let Some(query) = query {
        command.args(["--data-urlencode", &format!("query={query}")]);
    }
    let out = command.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// A Prometheus server on a free port, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn scraping(target: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}
scrape_configs:
  - job_name: sluice
    static_configs: [{{ targets: ['{target}'] }}]
"
            ),
        )
        .unwrap();
        let port = free_port().unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus (Debian package `prometheus`) must be installed");
        Self {
            child,
            port,
            _dir: dir,
        }
    }

    /// The result vector of an instant query; panics if Prometheus reports an error.
    fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let (status, body) = get(
            &format!("http://127.0.0.1:{}/api/v1/query", self.port),
            Some(promql),
        );
        let json: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|_| panic!("{promql}: HTTP {status}: {body}"));
        assert_eq!(json["status"], "success", "{promql}: {body}");
        json["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The value of a query returning one sample (`None` when it returns none).
    fn scalar(&self, promql: &str) -> Option<f64> {
        let result = self.query(promql);
        result
            .first()
            .and_then(|sample| sample["value"][1].as_str())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every `expr` of the dashboard, with the `$pipeline` variable set to match all.
fn dashboard_expressions() -> Vec<String> {
    let text = std::fs::read_to_string(chart_files().join("sluice-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut expressions = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            expressions.push(expr.replace("$pipeline", ".+"));
        }
    }
    expressions
}

/// Every `expr` of the alert rules.
fn rule_expressions() -> Vec<String> {
    let text = std::fs::read_to_string(chart_files().join("sluice-alerts.yaml")).unwrap();
    let rules: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap().clone())
        .map(|rule| rule["expr"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn alert_rules_pass_promtool() {
    for args in [
        ["check", "rules", "sluice-alerts.yaml"],
        ["test", "rules", "sluice-alerts.test.yaml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(chart_files())
            .output()
            .expect("promtool (Debian package `prometheus`) must be installed");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Before the first message, every counter of the flow is exported with the value 0, for each
/// label value sluice can emit (so `rate()`, alerts and panels have a series from the start),
/// and the watermark gauges are absent until the flow has a watermark.
fn assert_counters_start_at_zero(listen: &str) {
    let (status, text) = get(&format!("http://{listen}/metrics"), None);
    assert_eq!(status, 200);
    let mut expected: Vec<String> = [
        "sluice_messages_received_total",
        "sluice_messages_committed_total",
        "sluice_messages_acked_total",
        "sluice_messages_late_total",
        "sluice_messages_stale_total",
        "sluice_dedup_key_missing_total",
    ]
    .iter()
    .map(|name| format!("{name}{{pipeline=\"test\",flow=\"ingest\"}}"))
    .collect();
    for layer in ["memory", "store"] {
        expected.push(format!(
            "sluice_messages_duplicate_total{{pipeline=\"test\",flow=\"ingest\",layer=\"{layer}\"}}"
        ));
    }
    for reason in [
        "bad_timestamp",
        "max_attempts",
        "missing_dedup_attribute",
        "missing_id",
        "record_too_large",
        "reserved_attribute",
        "undecodable",
        "unstorable",
    ] {
        expected.push(format!(
            "sluice_messages_dead_lettered_total{{pipeline=\"test\",flow=\"ingest\",reason=\"{reason}\"}}"
        ));
    }
    for kind in [
        "config",
        "gave_up",
        "rejected",
        "stage",
        "stage_unavailable",
        "stale",
        "unavailable",
    ] {
        expected.push(format!(
            "sluice_commit_errors_total{{pipeline=\"test\",flow=\"ingest\",kind=\"{kind}\"}}"
        ));
    }
    // The flow has no watermark yet: its gauges are absent, not 0 ("perfectly fresh").
    for gauge in [
        "sluice_watermark_timestamp_seconds",
        "sluice_data_watermark_age_seconds",
    ] {
        assert!(
            !text
                .lines()
                .any(|line| line.starts_with(&format!("{gauge}{{"))),
            "{gauge} exported before the flow has a watermark:\n{text}"
        );
    }
    // Every family has its help text.
    let undescribed: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter(|family| {
            !text
                .lines()
                .any(|line| line.starts_with(&format!("# HELP {family} ")))
        })
        .collect();
    assert!(
        undescribed.is_empty(),
        "no # HELP for {undescribed:?}\n/metrics:\n{text}"
    );
    let missing: Vec<&String> = expected
        .iter()
        .filter(|series| !text.lines().any(|line| line == format!("{series} 0")))
        .collect();
    assert!(
        missing.is_empty(),
        "not exported at 0 before the first message: {missing:#?}\n/metrics:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_sees_what_the_store_holds_and_every_shipped_query_runs() {
    const DISTINCT: usize = 3_000;
    const DUPLICATES: usize = 300;
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("metrics", 1).await;
    let dir = Workdir::new();
    let metrics_port = free_port().unwrap();
    let listen = format!("127.0.0.1:{metrics_port}");
    let file = dir.pipeline(
        "p.yaml",
        "db",
        &PipelineOptions {
            metrics_listen: Some(listen.clone()),
            watermark: Some("{ tracking_subscription: auto, band: 10s }"),
            ..PipelineOptions::continuous(&subs[0])
        },
    );
    let db = Db(dir.db("db"));
    let worker = Worker::start(&file, "w");
    assert!(
        eventually(Duration::from_secs(60), || {
            get(&format!("http://{listen}/readyz"), None).0 == 200
        })
        .await,
        "never ready; logs:\n{}",
        worker.logs()
    );
    assert_eq!(get(&format!("http://{listen}/healthz"), None).0, 200);
    assert_eq!(get(&format!("http://{listen}/nope"), None).0, 404);
    assert_counters_start_at_zero(&listen);

    let prometheus = Prometheus::scraping(&listen);
    // The tracking subscription sees what is published after it exists.
    pubsub
        .wait_until_exists(&format!("{}-tracking", subs[0]), Duration::from_secs(60))
        .await;
    pubsub
        .publish(&topic, events_with_duplicates("m", DISTINCT, DUPLICATES))
        .await;
    assert!(eventually(Duration::from_secs(120), || db.rows() == DISTINCT as i64).await);

    // Wait until Prometheus has scraped the final counts.
    let committed = "sum(sluice_messages_committed_total)";
    assert!(
        eventually(Duration::from_secs(60), || {
            prometheus.scalar(committed) == Some(DISTINCT as f64)
        })
        .await,
        "Prometheus says {:?} committed, the table holds {}",
        prometheus.scalar(committed),
        db.rows()
    );
    assert_eq!(prometheus.scalar(committed), Some(db.rows() as f64));
    assert_eq!(
        prometheus.scalar("sum(sluice_messages_duplicate_total)"),
        Some(DUPLICATES as f64),
        "duplicates published"
    );
    let received = prometheus
        .scalar("sum(sluice_messages_received_total)")
        .unwrap();
    let acked = prometheus
        .scalar("sum(sluice_messages_acked_total)")
        .unwrap();
    let in_flight = prometheus.scalar("sum(sluice_inflight_messages)").unwrap();
    assert_eq!(
        acked,
        received - in_flight,
        "acked = received - uncommitted"
    );
    assert!(received >= (DISTINCT + DUPLICATES) as f64);
    assert_eq!(prometheus.scalar("sum(sluice_ready)"), Some(1.0));
    assert_eq!(
        prometheus.scalar(r#"sluice_flow_state{flow="ingest",state="RUNNING"}"#),
        Some(1.0)
    );
    assert_eq!(prometheus.scalar("count(sluice_build_info)"), Some(1.0));
    // The watermark: published as a timestamp and an age; nothing committed below it.
    assert!(
        eventually(Duration::from_secs(60), || {
            prometheus
                .scalar("max(sluice_data_watermark_age_seconds)")
                .is_some_and(|age| age > 0.0 && age < 120.0)
        })
        .await,
        "watermark age {:?}",
        prometheus.scalar("max(sluice_data_watermark_age_seconds)")
    );
    assert!(
        prometheus
            .scalar("max(sluice_watermark_timestamp_seconds)")
            .is_some_and(|t| t > 1.7e9)
    );
    assert_eq!(
        prometheus.scalar("sum(sluice_messages_late_total)"),
        Some(0.0)
    );
    // Everything is acked: no system lag; the memory tier holds the committed keys.
    assert!(
        eventually(Duration::from_secs(30), || {
            prometheus.scalar("max(sluice_oldest_unacked_message_age_seconds)") == Some(0.0)
        })
        .await
    );
    assert!(
        prometheus
            .scalar("sum(sluice_dedup_cache_entries)")
            .is_some_and(|entries| entries > 0.0)
    );
    assert!(
        prometheus
            .scalar("sum(sluice_commit_duration_seconds_count)")
            .unwrap()
            >= 1.0
    );

    // The shipped queries: all run; those over metrics the worker emits return data (rates
    // need a few samples in their range first).
    assert!(
        eventually(Duration::from_secs(30), || {
            prometheus
                .scalar("min(count_over_time(sluice_messages_received_total[5m]))")
                .is_some_and(|samples| samples >= 3.0)
        })
        .await
    );
    let emitted = [
        "sluice_messages_received_total",
        "sluice_messages_committed_total",
        "sluice_messages_acked_total",
        "sluice_messages_duplicate_total",
        "sluice_commit_duration_seconds",
        "sluice_ack_latency_seconds",
        "sluice_inflight_messages",
        "sluice_flow_state",
        "sluice_ready",
        "sluice_oldest_unacked_message_age_seconds",
        "sluice_watermark_timestamp_seconds",
        "sluice_data_watermark_age_seconds",
        "sluice_messages_late_total",
    ];
    for expr in dashboard_expressions() {
        let result = prometheus.query(&expr);
        if emitted.iter().any(|metric| expr.contains(metric)) {
            assert!(!result.is_empty(), "no data for dashboard query {expr}");
        }
    }
    for expr in rule_expressions() {
        prometheus.query(&expr);
    }

    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());
}
