//! Exponential backoff with full jitter, for retries of stages, commits and connections, and
//! the patience of a retry sequence that must end (a triggered run's `give_up_after`).

use std::time::Duration;
use tokio::time::Instant;

/// First retry delay.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Longest delay between retries: a recovered store or emulator is noticed within this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One retry sequence. Each [`Backoff::next_delay`] doubles the ceiling up to `MAX_BACKOFF`.
#[derive(Debug, Clone)]
pub struct Backoff {
    ceiling: Duration,
    step: u32,
    /// How long the sequence may go on, from its first delay (`None`: for ever).
    patience: Option<Duration>,
    first_delay: Option<Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            ceiling: INITIAL_BACKOFF,
            step: 0,
            patience: None,
            first_delay: None,
        }
    }
}

impl Backoff {
    /// A sequence that is [`Backoff::exhausted`] once `patience` has passed since its first
    /// delay (`None`: never).
    pub fn giving_up_after(patience: Option<Duration>) -> Self {
        Self {
            patience,
            ..Self::default()
        }
    }

    /// The patience, once it has run out: the retries began longer ago than it allows.
    pub fn exhausted(&self) -> Option<Duration> {
        let patience = self.patience?;
        let first = self.first_delay?;
        (first.elapsed() >= patience).then_some(patience)
    }

    /// The delay before the next retry (random in `[ceiling/2, ceiling]`), and advances.
    pub fn next_delay(&mut self) -> Duration {
        self.first_delay.get_or_insert_with(Instant::now);
        let ceiling = self.ceiling;
        self.ceiling = (self.ceiling * 2).min(MAX_BACKOFF);
        self.step += 1;
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// How many delays were handed out: the step number logged with each retry.
    pub fn step(&self) -> u32 {
        self.step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap() {
        let mut backoff = Backoff::default();
        let first = backoff.next_delay();
        assert!(first <= INITIAL_BACKOFF && first >= INITIAL_BACKOFF / 2);
        let last = (0..20)
            .map(|_| backoff.next_delay())
            .last()
            .unwrap_or_default();
        assert!(last <= MAX_BACKOFF && last >= MAX_BACKOFF / 2, "{last:?}");
        assert_eq!(backoff.step(), 21);
        assert_eq!(
            backoff.exhausted(),
            None,
            "no patience set: never exhausted"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn patience_runs_from_the_first_delay() {
        let patience = Duration::from_secs(5);
        let mut backoff = Backoff::giving_up_after(Some(patience));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            backoff.exhausted(),
            None,
            "no retry yet: the clock has not started"
        );
        let _ = backoff.next_delay();
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(backoff.exhausted(), None);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(backoff.exhausted(), Some(patience));
    }
}
