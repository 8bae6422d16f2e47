//! A small TCP proxy that injects network faults between a `sluice` worker and one of its parts
//! (PostgreSQL, the Pub/Sub emulator).
//!
//! It is a fake: the real parts cannot be made, on demand and at an exact moment, to drop every
//! connection, to go silent without closing anything, or to answer slowly. The proxy sits on the
//! path instead: the worker is configured with [`FaultProxy::addr`] in place of the part's
//! address, and the proxy forwards bytes both ways to the real part until told otherwise.
//!
//! Commands take effect at once, on the connections already open and on new ones:
//! - [`FaultProxy::pass`]: forward everything (the start state);
//! - [`FaultProxy::reset`]: close every open connection now, with a TCP reset to both sides;
//!   connections made afterwards pass;
//! - [`FaultProxy::blackhole`]: accept connections but forward nothing in either direction: the
//!   bytes are held (not dropped, not answered), so both sides see silence, never an error, as
//!   in a network partition; new connections are accepted and not connected upstream until the
//!   fault ends. When another command lifts it, the held bytes go on in order (up to 256
//!   chunks of at most 64 KiB per direction are read ahead into memory; past that the
//!   sockets' own buffers fill, so a sender sees a full window, still no error);
//! - [`FaultProxy::delay`]: forward each chunk that long after it was read, in order, in both
//!   directions (so a request and its answer take twice the delay more).
//!
//! [`FaultProxy::accepted`] counts the connections accepted, [`FaultProxy::open`] those open.
//! Dropping the proxy closes its listener and every connection. It uses tokio only, and must be
//! started inside a tokio runtime.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward at once.
    Pass,
    /// Hold everything, forward nothing.
    Blackhole,
    /// Forward each chunk this long after it was read.
    Delay(Duration),
}

#[derive(Debug, Clone, Copy)]
struct State {
    fault: Fault,
    /// Bumped by every reset: a connection opened under an older generation closes.
    generation: u64,
}

/// Chunks read ahead of the writer per direction (each up to [`CHUNK`] bytes).
const READ_AHEAD: usize = 256;
/// Largest chunk read at once.
const CHUNK: usize = 64 * 1024;

/// A TCP proxy from a free port on 127.0.0.1 to one upstream address, with faults on command.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: watch::Sender<State>,
    counters: Arc<Counters>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    open: AtomicU64,
}

impl FaultProxy {
    /// Listens on 127.0.0.1 on a free port and forwards every connection to `upstream`, passing
    /// everything until a command says otherwise. Call inside a tokio runtime.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("the proxy's address");
        let listener = TcpListener::from_std(listener).expect("a tokio listener");
        let (state, _) = watch::channel(State {
            fault: Fault::Pass,
            generation: 0,
        });
        let counters = Arc::new(Counters::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            state.clone(),
            counters.clone(),
        ));
        FaultProxy {
            addr,
            upstream,
            state,
            counters,
            accept,
        }
    }

    /// The address to connect to instead of the upstream one.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address it forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Forwards everything at once (held bytes go on, in order).
    pub fn pass(&self) {
        self.set(Fault::Pass);
    }

    /// Closes every open connection now (a TCP reset to both sides); new connections pass.
    pub fn reset(&self) {
        self.state.send_modify(|state| {
            state.fault = Fault::Pass;
            state.generation += 1;
        });
    }

    /// Holds every byte in both directions on open and new connections: silence, not errors.
    pub fn blackhole(&self) {
        self.set(Fault::Blackhole);
    }

    /// Forwards each chunk `delay` after it was read, in order, in both directions.
    pub fn delay(&self, delay: Duration) {
        self.set(Fault::Delay(delay));
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        self.state.borrow().fault
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.counters.open.load(Ordering::SeqCst)
    }

    fn set(&self, fault: Fault) {
        self.state.send_modify(|state| state.fault = fault);
    }
}

impl Drop for FaultProxy {
    /// Stops accepting; the connections close as the command channel goes away.
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    state: watch::Sender<State>,
    counters: Arc<Counters>,
) {
    loop {
        match listener.accept().await {
            Ok((client, _)) => {
                counters.accepted.fetch_add(1, Ordering::SeqCst);
                counters.open.fetch_add(1, Ordering::SeqCst);
                let state = state.subscribe();
                let counters = counters.clone();
                tokio::spawn(async move {
                    connection(client, upstream, state).await;
                    counters.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
            // Out of file descriptors and the like: try again shortly.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// How a connection ended.
enum End {
    /// Both directions closed normally.
    Closed,
    /// A reset command, the proxy dropped, or an error on one side: reset both sides.
    Reset,
}

async fn connection(client: TcpStream, upstream: SocketAddr, mut state: watch::Receiver<State>) {
    let generation = state.borrow_and_update().generation;
    // Under a blackhole the client is accepted but not connected upstream until it lifts.
    let server = tokio::select! {
        () = reset_of(state.clone(), generation) => None,
        server = async {
            until_open(&mut state).await;
            TcpStream::connect(upstream).await.ok()
        } => server,
    };
    let Some(server) = server else {
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let end = {
        let up = pump(&mut client_read, &mut server_write, state.clone());
        let down = pump(&mut server_read, &mut client_write, state.clone());
        tokio::select! {
            () = reset_of(state.clone(), generation) => End::Reset,
            done = async { tokio::try_join!(up, down) } => match done {
                Ok(_) => End::Closed,
                Err(_) => End::Reset,
            },
        }
    };
    if let End::Reset = end {
        let _ = client_read.as_ref().set_zero_linger();
        let _ = server_read.as_ref().set_zero_linger();
    }
}

/// Returns when a reset happened after `generation`, or the proxy was dropped.
async fn reset_of(mut state: watch::Receiver<State>, generation: u64) {
    loop {
        if state.borrow_and_update().generation != generation {
            return;
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

/// Waits while the proxy is blackholed; returns the fault in force once it is not.
async fn until_open(state: &mut watch::Receiver<State>) -> Fault {
    loop {
        let fault = state.borrow_and_update().fault;
        if fault != Fault::Blackhole {
            return fault;
        }
        if state.changed().await.is_err() {
            // The proxy is gone; the connection's reset watch ends it.
            std::future::pending::<()>().await;
        }
    }
}

/// Forwards one direction: a reader takes chunks (stamped with when they were read) into a
/// bounded queue, a writer sends each when the fault in force allows; at the end of the input
/// the output is shut down (a half close passes through).
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    state: watch::Receiver<State>,
) -> std::io::Result<()> {
    let (chunks, mut queue) = mpsc::channel::<(Instant, Vec<u8>)>(READ_AHEAD);
    let read = async move {
        let mut buffer = vec![0u8; CHUNK];
        loop {
            let n = from.read(&mut buffer).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            if chunks
                .send((Instant::now(), buffer[..n].to_vec()))
                .await
                .is_err()
            {
                return Ok(());
            }
        }
    };
    let write = async move {
        let mut state = state;
        while let Some((read_at, chunk)) = queue.recv().await {
            loop {
                let fault = until_open(&mut state).await;
                let due = match fault {
                    Fault::Delay(delay) => read_at + delay,
                    _ => read_at,
                };
                if Instant::now() >= due {
                    break;
                }
                // Sleep until due, but look again if the fault changes meanwhile.
                tokio::select! {
                    () = tokio::time::sleep_until(due) => {}
                    changed = state.changed() => if changed.is_err() {
                        // The proxy is gone; the connection's reset watch ends it.
                        std::future::pending::<()>().await;
                    },
                }
            }
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(|_| ())
}
