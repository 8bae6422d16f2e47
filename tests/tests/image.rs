//! The image's binary, as the `Dockerfile` builds and runs it, without a container engine
//! (none on these machines): the same compiler release as the Dockerfile's build stage, run as
//! user 65532 with writable paths only where the chart mounts them (its working directory
//! `/var/lib/sluice` and `/tmp`): the pipeline file is in a root-owned, read-only folder, as
//! the chart's ConfigMap mount is, and the environment holds only what the Deployment sets.
//!
//! Which binary: the Dockerfile's `cargo build --release --locked -p sluice` takes minutes on
//! these machines, so the test command runs this on the debug binary it builds anyway (the same
//! code; the lockfile is checked by `./scripts/test` with `cargo metadata --locked`), and the
//! release binary is run by the named command `scripts/test-release-image` (README, "Tests"),
//! which builds it as the Dockerfile does and sets `SLUICE_TEST_RELEASE_BINARY=1`.
//!
//! Real parts: the Pub/Sub emulator, PostgreSQL, the binary under `setpriv`. Not here:
//! the distroless base and a read-only root filesystem (a non-root user cannot write outside
//! the folders it owns and `/tmp` on this machine either, which is what the test relies on).
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{
    PROJECT, PubSub, Workdir, emulator, events_with_duplicates, eventually, http_status,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const NONROOT: u32 = 65532;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn dockerfile() -> String {
    std::fs::read_to_string(workspace().join("Dockerfile")).unwrap()
}

#[test]
fn the_dockerfile_builds_the_binary_this_test_runs_and_runs_it_as_nonroot() {
    let dockerfile = dockerfile();
    assert!(dockerfile.contains("cargo build --release --locked -p sluice"));
    assert!(dockerfile.contains("cp target/release/sluice"));
    assert!(dockerfile.contains(&format!("USER {NONROOT}:{NONROOT}")));
    assert!(dockerfile.contains("WORKDIR /var/lib/sluice"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/usr/local/bin/sluice"]"#));
    // The build stage's compiler is this machine's release (major.minor).
    let rustc = Command::new("rustc").arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&rustc.stdout);
    let release: Vec<&str> = version
        .split_whitespace()
        .nth(1)
        .unwrap()
        .split('.')
        .collect();
    let image = format!("FROM rust:{}.{}-bookworm AS build", release[0], release[1]);
    assert!(
        dockerfile.contains(&image),
        "the Dockerfile's build stage is `{image}`"
    );
    // The chart runs what the image holds, as the image's user.
    let values = std::fs::read_to_string(workspace().join("charts/sluice/values.yaml")).unwrap();
    assert!(values.contains(&format!("runAsUser: {NONROOT}")));
    assert!(values.contains("readOnlyRootFilesystem: true"));
}

fn mkdir(path: &Path, mode: u32, owner: Option<u32>) {
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    if let Some(uid) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
    }
}

fn running_as_root() -> bool {
    let id = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&id.stdout).trim() == "0"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_as_nonroot_with_only_the_charts_writable_paths() {
    let binary = if std::env::var_os("SLUICE_TEST_RELEASE_BINARY").is_some() {
        // target/debug/sluice -> target/release/sluice, wherever the target directory is.
        let release = sluice_tests::sluice_bin()
            .parent()
            .unwrap()
            .with_file_name("release")
            .join("sluice");
        assert!(
            release.exists(),
            "{} missing: `cargo build --release --locked -p sluice` \
             (scripts/test-release-image runs it)",
            release.display()
        );
        release
    } else {
        sluice_tests::sluice_bin()
    };
    println!("running {}", binary.display());
    let database = sluice_store::ScratchDatabase::create().await.unwrap();
    let pubsub = PubSub::connect().await;
    let (topic, subscriptions) = pubsub.topic_with("image", 1).await;
    let port = sluice_bench::free_port().unwrap();

    // The pod's file system: the ConfigMap's folder root-owned and read-only, the working
    // directory and /tmp the only places the user may write.
    let root = Workdir::new();
    mkdir(root.path(), 0o755, None);
    // The binary where the image puts it (the checkout may not be readable by the user).
    let bin = root.path().join("usr/local/bin");
    mkdir(&bin, 0o755, None);
    std::fs::copy(&binary, bin.join("sluice")).unwrap();
    let binary = bin.join("sluice");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = root.path().join("etc/sluice/pipeline");
    mkdir(&config, 0o755, None);
    let pipeline = config.join("pipeline.yaml");
    std::fs::write(
        &pipeline,
        format!(
            "pipeline: events\nmode: continuous\nmetrics: {{ listen: \"127.0.0.1:{port}\" }}\n\
             targets:\n  - name: events\n    kind: table\nflows:\n  - name: events_live\n    \
             target: events\n    source:\n      pubsub:\n        subscription: {}\n        \
             dedup: {{ by: attribute, attribute: event_id, window: 10m }}\n",
            subscriptions[0]
        ),
    )
    .unwrap();
    std::fs::set_permissions(&pipeline, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o555)).unwrap();
    let state = root.path().join("var/lib/sluice");
    let tmp = root.path().join("tmp");
    let as_root = running_as_root();
    let owner = as_root.then_some(NONROOT);
    mkdir(&state, 0o700, owner);
    mkdir(&tmp, 0o1777, None);

    // The Deployment's command and environment, nothing else.
    let mut command = if as_root {
        let mut setpriv = Command::new("setpriv");
        setpriv.args([
            &format!("--reuid={NONROOT}"),
            &format!("--regid={NONROOT}"),
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ]);
        setpriv.arg(&binary);
        setpriv
    } else {
        Command::new(&binary)
    };
    let host = emulator()
        .endpoint()
        .trim_start_matches("http://")
        .to_owned();
    let log = root.path().join("worker.log");
    let mut child = command
        .args(["run", "-c"])
        .arg(&pipeline)
        .args(["--log-format", "json"])
        .env_clear()
        .env("SLUICE_STORE", database.url())
        .env("PUBSUB_PROJECT_ID", PROJECT)
        .env("PUBSUB_EMULATOR_HOST", host)
        .env("TMPDIR", &tmp)
        .env("RUST_LOG", "info")
        .current_dir(&state)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(root.path().join("worker.out")).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    assert!(
        eventually(Duration::from_secs(120), || http_status(port, "/readyz")
            == "200")
        .await,
        "never ready:\n{}",
        logs()
    );
    if as_root {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid.split_whitespace()
                .skip(1)
                .all(|u| u == NONROOT.to_string()),
            "runs as {NONROOT}: {uid}"
        );
    }

    // It works: 300 events, 30 of them publisher duplicates, land once each.
    pubsub
        .publish(&topic, events_with_duplicates("img", 270, 30))
        .await;
    let db = sluice_tests::PgDb(database.url().to_owned());
    assert!(
        eventually(Duration::from_secs(120), || db
            .query("SELECT COUNT(*) FROM events__events")
            == 270)
        .await,
        "{} of 270 rows:\n{}",
        db.query("SELECT COUNT(*) FROM events__events"),
        logs()
    );
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "drained and exited 0:\n{}", logs());
    assert_eq!(
        std::fs::read_dir(&config).unwrap().count(),
        1,
        "nothing written beside the pipeline file"
    );
    let written: Vec<String> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    println!("written in the working directory: {written:?}");
}
