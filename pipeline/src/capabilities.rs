//! What this version of sluice runs. A file can be valid (`sluice validate` accepts it) and use
//! what is not built yet, or combine built parts in a way that cannot run (a window nobody's
//! watermark closes). `sluice run` loads a file with [`crate::load_for_run`], which adds these
//! checks to validation: each problem is a located [`NOT_BUILT`](ErrorCode::NotBuilt) error,
//! so the run exits 2 before it creates anything.

use crate::errors::{Collector, ErrorCode};
use crate::model::{Flow, Mode, Pipeline, Source, TargetKind};
use crate::validate::MAX_IDENTIFIER_LEN;

/// The suffix of a window target's counts table (`<pipeline>__<target>__windows`).
const COUNTS_TABLE_SUFFIX: &str = "__windows";

/// Records every part of `p` this version cannot run.
pub(crate) fn check(p: &Pipeline, c: &mut Collector<'_>) {
    typed_tables(p, c);
    for (j, target) in p.targets.iter().enumerate() {
        if matches!(target.kind, TargetKind::View) && !p.views.iter().any(|v| v.name == target.name)
        {
            c.push(
                ErrorCode::MissingField,
                &format!("targets[{j}]"),
                format!(
                    "view `{}` has no flow writing it: its query is the `select:` and `where:` of \
                     the flow that writes it",
                    target.name
                ),
            );
        }
    }
    for (i, flow) in p.flows.iter().enumerate() {
        if let Source::Table { target } = &flow.source
            && p.targets
                .iter()
                .any(|t| t.name == *target && !t.keys.is_empty())
        {
            c.push(
                ErrorCode::NotBuilt,
                &format!("flows[{i}].source.table"),
                format!(
                    "`{target}` is a table of the latest change per key (`keys:`); a flow \
                     following its changes is not built yet"
                ),
            );
        }
        let target_path = format!("flows[{i}].target");
        let kind = p
            .targets
            .iter()
            .find(|t| t.name == flow.target)
            .map(|t| &t.kind);
        let window = matches!(kind, Some(TargetKind::Window { .. }));
        if let Source::Table { target } = &flow.source
            && window
        {
            // A window over a table copies nothing: the table's watermark closes its windows.
            window_over_table(p, c, i, flow, target);
        }
        match kind {
            Some(TargetKind::Table | TargetKind::ForeachBatch { .. } | TargetKind::View) => {}
            Some(TargetKind::Window { group_by, .. }) => {
                let watermarked = match &flow.source {
                    Source::PubSub(s) => s.watermark.is_some(),
                    Source::Table { .. } => true,
                    Source::File { .. } | Source::PipelineTable { .. } => false,
                };
                if !watermarked {
                    c.push(
                        ErrorCode::NotBuilt,
                        &target_path,
                        format!(
                            "flow {:?} writes window target {:?}, whose windows close when the \
                             flow's event-time watermark passes them; a window is fed by a \
                             Pub/Sub source with `watermark:`, or by a `table` source of this \
                             pipeline (closed by its writers' watermarks)",
                            flow.name, flow.target
                        ),
                    );
                }
                if TargetKind::group_attribute(group_by).is_none()
                    && TargetKind::group_column(group_by).is_none()
                {
                    c.push(
                        ErrorCode::NotBuilt,
                        &target_path,
                        format!(
                            "window target {:?} groups by {group_by:?}; `attribute:NAME` and \
                             (over a typed table) `column:NAME` exist",
                            flow.target
                        ),
                    );
                }
                let longest = MAX_IDENTIFIER_LEN - COUNTS_TABLE_SUFFIX.len();
                if flow.target.len() > longest {
                    c.push(
                        ErrorCode::NotBuilt,
                        &target_path,
                        format!(
                            "window target {:?} needs a counts table \
                             `<pipeline>__<target>{COUNTS_TABLE_SUFFIX}`, so its name may have \
                             at most {longest} bytes",
                            flow.target
                        ),
                    );
                }
                let writers = p.flows.iter().filter(|f| f.target == flow.target).count();
                if writers > 1 {
                    c.push(
                        ErrorCode::NotBuilt,
                        &target_path,
                        format!(
                            "window target {:?} has {writers} flows; a window target takes one \
                             flow, whose watermark closes its windows",
                            flow.target
                        ),
                    );
                }
            }
            Some(TargetKind::Sink { format, .. }) if format == "jsonl" => {}
            Some(TargetKind::Sink { format, .. }) => c.push(
                ErrorCode::NotBuilt,
                &target_path,
                format!(
                    "flow {:?} writes a sink of format {format:?}; only `jsonl` sinks exist",
                    flow.name
                ),
            ),
            // An unknown target is validation's error.
            None => {}
        }
    }
}

/// Whether `table` has a watermark: no file flow writes it without end, and each of its live
/// writers has one, a Pub/Sub flow with `watermark:` or a flow reading a table that has one
/// (which hands it down). `depth` stops a cycle, which validation reports anyway.
fn has_watermark(p: &Pipeline, table: &str, depth: usize) -> bool {
    depth <= p.flows.len()
        && p.unbounded_file_writers(table).is_empty()
        && p.live_writers(table).iter().all(|w| match &w.source {
            Source::PubSub(s) => s.watermark.is_some(),
            Source::Table { target } => has_watermark(p, target, depth + 1),
            Source::File { .. } | Source::PipelineTable { .. } => false,
        })
}

/// Why a window over `table` cannot run: a live writer of the table without a watermark (the
/// table would have none), or a `once` window flow that live writers would never let end.
fn window_over_table(p: &Pipeline, c: &mut Collector<'_>, i: usize, flow: &Flow, table: &str) {
    let source_path = format!("flows[{i}].source");
    let live = p.live_writers(table);
    for writer in live.iter().filter(|w| match &w.source {
        Source::PubSub(s) => s.watermark.is_none(),
        Source::Table { target } => !has_watermark(p, target, 0),
        Source::File { .. } | Source::PipelineTable { .. } => true,
    }) {
        c.push(
            ErrorCode::NotBuilt,
            &source_path,
            format!(
                "window flow {:?} reads table {table:?}, whose windows close when the watermark \
                 of every live writer has passed them; live writer {:?} has no watermark (a \
                 Pub/Sub flow needs `watermark:`, a flow reading a table one whose own writers \
                 have watermarks)",
                flow.name, writer.name
            ),
        );
    }
    let unbounded_file_writers: Vec<&str> = p
        .unbounded_file_writers(table)
        .iter()
        .map(|w| w.name.as_str())
        .collect();
    if !unbounded_file_writers.is_empty() {
        c.push(
            ErrorCode::NotBuilt,
            &source_path,
            format!(
                "window flow {:?} reads table {table:?}, which flows without `once: true` write \
                 from files in a continuous pipeline ({}); their rows have no watermark \
                 (make them `once: true`, so the window waits for them)",
                flow.name,
                unbounded_file_writers.join(", ")
            ),
        );
    }
    if flow.once && p.mode == Mode::Continuous && !live.is_empty() {
        c.push(
            ErrorCode::NotBuilt,
            &format!("flows[{i}].once"),
            format!(
                "window flow {:?} reads table {table:?}, which live flows write; it would never \
                 end (drop `once: true`)",
                flow.name
            ),
        );
    }
}

/// What typed tables do not do yet: typed rows from an envelope table or another pipeline's
/// table.
fn typed_tables(p: &Pipeline, c: &mut Collector<'_>) {
    let typed = |name: &str| {
        p.targets
            .iter()
            .any(|t| t.name == name && !t.columns.is_empty())
    };
    for (i, flow) in p.flows.iter().enumerate() {
        match &flow.source {
            Source::Table { target } if typed(&flow.target) && !typed(target) => c.push(
                ErrorCode::NotBuilt,
                &format!("flows[{i}].source"),
                format!(
                    "flow {:?} fills typed columns from table {target:?}, which has none; in \
                     this version typed rows come from decoded payloads and typed tables",
                    flow.name
                ),
            ),
            Source::PipelineTable { .. } if typed(&flow.target) => c.push(
                ErrorCode::NotBuilt,
                &format!("flows[{i}].source"),
                format!(
                    "flow {:?} fills typed columns from another pipeline's table; in this \
                     version a typed flow reads a typed table of its own pipeline",
                    flow.name
                ),
            ),
            _ => {}
        }
    }
}
