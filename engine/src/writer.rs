//! The single writer: validates requests against current state, frames their records,
//! writes each group commit once, syncs per the policy, applies the index, then acknowledges.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::{
    Append, Appended, EpochAdvanced, NewEvent, OpenStream, SessionExpired, SessionInfo, StreamInfo,
    Terminated,
};
use crate::apply::{apply, remove_positions};
use crate::config::{Config, SyncPolicy};
use crate::cursor::Cursor;
use crate::error::{Error, Result};
use crate::index::{
    open_stream_key, outcome_key, parse_origin_key, terminal_frame_key, Index, KvRead, Txn,
    ORIGIN_SESSION, ORIGIN_STREAM,
};
use crate::log::{Position, SegmentSet};
use crate::record::{encode_frame, EventBody, Record, StreamOpened, StreamSnapshot, Terminal};
use crate::segment::Segment;
use crate::state::{StreamMeta, StreamState};
use crate::verdict::past_horizon;

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A request to the writer.
#[derive(Debug)]
pub(crate) enum Command {
    OpenSession(String),
    AdvanceEpoch(String),
    ExpireSession(String),
    OpenStream(OpenStream),
    Append(Append),
    Terminate {
        session: Option<String>,
        stream: u64,
        state: StreamState,
        expected_next_seq: Option<u64>,
        reason: Option<String>,
        frame: Option<NewEvent>,
    },
    Trim {
        session: Option<String>,
        stream: u64,
        watermark: u64,
    },
    /// Carry forward (or forget, past the horizon) state born below `below_lsn`, then retire
    /// every segment whose records all lie below it.
    Retire {
        below_lsn: u64,
        bases: Vec<u64>,
    },
    Sync,
}

/// The writer's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    Session(SessionInfo),
    Epoch(EpochAdvanced),
    Expired(SessionExpired),
    Stream(StreamInfo),
    Appended(Appended),
    Terminated(Terminated),
    Watermark(u64),
    Done,
}

pub(crate) type Request = (Command, SyncSender<Result<Reply>>);

/// Counters the writer keeps for stats.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub events_appended: AtomicU64,
    pub payload_bytes_appended: AtomicU64,
    pub fsyncs: AtomicU64,
    pub commit_batches: AtomicU64,
    pub records_written: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub last_lsn: AtomicU64,
}

/// State shared between the writer thread and the engine handle.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: Config,
    pub fs: Arc<dyn crate::fs::FileSystem>,
    pub index: Index,
    pub segments: SegmentSet,
    pub poisoned: AtomicBool,
    pub counters: Counters,
    pub commits: tokio::sync::watch::Sender<u64>,
}

/// The writer thread's own state.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    active: Arc<Segment>,
    next_lsn: u64,
    last_sync: Instant,
    unsynced: bool,
}

/// Records planned for one request, framed and ready.
struct Planned {
    frames: Vec<(u64, Position, Record)>,
}

impl Writer {
    pub(crate) fn new(shared: Arc<Shared>, active: Arc<Segment>, next_lsn: u64) -> Self {
        Self {
            shared,
            active,
            next_lsn,
            last_sync: Instant::now(),
            unsynced: false,
        }
    }

    /// Runs until every sender is gone, then syncs.
    pub(crate) fn run(mut self, rx: &Receiver<Request>) {
        let tick = match self.shared.config.sync {
            SyncPolicy::Interval(ms) => Duration::from_millis(ms.max(1)),
            _ => Duration::from_secs(3600),
        };
        loop {
            let first = match rx.recv_timeout(tick) {
                Ok(r) => r,
                Err(RecvTimeoutError::Timeout) => {
                    self.sync_if_due(true);
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let mut batch = vec![first];
            while batch.len() < 4096 {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            self.commit(batch);
        }
        if !self.shared.poisoned.load(Ordering::Acquire) {
            if let Err(e) = self
                .active
                .sync_data()
                .and_then(|()| self.shared.index.flush())
            {
                tracing::error!(error = %e, "final sync on close failed");
            }
        }
    }

    fn poison(&self, e: &Error) {
        tracing::error!(error = %e, "write path failed; engine poisoned until reopened");
        self.shared.poisoned.store(true, Ordering::Release);
    }

    fn sync_if_due(&mut self, force_interval: bool) {
        if !self.unsynced || self.shared.poisoned.load(Ordering::Acquire) {
            return;
        }
        let due = match self.shared.config.sync {
            SyncPolicy::Interval(ms) => {
                force_interval || self.last_sync.elapsed() >= Duration::from_millis(ms)
            }
            _ => false,
        };
        if due {
            if let Err(e) = self.sync_now() {
                self.poison(&e);
            }
        }
    }

    fn sync_now(&mut self) -> Result<()> {
        self.active.sync_data()?;
        self.shared.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.last_sync = Instant::now();
        self.unsynced = false;
        Ok(())
    }

    fn rotate_if_full(&mut self) -> Result<()> {
        if self.active.len() < self.shared.config.segment_bytes_max {
            return Ok(());
        }
        self.active.seal()?;
        let next = Arc::new(Segment::create(
            Arc::clone(&self.shared.fs),
            &self.shared.config.dir,
            self.next_lsn,
        )?);
        self.shared.segments.insert(Arc::clone(&next));
        self.active = next;
        self.unsynced = false;
        tracing::debug!(base_lsn = self.next_lsn, "rolled to a new segment");
        Ok(())
    }

    fn commit(&mut self, batch: Vec<Request>) {
        if self.shared.poisoned.load(Ordering::Acquire) {
            for (_, tx) in batch {
                let _ = tx.send(Err(Error::Poisoned));
            }
            return;
        }
        if let Err(e) = self.rotate_if_full() {
            self.poison(&e);
            for (_, tx) in batch {
                let _ = tx.send(Err(Error::Poisoned));
            }
            return;
        }
        let index = self.shared.index.clone();
        let mut txn = Txn::new(&index);
        let mut buf = Vec::new();
        let mut acks = Vec::with_capacity(batch.len());
        let mut retire = Vec::new();
        let mut force_sync = false;
        let first_lsn = self.next_lsn;
        for (cmd, tx) in batch {
            if let Command::Retire { bases, .. } = &cmd {
                retire.extend_from_slice(bases);
            }
            force_sync |= matches!(cmd, Command::Sync | Command::Retire { .. });
            match self.plan(cmd, &mut txn, &mut buf) {
                Ok(reply) => acks.push((tx, reply)),
                Err(e @ Error::Index(_)) => {
                    // The overlay may be half-applied: fail the whole batch.
                    self.poison(&e);
                    let _ = tx.send(Err(e));
                    for (tx, _) in acks {
                        let _ = tx.send(Err(Error::Poisoned));
                    }
                    return;
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        }
        if let Err(e) = self.write_and_sync(&buf, force_sync) {
            self.poison(&e);
            for (tx, _) in acks {
                let _ = tx.send(Err(Error::Poisoned));
            }
            return;
        }
        let last_lsn = self.next_lsn - 1;
        let applied = if txn.is_empty() && first_lsn == self.next_lsn {
            Ok(())
        } else {
            index.commit(txn, last_lsn)
        };
        let retired = applied.and_then(|()| {
            if retire.is_empty() {
                return Ok(());
            }
            // The carried-forward state must be durable in sled before the files go: then a
            // restart never needs a record that is gone.
            index.flush()?;
            let paths = self.shared.segments.retire(&retire);
            self.shared
                .counters
                .segments_deleted
                .fetch_add(paths.len() as u64, Ordering::Relaxed);
            tracing::info!(
                segments = paths.len(),
                "retired segments below the retention watermarks"
            );
            Ok(())
        });
        if let Err(e) = retired {
            self.poison(&e);
            for (tx, _) in acks {
                let _ = tx.send(Err(Error::Poisoned));
            }
            return;
        }
        let c = &self.shared.counters;
        c.commit_batches.fetch_add(1, Ordering::Relaxed);
        c.records_written
            .fetch_add(self.next_lsn - first_lsn, Ordering::Relaxed);
        c.last_lsn.store(last_lsn, Ordering::Release);
        self.shared.commits.send_replace(last_lsn);
        for (tx, reply) in acks {
            let _ = tx.send(Ok(reply));
        }
    }

    fn write_and_sync(&mut self, buf: &[u8], force: bool) -> Result<()> {
        if !buf.is_empty() {
            self.active.append(buf)?;
            self.unsynced = true;
        }
        match self.shared.config.sync {
            SyncPolicy::Always if self.unsynced => self.sync_now(),
            _ if force && self.unsynced => self.sync_now(),
            _ => {
                self.sync_if_due(false);
                Ok(())
            }
        }
    }

    /// Frames `records` as one atomic group and applies them to the overlay.
    fn emit(&mut self, records: Vec<Record>, txn: &mut Txn<'_>, buf: &mut Vec<u8>) -> Result<()> {
        let mut planned = Planned {
            frames: Vec::with_capacity(records.len()),
        };
        let mut local = Vec::new();
        let base_offset = self.active.len() + buf.len() as u64;
        let count = records.len();
        for (i, record) in records.into_iter().enumerate() {
            let lsn = self.next_lsn + i as u64;
            let group_left = u32::try_from(count - 1 - i).unwrap_or(u32::MAX);
            let offset = base_offset + local.len() as u64;
            let len = encode_frame(&record, lsn, group_left, &mut local)
                .map_err(|e| Error::invalid("event", e))?;
            let pos = Position {
                segment: self.active.base_lsn(),
                offset,
                len,
            };
            planned.frames.push((lsn, pos, record));
        }
        for (lsn, pos, record) in &planned.frames {
            apply(txn, *lsn, *pos, record)?;
        }
        self.next_lsn += count as u64;
        buf.extend_from_slice(&local);
        Ok(())
    }

    fn plan(&mut self, cmd: Command, txn: &mut Txn<'_>, buf: &mut Vec<u8>) -> Result<Reply> {
        let now = now_ms();
        match cmd {
            Command::Sync => Ok(Reply::Done),
            Command::OpenSession(session) => match txn.stored_session(&session)? {
                Some(s) if s.meta.expired_at_ms.is_some() => Err(Error::SessionExpired),
                Some(s) => Ok(Reply::Session(SessionInfo {
                    session,
                    epoch: s.meta.epoch,
                    created: false,
                })),
                None => {
                    let rec = Record::SessionOpened {
                        session: session.clone(),
                        epoch: 1,
                        at_ms: now,
                    };
                    self.emit(vec![rec], txn, buf)?;
                    Ok(Reply::Session(SessionInfo {
                        session,
                        epoch: 1,
                        created: true,
                    }))
                }
            },
            Command::AdvanceEpoch(session) => {
                let s = live_session(txn, &session)?;
                let epoch = s
                    .epoch
                    .checked_add(1)
                    .ok_or_else(|| Error::invalid("session", "epoch exhausted"))?;
                let superseded = txn.open_streams(&session)?;
                let mut records = vec![Record::EpochAdvanced {
                    session,
                    epoch,
                    at_ms: now,
                }];
                for stream in &superseded {
                    records.push(self.tombstone(
                        txn,
                        *stream,
                        StreamState::Superseded,
                        Some("epoch advanced".into()),
                        None,
                        now,
                    )?);
                }
                self.emit(records, txn, buf)?;
                Ok(Reply::Epoch(EpochAdvanced { epoch, superseded }))
            }
            Command::ExpireSession(session) => {
                live_session(txn, &session)?;
                let aborted = txn.open_streams(&session)?;
                let mut records = vec![Record::SessionExpired {
                    session,
                    at_ms: now,
                }];
                for stream in &aborted {
                    records.push(self.tombstone(
                        txn,
                        *stream,
                        StreamState::Aborted,
                        Some("session expired".into()),
                        None,
                        now,
                    )?);
                }
                self.emit(records, txn, buf)?;
                Ok(Reply::Expired(SessionExpired { aborted }))
            }
            Command::OpenStream(req) => {
                let s = live_session(txn, &req.session)?;
                if req.epoch != s.epoch {
                    return Err(Error::StaleEpoch {
                        given: req.epoch,
                        current: s.epoch,
                    });
                }
                let stream = self.next_lsn;
                let rec = Record::StreamOpened(StreamOpened {
                    stream,
                    session: req.session,
                    epoch: s.epoch,
                    correlation: req.correlation,
                    lease_ms: req.lease_ms,
                    at_ms: now,
                });
                self.emit(vec![rec], txn, buf)?;
                Ok(Reply::Stream(StreamInfo {
                    stream,
                    epoch: s.epoch,
                }))
            }
            Command::Append(req) => self.plan_append(req, txn, buf, now),
            Command::Terminate {
                session,
                stream,
                state,
                expected_next_seq,
                reason,
                frame,
            } => {
                let meta = owned_stream(txn, session.as_deref(), stream)?;
                if meta.state.is_terminal() {
                    return Err(terminated(&meta));
                }
                if let Some(expected) = expected_next_seq {
                    if expected != meta.head + 1 {
                        return Err(Error::SeqConflict {
                            stream,
                            expected,
                            head: meta.head,
                            reason: "a terminal frame must follow the head",
                        });
                    }
                }
                let rec = self.tombstone(txn, stream, state, reason, frame, now)?;
                let Record::Terminal(t) = &rec else {
                    unreachable!("tombstone builds a terminal record")
                };
                let reply = Terminated {
                    stream,
                    state,
                    terminal_seq: t.terminal_seq,
                    cursor: Cursor::new(meta.epoch, stream, t.terminal_seq),
                };
                self.emit(vec![rec], txn, buf)?;
                Ok(Reply::Terminated(reply))
            }
            Command::Trim {
                session,
                stream,
                watermark,
            } => {
                let meta = owned_stream(txn, session.as_deref(), stream)?;
                let target = watermark.min(meta.head + 1);
                if target <= meta.watermark {
                    return Ok(Reply::Watermark(meta.watermark));
                }
                self.emit(
                    vec![Record::Trim {
                        stream,
                        watermark: target,
                        at_ms: now,
                    }],
                    txn,
                    buf,
                )?;
                Ok(Reply::Watermark(target))
            }
            Command::Retire { below_lsn, .. } => {
                let records = self.carry_forward(txn, below_lsn, now)?;
                if !records.is_empty() {
                    self.emit(records, txn, buf)?;
                }
                Ok(Reply::Done)
            }
        }
    }

    fn plan_append(
        &mut self,
        req: Append,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
        now: u64,
    ) -> Result<Reply> {
        let cfg = &self.shared.config;
        let meta = owned_stream(txn, Some(&req.session), req.stream)?;
        if meta.state.is_terminal() {
            return Err(terminated(&meta));
        }
        let count = req.events.len() as u64;
        let next = meta.head + 1;
        if let Some(expected) = req.expected_next_seq {
            if expected < next {
                return self.match_retry(&req, &meta, expected);
            }
            if expected > next {
                return Err(Error::SeqConflict {
                    stream: req.stream,
                    expected,
                    head: meta.head,
                    reason: "the expected seq is beyond the head (a gap)",
                });
            }
        }
        let first_seq = next;
        let mut records: Vec<Record> = req
            .events
            .into_iter()
            .enumerate()
            .map(|(i, e)| Record::Event(body(req.stream, first_seq + i as u64, now, e)))
            .collect();
        let last_seq = first_seq + count - 1;
        if let Some(max) = cfg.retention.max_events_per_stream {
            let keep_from = (last_seq + 1).saturating_sub(max.max(1));
            if keep_from > meta.watermark {
                records.push(Record::Trim {
                    stream: req.stream,
                    watermark: keep_from,
                    at_ms: now,
                });
            }
        }
        let payload: u64 = records
            .iter()
            .map(|r| {
                if let Record::Event(e) = r {
                    e.payload.len() as u64
                } else {
                    0
                }
            })
            .sum();
        self.emit(records, txn, buf)?;
        let c = &self.shared.counters;
        c.events_appended.fetch_add(count, Ordering::Relaxed);
        c.payload_bytes_appended
            .fetch_add(payload, Ordering::Relaxed);
        Ok(Reply::Appended(Appended {
            epoch: meta.epoch,
            stream: req.stream,
            first_seq,
            last_seq,
            duplicate: false,
        }))
    }

    /// An append whose expected seq is already written: success if it is the same batch.
    fn match_retry(&self, req: &Append, meta: &StreamMeta, expected: u64) -> Result<Reply> {
        let count = req.events.len() as u64;
        let conflict = |reason| Error::SeqConflict {
            stream: req.stream,
            expected,
            head: meta.head,
            reason,
        };
        if expected + count - 1 > meta.head {
            return Err(conflict(
                "the batch overlaps the head: it is not a retry of a written batch",
            ));
        }
        if expected < meta.watermark {
            return Err(Error::Evicted {
                stream: req.stream,
                seq: expected,
                watermark: meta.watermark,
            });
        }
        for (i, e) in req.events.iter().enumerate() {
            let seq = expected + i as u64;
            let stored = crate::engine::read_event(&self.shared, req.stream, seq)?;
            let same = stored.as_ref().is_some_and(|s| {
                s.payload == e.payload && s.kind == e.kind && s.correlation == e.correlation
            });
            if !same {
                return Err(conflict(
                    "a retry carried different events than the batch written at that seq",
                ));
            }
        }
        Ok(Reply::Appended(Appended {
            epoch: meta.epoch,
            stream: req.stream,
            first_seq: expected,
            last_seq: expected + count - 1,
            duplicate: true,
        }))
    }

    fn tombstone(
        &self,
        txn: &Txn<'_>,
        stream: u64,
        state: StreamState,
        reason: Option<String>,
        frame: Option<NewEvent>,
        now: u64,
    ) -> Result<Record> {
        let meta = txn
            .stored_stream(stream)?
            .ok_or(Error::UnknownStream(stream))?
            .meta;
        let terminal_seq = meta.head + u64::from(frame.is_some());
        Ok(Record::Terminal(Terminal {
            stream,
            state,
            terminal_seq,
            at_ms: now,
            reason,
            frame: frame.map(|f| body(stream, terminal_seq, now, f)),
        }))
    }

    /// Snapshot records for state born below `below_lsn` that is still remembered; state past
    /// the metadata horizon is forgotten instead.
    fn carry_forward(&self, txn: &mut Txn<'_>, below_lsn: u64, now: u64) -> Result<Vec<Record>> {
        let horizon = duration_ms(self.shared.config.retention.metadata_horizon);
        let mut records = Vec::new();
        for key in self.shared.index.origins_below(below_lsn)? {
            let Some((_, kind, id)) = parse_origin_key(&key) else {
                continue;
            };
            match kind {
                ORIGIN_SESSION => {
                    let Ok(id) = std::str::from_utf8(id) else {
                        continue;
                    };
                    let Some(s) = txn.stored_session(id)? else {
                        continue;
                    };
                    if past_horizon(s.meta.expired_at_ms, now, horizon) {
                        txn.remove_raw(crate::index::session_key(id));
                        txn.remove_raw(key);
                    } else {
                        records.push(Record::SessionSnapshot(s.meta));
                    }
                }
                ORIGIN_STREAM => {
                    let Some(id) = id.try_into().ok().map(u64::from_be_bytes) else {
                        continue;
                    };
                    let Some(s) = txn.stored_stream(id)? else {
                        continue;
                    };
                    let m = s.meta;
                    if past_horizon(m.ended_at_ms, now, horizon) {
                        txn.remove_raw(crate::index::stream_key(id).to_vec());
                        txn.remove_raw(terminal_frame_key(id).to_vec());
                        txn.remove_raw(open_stream_key(&m.session, id));
                        if let Some(c) = &m.correlation {
                            if txn.outcome_stream(&m.session, c)? == Some(id) {
                                txn.remove_raw(outcome_key(&m.session, c));
                            }
                        }
                        remove_positions(txn, id, 0, u64::MAX)?;
                        txn.remove_raw(key);
                    } else {
                        let terminal_frame = txn.terminal_frame(id)?;
                        records.push(Record::StreamSnapshot(StreamSnapshot {
                            meta: m,
                            terminal_frame,
                        }));
                    }
                }
                _ => {}
            }
        }
        Ok(records)
    }
}

pub(crate) fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn body(stream: u64, seq: u64, at_ms: u64, e: NewEvent) -> EventBody {
    EventBody {
        stream,
        seq,
        at_ms,
        kind: e.kind,
        correlation: e.correlation,
        payload: e.payload,
    }
}

fn terminated(meta: &StreamMeta) -> Error {
    Error::StreamTerminated {
        stream: meta.id,
        state: meta.state,
        terminal_seq: meta.head,
    }
}

fn live_session(txn: &Txn<'_>, session: &str) -> Result<crate::state::SessionMeta> {
    match txn.stored_session(session)? {
        None => Err(Error::UnknownSession),
        Some(s) if s.meta.expired_at_ms.is_some() => Err(Error::SessionExpired),
        Some(s) => Ok(s.meta),
    }
}

/// The stream, checked to belong to `session` when one is given (internal callers such as
/// retention and the lease reaper pass none).
fn owned_stream(txn: &Txn<'_>, session: Option<&str>, stream: u64) -> Result<StreamMeta> {
    match txn.stored_stream(stream)? {
        Some(s) if session.is_none_or(|sess| sess == s.meta.session) => Ok(s.meta),
        _ => Err(Error::UnknownStream(stream)),
    }
}
