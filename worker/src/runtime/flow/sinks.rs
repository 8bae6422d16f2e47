//! `sink` targets: which flow writes one, and where its files go (`sluice_engine::JsonlSink`,
//! which says how each record lands in exactly one published file).

use sluice_engine::JsonlSink;
use sluice_pipeline::{Flow, Pipeline, TargetKind};
use std::path::Path;

/// The path of the `sink` target `flow` writes, when its target is one.
pub fn sink_target<'a>(pipeline: &'a Pipeline, flow: &Flow) -> Option<&'a Path> {
    pipeline.targets.iter().find_map(|t| match &t.kind {
        TargetKind::Sink { path, .. } if t.name == flow.target => Some(path.as_path()),
        _ => None,
    })
}

/// The sink of a flow, when its target is a `sink`.
pub fn sink_of(pipeline: &Pipeline, flow: &Flow) -> Option<JsonlSink> {
    sink_target(pipeline, flow).map(|path| JsonlSink::new(path, &flow.name))
}
