//! Google Cloud Pub/Sub through the official `google-cloud-pubsub` client: where to connect,
//! the streaming-pull source, and admin helpers for topics and subscriptions.
//!
//! The client does not read `PUBSUB_EMULATOR_HOST` itself; [`PubSubConfig::endpoint`] does:
//! `pubsub.endpoint` from the pipeline file wins, then `PUBSUB_EMULATOR_HOST`. A plaintext
//! (`http://`) endpoint is taken to be an emulator and gets anonymous credentials; otherwise
//! Application Default Credentials are used.

mod ack;
mod adc_project;
mod admin;
mod pause;
mod probe;
mod publish_outcome;
mod reachability;
mod running;
mod schema_registry;
mod settings;
mod source;
mod tracking_subscription;

/// Where the error of a source lives: the seam of every source (`crate::source`).
pub use crate::source::SourceError;
pub use ack::ACK_FAILURE_REASONS;
pub use admin::{Admin, SubscriptionSettings, publish_all};
pub use probe::{
    PROBE_ATTRIBUTE, RESERVED_ATTRIBUTE_REASON, is_probe, probe_message, reserved_attribute_problem,
};
pub use publish_outcome::publish_refused;
pub use schema_registry::PubSubSchemas;
pub use settings::FlowIntent;
pub use settings::describe as describe_subscription;
pub use source::PubSubSource;
pub use tracking_subscription::{TrackingStart, log_tracking_start, tracking_filter};

use google_cloud_auth::credentials::Credentials;

/// Where and as whom to talk to Pub/Sub. The default follows the environment: the emulator
/// at `PUBSUB_EMULATOR_HOST` if set, else the real service with Application Default
/// Credentials.
///
/// ```
/// use sluice_engine::PubSubConfig;
/// let emulator = PubSubConfig {
///     project: Some("my-project".to_owned()),
///     endpoint: Some("127.0.0.1:8085".to_owned()),
/// };
/// assert_eq!(emulator.endpoint().as_deref(), Some("http://127.0.0.1:8085"));
/// assert_eq!(
///     emulator.subscription_path("orders").unwrap(),
///     "projects/my-project/subscriptions/orders"
/// );
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PubSubConfig {
    /// `pubsub.project`; `None`: `PUBSUB_PROJECT_ID`, then `GOOGLE_CLOUD_PROJECT`.
    pub project: Option<String>,
    /// `pubsub.endpoint`; `None`: `PUBSUB_EMULATOR_HOST`, then the real service.
    pub endpoint: Option<String>,
}

impl PubSubConfig {
    /// The endpoint to use, with a scheme; `None` for the real service's default.
    pub fn endpoint(&self) -> Option<String> {
        let raw = self
            .endpoint
            .clone()
            .or_else(|| std::env::var("PUBSUB_EMULATOR_HOST").ok())
            .filter(|e| !e.trim().is_empty())?;
        Some(if raw.contains("://") {
            raw
        } else {
            format!("http://{raw}")
        })
    }

    /// This config with its project from Application Default Credentials when neither it nor
    /// the environment names one (logged once); unchanged otherwise.
    ///
    /// ```no_run
    /// # async fn resolve() {
    /// use sluice_engine::PubSubConfig;
    /// let config = PubSubConfig::default().with_adc_project().await;
    /// println!("project: {:?}", config.project());
    /// # }
    /// ```
    pub async fn with_adc_project(mut self) -> Self {
        if self.project().is_some() {
            return self;
        }
        match adc_project::adc_project().await {
            Some((project, from)) => {
                tracing::info!(
                    project,
                    from,
                    "Pub/Sub project from Application Default Credentials"
                );
                self.project = Some(project);
            }
            None => tracing::debug!("no project in Application Default Credentials"),
        }
        self
    }

    /// The project, from the file or the environment.
    pub fn project(&self) -> Option<String> {
        self.project
            .clone()
            .or_else(|| std::env::var("PUBSUB_PROJECT_ID").ok())
            .or_else(|| std::env::var("GOOGLE_CLOUD_PROJECT").ok())
            .filter(|p| !p.is_empty())
    }

    /// Anonymous credentials for a plaintext (emulator) endpoint; `None`: ADC.
    pub(crate) fn credentials(&self) -> Option<Credentials> {
        self.endpoint()
            .filter(|e| e.starts_with("http://"))
            .map(|_| google_cloud_auth::credentials::anonymous::Builder::new().build())
    }

    /// `projects/P/subscriptions/S` for a short name or a full path.
    pub fn subscription_path(&self, name: &str) -> Result<String, SourceError> {
        self.resource_path("subscriptions", name)
    }

    /// `projects/P/topics/T` for a short name or a full path.
    pub fn topic_path(&self, name: &str) -> Result<String, SourceError> {
        self.resource_path("topics", name)
    }

    fn resource_path(&self, kind: &str, name: &str) -> Result<String, SourceError> {
        if name.starts_with("projects/") {
            return Ok(name.to_owned());
        }
        let project = self.project().ok_or_else(|| {
            SourceError::Name(format!(
                "{kind} {name:?} is a short name but no project is set \
                 (pubsub.project, PUBSUB_PROJECT_ID, GOOGLE_CLOUD_PROJECT or Application \
                 Default Credentials)"
            ))
        })?;
        Ok(format!("projects/{project}/{kind}/{name}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_endpoint_gets_a_scheme_and_paths_expand() {
        let config = PubSubConfig {
            project: Some("p".into()),
            endpoint: Some("127.0.0.1:8085".into()),
        };
        assert_eq!(config.endpoint().as_deref(), Some("http://127.0.0.1:8085"));
        assert!(config.credentials().is_some());
        assert_eq!(
            config.subscription_path("s").ok().as_deref(),
            Some("projects/p/subscriptions/s")
        );
        assert_eq!(
            config.topic_path("projects/q/topics/t").ok().as_deref(),
            Some("projects/q/topics/t")
        );
    }
}
