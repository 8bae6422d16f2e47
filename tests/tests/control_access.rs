//! Who may call the control API (`proto/sluice/v1/control.proto`). Reads (`GetStatus`,
//! `ListFlows`) are open when it listens on loopback. Every call that acts (`ResetFlow`,
//! `StartUpdate`, `Drain`) needs the bearer token on every address, loopback included: without
//! `control.token_file` the worker refuses them (PERMISSION_DENIED, naming the setting), with
//! it a call without the right token is UNAUTHENTICATED. Bound beyond loopback, every call
//! needs the token. Each refusal is logged and counted in `sluice_control_rejected_total` and
//! changes nothing. `sluice status` sends the token from `SLUICE_CONTROL_TOKEN` or the file's
//! `control.token_file`. A `ResetFlow` seek time in the future (which would acknowledge what is
//! published until then) is INVALID_ARGUMENT.
//!
//! Real parts: the Pub/Sub emulator, `sluice` processes, SQLite, a tonic client.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_bench::free_port;
use sluice_proto::v1::control_client::ControlClient;
use sluice_proto::v1::{
    DrainRequest, FlowStatus, GetStatusRequest, ListFlowsRequest, ResetFlowRequest,
    StartUpdateRequest,
};
use sluice_tests::{
    Db, PipelineOptions, PubSub, Workdir, Worker, event, eventually, now_ms, sluice_bin,
    sluice_command, unique,
};
use std::time::Duration;
use tonic::{Code, Status};

const TOKEN: &str = "s3cret-token";

async fn client(port: u16) -> ControlClient<tonic::transport::Channel> {
    for _ in 0..100 {
        if let Ok(client) = ControlClient::connect(format!("http://127.0.0.1:{port}")).await {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the control API never answered on port {port}");
}

/// `message` with `authorization: Bearer {token}`.
fn bearer<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// `sluice_control_rejected_total` of pipeline `test` on the worker's `/metrics`.
fn rejected(metrics_port: u16) -> Option<f64> {
    sluice_tests::metrics_text(metrics_port)
        .lines()
        .find_map(|l| {
            l.strip_prefix("sluice_control_rejected_total{pipeline=\"test\"} ")?
                .trim()
                .parse()
                .ok()
        })
}

/// Asserts that `call` was refused with `code`, its message containing `says`.
fn refused<T: std::fmt::Debug>(call: &str, result: Result<T, Status>, code: Code, says: &str) {
    match result {
        Ok(answer) => panic!("{call} was accepted: {answer:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "{call}: {status:?}");
            assert!(status.message().contains(says), "{call}: {status:?}");
        }
    }
}

/// The worker's only flow, asked without a token once the worker reports itself ready (its
/// readiness follows the flows' states every 250 ms, so it may lag a flow that just started).
async fn flow(client: &mut ControlClient<tonic::transport::Channel>) -> FlowStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status = client
            .get_status(GetStatusRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(!status.draining, "{status:?}");
        if status.ready {
            return status.flows.into_iter().next().unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ready: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A seek an hour ahead: it would mark everything published until then as acknowledged.
fn an_hour_ahead() -> String {
    (now_ms() + 3_600_000).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn on_loopback_without_a_token_file_only_reads_are_open() {
    let pubsub = PubSub::connect().await;
    let (topic, subs) = pubsub.topic_with("open-reads", 1).await;
    let dir = Workdir::new();
    let (port, metrics_port) = (free_port().unwrap(), free_port().unwrap());
    let file = dir.pipeline(
        "p.yaml",
        "db",
        &PipelineOptions {
            control: Some(format!("{{ listen: \"127.0.0.1:{port}\" }}")),
            metrics_listen: Some(format!("127.0.0.1:{metrics_port}")),
            ..PipelineOptions::continuous(&subs[0])
        },
    );
    let db = Db(dir.db("db"));
    let worker = Worker::start(&file, "w");
    let mut client = client(port).await;
    pubsub
        .publish(&topic, (0..200).map(|i| event(&format!("a{i}"))).collect())
        .await;
    assert!(eventually(Duration::from_secs(120), || db.rows() == 200).await);
    let before = flow(&mut client).await;
    assert_eq!(before.state, "RUNNING");
    assert!(before.last_run_started_ms > 0, "{before:?}");
    let listed = client.list_flows(ListFlowsRequest {}).await.unwrap();
    assert_eq!(listed.into_inner().flows.len(), 1);

    // Every call that acts is refused, and says how to enable it.
    let hint = "control.token_file";
    let denied = Code::PermissionDenied;
    let reset = ResetFlowRequest {
        flow: "ingest".into(),
        seek: String::new(),
        drop_unread: false,
    };
    refused(
        "ResetFlow",
        client.reset_flow(reset.clone()).await,
        denied,
        hint,
    );
    for (call, request) in [
        (
            "StartUpdate(refresh_flows)",
            StartUpdateRequest {
                full_refresh: false,
                refresh_flows: vec!["ingest".into()],
            },
        ),
        (
            "StartUpdate(full_refresh)",
            StartUpdateRequest {
                full_refresh: true,
                refresh_flows: vec![],
            },
        ),
        (
            "StartUpdate()",
            StartUpdateRequest {
                full_refresh: false,
                refresh_flows: vec![],
            },
        ),
    ] {
        refused(call, client.start_update(request).await, denied, hint);
    }
    refused("Drain", client.drain(DrainRequest {}).await, denied, hint);
    // No token is right when the worker has none.
    refused(
        "Drain with a token",
        client.drain(bearer(DrainRequest {}, "anything")).await,
        denied,
        hint,
    );

    // Nothing happened: the same run of the flow, not draining, every row kept; each refusal
    // was logged and counted.
    let after = flow(&mut client).await;
    assert_eq!(after.state, "RUNNING");
    assert_eq!(after.last_run_started_ms, before.last_run_started_ms);
    assert_eq!(db.rows(), 200);
    assert_eq!(rejected(metrics_port), Some(6.0));
    assert!(worker.logs().contains("control API call refused"));
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());
}

#[tokio::test(flavor = "multi_thread")]
async fn on_loopback_with_a_token_file_reads_stay_open_and_acting_needs_the_token() {
    let pubsub = PubSub::connect().await;
    let topic = unique("token-loopback");
    pubsub.admin.create_topic(&topic).await.unwrap();
    // It retains acked messages: a seek of it is otherwise allowed.
    let subscription = format!("{topic}-sub");
    pubsub
        .admin
        .create_replayable_subscription(&subscription, &topic, 10)
        .await
        .unwrap();
    let dir = Workdir::new();
    let port = free_port().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let file = dir.pipeline(
        "p.yaml",
        "db",
        &PipelineOptions {
            control: Some(format!(
                "{{ listen: \"127.0.0.1:{port}\", token_file: \"{}\" }}",
                token_file.display()
            )),
            ..PipelineOptions::continuous(&subscription)
        },
    );
    let db = Db(dir.db("db"));
    let worker = Worker::start(&file, "w");
    let mut client = client(port).await;
    pubsub
        .publish(&topic, (0..100).map(|i| event(&format!("a{i}"))).collect())
        .await;
    assert!(eventually(Duration::from_secs(120), || db.rows() == 100).await);

    // Reads need no token on loopback.
    let before = flow(&mut client).await;
    assert_eq!(before.state, "RUNNING");
    let out = sluice_command(
        &["status", "-c", file.to_str().unwrap(), "--format", "json"],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["source"], "control_api", "{json}");

    // A seek time in the future is refused, with the right token too.
    let future = ResetFlowRequest {
        flow: "ingest".into(),
        seek: an_hour_ahead(),
        drop_unread: true,
    };
    refused(
        "ResetFlow(seek in the future)",
        client.reset_flow(bearer(future, TOKEN)).await,
        Code::InvalidArgument,
        "in the future",
    );

    // Calls that act need the token.
    let reset = ResetFlowRequest {
        flow: "ingest".into(),
        seek: String::new(),
        drop_unread: false,
    };
    let unauthenticated = Code::Unauthenticated;
    let says = "bearer token";
    refused(
        "ResetFlow without a token",
        client.reset_flow(reset.clone()).await,
        unauthenticated,
        says,
    );
    refused(
        "ResetFlow with a wrong token",
        client.reset_flow(bearer(reset, "nope")).await,
        unauthenticated,
        says,
    );
    refused(
        "StartUpdate without a token",
        client
            .start_update(StartUpdateRequest {
                full_refresh: true,
                refresh_flows: vec![],
            })
            .await,
        unauthenticated,
        says,
    );
    refused(
        "Drain without a token",
        client.drain(DrainRequest {}).await,
        unauthenticated,
        says,
    );

    // Nothing happened: the same run, and the subscription was not seeked (a seek to the
    // future would have acknowledged what is published now).
    let after = flow(&mut client).await;
    assert_eq!(after.state, "RUNNING");
    assert_eq!(after.last_run_started_ms, before.last_run_started_ms);
    pubsub
        .publish(&topic, (0..100).map(|i| event(&format!("b{i}"))).collect())
        .await;
    assert!(
        eventually(Duration::from_secs(120), || db.rows() == 200).await,
        "rows {}; logs:\n{}",
        db.rows(),
        worker.logs()
    );

    // With the token, Drain ends the run as SIGTERM does.
    let drained = client
        .drain(bearer(DrainRequest {}, TOKEN))
        .await
        .unwrap()
        .into_inner();
    assert!(drained.started);
    let logs = worker.logs();
    assert!(worker.wait(Duration::from_secs(60)).success(), "{logs}");
    assert_eq!(db.rows(), 200);
}

/// `sluice status -c file --format json` with `SLUICE_CONTROL_TOKEN` set to `token` (unset:
/// `None`).
fn status_with_token_env(file: &std::path::Path, token: Option<&str>) -> std::process::Output {
    let mut command = std::process::Command::new(sluice_bin());
    command
        .args(["status", "-c", file.to_str().unwrap(), "--format", "json"])
        .env_remove("PUBSUB_EMULATOR_HOST")
        .env_remove("SLUICE_CONTROL_TOKEN");
    if let Some(token) = token {
        command.env("SLUICE_CONTROL_TOKEN", token);
    }
    command.output().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn bound_beyond_loopback_every_call_needs_the_token() {
    let pubsub = PubSub::connect().await;
    let (_topic, subs) = pubsub.topic_with("token", 1).await;
    let dir = Workdir::new();
    let (port, metrics_port) = (free_port().unwrap(), free_port().unwrap());
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let control = |token_file: &std::path::Path| PipelineOptions {
        control: Some(format!(
            "{{ listen: \"0.0.0.0:{port}\", token_file: \"{}\" }}",
            token_file.display()
        )),
        metrics_listen: Some(format!("127.0.0.1:{metrics_port}")),
        ..PipelineOptions::continuous(&subs[0])
    };
    let file = dir.pipeline("p.yaml", "db", &control(&token_file));
    let worker = Worker::start(&file, "w");
    let mut client = client(port).await;

    refused(
        "GetStatus without a token",
        client.get_status(GetStatusRequest {}).await,
        Code::Unauthenticated,
        "bearer token",
    );
    refused(
        "GetStatus with a wrong token",
        client.get_status(bearer(GetStatusRequest {}, "nope")).await,
        Code::Unauthenticated,
        "bearer token",
    );
    let status = client
        .get_status(bearer(GetStatusRequest {}, TOKEN))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.pipeline, "test");
    assert_eq!(rejected(metrics_port), Some(2.0));
    assert!(worker.logs().contains("control API call refused"));

    // `sluice status` sends the token of the file's control.token_file...
    let out = status_with_token_env(&file, None);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["source"], "control_api", "{json}");
    // ...or, where it cannot read that file, the one in SLUICE_CONTROL_TOKEN.
    let elsewhere = dir.pipeline("cli.yaml", "db", &control(&dir.path().join("absent")));
    let out = status_with_token_env(&elsewhere, Some(TOKEN));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json["source"],
        "control_api",
        "{json} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // With neither, the worker refuses it: it says so and shows the store's view.
    let out = status_with_token_env(&elsewhere, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_ne!(json["source"], "control_api", "{json}");
    assert!(stderr.contains("SLUICE_CONTROL_TOKEN"), "{stderr}");
    // An empty SLUICE_CONTROL_TOKEN is invalid input, not ignored.
    let out = status_with_token_env(&file, Some(" "));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("SLUICE_CONTROL_TOKEN"), "{stderr}");

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
