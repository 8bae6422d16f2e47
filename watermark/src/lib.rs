//! Event-time watermarks for Pub/Sub flows, estimated through a tracking subscription, and
//! provably never ahead of the data.
//!
//! # The setting
//!
//! A flow reads a *base* subscription. A second, *tracking* subscription on the same topic is
//! read by one reader that acks as soon as it has recorded, per publish-time bucket, the
//! smallest event time and the count of what it saw ([`TrackingHistogram`]). How far processing
//! has got ([`BaseProgress`]) comes from the workers: in sluice's worker, from their per-bucket
//! processed counts compared with the tracked counts (the first bucket not fully processed). The estimator ([`SluiceEstimator`]) is
//! a pure function of these, the band and the clock, plus the last watermark it gave (it never
//! goes back). This is Dataflow's design for Pub/Sub watermarks (Google Cloud's Dataflow
//! documentation, "Stream messages from Pub/Sub by using Dataflow"); the baseline to beat is
//! the open-source Beam reader, the minimum event time seen in the last minute ([`BeamStyleEstimator`]).
//!
//! # The guarantee
//!
//! Assume (a) every message's event time is at least its publish time minus the band `B`
//! (a message outside the band is late by definition, and counted as such: nothing holds the
//! horizon for it, though its bucket's minimum holds the watermark while it is unprocessed);
//! (b) the tracking
//! reader has seen every message published before its horizon `H`
//! ([`TrackingHistogram::advance_horizon`]; [`DeliveryHorizon`] derives `H` from probes the
//! reader publishes and sees come back, on Pub/Sub's clock, under its stated assumption that
//! a live stream delivers within 2 s; the reader's own clock plays no part; a backlog the
//! stream holds back behind fresh deliveries is waited for through the probes stored in it,
//! a probe whose publish outcome is unknown counting as stored); (c) every
//! message published before
//! `unprocessed_from` ([`BaseProgress`]) has been processed. Then the watermark
//!
//! ```text
//! W = max(W_previous, min( min event time of the tracked buckets from unprocessed_from on,
//!                          H − B ))
//! ```
//!
//! is at most the event time of every message not yet processed: such a message was published
//! at `p ≥ unprocessed_from`; if the tracking reader saw it (as it did if `p < H`), its bucket's
//! minimum is at most its event time; if not, `p ≥ H` and its event time is at least
//! `p − B ≥ H − B`. (Buckets past the horizon count too: what was seen there is a bound all the
//! same, and it is what holds the watermark for a backlog whose event times lie far outside
//! the band, which assumption (a) alone would not cover.) Taking the
//! maximum with the previous watermark keeps it monotonic without breaking the bound, because
//! the set of unprocessed messages only loses members older than `unprocessed_from` and gains
//! messages published after the horizon, both of which the previous bound already covered
//! (the horizon and `unprocessed_from` never move back). When nothing is unprocessed and the
//! tracking reader is caught up with the clock, `W = H − B ≈ now − B`: an idle flow's watermark
//! trails the clock by the band (plus the 2 s allowance and the probe interval). While the
//! tracking reader lags, or its probes stop coming back, `H` stalls and the watermark holds.
//! Assumption (c) holds in sluice's worker because a message is acked only once its settled
//! report is stored; a bucket that stays unprocessed is waited for, not released. The property
//! tests check all of this on random streams: `tests/properties.rs` the estimator,
//! `tests/horizon_properties.rs` the horizon under outages and clock skew,
//! `tests/held_back_backlog.rs` the horizon when a silence's backlog is held back behind fresh
//! deliveries while the probe publisher fails (refusals and unknown outcomes).

mod baseline;
mod estimator;
mod histogram;
mod horizon;

pub use baseline::{BEAM_BUCKET_MS, BEAM_IDLE_MS, BEAM_WINDOW_MS, BeamStyleEstimator};
pub use estimator::{BaseProgress, Estimate, SluiceEstimator, WatermarkEstimator};
pub use histogram::{BucketStats, TrackingHistogram};
pub use horizon::{DEFAULT_QUIET_MS, DeliveryHorizon, PROBE_GIVE_UP_MS, PublishFailure};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;
