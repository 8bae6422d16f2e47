//! What `sluice bench latency` measures at each rate, shared by the measurement
//! (`latency.rs`) and its plot (`latency_plot.rs`), so that neither imports the other.

/// Latency percentiles of one measurement, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
    /// Messages measured (after the first second).
    pub(crate) count: usize,
}

/// One rate's four measurements: (raw, sluice) unordered, then ordered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RatePoint {
    pub(crate) rate: u32,
    pub(crate) unordered: [Percentiles; 2],
    pub(crate) ordered: [Percentiles; 2],
}
