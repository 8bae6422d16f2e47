//! What one flow's watermark tracker is configured with (from the flow's `watermark` and
//! `event_time` sections and the worker's identity).

/// What one flow's tracker needs.
#[derive(Debug, Clone)]
pub struct TrackerSettings {
    /// The tracking subscription (short name or full path).
    pub tracking_subscription: String,
    /// `tracking_subscription: auto`: the base subscription, on whose topic (with whose
    /// filter) the tracking subscription is created when missing, before it is first read.
    pub create_from: Option<String>,
    /// `event_time.attribute`; `None`: the publish time.
    pub event_time_attribute: Option<String>,
    /// `on_bad_timestamp: publish_time`.
    pub bad_timestamp_uses_publish_time: bool,
    /// `watermark.band`, ms.
    pub band_ms: i64,
    /// The flow's own subscription, which the tracking subscription must mirror (same topic,
    /// same filter).
    pub base_subscription: String,
    /// This worker's id (the lease holder name).
    pub worker: String,
    /// Where the reader publishes its probes; `None`: the flow's Pub/Sub endpoint. (The
    /// worker takes it from `SLUICE_PROBE_ENDPOINT`, with which the tests fault the probe
    /// publisher alone.)
    pub probe_endpoint: Option<String>,
}
