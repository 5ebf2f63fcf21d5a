//! The adapter's typed errors.

use rmcp::transport::streamable_http_server::session::local::LocalSessionManagerError;

/// What went wrong talking to cursorlog on behalf of rmcp.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cursorlog endpoint could not be parsed or reached.
    #[error(
        "cannot connect to cursorlog at {endpoint}: {source}; is `cursorlog serve` running there?"
    )]
    Connect {
        /// The endpoint as given.
        endpoint: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// A cursorlog call failed; `op` names it.
    #[error("cursorlog {op} failed: {} ({:?})", .status.message(), .status.code())]
    Rpc {
        /// The RPC, e.g. `Append`.
        op: &'static str,
        /// The gRPC status cursorlog (or the transport) answered.
        status: tonic::Status,
    },
    /// rmcp stored an event for a request stream this adapter was not told about. It happens
    /// when the event store is used without [`crate::CursorlogSessionManager`], or with SSE
    /// priming turned off (`SessionConfig::sse_retry = None`), because the session manager
    /// binds each new stream to its session and request while rmcp stores the priming event.
    #[error(
        "rmcp stream {stream_id} is not bound to an MCP session: use CursorlogSessionManager \
         (not LocalSessionManager::with_event_store) and keep SSE priming on"
    )]
    UnboundStream {
        /// rmcp's stream id.
        stream_id: String,
    },
    /// A JSON-RPC message could not be encoded, or a stored payload decoded.
    #[error("JSON-RPC payload: {0}")]
    Json(#[from] serde_json::Error),
    /// cursorlog answered something the API does not allow (a bug on one side).
    #[error("unexpected answer from cursorlog: {0}")]
    Protocol(String),
    /// Resuming a stream failed (cursorlog unreachable, or an answer it should not give).
    #[error("resume failed: {0}")]
    Resume(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The in-process rmcp session manager failed.
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

impl Error {
    pub(crate) fn rpc(op: &'static str) -> impl FnOnce(tonic::Status) -> Self {
        move |status| Self::Rpc { op, status }
    }

    /// The gRPC code of a failed call, if it was one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Rpc { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}

/// Result with the adapter's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
