//! What the tracking subscription tells: per publish-time bucket, the smallest event time and
//! how many messages, plus the horizon before which it has seen everything.

use crate::Millis;
use std::collections::BTreeMap;

/// One bucket of the tracking histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketStats {
    /// Smallest event time of the bucket's messages.
    pub min_event_ms: Millis,
    /// Messages seen in the bucket.
    pub count: u64,
}

/// A sparse histogram over publish-time buckets (only buckets with messages take memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackingHistogram {
    bucket_ms: Millis,
    buckets: BTreeMap<Millis, BucketStats>,
    horizon_ms: Option<Millis>,
}

impl TrackingHistogram {
    /// An empty histogram with buckets of `bucket_ms` (at least 1).
    pub fn new(bucket_ms: Millis) -> Self {
        Self {
            bucket_ms: bucket_ms.max(1),
            buckets: BTreeMap::new(),
            horizon_ms: None,
        }
    }

    /// The start of the bucket holding `publish_ms`.
    pub fn bucket_of(&self, publish_ms: Millis) -> Millis {
        publish_ms.div_euclid(self.bucket_ms) * self.bucket_ms
    }

    /// Records one message read from the tracking subscription.
    pub fn observe(&mut self, publish_ms: Millis, event_ms: Millis) {
        self.add_bucket(publish_ms, event_ms, 1);
    }

    /// Adds a bucket's totals as a store keeps them (`count` messages, the smallest event time
    /// `min_event_ms`) to the bucket holding `bucket_ms`.
    pub fn add_bucket(&mut self, bucket_ms: Millis, min_event_ms: Millis, count: u64) {
        let bucket = self.bucket_of(bucket_ms);
        self.buckets
            .entry(bucket)
            .and_modify(|b| {
                b.min_event_ms = b.min_event_ms.min(min_event_ms);
                b.count += count;
            })
            .or_insert(BucketStats {
                min_event_ms,
                count,
            });
    }

    /// Everything published before `horizon_ms` has been observed. The horizon never moves
    /// back: an earlier value is ignored.
    pub fn advance_horizon(&mut self, horizon_ms: Millis) {
        self.horizon_ms = Some(self.horizon_ms.map_or(horizon_ms, |h| h.max(horizon_ms)));
    }

    /// The horizon, once one was given.
    pub fn horizon(&self) -> Option<Millis> {
        self.horizon_ms
    }

    /// The smallest event time of the buckets that may hold messages published at or after
    /// `from_ms` (its own bucket included), those past the horizon too; `None` when there are
    /// none.
    pub fn min_event_from(&self, from_ms: Millis) -> Option<Millis> {
        self.buckets
            .range(self.bucket_of(from_ms)..)
            .map(|(_, b)| b.min_event_ms)
            .min()
    }

    /// Forgets buckets that end at or before `publish_ms` (everything in them is processed).
    pub fn prune_before(&mut self, publish_ms: Millis) {
        let keep = self.bucket_of(publish_ms);
        self.buckets = self.buckets.split_off(&keep);
    }

    /// Buckets held.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The buckets, by start.
    pub fn buckets(&self) -> impl Iterator<Item = (Millis, BucketStats)> + '_ {
        self.buckets.iter().map(|(k, v)| (*k, *v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_minimum_and_count() {
        let mut h = TrackingHistogram::new(1_000);
        h.observe(1_500, 900);
        h.observe(1_999, 1_200);
        h.observe(3_000, 2_000);
        h.observe(-1, -5);
        assert_eq!(h.len(), 3);
        assert_eq!(h.horizon(), None, "no horizon yet");
        h.advance_horizon(3_000);
        h.advance_horizon(2_000);
        assert_eq!(h.horizon(), Some(3_000), "the horizon never moves back");
        assert_eq!(
            h.min_event_from(1_700),
            Some(900),
            "the whole bucket counts"
        );
        assert_eq!(h.min_event_from(-10), Some(-5));
        assert_eq!(
            h.min_event_from(2_000),
            Some(2_000),
            "bucket 3000, at the horizon, still bounds"
        );
        assert_eq!(h.min_event_from(4_000), None);
        h.prune_before(1_999);
        assert_eq!(
            h.buckets().map(|(k, _)| k).collect::<Vec<_>>(),
            [1_000, 3_000]
        );
        assert_eq!(
            h.buckets().next().map(|(_, b)| b),
            Some(BucketStats {
                min_event_ms: 900,
                count: 2
            })
        );
    }
}
