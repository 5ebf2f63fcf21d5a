//! Recovery's fencing, before anything is served: what a crash may have taken that a client
//! may still hold (a seq, a stream id, an epoch, a task's version or id) is ended or moved
//! past, never given to something else (FORMAT.md invariants 5 and 8, `crate::lost`).

use super::unexpected;
use crate::background::open_stream_ids;
use crate::error::{Error, Result};
use crate::lost::LostWrites;
use crate::mailbox::{Command, Mailbox, Reply, TaskCommand, TaskReply};
use crate::shared::Shared;
use crate::state::StreamState;

/// Ends every open stream after a run that may have lost acknowledged events: a client may
/// hold a cursor for a lost event, and appending after the surviving head would give its
/// seq to another event. Returns how many were ended.
pub(super) fn fence_open_streams(shared: &Shared, tx: &Mailbox) -> Result<u64> {
    let mut fenced = 0;
    for stream in open_stream_ids(shared)? {
        let reason = "the server restarted after a crash under a non-durable sync policy: \
                      events acknowledged just before it may be lost";
        fenced += u64::from(abort_stream(shared, tx, stream, reason)?);
    }
    if fenced > 0 {
        tracing::warn!(
            streams = fenced,
            "ended the open streams: the previous run acknowledged unsynced events and the machine restarted, so some may be lost"
        );
    }
    Ok(fenced)
}

/// After a crash that may have lost acknowledged but unsynced changes (a reboot after an
/// unclean `interval`/`never` run), fails every running task (`Fenced`), as
/// [`fence_open_streams`] ends every open stream: a task may have lost a change a client saw
/// (even its end), so it must not run on as if it had not. Creations are synced under every
/// policy, so no task id is lost; how many versions were lost is unknown, so the end is at
/// the next version the log has.
pub(super) fn fence_running_tasks(shared: &Shared, tx: &Mailbox) -> Result<u64> {
    let mut fenced = 0;
    for id in crate::background::running_task_ids(shared)? {
        let fence = TaskCommand::Fence {
            id,
            past_version: 0,
            why: "task failed: the server restarted after a crash under a non-durable sync \
                  policy, and changes to it acknowledged just before may be lost",
        };
        fenced += u64::from(task_decision(shared, tx, fence)?);
    }
    if fenced > 0 {
        tracing::warn!(
            tasks = fenced,
            "failed the running tasks (cause: fenced): the previous run acknowledged unsynced changes and the machine restarted, so some may be lost"
        );
        crate::mailbox::submit(tx, shared, Command::Sync)?;
    }
    Ok(fenced)
}

/// Ends `stream` as `ABORTED` for `reason` before anything is served: true if it was open,
/// false if it had already ended or is gone.
fn abort_stream(shared: &Shared, tx: &Mailbox, stream: u64, reason: &str) -> Result<bool> {
    let cmd = Command::Terminate {
        session: None,
        stream,
        state: StreamState::Aborted,
        expected_next_seq: None,
        reason: Some(reason.into()),
        frame: None,
    };
    match crate::mailbox::submit(tx, shared, cmd) {
        Ok(_) => Ok(true),
        Err(Error::StreamTerminated { .. } | Error::UnknownStream(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// What [`fence_lost`] did.
pub(super) struct Fenced {
    pub streams: u64,
    pub sessions: u64,
    pub tasks: u64,
}

/// Blank records in one padding group (see [`fence_lost`]).
const PAD_GROUP_MAX: usize = 4096;

/// Fences what the log lost that the index remembered (see [`crate::lost`]): ends the
/// streams that lost events at the head that survived, and moves the sessions that lost a
/// stream or an epoch past every epoch a client may hold, so a lost stream's id, given to a
/// new stream, can never match an old cursor. Fails the tasks that lost a change at a
/// version past every one a client may have seen, and pads the log with blank records past
/// the id of every task whose creation was lost (a task's id is its creation's LSN), so no
/// new task takes it.
pub(super) fn fence_lost(shared: &Shared, tx: &Mailbox, lost: &LostWrites) -> Result<Fenced> {
    let mut ended = 0;
    for stream in &lost.streams_to_end {
        let reason = "events of this stream that had been acknowledged are missing from the \
                      log (lost at a crash)";
        ended += u64::from(abort_stream(shared, tx, *stream, reason)?);
    }
    let mut moved = 0;
    for (session, steps) in &lost.sessions_to_advance {
        for _ in 0..*steps {
            match crate::mailbox::submit(tx, shared, Command::AdvanceEpoch(session.clone())) {
                Ok(_) => {}
                Err(Error::UnknownSession | Error::SessionExpired) => break,
                Err(e) => return Err(e),
            }
        }
        moved += 1;
    }
    let through_lsn = lost.task_ids_through();
    let pad = || TaskCommand::PadLsns {
        through_lsn,
        max: PAD_GROUP_MAX,
    };
    while through_lsn > 0 && !task_decision(shared, tx, pad())? {}
    let mut tasks = 0;
    for (id, past_version) in &lost.tasks_to_end {
        let fence = TaskCommand::Fence {
            id: *id,
            past_version: *past_version,
            why: "task failed: changes to it that had been acknowledged were lost at a crash",
        };
        tasks += u64::from(task_decision(shared, tx, fence)?);
    }
    if tasks > 0 || through_lsn > 0 {
        tracing::warn!(
            tasks_failed = tasks,
            task_ids_padded_through = through_lsn,
            "failed the tasks that lost acknowledged changes (cause: fenced), and kept the ids \
             of tasks whose creation was lost from being issued again"
        );
    }
    if ended + moved + tasks > 0 || through_lsn > 0 {
        crate::mailbox::submit(tx, shared, Command::Sync)?;
    }
    Ok(Fenced {
        streams: ended,
        sessions: moved,
        tasks,
    })
}

/// Submits a recovery task command; its answer (`Expired(done)`).
fn task_decision(shared: &Shared, tx: &Mailbox, cmd: TaskCommand) -> Result<bool> {
    match crate::mailbox::submit(tx, shared, Command::Task(cmd))? {
        Reply::Task(r) => match *r {
            TaskReply::Expired(done) => Ok(done),
            other => Err(Error::Internal(format!(
                "unexpected writer reply {other:?} to a recovery task command"
            ))),
        },
        other => Err(unexpected(&other)),
    }
}
