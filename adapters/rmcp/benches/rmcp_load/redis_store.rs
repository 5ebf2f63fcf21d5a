//! The comparison: the Redis-Streams-backed rmcp stores an rmcp user writes today. One
//! multiplexed connection (`ConnectionManager`, which pipelines concurrent commands), `XADD`
//! of every SSE event rmcp stores (priming included) into one Redis stream per rmcp stream,
//! event ids `{stream_id}/{entry_id}`, replay with `XRANGE` after the entry. The session
//! store is a `SET`/`GET`/`DEL` of the JSON state. Run against `redis-server` with
//! `appendonly yes` and `appendfsync always`, every acknowledged `XADD` is on disk.

use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use rmcp::model::ServerJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage, SessionState,
    SessionStore, SessionStoreError,
};

/// rmcp `EventStore` over Redis Streams.
#[derive(Clone)]
pub struct RedisEventStore {
    pub conn: ConnectionManager,
}

fn key(stream_id: &str) -> String {
    format!("mcp:events:{stream_id}")
}

#[async_trait::async_trait]
impl EventStore for RedisEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let data = match &event.message {
            Some(m) => serde_json::to_string(m.as_ref())?,
            None => String::new(),
        };
        let retry = event.retry.map_or(0, |r| r.as_millis() as u64);
        let mut conn = self.conn.clone();
        let entry: String = conn
            .xadd(
                key(stream_id),
                "*",
                &[("data", data), ("retry", retry.to_string())],
            )
            .await?;
        Ok(format!("{stream_id}/{entry}"))
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let (stream_id, entry) = last_event_id
            .split_once('/')
            .ok_or_else(|| std::io::Error::other("not an event id of this store"))?;
        let mut conn = self.conn.clone();
        let reply: redis::streams::StreamRangeReply = conn
            .xrange(key(stream_id), format!("({entry}"), "+")
            .await?;
        let mut events = Vec::new();
        for e in reply.ids {
            let data: String = e.get("data").unwrap_or_default();
            let id = format!("{stream_id}/{}", e.id);
            if data.is_empty() {
                continue;
            }
            let message: ServerJsonRpcMessage = serde_json::from_str(&data)?;
            events.push(ServerSseMessage::new(id, message));
        }
        Ok(Box::pin(futures::stream::iter(events)))
    }
}

/// rmcp `SessionStore` over Redis keys.
#[derive(Clone)]
pub struct RedisSessionStore {
    pub conn: ConnectionManager,
}

#[async_trait::async_trait]
impl SessionStore for RedisSessionStore {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let mut conn = self.conn.clone();
        let value: Option<String> = conn.get(format!("mcp:session:{session_id}")).await?;
        Ok(value.map(|v| serde_json::from_str(&v)).transpose()?)
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let mut conn = self.conn.clone();
        let () = conn
            .set(
                format!("mcp:session:{session_id}"),
                serde_json::to_string(state)?,
            )
            .await?;
        Ok(())
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        let mut conn = self.conn.clone();
        let () = conn.del(format!("mcp:session:{session_id}")).await?;
        Ok(())
    }
}
