//! This worker's name in the pool of its pipeline, unique per process start: a restarted worker
//! joins as a new member.

use sluice_store::WorkerBeat;

/// This worker's identity in the pool: `<host>-<pid>-<random>`, unique per process start.
pub fn identity(pipeline: &str) -> WorkerBeat {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let pid = std::process::id();
    WorkerBeat {
        pipeline: pipeline.to_owned(),
        worker: format!("{host}-{pid}-{:04x}", rand::random::<u16>()),
        host,
        pid,
        schedule: None,
    }
}
