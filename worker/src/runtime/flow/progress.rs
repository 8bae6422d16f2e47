//! A progress bar for a file backfill, drawn on stderr only when stderr is a terminal (never
//! into a pipe or a log file, SPEC §3).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sluice_engine::SourceProgress;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often the bar is redrawn.
const REFRESH: Duration = Duration::from_millis(200);

/// Draws `progress` until the returned guard is dropped; nothing when stderr is not a terminal.
pub fn draw(flow: &str, progress: Arc<SourceProgress>) -> Option<tokio_util::sync::DropGuard> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let total = progress.bytes_total.load(Ordering::Relaxed);
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("{prefix} [{bar:30}] {bytes}/{total_bytes} {msg} ({eta})")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(flow.to_owned());
    let stop = tokio_util::sync::CancellationToken::new();
    let done = stop.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(REFRESH);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = done.cancelled() => break,
            }
            bar.set_length(progress.bytes_total.load(Ordering::Relaxed));
            bar.set_position(progress.bytes_read.load(Ordering::Relaxed));
            bar.set_message(format!(
                "{} records, {} already committed",
                progress.delivered.load(Ordering::Relaxed),
                progress.skipped.load(Ordering::Relaxed)
            ));
        }
        bar.finish_and_clear();
    });
    Some(stop.drop_guard())
}
