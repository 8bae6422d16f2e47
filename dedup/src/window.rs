//! The memory tier: recently committed keys (moka, time-to-live = dedup window) and keys in flight.

use crate::KeyHash;
use moka::sync::Cache;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bound on committed keys remembered in memory per flow. At 100k msg/s and a 10-minute
/// window the full window would be 60M keys; beyond this bound moka evicts the least useful
/// entries and the durable ledger answers instead (memory is only a fast path).
pub const MAX_REMEMBERED_KEYS: u64 = 2_000_000;

/// What the memory tier says about a newly received key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Not seen: the caller now owns the key until it calls [`MemoryWindow::settle`].
    New,
    /// Another message with this key is in flight; hold this one until that one settles.
    InFlight,
    /// The store has already decided this key within the window: a duplicate.
    Committed,
}

/// How an in-flight key ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Its effect (or dead letter) committed, or the store found it duplicate: remember it.
    Committed,
    /// It was given back uncommitted (nacked): forget it so a redelivery is processed.
    Abandoned,
}

/// The memory tier of one flow. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct MemoryWindow {
    committed: Cache<KeyHash, ()>,
    in_flight: Mutex<HashMap<KeyHash, ()>>,
}

impl MemoryWindow {
    /// A window remembering committed keys for `window` (the flow's `dedup.window`).
    pub fn new(window: Duration) -> Self {
        Self::with_capacity(window, MAX_REMEMBERED_KEYS)
    }

    /// As [`MemoryWindow::new`], with a custom bound on remembered keys.
    pub fn with_capacity(window: Duration, max_keys: u64) -> Self {
        Self {
            committed: Cache::builder()
                .max_capacity(max_keys)
                .time_to_live(window)
                .build(),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Classifies a received key; on [`Admission::New`] the key is now in flight.
    pub fn admit(&self, key: KeyHash) -> Admission {
        let mut in_flight = self.lock();
        if in_flight.contains_key(&key) {
            return Admission::InFlight;
        }
        if self.committed.contains_key(&key) {
            return Admission::Committed;
        }
        in_flight.insert(key, ());
        Admission::New
    }

    /// Ends a key's flight.
    pub fn settle(&self, key: KeyHash, how: Settlement) {
        let mut in_flight = self.lock();
        in_flight.remove(&key);
        if how == Settlement::Committed {
            self.committed.insert(key, ());
        }
    }

    /// Records a key the store decided without it being in flight here.
    pub fn remember(&self, key: KeyHash) {
        self.committed.insert(key, ());
    }

    /// Forgets every committed key (after a full refresh or a reset of the flow).
    pub fn clear(&self) {
        self.committed.invalidate_all();
    }

    /// Keys held: remembered committed keys plus keys in flight (`sluice_dedup_cache_entries`).
    pub fn entries(&self) -> u64 {
        self.committed.entry_count() + self.lock().len() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<KeyHash, ()>> {
        // A poisoned lock only means another thread panicked mid-update of a plain map; the map
        // itself is still consistent, so keep going.
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DedupKey;

    #[test]
    fn new_then_in_flight_then_committed() {
        let window = MemoryWindow::new(Duration::from_secs(600));
        let key = DedupKey::new("a").hash();
        assert_eq!(window.admit(key), Admission::New);
        assert_eq!(window.admit(key), Admission::InFlight);
        window.settle(key, Settlement::Committed);
        assert_eq!(window.admit(key), Admission::Committed);
    }

    #[test]
    fn abandoned_key_is_admitted_again() {
        let window = MemoryWindow::new(Duration::from_secs(600));
        let key = DedupKey::new("b").hash();
        assert_eq!(window.admit(key), Admission::New);
        window.settle(key, Settlement::Abandoned);
        assert_eq!(window.admit(key), Admission::New);
    }

    #[test]
    fn committed_keys_expire_with_the_window() {
        let window = MemoryWindow::new(Duration::from_millis(50));
        let key = DedupKey::new("c").hash();
        window.remember(key);
        assert_eq!(window.admit(key), Admission::Committed);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(window.admit(key), Admission::New);
    }

    #[test]
    fn distinct_keys_have_distinct_hashes() {
        assert_ne!(DedupKey::new("x").hash(), DedupKey::new("y").hash());
    }
}
