//! [`CursorlogEventStore`]: rmcp's `EventStore` over cursorlog.
//!
//! Each rmcp stream becomes one cursorlog stream *in the MCP session that owns it*:
//! - a request stream (rmcp names it with a fresh uuid) is opened with the JSON-RPC request id
//!   as its correlation and a producer lease that a background task renews while this process
//!   lives, so a replica that dies mid-call leaves an ABORTED stream, not a silent one;
//! - the standalone GET stream (`{session}:common`) gets one lease-less stream per replica.
//!
//! rmcp does not pass the session to the store, so [`crate::CursorlogSessionManager`] tells it:
//! while rmcp creates a request stream (and stores its priming event) the manager holds
//! `CursorlogEventStore::bind_next`'s slot with the session and request id.
//!
//! The priming event writes nothing: its id is the cursor before the stream's first event.
//! The JSON-RPC response (or error) to the stream's own request is the terminal frame
//! (`Complete`); everything else is an `Append`. Every id is returned only once cursorlog has
//! made the write durable, as rmcp's trait requires.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cursorlog_proto::v1 as pb;
use rmcp::model::{RequestId, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use tonic::Code;

use crate::error::{Error, Result};
use crate::event_id;
use crate::replay;
use crate::Client;

tokio::task_local! {
    /// The MCP session presenting a `Last-Event-ID`, set by the session manager around
    /// `replay_events_after`.
    static PRESENTING_SESSION: String;
}

/// The suffix rmcp gives its standalone (GET) stream ids: `{session_id}:common`.
const COMMON_SUFFIX: &str = ":common";

/// A cursorlog stream this process writes on behalf of one rmcp stream.
#[derive(Debug, Clone)]
struct Binding {
    session: String,
    epoch: u64,
    stream: u64,
    request: Option<RequestId>,
    _keepalive: Option<Arc<KeepAlive>>,
}

/// Aborts the lease-renewal task when the last binding copy goes away.
#[derive(Debug)]
struct KeepAlive(tokio::task::JoinHandle<()>);

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The session and request of the next rmcp request stream.
#[derive(Debug, Clone)]
pub(crate) struct PendingStream {
    pub session: String,
    pub request: Option<RequestId>,
}

/// rmcp's `EventStore` over cursorlog; see the module docs. Create it through
/// [`crate::Cursorlog::session_manager`], which wires it into the session manager that binds
/// streams to sessions.
#[derive(Debug, Clone)]
pub struct CursorlogEventStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    lease: Option<Duration>,
    bindings: Mutex<HashMap<String, Binding>>,
    pending: Mutex<Option<PendingStream>>,
    epochs: Mutex<HashMap<String, u64>>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The maps are only touched in short non-panicking sections; a poisoned lock still holds
    // consistent data, so keep going rather than take the replica down.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CursorlogEventStore {
    pub(crate) fn new(client: Client, lease: Option<Duration>) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                lease,
                bindings: Mutex::default(),
                pending: Mutex::default(),
                epochs: Mutex::default(),
            }),
        }
    }

    pub(crate) fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// Declares the session and request the next unknown rmcp stream belongs to. The caller
    /// serialises stream creation so that exactly one declaration is outstanding.
    pub(crate) fn bind_next(&self, pending: Option<PendingStream>) {
        *locked(&self.inner.pending) = pending;
    }

    /// Opens the session in cursorlog (idempotent) and remembers its epoch.
    pub(crate) async fn open_session(&self, session: &str) -> Result<u64> {
        let epoch = self
            .client()
            .open_session(pb::OpenSessionRequest {
                session: session.to_owned(),
                state: None,
            })
            .await
            .map_err(Error::rpc("OpenSession"))?
            .into_inner()
            .epoch;
        locked(&self.inner.epochs).insert(session.to_owned(), epoch);
        Ok(epoch)
    }

    /// Forgets the session's streams (stopping their lease renewal) and expires it in
    /// cursorlog: its open streams are aborted and its cursors answer UNKNOWN_SESSION.
    pub(crate) async fn close_session(&self, session: &str) -> Result<()> {
        locked(&self.inner.bindings).retain(|_, b| b.session != session);
        locked(&self.inner.epochs).remove(session);
        expire_session(self.client(), session).await
    }

    /// Resumes after `last_event_id` in `session` through the `EventStore` trait: the
    /// verdict decides what the client gets.
    pub(crate) async fn resume(
        &self,
        session: &str,
        last_event_id: &str,
    ) -> std::result::Result<EventStream, EventStoreError> {
        PRESENTING_SESSION
            .scope(session.to_owned(), self.replay_events_after(last_event_id))
            .await
    }

    async fn binding(&self, stream_id: &str) -> Result<Binding> {
        if let Some(b) = locked(&self.inner.bindings).get(stream_id) {
            return Ok(b.clone());
        }
        let (session, request, lease) = match stream_id.strip_suffix(COMMON_SUFFIX) {
            Some(session) => (session.to_owned(), None, None),
            None => {
                let pending =
                    locked(&self.inner.pending)
                        .take()
                        .ok_or_else(|| Error::UnboundStream {
                            stream_id: stream_id.to_owned(),
                        })?;
                (pending.session, pending.request, self.inner.lease)
            }
        };
        let opened = self.open_stream(&session, request.as_ref(), lease).await?;
        let keepalive = lease.map(|lease| {
            Arc::new(KeepAlive(tokio::spawn(renew_lease(
                self.client(),
                session.clone(),
                opened.stream,
                lease,
            ))))
        });
        let binding = Binding {
            session,
            epoch: opened.epoch,
            stream: opened.stream,
            request,
            _keepalive: keepalive,
        };
        locked(&self.inner.bindings).insert(stream_id.to_owned(), binding.clone());
        tracing::debug!(
            stream_id,
            session = %binding.session,
            stream = binding.stream,
            "bound rmcp stream to cursorlog stream"
        );
        Ok(binding)
    }

    async fn open_stream(
        &self,
        session: &str,
        request: Option<&RequestId>,
        lease: Option<Duration>,
    ) -> Result<pb::OpenStreamResponse> {
        let cached = locked(&self.inner.epochs).get(session).copied();
        let mut epoch = match cached {
            Some(e) => e,
            None => self.open_session(session).await?,
        };
        let mut refreshed = cached.is_none();
        loop {
            let req = pb::OpenStreamRequest {
                session: session.to_owned(),
                epoch,
                correlation: request.map(event_id::correlation),
                lease_ms: lease.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX).max(1)),
            };
            match self.client().open_stream(req).await {
                Ok(r) => return Ok(r.into_inner()),
                // The epoch moved on elsewhere (or the cache is from before a restart): ask once.
                Err(s) if s.code() == Code::FailedPrecondition && !refreshed => {
                    epoch = self.open_session(session).await?;
                    refreshed = true;
                }
                Err(status) => {
                    return Err(Error::Rpc {
                        op: "OpenStream",
                        status,
                    })
                }
            }
        }
    }

    async fn write(&self, stream_id: &str, event: &ServerSseMessage) -> Result<String> {
        let b = self.binding(stream_id).await?;
        let Some(message) = event.message.as_deref() else {
            // Priming: the cursor before the first event replays the whole stream.
            let start = format!("{}-{}-0", b.epoch, b.stream);
            return Ok(event_id::format(&start, b.request.as_ref()));
        };
        let payload = serde_json::to_vec(message)?;
        let new_event = pb::NewEvent {
            kind: kind(message).to_owned(),
            correlation: b.request.as_ref().map(event_id::correlation),
            payload,
        };
        let cursor = if answers(message, b.request.as_ref()) {
            let done = self
                .client()
                .complete(pb::CompleteRequest {
                    session: b.session.clone(),
                    stream: b.stream,
                    expected_next_seq: None,
                    terminal: Some(new_event),
                })
                .await
                .map_err(Error::rpc("Complete"))?
                .into_inner();
            // The stream is finished: stop renewing its lease.
            locked(&self.inner.bindings).remove(stream_id);
            done.terminal_event_id
        } else {
            let appended = self
                .client()
                .append(pb::AppendRequest {
                    session: b.session.clone(),
                    stream: b.stream,
                    expected_next_seq: None,
                    events: vec![new_event],
                })
                .await
                .map_err(Error::rpc("Append"))?
                .into_inner();
            appended
                .event_ids
                .into_iter()
                .next()
                .ok_or_else(|| Error::Protocol("Append returned no event id".into()))?
        };
        Ok(event_id::format(&cursor, b.request.as_ref()))
    }
}

#[async_trait::async_trait]
impl EventStore for CursorlogEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> std::result::Result<EventId, EventStoreError> {
        self.write(stream_id, event).await.map_err(|e| {
            tracing::error!(stream_id, error = %e, "cursorlog: storing an SSE event failed");
            Box::new(e) as EventStoreError
        })
    }

    /// Replays the events after `last_event_id` and then follows the stream live, whichever
    /// replica appends to it, until its terminal frame; or answers the verdict that forbids it
    /// (see [`crate::replay`]).
    ///
    /// The cursor is judged inside the session that presents it, which rmcp does not pass
    /// here: `resume` of [`crate::CursorlogSessionManager`] supplies it. Called any other way (rmcp's
    /// `LocalSessionManager`, or 2026-07-28 stateless traffic, whose spec says `Last-Event-ID`
    /// is to be ignored) there is no session, and it refuses rather than guess one.
    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> std::result::Result<EventStream, EventStoreError> {
        if let Ok(session) = PRESENTING_SESSION.try_with(String::clone) {
            return replay::resume(self.client(), &session, last_event_id)
                .await
                .map_err(|e| {
                    tracing::warn!(session, last_event_id, error = %e, "cursorlog: resume failed");
                    Box::new(e) as EventStoreError
                });
        }
        tracing::warn!(
            last_event_id,
            "cursorlog: resume without an MCP session refused (stateless streams are not resumable)"
        );
        Err("cursorlog-rmcp resumes only inside an MCP session (legacy session mode)".into())
    }
}

/// Expires `session` in cursorlog; an unknown or already expired session is fine.
pub(crate) async fn expire_session(mut client: Client, session: &str) -> Result<()> {
    match client
        .expire_session(pb::ExpireSessionRequest {
            session: session.to_owned(),
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(s) if matches!(s.code(), Code::NotFound | Code::FailedPrecondition) => Ok(()),
        Err(status) => Err(Error::Rpc {
            op: "ExpireSession",
            status,
        }),
    }
}

/// Whether `message` answers the stream's own request, which makes it the terminal frame.
fn answers(message: &ServerJsonRpcMessage, request: Option<&RequestId>) -> bool {
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
fn kind(message: &ServerJsonRpcMessage) -> &'static str {
    match message {
        ServerJsonRpcMessage::Request(_) => "request",
        ServerJsonRpcMessage::Notification(_) => "notification",
        ServerJsonRpcMessage::Response(_) => "response",
        ServerJsonRpcMessage::Error(_) => "error",
    }
}

/// Renews the producer lease every third of its length until the stream is terminal (or the
/// task is aborted because this process finished or forgot the stream).
async fn renew_lease(client: Client, session: String, stream: u64, lease: Duration) {
    let period = (lease / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        let r = client
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

    fn unreachable_store() -> CursorlogEventStore {
        // Nothing listens there: the paths under test must refuse before any call.
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
        CursorlogEventStore::new(
            cursorlog_proto::v1::cursor_log_client::CursorLogClient::with_interceptor(
                channel,
                crate::BearerToken::default(),
            ),
            None,
        )
    }

    #[tokio::test]
    async fn a_stream_no_session_manager_bound_is_refused_not_guessed() {
        let store = unreachable_store();
        let event = ServerSseMessage::from_message(ServerJsonRpcMessage::error(
            ErrorData::new(ErrorCode(-1), "x", None),
            None,
        ));
        let err = store
            .store_event("0b5a2c1e-uuid-of-a-post-stream", &event)
            .await
            .expect_err("an unbound stream has no session to live in");
        let err = err.downcast::<Error>().expect("the adapter's error");
        assert!(matches!(*err, Error::UnboundStream { .. }), "{err}");
    }

    #[tokio::test]
    async fn replay_without_a_session_is_refused() {
        let store = unreachable_store();
        assert!(store.replay_events_after("1-2-3.n1").await.is_err());
    }

    #[test]
    fn only_the_response_to_the_streams_own_request_is_terminal() {
        let ok =
            |id| ServerJsonRpcMessage::error(ErrorData::new(ErrorCode(-1), "x", None), Some(id));
        let own = RequestId::Number(4);
        assert!(answers(&ok(RequestId::Number(4)), Some(&own)));
        assert!(!answers(&ok(RequestId::Number(5)), Some(&own)));
        assert!(!answers(&ok(RequestId::String("4".into())), Some(&own)));
        assert!(
            !answers(&ok(RequestId::Number(4)), None),
            "standalone streams never end"
        );
    }
}
