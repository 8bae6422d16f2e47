//! What runs inside a worker process: the supervisor of updates, the runs of a triggered
//! pipeline and its schedule, the scheduler that starts flows in `depends_on` order, the
//! building of each flow, the board of their phases, the pool membership, drain quorum and pool updates,
//! watermarks and windows, refreshes, and the signals that drain.

pub mod board;
pub mod dead_letters;
pub mod drain_quorum;
pub mod flows;
pub mod liveness;
pub mod membership;
pub mod pool_update;
pub mod progress;
pub mod refresh;
pub mod run_record;
pub mod schedule;
pub mod scheduler;
pub mod scheduler_lease;
pub mod signals;
pub mod stage_client;
pub mod store_retry;
pub mod supervisor;
pub mod table_updates;
pub mod update;
pub mod update_loop;
pub mod watermarks;
pub mod windows;
