//! The Helm chart (`charts/sluice`), rendered by Helm's own Go SDK (PyPI `helm-python-sdk`)
//! and checked against Kubernetes' schemas (PyPI `kubernetes-validate`) by
//! `charts/sluice/ci/check.py`, in the virtualenv `scripts/chart-venv` prepares; then the
//! chart's default pipeline, as its ConfigMap renders it, run by a real `sluice` with the
//! environment its Deployment gives the container.
//!
//! Real parts: Helm's template engine and linter, Kubernetes 1.30 schemas, the Pub/Sub
//! emulator, PostgreSQL, a `sluice` process. Not here: a cluster (no kubelet runs the pod; the
//! test plays its part: the mounted file, the env, the probe).

#![allow(clippy::unwrap_used, missing_docs)]

use serde_json::Value;
use sluice_tests::{
    PROJECT, PubSub, Workdir, Worker, emulator, eventually, http_status, sluice_bin,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/sluice")
}

/// The virtualenv's Python (`SLUICE_CHART_PYTHON`, else `target/chart-venv`).
fn python() -> PathBuf {
    let path = std::env::var_os("SLUICE_CHART_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/chart-venv/bin/python"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} missing: run scripts/chart-venv (./scripts/test does) to install Helm's SDK",
        path.display()
    );
    path
}

fn check_py(args: &[&str]) -> std::process::Output {
    Command::new(python())
        .arg(chart_dir().join("ci/check.py"))
        .args(args)
        .output()
        .unwrap()
}

/// The manifests for `values`, each parsed (one document per template here).
fn render(values: &Value) -> Vec<Value> {
    let out = check_py(&["render", &values.to_string()]);
    assert!(
        out.status.success(),
        "render failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifests: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(&out.stdout).unwrap();
    manifests
        .iter()
        .filter(|(path, text)| !path.ends_with("NOTES.txt") && !text.trim().is_empty())
        .map(|(_, text)| serde_saphyr::from_str::<Value>(text).unwrap())
        .collect()
}

fn of_kind<'a>(manifests: &'a [Value], kind: &str) -> &'a Value {
    manifests
        .iter()
        .find(|m| m["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

#[test]
fn every_scenario_renders_lints_and_validates_and_bad_values_are_refused() {
    let out = check_py(&["check"]);
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "findings:\n{text}");
    // Each scenario's objects are there (the check prints the kinds it rendered).
    for (scenario, kind) in [
        ("keda-values.yaml", "ScaledObject"),
        ("hpa-values.yaml", "HorizontalPodAutoscaler"),
        ("monitoring-values.yaml", "PrometheusRule"),
        ("monitoring-values.yaml", "ServiceMonitor"),
        ("podmonitor-values.yaml", "PodMonitor"),
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(scenario) && l.contains(kind)),
            "{scenario} renders a {kind}"
        );
    }
    let refused = text
        .lines()
        .find_map(|l| l.strip_prefix("bad values refused: "))
        .expect("the count of refusals");
    let (refused, of) = refused.split_once(" of ").unwrap();
    assert_eq!(refused, of, "every bad value refused with its reason");
    assert!(of.parse::<u32>().unwrap() >= 20);
}

#[test]
fn the_rendered_deployment_is_hardened_and_drains_within_its_grace_period() {
    let manifests = render(&serde_json::json!({}));
    let deployment = of_kind(&manifests, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    // preStop, then the worker's drain give-up (15 s) and exit deadline (10 s), with slack.
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
    let pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_i64()
        .unwrap();
    assert!(
        grace > pre_stop + 15 + 10,
        "grace {grace}, preStop {pre_stop}"
    );
    // The store URL only from a Secret, never in the pipeline file.
    let store = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SLUICE_STORE")
        .expect("SLUICE_STORE in the env");
    assert_eq!(
        store["valueFrom"]["secretKeyRef"]["name"], "sluice-store",
        "the default Secret name"
    );
    assert!(of_kind(&manifests, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1);
}

/// `extraVolumes`, `extraVolumeMounts` and `extraEnv` reach the pod and its container, beside
/// the chart's own.
#[test]
fn extra_volumes_mounts_and_env_reach_the_worker() {
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart_dir().join("ci/extra-volumes-values.yaml")).unwrap(),
    )
    .unwrap();
    let manifests = render(&values);
    let pod = &of_kind(&manifests, "Deployment")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let named = |list: &Value, name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        named(&pod["volumes"], "history")["persistentVolumeClaim"]["claimName"],
        "history"
    );
    assert!(
        named(&pod["volumes"], "pipeline").is_object(),
        "the chart's own stay"
    );
    let mount = named(&container["volumeMounts"], "history");
    assert_eq!(
        (&mount["mountPath"], &mount["readOnly"]),
        (&Value::from("/data/history"), &Value::from(true))
    );
    assert_eq!(named(&container["env"], "RUST_LOG")["value"], "info");
    assert!(named(&container["env"], "SLUICE_STORE").is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_pipeline_validates_and_a_worker_on_the_rendered_files_gets_ready() {
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let manifests = render(&serde_json::json!({
        "store": { "url": database.url() },
        "pubsub": { "project": PROJECT },
        "replicaCount": 1,
    }));
    let dir = Workdir::new();

    // The ConfigMap, mounted where the Deployment mounts it.
    let config_map = of_kind(&manifests, "ConfigMap");
    let deployment = of_kind(&manifests, "Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "pipeline")
        .unwrap()["mountPath"]
        .as_str()
        .unwrap()
        .to_owned();
    let (key, text) = config_map["data"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    let mounted = dir.path().join(mount.trim_start_matches('/'));
    std::fs::create_dir_all(&mounted).unwrap();
    std::fs::write(mounted.join(key), text.as_str().unwrap()).unwrap();

    let validate = Command::new(sluice_bin())
        .args(["validate", "-c"])
        .arg(mounted.join(key))
        .output()
        .unwrap();
    assert!(
        validate.status.success(),
        "the default pipeline is valid: {}",
        String::from_utf8_lossy(&validate.stderr)
    );

    // The container's environment: values, and Secret references resolved from the rendered
    // Secret (as the kubelet would).
    let secret = of_kind(&manifests, "Secret");
    let mut env: Vec<(String, String)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_owned();
            let value = match e["valueFrom"]["secretKeyRef"]["key"].as_str() {
                Some(key) => secret["stringData"][key].as_str().unwrap().to_owned(),
                None => e["value"].as_str().unwrap().to_owned(),
            };
            (name, value)
        })
        .collect();
    let host = emulator()
        .endpoint()
        .trim_start_matches("http://")
        .to_owned();
    env.push(("PUBSUB_EMULATOR_HOST".to_owned(), host));

    // The default pipeline's subscription, on the run's emulator.
    let pubsub = PubSub::connect().await;
    let topic = sluice_tests::unique("chart");
    pubsub.admin.create_topic(&topic).await.unwrap();
    // The name is the chart's; on an emulator that ran this test before, it is there already.
    if !pubsub
        .admin
        .subscription_exists("events-sub")
        .await
        .unwrap()
    {
        pubsub
            .admin
            .create_subscription("events-sub", &topic, 10)
            .await
            .unwrap();
    }

    // The Deployment's args, the mount path under the test's directory.
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let arg = a.as_str().unwrap();
            match arg.strip_prefix('/') {
                Some(path) if arg.starts_with(&mount) => {
                    dir.path().join(path).to_string_lossy().into_owned()
                }
                _ => arg.to_owned(),
            }
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let worker = Worker::spawn_with_env(&args, &env, dir.path(), "chart");
    let port = u16::try_from(
        deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
            .as_i64()
            .unwrap(),
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(120), || http_status(port, "/readyz")
            == "200")
        .await,
        "the worker never got ready:\n{}",
        worker.logs()
    );
    assert_eq!(http_status(port, "/healthz"), "200");
    worker.terminate();
    assert!(worker.wait(Duration::from_secs(60)).success());
}
