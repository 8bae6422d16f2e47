//! Property tests of the horizon (proptest) in a world that breaks its live-stream assumption
//! the way the emulator does after a silence, while the probe publisher fails too.
//!
//! Messages are published every 100 ms and the reader's probes every 500 ms, each delivered
//! within 300 ms, except around a silence of 2 to 60 s: what would have been delivered during
//! it, and what is published during it (probes too), is *held back* and handed back, in random
//! order within 2 s, up to 60 s after the silence ended, while what is published after the
//! silence is delivered live at once (ahead of the held-back backlog, as the emulator does with
//! a stream that went silent). The reader's clock is off Pub/Sub's by up to ±30 s.
//!
//! During the silence the probe publisher fails too (a brownout): each probe published in it
//! is published, refused (Pub/Sub answered that it did not take it: it is never delivered),
//! or answered with an error whose outcome is unknown (a deadline, a connection lost after
//! sending), in which case Pub/Sub may have stored it (it is held back with the rest) or not
//! (it never comes). The reader learns each outcome a few ticks after sending.
//!
//! At every tick the horizon must be at most the publish time of every message published and
//! not delivered yet; at the end (five minutes after the silence, so probes that never came
//! are given up) it must have caught up.
//!
//! What the world keeps: at least one probe of the silence is not refused. A silence in which
//! every probe publish was refused holds no probe back, and nothing can be waited for (see the
//! horizon's docs).
#![allow(clippy::unwrap_used, missing_docs)]

use proptest::prelude::*;
use sluice_watermark::{DeliveryHorizon, PublishFailure};

const QUIET_MS: i64 = 2_000;
/// Long enough after the latest silence (ends by 100 s) for a probe that never comes (sent in
/// it) to be given up, and for the horizon to catch up.
const END_MS: i64 = 420_000;
const TICK_MS: i64 = 500;

/// What became of a probe's publish, and what the reader was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Stored, and the reader was told so.
    Published,
    /// Not stored; Pub/Sub answered that it did not take it.
    Refused,
    /// Stored; the reader was told an error whose outcome it cannot know.
    UnknownStored,
    /// Not stored; the reader was told an error whose outcome it cannot know.
    UnknownLost,
}

impl Outcome {
    fn stored(self) -> bool {
        matches!(self, Outcome::Published | Outcome::UnknownStored)
    }
}

#[derive(Debug, Clone, Copy)]
struct Sent {
    publish: i64,
    /// `None`: never delivered (not stored).
    delivered_at: Option<i64>,
    /// The probe's sequence number, and its outcome.
    probe: Option<(u64, Outcome)>,
}

struct Silence {
    start: i64,
    end: i64,
    /// How long after its end the held-back backlog starts coming back.
    held_ms: i64,
}

fn world(
    silence: &Silence,
    latencies: &[i64],
    backlog_delays: &[i64],
    outcomes: &[Outcome],
) -> Vec<Sent> {
    let mut sent = Vec::new();
    let mut in_silence = 0usize;
    for (i, publish) in (0..END_MS).step_by(100).enumerate() {
        let live = publish + latencies[i % latencies.len()];
        let held = live >= silence.start && publish < silence.end;
        let probe = (publish % TICK_MS == 0).then(|| {
            let seq = (publish / TICK_MS) as u64;
            if publish >= silence.start && publish < silence.end {
                in_silence += 1;
                (seq, outcomes[(in_silence - 1) % outcomes.len()])
            } else {
                (seq, Outcome::Published)
            }
        });
        let delivered_at = if probe.is_some_and(|(_, o)| !o.stored()) {
            None
        } else if held {
            Some(silence.end + silence.held_ms + backlog_delays[i % backlog_delays.len()])
        } else {
            Some(live)
        };
        sent.push(Sent {
            publish,
            delivered_at,
            probe,
        });
    }
    sent
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Published),
        Just(Outcome::Refused),
        Just(Outcome::UnknownStored),
        Just(Outcome::UnknownLost),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn a_held_back_backlog_is_waited_for_whatever_the_probe_publisher_says(
        skew in -30_000i64..30_000,
        start in 5_000i64..40_000,
        silence_ms in 2_000i64..60_000,
        held_ms in 0i64..60_000,
        latencies in prop::collection::vec(0i64..300, 1..50),
        backlog_delays in prop::collection::vec(0i64..QUIET_MS, 1..50),
        outcomes in prop::collection::vec(outcome(), 1..20),
        told_after in prop::collection::vec(1i64..4, 1..20),
    ) {
        let silence = Silence { start, end: start + silence_ms, held_ms };
        let sent = world(&silence, &latencies, &backlog_delays, &outcomes);
        prop_assume!(sent.iter().any(|s| s.publish >= silence.start
            && s.publish < silence.end
            && s.probe.is_some_and(|(_, o)| o != Outcome::Refused)));
        let mut by_delivery: Vec<usize> =
            (0..sent.len()).filter(|i| sent[*i].delivered_at.is_some()).collect();
        by_delivery.sort_by_key(|i| sent[*i].delivered_at);
        let mut next_delivery = 0;
        let mut delivered = vec![false; sent.len()];
        // Outcomes the reader is told of: (tick, sequence number, outcome).
        let mut told: Vec<(i64, u64, Outcome)> = Vec::new();
        let mut first_undelivered = 0;
        let mut horizon = DeliveryHorizon::new(QUIET_MS);
        let mut last = None;
        for now in (0..END_MS).step_by(TICK_MS as usize) {
            told.retain(|(at, seq, outcome)| {
                if *at > now {
                    return true;
                }
                match outcome {
                    Outcome::Published => {}
                    Outcome::Refused => horizon.probe_failed(*seq, PublishFailure::Refused),
                    Outcome::UnknownStored | Outcome::UnknownLost => {
                        horizon.probe_failed(*seq, PublishFailure::OutcomeUnknown)
                    }
                }
                false
            });
            let seq = (now / TICK_MS) as u64;
            horizon.probe_sent(seq, now + skew);
            let (_, outcome) = sent[(now / 100) as usize].probe.unwrap();
            told.push((now + TICK_MS * told_after[seq as usize % told_after.len()], seq, outcome));
            while next_delivery < by_delivery.len()
                && sent[by_delivery[next_delivery]].delivered_at.unwrap() <= now
            {
                let i = by_delivery[next_delivery];
                next_delivery += 1;
                delivered[i] = true;
                match sent[i].probe {
                    Some((seq, _)) => horizon.probe_delivered(seq, sent[i].publish, now + skew),
                    None => horizon.delivered(sent[i].publish, now + skew),
                }
            }
            while first_undelivered < sent.len()
                && (delivered[first_undelivered] || sent[first_undelivered].delivered_at.is_none())
            {
                first_undelivered += 1;
            }
            let h = horizon.horizon(now + skew);
            if let Some(h) = h {
                let undelivered = sent
                    .get(first_undelivered)
                    .map(|s| s.publish)
                    .filter(|p| *p <= now);
                prop_assert!(h <= now - QUIET_MS, "at {now}: horizon {h} ahead of the clock");
                prop_assert!(
                    undelivered.is_none_or(|u| h <= u),
                    "at {now}: horizon {h} passes {undelivered:?}, not delivered yet (silence \
                     {}..{}, held back {} ms more)",
                    silence.start, silence.end, silence.held_ms
                );
            }
            last = h;
        }
        let end = END_MS - TICK_MS;
        prop_assert!(last.is_some_and(|h| h >= end - QUIET_MS - 1_000), "{last:?} at {end}");
    }
}
