//! Reading tasks: a lookup answers a verdict (found, expired, deleted, unknown), and a
//! [`TaskWatch`] follows one task's changes through the commits that touch it — the same
//! bells stream followers use — so the replica that started a task learns of an answer or
//! a cancel that another replica handled (docs/TASKS-DESIGN.md §1.9). A watch is a state
//! watch, not a log: it delivers the task as it is now whenever its version moved, so a
//! client that re-watches from the last version it saw loses nothing.

use std::sync::Arc;

use crate::api::{TaskRef, TaskVerdict, TaskView};
use crate::error::{Error, Result};
use crate::followers::Bell;
use crate::index::TaskRead;
use crate::shared::Shared;
use crate::task::{SlotState, TaskOutcome, TaskRemoval, INBOUND, OUTBOUND};
use crate::verdict::past_horizon;

fn unknown() -> TaskView {
    TaskView {
        verdict: TaskVerdict::Unknown,
        task: None,
        outcome: None,
        outstanding: Vec::new(),
        answered: Vec::new(),
        outbound_queued: 0,
        inbound_queued: 0,
    }
}

/// The engine id of `task`, if its owner has it (or its tombstone).
fn task_id(shared: &Shared, task: &TaskRef) -> Result<Option<u64>> {
    shared.index.task_by_task_id(&task.owner, &task.task_id)
}

/// Task `id` as a lookup sees it now.
pub(crate) fn view_of(shared: &Shared, id: u64, include_outcome: bool) -> Result<TaskView> {
    // The task, its outcome, its input slots and its queues as of one moment: a write
    // between two of these reads would give a view of no moment (`Index::snapshot`).
    let snapshot = shared.index.snapshot();
    let index = &snapshot;
    let Some(stored) = index.stored_task(id)? else {
        return Ok(unknown());
    };
    let meta = stored.meta;
    if let Some(removal) = meta.removal {
        if past_horizon(meta.deleted_at_ms, shared.now_ms(), shared.horizon_ms()) {
            return Ok(unknown());
        }
        return Ok(TaskView {
            verdict: match removal {
                TaskRemoval::Expired => TaskVerdict::Expired,
                TaskRemoval::Deleted => TaskVerdict::Deleted,
            },
            task: Some(meta),
            outcome: None,
            outstanding: Vec::new(),
            answered: Vec::new(),
            outbound_queued: 0,
            inbound_queued: 0,
        });
    }
    let outcome = if include_outcome && meta.status.is_terminal() {
        Some(TaskOutcome {
            kind: meta.outcome_kind,
            json: index.task_outcome(id)?,
        })
    } else {
        None
    };
    let (outstanding, answered): (Vec<_>, Vec<_>) = index
        .task_slots(id)?
        .into_iter()
        .filter(|s| s.state != SlotState::Dropped)
        .partition(|s| s.state == SlotState::Outstanding);
    let waiting = |channel| -> Result<u64> {
        let q = index.queue_state(id, channel)?;
        Ok(q.tail - q.head)
    };
    Ok(TaskView {
        verdict: TaskVerdict::Found,
        task: Some(meta),
        outcome,
        outstanding,
        answered,
        outbound_queued: waiting(OUTBOUND)?,
        inbound_queued: waiting(INBOUND)?,
    })
}

/// `task` as a lookup sees it now.
pub(crate) fn view(shared: &Shared, task: &TaskRef, include_outcome: bool) -> Result<TaskView> {
    match task_id(shared, task)? {
        Some(id) => view_of(shared, id, include_outcome),
        None => Ok(unknown()),
    }
}

/// A live watch of one task: yields the task each time it changed (its version moved, or a
/// message was enqueued), until it has delivered its end (a terminal status with nothing
/// left queued, or its deletion). While it lives it costs a bell; dropping
/// it frees the bell.
#[derive(Debug)]
pub struct TaskWatch {
    shared: Arc<Shared>,
    id: u64,
    /// The version last delivered (0: none).
    after_version: u64,
    /// The queue tails last delivered: an enqueue changes no version but is news.
    tails: (u64, u64),
    done: bool,
    bell: Option<Arc<Bell>>,
    /// The bell's count when the last poll started.
    seen: u64,
}

impl TaskWatch {
    /// A watch of `task`, delivering changes past `after_version` (0: the task as it is).
    pub(crate) fn new(shared: Arc<Shared>, task: &TaskRef, after_version: u64) -> Result<Self> {
        if shared.followers.is_closed() {
            return Err(Error::Closed);
        }
        let id = task_id(&shared, task)?.ok_or_else(|| Error::UnknownTask {
            task_id: task.task_id.clone(),
        })?;
        let bell = shared.followers.follow_task(id);
        Ok(Self {
            shared,
            id,
            after_version,
            tails: (0, 0),
            done: false,
            bell: Some(bell),
            seen: 0,
        })
    }

    /// The task now, if it changed since what was delivered (`Ok(Some)`), or `Ok(None)`
    /// when it did not; [`TaskWatch::is_done`] once its end was delivered. Terminal views
    /// carry the outcome. Blocking: it reads the index.
    ///
    /// # Errors
    /// [`Error::Closed`] once the engine closed; index failures.
    pub fn poll(&mut self) -> Result<Option<TaskView>> {
        if self.done {
            return Ok(None);
        }
        if self.shared.followers.is_closed() {
            return Err(Error::Closed);
        }
        if let Some(bell) = &self.bell {
            self.seen = bell.rings();
        }
        let view = view_of(&self.shared, self.id, true)?;
        let Some(task) = &view.task else {
            // Forgotten: its end was delivered before, or it is gone past the horizon.
            self.done = true;
            return Ok(Some(view));
        };
        let ended = task.status.is_terminal() || task.is_deleted();
        let tails = (
            self.shared.index.queue_state(self.id, OUTBOUND)?.tail,
            self.shared.index.queue_state(self.id, INBOUND)?.tail,
        );
        let queued = view.outbound_queued + view.inbound_queued > 0;
        if task.version <= self.after_version && !task.is_deleted() && tails == self.tails {
            // Nothing new; a watch started after the end it already saw is over.
            self.done = ended && !queued;
            return Ok(None);
        }
        self.tails = tails;
        self.after_version = task.version;
        // An ended task with messages still queued (its result's notifications) is watched
        // until they are taken.
        self.done = ended && !queued;
        Ok(Some(view))
    }

    /// True once the watch delivered the task's end.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Waits until a commit touched the task since the last [`TaskWatch::poll`] began.
    ///
    /// # Errors
    /// [`Error::Closed`] when the engine closes.
    pub async fn changed(&mut self) -> Result<()> {
        let Some(bell) = &self.bell else {
            return Err(Error::Closed);
        };
        if self.shared.followers.wait(bell, self.seen).await {
            Ok(())
        } else {
            Err(Error::Closed)
        }
    }

    /// The next change, waiting for a commit if there is none yet; `Ok(None)` once the
    /// task's end was delivered.
    ///
    /// # Errors
    /// As [`TaskWatch::poll`].
    pub async fn next(&mut self) -> Result<Option<TaskView>> {
        loop {
            if self.done {
                return Ok(None);
            }
            match self.poll()? {
                Some(view) => return Ok(Some(view)),
                None if self.done => return Ok(None),
                None => self.changed().await?,
            }
        }
    }

    /// The version last delivered.
    pub fn version(&self) -> u64 {
        self.after_version
    }
}

impl Drop for TaskWatch {
    fn drop(&mut self) {
        if let Some(bell) = self.bell.take() {
            self.shared.followers.unfollow_task(self.id, bell);
        }
    }
}
