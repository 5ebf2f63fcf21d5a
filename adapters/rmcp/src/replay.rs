//! Resumption: a `Last-Event-ID` becomes one cursorlog `Read` (with `resume_own_stream`: an
//! MCP GET with `Last-Event-ID` always continues the cursor's own stream), and its verdict
//! becomes something rmcp's client understands. Never a silent empty stream where the
//! client's call would then wait forever:
//!
//! | verdict | the client gets |
//! |---|---|
//! | `RESUMABLE` | every event after the cursor, then live events from any replica until the terminal frame; if the producer dies first, the aborted error |
//! | `STREAM_TERMINATED`, cursor before the terminal seq | every retained event after the cursor through the terminal frame, once, under their original ids |
//! | `STREAM_TERMINATED` at the terminal seq, `EPOCH_MISMATCH` | a clean end, no replay (aborted error if the stream ended without an answer) |
//! | `CURSOR_EVICTED` | a `notifications/message` warning marking the gap (the verdict's facts in `data`), then the retained rest, live events and the terminal frame; or, with [`OnEvicted::EndWithError`], the discontinuity error |
//! | `CURSOR_AHEAD`, `UNKNOWN_CURSOR`, `MALFORMED_CURSOR`, `UNKNOWN_SESSION`, `STREAM_MISMATCH` | a JSON-RPC error response (code [`RESUME_DISCONTINUITY`]) for the original request id |
//! | producer aborted (stream ABORTED/SUPERSEDED without a terminal frame) | a JSON-RPC error response (code [`PRODUCER_ABORTED`]) |
//!
//! A connection that delivers events starts with a priming event (the presented cursor and
//! the retry hint), so a client that loses it again resumes again from where it is. Every
//! verdict is logged with its facts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cursorlog_proto::v1 as pb;
use pb::read_response::Item;
use rmcp::model::{ErrorCode, ErrorData, RequestId, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::{EventStream, ServerSseMessage};
use serde_json::json;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::error::{Error, Result};
use crate::event_id::{self, EventId};
use crate::facts::{aborted_reason, facts, reason, state_name};
use crate::store::locked;
use crate::Shared;

/// JSON-RPC error code for "this stream cannot be resumed from that cursor": the client must
/// re-issue the request (or reconcile, if it may have had effects). `data.verdict` says why.
pub const RESUME_DISCONTINUITY: i32 = -32011;
/// JSON-RPC error code for "the server producing this response stopped before finishing".
pub const PRODUCER_ABORTED: i32 = -32012;
/// The `logger` of the `notifications/message` warning that marks evicted events.
pub const GAP_LOGGER: &str = "cursorlog";

/// What a client resuming from an evicted cursor gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnEvicted {
    /// A `notifications/message` warning (logger [`GAP_LOGGER`], level `warning`) naming the
    /// evicted seqs, then the retained rest of the stream and its terminal frame: the pending
    /// call still gets its real answer instead of an error that invites re-executing it.
    #[default]
    MarkGap,
    /// End the call at once with the [`RESUME_DISCONTINUITY`] error (`reason` `cursor_evicted`).
    EndWithError,
}

/// Events buffered between the cursorlog reader and the client's SSE connection.
const BUFFER: usize = 64;

/// A server-initiated close of a stream's connections (rmcp's `close_sse_stream`).
#[derive(Debug, Clone, Copy)]
struct Close {
    retry: Option<Duration>,
}

/// The resumed connections of each cursorlog stream on this replica, so that rmcp's
/// `close_sse_stream` closes them too (with a priming event carrying their own position).
#[derive(Debug, Default)]
pub(crate) struct Closers {
    streams: Mutex<HashMap<u64, broadcast::Sender<Close>>>,
}

impl Closers {
    fn subscribe(&self, stream: u64) -> broadcast::Receiver<Close> {
        let mut streams = locked(&self.streams);
        streams.retain(|_, tx| tx.receiver_count() > 0);
        streams
            .entry(stream)
            .or_insert_with(|| broadcast::channel(1).0)
            .subscribe()
    }

    /// Closes every resumed connection of `stream` on this replica.
    pub(crate) fn close(&self, stream: u64, retry: Option<Duration>) {
        if let Some(tx) = locked(&self.streams).get(&stream) {
            let _ = tx.send(Close { retry });
        }
    }
}

pub(crate) async fn resume(
    shared: Arc<Shared>,
    session: &str,
    last_event_id: &str,
) -> Result<EventStream> {
    let id = EventId::parse(last_event_id);
    let (reader, resolution) = read_from(&shared, session, &id.cursor)
        .await
        .map_err(Error::rpc("Read"))?;
    let resolution = resolution?;
    let verdict = resolution.verdict();
    // The stored request id is authoritative; the client's own claim is the fallback for
    // cursors cursorlog will not explain.
    let request = resolution
        .correlation
        .as_deref()
        .and_then(event_id::request_from_correlation)
        .or(id.request.clone());
    log_verdict(session, last_event_id, &resolution);
    let (tx, rx) = mpsc::channel(BUFFER);
    let suffix = match &id.token {
        Some(token) => event_id::token_suffix(token),
        None => event_id::request_suffix(request.as_ref()),
    };
    let out = Out {
        tx,
        request,
        suffix,
        cursor: id.cursor.clone(),
    };
    let delivers = match verdict {
        pb::Verdict::Resumable => true,
        pb::Verdict::StreamTerminated => resolution.missed_terminal_frame,
        pb::Verdict::CursorEvicted => shared.on_evicted == OnEvicted::MarkGap,
        _ => false,
    };
    if delivers {
        let closer = resolution
            .cursor
            .as_ref()
            .map(|c| shared.closers.subscribe(c.stream));
        let session = session.to_owned();
        tokio::spawn(
            async move { deliver(shared, session, reader, out, resolution, closer).await },
        );
    } else {
        match verdict {
            pb::Verdict::StreamTerminated => {
                let session = session.to_owned();
                tokio::spawn(
                    async move { at_terminal_seq(shared, session, out, resolution).await },
                );
            }
            pb::Verdict::EpochMismatch => {}
            _ => {
                tokio::spawn(async move { out.discontinuity(&resolution).await });
            }
        }
    }
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// Opens `Read(follow)` after `cursor` on the leader: the reader and its resolution (an
/// error if the first message is not one).
async fn read_from(
    shared: &Shared,
    session: &str,
    cursor: &str,
) -> std::result::Result<(tonic::Streaming<pb::ReadResponse>, Result<pb::Resolution>), tonic::Status>
{
    let (reader, first) = shared
        .client
        .read_resolved(pb::ReadRequest {
            session: session.to_owned(),
            last_event_id: cursor.to_owned(),
            declared_stream: None,
            follow: true,
            batch_events_max: 0,
            resume_own_stream: true,
        })
        .await?;
    let resolution = match first {
        Some(pb::ReadResponse {
            item: Some(Item::Resolution(r)),
        }) => Ok(r),
        other => Err(Error::Protocol(format!(
            "Read did not start with a resolution: {other:?}"
        ))),
    };
    Ok((reader, resolution))
}

fn log_verdict(session: &str, last_event_id: &str, r: &pb::Resolution) {
    let verdict = r.verdict();
    let state = r.stream_state.map(|_| r.stream_state().as_str_name());
    macro_rules! log {
        ($level:ident) => {
            tracing::$level!(
                session,
                last_event_id,
                verdict = verdict.as_str_name(),
                current_epoch = r.current_epoch,
                state,
                head = r.head,
                terminal_seq = r.terminal_seq,
                watermark = r.watermark,
                detail = r.detail.as_deref(),
                missed_terminal_frame = r.missed_terminal_frame,
                "cursorlog: resume verdict"
            )
        };
    }
    match verdict {
        pb::Verdict::Resumable | pb::Verdict::StreamTerminated | pb::Verdict::EpochMismatch => {
            log!(info)
        }
        _ => log!(warn),
    }
}

/// Where the resumed events go, and what the error responses are addressed to.
struct Out {
    tx: mpsc::Sender<ServerSseMessage>,
    request: Option<RequestId>,
    /// What follows the cursor in the stream's event ids (request or stateless token).
    suffix: String,
    cursor: String,
}

impl Out {
    /// Sends one event; false once the client is gone.
    async fn send(&self, message: ServerSseMessage) -> bool {
        self.tx.send(message).await.is_ok()
    }

    fn id(&self, cursor: &str) -> String {
        format!("{cursor}{}", self.suffix)
    }

    /// A priming event: an id to resume from (and nothing else) plus the retry hint.
    async fn priming(&self, cursor: &str, retry: Option<Duration>) -> bool {
        let mut priming = ServerSseMessage::default();
        priming.event_id = Some(self.id(cursor));
        priming.retry = retry;
        self.send(priming).await
    }

    async fn event(&self, e: &pb::Event) -> std::result::Result<bool, Error> {
        let message: ServerJsonRpcMessage = serde_json::from_slice(&e.payload)?;
        Ok(self
            .send(ServerSseMessage::new(self.id(&e.id), message))
            .await)
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

    /// The visible mark of evicted events: a `notifications/message` warning whose event id
    /// is the gap's last seq, so a client that reconnects after it resumes after the gap.
    async fn gap(&self, r: &pb::Resolution, epoch: u64, stream: u64, gap: &pb::EvictedGap) -> bool {
        let mut data = facts(r, &self.cursor, "events_evicted");
        data["first_evicted_seq"] = json!(gap.first_seq);
        data["last_evicted_seq"] = json!(gap.last_seq);
        data["message"] = json!(format!(
            "{} event(s) of this response stream (seq {} to {}) were evicted by retention before \
             they could be delivered; delivery continues after them",
            gap.last_seq - gap.first_seq + 1,
            gap.first_seq,
            gap.last_seq
        ));
        let notification = json!({
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {"level": "warning", "logger": GAP_LOGGER, "data": data},
        });
        let message: ServerJsonRpcMessage = match serde_json::from_value(notification) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, "cursorlog: cannot build the gap notification");
                return false;
            }
        };
        let cursor = format!("{epoch}-{stream}-{}", gap.last_seq);
        self.send(ServerSseMessage::new(self.id(&cursor), message))
            .await
    }
}

/// RESUMABLE, STREAM_TERMINATED with missed frames, CURSOR_EVICTED: priming, then replay and
/// follow until the stream ends. A request stream that ends without its response (producer
/// crashed, lease expired, epoch advanced) gets the aborted error.
///
/// A read that breaks (the member serving it died or stopped leading) is opened again on the
/// leader after the last event delivered, so the client sees every event once, without a gap.
async fn deliver(
    shared: Arc<Shared>,
    session: String,
    mut reader: tonic::Streaming<pb::ReadResponse>,
    out: Out,
    r: pb::Resolution,
    mut closer: Option<broadcast::Receiver<Close>>,
) {
    let retry = shared.sse_retry;
    let Some(cursor) = r.cursor else {
        tracing::error!(cursor = %out.cursor, "cursorlog: a delivering verdict without its cursor");
        return;
    };
    if !out.priming(&out.cursor, Some(retry)).await {
        return;
    }
    let mut position = out.cursor.clone();
    let mut answered = false;
    // Reads opened again in a row without delivering anything.
    let mut reopened = 0;
    loop {
        let next = tokio::select! {
            next = reader.message() => next,
            close = recv_close(&mut closer) => {
                // rmcp closed this stream's connections (`close_sse_stream`): this one too,
                // with its own position, so the client resumes from exactly here.
                out.priming(&position, close.retry).await;
                return;
            }
        };
        let item = match next {
            Ok(Some(pb::ReadResponse { item: Some(item) })) => item,
            Ok(_) => {
                tracing::warn!(cursor = %out.cursor, "cursorlog: read ended without an end message");
                return;
            }
            Err(status) => {
                reopened += 1;
                tracing::warn!(cursor = %out.cursor, %position, error = %status, "cursorlog: read broke; reading on from the leader");
                match reread(&shared, &session, &position, reopened).await {
                    Reread::Continue(next) => {
                        reader = *next;
                        continue;
                    }
                    Reread::Ended(state) => {
                        if !answered && out.request.is_some() && state != pb::StreamState::Completed
                        {
                            let mut f = facts(&r, &out.cursor, aborted_reason(state));
                            f["state"] = json!(state_name(state));
                            out.aborted(state, None, f).await;
                        }
                    }
                    // The client reconnects with its last event id; nothing is lost.
                    Reread::Stop => {}
                }
                return;
            }
        };
        reopened = 0;
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
                    position.clone_from(&e.id);
                    answered = e.kind == "response" || e.kind == "error";
                }
            }
            Item::Gap(gap) => {
                tracing::warn!(cursor = %out.cursor, first = gap.first_seq, last = gap.last_seq, "cursorlog: evicted events marked as a gap");
                if !out.gap(&r, cursor.epoch, cursor.stream, &gap).await {
                    return;
                }
                position = format!("{}-{}-{}", cursor.epoch, cursor.stream, gap.last_seq);
            }
            Item::End(end) => {
                let state = end.state();
                tracing::info!(cursor = %out.cursor, state = state.as_str_name(), reason = end.reason.as_deref(), "cursorlog: resumed stream ended");
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
        }
    }
}

/// Reads opened again in a row, without an event between them, before the delivery stops
/// (the client then reconnects with its last event id).
const REREADS_MAX: u32 = 5;

/// What opening a broken read again gave.
enum Reread {
    /// Events after the position follow on this reader.
    Continue(Box<tonic::Streaming<pb::ReadResponse>>),
    /// The stream ended at the position, in this state: nothing more to deliver.
    Ended(pb::StreamState),
    /// Cannot go on here.
    Stop,
}

/// Opens `Read(follow)` again after `position` (the last event delivered) on the leader.
async fn reread(shared: &Arc<Shared>, session: &str, position: &str, attempt: u32) -> Reread {
    if attempt > REREADS_MAX {
        return Reread::Stop;
    }
    let (reader, resolution) = match read_from(shared, session, position).await {
        Ok((reader, Ok(r))) => (reader, r),
        Ok((_, Err(e))) => {
            tracing::error!(position, error = %e, "cursorlog: read again failed");
            return Reread::Stop;
        }
        Err(status) => {
            tracing::warn!(position, error = %status, "cursorlog: no leader to read on from");
            return Reread::Stop;
        }
    };
    match resolution.verdict() {
        pb::Verdict::Resumable => Reread::Continue(Box::new(reader)),
        pb::Verdict::StreamTerminated if resolution.missed_terminal_frame => {
            Reread::Continue(Box::new(reader))
        }
        pb::Verdict::CursorEvicted if shared.on_evicted == OnEvicted::MarkGap => {
            Reread::Continue(Box::new(reader))
        }
        pb::Verdict::StreamTerminated => Reread::Ended(resolution.stream_state()),
        other => {
            tracing::warn!(
                position,
                verdict = other.as_str_name(),
                "cursorlog: read again gave another verdict; stopping"
            );
            Reread::Stop
        }
    }
}

async fn recv_close(closer: &mut Option<broadcast::Receiver<Close>>) -> Close {
    loop {
        match closer {
            Some(rx) => match rx.recv().await {
                Ok(close) => return close,
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => *closer = None,
            },
            None => std::future::pending::<()>().await,
        }
    }
}

/// STREAM_TERMINATED at the terminal seq: the client has everything, unless the stream ended
/// without an answer (aborted), which it must be told.
async fn at_terminal_seq(shared: Arc<Shared>, session: String, out: Out, r: pb::Resolution) {
    let Some(stream) = r.cursor.as_ref().map(|c| c.stream) else {
        return;
    };
    if out.request.is_none() {
        return;
    }
    let outcome = shared
        .client
        .clone()
        .get_outcome(pb::GetOutcomeRequest {
            session,
            correlation: String::new(),
            stream: Some(stream),
        })
        .await;
    match outcome {
        Ok(o)
            if o.get_ref()
                .outcome
                .as_ref()
                .is_some_and(|o| o.frame.is_some()) => {}
        Ok(_) => {
            let data = facts(&r, &out.cursor, aborted_reason(r.stream_state()));
            out.aborted(r.stream_state(), r.detail.as_deref(), data)
                .await;
        }
        Err(status) => {
            tracing::warn!(stream, error = %status, "cursorlog: GetOutcome failed");
        }
    }
}
