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
//! Module map: [`event_id`] (the ids clients see), [`store`] (rmcp stream → cursorlog stream),
//! [`replay`] (verdict → what the client gets), [`session`] (session binding and restore).

pub mod error;
pub mod event_id;
pub mod replay;
pub mod session;
pub mod store;

use std::time::Duration;

use cursorlog_proto::v1::cursor_log_client::CursorLogClient;
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::{InterceptedService, Interceptor};
use tonic::transport::{Channel, Endpoint};

pub use error::{Error, Result};
pub use replay::{PRODUCER_ABORTED, RESUME_DISCONTINUITY};
pub use session::{CursorlogSessionManager, CursorlogSessionStore};
pub use store::CursorlogEventStore;

/// The gRPC client the adapter uses (cheap to clone: one HTTP/2 channel).
pub(crate) type Client = CursorLogClient<InterceptedService<Channel, BearerToken>>;

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
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of the adapter. The defaults suit a replica behind a load balancer.
#[derive(Debug, Clone)]
pub struct AdapterConfig {
    /// Producer lease of each request stream. While this process lives it renews the lease
    /// every third of it; if the process dies, cursorlog aborts the stream after at most this
    /// long and a client resuming elsewhere gets the [`PRODUCER_ABORTED`] error instead of
    /// waiting forever. `None` disables leases (a dead replica's streams then stay open).
    pub lease: Option<Duration>,
    /// rmcp's per-session settings. SSE priming (`sse_retry`) is forced on: the adapter binds
    /// each request stream to its session while rmcp stores the priming event, and priming
    /// gives the client a resumable id before the first real event.
    pub session: SessionConfig,
}

impl Default for AdapterConfig {
    fn default() -> Self {
        Self {
            lease: Some(Duration::from_secs(10)),
            session: SessionConfig::default(),
        }
    }
}

/// A connection to cursorlog, from which the rmcp session manager and session store are made.
#[derive(Debug, Clone)]
pub struct Cursorlog {
    channel: Channel,
    token: BearerToken,
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
        Ok(Self::from_channel(channel))
    }

    /// Uses an existing channel (for TLS or custom settings).
    pub fn from_channel(channel: Channel) -> Self {
        Self {
            channel,
            token: BearerToken::default(),
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
            ..self
        })
    }

    fn client(&self) -> Client {
        CursorLogClient::with_interceptor(self.channel.clone(), self.token.clone())
    }

    /// The rmcp session manager: sessions in process, their events in cursorlog.
    pub fn session_manager(&self, config: AdapterConfig) -> CursorlogSessionManager {
        let store = CursorlogEventStore::new(self.client(), config.lease);
        let mut local =
            LocalSessionManager::default().with_event_store(std::sync::Arc::new(store.clone()));
        local.session_config = config.session;
        if local.session_config.sse_retry.is_none() {
            local.session_config.sse_retry = Some(SessionConfig::DEFAULT_SSE_RETRY);
        }
        CursorlogSessionManager::new(local, store)
    }

    /// The rmcp session store (`StreamableHttpServerConfig::session_store`), so a replica can
    /// restore a session another replica created.
    pub fn session_store(&self) -> CursorlogSessionStore {
        CursorlogSessionStore::new(self.client())
    }
}
