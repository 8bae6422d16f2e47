//! Starts and stops the publisher of the pipeline's dead-letter topic (`dead_letter.topic`,
//! see `sluice_engine::DeadLetterTopic` for what it guarantees): every replica runs
//! one, and the pool's lease lets one at a time publish.

use sluice_connector::PubSubConfig;
use sluice_engine::pubsub::Admin;
use sluice_engine::{DeadLetterTopic, FLUSH_GRACE, ReaderTurn};
use sluice_pipeline::Pipeline;
use sluice_store::Store;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// A running publisher.
pub struct Publishing {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Publishing {
    /// Stops taking new work and publishes what waits for at most the publisher's flush grace
    /// (a little longer, then it is aborted), or until `give_up` (the second signal): what is
    /// left waits in the outbox for the next holder.
    pub async fn finish(mut self, give_up: &CancellationToken) {
        self.stop.cancel();
        let limit = FLUSH_GRACE + std::time::Duration::from_secs(5);
        tokio::select! {
            ended = &mut self.task => {
                if let Err(error) = ended {
                    tracing::warn!(%error, "the dead-letter publisher ended abnormally");
                }
            }
            _ = tokio::time::sleep(limit) => {
                tracing::warn!("the dead-letter publisher did not stop in time; what it had \
                    not published waits in the outbox");
                self.task.abort();
            }
            _ = give_up.cancelled() => self.task.abort(),
        }
    }
}

/// Starts the publisher when the pipeline has a dead-letter topic. A topic given by a short
/// name with no project anywhere is an error (the run cannot start); a missing or unreachable
/// topic is not (letters wait in the outbox, retried).
pub async fn start(
    pipeline: &Pipeline,
    store: &Arc<dyn Store>,
    worker: &str,
) -> Result<Option<Publishing>, String> {
    let Some(topic) = &pipeline.dead_letter_topic else {
        return Ok(None);
    };
    let config = PubSubConfig {
        project: pipeline.pubsub.project.clone(),
        endpoint: pipeline.pubsub.endpoint.clone(),
    }
    .with_adc_project()
    .await;
    let path = config
        .topic_path(topic)
        .map_err(|e| format!("dead_letter.topic: {e}"))?;
    let admin = Admin::connect(&config)
        .await
        .map_err(|e| format!("dead_letter.topic {path}: {e}"))?;
    let publisher = admin
        .publisher(&path)
        .await
        .map_err(|e| format!("dead_letter.topic {path}: {e}"))?;
    tracing::info!(topic = %path, "dead letters are published to this topic as well");
    let letters = DeadLetterTopic {
        outbox: store.clone(),
        turn: ReaderTurn {
            pool: store.clone(),
            holder: worker.to_owned(),
        },
        pipeline: pipeline.name.clone(),
        topic: path,
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(letters.run(publisher, stop.clone()));
    Ok(Some(Publishing { stop, task }))
}
