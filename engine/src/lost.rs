//! Acknowledged writes the log lost, told by the index that remembers them.
//!
//! The index is derived and flushed lazily, so it normally trails the log. Under
//! `sync=always` it only ever holds groups that were fsynced before they were applied, so an
//! index whose applied LSN is *beyond* the log's last record proves that synced records
//! vanished (a disk that acknowledged an fsync it did not keep, a lost write, a file cut by
//! hand). Under `interval`/`never` the same gap is the unsynced tail a power loss took.
//! Either way the log is the truth and the index is rebuilt from it, but first this module
//! takes note of what the index knew, so the next open can end every stream that lost
//! events and move every session that lost a stream or an epoch to a new epoch, fail every
//! task that lost a change (past every version a client may have seen), and pad the log past
//! every task id it lost: no seq, stream id, epoch, task version or task id that a client may
//! hold is ever given to something else.

use std::collections::HashMap;

use crate::error::Result;
use crate::index::{Index, TaskRead};
use crate::state::StreamState;
use crate::task::TaskStatus;

/// What the index knew before it was rebuilt, as much as is needed to find what was lost.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    /// Session → the epoch the index held.
    sessions: HashMap<String, u64>,
    /// Streams the index held: id, session, head, state.
    streams: Vec<(u64, String, u64, StreamState)>,
    /// Tasks the index held: id, owner, version, status, deleted.
    tasks: Vec<RememberedTask>,
}

/// What the index knew of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RememberedTask {
    id: u64,
    owner: String,
    version: u64,
    status: TaskStatus,
    deleted: bool,
}

impl Remembered {
    /// Reads every session and stream of `index` (an index about to be rebuilt).
    ///
    /// # Errors
    /// Index read failures.
    pub(crate) fn read(index: &Index) -> Result<Self> {
        let sessions = index
            .sessions()?
            .into_iter()
            .map(|s| (s.meta.id, s.meta.epoch))
            .collect();
        let streams = index
            .streams()?
            .into_iter()
            .map(|s| (s.meta.id, s.meta.session, s.meta.head, s.meta.state))
            .collect();
        Ok(Self {
            sessions,
            streams,
            tasks: tasks_of(index)?,
        })
    }
}

/// Every task `index` remembers (tombstones included).
fn tasks_of(index: &Index) -> Result<Vec<RememberedTask>> {
    let mut tasks = Vec::new();
    index.for_each_task(|id, t| {
        let deleted = t.meta.is_deleted();
        tasks.push(RememberedTask {
            id,
            owner: t.meta.owner,
            version: t.meta.version,
            status: t.meta.status,
            deleted,
        });
        Ok(())
    })?;
    Ok(tasks)
}

/// Acknowledged writes the log no longer holds, and what the next open does about them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LostWrites {
    /// The index's applied LSN: the log once held records up to here.
    pub applied_lsn: u64,
    /// The log's last LSN now.
    pub last_lsn: u64,
    /// Streams the rebuilt log holds with fewer events (or an earlier state) than the index
    /// knew: they are ended (`ABORTED`) at the head that survived.
    pub streams_to_end: Vec<u64>,
    /// Sessions that lost a stream (opened in the lost records: its id could be issued
    /// again) or an epoch advance, with how many times their epoch must advance to pass
    /// every epoch a client may have seen.
    pub sessions_to_advance: Vec<(String, u64)>,
    /// Streams the index knew that the log holds nothing of.
    pub streams_vanished: u64,
    /// Sessions the index knew that the log holds nothing of (`UNKNOWN_SESSION` now).
    pub sessions_vanished: u64,
    /// Tasks the rebuilt log holds running at an earlier version than the index knew (or
    /// running where the index knew them ended), with the version the index knew: each is
    /// failed (`EndCause::Fenced`) at a version past it, so no client that saw a later
    /// version or an end sees the task go back, or end twice with different outcomes.
    pub tasks_to_end: Vec<(u64, u64)>,
    /// Tasks whose creation the log lost, as (id, owner): their ids are LSNs the log will
    /// issue again, so the log is padded past the highest before anything else is written.
    pub tasks_vanished: Vec<(u64, String)>,
}

impl LostWrites {
    /// Records the index had applied that the log no longer holds.
    pub(crate) fn records(&self) -> u64 {
        self.applied_lsn.saturating_sub(self.last_lsn)
    }

    /// The LSN the log must reach before a task may be created: the highest id of a task
    /// whose creation was lost (0: none was).
    pub(crate) fn task_ids_through(&self) -> u64 {
        self.tasks_vanished
            .iter()
            .map(|(id, _)| *id)
            .max()
            .unwrap_or(0)
    }
}

/// Compares what the index knew with the index rebuilt from the log.
///
/// # Errors
/// Index read failures.
pub(crate) fn compare(
    before: &Remembered,
    rebuilt: &Index,
    applied_lsn: u64,
    last_lsn: u64,
) -> Result<LostWrites> {
    let now_sessions: HashMap<String, u64> = rebuilt
        .sessions()?
        .into_iter()
        .map(|s| (s.meta.id, s.meta.epoch))
        .collect();
    let now_streams: HashMap<u64, (u64, StreamState)> = rebuilt
        .streams()?
        .into_iter()
        .map(|s| (s.meta.id, (s.meta.head, s.meta.state)))
        .collect();
    let mut lost = LostWrites {
        applied_lsn,
        last_lsn,
        ..LostWrites::default()
    };
    // Session → the highest epoch a client may have seen in it.
    let mut advance: HashMap<&str, u64> = HashMap::new();
    for (id, session, head, state) in &before.streams {
        match now_streams.get(id) {
            None => {
                lost.streams_vanished += 1;
                let seen = before.sessions.get(session).copied().unwrap_or(0);
                let e = advance.entry(session.as_str()).or_insert(0);
                *e = (*e).max(seen);
            }
            Some((now_head, now_state)) => {
                if now_head < head || (*now_state == StreamState::Open && *state != *now_state) {
                    lost.streams_to_end.push(*id);
                }
            }
        }
    }
    for (session, epoch) in &before.sessions {
        match now_sessions.get(session) {
            None => lost.sessions_vanished += 1,
            Some(now) if now < epoch => {
                let e = advance.entry(session.as_str()).or_insert(0);
                *e = (*e).max(*epoch);
            }
            Some(_) => {}
        }
    }
    let mut sessions: Vec<(String, u64)> = advance
        .into_iter()
        .filter_map(|(session, seen)| {
            let now = *now_sessions.get(session)?;
            // Past every epoch a client may hold: the highest one seen, or the current one.
            Some((session.to_owned(), seen.max(now) + 1 - now))
        })
        .collect();
    sessions.sort();
    lost.sessions_to_advance = sessions;
    lost.streams_to_end.sort_unstable();
    compare_tasks(before, rebuilt, &mut lost)?;
    Ok(lost)
}

/// The task half of [`compare`]. The rebuilt log is a prefix of the history the index had
/// applied, so a task it holds ended (or deleted) ended the same way before; only a task it
/// holds running can have lost a change.
fn compare_tasks(before: &Remembered, rebuilt: &Index, lost: &mut LostWrites) -> Result<()> {
    for t in &before.tasks {
        match rebuilt.stored_task(t.id)? {
            None => lost.tasks_vanished.push((t.id, t.owner.clone())),
            Some(now) => {
                let running = !now.meta.is_deleted() && !now.meta.status.is_terminal();
                let was_further = now.meta.version < t.version
                    || t.deleted
                    || t.status.is_terminal() && t.status != now.meta.status;
                if running && was_further {
                    lost.tasks_to_end.push((t.id, t.version));
                }
            }
        }
    }
    lost.tasks_to_end.sort_unstable();
    lost.tasks_vanished.sort_unstable();
    Ok(())
}
