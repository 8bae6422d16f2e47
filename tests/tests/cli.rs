//! The command line on bad input and unreachable dependencies: clear errors, exit codes, no
//! panics, retries logged once per backoff step.
#![allow(clippy::unwrap_used, missing_docs)]

use sluice_tests::{FlowYaml, PipelineYaml, Workdir, Worker, http_status, sluice_command};
use std::path::Path;
use std::time::Duration;

/// `sluice run -c FILE` to its end: exit code and stderr.
fn run_with(file: &Path) -> (i32, String) {
    let out = sluice_command(&["run", "-c", file.to_str().unwrap()], None);
    (out.code, out.stderr)
}

fn write(dir: &Workdir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

const HEADER: &str = "pipeline: p\ntargets:\n  - { name: events, kind: table }\nflows:\n  - name: live\n    target: events\n";

#[test]
fn unknown_key_exits_2_with_file_path_and_line() {
    let dir = Workdir::new();
    let file = write(
        &dir,
        "bad.yaml",
        &format!(
            "{HEADER}    source:\n      pubsub:\n        subscription: s\n        dedupe: {{ by: message_id }}\n"
        ),
    );
    let (code, stderr) = run_with(&file);
    assert_eq!(code, 2, "{stderr}");
    let expected = format!("{}:10:", file.display());
    assert!(stderr.contains(&expected), "no file:line in {stderr:?}");
    assert!(stderr.contains("UNKNOWN_KEY"), "{stderr}");
    assert!(stderr.contains("flows[0].source.pubsub.dedupe"), "{stderr}");
}

#[test]
fn bad_duration_exits_2_with_file_path_and_line() {
    let dir = Workdir::new();
    let file = write(
        &dir,
        "bad.yaml",
        &format!(
            "{HEADER}    source:\n      pubsub:\n        subscription: s\n        drain_idle: 5 parsecs\n"
        ),
    );
    let (code, stderr) = run_with(&file);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("{}:10:", file.display())),
        "{stderr}"
    );
    assert!(stderr.contains("INVALID_DURATION"), "{stderr}");
    assert!(
        stderr.contains("flows[0].source.pubsub.drain_idle"),
        "{stderr}"
    );
}

#[test]
fn missing_subscription_exits_2_with_file_path_and_line() {
    let dir = Workdir::new();
    let file = write(
        &dir,
        "bad.yaml",
        &format!("{HEADER}    source:\n      pubsub:\n        max_attempts: 3\n"),
    );
    let (code, stderr) = run_with(&file);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("MISSING_FIELD"), "{stderr}");
    assert!(
        stderr.contains("flows[0].source.pubsub.subscription"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{}:8:", file.display())),
        "{stderr}"
    );
}

#[test]
fn validate_reports_json_and_exit_codes() {
    let dir = Workdir::new();
    let good = write(
        &dir,
        "good.yaml",
        &format!("{HEADER}    source: {{ pubsub: {{ subscription: s }} }}\n"),
    );
    let out = sluice_command(&["validate", "-c", good.to_str().unwrap()], None);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let bad = write(
        &dir,
        "bad.yaml",
        &format!("{HEADER}    source: {{ pubsub: {{ subscription: s, window: 3 }} }}\n"),
    );
    let out = sluice_command(
        &["validate", "-c", bad.to_str().unwrap(), "--format", "json"],
        None,
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    let stdout = out.stdout;
    assert!(
        stdout.contains("\"valid\":false") && stdout.contains("UNKNOWN_KEY"),
        "{stdout}"
    );
}

/// Steps of the "retrying" lines in a log: each backoff step logs once, so they count up 1, 2, ...
fn retry_steps(logs: &str, message: &str) -> Vec<u32> {
    logs.lines()
        .filter(|l| l.contains(message))
        .filter_map(|l| {
            l.split("step=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[test]
fn unreachable_emulator_is_retried_with_backoff_not_a_panic() {
    let dir = Workdir::new();
    // A port nothing listens on.
    let port = sluice_bench::emulator::free_port().unwrap();
    let metrics_port = sluice_bench::emulator::free_port().unwrap();
    let file = PipelineYaml::new("p")
        .sqlite(&dir.path().join("s.db"))
        .pubsub("x", &format!("http://127.0.0.1:{port}"))
        .metrics(&format!("127.0.0.1:{metrics_port}"))
        .target_table("events")
        .flow(FlowYaml::pubsub("live", "events", "s").streams(1))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "w");
    std::thread::sleep(Duration::from_secs(8));
    // Alive, but not ready: its flow cannot start while Pub/Sub does not answer.
    assert_eq!(
        http_status(metrics_port, "/healthz"),
        "200",
        "{}",
        worker.logs()
    );
    assert_eq!(
        http_status(metrics_port, "/readyz"),
        "503",
        "{}",
        worker.logs()
    );
    worker.terminate();
    let logs = worker.logs();
    let status = worker.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{logs}");
    assert!(!logs.contains("panicked"), "{logs}");
    let steps = retry_steps(&logs, "Pub/Sub unreachable; retrying");
    assert!(steps.len() >= 2, "expected several retries: {logs}");
    assert_eq!(
        steps,
        (1..=steps.len() as u32).collect::<Vec<_>>(),
        "one line per backoff step"
    );
}

#[test]
fn unreachable_store_is_retried_with_backoff_not_a_panic() {
    let dir = Workdir::new();
    // The store's folder cannot be created: a plain file stands where the folder should be.
    std::fs::write(dir.path().join("blocker"), "").unwrap();
    let file = PipelineYaml::new("p")
        .sqlite(&dir.path().join("blocker").join("s.db"))
        .pubsub("x", "http://127.0.0.1:9")
        .target_table("events")
        .flow(FlowYaml::pubsub("live", "events", "s"))
        .write(dir.path(), "p.yaml");
    let worker = Worker::start(&file, "w");
    std::thread::sleep(Duration::from_secs(5));
    worker.terminate();
    let logs = worker.logs();
    let status = worker.wait(Duration::from_secs(30));
    assert!(!logs.contains("panicked"), "{logs}");
    assert_eq!(
        status.code(),
        Some(0),
        "a stop before the store was ever reached is clean: {logs}"
    );
    let steps = retry_steps(&logs, "store unavailable; retrying");
    assert!(steps.len() >= 3, "expected several retries: {logs}");
    assert_eq!(
        steps,
        (1..=steps.len() as u32).collect::<Vec<_>>(),
        "one line per backoff step"
    );
}

#[test]
fn a_listen_setting_that_is_not_an_address_exits_2_naming_it() {
    let dir = Workdir::new();
    for (section, setting) in [("metrics", "metrics.listen"), ("control", "control.listen")] {
        let file = write(
            &dir,
            "p.yaml",
            &format!(
                "pipeline: p\nstore: sqlite://{}/s.db\n{section}: {{ listen: \"localhost-ish\" }}\n\
                 pubsub: {{ project: x, endpoint: \"http://127.0.0.1:9\" }}\n\
                 targets: [ {{ name: events, kind: table }} ]\n\
                 flows:\n  - name: live\n    target: events\n    source: {{ pubsub: {{ subscription: s }} }}\n",
                dir.path().display()
            ),
        );
        let (code, stderr) = run_with(&file);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains(setting) && stderr.contains("localhost-ish"),
            "{stderr}"
        );
        assert!(stderr.contains("p.yaml"), "names the file: {stderr}");
    }
}

/// A window target fed by a `table` source (SPEC §4's example) closes its windows with the
/// watermarks of the table's live writers: with a live writer that has no `watermark:`, the
/// file is valid (`validate` accepts it) but `run` refuses it with exit 2 (a located
/// `NOT_BUILT` error), names the writer and says why, before touching anything.
#[test]
fn a_window_over_a_table_needs_its_live_writers_watermarks() {
    let dir = Workdir::new();
    let file = PipelineYaml::new("p")
        .sqlite(&dir.path().join("s.db"))
        .pubsub("x", "http://127.0.0.1:9")
        .target_table("events")
        .target(
            "per_minute",
            "window",
            "{ size: 1m, group_by: \"attribute:region\" }",
        )
        .flow(FlowYaml::pubsub("live", "events", "s"))
        .flow(FlowYaml::table("counts", "per_minute", "events"))
        .write(dir.path(), "p.yaml");
    let validated = sluice_command(&["validate", "-c", file.to_str().unwrap()], None);
    assert_eq!(validated.code, 0, "{}", validated.stderr);
    let (code, stderr) = run_with(&file);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("NOT_BUILT")
            && stderr.contains("p.yaml:")
            && stderr.contains("flows[1].source")
            && stderr.contains("reads table \"events\"")
            && stderr.contains(
                "live writer \"live\" has no watermark (a Pub/Sub flow needs `watermark:`"
            ),
        "{stderr}"
    );
    assert!(!dir.path().join("s.db").exists(), "nothing was created");
}

/// `sluice status` on a file whose store is `sqlite://from_file.db`, with `SLUICE_STORE` set.
fn status_with_store_env(dir: &Workdir, store: &str) -> std::process::Output {
    let file = write(
        dir,
        "p.yaml",
        &format!(
            "store: sqlite://from_file.db\n{HEADER}    source: {{ pubsub: {{ subscription: s }} }}\n"
        ),
    );
    std::process::Command::new(sluice_tests::sluice_bin())
        .args(["status", "-c", file.to_str().unwrap()])
        .env("SLUICE_STORE", store)
        .current_dir(dir.path())
        .output()
        .unwrap()
}

#[test]
fn the_store_from_the_environment_replaces_the_files_and_a_bad_one_is_refused_unechoed() {
    let dir = Workdir::new();
    // The environment's store, not there yet: status names it and creates nothing.
    let out = status_with_store_env(&dir, "sqlite://from_env.db");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no store at from_env.db") && stderr.contains("has this pipeline run?"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("from_env.db").exists(),
        "status created a store"
    );
    drop(sluice_store::SqliteStore::open(&dir.path().join("from_env.db")).unwrap());
    let out = status_with_store_env(&dir, "sqlite://from_env.db");
    assert!(
        out.status.success(),
        "status reads SLUICE_STORE's store: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !dir.path().join("from_file.db").exists(),
        "and not the file's"
    );

    let out = status_with_store_env(&dir, "mysql://root:hunter2@db/x");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("SLUICE_STORE"), "{stderr}");
    assert!(
        !stderr.contains("hunter2"),
        "the URL's password is not echoed: {stderr}"
    );
}

/// `sluice completions SHELL` prints a script the shell accepts (bash checks its syntax),
/// naming the commands; an unknown shell exits 2 with the choices.
#[test]
fn completions_are_printed_for_each_shell() {
    let bash = sluice_command(&["completions", "bash"], None);
    assert_eq!(bash.code, 0, "{}", bash.all());
    assert!(
        bash.stdout.contains("_sluice()") && bash.stdout.contains("validate"),
        "{}",
        bash.stdout
    );
    let dir = Workdir::new();
    let script = write(&dir, "sluice.bash", &bash.stdout);
    let syntax = std::process::Command::new("bash")
        .args(["-n", script.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        syntax.status.success(),
        "{}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    for (shell, mark) in [("zsh", "#compdef sluice"), ("fish", "complete -c sluice")] {
        let out = sluice_command(&["completions", shell], None);
        assert_eq!(out.code, 0, "{}", out.all());
        assert!(out.stdout.contains(mark), "{shell}: {}", out.stdout);
    }
    let unknown = sluice_command(&["completions", "tcsh"], None);
    assert_eq!(unknown.code, 2, "{}", unknown.all());
    assert!(unknown.stderr.contains("bash"), "{}", unknown.all());
}

/// Every pipeline file of `examples/` is valid, read from that folder (its schema files are
/// named relative to it).
#[test]
fn every_example_is_valid() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let out = sluice_command(&["validate", "-c", &name], Some(&examples));
        assert_eq!(out.code, 0, "{name}: {}", out.all());
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} examples");
}

/// `sluice init` writes a file that validates for every source and store, and that runs as
/// written (files into SQLite: the records land in the typed table, the one breaking the
/// expectation a dead letter); it never overwrites a file.
#[test]
fn init_writes_a_pipeline_that_validates_and_runs() {
    let dir = Workdir::new();
    for source in ["pubsub", "files", "both"] {
        for store in ["sqlite", "postgres"] {
            let file = format!("{source}-{store}.yaml");
            let init = sluice_command(
                &["init", "-o", &file, "--source", source, "--store", store],
                Some(dir.path()),
            );
            assert_eq!(init.code, 0, "{}", init.all());
            let validate = sluice_command(&["validate", "-c", &file], Some(dir.path()));
            assert_eq!(validate.code, 0, "{source} {store}: {}", validate.all());
        }
    }
    let again = sluice_command(&["init", "-o", "files-sqlite.yaml"], Some(dir.path()));
    assert_eq!(again.code, 1, "{}", again.all());
    assert!(again.stderr.contains("never overwrites"), "{}", again.all());

    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let records: String = (0..20)
        .map(|i| {
            format!(
                "{{\"id\":\"o-{i}\",\"data\":{{\"order_id\":\"o-{i}\",\"amount\":{},\"region\":\"EU\"}}}}\n",
                i - 1
            )
        })
        .collect();
    std::fs::write(dir.path().join("data/a.jsonl"), records).unwrap();
    let file = dir.path().join("files-sqlite.yaml");
    // The scaffold's metrics port is the conventional 9464: another test may hold it.
    let port = sluice_bench::free_port().unwrap();
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("127.0.0.1:9464", &format!("127.0.0.1:{port}"));
    std::fs::write(&file, text).unwrap();
    let run = sluice_command(
        &["run", "-c", file.to_str().unwrap()],
        Some(&dir.path().join("data")),
    );
    assert_eq!(run.code, 0, "{}", run.all());
    let db = sluice_tests::Db(dir.path().join("state/shop.db"));
    assert_eq!(db.query("SELECT COUNT(*) FROM shop__orders"), 18);
    assert_eq!(
        db.query("SELECT COUNT(*) FROM shop__orders WHERE region = 'EU' AND amount > 0"),
        18
    );
    assert_eq!(db.query("SELECT COUNT(*) FROM shop__dead_letter"), 2);
}
