//! [`SessionEventStore`]: rmcp's `EventStore` for *one* MCP session, over cursorlog.
//!
//! rmcp hands its event store to a session worker and calls `store_event(stream_id, event)`
//! without naming the session. [`crate::CursorlogSessionManager`] therefore gives every
//! session its own worker *and its own store*, which knows its session for certain: an event
//! can only ever land in a stream of the session whose worker stored it.
//!
//! Each rmcp stream becomes one cursorlog stream in that session:
//! - a request stream (rmcp names it with a fresh uuid) is opened with the JSON-RPC request id
//!   as its correlation and a producer lease that this process renews while it lives, so a
//!   replica that dies mid-call leaves an ABORTED stream, not a silent one. The request id
//!   comes from the session manager, which declares it (`SessionEventStore::expect_stream`)
//!   while rmcp creates the stream and stores its priming event;
//! - the standalone GET stream (`{session}:common`) gets one lease-less stream per replica.
//!
//! A priming event writes nothing: its id is the stream's current position (the start for a
//! new stream; the last event written when rmcp closes a connection with a retry hint, in
//! which case the connections resumed on this replica are closed the same way). The JSON-RPC
//! response (or error) to the stream's own request is the terminal frame (`Complete`);
//! everything else is an append. Writes go through the shared appender (see [`crate::appender`])
//! and every id is returned only once cursorlog has made the write durable, as rmcp's trait
//! requires; a write that fails is an error, never an id-less event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cursorlog_proto::v1 as pb;
use rmcp::model::{RequestId, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use tonic::Code;

use crate::appender::{Write, Written};
use crate::error::{Error, Result};
use crate::{event_id, Shared};

/// The suffix rmcp gives its standalone (GET) stream ids: `{session_id}:common`.
const COMMON_SUFFIX: &str = ":common";

pub(crate) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only short, non-panicking sections hold these locks; a poisoned lock still holds
    // consistent data, so keep going rather than take the replica down.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Aborts a background task when dropped.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where a stream's writer stands.
#[derive(Debug)]
pub(crate) struct Position {
    /// The seq the next event gets (`expected_next_seq` of the next write).
    next_seq: u64,
    /// When this process last wrote to the stream (a write renews the lease).
    last_write: Instant,
}

/// The cursorlog stream behind one rmcp stream, and where its writer stands.
#[derive(Debug)]
pub(crate) struct Binding {
    pub(crate) session: String,
    pub(crate) epoch: u64,
    pub(crate) stream: u64,
    pub(crate) request: Option<RequestId>,
    position: Arc<Mutex<Position>>,
    _lease: Option<AbortOnDrop>,
}

impl Binding {
    /// A binding for a stream just opened, renewing its lease (if any) in the background.
    pub(crate) fn new(
        shared: &Arc<Shared>,
        session: &str,
        opened: &pb::OpenStreamResponse,
        request: Option<RequestId>,
        lease: Option<Duration>,
    ) -> Self {
        let position = Arc::new(Mutex::new(Position {
            next_seq: 1,
            last_write: Instant::now(),
        }));
        let renewal = lease.map(|lease| {
            AbortOnDrop(tokio::spawn(renew_lease(
                shared.clone(),
                session.to_owned(),
                opened.stream,
                lease,
                position.clone(),
            )))
        });
        Self {
            session: session.to_owned(),
            epoch: opened.epoch,
            stream: opened.stream,
            request,
            position,
            _lease: renewal,
        }
    }

    /// The cursor of the stream's current position: the last event written, or the start.
    pub(crate) fn current_cursor(&self) -> String {
        let seq = locked(&self.position).next_seq.saturating_sub(1);
        format!("{}-{}-{seq}", self.epoch, self.stream)
    }

    /// The event id of the stream's current position, with the request suffix.
    fn current_id(&self) -> String {
        event_id::format(&self.current_cursor(), self.request.as_ref())
    }

    /// Writes `message` (as the terminal frame with `Complete` when `terminal`) through the
    /// shared appender, at the seq this writer expects, and returns its cursor once durable.
    pub(crate) async fn write(
        &self,
        shared: &Shared,
        message: &ServerJsonRpcMessage,
        terminal: bool,
    ) -> Result<String> {
        let next_seq = locked(&self.position).next_seq;
        let new_event = pb::NewEvent {
            kind: kind(message).to_owned(),
            correlation: self.request.as_ref().map(event_id::correlation),
            payload: serde_json::to_vec(message)?,
        };
        if terminal {
            let complete = pb::CompleteRequest {
                session: self.session.clone(),
                stream: self.stream,
                expected_next_seq: Some(next_seq),
                terminal: Some(new_event),
            };
            return match shared.appender.write(Write::Complete(complete)).await? {
                Written::Completed(done) => Ok(done.terminal_event_id),
                other => Err(Error::Protocol(format!("Complete answered with {other:?}"))),
            };
        }
        let append = pb::AppendRequest {
            session: self.session.clone(),
            stream: self.stream,
            expected_next_seq: Some(next_seq),
            events: vec![new_event],
        };
        let appended = match shared.appender.write(Write::Append(append)).await? {
            Written::Appended(a) => a,
            other => return Err(Error::Protocol(format!("Append answered with {other:?}"))),
        };
        {
            let mut position = locked(&self.position);
            position.next_seq = appended.last_seq + 1;
            position.last_write = Instant::now();
        }
        appended
            .event_ids
            .into_iter()
            .next()
            .ok_or_else(|| Error::Protocol("Append returned no event id".into()))
    }
}

/// rmcp's `EventStore` for one MCP session; see the module docs. Made by
/// [`crate::CursorlogSessionManager`] for each session it creates or restores.
#[derive(Debug, Clone)]
pub struct SessionEventStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    session: String,
    common_id: String,
    shared: Arc<Shared>,
    epoch: Mutex<Option<u64>>,
    streams: Mutex<HashMap<String, Arc<Binding>>>,
    /// `Some(request)` while the session manager creates a request stream: the request the
    /// next new request stream answers.
    expected: Mutex<Option<Option<RequestId>>>,
}

impl SessionEventStore {
    pub(crate) fn new(shared: Arc<Shared>, session: &str, epoch: Option<u64>) -> Self {
        Self {
            inner: Arc::new(Inner {
                session: session.to_owned(),
                common_id: format!("{session}{COMMON_SUFFIX}"),
                shared,
                epoch: Mutex::new(epoch),
                streams: Mutex::default(),
                expected: Mutex::default(),
            }),
        }
    }

    /// The MCP session this store writes into.
    pub fn session(&self) -> &str {
        &self.inner.session
    }

    /// Declares the request that the next new request stream answers. The session manager
    /// calls it (and [`Self::expect_no_stream`] after) around rmcp's stream creation, one
    /// creation at a time *per session*, so the declaration meets exactly its own stream.
    pub(crate) fn expect_stream(&self, request: Option<RequestId>) {
        *locked(&self.inner.expected) = Some(request);
    }

    /// Ends a declaration made by [`Self::expect_stream`].
    pub(crate) fn expect_no_stream(&self) {
        *locked(&self.inner.expected) = None;
    }

    async fn epoch(&self, refresh: bool) -> Result<u64> {
        if !refresh {
            if let Some(e) = *locked(&self.inner.epoch) {
                return Ok(e);
            }
        }
        let epoch = self
            .inner
            .shared
            .client
            .clone()
            .open_session(pb::OpenSessionRequest {
                session: self.inner.session.clone(),
                state: None,
            })
            .await
            .map_err(Error::rpc("OpenSession"))?
            .into_inner()
            .epoch;
        *locked(&self.inner.epoch) = Some(epoch);
        Ok(epoch)
    }

    /// The binding of `stream_id`, opening its cursorlog stream on first sight. A new request
    /// stream is only ever bound by its priming event (rmcp stores it first, and the session
    /// manager declared its request): any other event of an unknown request stream is refused,
    /// so a stray write can never take another stream's declaration.
    async fn binding(&self, stream_id: &str, priming: bool) -> Result<(Arc<Binding>, bool)> {
        if let Some(b) = locked(&self.inner.streams).get(stream_id) {
            return Ok((b.clone(), false));
        }
        let (request, lease) = if stream_id == self.inner.common_id {
            (None, None)
        } else if stream_id.ends_with(COMMON_SUFFIX) {
            return Err(Error::ForeignStream {
                stream_id: stream_id.to_owned(),
                session: self.inner.session.clone(),
            });
        } else {
            let declared = if priming {
                locked(&self.inner.expected).take()
            } else {
                None
            };
            let request = declared.ok_or_else(|| Error::UnboundStream {
                stream_id: stream_id.to_owned(),
            })?;
            (request, self.inner.shared.lease)
        };
        let opened = self.open_stream(request.as_ref(), lease).await?;
        let binding = Arc::new(Binding::new(
            &self.inner.shared,
            &self.inner.session,
            &opened,
            request,
            lease,
        ));
        locked(&self.inner.streams).insert(stream_id.to_owned(), binding.clone());
        tracing::debug!(
            stream_id,
            session = %self.inner.session,
            stream = binding.stream,
            "bound rmcp stream to cursorlog stream"
        );
        Ok((binding, true))
    }

    /// Opens the cursorlog stream of a new rmcp stream: an `open` item of the shared batch
    /// (or a unary `OpenStream` when `open_in_batch` is off).
    async fn open_stream(
        &self,
        request: Option<&RequestId>,
        lease: Option<Duration>,
    ) -> Result<pb::OpenStreamResponse> {
        let mut refreshed = false;
        let mut epoch = self.epoch(false).await?;
        loop {
            let req = pb::OpenStreamRequest {
                session: self.inner.session.clone(),
                epoch,
                correlation: request.map(event_id::correlation),
                lease_ms: lease.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX).max(1)),
            };
            let opened = if self.inner.shared.open_in_batch {
                match self.inner.shared.appender.write(Write::Open(req)).await {
                    Ok(Written::Opened(o)) => Ok(o),
                    Ok(other) => {
                        return Err(Error::Protocol(format!(
                            "OpenStream answered with {other:?}"
                        )))
                    }
                    Err(e) => Err(e),
                }
            } else {
                match self.inner.shared.client.clone().open_stream(req).await {
                    Ok(r) => Ok(r.into_inner()),
                    Err(status) => Err(Error::Rpc {
                        op: "OpenStream",
                        status,
                    }),
                }
            };
            match opened {
                Ok(o) => return Ok(o),
                // Refused with its outcome unknown (a leader change while it was in flight):
                // the stream may exist. Take it if it does; a second open could make two.
                Err(e) if matches!(e.code(), Some(Code::Unavailable | Code::Unknown)) => {
                    return match self.find_opened(request, epoch).await {
                        Some(o) => Ok(o),
                        None => Err(e),
                    };
                }
                // The epoch moved on (or the cached one predates a restart): ask once.
                Err(e) if e.code() == Some(Code::FailedPrecondition) && !refreshed => {
                    epoch = self.epoch(true).await?;
                    refreshed = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The stream an open whose outcome is unknown created, if it did: the session's open,
    /// still empty stream answering `request` (a JSON-RPC id is unique in its session), asked
    /// of the leader, which has decided every entry of earlier terms before it answers.
    async fn find_opened(
        &self,
        request: Option<&RequestId>,
        epoch: u64,
    ) -> Option<pb::OpenStreamResponse> {
        let correlation = event_id::correlation(request?);
        let client = &self.inner.shared.client;
        let found = client
            .get_outcome(pb::GetOutcomeRequest {
                session: self.inner.session.clone(),
                correlation: correlation.clone(),
                stream: None,
            })
            .await
            .ok()?
            .into_inner();
        let outcome = found
            .outcome
            .filter(|o| found.found && o.epoch == epoch && o.state() == pb::StreamState::Open)?;
        let start = format!("{epoch}-{}-0", outcome.stream);
        let head = client
            .resolve(pb::ResolveRequest {
                session: self.inner.session.clone(),
                last_event_id: start.clone(),
                declared_stream: None,
            })
            .await
            .ok()?
            .into_inner()
            .head
            .unwrap_or_default();
        tracing::info!(
            stream = outcome.stream,
            correlation,
            head,
            "cursorlog: an open whose outcome was unknown had taken effect"
        );
        (head == 0).then_some(pb::OpenStreamResponse {
            stream: outcome.stream,
            epoch,
            start_event_id: start,
        })
    }

    async fn write(&self, stream_id: &str, event: &ServerSseMessage) -> Result<String> {
        let (b, fresh) = self.binding(stream_id, event.message.is_none()).await?;
        let Some(message) = event.message.as_deref() else {
            // Priming. On an existing stream it precedes a server-initiated close
            // (`close_sse_stream`): close this stream's resumed connections too.
            if !fresh {
                self.inner.shared.closers.close(b.stream, event.retry);
            }
            return Ok(b.current_id());
        };
        let terminal = answers(message, b.request.as_ref());
        if terminal {
            // Finished or not, this process stops renewing the stream's lease: if the
            // response could not be stored, the lease runs out and a resuming client gets the
            // "producer aborted" error instead of waiting forever.
            locked(&self.inner.streams).remove(stream_id);
        }
        let cursor = b.write(&self.inner.shared, message, terminal).await?;
        Ok(event_id::format(&cursor, b.request.as_ref()))
    }
}

#[async_trait::async_trait]
impl EventStore for SessionEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> std::result::Result<EventId, EventStoreError> {
        self.write(stream_id, event).await.map_err(|e| {
            tracing::error!(
                session = %self.inner.session,
                stream_id,
                error = %e,
                "cursorlog: storing an SSE event failed; rmcp will not send it"
            );
            Box::new(e) as EventStoreError
        })
    }

    /// Resumes `last_event_id` inside this store's session; see [`crate::replay`]. rmcp calls
    /// [`crate::CursorlogSessionManager`]'s `resume` instead, which does the same.
    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> std::result::Result<EventStream, EventStoreError> {
        crate::replay::resume(
            self.inner.shared.clone(),
            &self.inner.session,
            last_event_id,
        )
        .await
        .map_err(|e| Box::new(e) as EventStoreError)
    }
}

/// Whether `message` answers the stream's own request, which makes it the terminal frame.
pub(crate) fn answers(message: &ServerJsonRpcMessage, request: Option<&RequestId>) -> bool {
    let Some(request) = request else {
        return false;
    };
    match message {
        ServerJsonRpcMessage::Response(r) => &r.id == request,
        ServerJsonRpcMessage::Error(e) => e.id.as_ref() == Some(request),
        _ => false,
    }
}

/// The event kind cursorlog records, for `cursorlog inspect` and metrics.
pub(crate) fn kind(message: &ServerJsonRpcMessage) -> &'static str {
    match message {
        ServerJsonRpcMessage::Request(_) => "request",
        ServerJsonRpcMessage::Notification(_) => "notification",
        ServerJsonRpcMessage::Response(_) => "response",
        ServerJsonRpcMessage::Error(_) => "error",
    }
}

/// Renews the producer lease every third of its length unless a write did, until the stream
/// is terminal (or the task is aborted because this process finished or forgot the stream).
pub(crate) async fn renew_lease(
    shared: Arc<Shared>,
    session: String,
    stream: u64,
    lease: Duration,
    position: Arc<Mutex<Position>>,
) {
    let period = (lease / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        if locked(&position).last_write.elapsed() < period {
            continue;
        }
        let r = shared
            .client
            .clone()
            .keep_alive(pb::KeepAliveRequest {
                session: session.clone(),
                stream,
            })
            .await;
        match r {
            Ok(_) => {}
            Err(s) if matches!(s.code(), Code::NotFound | Code::FailedPrecondition) => {
                tracing::debug!(stream, reason = s.message(), "lease renewal stops");
                return;
            }
            Err(s) => {
                tracing::warn!(stream, error = %s, "cursorlog: lease renewal failed; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ErrorCode, ErrorData};

    fn error_to(id: RequestId) -> ServerJsonRpcMessage {
        ServerJsonRpcMessage::error(ErrorData::new(ErrorCode(-1), "x", None), Some(id))
    }

    #[test]
    fn only_the_response_to_the_streams_own_request_is_terminal() {
        let own = RequestId::Number(4);
        assert!(answers(&error_to(RequestId::Number(4)), Some(&own)));
        assert!(!answers(&error_to(RequestId::Number(5)), Some(&own)));
        assert!(!answers(
            &error_to(RequestId::String("4".into())),
            Some(&own)
        ));
        assert!(
            !answers(&error_to(RequestId::Number(4)), None),
            "standalone streams never end"
        );
    }
}
