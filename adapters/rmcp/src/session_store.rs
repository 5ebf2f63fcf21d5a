//! [`CursorlogSessionStore`]: rmcp's `SessionStore` in cursorlog's session state, so any
//! replica can restore a session another replica created, for exactly as long as the session
//! lives in cursorlog (not a metadata horizon), and a client's `DELETE` ends it everywhere.

use cursorlog_proto::v1 as pb;
use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};
use tonic::Code;

use crate::error::{Error, Result};
use crate::Client;

/// rmcp `SessionStore` over cursorlog: the session's `initialize` parameters (rmcp's
/// [`SessionState`], as JSON) are the session's opaque state (`SetSessionState`), read back
/// with `GetSession` by any replica that must restore it. An expired session is not restored.
#[derive(Debug, Clone)]
pub struct CursorlogSessionStore {
    client: Client,
}

impl CursorlogSessionStore {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    async fn load_state(&self, session_id: &str) -> Result<Option<SessionState>> {
        let found = self
            .client
            .clone()
            .get_session(pb::GetSessionRequest {
                session: session_id.to_owned(),
            })
            .await;
        let session = match found {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == Code::NotFound => return Ok(None),
            Err(status) => {
                return Err(Error::Rpc {
                    op: "GetSession",
                    status,
                })
            }
        };
        // An expired session must not come back to life on another replica; one that never
        // finished `initialize` has nothing to restore.
        if session.expired || session.state.is_empty() {
            return Ok(None);
        }
        let state =
            serde_json::from_slice(&session.state).map_err(|source| Error::SessionState {
                session: session_id.to_owned(),
                source,
            })?;
        Ok(Some(state))
    }

    async fn store_state(&self, session_id: &str, state: &SessionState) -> Result<()> {
        let bytes = serde_json::to_vec(state)?;
        let set = self
            .client
            .clone()
            .set_session_state(pb::SetSessionStateRequest {
                session: session_id.to_owned(),
                state: bytes.clone(),
            })
            .await;
        match set {
            Ok(_) => Ok(()),
            // Not opened yet (a session manager other than this adapter's): open it with it.
            Err(s) if s.code() == Code::NotFound => {
                let opened = self
                    .client
                    .clone()
                    .open_session(pb::OpenSessionRequest {
                        session: session_id.to_owned(),
                        state: Some(bytes.clone()),
                    })
                    .await
                    .map_err(Error::rpc("OpenSession"))?
                    .into_inner();
                if opened.state == bytes {
                    return Ok(());
                }
                // Opened concurrently without state: set it now.
                self.client
                    .clone()
                    .set_session_state(pb::SetSessionStateRequest {
                        session: session_id.to_owned(),
                        state: bytes,
                    })
                    .await
                    .map_err(Error::rpc("SetSessionState"))?;
                Ok(())
            }
            Err(status) => Err(Error::Rpc {
                op: "SetSessionState",
                status,
            }),
        }
    }
}

/// Expires `session` in cursorlog (its open streams are aborted, its cursors answer
/// UNKNOWN_SESSION); an unknown or already expired session is fine.
pub(crate) async fn expire_session(client: Client, session: &str) -> Result<()> {
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

    /// Called by rmcp only for a client's `DELETE`: the session ends in cursorlog too.
    async fn delete(&self, session_id: &str) -> std::result::Result<(), SessionStoreError> {
        expire_session(self.client.clone(), session_id)
            .await
            .map_err(boxed)
    }
}
