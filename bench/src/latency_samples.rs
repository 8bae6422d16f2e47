//! The latencies `sluice bench latency` records: per message, from the publisher's stamp
//! (`sent_us`) to its first receipt (raw client) or to the return of the commit that wrote it
//! ([`Timed`], a store around the real one), and their percentiles.
//!
//! Guarantee: a message counts once, at its first arrival or first commit (a redelivery or a
//! duplicate the ledger refused is not counted again), and the first second of a measurement
//! is left out of the percentiles.

use crate::latency_points::Percentiles;
use async_trait::async_trait;
use google_cloud_pubsub::model::Message;
use sluice_store::{
    CommitBatch, CommitOutcome, FlowHandle, FlowProgress, LedgerStore, LedgerUpkeep, StoreError,
};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// A store whose commits record, for each message they wrote, when they returned.
pub(crate) struct Timed {
    pub(crate) inner: Arc<dyn sluice_store::Store>,
    pub(crate) samples: Samples,
}

#[async_trait]
impl LedgerStore for Timed {
    async fn commit(&self, batch: CommitBatch) -> Result<CommitOutcome, StoreError> {
        let attributes: Vec<String> = batch
            .entries
            .iter()
            .map(|e| e.message.attributes_json.clone())
            .collect();
        let outcome = self.inner.commit(batch).await?;
        let at = now_us();
        for (json, written) in attributes.iter().zip(&outcome.written) {
            if *written {
                self.samples.record_json(json, at);
            }
        }
        Ok(outcome)
    }

    fn commit_concurrency(&self) -> usize {
        self.inner.commit_concurrency()
    }

    async fn keys_present(
        &self,
        flow: &FlowHandle,
        table: &str,
        keys: &[String],
    ) -> Result<Vec<bool>, StoreError> {
        self.inner.keys_present(flow, table, keys).await
    }

    async fn commit_recorded(
        &self,
        flow: &FlowHandle,
        commit_id: &str,
    ) -> Result<bool, StoreError> {
        self.inner.commit_recorded(flow, commit_id).await
    }

    async fn flow_progress(&self, flow: &FlowHandle) -> Result<FlowProgress, StoreError> {
        self.inner.flow_progress(flow).await
    }

    async fn ledger_upkeep(&self) -> Result<LedgerUpkeep, StoreError> {
        self.inner.ledger_upkeep().await
    }
}

/// Message number → latency in µs of its first arrival (raw; a redelivery is not counted)
/// or its commit (sluice).
#[derive(Clone, Default)]
pub(crate) struct Samples(Arc<Mutex<std::collections::HashMap<u64, u64>>>);

impl Samples {
    fn push(&self, i: u64, sent_us: u64, at_us: u64) {
        if let Ok(mut samples) = self.0.lock() {
            samples
                .entry(i)
                .or_insert_with(|| at_us.saturating_sub(sent_us));
        }
    }

    pub(crate) fn record_message(&self, message: &Message, at_us: u64) {
        let number = |key: &str| message.attributes.get(key).and_then(|v| v.parse().ok());
        if let (Some(i), Some(sent)) = (number("i"), number("sent_us")) {
            self.push(i, sent, at_us);
        }
    }

    /// From a message's attributes as the store holds them (a JSON object of strings).
    fn record_json(&self, json: &str, at_us: u64) {
        if let (Some(i), Some(sent)) = (json_number(json, "i"), json_number(json, "sent_us")) {
            self.push(i, sent, at_us);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.0.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Percentiles of the messages after the first second (`i >= rate`).
    pub(crate) fn percentiles(&self, rate: u64) -> Percentiles {
        let mut latencies: Vec<u64> = self
            .0
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|(i, _)| **i >= rate)
                    .map(|(_, l)| *l)
                    .collect()
            })
            .unwrap_or_default();
        latencies.sort_unstable();
        let at = |q: f64| {
            let index = ((latencies.len() as f64 - 1.0) * q).round() as usize;
            latencies.get(index).map_or(0.0, |&us| us as f64 / 1000.0)
        };
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
            max: at(1.0),
            count: latencies.len(),
        }
    }
}

/// The number in string attribute `key` of a flat JSON object of strings (`"key":"123"`).
fn json_number(json: &str, key: &str) -> Option<u64> {
    let pattern = format!("\"{key}\":\"");
    let start = json.find(&pattern)? + pattern.len();
    let digits: String = json[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The wall clock, µs since the epoch (what the publisher stamps in `sent_us`).
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_as_stored_give_their_numbers() {
        let json = r#"{"i":"42","sent_us":"1700000000123456"}"#;
        assert_eq!(json_number(json, "i"), Some(42));
        assert_eq!(json_number(json, "sent_us"), Some(1_700_000_000_123_456));
        assert_eq!(json_number(json, "missing"), None);
    }

    #[test]
    fn the_first_second_is_left_out() {
        let samples = Samples::default();
        for i in 0..200u64 {
            samples.push(i, 0, if i < 100 { 1_000_000 } else { (i - 99) * 1000 });
        }
        let p = samples.percentiles(100);
        assert_eq!(p.count, 100);
        assert_eq!(p.max, 100.0);
        assert!((p.p50 - 51.0).abs() <= 1.0);
    }
}
