//! `sluice status`'s live view: when the file sets `control.listen` and a worker answers
//! there within [`CONTROL_TIMEOUT`], its flow states and its own counters since it started
//! (received, rows, duplicates of both tiers, dead letters, acks, late rows, lag, watermark
//! age, when each flow's run started). A refused token is told on stderr.

use super::text::{rfc3339, table};
use std::time::Duration;

/// What `status` prints: as text and as JSON.
pub(super) struct Report {
    pub(super) text: String,
    pub(super) json: serde_json::Value,
}

/// How long `status` waits for a worker's control API before reading the store instead.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// The live status from the worker's control API, if `control.listen` is set and it answers
/// (a refusal of `token` is told on stderr).
pub(super) async fn ask_worker(
    pipeline: &sluice_pipeline::Pipeline,
    token: Option<String>,
) -> Option<Report> {
    use sluice_proto::v1::GetStatusRequest;
    use sluice_proto::v1::control_client::ControlClient;
    let listen: std::net::SocketAddr = pipeline.control_listen.as_deref()?.parse().ok()?;
    // A worker bound to every interface is reached on loopback.
    let host = if listen.ip().is_unspecified() {
        std::net::SocketAddr::from(([127, 0, 0, 1], listen.port()))
    } else {
        listen
    };
    let call = async {
        let mut client = ControlClient::connect(format!("http://{host}"))
            .await
            .ok()?;
        let mut request = tonic::Request::new(GetStatusRequest {});
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().ok()?);
        }
        match client.get_status(request).await {
            Ok(answer) => Some(answer),
            Err(refused) if refused.code() == tonic::Code::Unauthenticated => {
                eprintln!(
                    "the control API at {host} refused the call ({}): set {} or make \
                     control.token_file readable; showing what the store says",
                    refused.message(),
                    super::CONTROL_TOKEN_ENV
                );
                None
            }
            Err(_) => None,
        }
    };
    let status = tokio::time::timeout(CONTROL_TIMEOUT, call)
        .await
        .ok()??
        .into_inner();
    let headers = [
        "FLOW",
        "STATE",
        "RECEIVED",
        "ROWS",
        "DUPLICATES",
        "DEAD LETTERS",
        "ACKED",
        "LATE",
        "LAG",
        "WATERMARK AGE",
        "LAST RUN",
    ];
    let rows: Vec<Vec<String>> = status
        .flows
        .iter()
        .map(|f| {
            vec![
                f.name.clone(),
                f.state.clone(),
                f.received.to_string(),
                f.rows.to_string(),
                (f.duplicates_memory + f.duplicates_store).to_string(),
                f.dead_letters.to_string(),
                f.acked.to_string(),
                f.late.to_string(),
                format!("{:.1}s", f.oldest_unacked_age_seconds),
                if f.watermark_ms > 0 {
                    format!("{:.1}s", f.watermark_age_seconds)
                } else {
                    "-".to_owned()
                },
                if f.last_run_started_ms > 0 {
                    format!("started {}", rfc3339(f.last_run_started_ms))
                } else {
                    "-".to_owned()
                },
            ]
        })
        .collect();
    let mut text = format!(
        "pipeline {} on worker {} ({}{})\n\n",
        status.pipeline,
        status.worker,
        if status.ready { "ready" } else { "not ready" },
        if status.draining { ", draining" } else { "" }
    );
    text.push_str(&table(&headers, &rows));
    text.push_str(
        "(the counts are this worker's, since it started; `sluice status` without a \
                   running worker shows every worker's, from the store)\n",
    );
    let json = serde_json::json!({
        "pipeline": status.pipeline,
        "worker": status.worker,
        "ready": status.ready,
        "draining": status.draining,
        "source": "control_api",
        "flows": status.flows.iter().map(|f| serde_json::json!({
            "flow": f.name, "state": f.state, "once": f.once, "received": f.received,
            "rows": f.rows, "duplicates_memory": f.duplicates_memory,
            "duplicates_store": f.duplicates_store, "dead_letters": f.dead_letters,
            "acked": f.acked, "nacked": f.nacked,
            "oldest_unacked_age_seconds": f.oldest_unacked_age_seconds,
            "late": f.late,
            "watermark_ms": (f.watermark_ms > 0).then_some(f.watermark_ms),
            "watermark_age_seconds": (f.watermark_ms > 0).then_some(f.watermark_age_seconds),
            "last_run_started_ms": (f.last_run_started_ms > 0).then_some(f.last_run_started_ms),
        })).collect::<Vec<_>>(),
    });
    Some(Report { text, json })
}
