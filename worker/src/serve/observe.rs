//! What a worker shows Prometheus and Kubernetes on `metrics.listen`:
//!
//! - `GET /metrics`: every metric of SPEC §8 the worker emits, in Prometheus' text format
//!   (`metrics-exporter-prometheus`), histograms with the buckets below;
//! - `GET /healthz`: 200 while the process serves (liveness);
//! - `GET /readyz`: 200 once the store is prepared and no flow is starting (every flow that
//!   has been released has its source running: Pub/Sub answered), 503 before that, while a
//!   flow cannot start (retrying), and while draining; mirrored as the gauge
//!   `sluice_ready{pipeline}`.
//!
//! Without `metrics.listen` nothing is installed: the metrics facade then costs one atomic
//! load per call.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Buckets of `sluice_commit_duration_seconds`: one store transaction, from a millisecond
/// (SQLite, small batch) to the half minute of a store that is struggling.
const COMMIT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets of `sluice_ack_latency_seconds`: receive to ack, from the batch delay (tens of ms)
/// to the minutes a message waits through a store outage.
const ACK_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];

/// Readiness of this worker, shared by the run and the `/readyz` handler.
#[derive(Debug, Clone)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
    gauge: metrics::Gauge,
}

impl Readiness {
    /// Not ready yet.
    pub fn new(pipeline: &str) -> Self {
        let gauge = metrics::gauge!("sluice_ready", "pipeline" => pipeline.to_owned());
        gauge.set(0.0);
        Self {
            ready: Arc::new(AtomicBool::new(false)),
            gauge,
        }
    }

    /// Marks the worker ready (true) or not.
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
        self.gauge.set(if ready { 1.0 } else { 0.0 });
    }

    /// Whether the worker is ready.
    pub fn get(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// The exporter of a run (if `metrics.listen` is set) and the run's readiness. Dropping it
/// stops the server.
pub struct Observed {
    /// The run's readiness, served on `/readyz` and as `sluice_ready`.
    pub readiness: Readiness,
    _server: Option<tokio_util::sync::DropGuard>,
}

impl Observed {
    /// Installs the exporter and starts serving when `listen` is given; otherwise only keeps
    /// the readiness. Fails when the recorder cannot be installed or the address bound.
    pub async fn start(listen: Option<SocketAddr>, pipeline: &str) -> Result<Self, String> {
        let Some(listen) = listen else {
            return Ok(Self {
                readiness: Readiness::new(pipeline),
                _server: None,
            });
        };
        // Before any metric handle is taken: handles taken earlier go nowhere.
        let handle = install()?;
        let readiness = Readiness::new(pipeline);
        let stop = CancellationToken::new();
        serve(listen, handle, readiness.clone(), stop.clone())
            .await
            .map_err(|e| format!("metrics.listen {listen}: {e}"))?;
        Ok(Self {
            readiness,
            _server: Some(stop.drop_guard()),
        })
    }
}

/// Installs the Prometheus recorder (histogram buckets included) and records
/// `sluice_build_info`. Call once, before any metric is emitted.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("sluice_commit_duration_seconds".to_owned()),
            COMMIT_BUCKETS,
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("sluice_ack_latency_seconds".to_owned()),
                ACK_BUCKETS,
            )
        })
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    super::metric_help::describe();
    metrics::gauge!("sluice_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    Ok(handle)
}

/// Binds `listen` and serves the three endpoints until `stop` is cancelled.
pub async fn serve(
    listen: SocketAddr,
    handle: PrometheusHandle,
    readiness: Readiness,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(listen).await?;
    tracing::info!(%listen, "serving /metrics, /healthz and /readyz");
    Ok(tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.cancelled() => return,
            };
            let Ok((stream, _)) = accepted else { continue };
            let (handle, readiness) = (handle.clone(), readiness.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let response = respond(&request, &handle, &readiness);
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                // A client that hangs up mid-request is its own business.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    }))
}

fn respond<B>(
    request: &Request<B>,
    handle: &PrometheusHandle,
    readiness: &Readiness,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match request.uri().path() {
        "/metrics" => (StatusCode::OK, "text/plain; version=0.0.4", handle.render()),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" if readiness.get() => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: store not prepared, a flow starting (Pub/Sub not answering), or draining\n"
                .to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}
