//! The rules a record must satisfy against the state just before it: what makes applying
//! it meaningful. A single node's writer plans only records that satisfy them (planning is
//! where callers get their precise errors); a replicated log needs them again at apply,
//! because entries of a deposed leader's term can commit beside the new leader's, planned
//! against a state that is no longer the one they land on (issue 19: "apply validates
//! deterministically"). The rules read nothing but the index state — no clock, no
//! configuration — so every replica decides the same.
//!
//! Today the writer checks every record it emits against them in debug and test builds,
//! so the whole test suite holds the planner and these rules to agreeing.
//!
//! Records that restate state (carry-forward snapshots) must restate exactly the state they
//! meet: a snapshot planned against state that an earlier entry's refusal left unchanged
//! would otherwise write that state back. A forgotten marker needs its stream ended or its
//! session expired (when is the leader's decision, from its clock; that it may is not). The
//! log's own records (shutdown, blank, membership) are always valid.
//!
//! The rules are per record, in order, each against the state the records before it left;
//! a group (an entry) is all or nothing, so its caller refuses the whole group when any of
//! its records is refused (the writer fails the whole request).
//!
//! An event needs its stream's session live and still at the stream's epoch: an epoch
//! advance (or an expiry) ends the session's open streams in the same group, but a stream
//! opened by a deposed leader's entry that commits before the advance is not among them,
//! and its later events must not pass.

use crate::error::Result;
use crate::index::{KvRead, Txn};
use crate::record::Record;
use crate::state::StreamState;
use crate::task::TaskStatus;

mod task;

/// Why a record cannot apply to the state before it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Rejection {
    /// A session is opened that exists already.
    #[error("session {0:?} exists already")]
    SessionExists(String),
    /// The record names a session the state does not hold.
    #[error("session {0:?} is unknown")]
    UnknownSession(String),
    /// The record needs a live session; this one expired.
    #[error("session {0:?} has expired")]
    SessionExpired(String),
    /// An epoch advance that does not move the epoch forward.
    #[error("session {session:?} is at epoch {current}, not below {given}")]
    EpochNotAhead {
        session: String,
        current: u64,
        given: u64,
    },
    /// A stream opened in another epoch than its session's.
    #[error("session {session:?} is at epoch {current}, the stream names {given}")]
    StaleEpoch {
        session: String,
        current: u64,
        given: u64,
    },
    /// A stream id that is not the LSN of its `StreamOpened` record, or is taken.
    #[error("stream id {stream} at LSN {lsn}")]
    StreamIdNotLsn { stream: u64, lsn: u64 },
    /// The record names a stream the state does not hold.
    #[error("stream {0} is unknown")]
    UnknownStream(u64),
    /// An event or a tombstone for a stream that already ended.
    #[error("stream {stream} has ended ({state:?})")]
    StreamEnded { stream: u64, state: StreamState },
    /// An event for a stream of an epoch its session has left.
    #[error("stream {stream} is of epoch {stream_epoch}; session {session:?} is at {current}")]
    StreamSuperseded {
        stream: u64,
        session: String,
        stream_epoch: u64,
        current: u64,
    },
    /// An event or terminal frame whose seq does not follow the head.
    #[error("stream {stream}: seq {seq} does not follow head {head}")]
    SeqNotNext { stream: u64, seq: u64, head: u64 },
    /// A carried-forward snapshot that does not restate the state it meets.
    #[error("the snapshot of {0} does not restate its current state")]
    StaleSnapshot(String),
    /// A stream forgotten while it is still open.
    #[error("stream {0} is forgotten while open")]
    ForgottenWhileOpen(u64),
    /// A session forgotten while it is still live.
    #[error("session {0:?} is forgotten while live")]
    ForgottenWhileLive(String),
    /// A task id that is not the LSN of its `TaskCreated` record, or is taken.
    #[error("task id {id} at LSN {lsn}")]
    TaskIdNotLsn { id: u64, lsn: u64 },
    /// The owner has a task of this task id already (or its tombstone).
    #[error("owner {owner:?} has a task {task_id:?} already")]
    TaskIdTaken { owner: String, task_id: String },
    /// The owner created a task with this request key already.
    #[error("owner {owner:?} created a task for request {request_key:?} already")]
    TaskRequestTaken { owner: String, request_key: String },
    /// The record names a task the state does not hold.
    #[error("task {0} is unknown")]
    UnknownTask(u64),
    /// The record changes a task whose content was deleted.
    #[error("task {0} was deleted")]
    TaskDeleted(u64),
    /// A change of a task that ended.
    #[error("task {id} has ended ({status})")]
    TaskEnded { id: u64, status: TaskStatus },
    /// A change planned against another version of the task: the compare-and-set failed.
    #[error("task {id}: version {version} does not follow {current}")]
    TaskVersion { id: u64, version: u64, current: u64 },
    /// A status move the protocol does not allow (or a terminal status without `TaskEnded`).
    #[error("task {id} may not move from {from} to {to}")]
    TaskMove {
        id: u64,
        from: TaskStatus,
        to: TaskStatus,
    },
    /// An input request whose key this task used before (keys are never reused).
    #[error("task {id}: input key {key:?} was used before")]
    TaskInputKeyUsed { id: u64, key: String },
    /// An answer to a key that is not an outstanding input request.
    #[error("task {id}: input key {key:?} is not outstanding")]
    TaskInputNotOutstanding { id: u64, key: String },
    /// A second cancel request.
    #[error("task {0}: a cancel was requested already")]
    TaskCancelRequested(u64),
    /// An expiry before the task's TTL ran out (or of a task without one).
    #[error("task {id}: its TTL deadline {deadline:?} is not reached at {at_ms}")]
    TaskTimeNotUp {
        id: u64,
        at_ms: u64,
        deadline: Option<u64>,
    },
    /// A queue record that does not follow the queue's state (qseq not next, full, a
    /// dequeue past the tail, an unknown channel, a dedupe key in use).
    #[error("task {id}: queue {channel}: {why}")]
    TaskQueue { id: u64, channel: u8, why: String },
    /// A task forgotten before its content was deleted.
    #[error("task {0} is forgotten before it was deleted")]
    TaskNotDeleted(u64),
    /// A watermark that does not move forward or passes the head.
    #[error("stream {stream}: watermark {watermark} is not in {current}..={limit}")]
    BadWatermark {
        stream: u64,
        watermark: u64,
        current: u64,
        limit: u64,
    },
}

/// Checks `record`, to be written at `lsn`, against the state `txn` holds just before it.
///
/// # Errors
/// Index read failures (the outer `Result`); the rule the record breaks (the inner one).
pub(crate) fn validate(
    txn: &Txn<'_>,
    lsn: u64,
    record: &Record,
) -> Result<std::result::Result<(), Rejection>> {
    let live = |session: &str| -> Result<std::result::Result<u64, Rejection>> {
        Ok(match txn.stored_session(session)? {
            None => Err(Rejection::UnknownSession(session.to_owned())),
            Some(s) if s.meta.expired_at_ms.is_some() => {
                Err(Rejection::SessionExpired(session.to_owned()))
            }
            Some(s) => Ok(s.meta.epoch),
        })
    };
    let open_stream = |stream: u64| -> Result<std::result::Result<(u64, u64), Rejection>> {
        Ok(match txn.stored_stream(stream)? {
            None => Err(Rejection::UnknownStream(stream)),
            Some(s) if s.meta.state.is_terminal() => Err(Rejection::StreamEnded {
                stream,
                state: s.meta.state,
            }),
            Some(s) => Ok((s.meta.head, s.meta.watermark)),
        })
    };
    Ok(match record {
        Record::SessionOpened { session, .. } => match txn.stored_session(session)? {
            Some(_) => Err(Rejection::SessionExists(session.clone())),
            None => Ok(()),
        },
        Record::SessionState(b) => match txn.stored_session(&b.session)? {
            None => Err(Rejection::UnknownSession(b.session.clone())),
            Some(_) => Ok(()),
        },
        Record::EpochAdvanced { session, epoch, .. } => match txn.stored_session(session)? {
            None => Err(Rejection::UnknownSession(session.clone())),
            Some(s) if s.meta.epoch >= *epoch => Err(Rejection::EpochNotAhead {
                session: session.clone(),
                current: s.meta.epoch,
                given: *epoch,
            }),
            Some(_) => Ok(()),
        },
        Record::SessionExpired { session, .. } => live(session)?.map(|_| ()),
        Record::StreamOpened(o) => {
            if o.stream != lsn || txn.stored_stream(o.stream)?.is_some() {
                Err(Rejection::StreamIdNotLsn {
                    stream: o.stream,
                    lsn,
                })
            } else {
                match live(&o.session)? {
                    Err(r) => Err(r),
                    Ok(current) if current != o.epoch => Err(Rejection::StaleEpoch {
                        session: o.session.clone(),
                        current,
                        given: o.epoch,
                    }),
                    Ok(_) => Ok(()),
                }
            }
        }
        Record::Event(e) => match current_epoch_of(txn, e.stream)? {
            Err(r) => Err(r),
            Ok(()) => open_stream(e.stream)?,
        }
        .and_then(|(head, _)| {
            if e.seq == head + 1 {
                Ok(())
            } else {
                Err(Rejection::SeqNotNext {
                    stream: e.stream,
                    seq: e.seq,
                    head,
                })
            }
        }),
        Record::Terminal(t) => open_stream(t.stream)?.and_then(|(head, _)| {
            let expected = if t.frame.is_some() { head + 1 } else { head };
            let frame_seq = t.frame.as_ref().map_or(expected, |f| f.seq);
            if t.terminal_seq == expected && frame_seq == expected {
                Ok(())
            } else {
                Err(Rejection::SeqNotNext {
                    stream: t.stream,
                    seq: t.terminal_seq,
                    head,
                })
            }
        }),
        Record::Trim {
            stream, watermark, ..
        } => match txn.stored_stream(*stream)? {
            None => Err(Rejection::UnknownStream(*stream)),
            Some(s) => {
                let (current, limit) = (s.meta.watermark, s.meta.head + 1);
                if *watermark > current && *watermark <= limit {
                    Ok(())
                } else {
                    Err(Rejection::BadWatermark {
                        stream: *stream,
                        watermark: *watermark,
                        current,
                        limit,
                    })
                }
            }
        },
        Record::SessionSnapshot(meta) => match txn.stored_session(&meta.id)? {
            None => Err(Rejection::UnknownSession(meta.id.clone())),
            Some(s) if s.meta != *meta => {
                Err(Rejection::StaleSnapshot(format!("session {:?}", meta.id)))
            }
            Some(_) => Ok(()),
        },
        Record::StreamSnapshot(snap) => match txn.stored_stream(snap.meta.id)? {
            None => Err(Rejection::UnknownStream(snap.meta.id)),
            Some(s)
                if s.meta != snap.meta
                    || txn.terminal_frame(snap.meta.id)? != snap.terminal_frame =>
            {
                Err(Rejection::StaleSnapshot(format!("stream {}", snap.meta.id)))
            }
            Some(_) => Ok(()),
        },
        Record::StreamForgotten { stream, .. } => match txn.stored_stream(*stream)? {
            None => Err(Rejection::UnknownStream(*stream)),
            Some(s) if !s.meta.state.is_terminal() => Err(Rejection::ForgottenWhileOpen(*stream)),
            Some(_) => Ok(()),
        },
        Record::SessionForgotten { session, .. } => match txn.stored_session(session)? {
            None => Err(Rejection::UnknownSession(session.clone())),
            Some(s) if s.meta.expired_at_ms.is_none() => {
                Err(Rejection::ForgottenWhileLive(session.clone()))
            }
            Some(_) => Ok(()),
        },
        Record::Shutdown { .. } | Record::Blank | Record::Membership { .. } => Ok(()),
        Record::TaskCreated(c) => task::created(txn, lsn, c)?,
        Record::TaskUpdated(u) => task::updated(txn, u)?,
        Record::TaskInputRequested(r) => task::input_requested(txn, r)?,
        Record::TaskInputAnswered(a) => task::input_answered(txn, a)?,
        Record::TaskCancelRequested(c) => task::cancel_requested(txn, c)?,
        Record::TaskEnded(e) => task::ended(txn, e)?,
        Record::TaskQueued(q) => task::queued(txn, q)?,
        Record::TaskDequeued(d) => task::dequeued(txn, d)?,
        Record::TaskDeleted(d) => task::deleted(txn, d)?,
        Record::TaskSnapshot(s) => task::snapshot(txn, s)?,
        Record::TaskForgotten(f) => task::forgotten(txn, f.id)?,
        Record::TaskRoutes(r) => task::routes(txn, r)?,
    })
}

/// Whether stream `stream`'s session is live and still at the stream's epoch (an unknown
/// stream passes here: the stream rules refuse it).
fn current_epoch_of(txn: &Txn<'_>, stream: u64) -> Result<std::result::Result<(), Rejection>> {
    let Some(s) = txn.stored_stream(stream)? else {
        return Ok(Ok(()));
    };
    Ok(match txn.stored_session(&s.meta.session)? {
        None => Err(Rejection::UnknownSession(s.meta.session)),
        Some(n) if n.meta.expired_at_ms.is_some() => Err(Rejection::SessionExpired(s.meta.session)),
        Some(n) if n.meta.epoch != s.meta.epoch => Err(Rejection::StreamSuperseded {
            stream,
            session: s.meta.session,
            stream_epoch: s.meta.epoch,
            current: n.meta.epoch,
        }),
        Some(_) => Ok(()),
    })
}

#[cfg(test)]
mod tests;
