//! Resumption: a `Last-Event-ID` becomes one cursorlog verdict, and the verdict becomes
//! something rmcp's client understands. Never a silent empty stream where the client's call
//! would then wait forever:
//!
//! | verdict | the client gets |
//! |---|---|
//! | `RESUMABLE` | every event after the cursor, then live events from any replica until the terminal frame; if the producer dies first, the aborted error |
//! | `STREAM_TERMINATED`, cursor before the terminal seq | the stored terminal frame once, under its original event id (nothing else) |
//! | `STREAM_TERMINATED` at the terminal seq, `EPOCH_MISMATCH` | a clean end, no replay |
//! | `CURSOR_EVICTED`, `CURSOR_AHEAD`, `UNKNOWN_CURSOR`, `MALFORMED_CURSOR`, `UNKNOWN_SESSION`, `STREAM_MISMATCH` | a JSON-RPC error response (code [`RESUME_DISCONTINUITY`]) for the original request id |
//! | producer aborted (stream ABORTED/SUPERSEDED without a terminal frame) | a JSON-RPC error response (code [`PRODUCER_ABORTED`]) |
//!
//! Every verdict is logged at `info` with its facts.

use cursorlog_proto::v1 as pb;
use pb::read_response::Item;
use rmcp::model::{ErrorCode, ErrorData, RequestId, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::{EventStream, ServerSseMessage};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::{Error, Result};
use crate::event_id::{self, EventId};
use crate::Client;

/// JSON-RPC error code for "this stream cannot be resumed from that cursor": the client must
/// re-issue the request (or reconcile, if it may have had effects). `data.verdict` says why.
pub const RESUME_DISCONTINUITY: i32 = -32011;
/// JSON-RPC error code for "the server producing this response stopped before finishing".
pub const PRODUCER_ABORTED: i32 = -32012;

/// Events buffered between the cursorlog reader and the client's SSE connection.
const BUFFER: usize = 64;

pub(crate) async fn resume(
    client: Client,
    session: &str,
    last_event_id: &str,
) -> Result<EventStream> {
    let id = EventId::parse(last_event_id);
    let mut reader = client
        .clone()
        .read(pb::ReadRequest {
            session: session.to_owned(),
            last_event_id: id.cursor.clone(),
            declared_stream: None,
            follow: true,
            batch_events_max: 0,
            resume_own_stream: false,
        })
        .await
        .map_err(Error::rpc("Read"))?
        .into_inner();
    let resolution = match reader.message().await.map_err(Error::rpc("Read"))? {
        Some(pb::ReadResponse {
            item: Some(Item::Resolution(r)),
        }) => r,
        other => {
            return Err(Error::Protocol(format!(
                "Read did not start with a resolution: {other:?}"
            )))
        }
    };
    let verdict = resolution.verdict();
    // The stored request id is authoritative; the client's own claim is the fallback for
    // cursors cursorlog will not explain.
    let request = resolution
        .correlation
        .as_deref()
        .and_then(event_id::request_from_correlation)
        .or(id.request.clone());
    tracing::info!(
        session,
        last_event_id,
        verdict = verdict.as_str_name(),
        current_epoch = resolution.current_epoch,
        state = resolution
            .stream_state
            .map(|_| resolution.stream_state().as_str_name()),
        head = resolution.head,
        terminal_seq = resolution.terminal_seq,
        watermark = resolution.watermark,
        detail = resolution.detail.as_deref(),
        missed_terminal_frame = resolution.missed_terminal_frame,
        "cursorlog: resume verdict"
    );
    let (tx, rx) = mpsc::channel(BUFFER);
    let out = Out {
        tx,
        request,
        cursor: id.cursor.clone(),
    };
    match verdict {
        pb::Verdict::Resumable => {
            tokio::spawn(follow(reader, out, resolution));
        }
        pb::Verdict::StreamTerminated => {
            let session = session.to_owned();
            tokio::spawn(async move { terminated(client, session, out, resolution).await });
        }
        pb::Verdict::EpochMismatch => {}
        _ => {
            tokio::spawn(async move { out.discontinuity(&resolution).await });
        }
    }
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// Where the resumed events go, and what the error responses are addressed to.
struct Out {
    tx: mpsc::Sender<ServerSseMessage>,
    request: Option<RequestId>,
    cursor: String,
}

impl Out {
    /// Sends one event; false once the client is gone.
    async fn send(&self, message: ServerSseMessage) -> bool {
        self.tx.send(message).await.is_ok()
    }

    async fn event(&self, e: &pb::Event) -> std::result::Result<bool, Error> {
        let message: ServerJsonRpcMessage = serde_json::from_slice(&e.payload)?;
        let id = event_id::format(&e.id, self.request.as_ref());
        Ok(self.send(ServerSseMessage::new(id, message)).await)
    }

    /// An error response for the original request; without an event id, so the client's
    /// resumption point does not move past events it never got.
    async fn error(&self, code: i32, message: String, data: serde_json::Value) {
        let error = ErrorData::new(ErrorCode(code), message, Some(data));
        let message = ServerJsonRpcMessage::error(error, self.request.clone());
        self.send(ServerSseMessage::from_message(message)).await;
    }

    async fn discontinuity(&self, r: &pb::Resolution) {
        let verdict = r.verdict();
        let what = match verdict {
            pb::Verdict::CursorEvicted => format!(
                "the events after it were evicted by retention (the stream keeps seq {} and up)",
                r.watermark.unwrap_or_default()
            ),
            pb::Verdict::CursorAhead => format!(
                "it is beyond anything the server durably wrote (the stream's head is seq {})",
                r.head.unwrap_or_default()
            ),
            pb::Verdict::UnknownCursor => "it does not name a stream of this session".to_owned(),
            pb::Verdict::MalformedCursor => format!(
                "it is not an event id this server issued ({})",
                r.detail.as_deref().unwrap_or("malformed")
            ),
            pb::Verdict::UnknownSession => "the session is unknown or has expired".to_owned(),
            _ => "it belongs to another stream".to_owned(),
        };
        let action = if verdict == pb::Verdict::UnknownSession {
            "re-initialize the session, then re-issue the request"
        } else {
            "re-issue the request (reconcile first if it may already have had effects)"
        };
        let message = format!(
            "cannot resume: Last-Event-ID {} is unresumable ({}): {what}; nothing was replayed; {action}",
            self.cursor,
            verdict.as_str_name()
        );
        let data = facts(r, &self.cursor, reason(verdict));
        self.error(RESUME_DISCONTINUITY, message, data).await;
    }

    async fn aborted(
        &self,
        state: pb::StreamState,
        reason: Option<&str>,
        facts: serde_json::Value,
    ) {
        let reason = reason.unwrap_or("no reason recorded");
        let message = format!(
            "the server producing this response stopped before finishing ({}: {reason}); \
             the request may have partly run: reconcile, then re-issue it if needed",
            state_name(state)
        );
        self.error(PRODUCER_ABORTED, message, facts).await;
    }
}

/// The verdict's facts, for the error's `data`: the same shape as the Python adapter's
/// (`reason`, `verdict`, `cursor`, then only the facts cursorlog revealed).
fn facts(r: &pb::Resolution, cursor: &str, reason: &str) -> serde_json::Value {
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
fn state_name(state: pb::StreamState) -> &'static str {
    let name = state.as_str_name();
    name.strip_prefix("STREAM_STATE_").unwrap_or(name)
}

/// `data.reason` of a discontinuity, as in the Python adapter.
fn reason(verdict: pb::Verdict) -> &'static str {
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
fn aborted_reason(state: pb::StreamState) -> &'static str {
    if state == pb::StreamState::Superseded {
        "stream_superseded"
    } else {
        "producer_aborted"
    }
}

/// RESUMABLE: replay, then follow until the stream ends. A request stream that ends without
/// its response (producer crashed, lease expired, epoch advanced) gets the aborted error.
async fn follow(mut reader: tonic::Streaming<pb::ReadResponse>, out: Out, r: pb::Resolution) {
    let mut answered = false;
    loop {
        let item = match reader.message().await {
            Ok(Some(pb::ReadResponse { item: Some(item) })) => item,
            Ok(_) => {
                tracing::warn!(cursor = %out.cursor, "cursorlog: follow ended without an end message");
                return;
            }
            Err(status) => {
                // The client reconnects with its last event id; nothing is lost.
                tracing::warn!(cursor = %out.cursor, error = %status, "cursorlog: follow failed");
                return;
            }
        };
        match item {
            Item::Events(batch) => {
                for e in &batch.events {
                    match out.event(e).await {
                        Ok(true) => {}
                        Ok(false) => return,
                        Err(err) => {
                            tracing::error!(event = %e.id, error = %err, "cursorlog: stored payload is not JSON-RPC");
                            return;
                        }
                    }
                    answered = e.kind == "response" || e.kind == "error";
                }
            }
            Item::End(end) => {
                let state = end.state();
                tracing::info!(cursor = %out.cursor, state = state.as_str_name(), reason = end.reason.as_deref(), "cursorlog: followed stream ended");
                if !answered && out.request.is_some() && state != pb::StreamState::Completed {
                    let mut f = facts(&r, &out.cursor, aborted_reason(state));
                    f["state"] = json!(state_name(state));
                    f["terminal_seq"] = json!(end.terminal_seq);
                    f["detail"] = json!(end.reason);
                    out.aborted(state, end.reason.as_deref(), f).await;
                }
                return;
            }
            Item::Resolution(_) => {
                tracing::error!("cursorlog: a second resolution in one Read");
                return;
            }
            Item::Gap(gap) => {
                // Only sent with `resume_own_stream`, which this replay does not set.
                tracing::error!(
                    first = gap.first_seq,
                    last = gap.last_seq,
                    "cursorlog: unexpected gap in a Read"
                );
                return;
            }
        }
    }
}

/// STREAM_TERMINATED: the stored terminal frame once if the client missed it; the aborted
/// error if the stream ended without one; otherwise a clean end.
async fn terminated(client: Client, session: String, out: Out, r: pb::Resolution) {
    let Some(stream) = r.cursor.as_ref().map(|c| c.stream) else {
        return;
    };
    let outcome = client
        .clone()
        .get_outcome(pb::GetOutcomeRequest {
            session,
            correlation: String::new(),
            stream: Some(stream),
        })
        .await;
    let frame = match outcome {
        Ok(o) => o.into_inner().outcome.and_then(|o| o.frame),
        Err(status) => {
            tracing::warn!(stream, error = %status, "cursorlog: GetOutcome failed");
            return;
        }
    };
    match frame {
        Some(frame) if r.missed_terminal_frame => {
            if let Err(err) = out.event(&frame).await {
                tracing::error!(event = %frame.id, error = %err, "cursorlog: stored terminal frame is not JSON-RPC");
            }
        }
        Some(_) => {} // The client has the terminal frame: nothing lost, nothing to send.
        None if out.request.is_some() => {
            let data = facts(&r, &out.cursor, aborted_reason(r.stream_state()));
            out.aborted(r.stream_state(), r.detail.as_deref(), data)
                .await;
        }
        None => {}
    }
}
