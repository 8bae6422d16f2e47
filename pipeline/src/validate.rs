//! Checks that relate parts of the file to each other: identifiers, unique names, references
//! from flows to targets and flows, and what the mode allows (SPEC §5, §6).
//!
//! The flow-graph checks (on the [`FlowGraph`] of the converted pipeline) guarantee that a
//! valid pipeline has:
//!
//! - no cycle of `depends_on` and data edges, a flow depending on itself included
//!   (`DEPENDS_ON_CYCLE`, one error per cycle found, printing it as `a -> b -> a` where each
//!   flow waits for the one before it, located at the `depends_on` entry, or the
//!   `source.table`, through which the cycle's first flow in the file waits);
//! - in continuous mode, only `once` flows as `depends_on` predecessors
//!   (`DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE`) and none that writes to a `foreach_batch` target
//!   (`FOREACH_BATCH_PREDECESSOR`); triggered mode allows both;
//! - no `depends_on` predecessor that writes to a `view` (`DEPENDS_ON_PREDECESSOR_WRITES_TO_VIEW`);
//! - no `once` flow writing to a `foreach_batch` target (`FOREACH_BATCH_CANNOT_BE_ONCE`).
//!
//! And no two flows reading one Pub/Sub subscription (`SUBSCRIPTION_SHARED`): each flow has its
//! own dedup ledger, so a redelivery that crossed from one flow to the other would land twice;
//! and no named tracking subscription that a flow reads its data from (`INVALID_VALUE`): the
//! tracking reader acks what it reads.
//!
//! Predecessor errors are located at the `depends_on` entry that names the predecessor. A
//! reference already reported as unknown (`UNKNOWN_FLOW`, `UNKNOWN_TARGET`) takes part in no
//! graph check, a predecessor named twice by one flow is checked once, and a flow depending on
//! itself gets only the cycle error.

use std::collections::{HashMap, HashSet};

use crate::errors::{Collector, ErrorCode};
use crate::graph::{EdgeKind, FlowGraph};
use crate::model::{Mode, Pipeline, Source, TargetKind, TrackingSubscription};

/// Longest identifier, in bytes (table names are `<pipeline>__<target>`).
pub const MAX_IDENTIFIER_LEN: usize = 48;

/// Whether `name` is a valid identifier: `[a-z_][a-z0-9_]*`, at most
/// [`MAX_IDENTIFIER_LEN`] bytes.
pub fn is_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    let Some(first) = bytes.next() else {
        return false;
    };
    name.len() <= MAX_IDENTIFIER_LEN
        && (first.is_ascii_lowercase() || first == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// Runs every cross-reference check on a converted pipeline.
pub(crate) fn validate(p: &Pipeline, c: &mut Collector<'_>) {
    identifier(c, &p.name, "pipeline");
    if p.schedule.as_ref().is_some_and(|s| s.on_update)
        && !p
            .flows
            .iter()
            .any(|f| matches!(f.source, Source::PipelineTable { .. }))
    {
        c.push(
            ErrorCode::InvalidSchedule,
            "schedule.on_update",
            "`on_update` runs the pipeline when another pipeline's table it reads grows, and no \
             flow reads one (`source: { table: PIPELINE.TARGET }`)",
        );
    }
    crate::update_condition::check_tables(p, c);
    if p.schedule.is_some() && p.mode == Mode::Continuous {
        c.push(
            ErrorCode::InvalidSchedule,
            "schedule",
            "a schedule is only allowed with `mode: triggered`",
        );
    }

    let targets = unique_names(
        c,
        p.targets.iter().map(|t| t.name.as_str()),
        "targets",
        "target",
    );
    let flows = unique_names(c, p.flows.iter().map(|f| f.name.as_str()), "flows", "flow");

    for (i, flow) in p.flows.iter().enumerate() {
        if !flow.target.is_empty() && !targets.contains_key(flow.target.as_str()) {
            c.push(
                ErrorCode::UnknownTarget,
                &format!("flows[{i}].target"),
                format!("no target named `{}`{}", flow.target, known(&targets)),
            );
        }
        if let Source::Table { target } = &flow.source
            && !target.is_empty()
            && !targets.contains_key(target.as_str())
        {
            c.push(
                ErrorCode::UnknownTarget,
                &format!("flows[{i}].source.table"),
                format!("no target named `{target}`{}", known(&targets)),
            );
        }
        if let Source::PipelineTable { pipeline, target } = &flow.source {
            let path = format!("flows[{i}].source.table");
            if pipeline == &p.name {
                c.push(
                    ErrorCode::InvalidValue,
                    &path,
                    format!("`{pipeline}.{target}` is this pipeline's own table: write `{target}`"),
                );
            } else if !is_identifier(pipeline) || !is_identifier(target) {
                c.push(
                    ErrorCode::InvalidIdentifier,
                    &path,
                    format!(
                        "`{pipeline}.{target}`: another pipeline's table is PIPELINE.TARGET, two \
                         identifiers ([a-z_][a-z0-9_]*, at most {MAX_IDENTIFIER_LEN} bytes)"
                    ),
                );
            }
        }
        for (j, dep) in flow.depends_on.iter().enumerate() {
            if flows.contains_key(dep.as_str()) {
                continue;
            }
            let path = depends_on_path(c, i, j);
            c.push(
                ErrorCode::UnknownFlow,
                &path,
                format!("no flow named `{dep}`{}", known(&flows)),
            );
        }
    }

    shared_subscriptions(p, c);
    crate::aggregates::check_windows(p, c);
    flow_graph(p, c, &flows);
}

/// `SUBSCRIPTION_SHARED`: two flows reading one subscription would each get some of its
/// messages, and a redelivery that reaches the other flow lands twice (each flow has its own
/// dedup ledger). Reported at the later flow's `subscription`.
fn shared_subscriptions(p: &Pipeline, c: &mut Collector<'_>) {
    let mut readers: Vec<(SubscriptionId<'_>, &str)> = Vec::new();
    for (i, flow) in p.flows.iter().enumerate() {
        let Source::PubSub(source) = &flow.source else {
            continue;
        };
        let id = SubscriptionId::of(&source.subscription, p.pubsub.project.as_deref());
        if let Some((_, first)) = readers.iter().find(|(other, _)| other.same_as(&id)) {
            c.push(
                ErrorCode::SubscriptionShared,
                &format!("flows[{i}].source.pubsub.subscription"),
                format!(
                    "flows `{first}` and `{}` both read subscription `{}`: a redelivery could \
                     land in both, since each flow has its own dedup ledger; give each flow its \
                     own subscription",
                    flow.name,
                    id.shown()
                ),
            );
        } else {
            readers.push((id, &flow.name));
        }
    }
    // The tracking reader acks everything it reads: a tracking subscription that some flow
    // reads its data from would have that data acked, never ingested.
    for (i, flow) in p.flows.iter().enumerate() {
        let Source::PubSub(source) = &flow.source else {
            continue;
        };
        let Some(TrackingSubscription::Named(tracking)) =
            source.watermark.as_ref().map(|w| &w.tracking_subscription)
        else {
            continue;
        };
        let id = SubscriptionId::of(tracking, p.pubsub.project.as_deref());
        if let Some((_, reader)) = readers.iter().find(|(data, _)| data.same_as(&id)) {
            c.push(
                ErrorCode::InvalidValue,
                &format!("flows[{i}].source.pubsub.watermark.tracking_subscription"),
                format!(
                    "`{tracking}` is the subscription flow `{reader}` reads its data from; the \
                     tracking reader acks every message it reads, so that data would never be \
                     ingested: name a subscription of its own on the same topic, or `auto`"
                ),
            );
        }
    }
}

/// A subscription as a flow names it: a full path, or a short name in the pipeline's project
/// (unknown when the project comes from the environment).
struct SubscriptionId<'a> {
    project: Option<&'a str>,
    name: &'a str,
}

impl<'a> SubscriptionId<'a> {
    fn of(subscription: &'a str, project: Option<&'a str>) -> Self {
        let mut parts = subscription.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("projects"), Some(given), Some("subscriptions"), Some(name)) => Self {
                project: Some(given),
                name,
            },
            _ => Self {
                project,
                name: subscription,
            },
        }
    }

    /// Whether both name the same subscription (an unknown project matches any).
    fn same_as(&self, other: &Self) -> bool {
        self.name == other.name
            && match (self.project, other.project) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    fn shown(&self) -> String {
        match self.project {
            Some(project) => format!("projects/{project}/subscriptions/{}", self.name),
            None => self.name.to_owned(),
        }
    }
}

/// The flow-graph checks of the module docs; `flows` maps each flow name to its first index.
fn flow_graph(p: &Pipeline, c: &mut Collector<'_>, flows: &HashMap<&str, usize>) {
    let graph = FlowGraph::new(p);
    let continuous = p.mode == Mode::Continuous;

    for cycle in graph.cycle_paths() {
        // A cycle path is `[first, ..., before, first]`: `first` waits for `before`.
        let (Some(&first), Some(&before)) = (cycle.first(), cycle.iter().rev().nth(1)) else {
            continue;
        };
        let shown: Vec<&str> = cycle.iter().map(|&at| p.flows[at].name.as_str()).collect();
        let waits_on = &p.flows[before].name;
        let path = match graph.edge_kind(before, first) {
            Some(EdgeKind::Data) => format!("flows[{first}].source.table"),
            _ => match p.flows[first].depends_on.iter().position(|d| d == waits_on) {
                Some(j) => depends_on_path(c, first, j),
                None => format!("flows[{first}].depends_on"),
            },
        };
        c.push(
            ErrorCode::DependsOnCycle,
            &path,
            format!(
                "cycle {}: each flow waits for the one before it (by `depends_on` or by \
                 reading its target); remove one of these edges",
                shown.join(" -> ")
            ),
        );
    }

    for (i, flow) in p.flows.iter().enumerate() {
        let kind = graph.nodes()[i].target_kind.as_ref();
        if flow.once && matches!(kind, Some(TargetKind::ForeachBatch { .. })) {
            c.push(
                ErrorCode::ForeachBatchCannotBeOnce,
                &format!("flows[{i}].once"),
                format!(
                    "`{}` writes to `{}`, a foreach_batch target, which takes the micro-batches \
                     of a running stream: such a flow cannot be `once`",
                    flow.name, flow.target
                ),
            );
        }
        let mut checked = HashSet::new();
        for (j, dep) in flow.depends_on.iter().enumerate() {
            // Unknown names were reported above; a self-dependency is reported as a cycle.
            let Some(&at) = flows.get(dep.as_str()) else {
                continue;
            };
            if at == i || !checked.insert(at) {
                continue;
            }
            predecessor(c, &graph, continuous, &depends_on_path(c, i, j), at);
        }
    }
}

/// Checks the flow at index `at` as a `depends_on` predecessor named at `path`.
fn predecessor(c: &mut Collector<'_>, graph: &FlowGraph, continuous: bool, path: &str, at: usize) {
    let pred = &graph.nodes()[at];
    if continuous && !pred.once {
        c.push(
            ErrorCode::DependsOnPredecessorMustBeOnce,
            path,
            format!(
                "predecessor `{}` is not a `once` flow: in a continuous pipeline it never \
                 completes, so a predecessor must have `once: true` (`mode: triggered` allows \
                 any flow as a predecessor)",
                pred.name
            ),
        );
    }
    match pred.target_kind {
        Some(TargetKind::View) => c.push(
            ErrorCode::DependsOnPredecessorWritesToView,
            path,
            format!(
                "predecessor `{}` writes to `{}`, a view: a view stores nothing, so there is no \
                 completed output to wait for; depend on a flow that writes a table",
                pred.name, pred.target
            ),
        ),
        Some(TargetKind::ForeachBatch { .. }) if continuous => c.push(
            ErrorCode::ForeachBatchPredecessor,
            path,
            format!(
                "predecessor `{}` writes to `{}`, a foreach_batch target: in a continuous \
                 pipeline such a flow cannot be a predecessor (`mode: triggered` allows it)",
                pred.name, pred.target
            ),
        ),
        _ => {}
    }
}

/// The path of `depends_on` entry `j` of flow `i`: `depends_on: x` has no index,
/// `depends_on: [x, y]` does.
fn depends_on_path(c: &Collector<'_>, i: usize, j: usize) -> String {
    let item = format!("flows[{i}].depends_on[{j}]");
    if c.locator().contains(&item) {
        item
    } else {
        format!("flows[{i}].depends_on")
    }
}

fn identifier(c: &mut Collector<'_>, name: &str, path: &str) {
    // An empty name was already reported as missing.
    if !name.is_empty() && !is_identifier(name) {
        c.push(
            ErrorCode::InvalidIdentifier,
            path,
            format!(
                "`{name}` is not an identifier: use [a-z_][a-z0-9_]*, at most \
                 {MAX_IDENTIFIER_LEN} bytes"
            ),
        );
    }
}

/// Checks each name of one list (`targets` or `flows`) and returns name → first index.
fn unique_names<'a>(
    c: &mut Collector<'_>,
    names: impl Iterator<Item = &'a str>,
    list: &str,
    what: &str,
) -> HashMap<&'a str, usize> {
    let mut seen: HashMap<&'a str, usize> = HashMap::new();
    for (i, name) in names.enumerate() {
        let path = format!("{list}[{i}].name");
        identifier(c, name, &path);
        if name.is_empty() {
            continue;
        }
        if let Some(first) = seen.get(name) {
            let line = c
                .locator()
                .locate(&format!("{list}[{first}].name"))
                .map(|s| format!(" (line {})", s.line))
                .unwrap_or_default();
            c.push(
                ErrorCode::DuplicateName,
                &path,
                format!("{what} `{name}` is already declared at {list}[{first}]{line}"),
            );
        } else {
            seen.insert(name, i);
        }
    }
    seen
}

/// ` (declared: a, b)` for a helpful message, or nothing when there is nothing declared.
fn known(names: &HashMap<&str, usize>) -> String {
    if names.is_empty() {
        return " (none is declared)".to_owned();
    }
    let mut list: Vec<(&str, usize)> = names.iter().map(|(n, i)| (*n, *i)).collect();
    list.sort_by_key(|(_, i)| *i);
    let list: Vec<&str> = list.into_iter().map(|(n, _)| n).collect();
    format!(" (declared: {})", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        assert!(is_identifier("orders"));
        assert!(is_identifier("_x9"));
        assert!(is_identifier(&"a".repeat(48)));
        assert!(!is_identifier(&"a".repeat(49)));
        assert!(!is_identifier(""));
        assert!(!is_identifier("9a"));
        assert!(!is_identifier("Orders"));
        assert!(!is_identifier("events-live"));
        assert!(!is_identifier("naïve"));
    }
}
