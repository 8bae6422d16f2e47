//! Drawings of a [`FlowGraph`]: plain text, Graphviz DOT and Mermaid (`sluice graph --format`).
//!
//! What these functions guarantee:
//!
//! - **Deterministic.** Text lists flows in [`FlowGraph::topological_order`]; DOT and Mermaid
//!   list nodes in file order, then edges grouped by the waiting flow in file order, each group
//!   in file order of the predecessors. Equal inputs give byte-identical output.
//! - **Every edge once**, with its kind: `depends_on` edges solid (`-->` in Mermaid), data edges
//!   dashed and labelled `data` (`-.data.->` in Mermaid). Arrows point from the predecessor to
//!   the flow that waits for it; in text, `<-` lists a flow's predecessors.
//! - **`once` flows look different**: `once` instead of `continuous` in the text and in labels,
//!   an ellipse in DOT, a stadium in Mermaid (other flows are boxes).
//! - **States are shown when given.** `states` maps a flow name to its state (`RUNNING`, ...);
//!   flows missing from it are drawn without one.
//! - **Well-formed whatever the strings.** Names, targets and states are escaped for each format
//!   (quotes, backslashes, `#`, `<`, `&`, ...), and control characters become spaces, so a
//!   state can neither break a diagram nor split a text line. Mermaid node ids are `f0`, `f1`, ...
//!   (file positions), never flow names, since words like `end` are reserved there.

use std::collections::HashMap;

use super::{EdgeKind, FlowGraph, FlowNode};

/// One line per flow, in topological order:
/// `live [continuous -> events] <- backfill (depends_on): RUNNING`.
///
/// The bracket gives `once` or `continuous` and the target; `<- ...` lists the predecessors with
/// their edge kind (left out when there is none); `: STATE` is appended when `states` has one.
pub fn render_text(graph: &FlowGraph, states: &HashMap<String, String>) -> String {
    let mut out = String::new();
    for at in graph.order() {
        let node = &graph.nodes[at];
        out.push_str(&format!(
            "{} [{} -> {}]",
            plain(&node.name),
            flavour(node),
            plain(&node.target)
        ));
        let preds: Vec<String> = graph.preds[at]
            .iter()
            .map(|&(pred, kind)| format!("{} ({kind})", plain(&graph.nodes[pred].name)))
            .collect();
        if !preds.is_empty() {
            out.push_str(&format!(" <- {}", preds.join(", ")));
        }
        if let Some(state) = states.get(&node.name) {
            out.push_str(&format!(": {}", plain(state)));
        }
        out.push('\n');
    }
    out
}

/// A Graphviz `digraph` named after the pipeline, left to right.
///
/// Each flow is a node whose label has the flow's name, `once`/`continuous -> TARGET` and the
/// state when `states` has one; `once` flows are ellipses, the others boxes. `depends_on` edges
/// are solid, data edges dashed with the label `data`.
pub fn render_dot(graph: &FlowGraph, states: &HashMap<String, String>) -> String {
    let mut out = format!("digraph {} {{\n", dot_quoted(graph.pipeline()));
    out.push_str("  rankdir=LR;\n  node [shape=box];\n");
    for node in &graph.nodes {
        out.push_str(&format!(
            "  {} [label={}",
            dot_quoted(&node.name),
            dot_quoted(&label(node, states, plain, "\n"))
        ));
        if node.once {
            out.push_str(", shape=ellipse");
        }
        out.push_str("];\n");
    }
    for (at, node) in graph.nodes.iter().enumerate() {
        for &(pred, kind) in &graph.preds[at] {
            out.push_str(&format!(
                "  {} -> {}",
                dot_quoted(&graph.nodes[pred].name),
                dot_quoted(&node.name)
            ));
            if kind == EdgeKind::Data {
                out.push_str(" [style=dashed, label=\"data\"]");
            }
            out.push_str(";\n");
        }
    }
    out.push_str("}\n");
    out
}

/// A Mermaid `flowchart LR`.
///
/// Nodes are `f0`, `f1`, ... in file order, labelled with the flow's name,
/// `once`/`continuous -> TARGET` and the state when `states` has one; `once` flows are stadiums
/// (`f0(["..."])`), the others boxes (`f1["..."]`). `depends_on` edges are `-->`, data edges
/// `-.data.->`.
pub fn render_mermaid(graph: &FlowGraph, states: &HashMap<String, String>) -> String {
    let mut out = String::from("flowchart LR\n");
    for (at, node) in graph.nodes.iter().enumerate() {
        let text = label(node, states, mermaid_escaped, "<br/>");
        if node.once {
            out.push_str(&format!("  f{at}([\"{text}\"])\n"));
        } else {
            out.push_str(&format!("  f{at}[\"{text}\"]\n"));
        }
    }
    for at in 0..graph.nodes.len() {
        for &(pred, kind) in &graph.preds[at] {
            let arrow = match kind {
                EdgeKind::DependsOn => "-->",
                EdgeKind::Data => "-.data.->",
            };
            out.push_str(&format!("  f{pred} {arrow} f{at}\n"));
        }
    }
    out
}

/// `once` or `continuous`.
fn flavour(node: &FlowNode) -> &'static str {
    if node.once { "once" } else { "continuous" }
}

/// The label of a node: its name, `once`/`continuous -> TARGET` and its state if known, each
/// string passed through `escape`, the lines joined by `newline`.
fn label(
    node: &FlowNode,
    states: &HashMap<String, String>,
    escape: fn(&str) -> String,
    newline: &str,
) -> String {
    let mut lines = vec![
        escape(&node.name),
        format!("{} -> {}", flavour(node), escape(&node.target)),
    ];
    if let Some(state) = states.get(&node.name) {
        lines.push(escape(state));
    }
    lines.join(newline)
}

/// `text` with control characters (line breaks included) replaced by spaces.
fn plain(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A DOT double-quoted string; `\n` in `text` becomes DOT's centred line break.
fn dot_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Text for inside a quoted Mermaid label: characters that Mermaid or HTML would interpret are
/// written as Mermaid entity codes (`"` as `#34;`), control characters as spaces.
fn mermaid_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' | '#' | '&' | '<' | '>' | '`' => out.push_str(&format!("#{};", u32::from(c))),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Flow, Mode, Pipeline, PubSubSettings, Source, Target, TargetKind};

    /// `c` and `a` (once) write `t`; `b` depends on `a`, reads `t` and writes `u`.
    fn graph() -> FlowGraph {
        let flow = |name: &str, target: &str, once, depends_on: &[&str], source| Flow {
            name: name.into(),
            target: target.into(),
            once,
            depends_on: depends_on.iter().map(|d| (*d).to_owned()).collect(),
            source,
            query: Default::default(),
        };
        let file = || Source::File {
            path: "x".into(),
            max_record_bytes: 1,
        };
        let table = || Source::Table { target: "t".into() };
        FlowGraph::new(&Pipeline {
            name: "p".into(),
            mode: Mode::Triggered,
            store: "sqlite://p.db".into(),
            pubsub: PubSubSettings::default(),
            metrics_listen: None,
            control_listen: None,
            control_token_file: None,
            dead_letter_topic: None,
            schedule: None,
            give_up_after: None,
            targets: ["t", "u"]
                .into_iter()
                .map(|name| Target {
                    name: name.into(),
                    kind: TargetKind::Table,
                    columns: Vec::new(),
                    columns_follow_schema: false,
                    keys: Vec::new(),
                })
                .collect(),
            flows: vec![
                flow("c", "t", false, &[], file()),
                flow("b", "u", false, &["a"], table()),
                flow("a", "t", true, &[], file()),
            ],
            views: Vec::new(),
        })
    }

    fn states(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn text_is_in_topological_order_with_one_entry_per_predecessor() {
        let text = render_text(&graph(), &states(&[("b", "RUNNING"), ("zz", "X")]));
        assert_eq!(
            text,
            "c [continuous -> t]\n\
             a [once -> t]\n\
             b [continuous -> u] <- c (data), a (depends_on): RUNNING\n"
        );
    }

    #[test]
    fn states_cannot_break_a_line_or_a_diagram() {
        let weird = states(&[("a", "say \"hi\"\\n\r\n<b>#1 & `x`")]);
        let text = render_text(&graph(), &weird);
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.contains("a [once -> t]: say \"hi\"\\n  <b>#1 & `x`\n"));

        let dot = render_dot(&graph(), &weird);
        assert!(
            dot.contains(
                "  \"a\" [label=\"a\\nonce -> t\\nsay \\\"hi\\\"\\\\n  <b>#1 & `x`\", \
                 shape=ellipse];\n"
            ),
            "{dot}"
        );

        let mermaid = render_mermaid(&graph(), &weird);
        assert!(
            mermaid.contains(
                "  f2([\"a<br/>once -> t<br/>say #34;hi#34;\\n  #60;b#62;#35;1 #38; #96;x#96;\"])\n"
            ),
            "{mermaid}"
        );
    }

    #[test]
    fn diagrams_list_nodes_then_edges_in_file_order() {
        let g = graph();
        let none = HashMap::new();
        assert_eq!(
            render_dot(&g, &none),
            "digraph \"p\" {\n  rankdir=LR;\n  node [shape=box];\n\
             \x20 \"c\" [label=\"c\\ncontinuous -> t\"];\n\
             \x20 \"b\" [label=\"b\\ncontinuous -> u\"];\n\
             \x20 \"a\" [label=\"a\\nonce -> t\", shape=ellipse];\n\
             \x20 \"c\" -> \"b\" [style=dashed, label=\"data\"];\n\
             \x20 \"a\" -> \"b\";\n\
             }\n"
        );
        assert_eq!(
            render_mermaid(&g, &none),
            "flowchart LR\n\
             \x20 f0[\"c<br/>continuous -> t\"]\n\
             \x20 f1[\"b<br/>continuous -> u\"]\n\
             \x20 f2([\"a<br/>once -> t\"])\n\
             \x20 f0 -.data.-> f1\n\
             \x20 f2 --> f1\n"
        );
    }
}
