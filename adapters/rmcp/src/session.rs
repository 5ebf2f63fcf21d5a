//! [`CursorlogSessionManager`]: rmcp's in-process session manager, made session-safe and
//! durable by cursorlog; and [`CursorlogSessionStore`], which lets any replica restore a
//! session another replica created.
//!
//! Why a session manager and not just an event store: rmcp hands one event store to every
//! session and calls `replay_events_after(last_event_id)` without saying which session asks,
//! and its request stream ids carry no session either. The session manager is the one place
//! rmcp names the session: it binds each new request stream to its session and request id
//! (see [`crate::store`]) and resumes a `Last-Event-ID` *inside the session that presents it*,
//! so cursorlog answers another session's cursor with UNKNOWN_CURSOR and replays nothing.

use cursorlog_proto::v1 as pb;
use futures::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionWorker,
};
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId, SessionManager, SessionState, SessionStore,
    SessionStoreError,
};
use rmcp::transport::WorkerTransport;

use crate::error::{Error, Result};
use crate::store::{CursorlogEventStore, PendingStream};
use crate::Client;

/// The event id rmcp gives the priming event of a standalone GET stream when the session
/// manager exposes no event store; resuming from it is a fresh standalone stream.
const STANDALONE_PRIMING_ID: &str = "0";

/// rmcp `SessionManager` that keeps sessions in process (rmcp's [`LocalSessionManager`]) and
/// their events in cursorlog, bound to the MCP session. Build it with
/// [`crate::Cursorlog::session_manager`].
#[derive(Debug)]
pub struct CursorlogSessionManager {
    local: LocalSessionManager,
    store: CursorlogEventStore,
    /// Serialises request-stream creation so the store binds each new stream to the right
    /// session and request (see [`CursorlogEventStore::bind_next`]).
    creating: tokio::sync::Mutex<()>,
}

impl CursorlogSessionManager {
    pub(crate) fn new(local: LocalSessionManager, store: CursorlogEventStore) -> Self {
        Self {
            local,
            store,
            creating: tokio::sync::Mutex::new(()),
        }
    }
}

impl SessionManager for CursorlogSessionManager {
    type Error = Error;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport)> {
        let (id, transport) = self.local.create_session().await?;
        self.store.open_session(&id).await?;
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage> {
        Ok(self.local.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool> {
        Ok(self.local.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<()> {
        self.local.close_session(id).await?;
        self.store.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static> {
        let request = match &message {
            ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        let _one_at_a_time = self.creating.lock().await;
        self.store.bind_next(Some(PendingStream {
            session: id.to_string(),
            request,
        }));
        // rmcp creates the stream and stores its priming event (binding it) in here.
        let stream = self.local.create_stream(id, message).await;
        self.store.bind_next(None);
        Ok(stream?)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<()> {
        Ok(self.local.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static> {
        Ok(self.local.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static> {
        if last_event_id == STANDALONE_PRIMING_ID {
            let fresh = self.local.create_standalone_stream(id).await?;
            return Ok(fresh.left_stream());
        }
        let resumed = self
            .store
            .resume(id, &last_event_id)
            .await
            .map_err(Error::Resume)?;
        Ok(resumed.right_stream())
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>> {
        Ok(self.local.restore_session(id).await?)
    }
}

/// The correlation id of the stream holding a session's `initialize` parameters.
const SESSION_STATE: &str = "rmcp.session-state";

/// rmcp `SessionStore` in cursorlog: the session's `initialize` parameters are the terminal
/// frame of a stream in that session (correlation `rmcp.session-state`), so every replica can
/// restore the session, and expiring the session forgets it everywhere.
#[derive(Debug, Clone)]
pub struct CursorlogSessionStore {
    client: Client,
}

impl CursorlogSessionStore {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    async fn load_state(&self, session_id: &str) -> Result<Option<SessionState>> {
        // An expired (or never opened) session must not come back to life on another replica.
        let probe = self
            .client
            .clone()
            .resolve(pb::ResolveRequest {
                session: session_id.to_owned(),
                last_event_id: "0-0-0".into(),
                declared_stream: None,
            })
            .await
            .map_err(Error::rpc("Resolve"))?
            .into_inner();
        if probe.verdict() == pb::Verdict::UnknownSession {
            return Ok(None);
        }
        let outcome = self
            .client
            .clone()
            .get_outcome(pb::GetOutcomeRequest {
                session: session_id.to_owned(),
                correlation: SESSION_STATE.into(),
                stream: None,
            })
            .await
            .map_err(Error::rpc("GetOutcome"))?
            .into_inner();
        match outcome.outcome.and_then(|o| o.frame) {
            Some(frame) => Ok(Some(serde_json::from_slice(&frame.payload)?)),
            None => Ok(None),
        }
    }

    async fn store_state(&self, session_id: &str, state: &SessionState) -> Result<()> {
        let mut client = self.client.clone();
        let epoch = client
            .open_session(pb::OpenSessionRequest {
                session: session_id.to_owned(),
                state: None,
            })
            .await
            .map_err(Error::rpc("OpenSession"))?
            .into_inner()
            .epoch;
        let stream = client
            .open_stream(pb::OpenStreamRequest {
                session: session_id.to_owned(),
                epoch,
                correlation: Some(SESSION_STATE.into()),
                lease_ms: None,
            })
            .await
            .map_err(Error::rpc("OpenStream"))?
            .into_inner()
            .stream;
        client
            .complete(pb::CompleteRequest {
                session: session_id.to_owned(),
                stream,
                expected_next_seq: Some(1),
                terminal: Some(pb::NewEvent {
                    kind: SESSION_STATE.into(),
                    correlation: None,
                    payload: serde_json::to_vec(state)?,
                }),
            })
            .await
            .map_err(Error::rpc("Complete"))?;
        Ok(())
    }

    async fn delete_state(&self, session_id: &str) -> Result<()> {
        crate::store::expire_session(self.client.clone(), session_id).await
    }
}

fn boxed(e: Error) -> SessionStoreError {
    Box::new(e)
}

#[async_trait::async_trait]
impl SessionStore for CursorlogSessionStore {
    async fn load(
        &self,
        session_id: &str,
    ) -> std::result::Result<Option<SessionState>, SessionStoreError> {
        self.load_state(session_id).await.map_err(boxed)
    }

    async fn store(
        &self,
        session_id: &str,
        state: &SessionState,
    ) -> std::result::Result<(), SessionStoreError> {
        self.store_state(session_id, state).await.map_err(boxed)
    }

    async fn delete(&self, session_id: &str) -> std::result::Result<(), SessionStoreError> {
        self.delete_state(session_id).await.map_err(boxed)
    }
}
