//! The `Engine` handle: opens the directory, runs the writer, answers reads and verdicts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::api::{
    Append, Appended, EpochAdvanced, Event, NewEvent, OpenStream, Outcome, ReadBatch,
    SessionExpired, SessionInfo, Stats, StreamInfo, Terminated,
};
use crate::config::Config;
use crate::error::{CorruptionKind, Error, Result};
use crate::format::{PAYLOAD_BYTES_LIMIT, SEGMENT_BYTES_MIN};
use crate::fs::{FileSystem, StdFs};
use crate::index::{prefix, KvRead};
use crate::record::{decode_frame, Record};
use crate::recovery::{recover, RecoveryReport};
use crate::state::{SessionMeta, StreamMeta, StreamState};
use crate::verdict::{decide, past_horizon, Resolution};
use crate::writer::{duration_ms, now_ms, Command, Counters, Reply, Request, Shared, Writer};

/// Depth of the writer's request queue; appenders block beyond it (back-pressure).
const WRITER_QUEUE_DEPTH: usize = 16 * 1024;
/// How often producer leases are checked.
const LEASE_TICK: Duration = Duration::from_millis(50);

/// A handle to an open data directory. Cheap to clone; every clone talks to one writer.
///
/// # Invariants
/// Exactly one writer thread appends to the log; reads never take its lock. A write or
/// fsync failure poisons the engine: every later write fails with [`Error::Poisoned`].
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    tx: Mutex<Option<SyncSender<Request>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    report: RecoveryReport,
    leases: Mutex<HashMap<u64, (Duration, Instant)>>,
    _lock: std::fs::File,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        for t in self
            .threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            let _ = t.join();
        }
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
        let mut leases = HashMap::new();
        let now = Instant::now();
        for s in shared.index.streams()? {
            if let (StreamState::Open, Some(ms)) = (s.meta.state, s.meta.lease_ms) {
                // Leases restart from recovery: a producer gets a full lease to reconnect.
                leases.insert(
                    s.meta.id,
                    (Duration::from_millis(ms), now + Duration::from_millis(ms)),
                );
            }
        }
        let engine = Self {
            inner: Arc::new(Inner {
                shared,
                tx: Mutex::new(Some(tx)),
                threads: Mutex::new(vec![writer]),
                report: rec.report,
                leases: Mutex::new(leases),
                _lock: rec.lock,
            }),
        };
        engine.start_background()?;
        Ok(engine)
    }

    fn start_background(&self) -> Result<()> {
        let weak = Arc::downgrade(&self.inner);
        let interval = self.inner.shared.config.retention.check_interval;
        let handle = std::thread::Builder::new()
            .name("cursorlog-background".into())
            .spawn(move || {
                let mut last_retention = Instant::now();
                loop {
                    std::thread::sleep(LEASE_TICK);
                    let Some(inner) = weak.upgrade() else { return };
                    let engine = Self { inner };
                    if engine
                        .inner
                        .tx
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .is_none()
                    {
                        return;
                    }
                    engine.expire_leases();
                    if last_retention.elapsed() >= interval {
                        last_retention = Instant::now();
                        if let Err(e) = engine.run_retention() {
                            tracing::warn!(error = %e, "retention pass failed; will retry");
                        }
                    }
                }
            })
            .map_err(Error::io("starting the background thread"))?;
        self.inner
            .threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(handle);
        Ok(())
    }

    fn expire_leases(&self) {
        let now = Instant::now();
        let expired: Vec<u64> = {
            let mut leases = self
                .inner
                .leases
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let ids: Vec<u64> = leases
                .iter()
                .filter(|(_, (_, at))| *at <= now)
                .map(|(id, _)| *id)
                .collect();
            for id in &ids {
                leases.remove(id);
            }
            ids
        };
        for stream in expired {
            let cmd = Command::Terminate {
                session: None,
                stream,
                state: StreamState::Aborted,
                expected_next_seq: None,
                reason: Some("producer lease expired".into()),
                frame: None,
            };
            match self.submit(cmd) {
                Ok(_) => tracing::info!(stream, "aborted stream: producer lease expired"),
                Err(Error::StreamTerminated { .. }) => {}
                Err(e) => tracing::warn!(stream, error = %e, "could not abort expired lease"),
            }
        }
    }

    /// Runs one retention pass now (it also runs every `retention.check_interval`); returns
    /// the number of segments retired.
    ///
    /// # Errors
    /// Write or index failures.
    pub fn run_retention(&self) -> Result<usize> {
        crate::retention::run_pass(&self.inner.shared, &|cmd| self.submit(cmd).map(|_| ()))
    }

    fn submit(&self, cmd: Command) -> Result<Reply> {
        if self.inner.shared.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        let tx = self
            .inner
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(Error::Closed)?;
        let (reply_tx, reply_rx) = sync_channel(1);
        tx.send((cmd, reply_tx)).map_err(|_| Error::Closed)?;
        reply_rx.recv().map_err(|_| Error::Closed)?
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
        self.check_id("session", session)?;
        match self.submit(Command::OpenSession(session.to_owned()))? {
            Reply::Session(s) => Ok(s),
            other => Err(unexpected(&other)),
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
                    let d = Duration::from_millis(ms);
                    self.inner
                        .leases
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(s.stream, (d, Instant::now() + d));
                }
                Ok(s)
            }
            other => Err(unexpected(&other)),
        }
    }

    fn renew_lease(&self, stream: u64) {
        let mut leases = self
            .inner
            .leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((d, at)) = leases.get_mut(&stream) {
            *at = Instant::now() + *d;
        }
    }

    /// Appends a batch atomically. With `expected_next_seq`, a retry of a batch already
    /// written returns the same seqs (`duplicate: true`) and a different batch is a conflict.
    ///
    /// # Errors
    /// Bad input (nothing written); unknown stream (or another session's);
    /// [`Error::StreamTerminated`]; [`Error::SeqConflict`]; write failures.
    pub fn append(&self, req: Append) -> Result<Appended> {
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
        let stream = req.stream;
        self.renew_lease(stream);
        match self.submit(Command::Append(req))? {
            Reply::Appended(a) => Ok(a),
            other => Err(unexpected(&other)),
        }
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
                self.inner
                    .leases
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&stream);
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

    fn horizon_ms(&self) -> u64 {
        duration_ms(self.config().retention.metadata_horizon)
    }

    /// The verdict for `cursor` presented in `session` (see [`crate::Verdict`]).
    ///
    /// # Errors
    /// Only index failures; every answer about the cursor is a verdict.
    pub fn resolve(
        &self,
        session: &str,
        cursor: &str,
        declared_stream: Option<u64>,
    ) -> Result<Resolution> {
        decide(
            &self.inner.shared.index,
            session,
            cursor,
            declared_stream,
            now_ms(),
            self.horizon_ms(),
        )
    }

    fn owned_stream(&self, session: &str, stream: u64) -> Result<StreamMeta> {
        let now = now_ms();
        match self.inner.shared.index.stored_stream(stream)? {
            Some(s)
                if s.meta.session == session
                    && !past_horizon(s.meta.ended_at_ms, now, self.horizon_ms()) =>
            {
                Ok(s.meta)
            }
            _ => Err(Error::UnknownStream(stream)),
        }
    }

    /// Up to `max_events` events strictly after `after_seq`, gap-free.
    ///
    /// # Errors
    /// Unknown stream (or another session's); [`Error::Evicted`] if the next event is below
    /// the watermark; corruption of the stored frames.
    pub fn read(
        &self,
        session: &str,
        stream: u64,
        after_seq: u64,
        max_events: u32,
    ) -> Result<ReadBatch> {
        let meta = self.owned_stream(session, stream)?;
        let from = after_seq.saturating_add(1);
        if from < meta.watermark {
            return Err(Error::Evicted {
                stream,
                seq: from,
                watermark: meta.watermark,
            });
        }
        let max = max_events.clamp(1, self.config().read_events_max) as usize;
        let positions = self.inner.shared.index.positions_from(stream, from, max)?;
        let mut events = Vec::with_capacity(positions.len());
        for (i, (seq, pos)) in positions.into_iter().enumerate() {
            if seq != from + i as u64 || seq > meta.head {
                break;
            }
            events.push(read_at(&self.inner.shared, stream, seq, pos)?);
        }
        let last = events.last().map_or(after_seq, |e| e.seq);
        let end_of_stream = meta.state.is_terminal() && last >= meta.head;
        Ok(ReadBatch {
            events,
            head: meta.head,
            state: meta.state,
            end_of_stream,
        })
    }

    /// A live reader of `stream` after `after_seq`, woken by commits of any appender.
    ///
    /// # Errors
    /// As [`Engine::read`] for the first position.
    pub fn follow(&self, session: &str, stream: u64, after_seq: u64) -> Result<Follower> {
        let meta = self.owned_stream(session, stream)?;
        if after_seq.saturating_add(1) < meta.watermark {
            return Err(Error::Evicted {
                stream,
                seq: after_seq + 1,
                watermark: meta.watermark,
            });
        }
        Ok(Follower {
            engine: self.clone(),
            session: session.to_owned(),
            stream,
            after: after_seq,
            done: false,
            commits: self.inner.shared.commits.subscribe(),
        })
    }

    /// The outcome of the stream answering `correlation` in `session`.
    ///
    /// # Errors
    /// Index failures.
    pub fn outcome(&self, session: &str, correlation: &str) -> Result<Option<Outcome>> {
        let index = &self.inner.shared.index;
        let Some(stream) = index.outcome_stream(session, correlation)? else {
            return Ok(None);
        };
        let Ok(meta) = self.owned_stream(session, stream) else {
            return Ok(None);
        };
        let frame = if meta.has_terminal_frame {
            index.terminal_frame(stream)?.map(|b| Event {
                stream,
                seq: b.seq,
                kind: b.kind,
                correlation: b.correlation,
                payload: b.payload,
                appended_at_ms: b.at_ms,
            })
        } else {
            None
        };
        Ok(Some(Outcome {
            stream,
            epoch: meta.epoch,
            state: meta.state,
            terminal_seq: meta.terminal_seq(),
            frame,
            reason: meta.end_reason,
        }))
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
            sessions: s.index.count(prefix::SESSION),
            streams: s.index.count(prefix::STREAM),
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
    /// The final sync failed.
    pub fn close(&self) -> Result<()> {
        let result = if self.inner.shared.poisoned.load(Ordering::Acquire) {
            Ok(())
        } else {
            self.sync().map(|_| ())
        };
        self.inner
            .tx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let threads: Vec<_> = self
            .inner
            .threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        result
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
    Error::invalid(
        "request",
        format!("internal: unexpected writer reply {reply:?}"),
    )
}

/// Reads and checks the stored event `seq` of `stream` at `pos`.
fn read_at(shared: &Shared, stream: u64, seq: u64, pos: crate::log::Position) -> Result<Event> {
    let seg = shared.segments.get(pos.segment).ok_or(Error::Evicted {
        stream,
        seq,
        watermark: seq + 1,
    })?;
    let decoded = seg.with_bytes(pos.offset, u64::from(pos.len), decode_frame)?;
    let corrupt = |kind| Error::Corruption {
        segment: seg.path().to_path_buf(),
        offset: pos.offset,
        kind,
    };
    let frame = decoded.map_err(|e| {
        corrupt(match e {
            crate::record::FrameError::Crc { got, expected } => {
                CorruptionKind::Crc { got, expected }
            }
            crate::record::FrameError::BadBody(b) => CorruptionKind::BadBody(b),
            crate::record::FrameError::BadLength(n) => CorruptionKind::BadLength(n),
            crate::record::FrameError::Truncated => CorruptionKind::BadLength(u64::from(pos.len)),
        })
    })?;
    let body = match frame.record {
        Record::Event(b) => b,
        Record::Terminal(t) => t.frame.ok_or_else(|| {
            corrupt(CorruptionKind::BadBody(
                "terminal record without a frame".into(),
            ))
        })?,
        _ => {
            return Err(corrupt(CorruptionKind::BadBody(
                "index points at a non-event record".into(),
            )))
        }
    };
    if body.stream != stream || body.seq != seq {
        return Err(corrupt(CorruptionKind::BadBody(format!(
            "index points at {}/{} for {stream}/{seq}",
            body.stream, body.seq
        ))));
    }
    Ok(Event {
        stream,
        seq,
        kind: body.kind,
        correlation: body.correlation,
        payload: body.payload,
        appended_at_ms: body.at_ms,
    })
}

/// Reads one committed event, `None` if it has no index entry.
pub(crate) fn read_event(shared: &Shared, stream: u64, seq: u64) -> Result<Option<Event>> {
    match shared.index.position(stream, seq)? {
        Some(pos) => read_at(shared, stream, seq, pos).map(Some),
        None => Ok(None),
    }
}

/// A live reader of one stream; yields batches until the terminal seq has been delivered.
#[derive(Debug)]
pub struct Follower {
    engine: Engine,
    session: String,
    stream: u64,
    after: u64,
    done: bool,
    commits: tokio::sync::watch::Receiver<u64>,
}

impl Follower {
    /// The next batch after what was delivered, waiting for a commit if there is none yet.
    /// `Ok(None)` once the stream's terminal seq has been delivered.
    ///
    /// # Errors
    /// As [`Engine::read`]; [`Error::Closed`] if the engine closes.
    pub async fn next_batch(&mut self, max_events: u32) -> Result<Option<Vec<Event>>> {
        loop {
            if self.done {
                return Ok(None);
            }
            self.commits.borrow_and_update();
            let batch = self
                .engine
                .read(&self.session, self.stream, self.after, max_events)?;
            self.done = batch.end_of_stream;
            if let Some(last) = batch.events.last() {
                self.after = last.seq;
                return Ok(Some(batch.events));
            }
            if self.done {
                return Ok(None);
            }
            self.commits.changed().await.map_err(|_| Error::Closed)?;
        }
    }

    /// The seq of the last event delivered.
    pub fn position(&self) -> u64 {
        self.after
    }
}
