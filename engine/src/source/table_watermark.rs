//! A table source's watermark: read from the table's live writers, taken over as the reading
//! flow's own.
//!
//! Guarantee: the flow's watermark only moves forward, here and in the store; the table's is
//! the smallest of its live writers', none while one of them has none.

use crate::telemetry::Counters;
use crate::watermark::FlowWatermark;
use sluice_store::{FlowHandle, ProgressStore, WatermarkRecord};
use std::sync::Arc;

/// Where the table's watermark comes from and where the flow's goes.
#[derive(Clone)]
pub struct TableWatermark {
    /// The store holding the writers' watermark records (and the flow's).
    pub store: Arc<dyn ProgressStore>,
    /// The table's live writers: its watermark is the smallest of theirs, none while one of
    /// them has none.
    pub writers: Vec<String>,
    /// The flow's watermark as this worker shows it.
    pub watermark: FlowWatermark,
}

impl TableWatermark {
    /// The table's watermark now: the smallest of its live writers' stored ones.
    pub(super) async fn read(&self, pipeline: &str) -> Option<i64> {
        let records = match self.store.watermarks(pipeline).await {
            Ok(records) => records,
            Err(error) => {
                tracing::debug!(%error, "cannot read the table's watermark; trying next range");
                return None;
            }
        };
        self.writers
            .iter()
            .map(|writer| {
                records
                    .iter()
                    .find(|(flow, _)| flow == writer)
                    .map(|(_, record)| record.watermark_ms)
            })
            .try_fold(i64::MAX, |lowest, w| w.map(|w| lowest.min(w)))
            .filter(|w| *w != i64::MAX)
    }

    /// Makes `watermark_ms` the watermark of `flow`, here and in the store (only when it
    /// moves), and shows it on `counters`.
    pub(super) async fn offer(
        &self,
        flow: &FlowHandle,
        watermark_ms: i64,
        counters: Option<&Counters>,
    ) {
        if self
            .watermark
            .current()
            .is_some_and(|shown| shown >= watermark_ms)
        {
            return;
        }
        self.watermark.advance(watermark_ms);
        let offer = WatermarkRecord {
            watermark_ms,
            horizon_ms: watermark_ms,
            updated_at_ms: crate::time::now_ms(),
        };
        if let Err(error) = self.store.advance_watermark(flow, &offer, None).await {
            tracing::debug!(%error, "cannot store the flow's watermark; the next range will");
        }
        if let Some(counters) = counters {
            counters.publish_watermark();
        }
    }
}
