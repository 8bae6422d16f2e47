//! A typed flow's expectations (`expect:`; Lakeflow's `expect`, `expect_or_drop`,
//! `expect_or_fail`): checks the store evaluates on each record of a batch before its commit
//! ([`sluice_store::LedgerStore::violations`]), and what a violation does.
//!
//! Guarantees:
//! - `warn`: the record lands; the violation is counted.
//! - `drop`: the record is a dead letter (reason `expectation:NAME`) instead of a row, in the
//!   same commit.
//! - `fail`: nothing of the batch is committed or acked (its messages stay in Pub/Sub); the
//!   flow stops FAILED with the record and the expectation named.
//! - `sluice_expectation_records_total{pipeline,flow,expectation,outcome}` (`passed`,
//!   `violated`) exists from the flow's start at 0 and counts each record whose key was new
//!   once, when its batch commits (a duplicate, or a retried commit, is not counted again).

use metrics::Counter;
use sluice_store::Effect;

/// The dead-letter reason of a record an expectation drops: `expectation:<name>`.
pub const EXPECTATION_REASON: &str = "expectation";

/// What a violation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnViolation {
    /// Count it; the record lands.
    Warn,
    /// The record becomes a dead letter.
    Drop,
    /// The flow stops FAILED; the batch is not acked.
    Fail,
}

/// One expectation of a flow, in the order of its query's checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// Its name (an identifier).
    pub name: String,
    /// What a violation does.
    pub on_violation: OnViolation,
}

/// A flow's expectations and their counters.
#[derive(Debug)]
pub struct Expectations {
    list: Vec<Expectation>,
    counters: Vec<(Counter, Counter)>,
}

impl Expectations {
    /// The expectations of flow `flow` of `pipeline`, their counters exported at 0.
    pub fn new(pipeline: &str, flow: &str, list: Vec<Expectation>) -> Self {
        let counters = list
            .iter()
            .map(|e| {
                let counter = |outcome: &'static str| {
                    let counter = metrics::counter!(
                        "sluice_expectation_records_total",
                        "pipeline" => pipeline.to_owned(),
                        "flow" => flow.to_owned(),
                        "expectation" => e.name.clone(),
                        "outcome" => outcome
                    );
                    counter.increment(0);
                    counter
                };
                (counter("passed"), counter("violated"))
            })
            .collect();
        Self { list, counters }
    }

    /// Applies the store's `violations` (per entry, per expectation) to the batch's `effects`:
    /// a dropped record becomes a dead letter; `Err` names the first record a `fail`
    /// expectation refuses (`message_ids[i]` is entry `i`'s id).
    pub(crate) fn apply(
        &self,
        violations: &[Vec<bool>],
        effects: &mut [Effect],
        message_ids: &[&str],
        attempts: &[u32],
    ) -> Result<(), String> {
        for (i, violated) in violations.iter().enumerate() {
            let broken = || {
                self.list
                    .iter()
                    .zip(violated)
                    .filter(|(_, v)| **v)
                    .map(|(e, _)| e)
            };
            if let Some(fail) = broken().find(|e| e.on_violation == OnViolation::Fail) {
                return Err(format!(
                    "expectation {} failed on message {}",
                    fail.name,
                    message_ids.get(i).copied().unwrap_or("?")
                ));
            }
            if let Some(drop) = broken().find(|e| e.on_violation == OnViolation::Drop)
                && let Some(effect) = effects.get_mut(i)
                && matches!(effect, Effect::Row { .. })
            {
                *effect = Effect::DeadLetter {
                    reason: format!("{EXPECTATION_REASON}:{}", drop.name),
                    error: format!("the record violates expectation {}", drop.name),
                    attempts: attempts.get(i).copied().unwrap_or(0) + 1,
                };
            }
        }
        Ok(())
    }

    /// Counts each committed record with a new key: passed or violated, per expectation.
    pub(crate) fn count(&self, violations: &[Vec<bool>], written: &[bool]) {
        for (violated, _) in violations.iter().zip(written).filter(|(_, w)| **w) {
            for ((passed, broken), v) in self.counters.iter().zip(violated) {
                if *v {
                    broken.increment(1);
                } else {
                    passed.increment(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expectations() -> Expectations {
        Expectations::new(
            "p",
            "f",
            vec![
                Expectation {
                    name: "positive".into(),
                    on_violation: OnViolation::Drop,
                },
                Expectation {
                    name: "sane".into(),
                    on_violation: OnViolation::Fail,
                },
            ],
        )
    }

    #[test]
    fn drop_makes_a_dead_letter_and_fail_names_the_record() {
        let mut effects = vec![Effect::row(1), Effect::row(2)];
        let ok = expectations().apply(
            &[vec![false, false], vec![true, false]],
            &mut effects,
            &["a", "b"],
            &[0, 0],
        );
        assert_eq!(ok, Ok(()));
        assert_eq!(effects[0], Effect::row(1));
        assert!(matches!(&effects[1], Effect::DeadLetter { reason, .. }
            if reason == "expectation:positive"));
        let failed = expectations().apply(
            &[vec![false, false], vec![true, true]],
            &mut [Effect::row(1), Effect::row(2)],
            &["a", "b"],
            &[0, 0],
        );
        assert_eq!(
            failed,
            Err("expectation sane failed on message b".to_owned())
        );
    }
}
