//! What a worker serves beside its flows: the control API (`control.listen`) and the metrics
//! and health endpoint (`metrics.listen`).

pub mod control;
mod metric_help;
pub mod observe;
