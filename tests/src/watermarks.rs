//! What the watermark tests share: events with an event-time attribute, and a sampler of a
//! flow's stored watermark to check rows against afterwards (every row committed after a
//! sample `(t, W)` must have an event time of at least `W`).

use crate::now_ms;
use google_cloud_pubsub::client::Publisher;
use google_cloud_pubsub::model::Message;
use sluice_engine::pubsub::publish_all;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// An event with id `id` (the `event_id` attribute, the dedup key) and event time `event_ms`
/// (the `ts` attribute).
pub fn timed_event(id: &str, event_ms: i64) -> Message {
    Message::new()
        .set_data(bytes::Bytes::from(format!("{{\"id\":\"{id}\"}}")))
        .set_attributes([("event_id", id.to_owned()), ("ts", event_ms.to_string())])
}

/// Publishes `per_tenth` events every 100 ms for `ticks` ticks, ids `<prefix><n>`, event times
/// up to 5 s before publish; returns how many.
pub async fn publish_steadily(
    publisher: &Publisher,
    prefix: &str,
    per_tenth: usize,
    ticks: u32,
) -> usize {
    let started = Instant::now();
    let mut sent = 0usize;
    for tick in 0..ticks {
        let chunk: Vec<Message> = (0..per_tenth)
            .map(|i| {
                timed_event(
                    &format!("{prefix}{}", sent + i),
                    now_ms() - rand::random_range(0..5_000),
                )
            })
            .collect();
        sent += chunk.len();
        publish_all(publisher, chunk).await.unwrap();
        tokio::time::sleep_until((started + Duration::from_millis(100) * (tick + 1)).into()).await;
    }
    sent
}

/// Samples `(when, watermark)` every `every` until finished, keeping samples with a watermark
/// (`read` gives 0 for none); `when` is taken after the read, so every row committed after it
/// was committed with that watermark (or a later one) in the store.
pub struct WatermarkHistory {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(i64, i64)>>,
}

impl WatermarkHistory {
    /// Starts sampling with `read`.
    pub fn start(every: Duration, read: impl Fn() -> i64 + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut samples = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let w = read();
                    if w > 0 {
                        samples.push((now_ms(), w));
                    }
                    std::thread::sleep(every);
                }
                samples
            })
        };
        Self { stop, thread }
    }

    /// Stops sampling; the samples, oldest first.
    pub fn finish(self) -> Vec<(i64, i64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// The band of a [`WatermarkedPipeline`], ms.
pub const BAND_MS: i64 = 10_000;

/// SQL: the row's event time lies within the band before its publish time. An event whose
/// publish came more than the band after it (the test's publisher, on a loaded machine, can
/// take seconds to publish what it stamped) is late by definition: nothing holds the watermark
/// for it before the tracking reader sees it, and sluice counts it late, rightly.
pub const IN_BAND: &str = "publish_time - event_time <= 10000";

/// Rows of `table` (in the SQLite store `db`) outside the band, which sluice may rightly
/// count late.
pub fn out_of_band(db: &crate::Db, table: &str) -> i64 {
    db.query(&format!(
        "SELECT COUNT(*) FROM {table} WHERE NOT ({IN_BAND})"
    ))
}

/// How many rows (at most, over the samples) `rows_behind(when, watermark)` found committed
/// after a sample below it, and the first such sample.
pub fn rows_behind(
    samples: &[(i64, i64)],
    rows_behind: impl Fn(i64, i64) -> i64,
) -> (i64, Option<String>) {
    let mut worst = 0;
    let mut first = None;
    for (when, watermark) in samples {
        let n = rows_behind(*when, *watermark);
        if n > 0 && first.is_none() {
            first = Some(format!("{n} rows committed after {when} below {watermark}"));
        }
        worst = worst.max(n);
    }
    (worst, first)
}

/// Where a watermarked test pipeline stores, reads and reports.
pub struct WatermarkedPipeline<'a> {
    /// `store:` URL.
    pub store: String,
    /// `pubsub.endpoint`.
    pub endpoint: String,
    /// `metrics.listen` port, if any.
    pub metrics_port: Option<u16>,
    /// The subscription of flow `ingest`.
    pub subscription: &'a str,
    /// The inline map of target `events` (`{ name: events, kind: table }`).
    pub target: &'a str,
}

impl WatermarkedPipeline<'_> {
    /// The YAML of pipeline `test`: flow `ingest` into target `events`, dedup by `event_id`,
    /// event time from `ts`, an `auto` tracking subscription and a 10 s band, two streams.
    /// More flows may be appended.
    pub fn yaml(&self) -> String {
        let metrics = self
            .metrics_port
            .map(|port| format!("metrics: {{ listen: \"127.0.0.1:{port}\" }}\n"))
            .unwrap_or_default();
        format!(
            "pipeline: test
mode: continuous
store: \"{store}\"
pubsub: {{ project: {project}, endpoint: \"{endpoint}\" }}
{metrics}targets:
  - {target}
flows:
  - name: ingest
    target: events
    source:
      pubsub:
        subscription: {subscription}
        dedup: {{ by: attribute, attribute: event_id }}
        event_time: {{ attribute: ts }}
        watermark: {{ tracking_subscription: auto, band: 10s }}
        streams: 2
",
            store = self.store,
            project = crate::PROJECT,
            endpoint = self.endpoint,
            target = self.target,
            subscription = self.subscription,
        )
    }
}
