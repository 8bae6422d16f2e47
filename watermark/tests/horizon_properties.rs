//! Property tests of the horizon itself (proptest), fed by a simulated tracking stream rather
//! than by an oracle: messages published every 100 ms and the reader's probes every 500 ms,
//! each delivered within 300 ms, except during an outage, when nothing is delivered and what
//! was published meanwhile (probes too) comes back in random order within 2 s after it ends,
//! mixed with what is published after it, but never after a message published 2 s or more
//! after it. That is the horizon's stated assumption: a stream that delivers a message
//! published at `p` has delivered everything published before `p − 2 s`, live or handing back
//! a backlog (see docs/watermarks.md, known limits). The reader's clock is off Pub/Sub's by up to ±30 s. At every tick the horizon must be at
//! most the publish time of every message published and not delivered yet, and at most
//! Pub/Sub's clock minus the 2 s allowance; after the outage it must catch up again.
//!
//! A horizon that trusted the clock (now − 2 s) fails this at once. (Counting a probe before
//! the earlier ones came back does not, in a world that keeps the assumption; the unit tests
//! in `src/horizon.rs` catch that.)
#![allow(clippy::unwrap_used, missing_docs)]

use proptest::prelude::*;
use sluice_watermark::DeliveryHorizon;

const QUIET_MS: i64 = 2_000;
const END_MS: i64 = 120_000;

#[derive(Debug, Clone, Copy)]
struct Sent {
    publish: i64,
    delivered_at: i64,
    probe: bool,
}

fn world(
    outage_start: i64,
    outage_ms: i64,
    latencies: &[i64],
    backlog_delays: &[i64],
) -> Vec<Sent> {
    let outage_end = outage_start + outage_ms;
    let mut sent: Vec<Sent> = Vec::new();
    for (i, publish) in (0..END_MS).step_by(100).enumerate() {
        let latency = latencies[i % latencies.len()];
        let mut delivered_at = publish + latency;
        if delivered_at >= outage_start && delivered_at < outage_end {
            delivered_at = outage_end + backlog_delays[i % backlog_delays.len()];
        }
        sent.push(Sent {
            publish,
            delivered_at,
            probe: publish % 500 == 0,
        });
    }
    // The stated assumption, enforced on the world: nothing arrives after a message published
    // more than the allowance after it (a stream hands a backlog back before it goes on).
    // Messages are 100 ms apart: those published `QUIET_MS` or more before message `i` are
    // `0..=i - QUIET_MS / 100`, and `i` arrives after all of them.
    let mut latest_arrival = Vec::with_capacity(sent.len());
    let mut latest = i64::MIN;
    for s in &sent {
        latest = latest.max(s.delivered_at);
        latest_arrival.push(latest);
    }
    let behind = (QUIET_MS / 100) as usize;
    for i in behind..sent.len() {
        sent[i].delivered_at = sent[i].delivered_at.max(latest_arrival[i - behind]);
    }
    sent
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn never_past_an_undelivered_message_and_catches_up(
        skew in -30_000i64..30_000,
        outage_start in 5_000i64..40_000,
        outage_ms in 0i64..60_000,
        latencies in prop::collection::vec(0i64..300, 1..50),
        backlog_delays in prop::collection::vec(0i64..2_000, 1..50),
    ) {
        let sent = world(outage_start, outage_ms, &latencies, &backlog_delays);
        let mut horizon = DeliveryHorizon::new(QUIET_MS);
        let mut delivered = vec![false; sent.len()];
        let mut last = None;
        for now in (0..END_MS).step_by(500) {
            // Delivered since the last tick, in delivery order.
            let mut due: Vec<usize> = (0..sent.len())
                .filter(|i| !delivered[*i] && sent[*i].delivered_at <= now)
                .collect();
            due.sort_by_key(|i| sent[*i].delivered_at);
            // The reader sends each probe as it publishes it.
            horizon.probe_sent((now / 500) as u64, now + skew);
            for i in due {
                delivered[i] = true;
                let s = sent[i];
                if s.probe {
                    horizon.probe_delivered((s.publish / 500) as u64, s.publish, now + skew);
                } else {
                    horizon.delivered(s.publish, now + skew);
                }
            }
            let h = horizon.horizon(now + skew);
            if let Some(h) = h {
                let undelivered = sent
                    .iter()
                    .zip(&delivered)
                    .filter(|(s, d)| !**d && s.publish <= now)
                    .map(|(s, _)| s.publish)
                    .min();
                prop_assert!(h <= now - QUIET_MS, "at {now}: horizon {h} ahead of the clock");
                prop_assert!(
                    undelivered.is_none_or(|u| h <= u),
                    "at {now}: horizon {h} passes {undelivered:?}, not delivered yet"
                );
            }
            last = h;
        }
        // Caught up at the end: within the allowance, a probe interval and a latency.
        let end = END_MS - 500;
        prop_assert!(last.is_some_and(|h| h >= end - QUIET_MS - 1_000), "{last:?} at {end}");
    }
}
