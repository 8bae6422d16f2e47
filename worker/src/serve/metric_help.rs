//! The `# HELP` line and unit of every metric sluice exports (their meanings are SPEC §8's and
//! README's), described once when the recorder is installed; `tests/tests/metrics_prometheus.rs`
//! checks that every `sluice_` family on `/metrics` has one.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// Describes every metric.
pub fn describe() {
    counters();
    gauges();
    describe_histogram!(
        "sluice_commit_duration_seconds",
        Unit::Seconds,
        "One store transaction of a flow: its rows, its ledger keys, its dead letters."
    );
    describe_histogram!(
        "sluice_ack_latency_seconds",
        Unit::Seconds,
        "From a message's receipt to its ack."
    );
}

fn counters() {
    for (name, help) in [
        (
            "sluice_messages_received_total",
            "Messages a flow received, redeliveries included.",
        ),
        (
            "sluice_messages_duplicate_total",
            "Messages dropped as duplicates, by the layer that caught them (memory or store).",
        ),
        (
            "sluice_messages_committed_total",
            "Effects committed to a flow's target.",
        ),
        (
            "sluice_messages_acked_total",
            "Acks sent, each after the commit that recorded its message.",
        ),
        (
            "sluice_messages_nacked_total",
            "Deliveries given back uncommitted (a drain, a stop, past the commit bound).",
        ),
        (
            "sluice_messages_stale_total",
            "Deliveries given back because they were held past the commit bound.",
        ),
        (
            "sluice_messages_dead_lettered_total",
            "Messages committed to the dead-letter table, by reason.",
        ),
        (
            "sluice_messages_late_total",
            "Rows committed with an event time below the flow's watermark.",
        ),
        (
            "sluice_records_filtered_total",
            "Records a typed flow's where: left out (acked, no row).",
        ),
        (
            "sluice_messages_deferred_total",
            "Pub/Sub messages a run with a data interval left for a later run (published at or \
             after the interval's end).",
        ),
        (
            "sluice_dedup_key_missing_total",
            "Messages without the flow's dedup attribute (keyed by their message id, or dead \
             letters with on_missing: dead_letter).",
        ),
        (
            "sluice_expectation_records_total",
            "A typed flow's records per expectation, passed or violated.",
        ),
        (
            "sluice_commit_errors_total",
            "Commits that failed, by kind (unavailable, rejected, stage, config, ...).",
        ),
        (
            "sluice_source_records_read_total",
            "Records a bounded source (a file backfill) read, skipped ones included.",
        ),
        (
            "sluice_ack_failures_total",
            "Acks an exactly-once subscription did not confirm, by reason.",
        ),
        (
            "sluice_acks_withheld_total",
            "Acks withheld because the pool no longer wanted this worker's (its update moved on).",
        ),
        (
            "sluice_probes_dropped_total",
            "Watermark probe messages a data flow dropped (they are not data).",
        ),
        (
            "sluice_watermark_probe_failures_total",
            "Watermark probes that could not be published, by outcome.",
        ),
        (
            "sluice_dead_letters_published_total",
            "Dead letters published to the pipeline's dead-letter topic.",
        ),
        (
            "sluice_dead_letters_republished_total",
            "Dead letters published to the topic again (a publish whose outcome was unknown).",
        ),
        (
            "sluice_dead_letter_publish_refused_total",
            "Dead letters the topic refused for good (kept in the outbox, marked with the answer).",
        ),
        (
            "sluice_control_rejected_total",
            "Control API calls refused (no or a wrong token, not allowed).",
        ),
        (
            "sluice_runs_total",
            "Runs of a triggered pipeline, by how they ended.",
        ),
        (
            "sluice_schedule_fires_delayed_total",
            "Schedule fires that came while a run was still going (run after it).",
        ),
    ] {
        describe_counter!(name, Unit::Count, help);
    }
}

fn gauges() {
    for (name, unit, help) in [
        (
            "sluice_inflight_messages",
            Unit::Count,
            "Messages received and not yet acked.",
        ),
        (
            "sluice_oldest_unacked_message_age_seconds",
            Unit::Seconds,
            "The age of the oldest message not yet settled (system lag).",
        ),
        (
            "sluice_watermark_timestamp_seconds",
            Unit::Seconds,
            "The flow's event-time watermark, seconds since the epoch.",
        ),
        (
            "sluice_data_watermark_age_seconds",
            Unit::Seconds,
            "Now minus the flow's watermark.",
        ),
        (
            "sluice_watermark_stalled_seconds",
            Unit::Seconds,
            "How long the watermark has been held back by one bucket.",
        ),
        (
            "sluice_watermark_probes_outstanding",
            Unit::Count,
            "Watermark probes published and not yet seen back.",
        ),
        (
            "sluice_tracking_clock_offset_seconds",
            Unit::Seconds,
            "The tracking subscription's publish clock against this worker's.",
        ),
        (
            "sluice_dedup_cache_entries",
            Unit::Count,
            "Dedup keys held in memory.",
        ),
        (
            "sluice_feed_rows_behind",
            Unit::Count,
            "Committed rows of the table a flow reads that it has not committed yet.",
        ),
        (
            "sluice_feed_lag_seconds",
            Unit::Seconds,
            "The age of the oldest row of the table a flow reads that it has not committed.",
        ),
        (
            "sluice_flow_state",
            Unit::Count,
            "1 for the flow's current state.",
        ),
        (
            "sluice_schedule_next_fire_timestamp_seconds",
            Unit::Seconds,
            "The schedule's next fire, seconds since the epoch.",
        ),
        (
            "sluice_schedule_disagreement",
            Unit::Count,
            "1 while live replicas of the pipeline run different schedules (no fire runs).",
        ),
        (
            "sluice_ready",
            Unit::Count,
            "1 when the worker is ready (its flows started), else 0.",
        ),
        (
            "sluice_build_info",
            Unit::Count,
            "1, labelled with the version.",
        ),
    ] {
        describe_gauge!(name, unit, help);
    }
}
