//! The `Engine` handle: opens the directory, runs the writer, answers reads and verdicts.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;

use crate::api::{
    Append, Appended, BatchWrite, BatchWritten, EpochAdvanced, NewEvent, OpenStream,
    SessionExpired, SessionInfo, SessionView, Stats, StreamInfo, Terminated,
};
use crate::background::{run_retention, spawn_index_flusher, spawn_maintenance, Leases};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::format::{PAYLOAD_BYTES_LIMIT, SEGMENT_BYTES_MIN};
use crate::fs::{FileSystem, StdFs};
use crate::index::prefix;
use crate::index::KvRead;
use crate::recovery::{recover, RecoveryReport};
use crate::state::{SessionMeta, StreamMeta, StreamState};
use crate::writer::{
    send, send_async, submit_async, wait, Command, Counters, Reply, Request, Shared, Writer,
};

/// Depth of the writer's request queue; appenders block beyond it (back-pressure).
const WRITER_QUEUE_DEPTH: usize = 16 * 1024;

/// A handle to an open data directory. Cheap to clone; every clone talks to one writer.
///
/// # Invariants
/// Exactly one writer thread appends to the log; reads never take its lock. A write or
/// fsync failure poisons the engine: every later write fails with [`Error::Poisoned`].
#[derive(Debug, Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) shared: Arc<Shared>,
    /// The writer's queue; `None` once closed. Callers hold the read lock only while they
    /// queue a request (never while they wait for its answer).
    tx: RwLock<Option<SyncSender<Request>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    background: Mutex<Vec<JoinHandle<()>>>,
    shutdown: Arc<AtomicBool>,
    report: RecoveryReport,
    leases: Arc<Leases>,
    _lock: std::fs::File,
}

impl Inner {
    /// Stops the background threads, then the writer (which drains its queue and syncs), and
    /// joins them all. Idempotent.
    fn stop_threads(&self) {
        self.shutdown.store(true, Ordering::Release);
        let me = std::thread::current().id();
        let background: Vec<_> = self
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        for t in background {
            t.thread().unpark();
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        self.tx
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(w) = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = w.join();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

fn validate_config(c: &Config) -> Result<()> {
    if c.segment_bytes_max < SEGMENT_BYTES_MIN {
        return Err(Error::invalid(
            "segment_bytes_max",
            format!("must be at least {SEGMENT_BYTES_MIN} bytes"),
        ));
    }
    if c.payload_bytes_max == 0 || c.payload_bytes_max > PAYLOAD_BYTES_LIMIT {
        return Err(Error::invalid(
            "payload_bytes_max",
            format!("must be 1..={PAYLOAD_BYTES_LIMIT} bytes"),
        ));
    }
    if c.batch_events_max == 0 || c.read_events_max == 0 || c.id_bytes_max == 0 {
        return Err(Error::invalid(
            "limits",
            "batch, read and id limits must be at least 1",
        ));
    }
    Ok(())
}

impl Engine {
    /// Opens (creating) the data directory, recovers it and starts the writer.
    ///
    /// # Errors
    /// [`Error::Locked`] if another process has it open; [`Error::Corruption`] naming the
    /// file and offset if a sealed segment is damaged; I/O and index failures.
    pub fn open(config: Config) -> Result<Self> {
        Self::open_with_fs(config, Arc::new(StdFs))
    }

    /// [`Engine::open`] with segment I/O through `fs` (a fault-injecting twin in tests).
    ///
    /// # Errors
    /// As [`Engine::open`].
    pub fn open_with_fs(config: Config, fs: Arc<dyn FileSystem>) -> Result<Self> {
        validate_config(&config)?;
        let rec = recover(&fs, &config.dir)?;
        tracing::info!(dir = %config.dir.display(), report = %rec.report, "recovered data directory");
        let (commits, _) = tokio::sync::watch::channel(rec.next_lsn - 1);
        let shared = Arc::new(Shared {
            config,
            fs,
            index: rec.index,
            segments: rec.segments,
            poisoned: false.into(),
            counters: Counters::default(),
            commits,
            summaries: crate::retention::Summaries::default(),
            poison_signal: tokio::sync::watch::channel(false).0,
        });
        shared
            .counters
            .last_lsn
            .store(rec.next_lsn - 1, Ordering::Release);
        let (tx, rx) = sync_channel::<Request>(WRITER_QUEUE_DEPTH);
        let writer = Writer::new(Arc::clone(&shared), rec.active, rec.next_lsn);
        let writer = std::thread::Builder::new()
            .name("cursorlog-writer".into())
            .spawn(move || writer.run(&rx))
            .map_err(Error::io("starting the writer thread"))?;
        let leases = Arc::new(Leases::default());
        for s in shared.index.streams()? {
            if let (StreamState::Open, Some(ms)) = (s.meta.state, s.meta.lease_ms) {
                // Leases restart from recovery: a producer gets a full lease to reconnect.
                leases.arm(s.meta.id, ms);
            }
        }
        let shutdown = Arc::new(AtomicBool::new(false));
        let background = vec![
            spawn_maintenance(
                Arc::clone(&shared),
                tx.clone(),
                Arc::clone(&leases),
                Arc::clone(&shutdown),
            )?,
            spawn_index_flusher(Arc::clone(&shared), Arc::clone(&shutdown))?,
        ];
        let engine = Self {
            inner: Arc::new(Inner {
                shared,
                tx: RwLock::new(Some(tx)),
                writer: Mutex::new(Some(writer)),
                background: Mutex::new(background),
                shutdown,
                report: rec.report,
                leases,
                _lock: rec.lock,
            }),
        };
        Ok(engine)
    }

    /// Runs one retention pass now (it also runs every `retention.check_interval`); returns
    /// the number of segments retired.
    ///
    /// # Errors
    /// Write or index failures.
    pub fn run_retention(&self) -> Result<usize> {
        let tx = self.sender()?;
        run_retention(&self.inner.shared, &tx)
    }

    fn sender(&self) -> Result<SyncSender<Request>> {
        self.inner
            .tx
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(Error::Closed)
    }

    fn submit(&self, cmd: Command) -> Result<Reply> {
        // Queue under the read lock (no clone of the sender per call), wait without it.
        let reply = {
            let tx = self.inner.tx.read().unwrap_or_else(PoisonError::into_inner);
            send(tx.as_ref().ok_or(Error::Closed)?, &self.inner.shared, cmd)?
        };
        wait(&reply)
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &Config {
        &self.inner.shared.config
    }

    /// What recovery did when this engine opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.report
    }

    fn check_id(&self, field: &'static str, v: &str) -> Result<()> {
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
        self.check_id("session", session)?;
        if let Some(s) = &state {
            self.check_session_state(s)?;
        }
        let cmd = Command::OpenSession {
            session: session.to_owned(),
            state,
        };
        match self.submit(cmd)? {
            Reply::Session(s) => Ok(s),
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
        self.check_id("session", session)?;
        self.check_session_state(&state)?;
        let cmd = Command::SetSessionState {
            session: session.to_owned(),
            state,
        };
        match self.submit(cmd)? {
            Reply::Done => Ok(()),
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
        let index = &self.inner.shared.index;
        let Some(s) = index.stored_session(session)? else {
            return Ok(None);
        };
        Ok(Some(SessionView {
            session: s.meta.id,
            epoch: s.meta.epoch,
            opened_at_ms: s.meta.opened_at_ms,
            expired: s.meta.expired_at_ms.is_some(),
            state: index.session_state(session)?.unwrap_or_default(),
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
        match self.submit(Command::AdvanceEpoch(session.to_owned()))? {
            Reply::Epoch(e) => Ok(e),
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
        match self.submit(Command::ExpireSession(session.to_owned()))? {
            Reply::Expired(e) => Ok(e),
            other => Err(unexpected(&other)),
        }
    }

    /// Opens a stream in the session's current epoch; returns its new, never reused id.
    ///
    /// # Errors
    /// Unknown/expired session; [`Error::StaleEpoch`]; invalid ids; write failures.
    pub fn open_stream(&self, req: OpenStream) -> Result<StreamInfo> {
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
        let lease = req.lease_ms;
        match self.submit(Command::OpenStream(req))? {
            Reply::Stream(s) => {
                if let Some(ms) = lease {
                    self.inner.leases.arm(s.stream, ms);
                }
                Ok(s)
            }
            other => Err(unexpected(&other)),
        }
    }

    fn renew_lease(&self, stream: u64) {
        self.inner.leases.renew(stream);
    }

    /// Appends a batch atomically. With `expected_next_seq`, a retry of a batch already
    /// written returns the same seqs (`duplicate: true`) and a different batch is a conflict.
    ///
    /// # Errors
    /// Bad input (nothing written); unknown stream (or another session's);
    /// [`Error::StreamTerminated`]; [`Error::SeqConflict`]; write failures.
    pub fn append(&self, req: Append) -> Result<Appended> {
        self.check_append(&req)?;
        match self.submit(Command::Append(req))? {
            Reply::Appended(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    /// [`Engine::append`] for async callers: no thread waits for the group commit, the task
    /// does. Dropping the future does not cancel an append that was already queued.
    ///
    /// # Errors
    /// As [`Engine::append`].
    pub async fn append_async(&self, req: Append) -> Result<Appended> {
        self.check_append(&req)?;
        let tx = self.sender()?;
        match submit_async(&tx, &self.inner.shared, Command::Append(req)).await? {
            Reply::Appended(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
    }

    /// Validates `req` and queues it to the writer now; the returned future resolves once it
    /// is durable. Appends queued one after another apply in that order, whenever their
    /// futures are awaited: a caller pipelining appends (many in flight, answered in order)
    /// queues each as it arrives.
    ///
    /// # Errors
    /// Refusals before queuing (bad input, closed, poisoned) at once; the rest, as
    /// [`Engine::append`], from the future.
    pub fn queue_append(
        &self,
        req: Append,
    ) -> Result<impl std::future::Future<Output = Result<Appended>> + Send + 'static> {
        self.check_append(&req)?;
        let tx = self.sender()?;
        let reply = send_async(&tx, &self.inner.shared, Command::Append(req))?;
        Ok(async move {
            match reply.await.map_err(|_| Error::Closed)?? {
                Reply::Appended(a) => Ok(a),
                other => Err(unexpected(&other)),
            }
        })
    }

    /// Checks an append's limits (nothing is written for a refused one) and renews the
    /// stream's producer lease.
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
        self.renew_lease(req.stream);
        Ok(())
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
        self.check_id("session", session)?;
        if let Some(f) = &frame {
            self.check_event(f)?;
        }
        let cmd = Command::Terminate {
            session: Some(session.to_owned()),
            stream,
            state,
            expected_next_seq: expected,
            reason,
            frame,
        };
        match self.submit(cmd)? {
            Reply::Terminated(t) => {
                self.inner.leases.remove(stream);
                Ok(t)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Writes the terminal frame and the `Completed` tombstone as one record.
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
        if reason.len() > self.config().id_bytes_max as usize * 4 {
            return Err(Error::invalid("reason", "is too long"));
        }
        self.terminate(
            session,
            stream,
            StreamState::Aborted,
            None,
            Some(reason.to_owned()),
            terminal,
        )
    }

    /// Renews a stream's producer lease without appending.
    ///
    /// # Errors
    /// Unknown stream; [`Error::StreamTerminated`].
    pub fn keep_alive(&self, session: &str, stream: u64) -> Result<()> {
        let meta = self.owned_stream(session, stream)?;
        if meta.state.is_terminal() {
            return Err(Error::StreamTerminated {
                stream,
                state: meta.state,
                terminal_seq: meta.head,
            });
        }
        self.renew_lease(stream);
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
            Reply::Watermark(w) => Ok(w),
            other => Err(unexpected(&other)),
        }
    }

    /// Counters and sizes.
    ///
    /// # Errors
    /// None in practice; kept fallible for index-backed counts.
    pub fn stats(&self) -> Result<Stats> {
        let s = &self.inner.shared;
        let c = &s.counters;
        Ok(Stats {
            sessions: s.index.count(prefix::SESSION)?,
            streams: s.index.count(prefix::STREAM)?,
            segments: s.segments.count() as u64,
            log_bytes: s.segments.total_bytes(),
            last_lsn: c.last_lsn.load(Ordering::Acquire),
            events_appended: c.events_appended.load(Ordering::Relaxed),
            payload_bytes_appended: c.payload_bytes_appended.load(Ordering::Relaxed),
            fsyncs: c.fsyncs.load(Ordering::Relaxed),
            commit_batches: c.commit_batches.load(Ordering::Relaxed),
            records_written: c.records_written.load(Ordering::Relaxed),
            segments_deleted: c.segments_deleted.load(Ordering::Relaxed),
            recovery_micros: u64::try_from(self.inner.report.elapsed.as_micros())
                .unwrap_or(u64::MAX),
            live_sessions: s
                .index
                .sessions()?
                .iter()
                .filter(|x| x.meta.expired_at_ms.is_none())
                .count() as u64,
            open_streams: s.index.count(prefix::OPEN_STREAM)?,
            poisoned: self.is_poisoned(),
            disk_free_bytes: None,
            appends_refused_low_disk: 0,
            sessions_expired_idle: 0,
        })
    }

    /// Every remembered session (for `cursorlog inspect`).
    ///
    /// # Errors
    /// Index failures.
    pub fn sessions(&self) -> Result<Vec<SessionMeta>> {
        Ok(self
            .inner
            .shared
            .index
            .sessions()?
            .into_iter()
            .map(|s| s.meta)
            .collect())
    }

    /// Every remembered stream (for `cursorlog inspect`).
    ///
    /// # Errors
    /// Index failures.
    pub fn streams(&self) -> Result<Vec<StreamMeta>> {
        Ok(self
            .inner
            .shared
            .index
            .streams()?
            .into_iter()
            .map(|s| s.meta)
            .collect())
    }

    /// Segment files: path, base LSN, bytes.
    pub fn segments(&self) -> Vec<(PathBuf, u64, u64)> {
        self.inner
            .shared
            .segments
            .all()
            .iter()
            .map(|s| (s.path().to_path_buf(), s.base_lsn(), s.len()))
            .collect()
    }

    /// Syncs the log and the index now, whatever the sync policy.
    ///
    /// # Errors
    /// Write failures (which poison the engine).
    pub fn sync(&self) -> Result<()> {
        self.submit(Command::Sync)?;
        self.inner.shared.index.flush()
    }

    /// Drains the writer, syncs, and stops; later calls on any clone fail with `Closed`.
    ///
    /// # Errors
    /// The final sync failed, or the engine was poisoned ([`Error::Poisoned`]): writes were
    /// refused, and the next open must recover the directory. A supervisor should treat
    /// that as a failure (the server exits non-zero).
    pub fn close(&self) -> Result<()> {
        let result = if self.is_poisoned() {
            Err(Error::Poisoned)
        } else {
            self.sync().map(|_| ())
        };
        self.inner.stop_threads();
        result
    }

    /// True once a failed write, fsync or index flush made the engine refuse every write.
    pub fn is_poisoned(&self) -> bool {
        self.inner.shared.poisoned.load(Ordering::Acquire)
    }

    /// A receiver that turns true the moment the engine is poisoned (see
    /// [`Engine::is_poisoned`]): the server flips its health status on it.
    pub fn poison_watch(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.shared.poison_signal.subscribe()
    }

    /// Many independent appends and completions, all queued to the writer before any is
    /// awaited (so they share group commits), each answered on its own: one failing item
    /// never fails another. Items of one stream apply in item order.
    ///
    /// # Errors
    /// Per item, as [`Engine::append`] or [`Engine::complete`].
    pub async fn write_batch_async(&self, items: Vec<BatchWrite>) -> Vec<Result<BatchWritten>> {
        enum Pending {
            Failed(Error),
            Queued {
                reply: tokio::sync::oneshot::Receiver<Result<Reply>>,
                complete: Option<u64>,
            },
        }
        let tx = self.sender();
        let mut pending = Vec::with_capacity(items.len());
        for item in items {
            let queued = match &tx {
                Err(_) => Err(Error::Closed),
                Ok(tx) => match item {
                    BatchWrite::Append(req) => self.check_append(&req).and_then(|()| {
                        send_async(tx, &self.inner.shared, Command::Append(req))
                            .map(|reply| (reply, None))
                    }),
                    BatchWrite::Complete {
                        session,
                        stream,
                        expected_next_seq,
                        terminal,
                    } => self
                        .check_id("session", &session)
                        .and_then(|()| self.check_event(&terminal))
                        .and_then(|()| {
                            let cmd = Command::Terminate {
                                session: Some(session),
                                stream,
                                state: StreamState::Completed,
                                expected_next_seq,
                                reason: None,
                                frame: Some(terminal),
                            };
                            send_async(tx, &self.inner.shared, cmd).map(|r| (r, Some(stream)))
                        }),
                },
            };
            pending.push(match queued {
                Ok((reply, complete)) => Pending::Queued { reply, complete },
                Err(e) => Pending::Failed(e),
            });
        }
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            out.push(match p {
                Pending::Failed(e) => Err(e),
                Pending::Queued { reply, complete } => {
                    match reply.await.map_err(|_| Error::Closed).and_then(|r| r) {
                        Ok(Reply::Appended(a)) => Ok(BatchWritten::Appended(a)),
                        Ok(Reply::Terminated(t)) => {
                            if let Some(stream) = complete {
                                self.inner.leases.remove(stream);
                            }
                            Ok(BatchWritten::Completed(t))
                        }
                        Ok(other) => Err(unexpected(&other)),
                        Err(e) => Err(e),
                    }
                }
            });
        }
        out
    }

    /// The whole index, for tests that compare a rebuilt index with the live one.
    ///
    /// # Errors
    /// Index failures.
    #[doc(hidden)]
    pub fn index_dump(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.shared.index.dump()
    }
}

fn unexpected(reply: &Reply) -> Error {
    Error::Internal(format!("unexpected writer reply {reply:?}"))
}
