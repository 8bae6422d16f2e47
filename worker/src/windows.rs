//! `window` targets: event-time tumbling window counts per group, emitted beside the flow that
//! feeds them.
//!
//! The flow writes its messages to the target's base table (`<pipeline>__<target>`, like any
//! table target). Every worker running the flow emits, each [`EMIT_INTERVAL`], the windows whose
//! end plus `allowed_lateness` the flow's watermark has passed, into
//! `<pipeline>__<target>__windows` ([`sluice_store::Store::emit_windows`]: computed from the
//! committed rows, one transaction, each count row written once whichever replica emits).
//!
//! Why the counts are complete: the watermark never passes an uncommitted message whose event
//! time is within the band (SPEC §2.4), so when it has passed a window's end every such message
//! of the window is in the base table. A message that comes later anyway is *late*: it is kept
//! in the base table and counted in `sluice_messages_late_total`, and the window's count stays
//! as emitted.

use sluice_connector::FlowWatermark;
use sluice_pipeline::{Flow, Pipeline, TargetKind};
use sluice_store::{FlowHandle, Store, WindowEmission, table_name, window_table_name};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often windows are emitted.
pub const EMIT_INTERVAL: Duration = Duration::from_secs(1);

/// The attribute of `group_by: attribute:NAME`; `None` for any other form.
pub fn group_attribute(group_by: &str) -> Option<&str> {
    group_by
        .strip_prefix("attribute:")
        .map(str::trim)
        .filter(|name| !name.is_empty())
}

/// What a flow writing a window target needs to emit it.
#[derive(Debug, Clone)]
pub struct WindowPlan {
    emission: WindowEmission,
    lateness_ms: i64,
    watermark: FlowWatermark,
}

/// The plan of `flow`'s windows, if its target is a `window` (whose checks `flows::unsupported`
/// made).
pub fn plan(pipeline: &Pipeline, flow: &Flow, watermark: &FlowWatermark) -> Option<WindowPlan> {
    let target = pipeline.targets.iter().find(|t| t.name == flow.target)?;
    let TargetKind::Window {
        size,
        group_by,
        allowed_lateness,
    } = &target.kind
    else {
        return None;
    };
    let millis = |d: &Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    Some(WindowPlan {
        emission: WindowEmission {
            base_table: table_name(&pipeline.name, &target.name).ok()?,
            windows_table: window_table_name(&pipeline.name, &target.name).ok()?,
            size_ms: millis(size).max(1),
            group_attribute: group_attribute(group_by)?.to_owned(),
            before_ms: i64::MIN,
        },
        lateness_ms: millis(allowed_lateness),
        watermark: watermark.clone(),
    })
}

/// A running emitter.
pub struct RunningEmitter {
    stop: CancellationToken,
    /// Set before `stop` when the flow's input has ended (a once flow drained).
    input_ended: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl RunningEmitter {
    /// Stops it after the flow's run ended, with a last emission. `input_ended`: the flow read
    /// all its input (a once flow that drained), so every window is complete and is emitted,
    /// as at the end of a bounded input; otherwise the watermark decides as before.
    pub async fn finish(self, input_ended: bool) {
        self.input_ended.store(input_ended, Ordering::Release);
        self.stop.cancel();
        if let Err(error) = self.task.await {
            tracing::error!(%error, "the window emitter failed");
        }
    }
}

/// Creates the counts table and starts emitting.
pub async fn start(
    plan: WindowPlan,
    store: Arc<dyn Store>,
    flow: FlowHandle,
) -> Result<RunningEmitter, String> {
    store
        .prepare_window_table(&plan.emission.windows_table)
        .await
        .map_err(|e| format!("cannot create {}: {e}", plan.emission.windows_table))?;
    let stop = CancellationToken::new();
    let input_ended = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(emit_until(
        plan,
        store,
        flow,
        stop.clone(),
        input_ended.clone(),
    ));
    Ok(RunningEmitter {
        stop,
        input_ended,
        task,
    })
}

async fn emit_until(
    plan: WindowPlan,
    store: Arc<dyn Store>,
    flow: FlowHandle,
    stop: CancellationToken,
    input_ended: Arc<AtomicBool>,
) {
    let mut ticks = tokio::time::interval(EMIT_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut emitted_before = i64::MIN;
    let mut failing = false;
    loop {
        let stopping = tokio::select! {
            _ = ticks.tick() => false,
            _ = stop.cancelled() => true,
        };
        let due = if stopping && input_ended.load(Ordering::Acquire) {
            Some(i64::MAX)
        } else {
            plan.watermark
                .current()
                .map(|w| w.saturating_sub(plan.lateness_ms))
        };
        if let Some(before_ms) = due
            && before_ms >= emitted_before.saturating_add(plan.emission.size_ms)
        {
            let emission = WindowEmission {
                before_ms,
                ..plan.emission.clone()
            };
            match store.emit_windows(&flow, &emission).await {
                Ok(emitted) => {
                    if emitted.rows > 0 {
                        tracing::info!(flow = %flow.name, rows = emitted.rows,
                            before_ms = emitted.emitted_before_ms, "windows emitted");
                    }
                    if failing {
                        tracing::info!(flow = %flow.name, "emitting windows again");
                    }
                    emitted_before = emitted.emitted_before_ms;
                    failing = false;
                }
                Err(error) if !failing => {
                    tracing::warn!(flow = %flow.name, %error,
                        "cannot emit windows; retrying every second");
                    failing = true;
                }
                Err(_) => {}
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_an_attribute_only() {
        assert_eq!(group_attribute("attribute:region"), Some("region"));
        assert_eq!(
            group_attribute("attribute: geo.region "),
            Some("geo.region")
        );
        assert_eq!(group_attribute("attribute:"), None);
        assert_eq!(group_attribute("region"), None);
    }
}
