//! Credentials on the real service, as far as they can be shown here: the project a worker
//! takes from Application Default Credentials when neither its file nor the environment names
//! one (a key file, or the metadata server of a GKE node), and a refusal of the worker's
//! identity stopping it at start with the permission it lacks.
//!
//! Real parts: the Pub/Sub emulator (it accepts any project, so a worker that found the
//! project reads the subscription, and one that did not cannot name it), `sluice` processes.
//! Fakes, for what this machine has no real part of: a metadata server (an HTTP responder on
//! loopback, named by `GCE_METADATA_HOST` as Google's clients read it), and a Pub/Sub REST
//! endpoint that answers every call with 403 `PERMISSION_DENIED`, as the service does for an
//! identity without the role.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{Db, PROJECT, PubSub, Workdir, Worker, emulator, events_with_duplicates};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A triggered pipeline reading `subscription` by its short name, with no project anywhere.
fn pipeline_without_project(
    dir: &Workdir,
    subscription: &str,
    endpoint: &str,
) -> std::path::PathBuf {
    let path = dir.path().join("p.yaml");
    std::fs::write(
        &path,
        format!(
            "pipeline: test\nmode: triggered\nstore: sqlite://{db}\npubsub: {{ endpoint: \"{endpoint}\" }}\n\
             targets:\n  - {{ name: events, kind: table }}\nflows:\n  - name: ingest\n    target: events\n    \
             source:\n      pubsub:\n        subscription: {subscription}\n        \
             dedup: {{ by: attribute, attribute: event_id }}\n        drain_idle: 3s\n",
            db = dir.db("test.db").display(),
        ),
    )
    .unwrap();
    path
}

/// The environment of a machine whose only project is what ADC names: no project variables,
/// no gcloud configuration, and a metadata server at `metadata` (or none).
fn adc_env(
    dir: &Workdir,
    key_file: Option<&std::path::Path>,
    metadata: &str,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("HOME".to_owned(), dir.path().display().to_string()),
        (
            "CLOUDSDK_CONFIG".to_owned(),
            dir.path().join("gcloud").display().to_string(),
        ),
        ("GCE_METADATA_HOST".to_owned(), metadata.to_owned()),
        ("PUBSUB_PROJECT_ID".to_owned(), String::new()),
        ("GOOGLE_CLOUD_PROJECT".to_owned(), String::new()),
    ];
    if let Some(key_file) = key_file {
        env.push((
            "GOOGLE_APPLICATION_CREDENTIALS".to_owned(),
            key_file.display().to_string(),
        ));
    }
    env
}

/// A fake HTTP/1.1 server on loopback: `respond` turns a request's lines (lowercased) into
/// the whole response. Returns its address and how many requests it answered.
fn fake_http(respond: fn(&[String]) -> String) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                request.push(line.to_ascii_lowercase());
            }
            count.fetch_add(1, Ordering::SeqCst);
            let _ = stream.write_all(respond(&request).as_bytes());
        }
    });
    (address, answered)
}

fn http_response(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nMetadata-Flavor: Google\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The metadata server of a GKE node: the project id, asked with `Metadata-Flavor: Google`.
fn metadata_server(request: &[String]) -> String {
    let asks_project = request
        .first()
        .is_some_and(|l| l.starts_with("get /computemetadata/v1/project/project-id "));
    let flavoured = request
        .iter()
        .any(|l| l.starts_with("metadata-flavor: google"));
    if asks_project && flavoured {
        http_response("200 OK", PROJECT)
    } else {
        http_response("403 Forbidden", "")
    }
}

/// Pub/Sub's REST endpoint to an identity without the role (the worker asks for the
/// subscription over REST before it opens its gRPC streams).
fn denying_pubsub(_: &[String]) -> String {
    http_response(
        "403 Forbidden",
        r#"{"error": {"code": 403, "message": "User not authorized to perform this action.", "status": "PERMISSION_DENIED"}}"#,
    )
}

/// Publishes 200 events to a fresh subscription and runs the pipeline to its end with `env`;
/// returns the rows committed and the worker's logs.
async fn run_without_project(dir: &Workdir, env: &[(String, String)]) -> (i64, String) {
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("adc", 1).await;
    pubsub
        .publish(&topic, events_with_duplicates("adc", 200, 0))
        .await;
    let file = pipeline_without_project(dir, &subscriptions[0], &emulator().endpoint());
    let worker =
        Worker::spawn_with_env(&["run", "-c", file.to_str().unwrap()], env, dir.path(), "w");
    let status = worker.wait(Duration::from_secs(120));
    let logs = std::fs::read_to_string(dir.path().join("w.err")).unwrap_or_default();
    assert!(status.success(), "the run failed:\n{logs}");
    (Db(dir.db("test.db")).rows(), logs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_subscription_name_takes_the_project_of_the_adc_key_file() {
    let dir = Workdir::new();
    let key_file = dir.path().join("key.json");
    std::fs::write(
        &key_file,
        format!(r#"{{"type": "service_account", "project_id": "{PROJECT}", "client_email": "w@{PROJECT}.iam.gserviceaccount.com"}}"#),
    )
    .unwrap();
    // No metadata server: port 9 (discard) on loopback has no HTTP server.
    let env = adc_env(&dir, Some(&key_file), "127.0.0.1:9");
    let (rows, logs) = run_without_project(&dir, &env).await;
    assert_eq!(rows, 200, "{logs}");
    assert!(
        logs.contains("GOOGLE_APPLICATION_CREDENTIALS"),
        "says where the project came from:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_gke_node_the_project_comes_from_the_metadata_server() {
    let dir = Workdir::new();
    let (metadata, answered) = fake_http(metadata_server);
    let env = adc_env(&dir, None, &metadata);
    let (rows, logs) = run_without_project(&dir, &env).await;
    assert_eq!(rows, 200, "{logs}");
    assert!(
        answered.load(Ordering::SeqCst) >= 1,
        "the metadata server was asked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_without_the_role_stops_the_worker_at_start_naming_the_permission() {
    let (address, asked) = fake_http(denying_pubsub);
    let endpoint = format!("http://{address}");
    let dir = Workdir::new();
    let path = dir.path().join("p.yaml");
    std::fs::write(
        &path,
        format!(
            "pipeline: test\nstore: sqlite://{db}\npubsub: {{ project: {PROJECT}, endpoint: \"{endpoint}\" }}\n\
             targets:\n  - {{ name: events, kind: table }}\nflows:\n  - name: ingest\n    target: events\n    \
             source: {{ pubsub: {{ subscription: orders }} }}\n",
            db = dir.db("test.db").display(),
        ),
    )
    .unwrap();
    let worker =
        Worker::spawn_with_env(&["run", "-c", path.to_str().unwrap()], &[], dir.path(), "w");
    // Old code: retried as "unreachable" for ever; this waits a minute, then fails.
    let status = worker.wait(Duration::from_secs(60));
    let logs = std::fs::read_to_string(dir.path().join("w.err")).unwrap();
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains("pubsub.subscriptions.get"),
        "names the permission:\n{logs}"
    );
    assert!(
        logs.contains("roles/pubsub.viewer"),
        "and the role:\n{logs}"
    );
    assert!(
        !logs.contains("unreachable; retrying"),
        "not taken for an outage:\n{logs}"
    );
    assert!(
        asked.load(Ordering::SeqCst) >= 1,
        "the refusal came from the fake"
    );
}
