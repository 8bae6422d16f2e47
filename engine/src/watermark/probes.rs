//! The tracking reader's probes: one published to the topic each tick, their publish outcomes,
//! and what a probe handed back through the tracking stream is to this reading.
//!
//! Only this reading's own probes that come back move the horizon
//! ([`sluice_watermark::DeliveryHorizon`]); a probe whose publish Pub/Sub refused ends the wait
//! for it, one whose outcome is unknown is waited for until it comes back or is given up.
//! Another reader's fresh probes are given back (nacked) to it.

use crate::source::pubsub::{probe_message, publish_refused};
use google_cloud_pubsub::client::Publisher;
use sluice_store::FlowHandle;
use sluice_watermark::{DeliveryHorizon, PublishFailure};
use tokio::sync::mpsc;

/// Another reader's probe published less than this long ago (by this worker's clock, so with
/// room for skew) is given back for it rather than acked.
const FOREIGN_PROBE_MS: i64 = 120_000;

/// How a probe's publish ended: published, or how it failed (refused or unknown) and why.
type ProbeOutcome = Result<(), (PublishFailure, String)>;

/// One reading's probes: the publisher, their names, and their publish outcomes.
pub struct Probes {
    /// Publishes a probe to the topic each tick (the horizon's evidence of a live stream).
    publisher: Publisher,
    /// This reading's probes carry `<prefix><sequence number>`.
    prefix: String,
    next: u64,
    /// Publish outcomes of the probes: (sequence number, published or how and why not).
    outcomes: mpsc::UnboundedReceiver<(u64, ProbeOutcome)>,
    outcomes_tx: mpsc::UnboundedSender<(u64, ProbeOutcome)>,
    /// Whether the last probe publish failed (logged once per episode), and the probes given
    /// up so far (logged as they grow).
    failing: bool,
    given_up: u64,
}

impl Probes {
    /// The probes of a reading named `prefix` (`<worker>/<start>/`), the next numbered `next`;
    /// shows the flow's failure counts from 0.
    pub fn new(flow: &FlowHandle, publisher: Publisher, prefix: String, next: u64) -> Self {
        let (outcomes_tx, outcomes) = mpsc::unbounded_channel();
        for failure in [PublishFailure::Refused, PublishFailure::OutcomeUnknown] {
            probe_failures(flow, failure).increment(0);
        }
        Self {
            publisher,
            prefix,
            next,
            outcomes,
            outcomes_tx,
            failing: false,
            given_up: 0,
        }
    }

    /// Gives the horizon the outcomes of the publishes that ended since the last call: a
    /// refused probe is no longer waited for. Failures are counted and logged once per episode.
    pub fn take_outcomes(&mut self, flow: &FlowHandle, horizon: &mut DeliveryHorizon) {
        while let Ok((seq, published)) = self.outcomes.try_recv() {
            match published {
                Err((failure, error)) => {
                    if !self.failing {
                        tracing::warn!(flow = %flow.name, %error, ?failure,
                            "cannot publish watermark probes to the topic; the watermark holds \
                             until they go through, and waits for a probe whose outcome is \
                             unknown until it comes back (may the worker publish there?)");
                    }
                    self.failing = true;
                    probe_failures(flow, failure).increment(1);
                    horizon.probe_failed(seq, failure);
                }
                Ok(()) => self.failing = false,
            }
        }
    }

    /// What `probe` (the attribute's value), published at `publish_ms`, is to this reading.
    pub fn classify(&self, probe: &str, publish_ms: i64, now: i64) -> Probe {
        classify_probe(probe, &self.prefix, publish_ms, now)
    }

    /// Logs the probes the horizon gave up since the last call.
    pub fn log_given_up(&mut self, flow: &FlowHandle, horizon: &DeliveryHorizon) {
        let given_up = horizon.probes_given_up();
        if given_up > self.given_up {
            tracing::warn!(flow = %flow.name, given_up, "watermark probes did not come back \
                within 5 minutes and were given up (another reader took them, or a filter drops \
                them)");
            self.given_up = given_up;
        }
    }

    /// Publishes the next probe. The horizon waits for it until it comes back, Pub/Sub refuses
    /// it, or it is given up (an unknown publish outcome does not end the wait).
    pub fn send(&mut self, horizon: &mut DeliveryHorizon, now: i64) {
        let seq = self.next;
        self.next += 1;
        horizon.probe_sent(seq, now);
        let published = self.publisher.publish(probe_message(&self.prefix, seq));
        let outcomes = self.outcomes_tx.clone();
        tokio::spawn(async move {
            let published = published.await.map(|_| ()).map_err(|error| {
                let failure = if publish_refused(&error) {
                    PublishFailure::Refused
                } else {
                    PublishFailure::OutcomeUnknown
                };
                (failure, error.to_string())
            });
            let _ = outcomes.send((seq, published));
        });
    }
}

/// `sluice_watermark_probe_failures_total{outcome}`: probe publishes that failed, refused or
/// with an unknown outcome.
fn probe_failures(flow: &FlowHandle, failure: PublishFailure) -> metrics::Counter {
    let outcome = match failure {
        PublishFailure::Refused => "refused",
        PublishFailure::OutcomeUnknown => "unknown",
    };
    metrics::counter!("sluice_watermark_probe_failures_total",
        "pipeline" => flow.pipeline.to_string(),
        "flow" => flow.name.to_string(), "outcome" => outcome)
}

/// A probe the tracking reader was handed.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// One of this reading's, with its sequence number.
    Own(u64),
    /// Another reading's: given back (nacked) while it is fresh, since another reader may still
    /// wait for it; a stale one is acked.
    Other {
        /// Nack it rather than ack it.
        give_back: bool,
    },
}

/// What `probe` (the attribute's value) is to the reading whose probes start with
/// `probe_prefix` (`<worker>/<start>/`).
fn classify_probe(probe: &str, probe_prefix: &str, publish_ms: i64, now: i64) -> Probe {
    if let Some(seq) = probe
        .strip_prefix(probe_prefix)
        .and_then(|seq| seq.parse::<u64>().ok())
    {
        return Probe::Own(seq);
    }
    // This worker's earlier readings' probes (replayed by its own seek) are given back too:
    // they hold the horizon as a backlog while the emulator is still handing the replay back
    // (acking them let `watermark_seek.rs` see 141 late rows under load).
    Probe::Other {
        give_back: publish_ms >= now - FOREIGN_PROBE_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_probes_of_other_readings_are_given_back_stale_ones_acked() {
        let (prefix, now) = ("w1/1000/", 1_000_000);
        assert_eq!(classify_probe("w1/1000/7", prefix, now, now), Probe::Own(7));
        assert_eq!(
            classify_probe("w2/900/3", prefix, now - 1_000, now),
            Probe::Other { give_back: true }
        );
        assert_eq!(
            classify_probe("w2/900/3", prefix, now - FOREIGN_PROBE_MS - 1, now),
            Probe::Other { give_back: false }
        );
    }
}
