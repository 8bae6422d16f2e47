//! How a job recognises copies of one message: [`Dedup`], the dedup key (message id or an
//! attribute) and the window its keys are remembered for.
//!
//! Guarantee: two messages with the same key within the window are one message: the second is
//! a duplicate, acked and never handed to the job's handler.

use sluice_engine::KeySource;
use sluice_engine::defaults;
use std::time::Duration;

/// How a job recognises copies of one message.
///
/// ```
/// # use sluice_connector::prelude::*;
/// use std::time::Duration;
/// // A publisher's retry carries a new message id but the same `order_id`.
/// let by_order = Dedup::by_attribute("order_id").window(Duration::from_secs(3600));
/// // Only Pub/Sub's own redeliveries, over the default 10 minutes.
/// let by_id = Dedup::by_message_id();
/// assert_ne!(by_order, by_id);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dedup {
    pub(super) key: KeySource,
    pub(super) window: Duration,
}

impl Dedup {
    /// By Pub/Sub message id (a publisher's retry with a new id is a new message).
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let dedup = Dedup::by_message_id();
    /// ```
    pub fn by_message_id() -> Self {
        Self {
            key: KeySource::MessageId,
            window: defaults::DEDUP_WINDOW,
        }
    }

    /// By the value of attribute `name`; a message without it is keyed by its message id.
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let dedup = Dedup::by_attribute("event_id").window(std::time::Duration::from_secs(3600));
    /// ```
    pub fn by_attribute(name: impl Into<String>) -> Self {
        Self {
            key: KeySource::Attribute {
                name: name.into(),
                dead_letter_if_missing: false,
            },
            window: defaults::DEDUP_WINDOW,
        }
    }

    /// As [`Dedup::by_attribute`], a message without it dead-lettered (`missing_dedup_attribute`).
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let strict = Dedup::by_attribute_or_dead_letter("event_id");
    /// ```
    pub fn by_attribute_or_dead_letter(name: impl Into<String>) -> Self {
        Self {
            key: KeySource::Attribute {
                name: name.into(),
                dead_letter_if_missing: true,
            },
            window: defaults::DEDUP_WINDOW,
        }
    }

    /// Keys are remembered this long (default 10 minutes).
    ///
    /// ```
    /// # use sluice_connector::prelude::*;
    /// let day = Dedup::by_message_id().window(std::time::Duration::from_secs(86_400));
    /// ```
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }
}
