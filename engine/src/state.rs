//! The domain state the verdicts are decided on: sessions and streams.
//!
//! These are plain values; where they are stored (the sled index today, a replicated tier
//! later) is behind [`StateView`], so the verdict logic never touches storage.

/// Lifecycle of a stream. Every state but `Open` is terminal and never changes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamState {
    /// Accepting events.
    Open,
    /// The producer wrote the terminal result/error frame.
    Completed,
    /// The producer gave up, died (lease expired) or its session expired.
    Aborted,
    /// The session's epoch advanced past the stream's epoch.
    Superseded,
}

impl StreamState {
    /// True for every state but `Open`.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Open)
    }

    /// Stable lowercase name, used in logs and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Completed => "completed",
            Self::Aborted => "aborted",
            Self::Superseded => "superseded",
        }
    }
}

impl std::fmt::Display for StreamState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the engine remembers about a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMeta {
    /// The opaque session id (the `Mcp-Session-Id`).
    pub id: String,
    /// The current epoch; cursors of other epochs get `EPOCH_MISMATCH`.
    pub epoch: u64,
    /// When the session was opened, ms since the Unix epoch.
    pub opened_at_ms: u64,
    /// When it was expired, if it was.
    pub expired_at_ms: Option<u64>,
}

/// What the engine remembers about a stream.
///
/// # Invariants
/// `1 <= watermark <= head + 1`; `terminal_seq == head` once `state` is terminal;
/// `state` never leaves a terminal value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMeta {
    /// Globally unique stream id.
    pub id: u64,
    /// Owning session.
    pub session: String,
    /// Epoch of the session the stream was opened in.
    pub epoch: u64,
    /// Lifecycle state.
    pub state: StreamState,
    /// Highest seq written (0 before the first event).
    pub head: u64,
    /// Lowest seq still retained (1 until something is evicted).
    pub watermark: u64,
    /// JSON-RPC request id the stream answers, if any.
    pub correlation: Option<String>,
    /// When the stream was opened, ms since the Unix epoch.
    pub opened_at_ms: u64,
    /// When it reached its terminal state.
    pub ended_at_ms: Option<u64>,
    /// Why it ended (abort reason, "epoch advanced", "lease expired", ...).
    pub end_reason: Option<String>,
    /// Whether the terminal state came with a terminal frame (stored at `head`).
    pub has_terminal_frame: bool,
    /// Producer lease in ms; the stream is aborted when no append or keep-alive renews it.
    pub lease_ms: Option<u64>,
}

impl StreamMeta {
    /// The terminal seq, once the stream is terminal.
    pub fn terminal_seq(&self) -> Option<u64> {
        self.state.is_terminal().then_some(self.head)
    }
}

/// Read access to the state verdicts are decided on.
pub trait StateView {
    /// The session, if it was ever opened and is still remembered.
    ///
    /// # Errors
    /// Storage failures.
    fn session(&self, id: &str) -> crate::Result<Option<SessionMeta>>;
    /// The stream, if it exists and is still remembered.
    ///
    /// # Errors
    /// Storage failures.
    fn stream(&self, id: u64) -> crate::Result<Option<StreamMeta>>;
}
