//! The control API (`proto/sluice/v1/control.proto`) of a running worker: `sluice status` reads
//! the live view from it, `GetStatus`/`ListFlows` report the flow running with its counts, a
//! `Drain` call ends the run like SIGTERM (exit 0, STOPPED, everything committed).
//! `ResetFlow` and `StartUpdate` stop the running flows,
//! clear what was asked and start a new update in which only that replays, each record once;
//! bad requests are refused without touching anything, and a request while another worker runs
//! becomes a pool update both workers take part in (`pool_reset.rs` has a pool of three).
//! These calls carry the bearer token, which they need on loopback too (who may call what:
//! `control_access.rs`).
//!
//! Real parts: the Pub/Sub emulator, `sluice` processes, SQLite, a tonic client.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_proto::v1::control_client::ControlClient;
use sluice_proto::v1::{
    DrainRequest, GetStatusRequest, ListFlowsRequest, ResetFlowRequest, StartUpdateRequest,
};
use sluice_tests::{
    Db, FlowYaml, PipelineOptions, PipelineYaml, PubSub, Workdir, Worker, event, eventually,
    sluice_command,
};
use std::time::Duration;

const TOKEN: &str = "s3cret-token";

/// `control: { listen: 127.0.0.1:PORT, token_file: ... }` with [`TOKEN`] in `dir/token`.
fn control_with_token(dir: &Workdir, port: u16) -> String {
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    format!(
        "{{ listen: \"127.0.0.1:{port}\", token_file: \"{}\" }}",
        token_file.display()
    )
}

/// `message` with `authorization: Bearer TOKEN`.
fn bearer<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    request
}

async fn client(port: u16) -> ControlClient<tonic::transport::Channel> {
    for _ in 0..100 {
        if let Ok(client) = ControlClient::connect(format!("http://127.0.0.1:{port}")).await {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the control API never answered on port {port}");
}

#[tokio::test(flavor = "multi_thread")]
async fn status_and_drain_through_the_control_api() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("control", 1).await;
    let dir = Workdir::new();
    let port = free_port().unwrap();
    let file = dir.pipeline(
        "p.yaml",
        "db",
        &PipelineOptions {
            control: Some(control_with_token(&dir, port)),
            ..PipelineOptions::continuous(&subs[0])
        },
    );
    let db = Db(dir.db("db"));
    let worker = Worker::start(&file, "w");
    let mut client = client(port).await;
    pubsub
        .publish(&topic, (0..500).map(|i| event(&format!("c{i}"))).collect())
        .await;
    assert!(eventually(Duration::from_secs(120), || db.rows() == 500).await);

    // Readiness follows the flows' states on a tick (`READINESS_INTERVAL`): rows can land
    // before the first tick after the flows started.
    let mut status = client
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    for _ in 0..100 {
        if status.ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = client
            .get_status(GetStatusRequest {})
            .await
            .unwrap()
            .into_inner();
    }
    assert_eq!(status.pipeline, "test");
    assert!(status.ready && !status.draining);
    assert!(
        status.worker.contains(&format!("-{}-", worker.pid())),
        "{}",
        status.worker
    );
    assert_eq!(status.flows.len(), 1);
    assert_eq!(status.flows[0].name, "ingest");
    assert_eq!(status.flows[0].state, "RUNNING");
    assert_eq!(status.flows[0].rows, 500);
    assert_eq!(status.flows[0].acked, 500);
    let listed = client
        .list_flows(ListFlowsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.flows, status.flows);

    // `sluice status` shows the live view when the worker answers.
    let out = sluice_command(
        &["status", "-c", file.to_str().unwrap(), "--format", "json"],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["source"], "control_api");
    assert_eq!(json["flows"][0]["state"], "RUNNING");
    assert_eq!(json["flows"][0]["rows"], 500);
    assert_eq!(json["flows"][0]["late"], 0);
    let started = json["flows"][0]["last_run_started_ms"].as_i64().unwrap();
    assert!(started > 1_700_000_000_000, "{json}");
    // This flow has no `watermark:`: none is shown.
    assert!(json["flows"][0]["watermark_ms"].is_null(), "{json}");
    let text = sluice_command(&["status", "-c", file.to_str().unwrap()], None).stdout;
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.starts_with("pipeline test on worker"))
            && text.contains("WATERMARK AGE")
            && text.contains("LAST RUN"),
        "{text}"
    );

    // Drain through the API: the run ends as after SIGTERM.
    let drained = client
        .drain(bearer(DrainRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert!(drained.started);
    let output_path = worker.stdout.clone();
    let logs = worker.logs();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    let output = std::fs::read_to_string(output_path).unwrap();
    assert!(output.contains("flow ingest: STOPPED"), "{output}");
    assert_eq!(db.rows(), 500);
}

/// States of the flows in the worker's live view, in pipeline order.
async fn states(client: &mut ControlClient<tonic::transport::Channel>) -> Vec<String> {
    let status = client.get_status(GetStatusRequest {}).await.unwrap();
    status
        .into_inner()
        .flows
        .into_iter()
        .map(|f| f.state)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_flow_and_start_update_replay_only_what_was_cleared() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("update", 1).await;
    let dir = Workdir::new();
    let port = free_port().unwrap();
    let history = dir.path().join("history.jsonl");
    let records: String = (0..2_000)
        .map(|i| format!("{{\"id\":\"h{i}\",\"data\":{{\"n\":{i}}}}}\n"))
        .collect();
    std::fs::write(&history, records).unwrap();
    let db_path = dir.db("db");
    let file = PipelineYaml::new("test")
        .mode("continuous")
        .sqlite(&db_path)
        .pubsub_emulator()
        .control(&control_with_token(&dir, port))
        .target_table("events")
        .flow(FlowYaml::file("hist", "events", &history.display().to_string()).once())
        .flow(
            FlowYaml::pubsub("live", "events", &subs[0])
                .depends_on(&["hist"])
                .dedup_attribute("event_id"),
        )
        .write(dir.path(), "p.yaml");
    let db = Db(db_path);
    let count = |flow: &str| {
        db.query(&format!(
            "SELECT COUNT(*) FROM test__events WHERE flow = '{flow}'"
        ))
    };
    let at = |agg: &str, flow: &str| {
        db.query(&format!(
            "SELECT COALESCE({agg}(committed_at), 0) FROM test__events WHERE flow = '{flow}'"
        ))
    };
    let exactly_once = |n: i64| {
        assert_eq!(db.rows(), n, "rows");
        assert_eq!(db.distinct_keys(), n, "distinct keys");
    };
    let worker = Worker::start(&file, "w");
    let mut client = client(port).await;
    pubsub
        .publish(&topic, (0..300).map(|i| event(&format!("l{i}"))).collect())
        .await;
    assert!(
        eventually(Duration::from_secs(120), || count("hist") == 2_000
            && count("live") == 300)
        .await,
        "{}",
        worker.logs()
    );
    assert_eq!(states(&mut client).await, ["COMPLETED", "RUNNING"]);
    let first_read = at("max", "hist");

    // Bad requests are refused and change nothing: an unknown flow, a seek the subscription
    // cannot replay (it does not retain acked messages).
    let unknown = client
        .reset_flow(bearer(ResetFlowRequest {
            flow: "nope".into(),
            seek: String::new(),
            drop_unread: false,
        }))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::InvalidArgument, "{unknown:?}");
    assert!(
        unknown.message().contains("no flow named `nope`"),
        "{unknown:?}"
    );
    let seek = client
        .reset_flow(bearer(ResetFlowRequest {
            flow: "live".into(),
            seek: "0".into(),
            drop_unread: false,
        }))
        .await
        .unwrap_err();
    assert_eq!(seek.code(), tonic::Code::InvalidArgument, "{seek:?}");
    assert!(
        seek.message().contains("does not retain acked messages"),
        "{seek:?}"
    );
    assert_eq!(states(&mut client).await, ["COMPLETED", "RUNNING"]);
    assert_eq!(at("max", "hist"), first_read);

    // ResetFlow(hist): the running flows stop, hist is cleared and re-read in full, each record
    // once; the live flow's rows stay (acked messages do not come back) and it runs again
    // after hist.
    let reset = client
        .reset_flow(bearer(ResetFlowRequest {
            flow: "hist".into(),
            seek: String::new(),
            drop_unread: false,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reset.update, 2);
    assert!(
        reset.message.contains("flow hist reset"),
        "{}",
        reset.message
    );
    assert!(
        eventually(Duration::from_secs(120), || count("hist") == 2_000
            && at("min", "hist") > first_read)
        .await,
        "hist was not re-read; logs:\n{}",
        worker.logs()
    );
    exactly_once(2_300);
    let mut live_again = false;
    for _ in 0..100 {
        if states(&mut client).await == ["COMPLETED", "RUNNING"] {
            live_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(live_again, "{:?}", states(&mut client).await);
    // The live flow of the new update receives what is published now. (The emulator holds a
    // subscription's new streams back for up to about 3 minutes after a stream of it closed,
    // ARCHITECTURE.md, "Pub/Sub client facts we build on".)
    pubsub
        .publish(
            &topic,
            (300..500).map(|i| event(&format!("l{i}"))).collect(),
        )
        .await;
    assert!(
        eventually(Duration::from_secs(300), || count("live") == 500).await,
        "{}",
        worker.logs()
    );
    exactly_once(2_500);

    // StartUpdate with a full refresh: every flow is cleared, the chain runs again from hist.
    let second_read = at("max", "hist");
    let update = client
        .start_update(bearer(StartUpdateRequest {
            full_refresh: true,
            refresh_flows: vec![],
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(update.update, 3);
    assert!(
        eventually(Duration::from_secs(120), || count("hist") == 2_000
            && at("min", "hist") > second_read)
        .await,
        "{}",
        worker.logs()
    );
    exactly_once(2_500);

    // A second worker of the pipeline is running: the update becomes a pool update, which
    // both stop their flows for before `hist` is cleared, once.
    let other_file = dir.path().join("other.yaml");
    std::fs::write(
        &other_file,
        std::fs::read_to_string(&file).unwrap().replace(
            &format!("control: {}\n", control_with_token(&dir, port)),
            "",
        ),
    )
    .unwrap();
    let other = Worker::start(&other_file, "other");
    let other_pid = other.pid();
    assert!(
        eventually(Duration::from_secs(60), || db.query(&format!(
            "SELECT COUNT(*) FROM sluice_workers WHERE pid = {other_pid}"
        )) == 1)
        .await,
        "{}",
        other.logs()
    );
    let third_read = at("max", "hist");
    let pooled = client
        .start_update(bearer(StartUpdateRequest {
            full_refresh: false,
            refresh_flows: vec!["hist".into()],
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(pooled.message.contains("hist"), "{pooled:?}");
    assert!(
        eventually(Duration::from_secs(30), || other
            .logs()
            .contains("pool update done; resuming"))
        .await,
        "{}",
        other.logs()
    );
    assert!(
        eventually(Duration::from_secs(120), || count("hist") == 2_000
            && at("min", "hist") > third_read)
        .await,
        "{}\n{}",
        worker.logs(),
        other.logs()
    );
    exactly_once(2_500);
    other.terminate();
    assert!(other.wait(Duration::from_secs(60)).success());

    let drained = client
        .drain(bearer(DrainRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert!(drained.started);
    let logs = worker.logs();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    exactly_once(2_500);
}
