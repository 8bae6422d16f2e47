//! The Google Cloud project Application Default Credentials name, for a worker told of none
//! (no `pubsub.project`, no `PUBSUB_PROJECT_ID` or `GOOGLE_CLOUD_PROJECT`), as Google's own
//! clients find it: the key file `GOOGLE_APPLICATION_CREDENTIALS` names (`project_id`, else
//! `quota_project_id`), then gcloud's application-default file (`quota_project_id`), then the
//! metadata server of the VM or the GKE node (Workload Identity serves the project there too).
//!
//! Looked up once, at start, and only when a project is needed; the metadata server gets
//! [`METADATA_TIMEOUT`], so off Google Cloud the lookup ends quickly with nothing.

use std::path::PathBuf;
use std::time::Duration;

/// How long the metadata server may take to answer (it answers in milliseconds on Google
/// Cloud; elsewhere its name does not resolve or nothing listens).
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the metadata server is: `GCE_METADATA_HOST` (as Google's clients read it), else its
/// well-known name.
fn metadata_host() -> String {
    std::env::var("GCE_METADATA_HOST")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| "metadata.google.internal".to_owned())
}

/// gcloud's application-default credentials file.
fn gcloud_adc_file() -> Option<PathBuf> {
    let config = std::env::var_os("CLOUDSDK_CONFIG")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/gcloud")))?;
    Some(config.join("application_default_credentials.json"))
}

/// A project named in a credentials file, under one of `keys`.
fn project_in_file(path: &std::path::Path, keys: &[&str]) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    keys.iter()
        .filter_map(|key| json.get(key)?.as_str())
        .find(|p| !p.trim().is_empty())
        .map(str::to_owned)
}

/// The project the metadata server reports, if one answers within [`METADATA_TIMEOUT`].
async fn project_from_metadata() -> Option<String> {
    let url = format!(
        "http://{}/computeMetadata/v1/project/project-id",
        metadata_host()
    );
    let client = reqwest::Client::builder()
        .timeout(METADATA_TIMEOUT)
        .build()
        .ok()?;
    let response = client
        .get(url)
        .header("Metadata-Flavor", "Google")
        .send()
        .await
        .ok()?
        .error_for_status()
        .ok()?;
    let project = response.text().await.ok()?;
    let project = project.trim();
    (!project.is_empty()).then(|| project.to_owned())
}

/// The project Application Default Credentials name, and where it was found.
pub async fn adc_project() -> Option<(String, &'static str)> {
    if let Some(path) = std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS")
        && let Some(project) = project_in_file(
            PathBuf::from(path).as_path(),
            &["project_id", "quota_project_id"],
        )
    {
        return Some((project, "GOOGLE_APPLICATION_CREDENTIALS"));
    }
    if let Some(path) = gcloud_adc_file()
        && let Some(project) = project_in_file(&path, &["quota_project_id"])
    {
        return Some((project, "gcloud's application-default credentials"));
    }
    project_from_metadata()
        .await
        .map(|project| (project, "the metadata server"))
}
