//! The verdict: is this cursor a valid continuation point, and if not, exactly why.
//!
//! [`decide`] is a pure function of the cursor and a [`StateView`]; it is the whole of
//! DESIGN.md's verdict table. Checks run in the table's order and the first that fails decides.

use crate::cursor::Cursor;
use crate::state::{StateView, StreamState};

/// The answer to "is this cursor resumable?". Every variant but `Resumable` means the
/// front-end must not replay the cursor's stream into the client's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Replay events strictly after the cursor, then follow live. Replay is gap-free.
    Resumable,
    /// The text is not `{u64}-{u64}-{u64}`. (HTTP 400.)
    MalformedCursor,
    /// The session never existed, was expired, or is past its metadata horizon. (404.)
    UnknownSession,
    /// The cursor's epoch is not the session's current epoch. (Fresh stream.)
    EpochMismatch,
    /// The stream does not exist in this session and epoch. Also returned for another
    /// session's stream, without saying so. (Explicit discontinuity.)
    UnknownCursor,
    /// The caller declared a stream and the cursor points into another. (Fresh stream.)
    StreamMismatch,
    /// The stream has a terminal tombstone. At the terminal seq nothing was lost; before it,
    /// reconcile from the outcome and never replay the stream into a new one.
    StreamTerminated,
    /// The events after the cursor were evicted by retention. (410-style discontinuity.)
    CursorEvicted,
    /// The cursor is beyond anything durably written. (Explicit discontinuity.)
    CursorAhead,
}

impl Verdict {
    /// Stable SCREAMING_SNAKE name, as in DESIGN.md and the proto.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Resumable => "RESUMABLE",
            Self::MalformedCursor => "MALFORMED_CURSOR",
            Self::UnknownSession => "UNKNOWN_SESSION",
            Self::EpochMismatch => "EPOCH_MISMATCH",
            Self::UnknownCursor => "UNKNOWN_CURSOR",
            Self::StreamMismatch => "STREAM_MISMATCH",
            Self::StreamTerminated => "STREAM_TERMINATED",
            Self::CursorEvicted => "CURSOR_EVICTED",
            Self::CursorAhead => "CURSOR_AHEAD",
        }
    }

    /// Every verdict, in table order.
    pub const ALL: [Self; 9] = [
        Self::MalformedCursor,
        Self::UnknownSession,
        Self::EpochMismatch,
        Self::UnknownCursor,
        Self::StreamMismatch,
        Self::StreamTerminated,
        Self::CursorEvicted,
        Self::CursorAhead,
        Self::Resumable,
    ];
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The facts behind a verdict, so a front-end can log and act without a second call.
/// Fields are `None` where the verdict may not reveal them (another session's stream).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The session's current epoch.
    pub current_epoch: Option<u64>,
    /// The cursor's stream state.
    pub stream_state: Option<StreamState>,
    /// The stream's highest written seq.
    pub head: Option<u64>,
    /// The stream's terminal seq, when terminal.
    pub terminal_seq: Option<u64>,
    /// The stream's lowest retained seq.
    pub watermark: Option<u64>,
    /// The session was explicitly expired (as opposed to never opened).
    pub session_expired: bool,
    /// Why it ended (for terminal streams) or why a cursor is malformed.
    pub detail: Option<String>,
    /// The JSON-RPC request id the cursor's stream answers (its `OpenStream` correlation),
    /// so a front-end can address an error or outcome to the client's pending call. Only
    /// for streams of the presenting session.
    pub correlation: Option<String>,
}

/// A verdict with its cursor and facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The verdict.
    pub verdict: Verdict,
    /// The parsed cursor, unless malformed.
    pub cursor: Option<Cursor>,
    /// The facts behind the verdict.
    pub facts: Facts,
}

impl Resolution {
    fn new(verdict: Verdict, cursor: Option<Cursor>, facts: Facts) -> Self {
        Self {
            verdict,
            cursor,
            facts,
        }
    }

    /// For `StreamTerminated`: true when the client is missing frames (cursor before the
    /// terminal seq) and must reconcile from the outcome.
    pub fn missed_terminal_frame(&self) -> bool {
        match (self.verdict, self.cursor, self.facts.terminal_seq) {
            (Verdict::StreamTerminated, Some(c), Some(t)) => c.seq < t,
            _ => false,
        }
    }
}

/// Decides the verdict for `cursor_text` presented in `session`, optionally declaring which
/// stream the client is joining.
///
/// Rules beyond the table (documented in README): a cursor past the terminal seq of a
/// terminated stream is `CURSOR_AHEAD` (it was never written); a cursor at `watermark - 1` is
/// resumable because every event after it is retained.
///
/// # Errors
/// Only storage failures of the view; every answer about the cursor is a verdict.
pub fn decide(
    view: &impl StateView,
    session: &str,
    cursor_text: &str,
    declared_stream: Option<u64>,
    now_ms: u64,
    horizon_ms: u64,
) -> crate::Result<Resolution> {
    let cursor = match cursor_text.parse::<Cursor>() {
        Ok(c) => c,
        Err(e) => {
            let facts = Facts {
                detail: Some(e.to_string()),
                ..Facts::default()
            };
            return Ok(Resolution::new(Verdict::MalformedCursor, None, facts));
        }
    };
    let some = Some(cursor);
    let Some(meta) = view.session(session)? else {
        return Ok(Resolution::new(
            Verdict::UnknownSession,
            some,
            Facts::default(),
        ));
    };
    if let Some(expired_at) = meta.expired_at_ms {
        // Expired sessions answer 404 at once; the horizon only decides how long the
        // "expired" fact (and the outcomes) are remembered.
        let facts = Facts {
            session_expired: expired_at.saturating_add(horizon_ms) > now_ms,
            ..Facts::default()
        };
        return Ok(Resolution::new(Verdict::UnknownSession, some, facts));
    }
    let epoch_only = Facts {
        current_epoch: Some(meta.epoch),
        ..Facts::default()
    };
    if cursor.epoch != meta.epoch {
        return Ok(Resolution::new(Verdict::EpochMismatch, some, epoch_only));
    }
    let stream = view.stream(cursor.stream)?.filter(|s| {
        s.session == session
            && s.epoch == cursor.epoch
            && !past_horizon(s.ended_at_ms, now_ms, horizon_ms)
    });
    let Some(stream) = stream else {
        return Ok(Resolution::new(Verdict::UnknownCursor, some, epoch_only));
    };
    let facts = Facts {
        current_epoch: Some(meta.epoch),
        stream_state: Some(stream.state),
        head: Some(stream.head),
        terminal_seq: stream.terminal_seq(),
        watermark: Some(stream.watermark),
        session_expired: false,
        detail: stream.end_reason.clone(),
        correlation: stream.correlation.clone(),
    };
    let verdict = if declared_stream.is_some_and(|d| d != cursor.stream) {
        Verdict::StreamMismatch
    } else if cursor.seq > stream.head {
        Verdict::CursorAhead
    } else if stream.state != StreamState::Open {
        Verdict::StreamTerminated
    } else if cursor.seq.saturating_add(1) < stream.watermark {
        Verdict::CursorEvicted
    } else {
        Verdict::Resumable
    };
    Ok(Resolution::new(verdict, some, facts))
}

/// True once a terminal stream (or expired session) is past the metadata horizon.
pub(crate) fn past_horizon(ended_at_ms: Option<u64>, now_ms: u64, horizon_ms: u64) -> bool {
    ended_at_ms.is_some_and(|t| t.saturating_add(horizon_ms) <= now_ms)
}
