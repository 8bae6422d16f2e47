//! The flow graph's unit tests: edges of both kinds in file order, a stable topological order,
//! what continuous mode waits for, cycles (their start, self and data cycles, a long chain
//! without recursion) and references that resolve to nothing.

use super::*;
use crate::model::{Flow, PubSubSettings, Target};

fn flow(name: &str, target: &str, once: bool, depends_on: &[&str], source: Source) -> Flow {
    Flow {
        name: name.into(),
        target: target.into(),
        once,
        depends_on: depends_on.iter().map(|d| (*d).to_owned()).collect(),
        source,
        query: Default::default(),
    }
}

fn file() -> Source {
    Source::File {
        path: "in/*.jsonl".into(),
        max_record_bytes: 1,
    }
}

fn table(target: &str) -> Source {
    Source::Table {
        target: target.into(),
    }
}

fn pipeline(mode: Mode, flows: Vec<Flow>) -> Pipeline {
    let target = |name: &str, kind| Target {
        name: name.into(),
        kind,
        columns: Vec::new(),
        columns_follow_schema: false,
        keys: Vec::new(),
    };
    Pipeline {
        name: "p".into(),
        mode,
        store: "sqlite://p.db".into(),
        pubsub: PubSubSettings::default(),
        metrics_listen: None,
        control_listen: None,
        control_token_file: None,
        dead_letter_topic: None,
        schedule: None,
        give_up_after: None,
        targets: vec![
            target("events", TargetKind::Table),
            target("counts", TargetKind::Table),
            target("v", TargetKind::View),
        ],
        flows,
        views: Vec::new(),
    }
}

/// backfill (once) and live write `events`; `counts` reads `events`; `late` depends on
/// `backfill` and also reads `events`.
fn backfill_then_live(mode: Mode) -> FlowGraph {
    FlowGraph::new(&pipeline(
        mode,
        vec![
            flow("counts", "counts", false, &[], table("events")),
            flow("live", "events", false, &["backfill"], file()),
            flow("backfill", "events", true, &[], file()),
            flow(
                "late",
                "v",
                false,
                &["backfill", "backfill"],
                table("events"),
            ),
        ],
    ))
}

#[test]
fn edges_of_both_kinds_in_file_order() {
    let g = backfill_then_live(Mode::Continuous);
    assert_eq!(
        g.predecessors("counts"),
        vec![("live", EdgeKind::Data), ("backfill", EdgeKind::Data)]
    );
    assert_eq!(
        g.predecessors("live"),
        vec![("backfill", EdgeKind::DependsOn)]
    );
    // Linked both ways and named twice: one entry, `depends_on` preferred.
    assert_eq!(
        g.predecessors("late"),
        vec![("live", EdgeKind::Data), ("backfill", EdgeKind::DependsOn)]
    );
    assert_eq!(
        g.successors("backfill"),
        vec![
            ("counts", EdgeKind::Data),
            ("live", EdgeKind::DependsOn),
            ("late", EdgeKind::DependsOn)
        ]
    );
    assert!(g.predecessors("nope").is_empty());
    assert_eq!(
        g.node("late").and_then(|n| n.target_kind.clone()),
        Some(TargetKind::View)
    );
}

#[test]
fn topological_order_is_stable() {
    let g = backfill_then_live(Mode::Continuous);
    assert_eq!(
        g.topological_order(),
        vec!["backfill", "live", "counts", "late"]
    );
    assert_eq!(g.find_cycle(), None);
    let independent = FlowGraph::new(&pipeline(
        Mode::Continuous,
        vec![
            flow("b", "events", false, &[], file()),
            flow("a", "counts", false, &[], file()),
        ],
    ));
    assert_eq!(independent.topological_order(), vec!["b", "a"]);
}

#[test]
fn continuous_mode_does_not_wait_for_live_writers() {
    let g = backfill_then_live(Mode::Continuous);
    assert_eq!(g.waits_for("counts"), vec!["backfill"]);
    assert_eq!(g.waits_for("late"), vec!["backfill"]);
    let g = backfill_then_live(Mode::Triggered);
    assert_eq!(g.waits_for("counts"), vec!["live", "backfill"]);
    assert_eq!(g.waits_for("late"), vec!["live", "backfill"]);
}

#[test]
fn cycles_start_at_their_first_flow() {
    // a waits for c, b for a, c for b: a -> b -> c -> a.
    let g = FlowGraph::new(&pipeline(
        Mode::Triggered,
        vec![
            flow("a", "events", true, &["c"], file()),
            flow("b", "events", true, &["a"], file()),
            flow("c", "counts", true, &["b"], file()),
            flow("d", "counts", true, &["c"], file()),
        ],
    ));
    assert_eq!(
        g.find_cycle(),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(g.cycles().len(), 1);
    // Flows on or behind a cycle come last, in file order.
    assert_eq!(g.topological_order(), vec!["a", "b", "c", "d"]);
}

#[test]
fn self_and_data_cycles() {
    let g = FlowGraph::new(&pipeline(
        Mode::Triggered,
        vec![
            flow("me", "v", false, &["me"], file()),
            // Writes `events` and reads it back.
            flow("loop", "events", false, &[], table("events")),
            // x writes counts, reads events; y writes events, reads counts.
            flow("x", "counts", false, &[], table("events")),
            flow("y", "events", false, &[], table("counts")),
        ],
    ));
    let cycles = g.cycles();
    assert!(cycles.contains(&vec!["me".to_owned(), "me".to_owned()]));
    assert!(cycles.contains(&vec!["loop".to_owned(), "loop".to_owned()]));
    assert!(cycles.contains(&vec!["x".to_owned(), "y".to_owned(), "x".to_owned()]));
    assert_eq!(g.edge_kind(3, 2), Some(EdgeKind::Data));
    assert_eq!(g.edge_kind(0, 0), Some(EdgeKind::DependsOn));
    assert_eq!(g.edge_kind(0, 1), None);
}

#[test]
fn unresolved_references_give_no_edge() {
    let g = FlowGraph::new(&pipeline(
        Mode::Continuous,
        vec![
            flow("a", "nowhere", false, &["ghost"], table("missing")),
            flow("b", "missing", true, &[], file()),
            flow("a", "events", true, &[], file()),
            flow("c", "events", false, &["a"], file()),
        ],
    ));
    assert!(g.predecessors("a").is_empty());
    assert_eq!(g.node("a").map(|n| n.target_kind.clone()), Some(None));
    // A duplicated name refers to its first flow.
    assert_eq!(g.successors("a"), vec![("c", EdgeKind::DependsOn)]);
    assert_eq!(g.find_cycle(), None);
}

#[test]
fn a_long_chain_does_not_recurse() {
    let names: Vec<String> = (0..20_000).map(|i| format!("f{i}")).collect();
    let flows = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let before = if i == 0 {
                &names[names.len() - 1]
            } else {
                &names[i - 1]
            };
            flow(name, "events", true, &[before.as_str()], file())
        })
        .collect();
    let g = FlowGraph::new(&pipeline(Mode::Triggered, flows));
    let cycle = g.find_cycle().unwrap_or_default();
    assert_eq!(cycle.len(), names.len() + 1);
    assert_eq!(cycle.first(), cycle.last());
}
