//! The control API of SPEC §9 (`proto/sluice/v1/control.proto`), served with tonic on
//! `control.listen`: `GetStatus`, `ListFlows`, `StartUpdate`, `ResetFlow` and `Drain` (how an
//! update replaces the running one: [`crate::runtime::updates::request`]).
//!
//! # Guarantees (who may call what)
//!
//! * **Reads** (`GetStatus`, `ListFlows`) are open to anyone on the host when `control.listen`
//!   is a loopback address (like the metrics endpoint).
//! * **Calls that act** (`StartUpdate`, `ResetFlow`, `Drain`: they stop flows, clear rows and
//!   ledger keys, seek subscriptions, which acknowledges messages, or end the worker) need
//!   `authorization: Bearer <token>` with the token of `control.token_file` on every address,
//!   loopback included. Without `control.token_file` the worker has no token and refuses them
//!   (PERMISSION_DENIED, naming the setting); a missing or wrong token is UNAUTHENTICATED.
//! * Bound to any other address, `control.token_file` is required at start (exit 2 without
//!   it) and every call needs the token.
//! * A refused call changes nothing; it is logged and counted in
//!   `sluice_control_rejected_total`. The token is compared in constant time.
//!
//! # What it does not cover
//!
//! No TLS: off loopback the token crosses the network in clear unless the network (a service
//! mesh, a private cluster network) protects it. Anyone who can read the token file, or write
//! the store (`sluice reset` and `full-refresh` act through the store), has the same power.

use crate::runtime::flow::board::FlowBoard;
use crate::runtime::kit::signals::Shutdown;
use crate::runtime::run_error::RunError;
use crate::runtime::updates::refresh_error::RefreshError;
use crate::runtime::updates::request::{UpdateKind, UpdateSender};
use crate::serve::observe::Readiness;
use sluice_proto::v1::control_server::{Control, ControlServer};
use sluice_proto::v1::{
    DrainRequest, DrainResponse, GetStatusRequest, GetStatusResponse, ListFlowsRequest,
    ListFlowsResponse, ResetFlowRequest, ResetFlowResponse, StartUpdateRequest,
    StartUpdateResponse,
};
use std::net::SocketAddr;
use std::path::Path;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::metadata::MetadataMap;
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
    /// Cancelled [`crate::runtime::kit::signals::DRAIN_DEADLINE`] after a drain the API started, as
    /// after a signal: batches still waiting on the store are nacked then.
    pub give_up: CancellationToken,
    /// Where `StartUpdate` and `ResetFlow` go: the run loop.
    pub updates: UpdateSender,
    /// Who may make which call.
    pub access: Access,
}

/// A call as the access rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// It only reads: open on loopback.
    Read(&'static str),
    /// It changes what the worker does or what the store holds: the token, always.
    Act(&'static str),
}

/// The access rule of the module docs for one worker's control API.
pub struct Access {
    /// The bearer token; `None`: calls that act are refused.
    token: Option<String>,
    /// `control.listen` is a loopback address: reads need no token.
    reads_open: bool,
    rejected: metrics::Counter,
}

impl Access {
    /// The rule for a worker of `pipeline` listening on `listen` with `token` (from
    /// [`token_for`]).
    pub fn new(pipeline: &str, listen: SocketAddr, token: Option<String>) -> Self {
        Self {
            token,
            reads_open: listen.ip().is_loopback(),
            rejected: metrics::counter!("sluice_control_rejected_total",
                "pipeline" => pipeline.to_owned()),
        }
    }

    /// Whether the worker has a token (calls that act are possible).
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Lets `call` through, or refuses it (logged and counted).
    fn admit<T>(&self, request: &Request<T>, call: Call) -> Result<(), Status> {
        let name = match call {
            Call::Read(_) if self.reads_open => return Ok(()),
            Call::Read(name) | Call::Act(name) => name,
        };
        let refusal = match &self.token {
            None => Status::permission_denied(format!(
                "{name} needs a bearer token, and this worker has none: set control.token_file \
                 in the pipeline file and call with `authorization: Bearer <token>` (reads stay \
                 open on loopback)"
            )),
            Some(token) if constant_time_eq(bearer(request.metadata()), token.as_bytes()) => {
                return Ok(());
            }
            Some(_) => Status::unauthenticated(format!("{name}: a valid bearer token is required")),
        };
        self.rejected.increment(1);
        tracing::warn!(peer = ?request.remote_addr(), call = name, why = refusal.message(),
            "control API call refused");
        Err(refusal)
    }
}

/// The token an `authorization: Bearer <token>` header presents (empty: none).
fn bearer(metadata: &MetadataMap) -> &[u8] {
    metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .as_bytes()
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn get_status(
        &self,
        request: Request<GetStatusRequest>,
    ) -> Result<Response<GetStatusResponse>, Status> {
        self.access.admit(&request, Call::Read("GetStatus"))?;
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
        request: Request<ListFlowsRequest>,
    ) -> Result<Response<ListFlowsResponse>, Status> {
        self.access.admit(&request, Call::Read("ListFlows"))?;
        Ok(Response::new(ListFlowsResponse {
            flows: self.board.statuses(),
        }))
    }

    async fn start_update(
        &self,
        request: Request<StartUpdateRequest>,
    ) -> Result<Response<StartUpdateResponse>, Status> {
        self.access.admit(&request, Call::Act("StartUpdate"))?;
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
        self.access.admit(&request, Call::Act("ResetFlow"))?;
        let request = request.into_inner();
        let kind = UpdateKind::Reset {
            flow: request.flow,
            seek: Some(request.seek).filter(|s| !s.is_empty()).map(|time| {
                crate::runtime::updates::seek::Seek {
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

    async fn drain(
        &self,
        request: Request<DrainRequest>,
    ) -> Result<Response<DrainResponse>, Status> {
        self.access.admit(&request, Call::Act("Drain"))?;
        let started = !self.drain.is_cancelled();
        if started {
            tracing::info!("drain requested through the control API");
            self.drain.cancel();
            let give_up = self.give_up.clone();
            tokio::spawn(async move {
                tokio::time::sleep(crate::runtime::kit::signals::DRAIN_DEADLINE).await;
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

/// Where the control API of a worker listens, and what it answers from and acts on.
pub struct ControlSettings<'a> {
    /// `control.listen` as written, and its address; `None`: no control API.
    pub listen: Option<(&'a str, SocketAddr)>,
    /// The pipeline's name.
    pub pipeline: &'a str,
    /// `control.token_file`.
    pub token_file: Option<&'a Path>,
    /// This worker's id.
    pub worker: &'a str,
    /// The run's flows.
    pub board: &'a FlowBoard,
    /// The run's readiness.
    pub readiness: &'a Readiness,
    /// The worker's signals, which `Drain` sets off.
    pub shutdown: &'a Shutdown,
    /// Where `StartUpdate` and `ResetFlow` go: the run loop.
    pub update_requests: UpdateSender,
}

/// A running control API; dropping it stops it.
pub struct ControlApi {
    _stop: DropGuard,
}

impl ControlApi {
    /// Starts the control API when `control.listen` is set. A token file that cannot be read,
    /// or none off loopback, is invalid input; an address that cannot be bound, an endpoint
    /// error.
    pub async fn start(settings: ControlSettings<'_>) -> Result<Option<ControlApi>, RunError> {
        let Some((listen, address)) = settings.listen else {
            return Ok(None);
        };
        let token = token_for(address, settings.token_file).map_err(RunError::Invalid)?;
        let service = ControlService {
            pipeline: settings.pipeline.to_owned(),
            worker: settings.worker.to_owned(),
            board: settings.board.clone(),
            readiness: settings.readiness.clone(),
            drain: settings.shutdown.drain.clone(),
            give_up: settings.shutdown.give_up.clone(),
            updates: settings.update_requests,
            access: Access::new(settings.pipeline, address, token),
        };
        let stop = CancellationToken::new();
        serve(address, service, stop.clone())
            .await
            .map_err(|e| RunError::Endpoint(format!("control.listen {listen}: {e}")))?;
        Ok(Some(ControlApi {
            _stop: stop.drop_guard(),
        }))
    }
}

/// The worker's bearer token: the content of `control.token_file` when it is set (required
/// when `listen` is not a loopback address).
pub fn token_for(listen: SocketAddr, token_file: Option<&Path>) -> Result<Option<String>, String> {
    match token_file {
        Some(file) => read_token(file).map(Some),
        None if listen.ip().is_loopback() => Ok(None),
        None => Err(format!(
            "control.listen {listen} is not a loopback address: control.token_file is required"
        )),
    }
}

/// The token in `file` (surrounding white space trimmed; empty is an error).
pub fn read_token(file: &Path) -> Result<String, String> {
    let token = std::fs::read_to_string(file)
        .map_err(|e| format!("control.token_file {}: {e}", file.display()))?;
    let token = token.trim().to_owned();
    if token.is_empty() {
        return Err(format!("control.token_file {} is empty", file.display()));
    }
    Ok(token)
}

/// Serves the API on `listen` until `stop` is cancelled.
pub async fn serve(
    listen: SocketAddr,
    service: ControlService,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, token = service.access.has_token(), "serving the control API");
    let server = tonic::transport::Server::builder()
        .add_service(ControlServer::new(service))
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{Access, Call, token_for};
    use tonic::{Code, Request};

    fn call(access: &Access, call: Call, token: Option<&str>) -> Result<(), Code> {
        let mut request = Request::new(());
        if let Some(token) = token {
            let value = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        access.admit(&request, call).map_err(|s| s.code())
    }

    #[test]
    fn on_loopback_reads_are_open_and_acting_needs_the_token() {
        let loopback = "127.0.0.1:50051".parse().unwrap();
        let (read, act) = (Call::Read("GetStatus"), Call::Act("ResetFlow"));
        let none = Access::new("p", loopback, None);
        assert_eq!(call(&none, read, None), Ok(()));
        assert_eq!(call(&none, act, None), Err(Code::PermissionDenied));
        assert_eq!(call(&none, act, Some("x")), Err(Code::PermissionDenied));
        let some = Access::new("p", loopback, Some("t0k".into()));
        assert_eq!(call(&some, read, None), Ok(()));
        assert_eq!(call(&some, act, None), Err(Code::Unauthenticated));
        assert_eq!(call(&some, act, Some("t0")), Err(Code::Unauthenticated));
        assert_eq!(call(&some, act, Some("t0k")), Ok(()));
    }

    #[test]
    fn beyond_loopback_every_call_needs_the_token() {
        let anywhere = "0.0.0.0:50051".parse().unwrap();
        let access = Access::new("p", anywhere, Some("t0k".into()));
        for kind in [Call::Read("GetStatus"), Call::Act("Drain")] {
            assert_eq!(call(&access, kind, None), Err(Code::Unauthenticated));
            assert_eq!(call(&access, kind, Some("t0k")), Ok(()));
        }
        assert!(token_for(anywhere, None).is_err());
    }

    #[test]
    fn a_token_file_is_read_on_loopback_too() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "t0k\n").unwrap();
        let loopback = "127.0.0.1:50051".parse().unwrap();
        assert_eq!(
            token_for(loopback, Some(&file)).unwrap().as_deref(),
            Some("t0k")
        );
        assert_eq!(token_for(loopback, None).unwrap(), None);
        std::fs::write(&file, " \n").unwrap();
        assert!(token_for(loopback, Some(&file)).is_err());
    }
}
