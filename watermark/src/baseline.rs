//! The baseline: a Beam-style estimator, as the open-source Pub/Sub reader does it: the
//! minimum event time of the messages processed in the last minute, kept in 5 s buckets, and a
//! jump to the clock after a minute without messages. It sees only what was processed, so it
//! cannot know about the backlog; it exists to be measured against (`sluice bench watermark`).

use crate::{BaseProgress, Millis, TrackingHistogram, WatermarkEstimator};
use std::collections::BTreeMap;

/// Width of a processing-time bucket.
pub const BEAM_BUCKET_MS: Millis = 5_000;
/// How far back processed messages count.
pub const BEAM_WINDOW_MS: Millis = 60_000;
/// After this long without a message, the watermark jumps to the clock.
pub const BEAM_IDLE_MS: Millis = 60_000;

/// The Beam-style baseline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BeamStyleEstimator {
    /// Processing-time bucket start → smallest event time processed in it.
    buckets: BTreeMap<Millis, Millis>,
    last_message_ms: Option<Millis>,
    last: Option<Millis>,
}

impl BeamStyleEstimator {
    /// A new baseline.
    pub fn new() -> Self {
        Self::default()
    }
}

impl WatermarkEstimator for BeamStyleEstimator {
    fn name(&self) -> &'static str {
        "beam-style"
    }

    fn processed(&mut self, _publish_ms: Millis, event_ms: Millis, now_ms: Millis) {
        let bucket = now_ms.div_euclid(BEAM_BUCKET_MS) * BEAM_BUCKET_MS;
        self.buckets
            .entry(bucket)
            .and_modify(|m| *m = (*m).min(event_ms))
            .or_insert(event_ms);
        self.last_message_ms = Some(now_ms);
    }

    fn watermark(
        &mut self,
        _: &TrackingHistogram,
        _: &BaseProgress,
        now_ms: Millis,
    ) -> Option<Millis> {
        let oldest = now_ms - BEAM_WINDOW_MS;
        self.buckets = self
            .buckets
            .split_off(&(oldest.div_euclid(BEAM_BUCKET_MS) * BEAM_BUCKET_MS));
        let idle = self
            .last_message_ms
            .is_none_or(|last| now_ms - last >= BEAM_IDLE_MS);
        let raw = if idle {
            self.last_message_ms.map(|_| now_ms)
        } else {
            self.buckets.values().copied().min()
        };
        let raw = raw?;
        let watermark = self.last.map_or(raw, |last| last.max(raw));
        self.last = Some(watermark);
        Some(watermark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimum_of_the_last_minute_then_the_clock_when_idle() {
        let (t, b) = (TrackingHistogram::new(1_000), BaseProgress::default());
        let mut beam = BeamStyleEstimator::new();
        assert_eq!(beam.watermark(&t, &b, 0), None);
        beam.processed(0, 1_000, 10_000);
        beam.processed(0, 500, 12_000);
        beam.processed(0, 9_000, 20_000);
        assert_eq!(beam.watermark(&t, &b, 20_000), Some(500));
        // The 10 s and 12 s buckets leave the window at 75 s; 500 is forgotten, 9 000 stays.
        assert_eq!(beam.watermark(&t, &b, 75_000), Some(9_000));
        // A minute without messages: the clock.
        assert_eq!(beam.watermark(&t, &b, 80_000), Some(80_000));
    }
}
