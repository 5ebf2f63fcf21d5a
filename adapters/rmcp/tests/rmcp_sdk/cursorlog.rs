//! What replaces rmcp's in-memory stores and `LocalSessionManager` in rmcp's own tests: a real
//! `cursorlog` server per test (temporary data directory, free port, killed on drop) and this
//! adapter's session manager and session store.

use std::sync::Arc;

use cursorlog_rmcp::{AdapterConfig, CursorlogSessionManager, CursorlogSessionStore};
use cursorlog_tests::{pb, Server};
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};

/// One cursorlog server and a connection to it.
#[derive(Debug)]
pub struct Cursorlog {
    pub server: Server,
    pub cursorlog: cursorlog_rmcp::Cursorlog,
}

impl Cursorlog {
    /// Starts cursorlog; call inside a tokio runtime (the connection is lazy).
    pub fn start() -> Self {
        let server = Server::start(&[]);
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
            .expect("endpoint")
            .connect_lazy();
        Self {
            server,
            cursorlog: cursorlog_rmcp::Cursorlog::from_channel(channel),
        }
    }

    /// The session manager, as a user wires it (default settings).
    pub fn manager(&self) -> CursorlogSessionManager {
        self.manager_with(|_| {})
    }

    /// The session manager with adjusted settings.
    pub fn manager_with(&self, adjust: impl FnOnce(&mut AdapterConfig)) -> CursorlogSessionManager {
        let mut config = AdapterConfig::default();
        adjust(&mut config);
        self.cursorlog.session_manager(config)
    }

    /// The session store.
    pub fn session_store(&self) -> Arc<CursorlogSessionStore> {
        Arc::new(self.cursorlog.session_store())
    }

    /// Sessions cursorlog holds alive (opened and not expired).
    pub async fn live_sessions(&self) -> u64 {
        self.server
            .client()
            .await
            .stats(pb::StatsRequest {})
            .await
            .expect("Stats")
            .into_inner()
            .live_sessions
    }
}

impl Cursorlog {
    /// Whether cursorlog has streams and none of them is open any more.
    pub async fn all_streams_finished(&self) -> bool {
        let stats = self
            .server
            .client()
            .await
            .stats(pb::StatsRequest {})
            .await
            .expect("Stats")
            .into_inner();
        stats.streams > 0 && stats.open_streams == 0
    }
}

/// rmcp's session-store tests look into their in-memory map; this looks into cursorlog the
/// same way: it is this adapter's `CursorlogSessionStore`, remembering which session ids rmcp
/// stored, and `len`/`states` say which of them cursorlog holds a restorable state for.
#[derive(Debug)]
pub struct StoreProbe {
    store: CursorlogSessionStore,
    stored: tokio::sync::Mutex<Vec<String>>,
}

impl StoreProbe {
    pub fn new(cl: &Cursorlog) -> Self {
        Self {
            store: cl.cursorlog.session_store(),
            stored: tokio::sync::Mutex::default(),
        }
    }

    /// The restorable states cursorlog holds for the sessions rmcp stored.
    pub async fn states(&self) -> Vec<SessionState> {
        let ids = self.stored.lock().await.clone();
        let mut states = Vec::new();
        for id in ids {
            if let Some(state) = self.store.load(&id).await.expect("load") {
                states.push(state);
            }
        }
        states
    }

    /// How many sessions cursorlog holds a restorable state for.
    pub async fn len(&self) -> usize {
        self.states().await.len()
    }
}

#[async_trait::async_trait]
impl SessionStore for StoreProbe {
    async fn load(&self, session_id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        self.store.load(session_id).await
    }

    async fn store(&self, session_id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        self.stored.lock().await.push(session_id.to_owned());
        self.store.store(session_id, state).await
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        self.store.delete(session_id).await
    }
}
