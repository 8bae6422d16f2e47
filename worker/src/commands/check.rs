//! `sluice check -c FILE`: before a run, what the file names is asked of the world it names.
//! The store is connected to (a PostgreSQL database that does not exist, a refused user, a
//! server that does not answer; an SQLite folder that cannot be written), every subscription
//! and topic is looked up in Pub/Sub, and every file source's glob is matched. Each finding is
//! one line (`ok` or `FAIL`, what, why and the fix); exit 0 when nothing failed, 1 otherwise, 2
//! for an invalid file. Nothing is created: not a store, not a table, not a subscription.

use sluice_connector::PubSubConfig;
use sluice_engine::pubsub::Admin;
use sluice_pipeline::{Pipeline, Source, TrackingSubscription};
use sluice_store::{PostgresStore, StoreUrl};
use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// How long one question (the store, one subscription) may take before it counts as no answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// One finding.
struct Finding {
    ok: bool,
    what: String,
    said: String,
}

impl Finding {
    fn ok(what: impl Into<String>, said: impl Into<String>) -> Self {
        Self {
            ok: true,
            what: what.into(),
            said: said.into(),
        }
    }

    fn fail(what: impl Into<String>, said: impl Into<String>) -> Self {
        Self {
            ok: false,
            what: what.into(),
            said: said.into(),
        }
    }
}

/// `sluice check`.
pub async fn check(config: &Path) -> ExitCode {
    let pipeline = match super::load_for_run_or_exit(config) {
        Ok(pipeline) => super::with_adc_project(pipeline).await,
        Err(exit) => return exit,
    };
    let mut findings = vec![store(&pipeline.store).await];
    findings.extend(pubsub(&pipeline).await);
    findings.extend(files(&pipeline));
    for finding in &findings {
        let mark = if finding.ok { "ok  " } else { "FAIL" };
        println!("{mark}  {}: {}", finding.what, finding.said);
    }
    let failed = findings.iter().filter(|f| !f.ok).count();
    if failed == 0 {
        println!("{}: every check passed", config.display());
        ExitCode::SUCCESS
    } else {
        println!(
            "{}: {failed} of {} checks failed",
            config.display(),
            findings.len()
        );
        ExitCode::from(1)
    }
}

/// `ask`, or `None` when it takes longer than [`ASK_TIMEOUT`].
async fn within<T>(ask: impl Future<Output = T>) -> Option<T> {
    tokio::time::timeout(ASK_TIMEOUT, ask).await.ok()
}

async fn store(url: &str) -> Finding {
    let what = "store";
    match url.parse::<StoreUrl>() {
        Err(error) => Finding::fail(what, error.to_string()),
        Ok(StoreUrl::Sqlite(path)) => sqlite(&path),
        Ok(StoreUrl::Postgres(url)) => {
            let store = match PostgresStore::open(&url) {
                Ok(store) => store,
                Err(error) => return Finding::fail(what, error.to_string()),
            };
            let shown = store.display_url().to_owned();
            match within(store.holds_a_store()).await {
                None => Finding::fail(
                    what,
                    format!("{shown}: no answer within {}s", ASK_TIMEOUT.as_secs()),
                ),
                Some(Err(error)) => Finding::fail(what, error.to_string()),
                Some(Ok(true)) => Finding::ok(what, format!("{shown}: a sluice store")),
                Some(Ok(false)) => Finding::ok(
                    what,
                    format!(
                        "{shown}: reachable, no sluice tables yet (the first run creates them)"
                    ),
                ),
            }
        }
    }
}

/// An SQLite store: there, or creatable in the nearest folder that exists.
fn sqlite(path: &Path) -> Finding {
    let what = "store";
    if path.is_file() {
        return Finding::ok(what, format!("{}: a store file", path.display()));
    }
    if path.exists() {
        return Finding::fail(what, format!("{} exists and is not a file", path.display()));
    }
    let folder = path
        .ancestors()
        .skip(1)
        .find(|dir| dir.as_os_str().is_empty() || dir.exists());
    let writable = |dir: &Path| {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        std::fs::metadata(dir).is_ok_and(|m| m.is_dir() && !m.permissions().readonly())
    };
    match folder {
        Some(dir) if writable(dir) => Finding::ok(
            what,
            format!(
                "{}: not there yet (the first run creates it)",
                path.display()
            ),
        ),
        _ => Finding::fail(
            what,
            format!(
                "{}: not there, and its folder cannot be created (no writable folder above it)",
                path.display()
            ),
        ),
    }
}

/// Every subscription (and named tracking subscription) the flows read, and the dead-letter
/// topic.
async fn pubsub(pipeline: &Pipeline) -> Vec<Finding> {
    let mut subscriptions = Vec::new();
    for flow in &pipeline.flows {
        if let Source::PubSub(source) = &flow.source {
            subscriptions.push((flow.name.clone(), source.subscription.clone()));
            if let Some(TrackingSubscription::Named(tracking)) = source
                .watermark
                .as_ref()
                .map(|w| w.tracking_subscription.clone())
            {
                subscriptions.push((format!("{} (tracking)", flow.name), tracking));
            }
        }
    }
    if subscriptions.is_empty() && pipeline.dead_letter_topic.is_none() {
        return Vec::new();
    }
    let config = PubSubConfig {
        project: pipeline.pubsub.project.clone(),
        endpoint: pipeline.pubsub.endpoint.clone(),
    };
    let endpoint = config
        .endpoint()
        .unwrap_or_else(|| "https://pubsub.googleapis.com".to_owned());
    let admin = match within(Admin::connect(&config)).await {
        Some(Ok(admin)) => admin,
        Some(Err(error)) => return vec![Finding::fail("pubsub", error.to_string())],
        None => return vec![Finding::fail("pubsub", format!("{endpoint}: no answer"))],
    };
    let mut findings = Vec::new();
    for (flow, subscription) in subscriptions {
        let what = format!("flow {flow}: subscription {subscription}");
        findings.push(match within(admin.subscription(&subscription)).await {
            None => Finding::fail(
                what,
                format!(
                    "no answer from {endpoint} within {}s",
                    ASK_TIMEOUT.as_secs()
                ),
            ),
            Some(Err(error)) => Finding::fail(what, error.to_string()),
            Some(Ok(None)) => Finding::fail(
                what,
                format!(
                    "does not exist at {endpoint}: create it (gcloud pubsub subscriptions create \
                     {subscription} --topic TOPIC), or fix the name or the pipeline's `pubsub`"
                ),
            ),
            Some(Ok(Some(found))) if found.topic == "_deleted-topic_" => {
                Finding::fail(what, "its topic was deleted: it will never deliver again")
            }
            Some(Ok(Some(found))) => Finding::ok(what, format!("exists, on {}", found.topic)),
        });
    }
    if let Some(topic) = &pipeline.dead_letter_topic {
        let what = format!("dead_letter.topic {topic}");
        findings.push(match within(admin.topic_exists(topic)).await {
            None => Finding::fail(what, format!("no answer from {endpoint}")),
            Some(Err(error)) => Finding::fail(what, error.to_string()),
            Some(Ok(false)) => Finding::fail(
                what,
                format!(
                    "does not exist at {endpoint}: create it (gcloud pubsub topics create {topic})"
                ),
            ),
            Some(Ok(true)) => Finding::ok(what, "exists"),
        });
    }
    findings
}

/// Every file source's glob, matched now.
fn files(pipeline: &Pipeline) -> Vec<Finding> {
    pipeline
        .flows
        .iter()
        .filter_map(|flow| match &flow.source {
            Source::File { path, .. } => Some((flow, path)),
            _ => None,
        })
        .map(|(flow, pattern)| {
            let what = format!("flow {}: files {pattern}", flow.name);
            match glob::glob(pattern) {
                Err(error) => Finding::fail(what, error.to_string()),
                Ok(paths) => match paths.filter_map(Result::ok).count() {
                    0 => Finding::fail(what, "no file matches"),
                    n => Finding::ok(what, format!("{n} file(s) match")),
                },
            }
        })
        .collect()
}
