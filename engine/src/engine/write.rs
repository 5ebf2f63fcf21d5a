//! The write side of the facade: sessions, streams, appends, completions, trims. Each
//! request is validated here (nothing is queued for a refused one), planned and written by
//! the writer, and renews the idle TTL of the session it names.

use crate::api::{
    Append, Appended, BatchWrite, BatchWritten, EpochAdvanced, NewEvent, OpenStream,
    SessionExpired, SessionInfo, SessionView, StreamInfo, Terminated,
};
use crate::error::{Error, Result};
use crate::index::KvRead;
use crate::mailbox::{send_async, Command, Reply};
use crate::state::StreamState;

use super::{unexpected, Engine};

impl Engine {
    pub(super) fn check_id(&self, field: &'static str, v: &str) -> Result<()> {
        if v.is_empty() {
            return Err(Error::invalid(field, "must not be empty"));
        }
        let max = self.config().id_bytes_max;
        if v.len() > max as usize {
            return Err(Error::invalid(
                field,
                format!("is {} bytes; the limit is {max}", v.len()),
            ));
        }
        Ok(())
    }

    fn check_event(&self, e: &NewEvent) -> Result<()> {
        let max = self.config().id_bytes_max as usize;
        if e.kind.len() > max {
            return Err(Error::invalid(
                "event.kind",
                format!("is {} bytes; the limit is {max}", e.kind.len()),
            ));
        }
        if let Some(c) = &e.correlation {
            self.check_id("event.correlation", c)?;
        }
        let limit = self.config().payload_bytes_max;
        if e.payload.len() as u64 > u64::from(limit) {
            return Err(Error::TooLarge {
                what: "event payload (bytes)",
                got: e.payload.len() as u64,
                limit: u64::from(limit),
            });
        }
        Ok(())
    }

    /// Opens a session, or returns it if it exists (idempotent). New sessions start at epoch 1.
    ///
    /// # Errors
    /// Invalid id; [`Error::SessionExpired`] for an expired session id; write failures.
    pub fn open_session(&self, session: &str) -> Result<SessionInfo> {
        self.open_session_with_state(session, None)
    }

    /// [`Engine::open_session`], storing `state` (opaque, e.g. the MCP `initialize`
    /// parameters a replica needs to restore the session) with a session this call creates,
    /// in the same durable record group. The state of an existing session is returned
    /// unchanged; it lives exactly as long as the session.
    ///
    /// # Errors
    /// As [`Engine::open_session`]; [`Error::TooLarge`] above `session_state_bytes_max`.
    pub fn open_session_with_state(
        &self,
        session: &str,
        state: Option<Vec<u8>>,
    ) -> Result<SessionInfo> {
        let cmd = self.open_session_command(session, state)?;
        self.session_opened(session, self.submit(cmd)?)
    }

    pub(super) fn open_session_command(
        &self,
        session: &str,
        state: Option<Vec<u8>>,
    ) -> Result<Command> {
        self.check_id("session", session)?;
        if let Some(s) = &state {
            self.check_session_state(s)?;
        }
        Ok(Command::OpenSession {
            session: session.to_owned(),
            state,
        })
    }

    pub(super) fn session_opened(&self, session: &str, reply: Reply) -> Result<SessionInfo> {
        match reply {
            Reply::Session(s) => {
                self.touch(session);
                Ok(s)
            }
            other => Err(unexpected(&other)),
        }
    }

    fn check_session_state(&self, state: &[u8]) -> Result<()> {
        let limit = self.config().session_state_bytes_max;
        if state.len() as u64 > u64::from(limit) {
            return Err(Error::TooLarge {
                what: "session state (bytes)",
                got: state.len() as u64,
                limit: u64::from(limit),
            });
        }
        Ok(())
    }

    /// Replaces a live session's opaque state (empty clears it).
    ///
    /// # Errors
    /// Unknown or expired session; [`Error::TooLarge`]; write failures.
    pub fn set_session_state(&self, session: &str, state: Vec<u8>) -> Result<()> {
        let cmd = self.set_session_state_command(session, state)?;
        self.session_state_set(session, self.submit(cmd)?)
    }

    pub(super) fn set_session_state_command(
        &self,
        session: &str,
        state: Vec<u8>,
    ) -> Result<Command> {
        self.check_id("session", session)?;
        self.check_session_state(&state)?;
        Ok(Command::SetSessionState {
            session: session.to_owned(),
            state,
        })
    }

    pub(super) fn session_state_set(&self, session: &str, reply: Reply) -> Result<()> {
        match reply {
            Reply::Done => {
                self.touch(session);
                Ok(())
            }
            other => Err(unexpected(&other)),
        }
    }

    /// The session as a replica restoring it needs it, `None` when it was never opened or
    /// is past its metadata horizon.
    ///
    /// # Errors
    /// Invalid id; index failures.
    pub fn session(&self, session: &str) -> Result<Option<SessionView>> {
        self.check_id("session", session)?;
        // The epoch and the state as of one moment (`Index::snapshot`).
        let index = self.inner.shared.index.snapshot();
        let Some(s) = index.stored_session(session)? else {
            return Ok(None);
        };
        let state = index.session_state(session)?.unwrap_or_default();
        drop(index);
        self.touch(session);
        Ok(Some(SessionView {
            session: s.meta.id,
            epoch: s.meta.epoch,
            opened_at_ms: s.meta.opened_at_ms,
            expired: s.meta.expired_at_ms.is_some(),
            state,
        }))
    }

    /// Checks that the session is live (renewing its idle TTL).
    ///
    /// # Errors
    /// [`Error::UnknownSession`]; [`Error::SessionExpired`]; index failures.
    pub fn touch_session(&self, session: &str) -> Result<()> {
        match self.session(session)? {
            None => Err(Error::UnknownSession),
            Some(s) if s.expired => Err(Error::SessionExpired),
            Some(_) => Ok(()),
        }
    }

    /// Advances the session's epoch by one; every open stream of older epochs becomes
    /// `Superseded` in the same atomic group.
    ///
    /// # Errors
    /// Unknown or expired session; write failures.
    pub fn advance_epoch(&self, session: &str) -> Result<EpochAdvanced> {
        self.check_id("session", session)?;
        let reply = self.submit(Command::AdvanceEpoch(session.to_owned()))?;
        self.epoch_advanced(session, reply)
    }

    pub(super) fn epoch_advanced(&self, session: &str, reply: Reply) -> Result<EpochAdvanced> {
        match reply {
            Reply::Epoch(e) => {
                self.touch(session);
                Ok(e)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Expires the session: its open streams are `Aborted`, cursors get `UNKNOWN_SESSION`,
    /// and its outcomes stay readable for the metadata horizon.
    ///
    /// # Errors
    /// Unknown or already expired session; write failures.
    pub fn expire_session(&self, session: &str) -> Result<SessionExpired> {
        self.check_id("session", session)?;
        expired(self.submit(expire_command(session))?)
    }

    /// Opens a stream in the session's current epoch; returns its new, never reused id.
    ///
    /// # Errors
    /// Unknown/expired session; [`Error::StaleEpoch`]; [`Error::TooLarge`] when the session
    /// already has `open_streams_per_session_max` open streams; invalid ids; write failures.
    pub fn open_stream(&self, req: OpenStream) -> Result<StreamInfo> {
        self.check_open_stream(&req)?;
        let lease = req.lease_ms;
        let session = req.session.clone();
        match self.submit(Command::OpenStream(req))? {
            Reply::Stream(s) => {
                self.opened(&session, &s, lease);
                Ok(s)
            }
            other => Err(unexpected(&other)),
        }
    }

    pub(super) fn check_open_stream(&self, req: &OpenStream) -> Result<()> {
        self.check_id("session", &req.session)?;
        if let Some(c) = &req.correlation {
            self.check_id("correlation", c)?;
        }
        if req.lease_ms == Some(0) {
            return Err(Error::invalid(
                "lease_ms",
                "must be at least 1 ms when given",
            ));
        }
        Ok(())
    }

    /// What opening a stream starts: its producer lease, and the session's idle TTL anew.
    pub(super) fn opened(&self, session: &str, s: &StreamInfo, lease_ms: Option<u64>) {
        let shared = &self.inner.shared;
        if let Some(ms) = lease_ms {
            shared.leases.arm(s.stream, ms, shared.now_ms());
        }
        self.touch(session);
    }

    /// What an append that was carried out renews: the stream's producer lease (only now,
    /// once the writer checked the stream is the caller's: another session naming the
    /// stream must not keep a dead producer's stream alive) and the session's idle TTL.
    fn appended(&self, session: &str, stream: u64) {
        let shared = &self.inner.shared;
        shared.leases.renew(stream, shared.now_ms());
        self.touch(session);
    }

    /// Appends a batch atomically. With `expected_next_seq`, a retry of a batch already
    /// written returns the same seqs (`duplicate: true`) and a different batch is a conflict.
    ///
    /// # Errors
    /// Bad input (nothing written); unknown stream (or another session's);
    /// [`Error::StreamTerminated`]; [`Error::SeqConflict`]; [`Error::DiskFull`]; write
    /// failures.
    pub fn append(&self, req: Append) -> Result<Appended> {
        self.check_append(&req)?;
        let session = req.session.clone();
        match self.submit(Command::Append(req))? {
            Reply::Appended(a) => {
                self.appended(&session, a.stream);
                Ok(a)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// [`Engine::append`] for async callers: no thread waits for the group commit, the task
    /// does (nor for a full writer queue). Dropping the future does not cancel an append
    /// that was already queued.
    ///
    /// # Errors
    /// As [`Engine::append`].
    pub async fn append_async(&self, req: Append) -> Result<Appended> {
        self.queue_append(req).await?.await
    }

    /// Validates `req` and queues it to the writer (awaiting room in its queue, never
    /// blocking a thread); the returned future resolves once it is durable. Appends queued
    /// one after another apply in that order, whenever their futures are awaited: a caller
    /// pipelining appends (many in flight, answered in order) queues each as it arrives.
    ///
    /// # Errors
    /// Refusals before queuing (bad input, closed, poisoned) at once; the rest, as
    /// [`Engine::append`], from the future.
    pub async fn queue_append(
        &self,
        req: Append,
    ) -> Result<impl std::future::Future<Output = Result<Appended>> + Send + 'static> {
        self.check_append(&req)?;
        let tx = self.sender()?;
        let session = req.session.clone();
        let reply = send_async(&tx, &self.inner.shared, Command::Append(req)).await?;
        let engine = self.clone();
        Ok(async move {
            match reply.await.map_err(|_| Error::Closed)?? {
                Reply::Appended(a) => {
                    engine.appended(&session, a.stream);
                    Ok(a)
                }
                other => Err(unexpected(&other)),
            }
        })
    }

    /// Checks an append's limits (nothing is written for a refused one).
    fn check_append(&self, req: &Append) -> Result<()> {
        self.check_id("session", &req.session)?;
        if req.events.is_empty() {
            return Err(Error::invalid(
                "events",
                "an append needs at least one event",
            ));
        }
        let max = self.config().batch_events_max;
        if req.events.len() > max as usize {
            return Err(Error::TooLarge {
                what: "batch (events)",
                got: req.events.len() as u64,
                limit: u64::from(max),
            });
        }
        if req.expected_next_seq == Some(0) {
            return Err(Error::invalid("expected_next_seq", "seqs start at 1"));
        }
        for e in &req.events {
            self.check_event(e)?;
        }
        Ok(())
    }

    pub(super) fn terminate_command(
        &self,
        session: &str,
        stream: u64,
        state: StreamState,
        expected: Option<u64>,
        reason: Option<String>,
        frame: Option<NewEvent>,
    ) -> Result<Command> {
        self.check_id("session", session)?;
        if let Some(f) = &frame {
            self.check_event(f)?;
        }
        Ok(Command::Terminate {
            session: Some(session.to_owned()),
            stream,
            state,
            expected_next_seq: expected,
            reason,
            frame,
        })
    }

    fn terminate(
        &self,
        session: &str,
        stream: u64,
        state: StreamState,
        expected: Option<u64>,
        reason: Option<String>,
        frame: Option<NewEvent>,
    ) -> Result<Terminated> {
        let cmd = self.terminate_command(session, stream, state, expected, reason, frame)?;
        self.terminated(session, self.submit(cmd)?)
    }

    pub(super) fn terminated(&self, session: &str, reply: Reply) -> Result<Terminated> {
        match reply {
            Reply::Terminated(t) => {
                self.touch(session);
                Ok(t)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Writes the terminal frame and the `Completed` tombstone as one record. A retry with
    /// the same `expected_next_seq` and frame is recognised (`duplicate`).
    ///
    /// # Errors
    /// As [`Engine::append`].
    pub fn complete(
        &self,
        session: &str,
        stream: u64,
        expected_next_seq: Option<u64>,
        terminal: NewEvent,
    ) -> Result<Terminated> {
        self.terminate(
            session,
            stream,
            StreamState::Completed,
            expected_next_seq,
            None,
            Some(terminal),
        )
    }

    /// Writes an `Aborted` tombstone with a reason and an optional terminal (error) frame.
    ///
    /// # Errors
    /// As [`Engine::append`].
    pub fn abort(
        &self,
        session: &str,
        stream: u64,
        reason: &str,
        terminal: Option<NewEvent>,
    ) -> Result<Terminated> {
        let cmd = self.abort_command(session, stream, reason, terminal)?;
        self.terminated(session, self.submit(cmd)?)
    }

    pub(super) fn abort_command(
        &self,
        session: &str,
        stream: u64,
        reason: &str,
        terminal: Option<NewEvent>,
    ) -> Result<Command> {
        if reason.len() > self.config().id_bytes_max as usize * 4 {
            return Err(Error::invalid("reason", "is too long"));
        }
        self.terminate_command(
            session,
            stream,
            StreamState::Aborted,
            None,
            Some(reason.to_owned()),
            terminal,
        )
    }

    /// Renews a stream's producer lease (and its session's idle TTL) without appending.
    ///
    /// # Errors
    /// Unknown stream (or another session's); [`Error::StreamTerminated`].
    pub fn keep_alive(&self, session: &str, stream: u64) -> Result<()> {
        let meta = crate::read::owned_stream(&self.inner.shared, session, stream)?;
        if meta.state.is_terminal() {
            return Err(Error::StreamTerminated {
                stream,
                state: meta.state,
                terminal_seq: meta.head,
            });
        }
        self.appended(session, stream);
        Ok(())
    }

    /// Evicts the stream's events up to and including `up_to_seq`; returns the new watermark.
    ///
    /// # Errors
    /// Unknown stream; write failures.
    pub fn trim(&self, session: &str, stream: u64, up_to_seq: u64) -> Result<u64> {
        self.check_id("session", session)?;
        let cmd = Command::Trim {
            session: Some(session.to_owned()),
            stream,
            watermark: up_to_seq.saturating_add(1),
        };
        match self.submit(cmd)? {
            Reply::Watermark(w) => {
                self.touch(session);
                Ok(w)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Many independent appends and completions, all queued to the writer before any is
    /// awaited (so they share group commits), each answered on its own: one failing item
    /// never fails another. Items of one stream apply in item order.
    ///
    /// # Errors
    /// Per item, as [`Engine::append`] or [`Engine::complete`].
    pub async fn write_batch_async(&self, items: Vec<BatchWrite>) -> Vec<Result<BatchWritten>> {
        type Answer = tokio::sync::oneshot::Receiver<Result<Reply>>;
        /// A queued item: its answer, its session, and the lease of a stream it opens.
        type Queued = (Answer, String, Option<u64>);
        let tx = self.sender();
        let mut pending: Vec<Result<Queued>> = Vec::with_capacity(items.len());
        for item in items {
            let tx = match &tx {
                Ok(tx) => tx,
                Err(_) => {
                    pending.push(Err(Error::Closed));
                    continue;
                }
            };
            let cmd = match item {
                BatchWrite::Append(req) => self
                    .check_append(&req)
                    .map(|()| (req.session.clone(), Command::Append(req), None)),
                BatchWrite::Open(req) => self.check_open_stream(&req).map(|()| {
                    let (session, lease) = (req.session.clone(), req.lease_ms);
                    (session, Command::OpenStream(req), lease)
                }),
                BatchWrite::Complete {
                    session,
                    stream,
                    expected_next_seq,
                    terminal,
                } => self
                    .terminate_command(
                        &session,
                        stream,
                        StreamState::Completed,
                        expected_next_seq,
                        None,
                        Some(terminal),
                    )
                    .map(|cmd| (session, cmd, None)),
            };
            pending.push(match cmd {
                Ok((session, cmd, lease)) => send_async(tx, &self.inner.shared, cmd)
                    .await
                    .map(|answer| (answer, session, lease)),
                Err(e) => Err(e),
            });
        }
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            out.push(match p {
                Err(e) => Err(e),
                Ok((answer, session, lease)) => {
                    match answer.await.map_err(|_| Error::Closed).and_then(|r| r) {
                        Ok(Reply::Appended(a)) => {
                            self.appended(&session, a.stream);
                            Ok(BatchWritten::Appended(a))
                        }
                        Ok(Reply::Terminated(t)) => {
                            self.touch(&session);
                            Ok(BatchWritten::Completed(t))
                        }
                        Ok(Reply::Stream(s)) => {
                            self.opened(&session, &s, lease);
                            Ok(BatchWritten::Opened(s))
                        }
                        Ok(other) => Err(unexpected(&other)),
                        Err(e) => Err(e),
                    }
                }
            });
        }
        out
    }
}

/// The command that expires `session` by request (not for idleness).
pub(super) fn expire_command(session: &str) -> Command {
    Command::ExpireSession {
        session: session.to_owned(),
        idle_ms: None,
    }
}

/// The answer to an expiry.
pub(super) fn expired(reply: Reply) -> Result<SessionExpired> {
    match reply {
        Reply::Expired(e) => Ok(e),
        other => Err(unexpected(&other)),
    }
}
