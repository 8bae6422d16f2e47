//! The control API (`proto/sluice/v1/control.proto`) of a running worker: `sluice status` reads
//! the live view from it, `GetStatus`/`ListFlows` report the flow running with its counts, a
//! `Drain` call ends the run like SIGTERM (exit 0, STOPPED, everything committed), and bound to
//! a non-loopback address it refuses calls without the bearer token (logged and counted in
//! `sluice_control_rejected_total`).
//!
//! Real parts: the Pub/Sub emulator, `sluice` processes, SQLite, a tonic client.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_proto::v1::control_client::ControlClient;
use sluice_proto::v1::{DrainRequest, GetStatusRequest, ListFlowsRequest};
use sluice_tests::{Db, PipelineOptions, PubSub, Workdir, Worker, event, eventually, sluice_bin};
use std::time::Duration;

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
            control: Some(format!("{{ listen: \"127.0.0.1:{port}\" }}")),
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

    let status = client
        .get_status(GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
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
    let out = std::process::Command::new(sluice_bin())
        .args(["status", "-c", file.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["source"], "control_api");
    assert_eq!(json["flows"][0]["state"], "RUNNING");
    assert_eq!(json["flows"][0]["rows"], 500);

    // Drain through the API: the run ends as after SIGTERM.
    let drained = client.drain(DrainRequest {}).await.unwrap().into_inner();
    assert!(drained.started);
    let output_path = worker.stdout.clone();
    let logs = worker.logs();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    let output = std::fs::read_to_string(output_path).unwrap();
    assert!(output.contains("flow ingest: STOPPED"), "{output}");
    assert_eq!(db.rows(), 500);
}

#[tokio::test(flavor = "multi_thread")]
async fn bound_beyond_loopback_it_requires_the_bearer_token() {
    let pubsub = PubSub::connect().await;
    let (_topic, subs) = pubsub.topic_with("token", 1).await;
    let dir = Workdir::new();
    let (port, metrics_port) = (free_port().unwrap(), free_port().unwrap());
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let file = dir.pipeline(
        "p.yaml",
        "db",
        &PipelineOptions {
            control: Some(format!(
                "{{ listen: \"0.0.0.0:{port}\", token_file: \"{}\" }}",
                token_file.display()
            )),
            metrics_listen: Some(format!("127.0.0.1:{metrics_port}")),
            ..PipelineOptions::continuous(&subs[0])
        },
    );
    let worker = Worker::start(&file, "w");
    let mut client = client(port).await;

    let refused = client.get_status(GetStatusRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut wrong = tonic::Request::new(GetStatusRequest {});
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer nope".parse().unwrap());
    assert_eq!(
        client.get_status(wrong).await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    let mut right = tonic::Request::new(GetStatusRequest {});
    right
        .metadata_mut()
        .insert("authorization", "Bearer s3cret-token".parse().unwrap());
    let status = client.get_status(right).await.unwrap().into_inner();
    assert_eq!(status.pipeline, "test");

    let metrics = std::process::Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{metrics_port}/metrics")])
        .output()
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluice_control_rejected_total") && l.ends_with(" 2")),
        "{metrics}"
    );
    assert!(worker.logs().contains("control API call refused"));
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());

    // Without a token file, a non-loopback control API is refused at start (exit 2).
    let no_token = dir.pipeline(
        "bad.yaml",
        "db",
        &PipelineOptions {
            control: Some(format!(
                "{{ listen: \"0.0.0.0:{}\" }}",
                free_port().unwrap()
            )),
            ..PipelineOptions::continuous(&subs[0])
        },
    );
    let refused = Worker::start(&no_token, "bad");
    let logs = refused.logs();
    let status = refused.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(2), "{logs}");
}
