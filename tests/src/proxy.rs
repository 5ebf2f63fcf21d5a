//! A TCP fault proxy for ONE directed link, switchable at run time.
//!
//! # What a "directed link" is
//!
//! A [`Proxy`] listens on `127.0.0.1:0` and forwards every connection it accepts to one target
//! address. Node A is configured to reach node B through the proxy's address, so the proxy sits
//! on the connections **initiated by A towards B**. Such a connection carries both A's requests
//! and B's responses: blackholing the proxy cuts A's calls to B, both ways. B's calls to A run
//! over connections B initiates, through a second proxy (B→A); a harness with N nodes uses one
//! proxy per ordered pair. To isolate A completely, blackhole every proxy A dials through and
//! every proxy that dials A.
//!
//! Within one link, "upstream" is the bytes the initiator (A) sends towards the target (B) and
//! "downstream" is B's bytes back to A. [`Mode::BlackholeUpstream`] and
//! [`Mode::BlackholeDownstream`] stop one of them only, to model asymmetric partitions (B
//! receives A's requests but A never hears back, or the reverse).
//!
//! # When a mode takes effect
//!
//! [`ProxyHandle::set_mode`] applies to live connections as well as new ones. Bytes the proxy
//! reads after `set_mode` returns are delivered under the new mode; bytes already written to the
//! other socket before the switch cannot be recalled (they were "on the wire"). Bytes held by a
//! blackhole or a delay stay queued in the proxy (up to [`HELD_BYTES`] per direction, then the
//! proxy stops reading and the sender's socket buffers fill, as across a real partition) and are
//! delivered in order when the mode allows it again, as TCP retransmission would after a
//! partition heals.
//!
//! A new connection is connected to the target only under [`Mode::Pass`] or [`Mode::Delay`].
//! Under any blackhole mode it is accepted (the kernel completes the client's handshake before
//! the proxy sees it) and held, unforwarded, until the mode allows both directions; then it is
//! connected. A connection the target refuses is reset.
//!
//! Dropping the [`Proxy`] stops listening and closes every connection.

use std::io;
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// How many bytes a direction holds (read, not yet delivered) before the proxy stops reading
/// from its sender. Counted in bytes, not reads, so that a delayed stream of small writes is not
/// throttled to a few reads per delay.
pub const HELD_BYTES: usize = 1 << 20;
/// The largest single read the proxy makes, as semaphore permits.
const CHUNK_PERMITS: u32 = 16 * 1024;
/// The largest single read the proxy makes.
const CHUNK: usize = CHUNK_PERMITS as usize;

/// What the proxy does with the link's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward bytes both ways as they arrive.
    Pass,
    /// Forward nothing either way: connections stay open, bytes are held in the proxy, the peers
    /// see a hang. New connections are accepted but not forwarded (held).
    Blackhole,
    /// The initiator's bytes stop reaching the target; the target's bytes still flow back.
    BlackholeUpstream,
    /// The target's bytes stop reaching the initiator; the initiator's bytes still flow.
    BlackholeDownstream,
    /// Close every live connection with RST on both sides (`SO_LINGER` 0), and reset every new
    /// one as soon as it is accepted. Setting `Reset` again resets the connections made since.
    Reset,
    /// Forward both ways, each direction delivering a read at least this long after the proxy
    /// read it (one-way latency; a round trip gains twice this). Byte order is kept.
    Delay(Duration),
    /// Keep forwarding live connections (as [`Mode::Pass`]); reset new connections (and held
    /// ones not yet forwarded) as soon as they are accepted. The client's `connect` succeeds
    /// (the kernel answers it) and its first read or write fails, as a refused dial would.
    DropNew,
}

/// Counters of a proxy since it started. Each is counted before the effect it counts can be
/// observed by a peer: a client that has read a byte can rely on that byte being counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted from initiators.
    pub accepted: u64,
    /// Accepted connections connected through to the target.
    pub forwarded: u64,
    /// Connections the proxy closed with RST (by [`Mode::Reset`], [`Mode::DropNew`], a refused
    /// target, or an I/O error on either side).
    pub reset: u64,
    /// Bytes written towards the target (initiator → target).
    pub bytes_upstream: u64,
    /// Bytes written towards the initiator (target → initiator).
    pub bytes_downstream: u64,
}

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// Binding or inspecting the listening socket failed.
    #[error("binding the proxy listener on 127.0.0.1:0")]
    Bind(#[source] io::Error),
}

/// The mode and how many times [`Mode::Reset`] has been set (so a `Reset` replaced before a
/// connection saw it still resets that connection).
#[derive(Debug, Clone, Copy)]
struct Setting {
    mode: Mode,
    resets: u64,
}

#[derive(Debug)]
struct Shared {
    target: SocketAddr,
    setting: watch::Sender<Setting>,
    accepted: AtomicU64,
    forwarded: AtomicU64,
    reset: AtomicU64,
    bytes_upstream: AtomicU64,
    bytes_downstream: AtomicU64,
}

/// A cheap cloneable handle that switches a [`Proxy`]'s mode and reads its counters. It keeps
/// working (to no effect) after the proxy is dropped.
#[derive(Debug, Clone)]
pub struct ProxyHandle {
    shared: Arc<Shared>,
}

impl ProxyHandle {
    /// Switches the mode, for live connections and new ones (see the module documentation for
    /// exactly which bytes the new mode governs).
    pub fn set_mode(&self, mode: Mode) {
        self.shared.setting.send_modify(|setting| {
            setting.mode = mode;
            if mode == Mode::Reset {
                setting.resets += 1;
            }
        });
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.shared.setting.borrow().mode
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        Stats {
            accepted: s.accepted.load(Ordering::SeqCst),
            forwarded: s.forwarded.load(Ordering::SeqCst),
            reset: s.reset.load(Ordering::SeqCst),
            bytes_upstream: s.bytes_upstream.load(Ordering::SeqCst),
            bytes_downstream: s.bytes_downstream.load(Ordering::SeqCst),
        }
    }
}

/// A running proxy for one directed link (see the module documentation). Stops, closing every
/// connection, when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    handle: ProxyHandle,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `target` in [`Mode::Pass`]. Must be called inside a tokio runtime; the
    /// proxy runs on it.
    ///
    /// # Errors
    /// [`ProxyError::Bind`] when the listener cannot be bound.
    pub async fn start(target: SocketAddr) -> Result<Self, ProxyError> {
        Self::start_with(target, Mode::Pass).await
    }

    /// Starts a proxy to `target` in `mode`.
    ///
    /// # Errors
    /// [`ProxyError::Bind`] when the listener cannot be bound.
    pub async fn start_with(target: SocketAddr, mode: Mode) -> Result<Self, ProxyError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(ProxyError::Bind)?;
        let addr = listener.local_addr().map_err(ProxyError::Bind)?;
        let resets = u64::from(mode == Mode::Reset);
        let (setting, _) = watch::channel(Setting { mode, resets });
        let shared = Arc::new(Shared {
            target,
            setting,
            accepted: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            reset: AtomicU64::new(0),
            bytes_upstream: AtomicU64::new(0),
            bytes_downstream: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self {
            addr,
            handle: ProxyHandle { shared },
            accept,
        })
    }

    /// The address initiators connect to (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address connections are forwarded to.
    pub fn target(&self) -> SocketAddr {
        self.handle.shared.target
    }

    /// A handle to switch the mode from elsewhere.
    pub fn handle(&self) -> ProxyHandle {
        self.handle.clone()
    }

    /// Switches the mode: [`ProxyHandle::set_mode`].
    pub fn set_mode(&self, mode: Mode) {
        self.handle.set_mode(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.handle.mode()
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.handle.stats()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // The accept task owns every connection task (a JoinSet), and each connection task its
        // pumps: aborting it drops them all, which closes every socket.
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    connections.spawn(serve_connection(client, Arc::clone(&shared)));
                }
                // ECONNABORTED and the like concern one connection; EMFILE would repeat, so
                // back off a little instead of spinning (a pause, not a synchronisation).
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Which way a pump forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Initiator → target.
    Up,
    /// Target → initiator.
    Down,
}

/// One read, queued for delivery.
#[derive(Debug)]
enum Chunk {
    Data { bytes: Vec<u8>, read_at: Instant },
    Eof { read_at: Instant },
}

impl Chunk {
    fn read_at(&self) -> Instant {
        match self {
            Self::Data { read_at, .. } | Self::Eof { read_at } => *read_at,
        }
    }
}

/// Closes `stream` with RST: `SO_LINGER` 0, then the last reference is dropped.
fn reset(shared: &Shared, stream: &TcpStream) {
    let _ = stream.set_zero_linger();
    shared.reset.fetch_add(1, Ordering::SeqCst);
}

async fn serve_connection(client: TcpStream, shared: Arc<Shared>) {
    let mut setting = shared.setting.subscribe();
    // A new connection waits here while a blackhole mode holds it.
    let resets_at_start = loop {
        let now = *setting.borrow_and_update();
        match now.mode {
            Mode::Pass | Mode::Delay(_) => break now.resets,
            Mode::Reset | Mode::DropNew => return reset(&shared, &client),
            Mode::Blackhole | Mode::BlackholeUpstream | Mode::BlackholeDownstream => {
                if setting.changed().await.is_err() {
                    return;
                }
            }
        }
    };
    let Ok(server) = TcpStream::connect(shared.target).await else {
        return reset(&shared, &client);
    };
    // Small writes (gRPC frames, test messages) go out at once, so Delay adds only its delay.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    shared.forwarded.fetch_add(1, Ordering::SeqCst);

    let client = Arc::new(client);
    let server = Arc::new(server);
    let mut pumps = JoinSet::new();
    for (direction, from, to) in [
        (Direction::Up, &client, &server),
        (Direction::Down, &server, &client),
    ] {
        // Unbounded by count; bounded by the bytes held, through `room`.
        let (tx, rx) = mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(HELD_BYTES));
        pumps.spawn(read_side(Arc::clone(from), tx, Arc::clone(&room)));
        pumps.spawn(write_side(
            rx,
            Arc::clone(to),
            direction,
            Arc::clone(&shared),
            room,
        ));
    }
    loop {
        tokio::select! {
            joined = pumps.join_next() => match joined {
                // Both directions ended cleanly: close normally.
                None => return,
                Some(Ok(Ok(()))) => {}
                // An I/O error (or a panic) on either side: break the whole path, as a broken
                // network path would.
                Some(_) => break,
            },
            changed = setting.changed() => {
                if changed.is_err() || setting.borrow_and_update().resets != resets_at_start {
                    break;
                }
            }
        }
    }
    // Stop the pumps first, so that ours are the last references to the sockets.
    pumps.shutdown().await;
    reset(&shared, &client);
    let _ = server.set_zero_linger();
}

/// Reads `from` into the queue until end of stream or an error, while fewer than
/// [`HELD_BYTES`] are held.
async fn read_side(
    from: Arc<TcpStream>,
    queue: mpsc::UnboundedSender<Chunk>,
    room: Arc<Semaphore>,
) -> io::Result<()> {
    let mut buf = vec![0; CHUNK];
    loop {
        // Room for a whole read before reading; the writer gives back what it delivers.
        let Ok(permit) = room.acquire_many(CHUNK_PERMITS).await else {
            return Ok(());
        };
        permit.forget();
        // `async_io` waits again when the socket only looked readable (tokio's readiness
        // has false positives): the room taken above is spent on a real read or given back,
        // never lost to a wake-up without data.
        let read = from
            .async_io(Interest::READABLE, || from.try_read(&mut buf))
            .await;
        let n = match read {
            Ok(n) => n,
            Err(e) => {
                room.add_permits(CHUNK);
                return Err(e);
            }
        };
        // Give back the room this read did not use.
        room.add_permits(CHUNK - n);
        let read_at = Instant::now();
        let chunk = if n == 0 {
            Chunk::Eof { read_at }
        } else {
            Chunk::Data {
                bytes: buf[..n].to_vec(),
                read_at,
            }
        };
        if queue.send(chunk).is_err() || n == 0 {
            return Ok(());
        }
    }
}

/// Delivers the queue to `to`, each chunk when the mode allows it.
async fn write_side(
    mut queue: mpsc::UnboundedReceiver<Chunk>,
    to: Arc<TcpStream>,
    direction: Direction,
    shared: Arc<Shared>,
    room: Arc<Semaphore>,
) -> io::Result<()> {
    let mut setting = shared.setting.subscribe();
    while let Some(chunk) = queue.recv().await {
        wait_deliverable(chunk.read_at(), direction, &mut setting).await;
        match chunk {
            Chunk::Data { bytes, .. } => {
                let counter = match direction {
                    Direction::Up => &shared.bytes_upstream,
                    Direction::Down => &shared.bytes_downstream,
                };
                counter.fetch_add(bytes.len() as u64, Ordering::SeqCst);
                write_all(&to, &bytes).await?;
                room.add_permits(bytes.len());
            }
            Chunk::Eof { .. } => {
                socket2::SockRef::from(&*to).shutdown(Shutdown::Write)?;
            }
        }
    }
    Ok(())
}

/// Returns when a chunk read at `read_at` may be delivered in `direction`.
async fn wait_deliverable(
    read_at: Instant,
    direction: Direction,
    setting: &mut watch::Receiver<Setting>,
) {
    loop {
        let mode = setting.borrow_and_update().mode;
        let until = match mode {
            Mode::Pass | Mode::DropNew => return,
            Mode::Delay(delay) => Some(read_at + delay),
            Mode::BlackholeUpstream if direction == Direction::Down => return,
            Mode::BlackholeDownstream if direction == Direction::Up => return,
            // Held; under Reset the connection's supervisor is about to reset it.
            Mode::Blackhole | Mode::BlackholeUpstream | Mode::BlackholeDownstream | Mode::Reset => {
                None
            }
        };
        let changed = async {
            if setting.changed().await.is_err() {
                // The sender lives in `Shared`, which this task holds: unreachable, but never
                // deliver because of it.
                std::future::pending::<()>().await;
            }
        };
        match until {
            Some(deadline) => tokio::select! {
                () = tokio::time::sleep_until(deadline) => return,
                () = changed => {}
            },
            None => changed.await,
        }
    }
}

async fn write_all(to: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        let n = to
            .async_io(Interest::WRITABLE, || to.try_write(bytes))
            .await?;
        bytes = &bytes[n..];
    }
    Ok(())
}

#[cfg(test)]
#[path = "proxy_tests.rs"]
mod tests;
