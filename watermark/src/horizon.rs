//! The tracking reader's horizon: a time, on Pub/Sub's clock, before which it has seen every
//! message published.
//!
//! Pub/Sub tells no reader what it has not delivered yet, and the emulator has no backlog
//! metric, so the horizon rests on one stated assumption about a *live* stream: a stream that
//! delivers a message published at `p` has delivered everything published before
//! `p − quiet_ms` (a live stream's delivery delay stays under [`DeliveryHorizon::quiet_ms`]).
//! Liveness needs positive evidence, and the reader makes it: it publishes a *probe* to the
//! topic every tick, and only a probe delivered back through the tracking stream moves the
//! horizon. From that:
//!
//! * until a probe comes back, the stream proves nothing (the emulator holds a reopened
//!   subscription back for minutes): no horizon. A horizon serves one stream: the reader makes
//!   a new one when it opens the stream again;
//! * while messages are delivered more than `quiet_ms` after their publish time, the stream is
//!   draining a backlog: no horizon for `quiet_ms` after the last such delivery (part of the
//!   backlog may not be delivered yet, and its event times are unknown). The delay is measured
//!   on Pub/Sub's clock: receipt minus the smallest receipt − publish offset of the last 20
//!   probes (deliveries before the first probe are judged when it comes);
//! * otherwise the horizon is the publish time of the newest probe delivered, minus
//!   `quiet_ms`, and no later than the oldest publish time delivered in the last `quiet_ms`;
//!   a probe counts only once every probe the reader sent before it came back too (or Pub/Sub
//!   refused its publish), so fresh probes delivered ahead of a backlog the stream hands back
//!   after a silence do not carry the horizon past it. A probe whose publish failed with an
//!   unknown outcome (a deadline, a connection lost after sending: [`PublishFailure`]) may be
//!   stored and held back with that backlog, so it is waited for like any other, until it
//!   comes back or is given up ([`PROBE_GIVE_UP_MS`]).
//!
//! What the probes cannot cover: a backlog held back with no probe in it. A silence during
//! which every probe's publish was refused (so none is stored), or one shorter than the probe
//! interval, leaves nothing to wait for, and a fresh probe delivered ahead of its backlog
//! moves the horizon (the live-stream assumption is all that covers it). So does a backlog
//! held back longer than [`PROBE_GIVE_UP_MS`].
//!
//! Every time the horizon is compared with is a publish time, stamped by Pub/Sub: the reader's
//! own clock only measures how long ago (by its own ticks) a delivery came. A reader whose clock
//! is off Pub/Sub's is therefore not ahead, however far off; [`DeliveryHorizon::clock_offset`]
//! reports the difference (receipt − publish time of the newest probe, latency included) for
//! alerting. A tracking stream that goes silent (an outage, a stream the client reopens without
//! a word) stops delivering probes too, and the horizon holds where the last probe left it.
//!
//! The caller keeps the horizon monotonic ([`crate::TrackingHistogram::advance_horizon`]).

use crate::Millis;
use std::collections::{BTreeMap, VecDeque};

/// Default allowance for a live stream's delivery delay.
pub const DEFAULT_QUIET_MS: Millis = 2_000;
/// A probe not back after this long is given up (counted in
/// [`DeliveryHorizon::probes_given_up`]): the horizon waits for an outage or a backlog this
/// long at most on a probe's account, and no longer for one that will never come (read by
/// another reader, dropped by a filter).
pub const PROBE_GIVE_UP_MS: Millis = 300_000;

/// How a probe's publish failed ([`DeliveryHorizon::probe_failed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishFailure {
    /// Pub/Sub answered that it did not take the probe, or it was never sent: it is surely
    /// not stored, and nothing waits for it.
    Refused,
    /// The outcome is unknown (a deadline, a connection lost after sending): Pub/Sub may have
    /// stored the probe, so it is waited for like one that was published.
    OutcomeUnknown,
}

/// Derives the horizon from the deliveries of the tracking stream; pure, clock-injected.
#[derive(Debug, Clone)]
pub struct DeliveryHorizon {
    quiet_ms: Millis,
    /// The newest probe delivered since the stream opened: (receipt on the reader's clock,
    /// publish time).
    newest_probe: Option<(Millis, Millis)>,
    /// The latest publish time among probes delivered with every probe sent before them
    /// delivered (or lost) too: the horizon's reference.
    contiguous_publish: Option<Millis>,
    /// Probes sent and neither delivered nor known lost: sequence number → when sent.
    outstanding: BTreeMap<u64, Millis>,
    /// Probes given up after [`PROBE_GIVE_UP_MS`] without coming back.
    given_up: u64,
    /// Probes delivered while an earlier one is outstanding: sequence number → publish time.
    delivered_ahead: BTreeMap<u64, Millis>,
    /// (receipt, publish time) of the deliveries of the last `quiet_ms`, probes included.
    recent: VecDeque<(Millis, Millis)>,
    /// When the last delivery that showed a backlog came (reader's clock).
    last_backlog: Option<Millis>,
    /// (receipt, receipt − publish time) of the last [`OFFSET_MEMORY`] probes.
    probes: VecDeque<(Millis, Millis)>,
}

/// How many of the last probes count toward the clock offset a delivery's lag is measured
/// with (by count, not time: after a silence, those from before it still count).
const OFFSET_MEMORY: usize = 20;

impl DeliveryHorizon {
    /// A horizon for a stream whose live delivery delay stays under `quiet_ms`.
    pub fn new(quiet_ms: Millis) -> Self {
        Self {
            quiet_ms: quiet_ms.max(1),
            newest_probe: None,
            contiguous_publish: None,
            outstanding: BTreeMap::new(),
            given_up: 0,
            delivered_ahead: BTreeMap::new(),
            recent: VecDeque::new(),
            last_backlog: None,
            probes: VecDeque::new(),
        }
    }

    /// The stream delivered a message published at `publish_ms`, at `now_ms` (reader's clock).
    pub fn delivered(&mut self, publish_ms: Millis, now_ms: Millis) {
        self.note(publish_ms, now_ms);
    }

    /// The reader published probe `seq` at `now_ms` (or is about to): the horizon will not
    /// pass it before it comes back, is known lost, or is given up ([`PROBE_GIVE_UP_MS`]).
    pub fn probe_sent(&mut self, seq: u64, now_ms: Millis) {
        self.outstanding.insert(seq, now_ms);
    }

    /// How many probes were given up so far for not coming back within [`PROBE_GIVE_UP_MS`]
    /// (another reader took them, or a filter drops them).
    pub fn probes_given_up(&self) -> u64 {
        self.given_up
    }

    /// The publish of probe `seq` failed. A refused probe is not stored: nothing waits for it.
    /// One whose outcome is unknown may be stored, and come back with a backlog the stream
    /// holds back: it is waited for still, until it comes back or is given up.
    pub fn probe_failed(&mut self, seq: u64, failure: PublishFailure) {
        match failure {
            PublishFailure::Refused => {
                self.outstanding.remove(&seq);
                self.advance_contiguous();
            }
            PublishFailure::OutcomeUnknown => {}
        }
    }

    /// Probes sent and not back yet (nor refused, nor given up): what the horizon waits for.
    pub fn outstanding_probes(&self) -> usize {
        self.outstanding.len()
    }

    fn advance_contiguous(&mut self) {
        let floor = self
            .outstanding
            .first_key_value()
            .map_or(u64::MAX, |(seq, _)| *seq);
        let ahead = self.delivered_ahead.split_off(&floor);
        let behind = std::mem::replace(&mut self.delivered_ahead, ahead);
        if let Some(latest) = behind.values().copied().max() {
            self.contiguous_publish =
                Some(self.contiguous_publish.map_or(latest, |c| c.max(latest)));
        }
    }

    /// The stream delivered this reader's probe `seq`, published at `publish_ms`, at `now_ms`
    /// (reader's clock). A probe this reader did not send (another reader's, or one of its own
    /// delivered again) counts as an ordinary delivery.
    pub fn probe_delivered(&mut self, seq: u64, publish_ms: Millis, now_ms: Millis) {
        if self.outstanding.remove(&seq).is_none() {
            self.note(publish_ms, now_ms);
            return;
        }
        self.delivered_ahead.insert(seq, publish_ms);
        self.advance_contiguous();
        let first = self.newest_probe.is_none();
        if self.newest_probe.is_none_or(|(_, p)| publish_ms > p) {
            self.newest_probe = Some((now_ms, publish_ms));
        }
        self.probes.push_back((now_ms, now_ms - publish_ms));
        if self.probes.len() > OFFSET_MEMORY {
            self.probes.pop_front();
        }
        self.forget_before(now_ms);
        if first {
            // What came before the first probe is judged by it.
            let backlog = self
                .recent
                .iter()
                .any(|(at, publish)| self.lag(*at, *publish) > self.quiet_ms);
            if backlog {
                self.last_backlog = Some(now_ms);
            }
        }
        self.note(publish_ms, now_ms);
    }

    fn note(&mut self, publish_ms: Millis, now_ms: Millis) {
        self.recent.push_back((now_ms, publish_ms));
        if self.lag(now_ms, publish_ms) > self.quiet_ms {
            self.last_backlog = Some(now_ms);
        }
    }

    /// How long after its publish a delivery came, on Pub/Sub's clock as the last
    /// [`OFFSET_MEMORY`] probes measure it (0 before a probe came back).
    fn lag(&self, at: Millis, publish_ms: Millis) -> Millis {
        self.probes
            .iter()
            .map(|(_, offset)| *offset)
            .min()
            .map_or(0, |offset| at - offset - publish_ms)
    }

    fn forget_before(&mut self, now_ms: Millis) {
        let since = now_ms.saturating_sub(self.quiet_ms);
        while self.recent.front().is_some_and(|(at, _)| *at < since) {
            self.recent.pop_front();
        }
    }

    /// Receipt minus publish time of the newest probe (the reader's clock offset from
    /// Pub/Sub's, plus the probe's delivery delay); `None` before a probe came back.
    pub fn clock_offset(&self) -> Option<Millis> {
        self.newest_probe.map(|(at, publish)| at - publish)
    }

    /// The horizon at `now_ms` (reader's clock), on Pub/Sub's clock; `None` while the stream
    /// has proven nothing or is draining a backlog.
    pub fn horizon(&mut self, now_ms: Millis) -> Option<Millis> {
        self.forget_before(now_ms);
        let before = self.outstanding.len();
        self.outstanding
            .retain(|_, sent| *sent >= now_ms.saturating_sub(PROBE_GIVE_UP_MS));
        if self.outstanding.len() < before {
            self.given_up += (before - self.outstanding.len()) as u64;
            self.advance_contiguous();
        }
        self.newest_probe?;
        let probe_publish = self.contiguous_publish?;
        let since = now_ms.saturating_sub(self.quiet_ms);
        if self.last_backlog.is_some_and(|at| at >= since) {
            return None;
        }
        let live = probe_publish.saturating_sub(self.quiet_ms);
        let oldest_recent = self.recent.iter().map(|(_, publish)| *publish).min();
        Some(oldest_recent.map_or(live, |oldest| oldest.min(live)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn nothing_before_a_probe_nor_while_draining_then_the_probe_minus_quiet() {
        let mut h = DeliveryHorizon::new(2_000);
        assert_eq!(h.horizon(100_000), None, "a fresh stream proves nothing");
        h.delivered(99_900, 100_000);
        assert_eq!(h.horizon(100_100), None, "data alone proves nothing");
        h.probe_sent(1, 100_000);
        h.probe_delivered(1, 100_050, 100_100);
        assert_eq!(h.horizon(100_200), Some(98_050));
        assert_eq!(h.clock_offset(), Some(50));
        // Silence: the horizon holds at the last probe, however long it lasts.
        assert_eq!(h.horizon(200_000), Some(98_050));
        // A backlog published around 40 s comes back: no horizon until quiet after it.
        h.delivered(40_000, 200_100);
        assert_eq!(h.horizon(200_200), None);
        h.probe_sent(2, 200_100);
        h.probe_delivered(2, 200_150, 200_200);
        assert_eq!(h.horizon(201_000), None);
        assert_eq!(h.horizon(202_300), Some(198_150));
    }

    #[test]
    fn a_probe_counts_once_every_probe_sent_before_it_came_back() {
        let mut h = DeliveryHorizon::new(2_000);
        h.probe_sent(1, 10_000);
        h.probe_delivered(1, 10_000, 10_010);
        assert_eq!(h.horizon(10_020), Some(8_000));
        // Probes 2 and 3 are sent in a silence; 4 and 5 after it come back first.
        for seq in 2..=5 {
            h.probe_sent(seq, 20_000 + seq as i64 * 5_000);
        }
        h.probe_delivered(4, 40_000, 40_010);
        h.probe_delivered(5, 40_500, 40_510);
        assert_eq!(h.horizon(40_600), Some(8_000), "held at probe 1");
        // Pub/Sub refused 2 (it is not stored); 3's publish failed with an unknown outcome, so
        // it may be stored and held back: it is waited for.
        h.probe_failed(2, PublishFailure::Refused);
        h.probe_failed(3, PublishFailure::OutcomeUnknown);
        assert_eq!(h.outstanding_probes(), 1);
        assert_eq!(h.horizon(40_700), Some(8_000), "3 may still come");
        // 3 was stored after all, and comes back: 5 counts.
        h.probe_delivered(3, 30_000, 43_000);
        assert_eq!(h.horizon(43_100), None, "3 came back late: a backlog");
        assert_eq!(h.horizon(45_100), Some(38_500));
        // A probe it did not send proves nothing.
        h.probe_delivered(99, 50_000, 50_010);
        assert_eq!(h.horizon(50_020), Some(38_500));
        // One that never comes back is given up after five minutes.
        h.probe_sent(6, 60_000);
        h.probe_sent(7, 60_500);
        h.probe_delivered(7, 60_500, 60_550);
        assert_eq!(h.horizon(61_000), Some(38_500), "6 is out");
        assert_eq!(h.horizon(360_001), Some(58_500));
        assert_eq!(h.probes_given_up(), 1);
    }

    #[test]
    fn a_reader_clock_far_off_pubsub_is_never_ahead() {
        for skew in [-30_000, 0, 30_000] {
            let mut h = DeliveryHorizon::new(2_000);
            // Live traffic, 40 ms latency, a probe every 500 ms; Pub/Sub's time is t.
            let mut horizon = None;
            for t in (1_000_000..1_010_000).step_by(100) {
                if t % 500 == 0 {
                    let seq = (t / 500) as u64;
                    h.probe_sent(seq, t + skew);
                    h.probe_delivered(seq, t - 40, t + skew);
                } else {
                    h.delivered(t - 40, t + skew);
                }
                horizon = h.horizon(t + skew);
                assert!(
                    horizon.is_none_or(|x| x <= t - 2_000),
                    "skew {skew}: {horizon:?} at {t}"
                );
            }
            assert_eq!(horizon, Some(1_009_500 - 2_040), "skew {skew}");
            assert_eq!(h.clock_offset(), Some(skew + 40));
        }
    }
}
