//! Exponential backoff with full jitter, for retries of stages, commits and connections.

use std::time::Duration;

/// First retry delay.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// Longest delay between retries: a recovered store or emulator is noticed within this.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// One retry sequence. Each [`Backoff::next_delay`] doubles the ceiling up to `MAX_BACKOFF`.
#[derive(Debug, Clone)]
pub struct Backoff {
    ceiling: Duration,
    step: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            ceiling: INITIAL_BACKOFF,
            step: 0,
        }
    }
}

impl Backoff {
    /// The delay before the next retry (random in `[ceiling/2, ceiling]`), and advances.
    pub fn next_delay(&mut self) -> Duration {
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
    }
}
