//! [`StatelessEventStore`]: rmcp's event store for *stateless* (2026-07-28) response streams,
//! for `NeverSessionManager::default().with_event_store(..)`.
//!
//! A stateless stream belongs to no MCP session, and cursorlog never interprets a cursor
//! outside a session. So each stateless stream gets a cursorlog session of its own, named by
//! an unguessable token (a random uuid), and its event ids carry that token
//! (`{epoch}-{stream}-{seq}~{token}`): whoever holds an event id of the stream (the client
//! that received it) can resume it, on any replica; nobody can name another stream by
//! guessing, because stream numbers are only ever judged inside the token's session.
//!
//! The 2026-07-28 specification removed SSE resumption (`Last-Event-ID` is to be ignored);
//! rmcp still replays stateless streams when the session manager has an event store, and this
//! store makes that replay durable and shared. The stream's first JSON-RPC response or error
//! is its terminal frame. The sessions are never renewed: cursorlog's idle TTL ends them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cursorlog_proto::v1 as pb;
use rmcp::model::ServerJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};

use crate::error::{Error, Result};
use crate::event_id::{self, EventId as ParsedId};
use crate::store::{locked, Binding};
use crate::Shared;

/// The prefix of the cursorlog session of a stateless stream: `rmcp-stateless-{token}`.
const SESSION_PREFIX: &str = "rmcp-stateless-";

/// A stateless stream's token: 32 lowercase hex digits (a v4 uuid without dashes).
fn valid_token(token: &str) -> bool {
    token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit())
}

/// rmcp's `EventStore` for stateless streams; see the module docs. Made by
/// [`crate::Cursorlog::stateless_event_store`].
#[derive(Debug, Clone)]
pub struct StatelessEventStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    /// Open streams by rmcp stream id, with their tokens.
    streams: Mutex<HashMap<String, (String, Arc<Binding>)>>,
}

impl StatelessEventStore {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            inner: Arc::new(Inner {
                shared,
                streams: Mutex::default(),
            }),
        }
    }

    async fn binding(&self, stream_id: &str) -> Result<(String, Arc<Binding>)> {
        if let Some(found) = locked(&self.inner.streams).get(stream_id) {
            return Ok(found.clone());
        }
        let token = uuid::Uuid::new_v4().simple().to_string();
        let session = format!("{SESSION_PREFIX}{token}");
        let client = self.inner.shared.client.clone();
        let epoch = client
            .open_session(pb::OpenSessionRequest {
                session: session.clone(),
                state: None,
            })
            .await
            .map_err(Error::rpc("OpenSession"))?
            .into_inner()
            .epoch;
        let lease = self.inner.shared.lease;
        let opened = client
            .open_stream(pb::OpenStreamRequest {
                session: session.clone(),
                epoch,
                correlation: None,
                lease_ms: lease.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX).max(1)),
            })
            .await
            .map_err(Error::rpc("OpenStream"))?
            .into_inner();
        let binding = Arc::new(Binding::new(
            &self.inner.shared,
            &session,
            &opened,
            None,
            lease,
        ));
        locked(&self.inner.streams).insert(stream_id.to_owned(), (token.clone(), binding.clone()));
        Ok((token, binding))
    }

    async fn write(&self, stream_id: &str, event: &ServerSseMessage) -> Result<String> {
        let (token, b) = self.binding(stream_id).await?;
        let suffix = event_id::token_suffix(&token);
        let Some(message) = event.message.as_deref() else {
            return Ok(format!("{}{suffix}", b.current_cursor()));
        };
        let terminal = matches!(
            message,
            ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)
        );
        if terminal {
            locked(&self.inner.streams).remove(stream_id);
        }
        let cursor = b.write(&self.inner.shared, message, terminal).await?;
        Ok(format!("{cursor}{suffix}"))
    }
}

#[async_trait::async_trait]
impl EventStore for StatelessEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> std::result::Result<EventId, EventStoreError> {
        self.write(stream_id, event).await.map_err(|e| {
            tracing::error!(stream_id, error = %e, "cursorlog: storing a stateless SSE event failed; rmcp will not send it");
            Box::new(e) as EventStoreError
        })
    }

    /// Resumes a stateless stream inside the cursorlog session its id names; see
    /// [`crate::replay`] for what each verdict delivers.
    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> std::result::Result<EventStream, EventStoreError> {
        let parsed = ParsedId::parse(last_event_id);
        let Some(token) = parsed.token.filter(|t| valid_token(t)) else {
            tracing::warn!(
                last_event_id,
                "cursorlog: not a stateless stream's event id"
            );
            return Err(Box::new(Error::NotStateless(last_event_id.to_owned())));
        };
        let session = format!("{SESSION_PREFIX}{token}");
        crate::replay::resume(self.inner.shared.clone(), &session, last_event_id)
            .await
            .map_err(|e| Box::new(e) as EventStoreError)
    }
}
