//! sluice's estimator (see the crate docs for the guarantee and its proof) and the trait both
//! estimators share, so the benchmark can run them on the same streams.

use crate::{Millis, TrackingHistogram};

/// How far the base subscription's processing has got, as the workers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BaseProgress {
    /// Every message published before this has been processed (committed, or found a
    /// duplicate, or dead-lettered). `None`: every message published before the tracking
    /// horizon has been.
    pub unprocessed_from: Option<Millis>,
}

/// An event-time watermark estimator, driven by a clock the caller injects.
pub trait WatermarkEstimator {
    /// A short name for reports.
    fn name(&self) -> &'static str;
    /// A message of the flow was processed at `now_ms` (the baseline learns from these).
    fn processed(&mut self, publish_ms: Millis, event_ms: Millis, now_ms: Millis);
    /// The watermark at `now_ms` (`None` until there is one). Never decreases.
    fn watermark(
        &mut self,
        tracking: &TrackingHistogram,
        base: &BaseProgress,
        now_ms: Millis,
    ) -> Option<Millis>;
}

/// What one estimation gave, with why (for `sluice status` and the logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// The watermark.
    pub watermark_ms: Millis,
    /// The bound from the unprocessed messages the tracking subscription saw (those published
    /// past the horizon too), if any.
    pub from_backlog_ms: Option<Millis>,
    /// The bound from what the tracking subscription has not seen yet: horizon − band.
    pub from_horizon_ms: Millis,
}

/// sluice's estimator: the smallest event time still ahead of processing, within the band.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SluiceEstimator {
    band_ms: Millis,
    last: Option<Millis>,
}

impl SluiceEstimator {
    /// An estimator for a flow whose event times are at least publish time − `band_ms`.
    pub fn new(band_ms: Millis) -> Self {
        Self {
            band_ms: band_ms.max(0),
            last: None,
        }
    }

    /// The estimate, with its parts; `None` until the tracking reader gave a horizon.
    pub fn estimate(
        &mut self,
        tracking: &TrackingHistogram,
        base: &BaseProgress,
    ) -> Option<Estimate> {
        let horizon = tracking.horizon()?;
        let from_horizon_ms = horizon.saturating_sub(self.band_ms);
        let from_backlog_ms = base
            .unprocessed_from
            .and_then(|from| tracking.min_event_from(from));
        let raw = from_backlog_ms.map_or(from_horizon_ms, |b| b.min(from_horizon_ms));
        let watermark_ms = self.last.map_or(raw, |last| last.max(raw));
        self.last = Some(watermark_ms);
        Some(Estimate {
            watermark_ms,
            from_backlog_ms,
            from_horizon_ms,
        })
    }
}

impl WatermarkEstimator for SluiceEstimator {
    fn name(&self) -> &'static str {
        "sluice"
    }

    fn processed(&mut self, _: Millis, _: Millis, _: Millis) {}

    fn watermark(
        &mut self,
        tracking: &TrackingHistogram,
        base: &BaseProgress,
        _now_ms: Millis,
    ) -> Option<Millis> {
        self.estimate(tracking, base).map(|e| e.watermark_ms)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn holds_at_the_oldest_unprocessed_then_trails_the_horizon() {
        let mut tracking = TrackingHistogram::new(1_000);
        let mut sluice = SluiceEstimator::new(10_000);
        let base = BaseProgress {
            unprocessed_from: Some(100_000),
        };
        assert_eq!(sluice.estimate(&tracking, &base), None, "no horizon yet");
        tracking.observe(100_500, 95_000);
        tracking.observe(101_000, 99_000);
        tracking.advance_horizon(120_000);
        let e = sluice.estimate(&tracking, &base).unwrap();
        assert_eq!(e.from_backlog_ms, Some(95_000));
        assert_eq!(e.from_horizon_ms, 110_000);
        assert_eq!(e.watermark_ms, 95_000);
        // All processed: the watermark trails the horizon by the band.
        let done = BaseProgress::default();
        assert_eq!(sluice.watermark(&tracking, &done, 0), Some(110_000));
        // It never goes back, even if asked with less.
        let back = BaseProgress {
            unprocessed_from: Some(0),
        };
        assert_eq!(sluice.watermark(&tracking, &back, 0), Some(110_000));
    }
}
