//! Deduplication keys and the memory tier of sluice's two-tier dedup.
//!
//! A message's [`DedupKey`] is its Pub/Sub message id or the value of one of its attributes.
//! Two tiers decide whether a key has been seen within the dedup window:
//!
//! 1. [`MemoryWindow`] (this crate): a moka cache of keys this worker has seen *committed*
//!    recently, plus the keys currently *in flight* (received, not yet committed). It is only a
//!    fast path: it reports [`Admission::Committed`] only for keys the store has already
//!    accepted or refused as duplicates, so it can never be the sole reason a message is dropped.
//! 2. The durable ledger (`sluice-store`): keys inserted in the same transaction as the target
//!    rows; a conflicting insert means "duplicate". The ledger is the authority, shared by every
//!    replica that uses the same store.
//!
//! Guarantee of this crate: while a key is between [`MemoryWindow::admit`] and
//! [`MemoryWindow::settle`], every other item with that key is [`Admission::Parked`] and handed
//! back by the settlement, so a redelivery racing its original is held instead of being processed
//! a second time, and is never lost: admission and settlement share one lock.

mod key;
mod window;

pub use key::{DedupKey, KeyHash};
pub use window::{Admission, MemoryWindow, Settlement};
