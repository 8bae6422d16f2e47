//! Updates: the flows of a pipeline run as one update at a time, and the requests (control API,
//! `sluice reset`, `sluice full-refresh`) that drain it, clear what was asked and start the next,
//! alone or across a running pool. Nothing is cleared under a running flow.

mod interrupts;
pub(crate) mod pool;
pub(crate) mod prepare;
pub(crate) mod refresh;
pub(crate) mod refresh_error;
pub(crate) mod request;
pub(crate) mod seek;
pub(super) mod update_loop;
