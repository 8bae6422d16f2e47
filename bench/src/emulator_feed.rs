//! The Pub/Sub emulator a benchmark feeds from: the one `PUBSUB_EMULATOR_HOST` names, or one
//! started for the run, warmed up before anything is measured.

use crate::BenchError;
use sluice_engine::PubSubConfig;
use sluice_engine::pubsub::Admin;

/// The emulator a benchmark feeds from (`PUBSUB_EMULATOR_HOST`'s, or one started now and
/// stopped when the returned guard drops), warmed up with a drained backlog of `size`-byte
/// messages (the first run after a start is several times slower).
pub(crate) async fn emulator_feed(
    size: usize,
) -> Result<(Admin, PubSubConfig, Option<crate::Emulator>), BenchError> {
    let (emulator, endpoint) = match std::env::var("PUBSUB_EMULATOR_HOST") {
        Ok(host) => (None, format!("http://{host}")),
        Err(_) => {
            let emulator = crate::Emulator::start()?;
            let endpoint = emulator.endpoint();
            (Some(emulator), endpoint)
        }
    };
    let config = PubSubConfig {
        project: Some(crate::throughput::PROJECT.to_owned()),
        endpoint: Some(endpoint),
    };
    let admin = Admin::connect(&config).await?;
    let run_id: u32 = rand::random();
    let warm = crate::throughput::backlog(
        &admin,
        &format!("warm-{run_id}"),
        crate::throughput::WARM_UP_MESSAGES,
        size,
    )
    .await?;
    crate::throughput::raw_drain(&config, &warm, crate::throughput::WARM_UP_MESSAGES, STREAMS)
        .await?;
    Ok((admin, config, emulator))
}

/// Streaming-pull streams of the emulator feed.
pub(crate) const STREAMS: usize = 16;
