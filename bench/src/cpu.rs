//! CPU time of this process, from `/proc/self/stat` (user + system, in clock ticks of 10 ms).

use std::time::Duration;

/// Clock ticks per second on Linux (`sysconf(_SC_CLK_TCK)` is 100 on every mainstream kernel).
const TICKS_PER_SECOND: u64 = 100;

/// User plus system CPU time used by this process so far; zero if unreadable.
pub fn process_cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let Some(after_name) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // after_name starts at field 3 (state), so field n is at index n - 3.
    let total = ticks(14 - 3) + ticks(15 - 3);
    Duration::from_millis(total * 1000 / TICKS_PER_SECOND)
}
