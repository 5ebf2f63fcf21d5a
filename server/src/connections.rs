//! Client connections are bounded: a cap with a reserve for health probes, a deadline for the
//! HTTP/2 preface, an accept loop that backs off when descriptors run out, and the soft
//! descriptor limit raised to the hard one at start.
//!
//! tonic accepts whatever stream of connections it is given, so the bounds live here, in the
//! stream handed to `serve_with_incoming_shutdown`:
//!
//! - **Cap.** Each accepted connection takes a slot, freed when the connection closes. With
//!   all `--connections-max` slots taken, a connection takes one of the
//!   `--connections-reserved` slots, on which only the gRPC health service answers (checked
//!   by the cursorlog interceptor, see [`on_reserved_slot`]); with those taken too, it is
//!   closed at once (accepted and dropped: the client sees the connection end instead of
//!   hanging in the kernel's backlog).
//! - **Handshake deadline.** A connection must send the HTTP/2 preface and the header of its
//!   first frame ([`HANDSHAKE_BYTES`]) within `--handshake-timeout-secs`; until then each read
//!   also polls the deadline, and a missed deadline fails the read, which makes hyper close the
//!   connection. With TLS the bytes counted are the TLS handshake's, and tonic's own TLS
//!   handshake timeout is set to the same value.
//! - **Descriptors.** A failed accept (EMFILE, ENFILE, ENOMEM, ...) leaves the connection in
//!   the backlog, so the listener stays readable and retrying at once would spin: the loop
//!   pauses, doubling from 5 ms to 1 s, and logs once per burst of failures (and once when
//!   accepting works again).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};
use tonic::Status;

/// Bytes a client sends before its HTTP/2 connection is usable: the 24-byte preface and the
/// 9-byte header of the SETTINGS frame that must follow it.
pub const HANDSHAKE_BYTES: usize = 24 + 9;
/// First pause after a failed accept.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest pause between failed accepts.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The connection bounds and their counters (shown on the metrics page).
#[derive(Debug)]
pub struct Connections {
    max: u32,
    reserved: u32,
    handshake_timeout: Duration,
    slots: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    refused: AtomicU64,
    handshake_timeouts: AtomicU64,
    accept_failures: AtomicU64,
}

impl Connections {
    /// `max` connections, `reserved` more for health, each with `handshake_timeout` to send
    /// its preface.
    pub fn new(max: u32, reserved: u32, handshake_timeout: Duration) -> Arc<Self> {
        let max = max.max(1);
        Arc::new(Self {
            max,
            reserved,
            handshake_timeout,
            slots: Arc::new(Semaphore::new(max as usize)),
            reserve: Arc::new(Semaphore::new(reserved as usize)),
            refused: AtomicU64::new(0),
            handshake_timeouts: AtomicU64::new(0),
            accept_failures: AtomicU64::new(0),
        })
    }

    /// A slot for a new connection: an ordinary one, else a reserved one, else none.
    fn admit(&self) -> Option<(OwnedSemaphorePermit, bool)> {
        if let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
            return Some((slot, false));
        }
        Arc::clone(&self.reserve)
            .try_acquire_owned()
            .ok()
            .map(|slot| (slot, true))
    }

    /// Connections open now (reserved ones included).
    pub fn open(&self) -> u64 {
        let free = self.slots.available_permits() + self.reserve.available_permits();
        (u64::from(self.max) + u64::from(self.reserved)).saturating_sub(free as u64)
    }

    /// The cap on connections (`--connections-max`).
    pub fn max(&self) -> u32 {
        self.max
    }

    /// Connections closed at once because every slot was taken, since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections closed because their preface did not arrive in time, since start.
    pub fn handshake_timeouts(&self) -> u64 {
        self.handshake_timeouts.load(Ordering::Relaxed)
    }

    /// Failed accepts, since start.
    pub fn accept_failures(&self) -> u64 {
        self.accept_failures.load(Ordering::Relaxed)
    }
}

/// The pause after `failures` consecutive failed accepts: doubling from 5 ms up to 1 s.
pub(crate) fn accept_backoff(failures: u32) -> Duration {
    let factor = 1_u32 << failures.saturating_sub(1).min(16);
    ACCEPT_BACKOFF_MIN
        .saturating_mul(factor)
        .min(ACCEPT_BACKOFF_MAX)
}

/// True for an accept error that concerns only the connection being accepted (it was reset
/// or aborted before `accept` returned): the next accept can follow at once.
fn only_that_connection(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// The connections accepted on `listener`, bounded as the module docs say. The listener is
/// closed when the stream is dropped (tonic drops it when it stops accepting).
pub fn incoming(
    listener: TcpListener,
    connections: Arc<Connections>,
) -> impl Stream<Item = io::Result<Conn>> {
    futures_util::stream::unfold(
        (listener, connections),
        |(listener, connections)| async move {
            let conn = accept_one(&listener, &connections).await;
            Some((Ok(conn), (listener, connections)))
        },
    )
}

/// Accepts until a connection gets a slot; closes the ones that get none.
async fn accept_one(listener: &TcpListener, connections: &Arc<Connections>) -> Conn {
    accept_with_backoff(
        || listener.accept(),
        |(stream, peer): (TcpStream, SocketAddr)| match connections.admit() {
            Some((slot, reserved)) => {
                let _ = stream.set_nodelay(true);
                Some(Conn::new(stream, slot, reserved, connections))
            }
            None => {
                connections.refused.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, "connection refused: every connection slot is taken");
                None
            }
        },
        &connections.accept_failures,
    )
    .await
}

/// Calls `accept` until `admit` turns an accepted connection into a `T`. Failures other than
/// [`only_that_connection`] pause the loop ([`accept_backoff`]), logged once per burst.
async fn accept_with_backoff<C, T, A, F>(
    mut accept: A,
    mut admit: impl FnMut(C) -> Option<T>,
    failed: &AtomicU64,
) -> T
where
    A: FnMut() -> F,
    F: Future<Output = io::Result<C>>,
{
    let mut failures = 0_u32;
    loop {
        match accept().await {
            Ok(connection) => {
                if failures > 0 {
                    tracing::info!(failures, "accepting connections again");
                    failures = 0;
                }
                if let Some(admitted) = admit(connection) {
                    return admitted;
                }
            }
            Err(err) if only_that_connection(&err) => {}
            Err(err) => {
                failed.fetch_add(1, Ordering::Relaxed);
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(
                        error = %err,
                        "accepting a connection failed; pausing between attempts (up to {:?}) \
                         until it works again. Out of file descriptors? Raise the hard \
                         RLIMIT_NOFILE or lower --connections-max",
                        ACCEPT_BACKOFF_MAX
                    );
                }
                tokio::time::sleep(accept_backoff(failures)).await;
            }
        }
    }
}

/// What the server knows about a connection (a request extension).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Its addresses.
    pub tcp: TcpConnectInfo,
    /// True on a reserved slot: only health answers there.
    pub reserved: bool,
}

/// RESOURCE_EXHAUSTED when `extensions` say the call came on a reserved connection slot.
///
/// # Errors
/// The status to answer with.
pub fn on_reserved_slot(extensions: &tonic::Extensions, max: u32) -> Result<(), Status> {
    let reserved = extensions
        .get::<ConnInfo>()
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<ConnInfo>>()
                .map(TlsConnectInfo::get_ref)
        })
        .is_some_and(|info| info.reserved);
    if reserved {
        return Err(Status::resource_exhausted(format!(
            "too many connections: the server's limit is {max} (--connections-max); this \
             connection is on a slot reserved for health checks. Reconnect later or reuse \
             connections"
        )));
    }
    Ok(())
}

/// An accepted connection: holds its slot until it closes, and fails its reads once the
/// handshake deadline passes without [`HANDSHAKE_BYTES`] received.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    info: ConnInfo,
    /// Until the handshake bytes arrived.
    deadline: Option<Pin<Box<Sleep>>>,
    received: usize,
    connections: Arc<Connections>,
    _slot: OwnedSemaphorePermit,
}

impl Conn {
    fn new(
        stream: TcpStream,
        slot: OwnedSemaphorePermit,
        reserved: bool,
        connections: &Arc<Connections>,
    ) -> Self {
        let tcp = TcpConnectInfo {
            local_addr: stream.local_addr().ok(),
            remote_addr: stream.peer_addr().ok(),
        };
        Self {
            stream,
            info: ConnInfo { tcp, reserved },
            deadline: Some(Box::pin(tokio::time::sleep(connections.handshake_timeout))),
            received: 0,
            connections: Arc::clone(connections),
            _slot: slot,
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if read.is_pending() {
            if let Some(deadline) = &mut this.deadline {
                if deadline.as_mut().poll(cx).is_ready() {
                    this.deadline = None;
                    this.connections
                        .handshake_timeouts
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        peer = ?this.info.tcp.remote_addr,
                        "closing a connection that sent no HTTP/2 preface in time"
                    );
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no HTTP/2 preface within the handshake timeout",
                    )));
                }
            }
            return Poll::Pending;
        }
        this.received += buf.filled().len() - before;
        if this.received >= HANDSHAKE_BYTES {
            this.deadline = None;
        }
        read
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit, so the connection cap, not the
/// descriptor limit, is what bounds connections. Returns the limits before and after.
///
/// # Errors
/// When the limit cannot be set.
pub fn raise_descriptor_limit() -> io::Result<(Option<u64>, Option<u64>)> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return Ok((limit.current, limit.current));
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    setrlimit(Resource::Nofile, raised)?;
    Ok((limit.current, getrlimit(Resource::Nofile).current))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_cap() {
        assert_eq!(accept_backoff(1), ACCEPT_BACKOFF_MIN);
        assert_eq!(accept_backoff(3), ACCEPT_BACKOFF_MIN * 4);
        assert_eq!(accept_backoff(u32::MAX), ACCEPT_BACKOFF_MAX);
    }

    #[test]
    fn slots_then_reserved_slots_then_none() {
        let c = Connections::new(2, 1, Duration::from_secs(1));
        let a = c.admit().unwrap();
        let b = c.admit().unwrap();
        assert!(!a.1 && !b.1);
        let r = c.admit().unwrap();
        assert!(r.1, "the third connection takes the reserved slot");
        assert!(c.admit().is_none());
        assert_eq!(c.open(), 3);
        drop(a);
        assert!(
            !c.admit().unwrap().1,
            "a freed ordinary slot is reused first"
        );
    }

    #[test]
    fn only_health_answers_on_a_reserved_slot() {
        let mut ext = tonic::Extensions::new();
        let tcp = TcpConnectInfo {
            local_addr: None,
            remote_addr: None,
        };
        ext.insert(ConnInfo {
            tcp: tcp.clone(),
            reserved: true,
        });
        let err = on_reserved_slot(&ext, 7).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("--connections-max"), "{err:?}");
        let mut ext = tonic::Extensions::new();
        ext.insert(ConnInfo {
            tcp,
            reserved: false,
        });
        assert!(on_reserved_slot(&ext, 7).is_ok());
        assert!(on_reserved_slot(&tonic::Extensions::new(), 7).is_ok());
    }

    /// A listener that fails every accept (as with EMFILE) is not polled in a tight loop: on
    /// a paused clock, ten failures take exactly the backoff schedule.
    #[tokio::test(start_paused = true)]
    async fn failing_accepts_back_off() {
        let start = tokio::time::Instant::now();
        let failed = AtomicU64::new(0);
        let mut calls = 0_u32;
        let got = accept_with_backoff(
            || {
                calls += 1;
                let n = calls;
                async move {
                    if n <= 10 {
                        Err(io::Error::from_raw_os_error(24)) // EMFILE
                    } else {
                        Ok(n)
                    }
                }
            },
            Some,
            &failed,
        )
        .await;
        assert_eq!(got, 11);
        assert_eq!(failed.load(Ordering::Relaxed), 10);
        let schedule: Duration = (1..=10).map(accept_backoff).sum();
        assert_eq!(tokio::time::Instant::now() - start, schedule);
    }

    #[test]
    fn the_soft_descriptor_limit_is_raised_to_the_hard_one() {
        let (_, after) = raise_descriptor_limit().unwrap();
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(after, limit.maximum);
        assert_eq!(limit.current, limit.maximum);
    }
}
