//! The leader's task clocks (docs/TASKS-DESIGN.md §1.7): the TTL pass finds tasks whose
//! deadline passed through one range scan of the `D` keys, and the lease pass takes the
//! worker leases that ran out. Each proposes its decision as a task command; the writer
//! plans it against the state of the moment (a task renewed, ended or deleted meanwhile is
//! left), and the apply rules accept a TTL end only at or past the deadline in the records.

use crate::error::{Error, Result};
use crate::index::task_deadline_key;
use crate::mailbox::{submit, Command, Mailbox, Reply, TaskCommand, TaskReply};
use crate::shared::Shared;
use crate::task::{TaskMeta, TaskStatus};

/// Most tasks one TTL pass takes (the rest wait for the next tick).
const TTL_PER_ROUND: usize = 1024;

/// Fails the running tasks whose TTL ran out and deletes the content of those that ended a
/// TTL ago; returns how many it changed.
pub(crate) fn expire_tasks(shared: &Shared, tx: &Mailbox) -> Result<usize> {
    let now = shared.now_ms();
    let due = shared.index.keys_in(
        &task_deadline_key(0, 0),
        &task_deadline_key(now.saturating_add(1), 0),
        TTL_PER_ROUND,
    )?;
    let mut n = 0;
    for key in due {
        let Some(id) = key
            .get(9..17)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
        else {
            continue;
        };
        n += usize::from(decide(shared, tx, TaskCommand::Expire(id), id, "ttl"));
    }
    Ok(n)
}

/// Fails the running tasks whose worker lease ran out; returns how many.
pub(crate) fn expire_task_leases(shared: &Shared, tx: &Mailbox) -> usize {
    let expired = shared.task_leases.take_expired(shared.now_ms());
    expired
        .into_iter()
        .filter(|id| decide(shared, tx, TaskCommand::LeaseExpired(*id), *id, "lease"))
        .count()
}

/// Submits one expiry decision; true when it changed the task.
fn decide(shared: &Shared, tx: &Mailbox, cmd: TaskCommand, id: u64, what: &str) -> bool {
    match submit(tx, shared, Command::Task(cmd)) {
        Ok(Reply::Task(r)) if matches!(*r, TaskReply::Expired(true)) => {
            tracing::info!(task = id, clock = what, "task expired");
            true
        }
        Ok(_) => false,
        Err(Error::NotLeader { .. } | Error::Closed) => false,
        Err(e) => {
            tracing::warn!(task = id, clock = what, error = %e, "could not expire a task; will retry");
            false
        }
    }
}

/// Arms a full worker lease for every running task that has one (a new leader's, or a
/// restarted node's: the worker gets a whole lease to reach it). A lease already armed keeps
/// its deadline. O(tasks), scanned.
pub(crate) fn arm_task_leases(shared: &Shared) -> Result<()> {
    let now = shared.now_ms();
    for_each_running_task(shared, |id, meta| {
        if let Some(ms) = meta.worker_lease_ms {
            shared.task_leases.arm_missing(id, ms, now);
        }
    })
}

/// The ids of every task still running (not ended, not deleted), in id order: recovery's
/// fencing after a crash under a non-durable sync policy fails them all.
///
/// # Errors
/// Index read failures.
pub(crate) fn running_task_ids(shared: &Shared) -> Result<Vec<u64>> {
    let mut ids = Vec::new();
    for_each_running_task(shared, |id, _| ids.push(id))?;
    Ok(ids)
}

/// Calls `f` with the id and metadata of every task still running, in id order.
fn for_each_running_task(shared: &Shared, mut f: impl FnMut(u64, &TaskMeta)) -> Result<()> {
    shared.index.for_each_task(|id, t| {
        if t.is_running() {
            f(id, &t.meta);
        }
        Ok(())
    })
}

/// Renews the worker lease of `task` (a worker's keep-alive), if it runs and has one.
pub(crate) fn renew_task_lease(shared: &Shared, id: u64, status: TaskStatus) {
    if !status.is_terminal() {
        shared.task_leases.renew(id, shared.now_ms());
    }
}
