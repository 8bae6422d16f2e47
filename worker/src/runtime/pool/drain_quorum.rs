//! When a once Pub/Sub flow read by several replicas is drained: the rule behind its completion.
//!
//! # Guarantee
//!
//! A replica records a once Pub/Sub flow complete only when, on the store's clock,
//! 1. it found the subscription empty for `drain_idle` holding nothing itself;
//! 2. every other live reader of the flow (heartbeat within [`ALIVE_WITHIN`]) reported the same
//!    and has not received anything since;
//! 3. every reader that died while reading (its report says reading, its heartbeat stopped) died
//!    long enough ago for what it held to have come back and been read: its last sign of life
//!    plus [`REDELIVERY_WAIT`] (or `SLUICE_REDELIVERY_WAIT`, [`redelivery_wait`]) plus
//!    `drain_idle` is in the past.
//!
//! Until then an idle replica keeps reading, so messages a crashed replica held come back to a
//! stream that is still open and are committed. A reader that stops cleanly (a drain) holds
//! nothing and withdraws its report. Reports go with a reset of the flow.
//!
//! What it does not cover: a reader that dies in the instant between receiving a message after
//! its "drained" report and saying so (one store round trip), and a replica that starts reading
//! the flow just as another records it complete (the newcomer commits what it reads; if it then
//! dies holding messages, they stay in the subscription).

use crate::runtime::kit::env_duration::from_env;
use crate::runtime::pool::timing::ALIVE_WITHIN;
use async_trait::async_trait;
use sluice_engine::DrainAgreement;
use sluice_store::DrainStore;
use sluice_store::{DrainCensus, FlowHandle};
use std::sync::Arc;
use std::time::Duration;

/// How long after a reader's last sign of life what it held may still come back. On Pub/Sub a
/// message comes back once its lease lapses (the stream's ack deadline, 10 s, after the last
/// extension; the last heartbeat may be a beat older). The emulator as shipped holds some of a
/// killed stream's messages back for minutes (up to about 3 minutes seen here: a fault of its
/// jar, which `sluice_bench::Emulator` fixes where it starts one; docs/architecture-notes.md),
/// so the wait is four minutes: a once flow whose reader crashed completes that much later, and
/// no message it held is left behind.
pub const REDELIVERY_WAIT: Duration = Duration::from_secs(240);

/// [`REDELIVERY_WAIT`] can be shortened, never below one ack deadline (10 s): on Pub/Sub,
/// where a lapsed lease comes back within seconds, or in a test that cannot wait four minutes.
pub const REDELIVERY_WAIT_VARIABLE: &str = "SLUICE_REDELIVERY_WAIT";
const SHORTEST_REDELIVERY_WAIT: Duration = Duration::from_secs(10);

/// This process's redelivery wait: [`REDELIVERY_WAIT`] or what [`REDELIVERY_WAIT_VARIABLE`]
/// says (every process of a pool should be given the same), read once.
pub fn redelivery_wait() -> Duration {
    static WAIT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *WAIT.get_or_init(|| {
        from_env(
            REDELIVERY_WAIT_VARIABLE,
            REDELIVERY_WAIT,
            SHORTEST_REDELIVERY_WAIT,
        )
    })
}

/// The store-backed [`DrainAgreement`] of one once flow on one worker.
pub struct StoreDrainQuorum {
    store: Arc<dyn DrainStore>,
    flow: FlowHandle,
    worker: String,
    drain_idle: Duration,
}

impl StoreDrainQuorum {
    /// The agreement of `worker` on `flow`, whose source drains after `drain_idle`.
    pub fn new(
        store: Arc<dyn DrainStore>,
        flow: FlowHandle,
        worker: &str,
        drain_idle: Duration,
    ) -> Self {
        Self {
            store,
            flow,
            worker: worker.to_owned(),
            drain_idle,
        }
    }

    async fn report(&self, drained: bool) -> bool {
        match self
            .store
            .report_drain(&self.flow, &self.worker, drained)
            .await
        {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(flow = %self.flow.name, %error,
                    "cannot report this worker's drain; reading on");
                false
            }
        }
    }
}

/// Why `me` may not end the flow yet, given every reader's report; `None`: it may.
fn blocked_by(census: &DrainCensus, me: &str, drain_idle: Duration) -> Option<String> {
    let alive_within = millis(ALIVE_WITHIN);
    let settle = millis(redelivery_wait()).saturating_add(millis(drain_idle));
    census
        .reports
        .iter()
        .filter(|r| r.worker != me && !r.drained)
        .find_map(|r| {
            let alive = r
                .last_beat_ms
                .is_some_and(|beat| census.now_ms.saturating_sub(beat) <= alive_within);
            let last_sign = r.last_beat_ms.unwrap_or(i64::MIN).max(r.reported_at_ms);
            if alive {
                Some(format!("{} is still reading", r.worker))
            } else if census.now_ms < last_sign.saturating_add(settle) {
                Some(format!(
                    "{} died while reading; what it held may still come back",
                    r.worker
                ))
            } else {
                None
            }
        })
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl DrainAgreement for StoreDrainQuorum {
    async fn reading(&self) {
        self.report(false).await;
    }

    async fn may_finish(&self) -> bool {
        if !self.report(true).await {
            return false;
        }
        match self.store.drain_census(&self.flow).await {
            Ok(census) => match blocked_by(&census, &self.worker, self.drain_idle) {
                None => true,
                Some(reason) => {
                    tracing::info!(flow = %self.flow.name, %reason,
                        "the subscription is empty here; not complete yet, reading on");
                    false
                }
            },
            Err(error) => {
                tracing::warn!(flow = %self.flow.name, %error,
                    "cannot read the other readers' drain reports; reading on");
                false
            }
        }
    }

    async fn stopped(&self) {
        if let Err(error) = self.store.withdraw_drain(&self.flow, &self.worker).await {
            tracing::warn!(flow = %self.flow.name, %error,
                "cannot withdraw this worker's drain report; others wait it out");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_store::DrainReport;

    fn report(worker: &str, drained: bool, reported: i64, beat: Option<i64>) -> DrainReport {
        DrainReport {
            worker: worker.into(),
            drained,
            reported_at_ms: reported,
            last_beat_ms: beat,
        }
    }

    #[test]
    fn live_readers_and_recently_dead_ones_hold_completion() {
        let now = 1_000_000;
        let blocked = |reports| {
            let census = DrainCensus {
                now_ms: now,
                reports,
            };
            blocked_by(&census, "me", Duration::from_secs(3))
        };
        assert_eq!(blocked(vec![report("me", true, now, Some(now))]), None);
        // Another live reader still reading.
        assert!(blocked(vec![report("b", false, now - 1_000, Some(now - 2_000))]).is_some());
        // A live reader that drained too.
        assert_eq!(blocked(vec![report("b", true, now, Some(now))]), None);
        // Died reading 200 s ago: its messages may still come back (wait 240 s + 3 s).
        assert!(blocked(vec![report("b", false, now - 200_000, Some(now - 200_000))]).is_some());
        // Died reading 250 s ago: long enough.
        assert_eq!(
            blocked(vec![report("b", false, now - 250_000, Some(now - 250_000))]),
            None
        );
        // Drained, then left the pool (no heartbeat): it held nothing.
        assert_eq!(blocked(vec![report("b", true, now - 1_000, None)]), None);
    }
}
