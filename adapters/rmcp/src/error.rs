//! The adapter's typed errors.

use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManagerError, SessionError,
};

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
    /// rmcp stored an event for a request stream whose request the session manager did not
    /// declare: a stream created other than through [`crate::CursorlogSessionManager`]'s
    /// `create_stream`, or an event of a request stream this store has already finished.
    /// Refused rather than guessed.
    #[error(
        "rmcp stream {stream_id} is not a request stream this session is creating or writing: \
         create streams through CursorlogSessionManager"
    )]
    UnboundStream {
        /// rmcp's stream id.
        stream_id: String,
    },
    /// A session's store was asked to write another session's standalone stream.
    #[error("rmcp stream {stream_id} is not a stream of session {session}")]
    ForeignStream {
        /// rmcp's stream id.
        stream_id: String,
        /// The session of the store that refused it.
        session: String,
    },
    /// A stateless stream was resumed with an id that is not a stateless stream's.
    #[error("Last-Event-ID {0} is not an event id of a stateless stream")]
    NotStateless(String),
    /// The session is not served by this replica (rmcp restores it first when it can).
    #[error("session {0} is not served by this replica")]
    SessionNotFound(String),
    /// A session's stored state is not rmcp's `SessionState` JSON.
    #[error("the stored state of session {session} is not rmcp session state: {source}")]
    SessionState {
        /// The session.
        session: String,
        /// Why it does not decode.
        #[source]
        source: serde_json::Error,
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
    /// The in-process rmcp session worker failed.
    #[error(transparent)]
    Session(#[from] SessionError),
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
