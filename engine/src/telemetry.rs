//! Counts kept per flow: plain atomics the worker reads for its summary and tests read for
//! assertions, mirrored to the `metrics` facade (SPEC §8 names) for Prometheus.

use crate::watermark::FlowWatermark;
use metrics::{Counter, Gauge, Histogram};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// The dead-letter reasons sluice writes (`sluice_messages_dead_lettered_total{reason}`),
/// exported at 0 from a flow's start.
pub const DEAD_LETTER_REASONS: [&str; 8] = [
    "bad_timestamp",
    "max_attempts",
    "missing_dedup_attribute",
    "missing_id",
    crate::source::file_record::RECORD_TOO_LARGE,
    crate::source::pubsub::RESERVED_ATTRIBUTE_REASON,
    "undecodable",
    crate::flow::storable::UNSTORABLE,
];

/// The kinds of failed commit attempts (`sluice_commit_errors_total{kind}`), exported at 0 from
/// a flow's start.
pub const COMMIT_ERROR_KINDS: [&str; 10] = [
    "claim_lost",
    "config",
    "gave_up",
    "moved",
    "record",
    "rejected",
    "stage",
    "stage_unavailable",
    "stale",
    "unavailable",
];

/// Per-flow counters. Cheap to clone; increments are per batch, not per message, where possible.
#[derive(Clone)]
pub struct Counters {
    inner: Arc<Inner>,
    pipeline: Arc<str>,
    flow: Arc<str>,
}

struct Inner {
    received: Tally,
    duplicates_memory: Tally,
    /// Memory-tier duplicates the store has not recorded yet ([`Counters::take_unrecorded_memory_duplicates`]).
    unrecorded_memory_duplicates: AtomicU64,
    duplicates_store: Tally,
    committed: Tally,
    /// Total only: the metric carries the reason, so it is made per reason when counted.
    dead_lettered: AtomicU64,
    acked: Tally,
    /// Deliveries given back uncommitted (`sluice_messages_nacked_total`).
    nacked: Tally,
    /// Nacked because they were held past the commit bound (part of `nacked`).
    stale: Tally,
    commit_errors: AtomicU64,
    inflight: Gauge,
    /// Receive instants of the oldest message of each batch not yet settled (a multiset):
    /// its minimum is the system lag.
    unacked_since: Mutex<BTreeMap<Instant, usize>>,
    oldest_unacked_age: Gauge,
    cache_entries: Gauge,
    commit_seconds: Histogram,
    ack_latency_seconds: Histogram,
    late: Tally,
    /// Records a typed flow's `where:` left out (`sluice_records_filtered_total`).
    filtered: Tally,
    /// Messages without the dedup attribute (`sluice_dedup_key_missing_total`).
    key_missing: Tally,
    /// Whether the first of them was logged.
    key_missing_warned: std::sync::atomic::AtomicBool,
    /// Set once, for flows with a watermark.
    watermark: OnceLock<FlowWatermark>,
    /// The watermark gauges, made when the flow first has a watermark: until then they are
    /// absent from `/metrics` (a 0 would read as "perfectly fresh").
    watermark_gauges: OnceLock<(Gauge, Gauge)>,
    /// Set once, for flows reading a table: the watermark that travels down from the table's
    /// writers (shown and counted against like `watermark`, with no tracker behind it).
    feed_watermark: OnceLock<FlowWatermark>,
    /// `sluice_feed_rows_behind` and `sluice_feed_lag_seconds`, made for flows reading a table.
    feed_gauges: OnceLock<(Gauge, Gauge)>,
    /// `sluice_source_records_read_total`, made when a bounded source first reads.
    records_read: OnceLock<Counter>,
}

struct Tally {
    value: AtomicU64,
    metric: Counter,
}

impl Tally {
    fn new(metric: Counter) -> Self {
        Self {
            value: AtomicU64::new(0),
            metric,
        }
    }

    fn add(&self, n: u64) {
        if n > 0 {
            self.value.fetch_add(n, Ordering::Relaxed);
            self.metric.increment(n);
        }
    }

    fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// A point-in-time copy of [`Counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Messages received, redeliveries included.
    pub received: u64,
    /// Duplicates caught by the memory tier.
    pub duplicates_memory: u64,
    /// Duplicates caught by the store's ledger.
    pub duplicates_store: u64,
    /// Target rows committed.
    pub committed: u64,
    /// Dead-letter rows committed.
    pub dead_lettered: u64,
    /// Acks sent (after commit).
    pub acked: u64,
    /// Nacks sent (abandoned, uncommitted).
    pub nacked: u64,
    /// Of those, deliveries held past the commit bound (`sluice_messages_stale_total`).
    pub stale: u64,
    /// Failed commit attempts.
    pub commit_errors: u64,
    /// Rows committed with an event time below the flow's watermark at their commit.
    pub late: u64,
    /// Records a typed flow's `where:` left out: acked, no row.
    pub filtered: u64,
}

impl Counters {
    /// Counters for one flow of one pipeline.
    pub fn new(pipeline: &str, flow: &str) -> Self {
        let labels = [("pipeline", pipeline.to_owned()), ("flow", flow.to_owned())];
        let with_layer = |layer: &'static str| {
            let mut l = labels.to_vec();
            l.push(("layer", layer.to_owned()));
            metrics::counter!("sluice_messages_duplicate_total", &l)
        };
        let counters = Self {
            inner: Arc::new(Inner {
                received: Tally::new(metrics::counter!("sluice_messages_received_total", &labels)),
                duplicates_memory: Tally::new(with_layer("memory")),
                unrecorded_memory_duplicates: AtomicU64::new(0),
                duplicates_store: Tally::new(with_layer("store")),
                committed: Tally::new(metrics::counter!(
                    "sluice_messages_committed_total",
                    &labels
                )),
                dead_lettered: AtomicU64::new(0),
                acked: Tally::new(metrics::counter!("sluice_messages_acked_total", &labels)),
                nacked: Tally::new(metrics::counter!("sluice_messages_nacked_total", &labels)),
                stale: Tally::new(metrics::counter!("sluice_messages_stale_total", &labels)),
                commit_errors: AtomicU64::new(0),
                inflight: metrics::gauge!("sluice_inflight_messages", &labels),
                unacked_since: Mutex::new(BTreeMap::new()),
                oldest_unacked_age: metrics::gauge!(
                    "sluice_oldest_unacked_message_age_seconds",
                    &labels
                ),
                cache_entries: metrics::gauge!("sluice_dedup_cache_entries", &labels),
                commit_seconds: metrics::histogram!("sluice_commit_duration_seconds", &labels),
                ack_latency_seconds: metrics::histogram!("sluice_ack_latency_seconds", &labels),
                late: Tally::new(metrics::counter!("sluice_messages_late_total", &labels)),
                filtered: Tally::new(metrics::counter!("sluice_records_filtered_total", &labels)),
                key_missing: Tally::new(metrics::counter!(
                    "sluice_dedup_key_missing_total",
                    &labels
                )),
                key_missing_warned: std::sync::atomic::AtomicBool::new(false),
                watermark: OnceLock::new(),
                watermark_gauges: OnceLock::new(),
                feed_watermark: OnceLock::new(),
                feed_gauges: OnceLock::new(),
                records_read: OnceLock::new(),
            }),
            pipeline: Arc::from(pipeline),
            flow: Arc::from(flow),
        };
        // Every labelled counter exists from the start, at 0, so rates and alerts have a series
        // before the first event.
        for reason in DEAD_LETTER_REASONS {
            counters.dead_letter_counter(reason).increment(0);
        }
        for kind in COMMIT_ERROR_KINDS {
            counters.commit_error_counter(kind).increment(0);
        }
        counters
    }

    fn dead_letter_counter(&self, reason: &str) -> Counter {
        metrics::counter!("sluice_messages_dead_lettered_total",
            "pipeline" => self.pipeline.clone(), "flow" => self.flow.clone(),
            "reason" => reason.to_owned())
    }

    fn commit_error_counter(&self, kind: &'static str) -> Counter {
        metrics::counter!("sluice_commit_errors_total",
            "pipeline" => self.pipeline.clone(), "flow" => self.flow.clone(), "kind" => kind)
    }

    /// Records a bounded source read from its files, skipped ones included (what a pool's
    /// replicas read in total, against the file's size).
    pub(crate) fn records_read(&self, n: u64) {
        self.inner
            .records_read
            .get_or_init(|| {
                metrics::counter!("sluice_source_records_read_total",
                    "pipeline" => self.pipeline.clone(), "flow" => self.flow.clone())
            })
            .increment(n);
    }

    pub(crate) fn received(&self, n: u64) {
        self.inner.received.add(n);
        self.inner.inflight.increment(n as f64);
    }
    pub(crate) fn duplicate_in_memory(&self, n: u64) {
        self.inner.duplicates_memory.add(n);
        self.inner
            .unrecorded_memory_duplicates
            .fetch_add(n, Ordering::Relaxed);
    }
    /// The memory-tier duplicates since the last call, for the next commit to record in the
    /// store (given back with [`Counters::memory_duplicates_unrecorded`] if it fails).
    pub(crate) fn take_unrecorded_memory_duplicates(&self) -> u64 {
        self.inner
            .unrecorded_memory_duplicates
            .swap(0, Ordering::Relaxed)
    }
    /// Memory-tier duplicates a failed commit did not record: the next one will.
    pub(crate) fn memory_duplicates_unrecorded(&self, n: u64) {
        self.inner
            .unrecorded_memory_duplicates
            .fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn committed(&self, rows: u64, duplicates: u64) {
        self.inner.committed.add(rows);
        self.inner.duplicates_store.add(duplicates);
    }
    /// Dead letters committed with `reason` (rare: the labelled handle is looked up each time).
    pub(crate) fn dead_lettered(&self, reason: &str, n: u64) {
        self.inner.dead_lettered.fetch_add(n, Ordering::Relaxed);
        self.dead_letter_counter(reason).increment(n);
    }
    pub(crate) fn acked(&self, n: u64) {
        self.inner.acked.add(n);
        self.inner.inflight.decrement(n as f64);
    }
    pub(crate) fn nacked(&self, n: u64) {
        self.inner.nacked.add(n);
        self.inner.inflight.decrement(n as f64);
    }
    /// Deliveries given back because they were held past the commit bound (also counted as
    /// nacked).
    pub(crate) fn stale(&self, n: u64) {
        self.inner.stale.add(n);
    }
    /// A batch whose oldest message was received at `since` is in flight.
    pub(crate) fn track_unacked(&self, since: Instant) {
        if let Ok(mut unacked) = self.inner.unacked_since.lock() {
            *unacked.entry(since).or_default() += 1;
        }
    }

    /// The batch tracked with `since` is settled (acked or nacked).
    pub(crate) fn untrack_unacked(&self, since: Instant) {
        if let Ok(mut unacked) = self.inner.unacked_since.lock()
            && let Some(count) = unacked.get_mut(&since)
        {
            *count -= 1;
            if *count == 0 {
                unacked.remove(&since);
            }
        }
    }

    /// Age of the oldest message received and not yet settled (zero when none): the system
    /// lag, as Dataflow's `system_lag`. Messages still in the intake queue, not yet in a batch,
    /// are not counted.
    pub fn oldest_unacked_age(&self) -> std::time::Duration {
        self.inner
            .unacked_since
            .lock()
            .ok()
            .and_then(|unacked| unacked.keys().next().map(Instant::elapsed))
            .unwrap_or_default()
    }

    /// Sets `sluice_oldest_unacked_message_age_seconds` from the batches in flight, and the
    /// watermark gauges of a flow that has one.
    pub(crate) fn publish_lag(&self) {
        self.inner
            .oldest_unacked_age
            .set(self.oldest_unacked_age().as_secs_f64());
        self.publish_watermark();
    }

    /// Gives the flow a watermark: its settled messages are counted toward it, its commits
    /// count late rows against it, and its gauges show it. Only the first call counts. Messages
    /// settled outside a commit (duplicates found in memory) are then acked only once a
    /// [`crate::WatermarkTracker`] of the flow has stored their reports: attach a watermark only
    /// with a tracker running.
    pub fn attach_watermark(&self, watermark: FlowWatermark) {
        let _ = self.inner.watermark.set(watermark);
    }

    /// The flow's watermark, if it has one.
    pub fn watermark(&self) -> Option<&FlowWatermark> {
        self.inner.watermark.get()
    }

    /// Gives a flow reading a table the watermark it takes over from the table (see
    /// [`crate::TableSource`]): shown by the watermark gauges and counted against for late
    /// rows, but with no reports to store before acks. Only the first call counts.
    pub fn attach_feed_watermark(&self, watermark: FlowWatermark) {
        let _ = self.inner.feed_watermark.set(watermark);
    }

    /// The watermark the flow shows: its own, or the one taken over from its table.
    pub fn shown_watermark(&self) -> Option<&FlowWatermark> {
        self.watermark().or(self.inner.feed_watermark.get())
    }

    /// Sets `sluice_feed_rows_behind` (committed rows of the table not yet committed by this
    /// flow) and `sluice_feed_lag_seconds` (age of the oldest of them), for a flow reading a
    /// table.
    pub(crate) fn publish_feed_lag(&self, rows_behind: u64, lag_seconds: f64) {
        let (rows, lag) = self.inner.feed_gauges.get_or_init(|| {
            let labels = [
                ("pipeline", self.pipeline.to_string()),
                ("flow", self.flow.to_string()),
            ];
            (
                metrics::gauge!("sluice_feed_rows_behind", &labels),
                metrics::gauge!("sluice_feed_lag_seconds", &labels),
            )
        });
        rows.set(rows_behind as f64);
        lag.set(lag_seconds);
    }

    /// Sets `sluice_watermark_timestamp_seconds` and `sluice_data_watermark_age_seconds`, which
    /// exist only once the flow has a watermark.
    pub fn publish_watermark(&self) {
        if let Some(ms) = self.shown_watermark().and_then(FlowWatermark::current) {
            let (timestamp, age) = self.inner.watermark_gauges.get_or_init(|| {
                let labels = [
                    ("pipeline", self.pipeline.to_string()),
                    ("flow", self.flow.to_string()),
                ];
                (
                    metrics::gauge!("sluice_watermark_timestamp_seconds", &labels),
                    metrics::gauge!("sluice_data_watermark_age_seconds", &labels),
                )
            });
            timestamp.set(ms as f64 / 1000.0);
            let age_ms = crate::time::now_ms().saturating_sub(ms).max(0);
            age.set(age_ms as f64 / 1000.0);
        }
    }

    /// Rows committed below the watermark.
    pub(crate) fn late(&self, n: u64) {
        self.inner.late.add(n);
    }

    /// Records a typed flow's `where:` left out.
    pub(crate) fn filtered(&self, n: u64) {
        self.inner.filtered.add(n);
    }

    /// Counts a message without the dedup attribute `attribute`, and logs the first one: it is
    /// keyed by its message id (so a publisher's repeat of it lands again), or with
    /// `dead_letter` refused.
    pub(crate) fn dedup_key_missing(&self, attribute: &str, dead_letter: bool) {
        self.inner.key_missing.add(1);
        if !self
            .inner
            .key_missing_warned
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            let what = if dead_letter {
                "dead-lettered (dedup.on_missing: dead_letter)"
            } else {
                "keyed by its message id, so a publisher's repeat of it lands again (set \
                 dedup.on_missing: dead_letter to refuse such messages)"
            };
            tracing::warn!(pipeline = %self.pipeline, flow = %self.flow, %attribute,
                "a message has no dedup attribute: {what}; counted in \
                 sluice_dedup_key_missing_total, logged once");
        }
    }

    /// Messages that had no dedup attribute.
    pub fn dedup_keys_missing(&self) -> u64 {
        self.inner.key_missing.get()
    }

    /// Sets `sluice_dedup_cache_entries` to the `entries` keys the memory tier holds.
    pub(crate) fn publish_cache_entries(&self, entries: u64) {
        self.inner.cache_entries.set(entries as f64);
    }

    /// A failed commit attempt; `kind` is one of [`COMMIT_ERROR_KINDS`].
    pub(crate) fn commit_failed(&self, kind: &'static str) {
        self.inner.commit_errors.fetch_add(1, Ordering::Relaxed);
        self.commit_error_counter(kind).increment(1);
    }
    pub(crate) fn commit_took(&self, seconds: f64) {
        self.inner.commit_seconds.record(seconds);
    }
    pub(crate) fn ack_latency(&self, seconds: f64) {
        self.inner.ack_latency_seconds.record(seconds);
    }

    /// Current values.
    pub fn snapshot(&self) -> Snapshot {
        let i = &self.inner;
        Snapshot {
            received: i.received.get(),
            duplicates_memory: i.duplicates_memory.get(),
            duplicates_store: i.duplicates_store.get(),
            committed: i.committed.get(),
            dead_lettered: i.dead_lettered.load(Ordering::Relaxed),
            acked: i.acked.get(),
            nacked: i.nacked.get(),
            stale: i.stale.get(),
            commit_errors: i.commit_errors.load(Ordering::Relaxed),
            late: i.late.get(),
            filtered: i.filtered.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::COMMIT_ERROR_KINDS;
    use sluice_store::StoreError;

    #[test]
    fn every_store_errors_commit_label_is_exported_from_the_start() {
        let errors = [
            StoreError::Unavailable(String::new()),
            StoreError::Rejected(String::new()),
            StoreError::Config(String::new()),
            StoreError::Closed,
            StoreError::Stale,
            StoreError::ClaimLost(String::new()),
            StoreError::Moved,
            StoreError::Record {
                index: 0,
                column: String::new(),
                error: String::new(),
            },
        ];
        for error in errors {
            assert!(
                COMMIT_ERROR_KINDS.contains(&error.commit_error_kind()),
                "{error:?} is labelled {:?}, not in COMMIT_ERROR_KINDS",
                error.commit_error_kind()
            );
        }
    }
}
