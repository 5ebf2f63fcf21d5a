//! The rules of the task records (docs/TASKS-DESIGN.md §1.3). Every record that changes a
//! task's status, message, timing, inputs or cancel request carries the task's version
//! after the change, which must be the current version + 1: the task's compare-and-set. Of
//! two writers racing to end a task, the second is planned (or, on a deposed leader,
//! applied) against a version that is gone, and refused.

use super::Rejection;
use crate::error::Result;
use crate::index::{StoredTask, TaskRead, Txn};
use crate::record::{
    TaskCancelRequested, TaskCreated, TaskDeleted, TaskDequeued, TaskEnded, TaskInputAnswered,
    TaskInputRequested, TaskQueued, TaskRoutes, TaskSnapshot, TaskUpdated,
};
use crate::task::{may_move, EndCause, SlotState, TaskRemoval, TaskStatus, INBOUND};

type Rule = std::result::Result<(), Rejection>;

/// The task `id`, existing and not deleted.
fn present(txn: &Txn<'_>, id: u64) -> Result<std::result::Result<StoredTask, Rejection>> {
    Ok(match txn.stored_task(id)? {
        None => Err(Rejection::UnknownTask(id)),
        Some(t) if t.meta.is_deleted() => Err(Rejection::TaskDeleted(id)),
        Some(t) => Ok(t),
    })
}

/// The task `id`, present, running, and at `version - 1`.
fn next_version(
    txn: &Txn<'_>,
    id: u64,
    version: u64,
) -> Result<std::result::Result<StoredTask, Rejection>> {
    Ok(present(txn, id)?.and_then(|t| {
        if t.meta.status.is_terminal() {
            Err(Rejection::TaskEnded {
                id,
                status: t.meta.status,
            })
        } else if t.meta.version.checked_add(1) != Some(version) {
            Err(Rejection::TaskVersion {
                id,
                version,
                current: t.meta.version,
            })
        } else {
            Ok(t)
        }
    }))
}

/// A move of `t` to `to`, if the protocol allows it.
fn moves(t: &StoredTask, to: TaskStatus) -> Rule {
    if may_move(t.meta.status, to) {
        Ok(())
    } else {
        Err(Rejection::TaskMove {
            id: t.meta.id,
            from: t.meta.status,
            to,
        })
    }
}

/// Keys that appear twice in one record.
fn repeated<'a>(keys: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = std::collections::HashSet::new();
    keys.into_iter().find(|k| !seen.insert(*k))
}

pub(super) fn created(txn: &Txn<'_>, lsn: u64, c: &TaskCreated) -> Result<Rule> {
    Ok(if c.id != lsn || txn.stored_task(c.id)?.is_some() {
        Err(Rejection::TaskIdNotLsn { id: c.id, lsn })
    } else if txn.task_by_task_id(&c.owner, &c.task_id)?.is_some() {
        Err(Rejection::TaskIdTaken {
            owner: c.owner.clone(),
            task_id: c.task_id.clone(),
        })
    } else if txn.task_by_request_key(&c.owner, &c.request_key)?.is_some() {
        Err(Rejection::TaskRequestTaken {
            owner: c.owner.clone(),
            request_key: c.request_key.clone(),
        })
    } else {
        Ok(())
    })
}

pub(super) fn updated(txn: &Txn<'_>, u: &TaskUpdated) -> Result<Rule> {
    Ok(next_version(txn, u.id, u.version)?.and_then(|t| {
        if u.status.is_terminal() {
            // A terminal status comes with its outcome, in `TaskEnded`.
            Err(Rejection::TaskMove {
                id: u.id,
                from: t.meta.status,
                to: u.status,
            })
        } else {
            moves(&t, u.status)
        }
    }))
}

pub(super) fn input_requested(txn: &Txn<'_>, r: &TaskInputRequested) -> Result<Rule> {
    let t = match next_version(txn, r.id, r.version)? {
        Err(e) => return Ok(Err(e)),
        Ok(t) => t,
    };
    if let Some(key) = repeated(r.requests.iter().map(|(k, _)| k.as_str())) {
        return Ok(Err(Rejection::TaskInputKeyUsed {
            id: r.id,
            key: key.to_owned(),
        }));
    }
    for (key, _) in &r.requests {
        if txn.task_slot(r.id, key)?.is_some() {
            return Ok(Err(Rejection::TaskInputKeyUsed {
                id: r.id,
                key: key.clone(),
            }));
        }
    }
    Ok(moves(&t, TaskStatus::InputRequired))
}

pub(super) fn input_answered(txn: &Txn<'_>, a: &TaskInputAnswered) -> Result<Rule> {
    if let Err(e) = next_version(txn, a.id, a.version)? {
        return Ok(Err(e));
    }
    if let Some(key) = repeated(a.responses.iter().map(|(k, _)| k.as_str())) {
        return Ok(Err(Rejection::TaskInputNotOutstanding {
            id: a.id,
            key: key.to_owned(),
        }));
    }
    for (key, _) in &a.responses {
        let outstanding = txn
            .task_slot(a.id, key)?
            .is_some_and(|s| s.state == SlotState::Outstanding);
        if !outstanding {
            return Ok(Err(Rejection::TaskInputNotOutstanding {
                id: a.id,
                key: key.clone(),
            }));
        }
    }
    Ok(Ok(()))
}

pub(super) fn cancel_requested(txn: &Txn<'_>, c: &TaskCancelRequested) -> Result<Rule> {
    Ok(next_version(txn, c.id, c.version)?.and_then(|t| {
        if t.meta.cancel_requested {
            Err(Rejection::TaskCancelRequested(c.id))
        } else {
            Ok(())
        }
    }))
}

pub(super) fn ended(txn: &Txn<'_>, e: &TaskEnded) -> Result<Rule> {
    Ok(next_version(txn, e.id, e.version)?.and_then(|t| {
        if !e.status.is_terminal() {
            return Err(Rejection::TaskMove {
                id: e.id,
                from: t.meta.status,
                to: e.status,
            });
        }
        moves(&t, e.status)?;
        match e.cause {
            // Only times written in records are compared: a leader whose clock runs slow
            // can expire a task late, never early.
            EndCause::TtlExpired => match t.meta.deadline_ms() {
                Some(deadline) if e.status == TaskStatus::Failed && e.at_ms >= deadline => Ok(()),
                deadline => Err(Rejection::TaskTimeNotUp {
                    id: e.id,
                    at_ms: e.at_ms,
                    deadline,
                }),
            },
            EndCause::LeaseExpired if e.status != TaskStatus::Failed => Err(Rejection::TaskMove {
                id: e.id,
                from: t.meta.status,
                to: e.status,
            }),
            EndCause::Client | EndCause::LeaseExpired | EndCause::Fenced => Ok(()),
        }
    }))
}

/// A queue record's refusal.
fn queue_rule(id: u64, channel: u8, why: String) -> Rule {
    Err(Rejection::TaskQueue { id, channel, why })
}

pub(super) fn queued(txn: &Txn<'_>, q: &TaskQueued) -> Result<Rule> {
    let t = match present(txn, q.id)? {
        Err(e) => return Ok(Err(e)),
        Ok(t) => t,
    };
    if q.channel > INBOUND {
        return Ok(queue_rule(q.id, q.channel, "no such channel".into()));
    }
    // An inbound answer with a correlation is a routed one: it needs its task's route open,
    // so a duplicated or deposed leader's routing entry cannot route the answer twice.
    if let (INBOUND, Some(c)) = (q.channel, &q.correlation) {
        let open = txn
            .task_route(&t.meta.owner, c)?
            .is_some_and(|r| r.id == q.id && r.inbound_qseq.is_none());
        if !open {
            return Ok(queue_rule(
                q.id,
                q.channel,
                format!("no open route for correlation {c:?}"),
            ));
        }
    }
    let state = txn.queue_state(q.id, q.channel)?;
    Ok(if state.tail.checked_add(1) != Some(q.qseq) {
        queue_rule(
            q.id,
            q.channel,
            format!("qseq {} does not follow {}", q.qseq, state.tail),
        )
    } else if state.tail - state.head >= u64::from(q.max_len) {
        queue_rule(
            q.id,
            q.channel,
            format!(
                "full: {} queued (max {})",
                state.tail - state.head,
                q.max_len
            ),
        )
    } else if let Some(d) = &q.dedupe_key {
        match txn.deduped(q.id, q.channel, d)? {
            Some(_) => queue_rule(q.id, q.channel, format!("dedupe key {d:?} is queued")),
            None => Ok(()),
        }
    } else {
        Ok(())
    })
}

pub(super) fn dequeued(txn: &Txn<'_>, d: &TaskDequeued) -> Result<Rule> {
    if let Err(e) = present(txn, d.id)? {
        return Ok(Err(e));
    }
    let state = txn.queue_state(d.id, d.channel)?;
    Ok(
        if d.through_qseq <= state.head || d.through_qseq > state.tail {
            queue_rule(
                d.id,
                d.channel,
                format!(
                    "dequeue through {} outside {}..={}",
                    d.through_qseq,
                    state.head + 1,
                    state.tail
                ),
            )
        } else if d.token.is_empty() {
            queue_rule(d.id, d.channel, "a dequeue needs a token".into())
        } else {
            Ok(())
        },
    )
}

pub(super) fn deleted(txn: &Txn<'_>, d: &TaskDeleted) -> Result<Rule> {
    Ok(present(txn, d.id)?.and_then(|t| match d.removal {
        TaskRemoval::Deleted => Ok(()),
        TaskRemoval::Expired => match t.meta.deadline_ms() {
            Some(deadline) if t.meta.status.is_terminal() && d.at_ms >= deadline => Ok(()),
            deadline => Err(Rejection::TaskTimeNotUp {
                id: d.id,
                at_ms: d.at_ms,
                deadline: deadline.filter(|_| t.meta.status.is_terminal()),
            }),
        },
    }))
}

pub(super) fn snapshot(txn: &Txn<'_>, s: &TaskSnapshot) -> Result<Rule> {
    let id = s.meta.id;
    Ok(match txn.stored_task(id)? {
        None => Err(Rejection::UnknownTask(id)),
        Some(t)
            if t.meta != s.meta
                || txn.task_outcome(id)? != s.outcome
                || txn.task_slots(id)? != s.slots
                || txn.task_queues(id)? != s.queues =>
        {
            Err(Rejection::StaleSnapshot(format!("task {id}")))
        }
        Some(_) => Ok(()),
    })
}

/// Routes carried forward must restate the task's routes exactly (like a snapshot), so a
/// stale one cannot reopen a route that was answered since.
pub(super) fn routes(txn: &Txn<'_>, r: &TaskRoutes) -> Result<Rule> {
    Ok(match present(txn, r.id)? {
        Err(e) => Err(e),
        Ok(t) if txn.task_routes(r.id, &t.meta.owner)? != r.routes => {
            Err(Rejection::StaleSnapshot(format!("routes of task {}", r.id)))
        }
        Ok(_) => Ok(()),
    })
}

pub(super) fn forgotten(txn: &Txn<'_>, id: u64) -> Result<Rule> {
    Ok(match txn.stored_task(id)? {
        None => Err(Rejection::UnknownTask(id)),
        Some(t) if !t.meta.is_deleted() => Err(Rejection::TaskNotDeleted(id)),
        Some(_) => Ok(()),
    })
}

#[cfg(test)]
mod tests;
