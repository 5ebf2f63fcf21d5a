//! The verdict's facts as the JSON-RPC error `data` (and the gap warning's `data`): the same
//! shape in both adapters (`reason`, `verdict`, `cursor`, then only what cursorlog revealed).

use cursorlog_proto::v1 as pb;
use serde_json::json;

/// `data` for a resumption answer: `reason`, `verdict`, `cursor`, then the facts cursorlog
/// revealed (nothing about a stream it will not explain).
pub(crate) fn facts(r: &pb::Resolution, cursor: &str, reason: &str) -> serde_json::Value {
    let mut data = json!({
        "reason": reason,
        "verdict": r.verdict().as_str_name(),
        "cursor": cursor,
    });
    if let Some(e) = r.current_epoch {
        data["current_epoch"] = json!(e);
    }
    if r.stream_state.is_some() {
        data["state"] = json!(state_name(r.stream_state()));
    }
    if let Some(h) = r.head {
        data["head"] = json!(h);
    }
    if let Some(w) = r.watermark {
        data["watermark"] = json!(w);
    }
    if let Some(t) = r.terminal_seq {
        data["terminal_seq"] = json!(t);
    }
    if let Some(d) = &r.detail {
        data["detail"] = json!(d);
    }
    if r.session_expired {
        data["session_expired"] = json!(true);
    }
    if r.missed_terminal_frame {
        data["missed_terminal_frame"] = json!(true);
    }
    data
}

/// `ABORTED` for `STREAM_STATE_ABORTED`.
pub(crate) fn state_name(state: pb::StreamState) -> &'static str {
    let name = state.as_str_name();
    name.strip_prefix("STREAM_STATE_").unwrap_or(name)
}

/// `data.reason` of a discontinuity, as in the Python adapter.
pub(crate) fn reason(verdict: pb::Verdict) -> &'static str {
    match verdict {
        pb::Verdict::CursorEvicted => "cursor_evicted",
        pb::Verdict::CursorAhead => "cursor_ahead",
        pb::Verdict::UnknownCursor => "unknown_cursor",
        pb::Verdict::MalformedCursor => "malformed_cursor",
        pb::Verdict::UnknownSession => "unknown_session",
        _ => "stream_mismatch",
    }
}

/// `data.reason` of a stream that ended without answering.
pub(crate) fn aborted_reason(state: pb::StreamState) -> &'static str {
    if state == pb::StreamState::Superseded {
        "stream_superseded"
    } else {
        "producer_aborted"
    }
}
