//! The memory tier: recently committed keys (moka) and keys in flight, each with the
//! redeliveries parked behind it.
//!
//! The memory tier is a fast path in front of the store's ledger and must never be the only
//! reason a message is dropped: it remembers a key only for as long as the ledger is sure to
//! (the window counted from before the commit's transaction began, see
//! [`Settlement::Committed`]), and it does not remember a key the ledger found duplicate of a
//! copy committed elsewhere, whose expiry it does not know.

use crate::KeyHash;
use moka::Expiry;
use moka::sync::Cache;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Upper bound on committed keys remembered in memory per flow. At 100k msg/s and a 10-minute
/// window the full window would be 60M keys; beyond this bound moka evicts the least useful
/// entries and the durable ledger answers instead (memory is only a fast path).
pub const MAX_REMEMBERED_KEYS: u64 = 2_000_000;

/// What the memory tier did with a newly received item.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<P> {
    /// Not seen: the caller gets the item back and owns the key until it settles it.
    New(P),
    /// Another item with this key is in flight: this one is parked behind it and handed back by
    /// [`MemoryWindow::settle`].
    Parked,
    /// The store has already decided this key within the window: a duplicate, handed back.
    Committed(P),
}

/// How an in-flight key ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Its effect (or dead letter) was committed by a transaction that began after `since`:
    /// the ledger keeps the key at least until `since` plus the window, and the memory tier
    /// remembers it until then, no longer. Its parked items are handed back (duplicates).
    Committed {
        /// An instant before the commit's transaction began (the delivery's receipt will do).
        since: Instant,
    },
    /// The store found it a duplicate of a copy committed elsewhere, whose expiry the memory
    /// tier cannot know: not remembered (the ledger answers the next copy). Its parked items are
    /// handed back (duplicates too).
    Duplicate,
    /// It was given back uncommitted (nacked): forget it so a redelivery is processed.
    Abandoned,
}

/// Expires each remembered key at the instant stored with it.
struct AtStoredInstant;

impl Expiry<KeyHash, Instant> for AtStoredInstant {
    fn expire_after_create(&self, _: &KeyHash, until: &Instant, now: Instant) -> Option<Duration> {
        Some(until.saturating_duration_since(now))
    }

    fn expire_after_update(
        &self,
        _: &KeyHash,
        until: &Instant,
        now: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(until.saturating_duration_since(now))
    }
}

/// The memory tier of one flow, holding parked items of type `P`. All methods take `&self`;
/// admission and settlement happen under one lock, so an item can never be parked behind a key
/// that has already settled.
pub struct MemoryWindow<P> {
    /// Committed keys, each with the instant it is forgotten.
    committed: Cache<KeyHash, Instant>,
    window: Duration,
    in_flight: Mutex<HashMap<KeyHash, Vec<P>>>,
}

impl<P> MemoryWindow<P> {
    /// A window remembering committed keys for `window` (the flow's `dedup.window`).
    pub fn new(window: Duration) -> Self {
        Self::with_capacity(window, MAX_REMEMBERED_KEYS)
    }

    /// As [`MemoryWindow::new`], with a custom bound on remembered keys.
    pub fn with_capacity(window: Duration, max_keys: u64) -> Self {
        Self {
            committed: Cache::builder()
                .max_capacity(max_keys)
                .expire_after(AtStoredInstant)
                .build(),
            window,
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    /// Classifies a received item by its key; on [`Admission::New`] the key is now in flight.
    pub fn admit(&self, key: KeyHash, item: P) -> Admission<P> {
        let mut in_flight = self.lock();
        if let Some(parked) = in_flight.get_mut(&key) {
            parked.push(item);
            return Admission::Parked;
        }
        if self
            .committed
            .get(&key)
            .is_some_and(|until| until > Instant::now())
        {
            return Admission::Committed(item);
        }
        in_flight.insert(key, Vec::new());
        Admission::New(item)
    }

    /// Ends the flight of each key as its settlement says and hands back every item parked
    /// behind them.
    pub fn settle(&self, keys: impl IntoIterator<Item = (KeyHash, Settlement)>) -> Vec<P> {
        let mut in_flight = self.lock();
        let mut released = Vec::new();
        for (key, how) in keys {
            if let Some(parked) = in_flight.remove(&key) {
                released.extend(parked);
            }
            if let Settlement::Committed { since } = how
                && let Some(until) = since.checked_add(self.window)
                && until > Instant::now()
            {
                self.committed.insert(key, until);
            }
        }
        released
    }

    /// Forgets every committed key (after a full refresh or a reset of the flow).
    pub fn clear(&self) {
        self.committed.invalidate_all();
    }

    /// Keys in flight (admitted, not settled).
    pub fn in_flight(&self) -> usize {
        self.lock().len()
    }

    /// Items parked behind keys in flight.
    pub fn parked(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    /// Keys held: remembered committed keys plus keys in flight (`sluice_dedup_cache_entries`).
    pub fn entries(&self) -> u64 {
        self.committed.entry_count() + self.in_flight() as u64
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<KeyHash, Vec<P>>> {
        // A poisoned lock only means another thread panicked mid-update of a plain map; the map
        // itself is still consistent, so keep going.
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DedupKey;

    #[test]
    fn new_then_parked_then_committed() {
        let window = MemoryWindow::new(Duration::from_secs(600));
        let key = DedupKey::new("a").hash();
        assert_eq!(window.admit(key, 1), Admission::New(1));
        assert_eq!(window.admit(key, 2), Admission::Parked);
        assert_eq!(window.admit(key, 3), Admission::Parked);
        assert_eq!((window.in_flight(), window.parked()), (1, 2));
        assert_eq!(window.settle([(key, committed_now())]), vec![2, 3]);
        assert_eq!(window.admit(key, 4), Admission::Committed(4));
        assert_eq!((window.in_flight(), window.parked()), (0, 0));
    }

    #[test]
    fn abandoned_key_is_admitted_again_and_releases_its_parked_items() {
        let window = MemoryWindow::new(Duration::from_secs(600));
        let key = DedupKey::new("b").hash();
        assert_eq!(window.admit(key, 1), Admission::New(1));
        assert_eq!(window.admit(key, 2), Admission::Parked);
        assert_eq!(window.settle([(key, Settlement::Abandoned)]), vec![2]);
        assert_eq!(window.admit(key, 3), Admission::New(3));
    }

    #[test]
    fn committed_keys_expire_with_the_window() {
        let window = MemoryWindow::new(Duration::from_millis(50));
        let key = DedupKey::new("c").hash();
        assert_eq!(window.admit(key, ()), Admission::New(()));
        window.settle([(key, committed_now())]);
        assert_eq!(window.admit(key, ()), Admission::Committed(()));
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(window.admit(key, ()), Admission::New(()));
    }

    #[test]
    fn a_committed_key_is_remembered_from_before_its_commit_not_from_its_settlement() {
        let window = MemoryWindow::new(Duration::from_millis(300));
        let key = DedupKey::new("d").hash();
        let before_commit = Instant::now();
        assert_eq!(window.admit(key, ()), Admission::New(()));
        // A slow commit: settled 200 ms after it began; remembered 100 ms more, not 300.
        std::thread::sleep(Duration::from_millis(200));
        window.settle([(
            key,
            Settlement::Committed {
                since: before_commit,
            },
        )]);
        assert_eq!(window.admit(key, ()), Admission::Committed(()));
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(window.admit(key, ()), Admission::New(()));
    }

    #[test]
    fn a_ledger_duplicate_is_not_remembered_but_releases_its_parked_items() {
        let window = MemoryWindow::new(Duration::from_secs(600));
        let key = DedupKey::new("e").hash();
        assert_eq!(window.admit(key, 1), Admission::New(1));
        assert_eq!(window.admit(key, 2), Admission::Parked);
        assert_eq!(window.settle([(key, Settlement::Duplicate)]), vec![2]);
        assert_eq!(window.admit(key, 3), Admission::New(3));
    }

    fn committed_now() -> Settlement {
        Settlement::Committed {
            since: Instant::now(),
        }
    }

    #[test]
    fn distinct_keys_have_distinct_hashes() {
        assert_ne!(DedupKey::new("x").hash(), DedupKey::new("y").hash());
    }
}
