//! The client side of a `foreach_batch` target's gRPC `Stage` service
//! (`proto/sluice/v1/stage.proto`): each batch is sent with `Process` before it is committed.
//!
//! The channel connects lazily and reconnects by itself, so a Stage service that is down when
//! the worker starts, or restarts later, only delays batches (retried with backoff, nothing
//! acked), it never fails the flow or loses a record.

use sluice_engine::{ForeachBatchStage, StageError, StageRecord, TableStage};
use sluice_pipeline::timetable::DataInterval;
use sluice_proto::v1::stage_client::StageClient;
use sluice_proto::v1::{DataInterval as ProtoInterval, ProcessRequest, Record};
use std::time::Duration;
use tonic::Code;

/// How long one `Process` call may take before it counts as unavailable (and is retried).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The stage of a `foreach_batch` flow calling the Stage service at `endpoint`.
pub fn grpc_stage(
    pipeline: &str,
    flow: &str,
    endpoint: &str,
    rows: TableStage,
    interval: Option<DataInterval>,
) -> Result<ForeachBatchStage, String> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| format!("foreach_batch.endpoint {endpoint:?}: {e}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_lazy();
    let client = StageClient::new(channel);
    let pipeline = pipeline.to_owned();
    Ok(ForeachBatchStage::new(flow, rows, move |batch| {
        let mut client = client.clone();
        let request = ProcessRequest {
            pipeline: pipeline.clone(),
            flow: batch.flow,
            batch_id: batch.batch_id,
            records: batch.records.into_iter().map(record).collect(),
            interval: interval.map(|i| ProtoInterval {
                start_ms: i.start_ms,
                end_ms: i.end_ms,
            }),
        };
        async move { client.process(request).await.map(|_| ()).map_err(classify) }
    }))
}

fn record(r: StageRecord) -> Record {
    Record {
        key: r.key,
        message_id: r.message_id,
        publish_time_ms: r.publish_time_ms,
        event_time_ms: r.event_time_ms,
        attributes: r.attributes.into_iter().collect(),
        data: r.data.to_vec(),
    }
}

/// Statuses that say the service is down, slow or overloaded (connection failures arrive as
/// UNAVAILABLE) are retried as long as it takes; every other status, UNKNOWN and INTERNAL
/// included (what a handler that throws on a record returns), blames the batch: it is split
/// and a record that keeps failing is dead-lettered after the flow's `max_attempts`, so one bad
/// record never stalls the flow.
fn classify(status: tonic::Status) -> StageError {
    let message = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Aborted => {
            StageError::unavailable(message)
        }
        _ => StageError::rejected(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_retry_and_refusals_blame_the_data() {
        assert!(classify(tonic::Status::unavailable("down")).transient);
        assert!(classify(tonic::Status::deadline_exceeded("slow")).transient);
        let refused = classify(tonic::Status::invalid_argument("bad record"));
        assert!(!refused.transient);
        assert!(refused.message.contains("bad record"));
        // A handler that throws: the data is suspected, never retried forever.
        assert!(!classify(tonic::Status::unknown("exception")).transient);
        assert!(!classify(tonic::Status::internal("exception")).transient);
    }
}
