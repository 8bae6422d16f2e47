//! What runs inside a worker process, one room per concern: the [`supervisor`] of a process
//! (its entry, `execute`); [`runs`], what runs when: a continuous pipeline's update, a
//! triggered pipeline's runs at the fires of its timetable; [`updates`], one run of the flows
//! at a time and the requests that replace it; [`flow`], the graph executor and everything
//! beside a running flow; [`pool`], membership and self-fencing; [`kit`], the signals that
//! drain and the one way to wait for the store.

pub(crate) mod flow;
pub(crate) mod kit;
pub(crate) mod pool;
pub(crate) mod run_error;
mod runs;
pub(crate) mod supervisor;
pub(crate) mod updates;
