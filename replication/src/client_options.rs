//! How a member dials its peers ([`ClientOptions`]): the cluster's bearer token, TLS, a
//! route per member (the fault harness's proxies), the connect timeout and the message
//! size limit; and the lazily connecting, pinged HTTP/2 channel it builds per address.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::types::NodeId;

/// The largest message either side accepts or sends, by default: a full AppendEntries batch
/// (openraft's `max_payload_entries`, 300 entries) of large groups, or one snapshot chunk.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 << 20;

/// How often a peer connection is pinged, and how long a ping may go unanswered before the
/// connection is dropped (the next call dials again).
const PEER_PING_EVERY: Duration = Duration::from_millis(500);
const PEER_PING_TIMEOUT: Duration = Duration::from_millis(1500);

/// A client option that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// The token cannot travel in an `authorization` header.
    #[error("the auth token cannot be sent in an authorization header (only visible ASCII can)")]
    BadToken,
}

/// How this node dials its peers.
#[derive(Clone)]
pub struct ClientOptions {
    pub(crate) authorization: Option<AsciiMetadataValue>,
    pub(crate) tls: Option<ClientTlsConfig>,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_message_bytes: usize,
    /// Where this node dials a member instead of the address the membership records (a
    /// test harness puts a fault proxy on every directed link this way).
    pub(crate) routes: HashMap<NodeId, String>,
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .field("tls", &self.tls.is_some())
            .field("connect_timeout", &self.connect_timeout)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("routes", &self.routes)
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            authorization: None,
            tls: None,
            connect_timeout: Duration::from_secs(1),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            routes: HashMap::new(),
        }
    }
}

impl ClientOptions {
    /// Plaintext, no token, 1 s connect timeout, 64 MiB messages.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends `authorization: Bearer <token>` on every call.
    ///
    /// # Errors
    /// [`OptionsError::BadToken`] when the token is not visible ASCII.
    pub fn with_token(mut self, token: &str) -> Result<Self, OptionsError> {
        let value = AsciiMetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| OptionsError::BadToken)?;
        self.authorization = Some(value);
        Ok(self)
    }

    /// Dials peers over TLS with `tls`.
    pub fn with_tls(mut self, tls: ClientTlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Dials member `id` at `addr` instead of the address the membership records for it.
    /// Leader hints still name the recorded address (the one clients use).
    pub fn with_route(mut self, id: NodeId, addr: impl Into<String>) -> Self {
        self.routes.insert(id, addr.into());
        self
    }

    /// How long a connection attempt may take before the peer counts as unreachable.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The largest message sent or accepted (match the server's
    /// [`RaftService::into_server`](crate::RaftService::into_server) limit).
    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// A lazily connecting channel to `addr` (`host:port`).
    pub(crate) fn channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        // HTTP/2 pings find a connection that went dead without a FIN or RST (a peer that
        // paused or was cut off): without them every later call on it waits out its deadline,
        // and the cluster can go without a leader long after the link healed.
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(PEER_PING_EVERY)
            .keep_alive_timeout(PEER_PING_TIMEOUT)
            .keep_alive_while_idle(true);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        Ok(endpoint.connect_lazy())
    }
}
