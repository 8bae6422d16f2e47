//! The control API of SPEC §9 (`proto/sluice/v1/control.proto`), served with tonic on
//! `control.listen`: `GetStatus`, `ListFlows`, `StartUpdate`, `ResetFlow` and `Drain` (how an
//! update replaces the running one: [`crate::runtime::update`]).
//!
//! Access: bound to a loopback address, anyone on the host may call (like the metrics
//! endpoint). Bound elsewhere, `control.token_file` is required at start (exit 2 without it) and
//! every call must carry `authorization: Bearer <token>`; a refused call is logged and counted in
//! `sluice_control_rejected_total`. The token is compared in constant time.

use crate::runtime::board::FlowBoard;
use crate::runtime::refresh::RefreshError;
use crate::runtime::update::{UpdateKind, UpdateSender};
use crate::serve::observe::Readiness;
use sluice_proto::v1::control_server::{Control, ControlServer};
use sluice_proto::v1::{
    DrainRequest, DrainResponse, GetStatusRequest, GetStatusResponse, ListFlowsRequest,
    ListFlowsResponse, ResetFlowRequest, ResetFlowResponse, StartUpdateRequest,
    StartUpdateResponse,
};
use std::net::SocketAddr;
use std::path::Path;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// What the API answers from.
pub struct ControlService {
    /// Pipeline name.
    pub pipeline: String,
    /// This worker's id.
    pub worker: String,
    /// The run's flows.
    pub board: FlowBoard,
    /// The run's readiness.
    pub readiness: Readiness,
    /// Cancelled to drain, as SIGTERM does.
    pub drain: CancellationToken,
    /// Cancelled [`crate::runtime::signals::DRAIN_DEADLINE`] after a drain the API started, as after a
    /// signal: batches still waiting on the store are nacked then.
    pub give_up: CancellationToken,
    /// Where `StartUpdate` and `ResetFlow` go: the run loop.
    pub updates: UpdateSender,
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn get_status(
        &self,
        _: Request<GetStatusRequest>,
    ) -> Result<Response<GetStatusResponse>, Status> {
        Ok(Response::new(GetStatusResponse {
            pipeline: self.pipeline.clone(),
            worker: self.worker.clone(),
            ready: self.readiness.get(),
            draining: self.drain.is_cancelled(),
            flows: self.board.statuses(),
        }))
    }

    async fn list_flows(
        &self,
        _: Request<ListFlowsRequest>,
    ) -> Result<Response<ListFlowsResponse>, Status> {
        Ok(Response::new(ListFlowsResponse {
            flows: self.board.statuses(),
        }))
    }

    async fn start_update(
        &self,
        request: Request<StartUpdateRequest>,
    ) -> Result<Response<StartUpdateResponse>, Status> {
        let request = request.into_inner();
        let kind = if request.full_refresh {
            UpdateKind::FullRefresh { seek: None }
        } else {
            UpdateKind::Refresh(request.refresh_flows)
        };
        tracing::info!(?kind, "update requested through the control API");
        let started = self.updates.request(kind).await.map_err(refused)?;
        Ok(Response::new(StartUpdateResponse {
            message: started.message,
            update: started.update,
        }))
    }

    async fn reset_flow(
        &self,
        request: Request<ResetFlowRequest>,
    ) -> Result<Response<ResetFlowResponse>, Status> {
        let request = request.into_inner();
        let kind = UpdateKind::Reset {
            flow: request.flow,
            seek: Some(request.seek).filter(|s| !s.is_empty()).map(|time| {
                crate::runtime::refresh::Seek {
                    time,
                    drop_unread: request.drop_unread,
                }
            }),
        };
        tracing::info!(?kind, "flow reset requested through the control API");
        let started = self.updates.request(kind).await.map_err(refused)?;
        Ok(Response::new(ResetFlowResponse {
            message: started.message,
            update: started.update,
        }))
    }

    async fn drain(&self, _: Request<DrainRequest>) -> Result<Response<DrainResponse>, Status> {
        let started = !self.drain.is_cancelled();
        if started {
            tracing::info!("drain requested through the control API");
            self.drain.cancel();
            let give_up = self.give_up.clone();
            tokio::spawn(async move {
                tokio::time::sleep(crate::runtime::signals::DRAIN_DEADLINE).await;
                give_up.cancel();
            });
        }
        Ok(Response::new(DrainResponse { started }))
    }
}

/// A refused update as a gRPC status: a bad request is INVALID_ARGUMENT, anything else (other
/// workers running, a drain, the store) FAILED_PRECONDITION.
fn refused(error: RefreshError) -> Status {
    match error {
        RefreshError::Invalid(why) => Status::invalid_argument(why),
        RefreshError::Failed(why) => Status::failed_precondition(why),
    }
}

/// Reads the bearer token a non-loopback `listen` requires.
pub fn token_for(listen: SocketAddr, token_file: Option<&Path>) -> Result<Option<String>, String> {
    if listen.ip().is_loopback() {
        return Ok(None);
    }
    let Some(file) = token_file else {
        return Err(format!(
            "control.listen {listen} is not a loopback address: control.token_file is required"
        ));
    };
    let token = std::fs::read_to_string(file)
        .map_err(|e| format!("control.token_file {}: {e}", file.display()))?;
    let token = token.trim().to_owned();
    if token.is_empty() {
        return Err(format!("control.token_file {} is empty", file.display()));
    }
    Ok(Some(token))
}

/// Serves the API on `listen` until `stop` is cancelled.
pub async fn serve(
    listen: SocketAddr,
    token: Option<String>,
    service: ControlService,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, authenticated = token.is_some(), "serving the control API");
    let rejected = metrics::counter!("sluice_control_rejected_total",
        "pipeline" => service.pipeline.clone());
    let check = move |request: Request<()>| match &token {
        None => Ok(request),
        Some(token) => {
            let presented = request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or_default();
            if constant_time_eq(presented.as_bytes(), token.as_bytes()) {
                Ok(request)
            } else {
                rejected.increment(1);
                tracing::warn!(peer = ?request.remote_addr(),
                    "control API call refused: missing or wrong bearer token");
                Err(Status::unauthenticated("a valid bearer token is required"))
            }
        }
    };
    let server = tonic::transport::Server::builder()
        .add_service(ControlServer::with_interceptor(service, check))
        .serve_with_incoming_shutdown(
            tokio_stream_of(listener),
            async move { stop.cancelled().await },
        );
    tokio::spawn(async move {
        if let Err(error) = server.await {
            tracing::error!(%error, "the control API stopped");
        }
    });
    Ok(())
}

fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
