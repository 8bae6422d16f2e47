//! The flow graph of SPEC §6: which flow waits for which, and in what order flows can start.
//!
//! A [`FlowGraph`] has one node per flow and an edge from each predecessor to the flow that
//! waits for it. There are two kinds of edge ([`EdgeKind`]):
//!
//! - **`depends_on`**: the flow names the predecessor in its `depends_on`;
//! - **data**: the flow reads `source: { table: X }` and the predecessor writes `X` (its `target`
//!   is `X`); every writer of `X` is a predecessor, the reader itself included when it writes
//!   the table it reads.
//!
//! What this module guarantees:
//!
//! - **One edge per pair.** When a flow both names a predecessor in `depends_on` and reads the
//!   predecessor's target, the pair has a single edge, of kind [`EdgeKind::DependsOn`].
//! - **Deterministic.** Nodes, predecessors and successors are in file order; the topological
//!   order takes ready flows in file order; cycles and the renderings ([`render_text`],
//!   [`render_dot`], [`render_mermaid`]) follow file order too. The same file always gives the
//!   same output, byte for byte.
//! - **Built from any model.** [`FlowGraph::new`] accepts any [`Pipeline`], including one that
//!   has not passed validation (validation builds its graph that way): a `depends_on` entry that
//!   names no flow and a `source.table` that names no declared target give no edge; of flows
//!   sharing a name, the first one in the file is the one that name refers to.
//!
//! What the edges mean for scheduling ([`FlowGraph::waits_for`]):
//!
//! - **Triggered mode**: every flow reaches a terminal state in each run, so a flow starts only
//!   after every predecessor, of either kind, has completed.
//! - **Continuous mode**: a `depends_on` predecessor is always a `once` flow (validation reports
//!   `DEPENDS_ON_PREDECESSOR_MUST_BE_ONCE` otherwise) and is waited for. A data edge is waited
//!   for only when its writer is a `once` flow. A data edge whose writer is not `once` is ignored
//!   for scheduling: such a writer never completes, so the reader does not wait for it and reads
//!   the table while it grows.
//! - **Cycles**: validation rejects every cycle (`DEPENDS_ON_CYCLE`) in both modes, even one
//!   that goes through a data edge that continuous mode would not wait for. A flow that feeds,
//!   directly or not, the table it reads from is a feedback loop, and sluice does not run those.

mod render;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;

use crate::model::{Mode, Pipeline, Source, TargetKind};

pub use render::{render_dot, render_mermaid, render_text};

/// Why a flow waits for a predecessor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EdgeKind {
    /// The flow names the predecessor in `depends_on`.
    DependsOn,
    /// The flow reads (`source: { table: X }`) the target `X` that the predecessor writes.
    Data,
}

impl EdgeKind {
    /// `depends_on` or `data`, as the renderings print it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DependsOn => "depends_on",
            Self::Data => "data",
        }
    }
}

impl fmt::Display for EdgeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One flow, as the graph sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowNode {
    /// The flow's name.
    pub name: String,
    /// The name of the target it writes.
    pub target: String,
    /// `once: true`.
    pub once: bool,
    /// The kind of that target; `None` when no target of that name is declared.
    pub target_kind: Option<TargetKind>,
}

/// The flows of a pipeline and the edges between them (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct FlowGraph {
    pipeline: String,
    mode: Mode,
    nodes: Vec<FlowNode>,
    /// Name → index of the first flow with that name.
    index: HashMap<String, usize>,
    /// Per node: its predecessors with the edge kind, ascending by index.
    preds: Vec<Vec<(usize, EdgeKind)>>,
    /// Per node: its successors with the edge kind, ascending by index.
    succs: Vec<Vec<(usize, EdgeKind)>>,
}

impl FlowGraph {
    /// Builds the graph of `pipeline`, which need not be validated (see the module docs).
    pub fn new(pipeline: &Pipeline) -> Self {
        let mut index = HashMap::new();
        for (i, flow) in pipeline.flows.iter().enumerate() {
            if !flow.name.is_empty() {
                index.entry(flow.name.clone()).or_insert(i);
            }
        }
        let mut kinds: HashMap<&str, &TargetKind> = HashMap::new();
        for target in &pipeline.targets {
            if !target.name.is_empty() {
                kinds.entry(target.name.as_str()).or_insert(&target.kind);
            }
        }
        let nodes: Vec<FlowNode> = pipeline
            .flows
            .iter()
            .map(|flow| FlowNode {
                name: flow.name.clone(),
                target: flow.target.clone(),
                once: flow.once,
                target_kind: kinds.get(flow.target.as_str()).map(|k| (*k).clone()),
            })
            .collect();

        let mut preds = Vec::with_capacity(nodes.len());
        for flow in &pipeline.flows {
            let mut edges: BTreeMap<usize, EdgeKind> = BTreeMap::new();
            for dep in &flow.depends_on {
                if let Some(&at) = index.get(dep) {
                    edges.insert(at, EdgeKind::DependsOn);
                }
            }
            if let Source::Table { target } = &flow.source
                && kinds.contains_key(target.as_str())
            {
                for (at, writer) in pipeline.flows.iter().enumerate() {
                    if writer.target == *target {
                        edges.entry(at).or_insert(EdgeKind::Data);
                    }
                }
            }
            preds.push(edges.into_iter().collect::<Vec<_>>());
        }
        let mut succs = vec![Vec::new(); nodes.len()];
        for (at, list) in preds.iter().enumerate() {
            for &(pred, kind) in list {
                // `at` ascends, so each successor list ends up ascending too.
                succs[pred].push((at, kind));
            }
        }
        Self {
            pipeline: pipeline.name.clone(),
            mode: pipeline.mode,
            nodes,
            index,
            preds,
            succs,
        }
    }

    /// The pipeline's name.
    pub fn pipeline(&self) -> &str {
        &self.pipeline
    }

    /// The pipeline's mode, which decides what [`Self::waits_for`] returns.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Every flow, in file order.
    pub fn nodes(&self) -> &[FlowNode] {
        &self.nodes
    }

    /// The flow named `flow` (the first one, should several share the name).
    pub fn node(&self, flow: &str) -> Option<&FlowNode> {
        self.index.get(flow).map(|&at| &self.nodes[at])
    }

    /// The flows that `flow` waits for, in file order, one entry per predecessor (one both named
    /// in `depends_on` and writing the table `flow` reads is reported as
    /// [`EdgeKind::DependsOn`]). Empty for an unknown flow.
    pub fn predecessors(&self, flow: &str) -> Vec<(&str, EdgeKind)> {
        self.named(flow, &self.preds)
    }

    /// The flows that wait for `flow`, in file order, one entry per successor. Empty for an
    /// unknown flow.
    pub fn successors(&self, flow: &str) -> Vec<(&str, EdgeKind)> {
        self.named(flow, &self.succs)
    }

    /// The predecessors that must have completed before `flow` may start, in file order: all of
    /// them in triggered mode; in continuous mode the `depends_on` ones and the `once` writers
    /// of a table it reads (see the module docs). Empty for an unknown flow.
    pub fn waits_for(&self, flow: &str) -> Vec<&str> {
        self.predecessors(flow)
            .into_iter()
            .filter(|&(name, kind)| {
                self.mode == Mode::Triggered
                    || kind == EdgeKind::DependsOn
                    || self.node(name).is_some_and(|n| n.once)
            })
            .map(|(name, _)| name)
            .collect()
    }

    /// Every flow once, predecessors before successors; among flows that are ready at the same
    /// point, file order. A flow that can never be ready (it is on a cycle, or waits for one)
    /// comes after all the others, in file order: the result is a true topological order exactly
    /// when [`Self::find_cycle`] is `None`, which validation guarantees.
    pub fn topological_order(&self) -> Vec<&str> {
        self.order()
            .into_iter()
            .map(|at| self.nodes[at].name.as_str())
            .collect()
    }

    /// A cycle, if there is one: the first of [`Self::cycles`].
    pub fn find_cycle(&self) -> Option<Vec<String>> {
        self.cycles().into_iter().next()
    }

    /// Distinct cycles, each as a path `[a, b, ..., a]` in which every flow is a predecessor of
    /// the next one; a flow waiting for itself is `[a, a]`. Each path starts at its flow that
    /// comes first in the file, and the paths are sorted by file position.
    ///
    /// The list is empty exactly when the graph has no cycle. It is not every elementary cycle
    /// (there can be exponentially many) but one per back edge of a depth-first search in file
    /// order, so each cycle listed has an edge that no other listed cycle has, and removing
    /// those edges leaves the graph acyclic.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        self.cycle_paths()
            .into_iter()
            .map(|path| {
                path.into_iter()
                    .map(|at| self.nodes[at].name.clone())
                    .collect()
            })
            .collect()
    }

    /// [`Self::cycles`] as node indices.
    pub(crate) fn cycle_paths(&self) -> Vec<Vec<usize>> {
        #[derive(Clone, Copy, PartialEq, Eq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        let mut mark = vec![Mark::New; self.nodes.len()];
        let mut cycles: Vec<Vec<usize>> = Vec::new();
        for root in 0..self.nodes.len() {
            if mark[root] != Mark::New {
                continue;
            }
            mark[root] = Mark::Open;
            // The current path, each node with the position of its next successor to visit.
            let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
            while let Some(top) = stack.last_mut() {
                let (node, next) = *top;
                let Some(&(succ, _)) = self.succs[node].get(next) else {
                    mark[node] = Mark::Done;
                    stack.pop();
                    continue;
                };
                top.1 += 1;
                match mark[succ] {
                    Mark::New => {
                        mark[succ] = Mark::Open;
                        stack.push((succ, 0));
                    }
                    Mark::Open => {
                        let from = stack.iter().position(|&(n, _)| n == succ).unwrap_or(0);
                        let mut cycle: Vec<usize> = stack[from..].iter().map(|&(n, _)| n).collect();
                        let first = cycle
                            .iter()
                            .enumerate()
                            .min_by_key(|&(_, &n)| n)
                            .map_or(0, |(at, _)| at);
                        cycle.rotate_left(first);
                        cycle.push(cycle[0]);
                        cycles.push(cycle);
                    }
                    Mark::Done => {}
                }
            }
        }
        cycles.sort();
        cycles.dedup();
        cycles
    }

    /// The kind of the edge `pred → flow`, by index.
    pub(crate) fn edge_kind(&self, pred: usize, flow: usize) -> Option<EdgeKind> {
        self.preds
            .get(flow)?
            .iter()
            .find(|&&(p, _)| p == pred)
            .map(|&(_, kind)| kind)
    }

    /// [`Self::topological_order`] as node indices (Kahn's algorithm, ready flows by index).
    fn order(&self) -> Vec<usize> {
        let mut waiting: Vec<usize> = self.preds.iter().map(Vec::len).collect();
        let mut ready: BinaryHeap<Reverse<usize>> = waiting
            .iter()
            .enumerate()
            .filter(|&(_, &w)| w == 0)
            .map(|(at, _)| Reverse(at))
            .collect();
        let mut placed = vec![false; self.nodes.len()];
        let mut order = Vec::with_capacity(self.nodes.len());
        while let Some(Reverse(at)) = ready.pop() {
            placed[at] = true;
            order.push(at);
            for &(succ, _) in &self.succs[at] {
                waiting[succ] -= 1;
                if waiting[succ] == 0 {
                    ready.push(Reverse(succ));
                }
            }
        }
        order.extend((0..self.nodes.len()).filter(|&at| !placed[at]));
        order
    }

    fn named<'a>(
        &'a self,
        flow: &str,
        edges: &[Vec<(usize, EdgeKind)>],
    ) -> Vec<(&'a str, EdgeKind)> {
        let Some(&at) = self.index.get(flow) else {
            return Vec::new();
        };
        edges[at]
            .iter()
            .map(|&(other, kind)| (self.nodes[other].name.as_str(), kind))
            .collect()
    }
}
