//! [`CursorlogSessionManager`]: rmcp's in-process session workers, made session-safe and
//! durable by cursorlog.
//!
//! Why a session manager and not just an event store: rmcp hands its event store to the
//! session worker and never says which session a `store_event` or a `replay_events_after`
//! is for. This manager gives every session its own rmcp [`LocalSessionManager`] (holding
//! exactly that session, created with rmcp's own `restore_session(id)`) wired to its own
//! [`SessionEventStore`], so:
//! - every event is written into a stream of the session whose worker produced it, whatever
//!   other sessions do at the same moment (no replica-wide state decides it);
//! - stream creation is serialised per session only (the store learns each new stream's
//!   request id while rmcp creates it), never across sessions: a session whose worker waits
//!   on a slow client delays only its own new streams, which rmcp's worker would delay anyway;
//! - a `Last-Event-ID` is resumed inside the session that presents it, so cursorlog answers
//!   another session's cursor with UNKNOWN_CURSOR and replays nothing.
//!
//! A session's worker ending (idle timeout, shutdown) forgets it here only: the session stays
//! alive in cursorlog, so the client resumes it on any replica. A client's `DELETE` expires it
//! in cursorlog through [`crate::CursorlogSessionStore`]'s `delete`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cursorlog_proto::v1 as pb;
use futures::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionHandle, LocalSessionManager, LocalSessionWorker, SessionConfig, SessionError,
};
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::WorkerTransport;
use tokio::sync::RwLock;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::error::{Error, Result};
use crate::store::{AbortOnDrop, SessionEventStore};
use crate::Shared;

/// The event id rmcp gives the priming event of a standalone GET stream when the session
/// manager exposes no event store; resuming from it is a fresh standalone stream.
const STANDALONE_PRIMING_ID: &str = "0";

/// One session served by this replica.
#[derive(Debug)]
struct Local {
    /// rmcp's handle of the session's worker (wired to `store`).
    handle: LocalSessionHandle,
    store: SessionEventStore,
    /// Serialises request-stream creation in this session (see the module docs).
    creating: Arc<tokio::sync::Mutex<()>>,
    _keepalive: AbortOnDrop,
}

/// rmcp `SessionManager` that keeps sessions in process (rmcp's [`LocalSessionManager`]
/// workers) and their events in cursorlog, bound to the MCP session. Build it with
/// [`crate::Cursorlog::session_manager`]; see the module docs.
#[derive(Debug)]
pub struct CursorlogSessionManager {
    shared: Arc<Shared>,
    config: SessionConfig,
    sessions: RwLock<HashMap<SessionId, Arc<Local>>>,
}

impl CursorlogSessionManager {
    pub(crate) fn new(shared: Arc<Shared>, config: SessionConfig) -> Self {
        Self {
            shared,
            config,
            sessions: RwLock::default(),
        }
    }

    /// rmcp's handle of a session served by this replica, e.g. to close an SSE stream with a
    /// retry hint (`close_sse_stream`, SEP-1699 polling). Connections resumed on this
    /// replica from cursorlog are closed along with the worker's own.
    pub async fn session_handle(&self, id: &SessionId) -> Option<LocalSessionHandle> {
        let local = self.sessions.read().await.get(id).cloned()?;
        Some(local.handle.clone())
    }

    /// The event store of a session served by this replica (for tests and diagnostics).
    pub async fn event_store_of(&self, id: &SessionId) -> Option<SessionEventStore> {
        let local = self.sessions.read().await.get(id).cloned()?;
        Some(local.store.clone())
    }

    /// How well this replica's writes are being coalesced into shared `AppendBatch` calls.
    pub fn append_stats(&self) -> crate::AppendStats {
        self.shared.appender.stats()
    }

    /// The ids of the sessions this replica serves now.
    pub async fn session_ids(&self) -> Vec<SessionId> {
        self.sessions.read().await.keys().cloned().collect()
    }

    /// How many sessions this replica serves now.
    pub async fn session_count(&self) -> usize {
        self.sessions.read().await.len()
    }

    async fn local(&self, id: &SessionId) -> Result<Arc<Local>> {
        self.sessions
            .read()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| Error::SessionNotFound(id.to_string()))
    }

    /// A worker for session `id` with its own store; `None` if one already exists.
    async fn spawn_local(
        &self,
        id: &SessionId,
        epoch: Option<u64>,
    ) -> Result<Option<WorkerTransport<LocalSessionWorker>>> {
        let mut sessions = self.sessions.write().await;
        if sessions.contains_key(id) {
            return Ok(None);
        }
        let store = SessionEventStore::new(self.shared.clone(), id, epoch);
        let mut manager = LocalSessionManager::default().with_event_store(Arc::new(store.clone()));
        manager.session_config = self.config.clone();
        // rmcp's own way to make a worker for a given session id, wired to the manager's
        // event store: here, this session's own store.
        let RestoreOutcome::Restored(transport) = manager.restore_session(id.clone()).await? else {
            return Err(Error::Protocol(
                "rmcp's LocalSessionManager did not make a worker for a new session".into(),
            ));
        };
        let handle = manager
            .sessions
            .read()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| Error::SessionNotFound(id.to_string()))?;
        let keepalive = AbortOnDrop(tokio::spawn(keep_session_alive(
            self.shared.clone(),
            id.to_string(),
        )));
        sessions.insert(
            id.clone(),
            Arc::new(Local {
                handle,
                store,
                creating: Arc::default(),
                _keepalive: keepalive,
            }),
        );
        Ok(Some(transport))
    }
}

impl SessionManager for CursorlogSessionManager {
    type Error = Error;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport)> {
        let id: SessionId = uuid::Uuid::new_v4().to_string().into();
        let epoch = self
            .shared
            .client
            .clone()
            .open_session(pb::OpenSessionRequest {
                session: id.to_string(),
                state: None,
            })
            .await
            .map_err(Error::rpc("OpenSession"))?
            .into_inner()
            .epoch;
        match self.spawn_local(&id, Some(epoch)).await? {
            Some(transport) => Ok((id, transport)),
            None => Err(Error::Protocol(format!(
                "session id {id} was already in use"
            ))),
        }
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage> {
        let local = self.local(id).await?;
        Ok(local.handle.initialize(message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool> {
        Ok(self.sessions.read().await.contains_key(id))
    }

    async fn close_session(&self, id: &SessionId) -> Result<()> {
        let local = self.sessions.write().await.remove(id);
        if let Some(local) = local {
            match local.handle.close().await {
                // The worker already exited: nothing left to stop.
                Ok(()) | Err(SessionError::SessionServiceTerminated) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static> {
        let local = self.local(id).await?;
        let request = match &message {
            ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        // In a task of its own, so that a caller that goes away (the HTTP client hung up)
        // cannot leave a declaration behind for another stream of this session to take.
        let creation = tokio::spawn(async move {
            let _one_at_a_time = local.creating.lock().await;
            local.store.expect_stream(request);
            // rmcp's worker creates the stream and stores its priming event (binding it to
            // the declared request) in here; what `LocalSessionManager::create_stream` does.
            let receiver = local.handle.establish_request_wise_channel().await;
            local.store.expect_no_stream();
            let receiver = receiver?;
            local
                .handle
                .push_message(message, receiver.http_request_id)
                .await?;
            Ok::<_, SessionError>(ReceiverStream::new(receiver.inner))
        });
        let stream = creation
            .await
            .map_err(|e| Error::Protocol(format!("stream creation task failed: {e}")))??;
        Ok(stream)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<()> {
        let local = self.local(id).await?;
        Ok(local.handle.push_message(message, None).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static> {
        let local = self.local(id).await?;
        let receiver = local.handle.establish_common_channel().await?;
        Ok(ReceiverStream::new(receiver.inner))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static> {
        if last_event_id == STANDALONE_PRIMING_ID {
            let local = self.local(id).await?;
            let receiver = local.handle.establish_common_channel().await?;
            return Ok(ReceiverStream::new(receiver.inner).left_stream());
        }
        let resumed = crate::replay::resume(self.shared.clone(), id, &last_event_id)
            .await
            .map_err(|e| {
                tracing::warn!(session = %id, last_event_id, error = %e, "cursorlog: resume failed");
                Error::Resume(Box::new(e))
            })?;
        Ok(resumed.right_stream())
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>> {
        Ok(match self.spawn_local(&id, None).await? {
            Some(transport) => RestoreOutcome::Restored(transport),
            None => RestoreOutcome::AlreadyPresent,
        })
    }
}

/// Renews the session's idle TTL in cursorlog while this replica serves it, so a client that
/// is connected but idle keeps its session. Asks cursorlog for the TTL once per replica.
async fn keep_session_alive(shared: Arc<Shared>, session: String) {
    let Some(ttl) = shared.session_idle_ttl(&session).await else {
        return;
    };
    let period = (ttl / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        let renewed = shared
            .client
            .clone()
            .keep_alive(pb::KeepAliveRequest {
                session: session.clone(),
                stream: 0,
            })
            .await;
        match renewed {
            Ok(_) => {}
            Err(s) if matches!(s.code(), Code::NotFound | Code::FailedPrecondition) => {
                tracing::info!(
                    session,
                    reason = s.message(),
                    "cursorlog: session ended; renewal stops"
                );
                return;
            }
            Err(s) => {
                tracing::warn!(session, error = %s, "cursorlog: session renewal failed; retrying");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::fake::{self, Fake};

    /// A session this replica serves is renewed every third of cursorlog's idle TTL with a
    /// session-only KeepAlive, so a client that is connected but idle keeps its session.
    #[tokio::test]
    async fn a_served_session_is_renewed_within_the_idle_ttl() {
        let fake = Arc::new(Fake {
            idle_ttl_ms: 300,
            ..Fake::default()
        });
        let shared = Shared::for_tests(fake::start(fake.clone()).await);
        let renewal = AbortOnDrop(tokio::spawn(keep_session_alive(shared, "s1".into())));
        let started = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let changed = fake.changed.notified();
                if fake.keepalives.lock().unwrap().len() >= 3 {
                    return;
                }
                changed.await;
            }
        })
        .await
        .expect("three renewals");
        // Three renewals, each due a third of the TTL after the last: well inside the TTL
        // apart, and only for the session (stream 0).
        assert!(started.elapsed() < Duration::from_millis(300 * 3));
        assert!(fake
            .keepalives
            .lock()
            .unwrap()
            .iter()
            .all(|(s, stream)| s == "s1" && *stream == 0));
        drop(renewal);
    }

    /// Without an idle TTL (cursorlog's default today), nothing is sent.
    #[tokio::test]
    async fn without_an_idle_ttl_nothing_is_renewed() {
        let fake = Arc::new(Fake::default());
        let shared = Shared::for_tests(fake::start(fake.clone()).await);
        tokio::time::timeout(
            Duration::from_secs(10),
            keep_session_alive(shared, "s1".into()),
        )
        .await
        .expect("the renewal task ends at once when sessions never expire");
        assert!(fake.keepalives.lock().unwrap().is_empty());
    }
}
