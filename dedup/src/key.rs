//! The dedup key and its 16-byte memory fingerprint.

use std::fmt;

/// The identity under which a message is deduplicated within a flow: the Pub/Sub message id or
/// an attribute's value. Stored verbatim in the durable ledger.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DedupKey(String);

impl DedupKey {
    /// Wraps a key value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The key as text, as stored in the ledger and the target's `dedup_key` column.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 128-bit fingerprint the memory tier keeps instead of the full key (XXH3-128).
    /// A collision would make the memory tier take two keys for one (a message acked as a
    /// duplicate, or parked behind another key's message); with 128 bits it is astronomically
    /// unlikely (see [`crate::MemoryWindow`]).
    pub fn hash(&self) -> KeyHash {
        KeyHash(xxhash_rust::xxh3::xxh3_128(self.0.as_bytes()))
    }
}

impl fmt::Debug for DedupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DedupKey({:?})", self.0)
    }
}

impl fmt::Display for DedupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A 128-bit fingerprint of a [`DedupKey`], used by the memory tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyHash(pub u128);
