//! cursorlog for rmcp: the durable, shared, session-safe event store and session store of
//! rmcp's Streamable HTTP server, so an MCP client can resume a broken SSE stream with
//! `Last-Event-ID` on *any* replica and always gets either exactly the events it missed or an
//! explicit JSON-RPC error saying why it cannot.
//!
//! ```no_run
//! # async fn wire() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
//! # #[derive(Clone)] struct MyServer;
//! # impl rmcp::ServerHandler for MyServer {}
//!
//! let cursorlog = cursorlog_rmcp::Cursorlog::connect("http://127.0.0.1:50051").await?;
//! let mut config = StreamableHttpServerConfig::default();
//! config.session_store = Some(Arc::new(cursorlog.session_store()));
//! let manager = Arc::new(cursorlog.session_manager(cursorlog_rmcp::AdapterConfig::default()));
//! let service = StreamableHttpService::new(|| Ok(MyServer), manager, config);
//! # let _ = service; Ok(()) }
//! ```
//!
//! Module map: [`session`] (one rmcp worker and one event store per session), [`store`] (rmcp
//! stream → cursorlog stream), [`appender`] (all sessions' writes in shared batches),
//! [`replay`] (verdict → what the client gets), [`session_store`] (restore on any replica),
//! [`event_id`] (the ids clients see).

pub mod appender;
pub mod error;
pub mod event_id;
mod facts;
pub mod failover;
#[cfg(test)]
mod fake;
pub mod replay;
pub mod session;
pub mod session_store;
pub mod stateless;
pub mod store;
pub mod tasks;

use std::sync::Arc;
use std::time::Duration;

use cursorlog_proto::v1 as pb;
use cursorlog_proto::v1::cursor_log_client::CursorLogClient;
use rmcp::transport::streamable_http_server::session::local::SessionConfig;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::{InterceptedService, Interceptor};
use tonic::transport::{Channel, Endpoint};

pub use appender::{AppendStats, BatchConfig};
pub use error::{Error, Result};
pub use failover::Failover;
pub use replay::{OnEvicted, GAP_LOGGER, PRODUCER_ABORTED, RESUME_DISCONTINUITY};
pub use session::CursorlogSessionManager;
pub use session_store::CursorlogSessionStore;
pub use stateless::StatelessEventStore;
pub use store::SessionEventStore;

/// The gRPC client of one cursorlog member (cheap to clone: one HTTP/2 channel).
pub(crate) type RawClient = CursorLogClient<InterceptedService<Channel, BearerToken>>;

/// The adapter's connection: every call goes to the leader; see [`failover`].
pub(crate) type Client = failover::Conn;

/// Adds `authorization: Bearer <token>` to every call when cursorlog requires a token
/// (`cursorlog serve --auth-token`).
#[derive(Debug, Clone, Default)]
pub(crate) struct BearerToken(Option<MetadataValue<Ascii>>);

impl Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

/// How long [`Cursorlog::connect`] waits for cursorlog to answer.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of the adapter. The defaults suit a replica behind a load balancer.
#[derive(Debug, Clone)]
pub struct AdapterConfig {
    /// Producer lease of each request stream. While this process lives it renews the lease
    /// every third of it; if the process dies, cursorlog aborts the stream after at most this
    /// long and a client resuming elsewhere gets the [`PRODUCER_ABORTED`] error instead of
    /// waiting forever. `None` disables leases (a dead replica's streams then stay open).
    pub lease: Option<Duration>,
    /// rmcp's per-session settings. SSE priming (`sse_retry`) is forced on: the adapter binds
    /// each request stream to its request while rmcp stores the priming event, and priming
    /// gives the client a resumable id before the first real event. `sse_retry` is also the
    /// retry hint of resumed connections.
    pub session: SessionConfig,
    /// How appends from all sessions are coalesced into shared `AppendBatch` calls.
    pub batch: BatchConfig,
    /// What a client resuming from an evicted cursor gets (default: a visible gap marker,
    /// then the rest of the stream).
    pub on_evicted: OnEvicted,
}

impl Default for AdapterConfig {
    fn default() -> Self {
        Self {
            lease: Some(Duration::from_secs(10)),
            session: SessionConfig::default(),
            batch: BatchConfig::default(),
            on_evicted: OnEvicted::default(),
        }
    }
}

/// What every session of one session manager shares: the cursorlog client, the batching
/// appender, the settings, and the resumed connections to close.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) appender: appender::Appender,
    /// `BatchConfig::open_in_batch`: streams open as items of the shared batch.
    pub(crate) open_in_batch: bool,
    pub(crate) lease: Option<Duration>,
    pub(crate) sse_retry: Duration,
    pub(crate) on_evicted: OnEvicted,
    pub(crate) closers: replay::Closers,
    idle_ttl: tokio::sync::OnceCell<Option<Duration>>,
}

impl Shared {
    /// A `Shared` with default settings on `client`, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(client: Client) -> Arc<Self> {
        Arc::new(Self {
            appender: appender::Appender::spawn(client.clone(), BatchConfig::default()),
            open_in_batch: BatchConfig::default().open_in_batch,
            client,
            lease: None,
            sse_retry: Duration::from_secs(3),
            on_evicted: OnEvicted::default(),
            closers: replay::Closers::default(),
            idle_ttl: tokio::sync::OnceCell::new(),
        })
    }

    /// cursorlog's session idle TTL (`None`: sessions do not expire when idle), asked once
    /// (with `GetSession` on `session`) and remembered; `None` too when it cannot be asked.
    pub(crate) async fn session_idle_ttl(&self, session: &str) -> Option<Duration> {
        *self
            .idle_ttl
            .get_or_init(|| async {
                match self
                    .client
                    .clone()
                    .get_session(pb::GetSessionRequest {
                        session: session.to_owned(),
                    })
                    .await
                {
                    Ok(r) => match r.into_inner().idle_ttl_ms {
                        0 => None,
                        ms => Some(Duration::from_millis(ms)),
                    },
                    Err(s) => {
                        tracing::warn!(error = %s, "cursorlog: cannot learn the session idle TTL; sessions are not renewed");
                        None
                    }
                }
            })
            .await
    }
}

/// A connection to cursorlog, from which the rmcp session manager and session store are made.
#[derive(Debug, Clone)]
pub struct Cursorlog {
    /// A channel built by the caller (`from_channel`), or the first endpoint's, connected.
    channel: Option<Channel>,
    /// The members' endpoints (empty with `from_channel`).
    endpoints: Vec<String>,
    token: BearerToken,
    failover: Failover,
    /// The connection every manager and store made from this shares (one leader, one
    /// channel per member), made on first use.
    conn: std::sync::OnceLock<Client>,
}

impl Cursorlog {
    /// Connects to cursorlog at `endpoint` (e.g. `http://127.0.0.1:50051`).
    ///
    /// # Errors
    /// [`Error::Connect`] if the endpoint is invalid or does not answer in 10 s.
    pub async fn connect(endpoint: impl Into<String>) -> Result<Self> {
        let endpoint = endpoint.into();
        let connect = |source| Error::Connect {
            endpoint: endpoint.clone(),
            source,
        };
        let channel = Endpoint::from_shared(endpoint.clone())
            .map_err(connect)?
            .connect_timeout(CONNECT_TIMEOUT)
            .connect()
            .await
            .map_err(connect)?;
        Ok(Self {
            channel: Some(channel),
            endpoints: vec![endpoint],
            token: BearerToken::default(),
            failover: Failover::no_wait(),
            conn: std::sync::OnceLock::new(),
        })
    }

    /// Uses the members of a replicated cursorlog (`cursorlog serve --node-id … --peers …`),
    /// e.g. `["http://10.0.0.1:7001", "http://10.0.0.2:7001", "http://10.0.0.3:7001"]`
    /// (any subset; leader hints name the others). Every call goes to the member that
    /// leads; on a leader change calls follow the new leader's hint or, without one, back
    /// off and try the next address ([`Failover::default`]: 50–400 ms, for up to 10 s). Each
    /// is dialled on first use, so this does not wait for any member.
    ///
    /// # Errors
    /// [`Error::Protocol`] if `endpoints` is empty; [`Error::Connect`] if one is not a URI.
    pub fn connect_cluster<I, S>(endpoints: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let endpoints: Vec<String> = endpoints.into_iter().map(Into::into).collect();
        if endpoints.is_empty() {
            return Err(Error::Protocol("no cursorlog endpoint given".into()));
        }
        for e in &endpoints {
            Endpoint::from_shared(e.clone()).map_err(|source| Error::Connect {
                endpoint: e.clone(),
                source,
            })?;
        }
        Ok(Self {
            channel: None,
            endpoints,
            token: BearerToken::default(),
            failover: Failover::default(),
            conn: std::sync::OnceLock::new(),
        })
    }

    /// [`Cursorlog::connect_cluster`] on a comma-separated list (`CURSORLOG_ENDPOINTS` style:
    /// `http://a:7001,http://b:7001,http://c:7001`); one address behaves as [`Cursorlog::connect`]
    /// except that nothing is dialled before the first call.
    ///
    /// # Errors
    /// As [`Cursorlog::connect_cluster`].
    pub fn connect_list(endpoints: &str) -> Result<Self> {
        Self::connect_cluster(
            endpoints
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_owned),
        )
    }

    /// Uses an existing channel (for TLS or custom settings). Leader hints cannot be dialled
    /// from it: calls are resent on this channel only.
    pub fn from_channel(channel: Channel) -> Self {
        Self {
            channel: Some(channel),
            endpoints: Vec::new(),
            token: BearerToken::default(),
            failover: Failover::no_wait(),
            conn: std::sync::OnceLock::new(),
        }
    }

    /// How calls ride out a leader change (see [`Failover`]); replaces the default of the
    /// constructor ([`Cursorlog::connect`] and [`Cursorlog::from_channel`] do not wait).
    pub fn with_failover(self, failover: Failover) -> Self {
        Self {
            failover,
            conn: std::sync::OnceLock::new(),
            ..self
        }
    }

    /// Sends `authorization: Bearer <token>` on every call, for a cursorlog started with
    /// `--auth-token`.
    ///
    /// # Errors
    /// [`Error::Protocol`] if the token is not a valid header value (visible ASCII).
    pub fn with_token(self, token: &str) -> Result<Self> {
        let value = format!("Bearer {token}")
            .parse::<MetadataValue<Ascii>>()
            .map_err(|_| Error::Protocol("the bearer token must be visible ASCII".into()))?;
        Ok(Self {
            token: BearerToken(Some(value)),
            conn: std::sync::OnceLock::new(),
            ..self
        })
    }

    fn client(&self) -> Client {
        self.conn.get_or_init(|| self.new_client()).clone()
    }

    fn new_client(&self) -> Client {
        if self.endpoints.is_empty() {
            if let Some(channel) = &self.channel {
                return failover::Conn::from_channel(
                    channel.clone(),
                    self.token.clone(),
                    self.failover,
                );
            }
        }
        failover::Conn::to_members(
            &self.endpoints,
            self.channel.clone(),
            self.token.clone(),
            self.failover,
        )
    }

    /// The rmcp session manager: sessions in process, their events in cursorlog. Must be
    /// called inside a tokio runtime (it starts the batching task).
    pub fn session_manager(&self, config: AdapterConfig) -> CursorlogSessionManager {
        let (shared, session) = self.shared(config);
        CursorlogSessionManager::new(shared, session)
    }

    /// rmcp's event store for stateless (2026-07-28) streams, for
    /// `NeverSessionManager::default().with_event_store(Arc::new(..))`; see [`stateless`].
    /// Must be called inside a tokio runtime (it starts the batching task).
    pub fn stateless_event_store(&self, config: AdapterConfig) -> StatelessEventStore {
        StatelessEventStore::new(self.shared(config).0)
    }

    fn shared(&self, config: AdapterConfig) -> (Arc<Shared>, SessionConfig) {
        let mut session = config.session;
        let sse_retry = *session
            .sse_retry
            .get_or_insert(SessionConfig::DEFAULT_SSE_RETRY);
        let client = self.client();
        let shared = Arc::new(Shared {
            open_in_batch: config.batch.open_in_batch,
            appender: appender::Appender::spawn(client.clone(), config.batch),
            client,
            lease: config.lease,
            sse_retry,
            on_evicted: config.on_evicted,
            closers: replay::Closers::default(),
            idle_ttl: tokio::sync::OnceCell::new(),
        });
        (shared, session)
    }

    /// The durable task manager (SEP-2663 tasks in cursorlog's `Tasks` service); see [`tasks`].
    pub fn task_manager(&self) -> tasks::CursorlogTaskManager {
        tasks::CursorlogTaskManager::new(self.client())
    }

    /// The rmcp session store (`StreamableHttpServerConfig::session_store`), so a replica can
    /// restore a session another replica created.
    pub fn session_store(&self) -> CursorlogSessionStore {
        CursorlogSessionStore::new(self.client())
    }
}
