//! The in-flight bound sluice enforces itself (the emulator ignores client flow control).

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Caps messages and bytes held between receipt and ack. A source acquires a message permit
/// before it asks for the next message and byte permits once it knows the size; the permits
/// travel with the [`crate::Delivery`] and are released when it is acked or nacked.
#[derive(Debug, Clone)]
pub struct Budget {
    messages: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    max_messages: usize,
    max_bytes: usize,
}

/// Permits held by one delivery.
#[derive(Debug)]
pub struct Permits {
    _message: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

impl Budget {
    /// A budget of `max_messages` messages and `max_bytes` bytes.
    pub fn new(max_messages: usize, max_bytes: u64) -> Self {
        let max_bytes = usize::try_from(max_bytes)
            .unwrap_or(usize::MAX)
            .clamp(1, Semaphore::MAX_PERMITS);
        let max_messages = max_messages.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            messages: Arc::new(Semaphore::new(max_messages)),
            bytes: Arc::new(Semaphore::new(max_bytes)),
            max_messages,
            max_bytes,
        }
    }

    /// Waits for room for one more message.
    pub async fn reserve_message(&self) -> Option<OwnedSemaphorePermit> {
        self.messages.clone().acquire_owned().await.ok()
    }

    /// Waits for room for `size` more bytes (a message larger than the whole byte budget takes
    /// all of it), then bundles the permits.
    pub async fn reserve_bytes(&self, message: OwnedSemaphorePermit, size: usize) -> Permits {
        let wanted = u32::try_from(size.clamp(1, self.max_bytes)).unwrap_or(u32::MAX);
        let bytes = self.bytes.clone().acquire_many_owned(wanted).await.ok();
        Permits {
            _message: message,
            _bytes: bytes,
        }
    }

    /// The bound: messages, bytes.
    pub fn limits(&self) -> (usize, usize) {
        (self.max_messages, self.max_bytes)
    }

    /// Messages that may still be received before the bound is reached.
    pub fn available_messages(&self) -> usize {
        self.messages.available_permits()
    }
}
