//! Property tests of the estimator (proptest): on random streams whose event times are shuffled
//! within the band, with a tracking reader and processing that lag and reorder at random, the
//! watermark never passes the event time of a message not yet processed (no message is late),
//! never decreases, and once all is processed and the clock idles it trails the clock by the
//! band.
//!
//! The world is simulated with an injected clock. The inputs follow the estimator's contract:
//! the tracking horizon is the earliest publish time the tracking reader has not yet seen, and
//! `unprocessed_from` is the earliest publish time not yet processed (both as a correct reader
//! and correct workers would report them).
#![allow(clippy::unwrap_used, missing_docs)]

use proptest::prelude::*;
use sluice_watermark::{BaseProgress, SluiceEstimator, TrackingHistogram, WatermarkEstimator};

const BAND_MS: i64 = 1_000;
const TICK_MS: i64 = 50;

#[derive(Debug, Clone)]
struct Message {
    publish: i64,
    event: i64,
    tracked_at: i64,
    processed_at: i64,
}

fn stream() -> impl Strategy<Value = Vec<Message>> {
    prop::collection::vec(
        (0i64..200, 0i64..=BAND_MS, 0i64..3_000, 0i64..5_000),
        1..150,
    )
    .prop_map(|steps| {
        let mut publish = 1_000_000;
        steps
            .into_iter()
            .map(|(gap, jitter, tracking_lag, processing_lag)| {
                publish += gap;
                Message {
                    publish,
                    event: publish - jitter,
                    tracked_at: publish + tracking_lag,
                    processed_at: publish + processing_lag,
                }
            })
            .collect()
    })
}

struct Run {
    /// (time, watermark) after each tick.
    history: Vec<(i64, Option<i64>)>,
    /// Messages processed below the watermark that held just before.
    late: usize,
    end: i64,
}

fn simulate(messages: &[Message], idle_after_ms: i64) -> Run {
    let mut tracking = TrackingHistogram::new(100);
    let mut estimator = SluiceEstimator::new(BAND_MS);
    let last_event = messages
        .iter()
        .map(|m| m.tracked_at.max(m.processed_at))
        .max()
        .unwrap();
    let end = last_event + idle_after_ms;
    let mut tracked = vec![false; messages.len()];
    let mut watermark: Option<i64> = None;
    let mut history = Vec::new();
    let mut late = 0;
    let mut now = messages[0].publish - TICK_MS;
    while now <= end {
        // Processing up to now, checked against the watermark of the previous tick.
        for m in messages
            .iter()
            .filter(|m| m.processed_at > now - TICK_MS && m.processed_at <= now)
        {
            if watermark.is_some_and(|w| m.event < w) {
                late += 1;
            }
        }
        for (i, m) in messages.iter().enumerate() {
            if !tracked[i] && m.tracked_at <= now {
                tracked[i] = true;
                tracking.observe(m.publish, m.event);
            }
        }
        // The horizon: everything published before it was seen (and it is not in the future).
        let unseen = messages
            .iter()
            .zip(&tracked)
            .filter(|(_, seen)| !**seen)
            .map(|(m, _)| m.publish)
            .min();
        tracking.advance_horizon(unseen.map_or(now, |p| p.min(now)));
        let unprocessed_from = messages
            .iter()
            .filter(|m| m.processed_at > now)
            .map(|m| m.publish)
            .min();
        let base = BaseProgress { unprocessed_from };
        watermark = estimator.watermark(&tracking, &base, now);
        history.push((now, watermark));
        now += TICK_MS;
    }
    Run { history, late, end }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_message_is_late(messages in stream()) {
        let run = simulate(&messages, 0);
        prop_assert_eq!(run.late, 0);
    }

    #[test]
    fn the_watermark_never_passes_an_unprocessed_message(messages in stream()) {
        let run = simulate(&messages, 0);
        for (now, watermark) in &run.history {
            let Some(w) = watermark else { continue };
            for m in messages.iter().filter(|m| m.processed_at > *now) {
                prop_assert!(m.event >= *w, "at {now}: {m:?} is behind the watermark {w}");
            }
        }
    }

    #[test]
    fn the_watermark_never_decreases(messages in stream()) {
        let run = simulate(&messages, 0);
        let values: Vec<i64> = run.history.iter().filter_map(|(_, w)| *w).collect();
        prop_assert!(values.windows(2).all(|w| w[0] <= w[1]), "{values:?}");
    }

    #[test]
    fn idle_it_trails_the_clock_by_the_band(messages in stream()) {
        let run = simulate(&messages, 2 * BAND_MS);
        let (now, watermark) = *run.history.last().unwrap();
        prop_assert_eq!(now, run.end - (run.end - now) % TICK_MS);
        prop_assert_eq!(watermark, Some(now - BAND_MS));
    }
}

/// The band is the contract: a message published later than the band after its event time is
/// late, and counted so (the estimator is not asked to wait for it).
#[test]
fn a_message_beyond_the_band_can_be_late() {
    let messages = vec![
        Message {
            publish: 1_000_000,
            event: 1_000_000,
            tracked_at: 1_000_000,
            processed_at: 1_000_000,
        },
        Message {
            publish: 1_010_000,
            event: 1_000_500 - BAND_MS * 5,
            tracked_at: 1_010_000,
            processed_at: 1_010_000,
        },
    ];
    assert_eq!(simulate(&messages, 0).late, 1);
}
