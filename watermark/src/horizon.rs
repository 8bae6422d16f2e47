//! The tracking reader's horizon: a time before which it has seen every message published.
//!
//! Pub/Sub tells no reader what it has not delivered yet, and the emulator has no backlog
//! metric, so the horizon rests on one stated assumption about a *live* stream: once a stream
//! has delivered a message, anything published more than [`DeliveryHorizon::quiet_ms`] ago
//! that it has not delivered would have been delivered by now. From that:
//!
//! * a stream that has not delivered anything since it opened proves nothing (the emulator
//!   holds a reopened subscription back for minutes): no horizon;
//! * a stream that delivered, within the last `quiet_ms`, a message published more than
//!   `quiet_ms` before its delivery is draining a backlog, and one that delivered a message
//!   whose event time is outside the band is carrying one (a replay, a backfill published
//!   now): no horizon either, for `quiet_ms` after the last late delivery, and for
//!   `out_of_band_hold_ms` after the last out-of-band one. Part of that backlog may not be
//!   delivered yet, and its event times are unknown (they can be far older than the band,
//!   which no bound from the clock covers), so the watermark holds until the reader has seen
//!   all of it;
//! * otherwise, while messages arrive, the horizon is the smallest publish time delivered
//!   within the last `quiet_ms`, and at most `now − quiet_ms`;
//! * when nothing arrived for `quiet_ms`, the reader is caught up: `now − quiet_ms`.
//!
//! The caller keeps the horizon monotonic ([`crate::TrackingHistogram::advance_horizon`]).

use crate::Millis;
use std::collections::VecDeque;

/// Default allowance for a live stream's delivery delay.
pub const DEFAULT_QUIET_MS: Millis = 2_000;

/// Derives the horizon from the deliveries of the tracking stream; pure, clock-injected.
#[derive(Debug, Clone)]
pub struct DeliveryHorizon {
    quiet_ms: Millis,
    out_of_band_hold_ms: Millis,
    proven: bool,
    /// (delivered at, publish time) of the last `quiet_ms` of deliveries.
    recent: VecDeque<(Millis, Millis)>,
    /// When the last delivery with an event time outside the band came.
    last_out_of_band: Option<Millis>,
}

impl DeliveryHorizon {
    /// A horizon for a stream whose live delivery delay stays under `quiet_ms`, held for
    /// `out_of_band_hold_ms` after a delivery with an event time outside the band.
    pub fn new(quiet_ms: Millis, out_of_band_hold_ms: Millis) -> Self {
        Self {
            quiet_ms: quiet_ms.max(1),
            out_of_band_hold_ms: out_of_band_hold_ms.max(quiet_ms),
            proven: false,
            recent: VecDeque::new(),
            last_out_of_band: None,
        }
    }

    /// The stream was (re)opened: it must deliver again before it proves anything.
    pub fn stream_opened(&mut self) {
        self.proven = false;
        self.recent.clear();
    }

    /// The stream delivered a message published at `publish_ms`, at `now_ms`; `in_band`:
    /// its event time is within the band of its publish time (or it has none).
    pub fn delivered(&mut self, publish_ms: Millis, now_ms: Millis, in_band: bool) {
        self.proven = true;
        self.recent.push_back((now_ms, publish_ms));
        if !in_band {
            self.last_out_of_band = Some(now_ms);
        }
    }

    /// The horizon at `now_ms`; `None` while the stream has proven nothing.
    pub fn horizon(&mut self, now_ms: Millis) -> Option<Millis> {
        if !self.proven {
            return None;
        }
        let since = now_ms.saturating_sub(self.quiet_ms);
        while self.recent.front().is_some_and(|(at, _)| *at < since) {
            self.recent.pop_front();
        }
        let draining = self
            .recent
            .iter()
            .any(|(at, publish)| at.saturating_sub(*publish) > self.quiet_ms)
            || self
                .last_out_of_band
                .is_some_and(|at| at >= now_ms.saturating_sub(self.out_of_band_hold_ms));
        if draining {
            return None;
        }
        let oldest_recent = self.recent.iter().map(|(_, publish)| *publish).min();
        Some(oldest_recent.map_or(since, |oldest| oldest.min(since)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn nothing_before_a_delivery_nor_while_draining_then_caught_up() {
        let mut h = DeliveryHorizon::new(2_000, 10_000);
        assert_eq!(h.horizon(100_000), None, "a fresh stream proves nothing");
        // Draining a backlog published around 40 s: no horizon until it is through.
        h.delivered(40_000, 100_000, true);
        h.delivered(40_500, 100_500, true);
        assert_eq!(h.horizon(100_600), None);
        // Live messages only: the oldest recent one, at most now − quiet.
        h.delivered(101_900, 102_700, true);
        assert_eq!(h.horizon(102_800), Some(100_800));
        h.delivered(102_000, 103_000, true);
        assert_eq!(h.horizon(103_100), Some(101_100));
        // A fresh message with an event time outside the band: hold for 10 s.
        h.delivered(103_500, 103_600, false);
        assert_eq!(h.horizon(104_000), None);
        assert_eq!(h.horizon(113_500), None);
        assert_eq!(h.horizon(113_700), Some(111_700));
        // Quiet for 2 s: caught up.
        assert_eq!(h.horizon(120_000), Some(118_000));
        // Reopened: proves nothing until it delivers again.
        h.stream_opened();
        assert_eq!(h.horizon(121_000), None);
    }
}
