//! Async forms of the session and termination calls, for callers on an async runtime: the
//! task awaits the group commit, no thread does. A server that ran them on a blocking pool
//! turned every slow `fdatasync` into one more thread per call in flight (each a stack and an
//! allocator heap); appends and batches already had async forms ([`Engine::append_async`],
//! [`Engine::write_batch_async`]). Each answers exactly as its blocking twin does.

use crate::api::{
    EpochAdvanced, NewEvent, OpenStream, SessionExpired, SessionInfo, StreamInfo, Terminated,
};
use crate::error::{Error, Result};
use crate::mailbox::{send_async, Command, Reply};
use crate::state::StreamState;

use super::write::{expire_command, expired};
use super::{unexpected, Engine};

impl Engine {
    /// Queues `cmd` (awaiting room in the writer's queue) and awaits its answer.
    async fn submit_async(&self, cmd: Command) -> Result<Reply> {
        let tx = self.sender()?;
        let answer = send_async(&tx, &self.inner.shared, cmd).await?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// [`Engine::open_session_with_state`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::open_session_with_state`].
    pub async fn open_session_with_state_async(
        &self,
        session: &str,
        state: Option<Vec<u8>>,
    ) -> Result<SessionInfo> {
        let cmd = self.open_session_command(session, state)?;
        let reply = self.submit_async(cmd).await?;
        self.session_opened(session, reply)
    }

    /// [`Engine::set_session_state`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::set_session_state`].
    pub async fn set_session_state_async(&self, session: &str, state: Vec<u8>) -> Result<()> {
        let cmd = self.set_session_state_command(session, state)?;
        let reply = self.submit_async(cmd).await?;
        self.session_state_set(session, reply)
    }

    /// [`Engine::advance_epoch`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::advance_epoch`].
    pub async fn advance_epoch_async(&self, session: &str) -> Result<EpochAdvanced> {
        self.check_id("session", session)?;
        let reply = self
            .submit_async(Command::AdvanceEpoch(session.to_owned()))
            .await?;
        self.epoch_advanced(session, reply)
    }

    /// [`Engine::expire_session`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::expire_session`].
    pub async fn expire_session_async(&self, session: &str) -> Result<SessionExpired> {
        self.check_id("session", session)?;
        expired(self.submit_async(expire_command(session)).await?)
    }

    /// [`Engine::open_stream`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::open_stream`].
    pub async fn open_stream_async(&self, req: OpenStream) -> Result<StreamInfo> {
        self.check_open_stream(&req)?;
        let (session, lease) = (req.session.clone(), req.lease_ms);
        match self.submit_async(Command::OpenStream(req)).await? {
            Reply::Stream(s) => {
                self.opened(&session, &s, lease);
                Ok(s)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// [`Engine::complete`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::complete`].
    pub async fn complete_async(
        &self,
        session: &str,
        stream: u64,
        expected_next_seq: Option<u64>,
        terminal: NewEvent,
    ) -> Result<Terminated> {
        let cmd = self.terminate_command(
            session,
            stream,
            StreamState::Completed,
            expected_next_seq,
            None,
            Some(terminal),
        )?;
        let reply = self.submit_async(cmd).await?;
        self.terminated(session, reply)
    }

    /// [`Engine::abort`] for async callers.
    ///
    /// # Errors
    /// As [`Engine::abort`].
    pub async fn abort_async(
        &self,
        session: &str,
        stream: u64,
        reason: &str,
        terminal: Option<NewEvent>,
    ) -> Result<Terminated> {
        let cmd = self.abort_command(session, stream, reason, terminal)?;
        let reply = self.submit_async(cmd).await?;
        self.terminated(session, reply)
    }
}
