//! A table source's rows as messages of the reading flow, and the cut of a page to its byte
//! bound.
//!
//! Guarantee: the cut depends on the rows alone, so a replayed page holds the same records as
//! the attempt it replaces.

use crate::flow::delivery::{AckHandle, SourceMessage};
use sluice_store::{FeedRow, StoredRow};
use std::collections::BTreeMap;

/// A row as a message of the reading flow.
pub(super) fn message(row: StoredRow) -> SourceMessage {
    let attributes: BTreeMap<String, String> =
        serde_json::from_str::<serde_json::Value>(&row.attributes_json)
            .ok()
            .and_then(|value| match value {
                serde_json::Value::Object(map) => Some(
                    map.into_iter()
                        .map(|(k, v)| match v {
                            serde_json::Value::String(s) => (k, s),
                            other => (k, other.to_string()),
                        })
                        .collect(),
                ),
                _ => None,
            })
            .unwrap_or_default();
    SourceMessage {
        message_id: format!("{}/{}", row.flow, row.dedup_key),
        publish_time_ms: row.publish_time_ms,
        attributes,
        data: row.data,
        event_time_ms: Some(row.event_time_ms),
        problem: None,
    }
}

/// The first rows of a page that fit in `max_bytes` (at least one): the same rows always give
/// the same cut.
pub(super) fn cut_to_bytes(mut rows: Vec<FeedRow>, max_bytes: usize) -> Vec<FeedRow> {
    let mut total = 0usize;
    let keep = rows
        .iter()
        .position(|r| {
            total = total.saturating_add(r.row.data.len() + r.row.attributes_json.len());
            total > max_bytes
        })
        .map_or(rows.len(), |at| at.max(1));
    rows.truncate(keep);
    rows
}

/// The ack handle of a table record: a page is found again by its position, not redelivered.
pub(super) struct NoAck;

impl AckHandle for NoAck {
    fn ack(self: Box<Self>) {}

    fn nack(self: Box<Self>) {}
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn row(bytes: usize) -> FeedRow {
        FeedRow {
            row: StoredRow {
                flow: "f".into(),
                dedup_key: "k".into(),
                message_id: "m".into(),
                publish_time_ms: 0,
                event_time_ms: 0,
                attributes_json: String::new(),
                data: bytes::Bytes::from(vec![0u8; bytes]),
            },
            cursor: (0, 0),
            committed_at_ms: 0,
        }
    }

    #[test]
    fn pages_are_cut_to_the_byte_bound_keeping_at_least_one_row() {
        let rows = || vec![row(40), row(40), row(40)];
        assert_eq!(cut_to_bytes(rows(), 100).len(), 2);
        assert_eq!(cut_to_bytes(rows(), 120).len(), 3);
        assert_eq!(cut_to_bytes(rows(), 10).len(), 1);
        assert_eq!(cut_to_bytes(Vec::new(), 10).len(), 0);
    }
}
