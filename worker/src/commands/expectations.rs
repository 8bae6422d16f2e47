//! `sluice status`'s expectations: for each typed flow with `expect:`, how many records met and
//! violated each expectation, as the store counted them in the commits' transactions (each
//! record with a new key once, whichever worker committed it, across restarts).

use super::text::table;
use crate::runtime::updates::prepare;
use sluice_pipeline::{OnViolation, Pipeline};
use sluice_store::Store;

/// The table and the JSON of the pipeline's expectation counts; `None` when no flow has any.
pub async fn summary(
    pipeline: &Pipeline,
    store: &dyn Store,
) -> Result<Option<(String, serde_json::Value)>, sluice_store::StoreError> {
    if pipeline
        .flows
        .iter()
        .all(|f| f.query.expectations.is_empty())
    {
        return Ok(None);
    }
    let handles = store.prepare(&prepare::layout(pipeline)).await?;
    let mut rows = Vec::new();
    let mut json = Vec::new();
    for (flow, handle) in pipeline.flows.iter().zip(&handles) {
        if flow.query.expectations.is_empty() {
            continue;
        }
        let counts = store.expectation_counts(handle).await?;
        for expectation in &flow.query.expectations {
            let (passed, violated) = counts
                .iter()
                .find(|c| c.expectation == expectation.name)
                .map_or((0, 0), |c| (c.passed, c.violated));
            let on_violation = match expectation.on_violation {
                OnViolation::Warn => "warn",
                OnViolation::Drop => "drop",
                OnViolation::Fail => "fail",
            };
            rows.push(vec![
                flow.name.clone(),
                expectation.name.clone(),
                on_violation.to_owned(),
                passed.to_string(),
                violated.to_string(),
            ]);
            json.push(serde_json::json!({
                "flow": flow.name, "expectation": expectation.name,
                "on_violation": on_violation, "passed": passed, "violated": violated,
            }));
        }
    }
    let text = format!(
        "expectations\n{}",
        table(
            &["FLOW", "EXPECTATION", "ON VIOLATION", "PASSED", "VIOLATED"],
            &rows
        )
    );
    Ok(Some((text, serde_json::Value::Array(json))))
}
