//! A real gRPC Stage server (tonic) on a free loopback port, recording every call in the
//! order it arrived: what `foreach_batch` targets hand their batches to.

use sluice_proto::v1::stage_server::{Stage, StageServer};
use sluice_proto::v1::{ProcessRequest, ProcessResponse};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// One call the Stage server received.
#[derive(Debug, Clone)]
pub struct StageCall {
    /// The flow that sent it.
    pub flow: String,
    /// Its batch id.
    pub batch_id: String,
    /// The records' keys, in order.
    pub keys: Vec<String>,
    /// The records' event times, in order.
    pub event_times: Vec<i64>,
    /// The run's data interval, `[start, end)` ms, if the request had one.
    pub interval: Option<(i64, i64)>,
}

/// The calls received so far, in arrival order.
#[derive(Default, Clone)]
pub struct StageRecorder {
    calls: Arc<Mutex<Vec<StageCall>>>,
    refused: Arc<Mutex<Vec<String>>>,
    slowest: Arc<Mutex<Option<std::time::Duration>>>,
}

impl StageRecorder {
    /// From now on, refuses (INVALID_ARGUMENT: the message is at fault) every call holding a
    /// record whose key contains `needle`.
    pub fn refuse_keys_containing(&self, needle: &str) {
        self.refused.lock().unwrap().push(needle.to_owned());
    }

    /// From now on, answers each call after a random delay of up to `slowest` (a stage whose
    /// answers take their time, unevenly).
    pub fn answer_within(&self, slowest: std::time::Duration) {
        *self.slowest.lock().unwrap() = Some(slowest);
    }

    /// A copy of the calls so far.
    pub fn calls(&self) -> Vec<StageCall> {
        self.calls.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl Stage for StageRecorder {
    async fn process(
        &self,
        request: tonic::Request<ProcessRequest>,
    ) -> Result<tonic::Response<ProcessResponse>, tonic::Status> {
        let request = request.into_inner();
        let slowest = *self.slowest.lock().unwrap();
        if let Some(slowest) = slowest {
            let millis = u64::try_from(slowest.as_millis()).unwrap_or(u64::MAX);
            let delay = std::time::Duration::from_millis(rand::random_range(0..=millis));
            tokio::time::sleep(delay).await;
        }
        let interval = request.interval.map(|i| (i.start_ms, i.end_ms));
        let event_times: Vec<i64> = request.records.iter().map(|r| r.event_time_ms).collect();
        let keys: Vec<String> = request.records.into_iter().map(|r| r.key).collect();
        let refused = self
            .refused
            .lock()
            .unwrap()
            .iter()
            .find(|needle| keys.iter().any(|k| k.contains(needle.as_str())))
            .cloned();
        self.calls.lock().unwrap().push(StageCall {
            flow: request.flow,
            batch_id: request.batch_id,
            keys,
            event_times,
            interval,
        });
        match refused {
            Some(needle) => Err(tonic::Status::invalid_argument(format!(
                "a record with {needle:?} in its key cannot be processed"
            ))),
            None => Ok(tonic::Response::new(ProcessResponse {})),
        }
    }
}

/// Serves a Stage recording its calls; its address and the recorder.
pub async fn stage_server() -> (SocketAddr, StageRecorder) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let recorder = StageRecorder::default();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let server = tonic::transport::Server::builder()
        .add_service(StageServer::new(recorder.clone()))
        .serve_with_incoming(incoming);
    tokio::spawn(server);
    (address, recorder)
}
