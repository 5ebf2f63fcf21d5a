//! Planning: validates one request against the current state (the committed index plus
//! what earlier requests of the same group commit changed) and turns it into records.
//! Terminal tombstones are enforced here: nothing is appended to a terminated stream.

use super::Writer;
use crate::api::{
    Append, Appended, EpochAdvanced, NewEvent, SessionExpired, SessionInfo, StreamInfo, Terminated,
};
use crate::cursor::Cursor;
use crate::error::{Error, LiveLimit, Result};
use crate::format::FRAME_HEADER_BYTES;
use crate::index::{origin_key, KvRead, Txn};
use crate::mailbox::{Command, Reply, TaskCommand};
use crate::record::{
    check_frame, decode_event_view, EventBody, EventView, Record, SessionStateBody, StreamOpened,
    Terminal,
};
use crate::state::{StreamMeta, StreamState};
use std::sync::atomic::Ordering;

mod live;
mod task;
mod task_end;
mod task_queue;
use live::named_session;

impl Writer {
    pub(super) fn plan(
        &mut self,
        cmd: Command,
        txn: &mut Txn<'_>,
        buf: &mut Vec<u8>,
    ) -> Result<Reply> {
        let now = self.shared.now_ms();
        if cmd_needs_space(&cmd) && self.shared.low_disk.load(Ordering::Acquire) {
            self.shared
                .counters
                .appends_refused_low_disk
                .fetch_add(1, Ordering::Relaxed);
            return Err(Error::DiskFull {
                free_bytes: self.shared.counters.disk_free_bytes.load(Ordering::Acquire),
                reserve_bytes: self.shared.config.disk_reserve_bytes,
            });
        }
        if let Some(session) = named_session(&cmd) {
            // The call renews its session now, not only once answered: an idle expiry the
            // background scan decided before it and planned after it must see it.
            self.shared.activity.touch(session, now);
        }
        match cmd {
            Command::Sync => Ok(Reply::Done),
            Command::OpenSession { session, state } => match txn.stored_session(&session)? {
                Some(s) if s.meta.expired_at_ms.is_some() => Err(Error::SessionExpired),
                Some(s) => {
                    let state = txn.session_state(&session)?.unwrap_or_default();
                    Ok(Reply::Session(SessionInfo {
                        session,
                        epoch: s.meta.epoch,
                        created: false,
                        state,
                    }))
                }
                None => {
                    self.check_live_sessions(txn)?;
                    let mut records = vec![Record::SessionOpened {
                        session: session.clone(),
                        epoch: 1,
                        at_ms: now,
                    }];
                    let state = state.unwrap_or_default();
                    if !state.is_empty() {
                        records.push(Record::SessionState(SessionStateBody {
                            session: session.clone(),
                            state: state.clone(),
                            at_ms: now,
                        }));
                    }
                    self.emit(records, txn, buf)?;
                    Ok(Reply::Session(SessionInfo {
                        session,
                        epoch: 1,
                        created: true,
                        state,
                    }))
                }
            },
            Command::SetSessionState { session, state } => {
                live_session(txn, &session)?;
                let rec = Record::SessionState(SessionStateBody {
                    session,
                    state,
                    at_ms: now,
                });
                self.emit(vec![rec], txn, buf)?;
                Ok(Reply::Done)
            }
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
            Command::ExpireSession { session, idle_ms } => {
                live_session(txn, &session)?;
                if idle_ms.is_some() && !self.still_idle(&session, now) {
                    // A call named it (or a follower pinned it) since the scan: kept.
                    return Ok(Reply::Done);
                }
                let aborted = txn.open_streams(&session)?;
                let reason = match idle_ms {
                    Some(ms) => format!("session expired after {} s idle", ms / 1000),
                    None => "session expired".to_owned(),
                };
                let mut records = vec![Record::SessionExpired {
                    session,
                    at_ms: now,
                }];
                for stream in &aborted {
                    records.push(self.tombstone(
                        txn,
                        *stream,
                        StreamState::Aborted,
                        Some(reason.clone()),
                        None,
                        now,
                    )?);
                }
                self.emit(records, txn, buf)?;
                if idle_ms.is_some() {
                    self.effects.push(super::Effect::ExpiredIdle);
                }
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
                // Bounds a session's open streams, and so the group that ends them all.
                let limit = self.shared.config.open_streams_per_session_max;
                let open = txn.open_streams(&req.session)?.len() as u64;
                if open >= u64::from(limit) {
                    return Err(Error::TooLarge {
                        what: "open streams in the session",
                        got: open + 1,
                        limit: u64::from(limit),
                    });
                }
                let max = self.shared.config.leased_streams_max;
                if req.lease_ms.is_some() && self.shared.leases.len() as u64 >= max {
                    self.shared
                        .counters
                        .leases_refused_at_capacity
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(Error::AtCapacity {
                        limit: LiveLimit::LeasedStreams,
                        max,
                    });
                }
                let stream = self.log.next_lsn();
                let lease_ms = req.lease_ms;
                let rec = Record::StreamOpened(StreamOpened {
                    stream,
                    session: req.session,
                    epoch: s.epoch,
                    correlation: req.correlation,
                    lease_ms,
                    at_ms: now,
                });
                self.emit(vec![rec], txn, buf)?;
                if let Some(ms) = lease_ms {
                    // Armed here, not only by the caller once answered, so the cap counts
                    // every lease the writer granted (the caller's arm restarts it).
                    self.shared.leases.arm(stream, ms, now);
                    self.leased.push(stream);
                }
                Ok(Reply::Stream(StreamInfo {
                    stream,
                    epoch: s.epoch,
                }))
            }
            Command::Append(req) => self.plan_append(req, txn, buf, now),
            Command::Task(t) => self.plan_task(t, txn, buf, now),
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
                    if let Some(reply) =
                        retried_completion(txn, &meta, state, expected_next_seq, frame.as_ref())?
                    {
                        return Ok(Reply::Terminated(reply));
                    }
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
                    duplicate: false,
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
            Command::CarryForward { below_lsn, limit } => {
                let done = self.carry_forward(txn, buf, below_lsn, now, limit)?;
                Ok(Reply::Count(done))
            }
            Command::Forget { limit } => {
                let done = self.forget(txn, buf, now, limit)?;
                Ok(Reply::Count(done))
            }
            Command::Retire {
                below_lsn,
                bases,
                streams,
            } => {
                // Only once everything born below is carried forward (or forgotten): the
                // carry-forward groups before this one must all have succeeded.
                let left = self.shared.index.keys_in(
                    &origin_key(0, 0, &[]),
                    &origin_key(below_lsn, 0, &[]),
                    1,
                )?;
                if !left.is_empty() || self.retiring.is_some() {
                    return Err(Error::Internal(format!(
                        "refusing to retire segments below lsn {below_lsn}: state born there \
                         has not been carried forward"
                    )));
                }
                for stream in streams {
                    crate::apply::drop_runs_in(txn, stream, &bases)?;
                }
                self.retiring = Some(bases);
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
        // The per-event path: look at the stream in place rather than copy its metadata.
        let meta = txn
            .with_stream(req.stream, |s| {
                s.filter(|s| s.meta.session == req.session)
                    .map(|s| AppendTarget {
                        epoch: s.meta.epoch,
                        state: s.meta.state,
                        head: s.meta.head,
                        watermark: s.meta.watermark,
                    })
            })?
            .ok_or(Error::UnknownStream(req.stream))?;
        if meta.state.is_terminal() {
            return Err(Error::StreamTerminated {
                stream: req.stream,
                state: meta.state,
                terminal_seq: meta.head,
            });
        }
        let count = req.events.len() as u64;
        let next = meta.head + 1;
        if let Some(expected) = req.expected_next_seq {
            if expected < next {
                return self.match_retry(&req, &meta, expected, buf);
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
        let buf_offset = buf.len();
        self.emit(records, txn, buf)?;
        self.group_runs.push(PendingRun {
            stream: req.stream,
            first_seq,
            last_seq,
            buf_offset,
        });
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
    ///
    /// The events it is compared with are in the log, or (written by an earlier request of
    /// this same group commit) still only in the group's buffer: those are read from there.
    fn match_retry(
        &self,
        req: &Append,
        meta: &AppendTarget,
        expected: u64,
        buf: &[u8],
    ) -> Result<Reply> {
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
            let same = match pending_event(&self.group_runs, buf, req.stream, seq)? {
                Some(v) => {
                    v.payload == e.payload.as_slice()
                        && v.kind == e.kind
                        && v.correlation == e.correlation.as_deref()
                }
                None => crate::read::read_event(&self.shared, req.stream, seq)?.is_some_and(|s| {
                    s.payload == e.payload && *s.kind == *e.kind && s.correlation == e.correlation
                }),
            };
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
}

/// True for the requests refused while free disk space is below the reserve: those that
/// add data. Ending streams, trimming, retention and expiry go on (they free space).
fn cmd_needs_space(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Append(_)
            | Command::OpenSession { .. }
            | Command::OpenStream(_)
            | Command::SetSessionState { .. }
            | Command::Terminate { frame: Some(_), .. }
            | Command::Task(
                TaskCommand::Create(_)
                    | TaskCommand::Change(_)
                    | TaskCommand::RequestInput(_)
                    | TaskCommand::Answer(_)
                    | TaskCommand::Finish(_)
                    | TaskCommand::Enqueue(_)
            )
    )
}

/// The events one request of the current group appended: frames `first_seq..=last_seq` of
/// `stream`, adjacent in the group buffer from `buf_offset`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingRun {
    stream: u64,
    first_seq: u64,
    last_seq: u64,
    buf_offset: usize,
}

/// Event `seq` of `stream` if an earlier request of this group wrote it (read from the group
/// buffer), `None` if it is in the log.
fn pending_event<'b>(
    runs: &[PendingRun],
    buf: &'b [u8],
    stream: u64,
    seq: u64,
) -> Result<Option<EventView<'b>>> {
    let Some(run) = runs
        .iter()
        .find(|r| r.stream == stream && (r.first_seq..=r.last_seq).contains(&seq))
    else {
        return Ok(None);
    };
    // Our own frames, encoded moments ago: a failure here is a bug, reported as one.
    let bug = |why: String| Error::Internal(format!("group buffer: {why}"));
    let mut offset = run.buf_offset;
    for _ in run.first_seq..seq {
        let frame = buf
            .get(offset..)
            .ok_or_else(|| bug("run past the end".into()))?;
        let len = crate::log::frames::frame_len_in(frame)
            .ok_or_else(|| bug("bad frame length".into()))?;
        offset += usize::try_from(len).map_err(|e| bug(e.to_string()))?;
    }
    let frame = buf
        .get(offset..)
        .ok_or_else(|| bug("run past the end".into()))?;
    let header = check_frame(frame).map_err(|e| bug(format!("{e:?}")))?;
    let body = frame
        .get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + header.body_len as usize)
        .ok_or_else(|| bug("truncated frame".into()))?;
    let view = decode_event_view(body).map_err(bug)?;
    debug_assert_eq!((view.stream, view.seq), (stream, seq), "pending run lookup");
    Ok(Some(view))
}

/// What planning an append needs of its stream.
struct AppendTarget {
    epoch: u64,
    state: StreamState,
    head: u64,
    watermark: u64,
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

/// A completion retried with the same expected seq and terminal frame as the one that
/// terminated the stream (possibly earlier in the same group commit): the original answer,
/// marked duplicate. `None` for anything else.
fn retried_completion(
    txn: &Txn<'_>,
    meta: &StreamMeta,
    state: StreamState,
    expected_next_seq: Option<u64>,
    frame: Option<&NewEvent>,
) -> Result<Option<Terminated>> {
    let (Some(expected), Some(frame)) = (expected_next_seq, frame) else {
        return Ok(None);
    };
    if meta.state != state || !meta.has_terminal_frame || expected != meta.head {
        return Ok(None);
    }
    let same = txn.terminal_frame(meta.id)?.is_some_and(|stored| {
        stored.seq == expected
            && stored.kind == frame.kind
            && stored.correlation == frame.correlation
            && stored.payload == frame.payload
    });
    Ok(same.then(|| Terminated {
        stream: meta.id,
        state,
        terminal_seq: meta.head,
        cursor: Cursor::new(meta.epoch, meta.id, meta.head),
        duplicate: true,
    }))
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
