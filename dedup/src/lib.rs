//! Deduplication keys and the memory tier of sluice's two-tier dedup.
//!
//! A message's [`DedupKey`] is its Pub/Sub message id or the value of one of its attributes.
//! Two tiers decide whether a key has been seen within the dedup window:
//!
//! 1. [`MemoryWindow`] (this crate): a moka cache of keys this worker has seen *committed*
//!    recently, plus the keys currently *in flight* (received, not yet committed). It is only a
//!    fast path: it reports [`Admission::Committed`] only for keys this worker committed, and
//!    only for the dedup window counted from before that commit began (the ledger keeps them at
//!    least that long); a key the ledger found duplicate of another worker's copy is not
//!    remembered. So it is never the only reason a message is dropped after the ledger's own
//!    window. (It keeps 128-bit fingerprints: two keys with the same fingerprint, about one
//!    chance in 2⁶⁴ for four billion keys, would be taken for one.)
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
