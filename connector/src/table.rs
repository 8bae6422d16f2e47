//! A bounded source reading a target table of the same pipeline (`source: { table: X }`).
//!
//! # Guarantees
//!
//! * **Every row once.** The table is read in pages in `(flow, dedup_key, message_id)` order
//!   ([`sluice_store::FlowStore::read_rows`]); a record's message id (hence its dedup key in the
//!   reading flow) is `<writer flow>/<dedup key>`, so the same record is the same key however
//!   often the table is read, and the guarantees of [`crate::SkipCommitted`] and the ledger make
//!   each land once in the reading flow's target.
//! * **A finished table, then the end.** Rows are read in pages until a page comes back empty.
//!   The pages are separate reads, so a row committed meanwhile may be missed: the table must
//!   not be written while it is read. The worker ensures it: a table flow starts after every
//!   writer of its table completed (a data edge), and a table that live flows write cannot be
//!   read in a continuous pipeline.
//! * Event time and attributes carry over from the row; its publish time too.

use crate::bounded::{CHUNK, Deliverer, Running, SkipCommitted, SourceProgress};
use crate::budget::Budget;
use crate::delivery::SourceMessage;
use crate::source::SourceError;
use crate::source::{MessageSource, Received, SourceHandle};
use async_trait::async_trait;
use sluice_store::FlowStore;
use sluice_store::{RowCursor, StoredRow};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Reads a target table once.
pub struct TableSource {
    store: Arc<dyn FlowStore>,
    table: String,
    skip: Option<SkipCommitted>,
    progress: Arc<SourceProgress>,
}

impl TableSource {
    /// A source of the rows of `table` (a full table name, `<pipeline>__<target>`).
    pub fn new(store: Arc<dyn FlowStore>, table: impl Into<String>) -> Self {
        Self {
            store,
            table: table.into(),
            skip: None,
            progress: Arc::new(SourceProgress::default()),
        }
    }

    /// Skips rows the reading flow has already committed (see [`SkipCommitted`]).
    pub fn skip_committed(mut self, skip: SkipCommitted) -> Self {
        self.skip = Some(skip);
        self
    }

    /// Its progress, and the reason it failed if it did.
    pub fn progress(&self) -> Arc<SourceProgress> {
        self.progress.clone()
    }
}

/// A row as a message of the reading flow.
fn message(row: StoredRow) -> SourceMessage {
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

#[async_trait]
impl MessageSource for TableSource {
    async fn start(
        self: Box<Self>,
        intake: mpsc::Sender<Received>,
        budget: Budget,
        stop: CancellationToken,
    ) -> Result<Box<dyn SourceHandle>, SourceError> {
        let deliverer = Deliverer {
            skip: self.skip,
            progress: self.progress.clone(),
            intake,
            budget,
            stop: stop.clone(),
        };
        let (store, table) = (self.store, self.table);
        let task = tokio::spawn(async move {
            let mut cursor: Option<RowCursor> = None;
            let mut backoff = crate::backoff::Backoff::default();
            loop {
                let page = match store.read_rows(&table, cursor.as_ref(), CHUNK).await {
                    Ok(page) => page,
                    Err(error) if error.is_transient() => {
                        let delay = backoff.next_delay();
                        tracing::warn!(%table, step = backoff.step(), %error,
                            "cannot read the source table; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => continue,
                            _ = deliverer.stop.cancelled() => return,
                        }
                    }
                    Err(error) => {
                        deliverer
                            .progress
                            .fail(format!("cannot read table {table}: {error}"));
                        return;
                    }
                };
                let Some(last) = page.last() else {
                    return;
                };
                cursor = Some(RowCursor::from(last));
                if !deliverer
                    .deliver(page.into_iter().map(message).collect())
                    .await
                {
                    return;
                }
            }
        });
        Ok(Box::new(Running {
            stop,
            task,
            progress: self.progress,
        }))
    }
}
